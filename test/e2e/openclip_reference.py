#!/usr/bin/env python3
"""dloss-run's CLIP loss against PyTorch's own distributed CLIP loss.

The reference is what a user gets from plain torch.distributed with OpenCLIP's
`ClipLoss(local_loss=True, gather_with_grad=True)` semantics (the math is
written here, not copied): on each of N ranks (Gloo, 127.0.0.1, spawned with
torch.multiprocessing)

    all_image = cat(torch.distributed.nn.all_gather(image))     # with gradient
    all_text  = cat(torch.distributed.nn.all_gather(text))
    logits_per_image = s * image @ all_text.T
    logits_per_text  = s * text @ all_image.T
    labels = arange(B_local) + B_local * rank
    loss_r = (CE(logits_per_image, labels) + CE(logits_per_text, labels)) / 2
    loss_r.backward()

with s a leaf tensor (already exponentiated). Then `dloss-run examples/clip.mlir
--world N` (ddp contract) on the same inputs must give

    loss (every rank)   == mean_r loss_r
    grad_image/text[r]  == torch's per-rank grads (= N * dF/dx_r)
    grad_scale[r]       == torch's per-rank d loss_r / ds (and the means agree)

within 1e-5 relative error (max |a - b| / max |b| per tensor).

If torch.distributed.nn.all_gather does not work on Gloo (raises, or gives
gradients different from an exact autograd all_gather written here), the
reference uses that hand-written one instead; the output says which.

usage: openclip_reference.py DLOSS_RUN CLIP.mlir [--world 4] [--rows 8]
                             [--dim 16] [--out DIR]
Exit 0 on PASS, 1 on FAIL, 77 when torch/numpy are unavailable.
"""
import argparse
import datetime
import math
import os
import subprocess
import sys
import tempfile
import time

SKIP = 77
TOLERANCE = 1e-5
SCALE = "14.285714"  # exp(log(1/0.07)), OpenCLIP's initial logit scale

try:
    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    import torch.nn.functional as F
except ImportError as e:
    print(f"openclip_reference.py: SKIP: {e} (needs numpy and torch; run with /usr/bin/python3)")
    sys.exit(SKIP)

try:
    import torch.distributed.nn as dist_nn
except ImportError:  # pragma: no cover
    dist_nn = None


class ExactAllGather(torch.autograd.Function):
    """all_gather along dim 0 (equal shards) whose backward sums the cotangent
    over ranks and keeps this rank's slice (the adjoint: reduce_scatter)."""

    @staticmethod
    def forward(ctx, x):
        x = x.contiguous()
        world, rank = dist.get_world_size(), dist.get_rank()
        parts = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(parts, x)
        ctx.rank, ctx.rows = rank, x.shape[0]
        return torch.cat(parts, dim=0)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)
        return grad[ctx.rank * ctx.rows:(ctx.rank + 1) * ctx.rows]


def gather_torch(x):
    return torch.cat(dist_nn.all_gather(x), dim=0)


def gather_own(x):
    return ExactAllGather.apply(x)


def clip_loss(image, text, scale, gather, rank):
    """OpenCLIP ClipLoss, local_loss=True, gather_with_grad=True."""
    all_image, all_text = gather(image), gather(text)
    logits_per_image = scale * image @ all_text.T
    logits_per_text = scale * text @ all_image.T
    rows = image.shape[0]
    labels = torch.arange(rows, dtype=torch.long) + rows * rank
    return (F.cross_entropy(logits_per_image, labels) +
            F.cross_entropy(logits_per_text, labels)) / 2


def worker(rank, world, port, out, kinds):
    torch.set_num_threads(1)
    # The parent hosts the store (see run_torch): every rank is a client.
    store = dist.TCPStore("127.0.0.1", port, world, False, datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    try:
        image_np = np.load(os.path.join(out, f"image{rank}.npy"))
        text_np = np.load(os.path.join(out, f"text{rank}.npy"))
        for kind in kinds:
            image = torch.from_numpy(image_np.copy()).requires_grad_(True)
            text = torch.from_numpy(text_np.copy()).requires_grad_(True)
            scale = torch.tensor(float(SCALE), dtype=torch.float32, requires_grad=True)
            gather = gather_torch if kind == "torch" else gather_own
            loss = clip_loss(image, text, scale, gather, rank)
            loss.backward()
            d = os.path.join(out, f"torch-{kind}", f"rank{rank}")
            os.makedirs(d, exist_ok=True)
            np.save(os.path.join(d, "loss.npy"), loss.detach().numpy())
            np.save(os.path.join(d, "grad_image.npy"), image.grad.numpy())
            np.save(os.path.join(d, "grad_text.npy"), text.grad.numpy())
            np.save(os.path.join(d, "grad_scale.npy"), scale.grad.numpy())
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_torch(world, out, kinds, deadline_s=90):
    """Spawns the ranks; returns None on success, else the reason."""
    # Hosted here on a port the kernel picks, as torchrun's agent does: a port
    # chosen free and then closed may go to a test started at the same time.
    store = dist.TCPStore("127.0.0.1", 0, world, True, datetime.timedelta(seconds=deadline_s),
                          wait_for_workers=False)
    ctx = mp.start_processes(worker, args=(world, store.port, out, kinds), nprocs=world,
                             join=False, start_method="spawn")
    deadline = time.monotonic() + deadline_s
    try:
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    if p.is_alive():
                        p.kill()
                for p in ctx.processes:
                    p.join()
                return f"the torch ranks did not finish within {deadline_s} s"
    except Exception as e:  # a rank raised; the others are terminated by torch
        return f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"
    return None


def load(d, name):
    return np.load(os.path.join(d, name)).astype(np.float64)


def rel(a, b):
    """The largest relative difference; inf where either side is not finite
    (a NaN would otherwise compare below every tolerance, and max() skips it)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    error = float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-30))
    return error if math.isfinite(error) else math.inf


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("dloss_run")
    parser.add_argument("mlir")
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--rows", type=int, default=8, help="B_local (equal on every rank)")
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    N = args.world
    out = os.path.abspath(args.out or tempfile.mkdtemp(prefix="dloss-openclip-"))
    os.makedirs(out, exist_ok=True)

    # Inputs: L2-normalised features, equal batches.
    rng = np.random.default_rng(args.seed)
    for r in range(N):
        for name in ("image", "text"):
            x = rng.standard_normal((args.rows, args.dim))
            x = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
            np.save(os.path.join(out, f"{name}{r}.npy"), x)

    # 1. The PyTorch reference.
    print(f"torch {torch.__version__}, gloo, {N} ranks, B_local={args.rows}, d={args.dim}, "
          f"s={SCALE}", flush=True)
    if dist_nn is None or not hasattr(dist_nn, "all_gather"):
        reason = "torch.distributed.nn.all_gather is not available"
    else:
        reason = run_torch(N, out, ["torch", "own"])
    if reason is None:
        # Cross-check torch.distributed.nn's gradients on Gloo against the
        # exact hand-written all_gather.
        worst = 0.0
        for r in range(N):
            a, b = (os.path.join(out, f"torch-{k}", f"rank{r}") for k in ("torch", "own"))
            for f in ("loss.npy", "grad_image.npy", "grad_text.npy", "grad_scale.npy"):
                worst = max(worst, rel(load(a, f), load(b, f)))
        print(f"torch.distributed.nn.all_gather vs exact autograd all_gather: "
              f"worst relative difference {worst:.2e}")
        if worst > TOLERANCE:
            reason = (f"torch.distributed.nn.all_gather's gradients on gloo differ from an "
                      f"exact all_gather (relative {worst:.2e})")
    if reason is None:
        kind = "torch"
        print("reference: torch.distributed.nn.all_gather (gloo)")
    else:
        print(f"torch.distributed.nn.all_gather does not work here: {reason}")
        again = run_torch(N, out, ["own"])
        if again is not None:
            print(f"openclip_reference.py: FAIL: the torch reference did not run: {again}")
            sys.exit(1)
        kind = "own"
        print("reference: hand-written autograd all_gather (backward: all_reduce + own "
              "slice), gloo")
    ref = [os.path.join(out, f"torch-{kind}", f"rank{r}") for r in range(N)]

    # 2. dloss-run on the same inputs (default ddp contract).
    dl_out = os.path.join(out, "dloss")
    cmd = [args.dloss_run, args.mlir, "--world", str(N), "--timeout", "60",
           "--out", dl_out,
           "--input", f"image={os.path.join(out, 'image')}{{rank}}.npy",
           "--input", f"text={os.path.join(out, 'text')}{{rank}}.npy",
           "--input", f"scale={SCALE}"]
    print("+", " ".join(cmd), flush=True)
    try:
        result = subprocess.run(cmd, timeout=120)
    except subprocess.TimeoutExpired:
        print("openclip_reference.py: FAIL: dloss-run did not finish within 120 s")
        sys.exit(1)
    if result.returncode != 0:
        print(f"openclip_reference.py: FAIL: dloss-run exited {result.returncode}")
        sys.exit(1)
    import json
    dl = [os.path.join(dl_out, f"rank{r}") for r in range(N)]
    dl_json = []
    for d in dl:
        with open(os.path.join(d, "result.json")) as f:
            dl_json.append(json.load(f))

    # 3. Compare.
    rows = []  # (quantity, dloss, torch, relative error)
    torch_losses = [float(load(d, "loss.npy")) for d in ref]
    mean_loss = float(np.mean(torch_losses))
    for r in range(N):
        rows.append((f"loss, rank {r} (vs mean_r loss_r)", dl_json[r]["loss"], mean_loss,
                     rel(dl_json[r]["loss"], mean_loss)))
    for name in ("grad_image", "grad_text"):
        for r in range(N):
            a, b = load(dl[r], f"{name}.npy"), load(ref[r], f"{name}.npy")
            shape_ok = a.shape == b.shape
            rows.append((f"{name}, rank {r} (max |.|)", float(np.max(np.abs(a))),
                         float(np.max(np.abs(b))), rel(a, b) if shape_ok else float("inf")))
    dl_scale = [float(load(d, "grad_scale.npy")) for d in dl]
    ref_scale = [float(load(d, "grad_scale.npy")) for d in ref]
    for r in range(N):
        rows.append((f"grad_scale, rank {r}", dl_scale[r], ref_scale[r],
                     rel(dl_scale[r], ref_scale[r])))
    rows.append(("grad_scale, mean over ranks", float(np.mean(dl_scale)),
                 float(np.mean(ref_scale)), rel(np.mean(dl_scale), np.mean(ref_scale))))

    width = max(len(q) for q, *_ in rows)
    print(f"{'quantity':<{width}}  {'dloss':>14}  {'torch':>14}  {'rel. error':>10}")
    for q, a, b, e in rows:
        flag = "" if e <= TOLERANCE else "  <-- FAIL"
        print(f"{q:<{width}}  {a:>14.8g}  {b:>14.8g}  {e:>10.2e}{flag}")
    worst = max(rows, key=lambda t: t[3])
    ok = worst[3] <= TOLERANCE
    print(f"openclip_reference.py: reference {'torch.distributed.nn.all_gather' if kind == 'torch' else 'hand-written autograd all_gather'}; "
          f"worst relative error {worst[3]:.2e} ({worst[0]}), tolerance {TOLERANCE:g}: "
          f"{'PASS' if ok else 'FAIL'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
