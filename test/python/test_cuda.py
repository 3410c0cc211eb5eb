"""dloss on CUDA tensors (ctest labels python and gpu; docs/Cuda.md).

Without a GPU every CUDA test skips, saying why. Each check is one function
of `device`; its CPU run (the `Cpu*` classes) goes through the same code with
CPU tensors, so the harness is proven wherever the suite runs, and a GPU run
differs from it only in the device.

- Drop-ins (ClipLoss, SigLipLoss, ArcFaceLoss, NTXentLoss, SupConLoss,
  PartialFC, an InfoNCE written with @dloss.loss) on CUDA tensors in
  float32 and bfloat16, fused (default tile and 2 x 3 tiles that cross
  every edge) and unfused, against the same call on CPU tensors: value and
  every gradient within 1e-4 (f32) or 2e-2 (bf16) relative to the CPU's
  largest magnitude. In this process the group is "cpu:gloo,cuda:nccl" at
  world size 1, so CUDA tensors go through NCCL (through Gloo where
  DLOSS_TEST_CUDA_BACKEND=gloo: scripts/gpu-check.sh sets it when its NCCL
  probe fails, and the NCCL rank test then skips, saying so). The CPU run
  compares with float64 instead (bfloat16 only where no scale of 64
  amplifies its rounding beyond 2e-2: not ArcFace, not PartialFC).
- Autograd: a two-tower model with its logit scale on `device`, ClipLoss,
  .backward(), every parameter's gradient against the float64 CPU model
  (float32, 1e-4).
- Ranks: 2, 3 and 4 processes sharing the one GPU over a Gloo group (torch's
  ProcessGroupGloo stages CUDA tensors through the host; NCCL refuses two
  ranks on one GPU), uneven batches (a rank with none), ClipLoss and
  NTXentLoss fused and unfused, against one process on the concatenated
  batch (CLIP: plain torch; NT-Xent: dloss at world 1) in float64 on the
  CPU; then one rank over NCCL.

Ranks start from multiproc.py's fork server. That is safe with CUDA: the
server is a fresh interpreter that imports torch without initialising CUDA,
and each rank forks from it, never from this process (which initialises
CUDA in the drop-in tests).
"""

import copy
import math
import os
import unittest

import torch
import torch.nn.functional as F

import multiproc
from loss_reference import fusion, offsets, rel, report

HAVE_CUDA = torch.cuda.is_available()
NO_CUDA = ("no CUDA device: torch.cuda.is_available() is False (the gpu "
           "tests run on a GPU machine, docs/Cuda.md)")
# The backend of CUDA tensors in this process: NCCL, or Gloo where NCCL
# does not work on the machine (scripts/gpu-check.sh's probe).
CUDA_BACKEND = os.environ.get("DLOSS_TEST_CUDA_BACKEND", "nccl")
NO_NCCL = ("DLOSS_TEST_CUDA_BACKEND=%s: NCCL failed its probe on this machine "
           "(scripts/gpu-check.sh's summary says why)" % CUDA_BACKEND)
TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}
# Fused with the default tile, fused with 2 x 3 tiles, unfused.
MODES = (True, "2x3", False)
B, DIM, CLASSES = 12, 16, 20


def setUpModule():
    import dloss
    # Both devices at world size 1: CPU references, CUDA through NCCL (or
    # Gloo: CUDA_BACKEND).
    dloss.init(backend="cpu:gloo,cuda:%s" % CUDA_BACKEND if HAVE_CUDA
               else "gloo")


def _rounded(t, dtype):
    """`t` rounded to `dtype` and back to float64: the inputs both sides
    see."""
    return t.to(dtype).to(torch.float64)


def _features(g, n):
    return F.normalize(torch.randn(n, DIM, generator=g, dtype=torch.float64))


def _pair_labels(n):
    """SimCLR's labels: two views of each of n / 2 images."""
    ids = torch.arange(n // 2)
    return torch.cat([ids, ids])


def infonce(q, k, scale):
    """InfoNCE in plain torch, as @dloss.loss takes it: each row's positive
    is its own index in the gathered keys."""
    import dloss
    k_all = dloss.all_gather(k)
    labels = torch.arange(q.shape[0]) + dloss.shard_offset(q)
    return F.cross_entropy(scale * q @ k_all.T, labels)


# name -> make(fuse, dtype, seed) -> (call, tensors, modules): call(device)
# returns the loss on `device`; `tensors` (float64, CPU, leaves) and the
# modules' parameters are what gets a gradient.
def _case(name, fuse, seed):
    import dloss
    g = torch.Generator().manual_seed(seed)
    if name in ("ClipLoss", "SigLipLoss", "@dloss.loss InfoNCE"):
        tensors = [_features(g, B), _features(g, B)]
        if name == "ClipLoss":
            fn, extra = dloss.ClipLoss(fuse=fuse), [7.5]
        elif name == "SigLipLoss":
            fn, extra = dloss.SigLipLoss(fuse=fuse), [10.0, -10.0]
        else:
            fn, extra = dloss.loss(fuse=fuse)(infonce), [7.5]
        tensors += [torch.tensor(v, dtype=torch.float64) for v in extra]
        return (lambda ts, module: fn(*ts)), tensors, None
    if name in ("NTXentLoss", "SupConLoss"):
        tensors = [torch.randn(B, DIM, generator=g, dtype=torch.float64)]
        labels = _pair_labels(B) if name == "NTXentLoss" else \
            torch.randint(0, 4, (B,), generator=g)
        fn = getattr(dloss, name)(fuse=fuse)
        return (lambda ts, module: fn(ts[0], labels.to(ts[0].device))), \
            tensors, None
    tensors = [torch.randn(B, DIM, generator=g, dtype=torch.float64)]
    labels = torch.randint(0, CLASSES, (B,), generator=g)
    torch.manual_seed(seed)
    if name == "ArcFaceLoss":
        module = dloss.ArcFaceLoss(CLASSES, DIM, fuse=fuse)
    else:
        module = dloss.PartialFC(DIM, CLASSES, fuse=fuse,
                                 margin_loss=dloss.CombinedMarginLoss(
                                     64, 1.0, 0.5, 0.0))
    return (lambda ts, m: m(ts[0], labels.to(ts[0].device))), tensors, module


DROP_INS = ("ClipLoss", "SigLipLoss", "ArcFaceLoss", "NTXentLoss",
            "SupConLoss", "PartialFC", "@dloss.loss InfoNCE")


def _run(call, tensors, module, device, dtype, fuse):
    """The loss and its gradients (float64, CPU) on `device` in `dtype`."""
    ts = [t.to(device=device, dtype=dtype).requires_grad_() for t in tensors]
    if module is not None:
        module = copy.deepcopy(module).to(device)
        if dtype == torch.float64:
            module = module.double()
    with fusion(fuse):
        loss = call(ts, module)
        loss.backward()
    params = [] if module is None else list(module.parameters())
    grads = [t.grad for t in ts] + [p.grad for p in params]
    for grad in grads:
        assert grad is not None and grad.device.type == device, (
            "a gradient is missing or on the wrong device")
    assert loss.device.type == device, "the loss is on %s" % loss.device
    return [loss.detach()] + grads


def check_drop_ins(test, device, cases, reference_dtype=None):
    """Each (drop-in, dtype) of `cases` on `device` against the same call on
    CPU tensors in `reference_dtype` (default: the same dtype)."""
    worst = {}
    for seed, name in enumerate(DROP_INS):
        for dtype in [d for n, d in cases if n == name]:
            ref_dtype = reference_dtype or dtype
            for fuse in MODES:
                what = "%s %s %s fuse=%s against cpu %s" % (
                    name, device, dtype, fuse, ref_dtype)
                with test.subTest(what=what):
                    call, tensors, module = _case(name, bool(fuse), seed)
                    # Both sides see the inputs (and parameters) rounded to
                    # dtype.
                    tensors = [_rounded(t, dtype) for t in tensors]
                    if module is not None:
                        with torch.no_grad():
                            for p in module.parameters():
                                p.copy_(p.to(dtype).to(p.dtype))
                    got = _run(call, tensors, module, device, dtype, fuse)
                    want = _run(call, tensors, module, "cpu", ref_dtype, fuse)
                    errors = [rel(g.cpu().double(), w.double())
                              for g, w in zip(got, want)]
                    key = "%s %s" % (name, str(dtype).replace("torch.", ""))
                    worst[key] = max(worst.get(key, 0.0), max(errors))
                    test.assertLess(max(errors), TOL[dtype],
                                    "%s: relative errors (loss, then each "
                                    "gradient) %s" % (what, errors))
    report("cuda-drop-ins-" + device, worst)


class TwoTower(torch.nn.Module):
    """A CLIP-style model: two linear towers and a learnt logit scale."""

    def __init__(self):
        super().__init__()
        self.image = torch.nn.Linear(24, DIM)
        self.text = torch.nn.Linear(20, DIM)
        self.logit_scale = torch.nn.Parameter(
            torch.tensor(math.log(1 / 0.07)))

    def forward(self, images, texts):
        return (F.normalize(self.image(images), dim=-1),
                F.normalize(self.text(texts), dim=-1),
                self.logit_scale.exp())


def check_autograd(test, device):
    """ClipLoss in a model on `device`: every parameter's gradient against
    the float64 model on the CPU."""
    import dloss
    torch.manual_seed(3)
    model = TwoTower()
    g = torch.Generator().manual_seed(4)
    images = torch.randn(B, 24, generator=g)
    texts = torch.randn(B, 20, generator=g)
    runs = {}
    for where, dtype in ((device, torch.float32), ("cpu", torch.float64)):
        m = copy.deepcopy(model).to(device=where, dtype=dtype)
        loss = dloss.ClipLoss()(*m(images.to(where, dtype),
                                   texts.to(where, dtype)))
        loss.backward()
        for name, p in m.named_parameters():
            test.assertEqual(p.grad.device.type, where, name)
        runs[where, dtype] = [loss.detach()] + [
            p.grad for _, p in m.named_parameters()]
    got, want = runs[device, torch.float32], runs["cpu", torch.float64]
    names = ["loss"] + [n for n, _ in model.named_parameters()]
    errors = {n: rel(g.cpu().double(), w) for n, g, w in zip(names, got,
                                                              want)}
    report("cuda-autograd-" + device, errors)
    for name, err in errors.items():
        test.assertLess(err, TOL[torch.float32], name)


# Per world size: uneven batches, a rank without rows at 4.
RANK_SIZES = {1: [6], 2: [5, 2], 3: [1, 4, 2], 4: [4, 0, 3, 2]}
RANK_LOSSES = ("ClipLoss", "NTXentLoss")


def _rank_data(name, sizes, seed):
    """The global batch (float64, CPU) and its labels (NT-Xent)."""
    g = torch.Generator().manual_seed(seed)
    total = sum(sizes)
    if name == "ClipLoss":
        return [_features(g, total), _features(g, total),
                torch.tensor(7.5, dtype=torch.float64)], None
    # Labels by rows' global index: positives cross ranks.
    return [torch.randn(total, DIM, generator=g, dtype=torch.float64)], \
        torch.arange(total) % max(total // 2, 1)


def _ranks_rank(rank, world, device, dtype, sizes):
    """This rank's loss and gradients (CPU), per loss and fusion mode."""
    import dloss
    if device == "cuda":
        torch.cuda.set_device(0)  # Every rank shares the one GPU.
    out = []
    for seed, name in enumerate(RANK_LOSSES):
        tensors, labels = _rank_data(name, sizes, seed)
        lo, n = offsets(sizes)[rank], sizes[rank]
        for fuse in MODES:
            ts = [(t[lo:lo + n] if t.dim() else t).to(device, dtype)
                  .requires_grad_() for t in tensors]
            with fusion(fuse):
                if name == "ClipLoss":
                    loss = dloss.ClipLoss(fuse=bool(fuse))(*ts)
                else:
                    loss = dloss.NTXentLoss(fuse=bool(fuse))(
                        ts[0], labels[lo:lo + n].to(device))
                loss.backward()
            out.append(dict(device=[t.grad.device.type for t in ts] +
                            [loss.device.type],
                            values=[loss.detach().cpu()] +
                            [t.grad.cpu() for t in ts]))
    return out


def _one_process(name, tensors, labels):
    """The loss and gradients on the concatenated batch, float64, CPU."""
    import dloss
    from loss_reference import clip_loss
    ts = [t.clone().requires_grad_() for t in tensors]
    loss = clip_loss(*ts) if name == "ClipLoss" else \
        dloss.NTXentLoss()(ts[0], labels)
    loss.backward()
    return [loss.detach()] + [t.grad for t in ts]


def check_ranks(test, device, world, backend="gloo", dtype=torch.float32):
    """`world` ranks with `device` tensors over `backend`: every rank's value
    equals one process's, rank r's feature gradients / world its rows'
    block, the mean of the 0-d shares its gradient (the ddp contract);
    fused, tiny tiles and unfused agree with it."""
    sizes = RANK_SIZES[world]
    per_rank = multiproc.run(world, _ranks_rank, device, dtype, sizes,
                             backend=backend, timeout=300)
    worst = {}
    i = 0
    for seed, name in enumerate(RANK_LOSSES):
        tensors, labels = _rank_data(name, sizes, seed)
        want = _one_process(name, tensors, labels)
        for fuse in MODES:
            what = "%s world %d %s %s fuse=%s" % (name, world, backend,
                                                 device, fuse)
            got = [r[i] for r in per_rank]
            i += 1
            with test.subTest(what=what):
                errors = []
                for rank, g in enumerate(got):
                    test.assertEqual(set(g["device"]), {device}, what)
                    value, grads = g["values"][0], g["values"][1:]
                    errors.append(rel(value.double(), want[0]))
                    lo, n = offsets(sizes)[rank], sizes[rank]
                    for grad, whole in zip(grads, want[1:]):
                        if whole.dim():
                            errors.append(rel(grad.double() / world,
                                              whole[lo:lo + n], whole))
                for k, whole in enumerate(want[1:]):
                    if not whole.dim():  # a 0-d parameter: shares
                        mean = sum(g["values"][1 + k].double()
                                   for g in got) / world
                        errors.append(rel(mean, whole))
                worst[name] = max(worst.get(name, 0.0), max(errors))
                test.assertLess(max(errors), TOL[dtype], what)
    report("cuda-ranks-%s-%s-world%d" % (device, backend, world), worst)


@unittest.skipUnless(HAVE_CUDA, NO_CUDA)
class CudaDropInTest(unittest.TestCase):
    def test_drop_ins_match_the_cpu(self):
        check_drop_ins(self, "cuda", [(name, dtype) for name in DROP_INS
                                      for dtype in TOL])

    def test_autograd_through_a_model(self):
        check_autograd(self, "cuda")


@unittest.skipUnless(HAVE_CUDA, NO_CUDA)
class CudaRanksTest(unittest.TestCase):
    def test_gloo_world_2(self):
        check_ranks(self, "cuda", 2)

    def test_gloo_world_3(self):
        check_ranks(self, "cuda", 3)

    def test_gloo_world_4(self):
        check_ranks(self, "cuda", 4)

    @unittest.skipUnless(CUDA_BACKEND == "nccl", NO_NCCL)
    def test_nccl_world_1(self):
        check_ranks(self, "cuda", 1, backend="nccl")


class CpuDryRunTest(unittest.TestCase):
    """The same checks with CPU tensors: float32 against float64 (the
    drop-ins, the model), and the ranks over Gloo; here they prove the
    harness the GPU run uses."""

    def test_drop_ins(self):
        # bfloat16 within 2e-2 of float64 where no scale of 64 (ArcFace's,
        # PartialFC's) multiplies its rounding.
        check_drop_ins(self, "cpu", [
            (name, dtype) for name in DROP_INS for dtype in TOL
            if dtype == torch.float32 or name not in ("ArcFaceLoss",
                                                      "PartialFC")],
            reference_dtype=torch.float64)

    def test_autograd_through_a_model(self):
        check_autograd(self, "cpu")

    def test_ranks_gloo_world_3(self):
        check_ranks(self, "cpu", 3)


if __name__ == "__main__":
    unittest.main()
