#!/usr/bin/env python3
"""The GPU bench (issue #25): dloss's fused losses on one GPU against an
OpenCLIP-style eager step in plain torch, and the fused tiles against plain
cuBLAS GEMMs of the same shapes.

One process (world 1: an NCCL group on the GPU, Gloo with --device cpu),
d = 512, bf16 and f32, B_local 4096, 16384 and 65536 (--quick: 256 and
1024, d kept so the plans are the same), for three losses:

  loss     fused (dloss)                     eager (plain torch, OpenCLIP)
  clip     dloss.ClipLoss()                  all_gather (own slot put back),
                                             scale x @ y_all.T both ways,
                                             cross-entropy, labels n*rank + i
  siglip   dloss.SigLipLoss()                logits scale x @ y_all.T + bias,
                                             -logsigmoid(z * logits) summed / n
  infonce  @dloss.loss (the general op)      cross-entropy of scale q @ k_all.T

and, for CLIP, Inf-CL (pip's inf-cl 1.2.1, arXiv 2410.17243) where inf_cl
imports and the device is CUDA: its ring (cal_inf_loss, at this group's
world size) both ways, (cal_inf_loss(image, text, scale) +
cal_inf_loss(text, image, scale)) / 2. Each call is one direction, the mean
over this rank's rows of lse(scale q k_all^T) - scale q.k_i, with the
scale applied by the caller: at world 1 exactly OpenCLIP's and dloss's
loss. Its Triton kernels run in float32 (bf16 inputs are converted) with
TF32 dot products, as Inf-CL ships them.

Each measurement is one forward + backward: warm-up steps, then the median
of timed ones (CUDA events; at most --reps, fewer for slow steps), and
torch.cuda.max_memory_allocated over one step after a reset, less what was
allocated before it (the inputs are allocated before the reset, so only the
loss's intermediates, gradients and workspaces count). An eager step that
runs out of memory is recorded as "OOM". The GEMM row times the four GEMMs
a fused step runs at full shapes (S = rows cols^T forward, again backward,
G cols and G^T rows), 8 B_local B_global d flops, with torch.matmul.

Also one GPU's share of a 131072 global batch on 8 GPUs (B_local 16384):
CLIP's two directions of this GPU's 16384 rows against all 131072 gathered
rows, through the general op with the gathered features as replicated
inputs (so their gradients are counted too: an upper bound of what a ring
over 8 GPUs holds), next to Inf-CL's reported 0.72 GB per GPU at 128k
(arXiv 2410.17243, 8 x A800; OpenCLIP 33.6 GB there) and the eager step at
that shape.

Writes OUT/gpu_bench.json and OUT/gpu_bench.md (tables and the issue's
targets: fused step <= 0.7x eager's time; fused loss memory <= 1/20 of
eager's at B_local 16384; tiles >= 70% of the GEMMs' throughput; dloss's
CLIP step time and loss memory at most Inf-CL's at the same B_local). Each
row also records its loss value (the last timed step's), and the fused
value of every shape must match the eager one on the same inputs (relative
1e-4 in f32, 3e-2 in bf16), Inf-CL's both the eager and the fused one: a
mismatch fails the bench, as an error does (except Inf-CL's own errors:
printed and recorded, but Inf-CL is the reference, not the subject).

usage: python bench/gpu_bench.py --out DIR [--quick] [--skip-without-cuda]
           [--device cuda|cpu] [--dtypes bf16,f32]
           [--losses clip,siglip,infonce]
           [--b-local 4096,16384,65536] [--reps 5] [--no-share]
           [--budget-s 200] [--backend nccl]

--backend is dloss.init's (default nccl with --device cuda, gloo with
cpu; "cpu:gloo,cuda:gloo" where NCCL does not work). Without CUDA it prints
one line and exits 1 (0 with --skip-without-cuda). `--device cpu --quick`
runs the whole harness on the CPU (times from perf_counter, no memory, no
Inf-CL: one line says why): a dry run, and it fills the plan cache
(DLOSS_CACHE_DIR) with the plans the GPU run needs. Where the dloss
compiler library does not load, plans come from that cache alone and the
@dloss.loss rows (infonce, clip-share) are skipped, saying so: tracing a
function asks the library for shapes.
"""
import argparse
import json
import math
import os
import platform
import statistics
import sys
import time

# The budget (--budget-s) counts from here: the imports and the group's set-up
# are part of the run.
STARTED = time.monotonic()

DIM = 512
FULL_SIZES = (4096, 16384, 65536)
QUICK_SIZES = (256, 1024)
LOSSES = ("clip", "siglip", "infonce")
DTYPES = {"bf16": "bfloat16", "f32": "float32"}
# The targets.
TIME_TARGET = 0.7
MEM_TARGET = 1 / 20
MEM_TARGET_B = 16384
GEMM_TARGET = 0.7
# How far the fused loss value may be from the eager one (relative), by dtype.
# In bf16 (unit round-off 2^-8) each side's logits are rounded, by up to
# 0.055 at a scale of 14, which moves a log-sum-exp by as much, and each
# loss value is rounded to bf16 again: about 1.5% at worst (1.1% seen on the
# CPU at B_local 256).
VALUE_TOLERANCE = {"bf16": 3e-2, "f32": 1e-4}
# Inf-CL's value against the others: its kernels multiply in TF32 even for
# f32 inputs (unit round-off 2^-11), so each logit at a scale of 14 may move
# by 7e-3 and a log-sum-exp by as much: 3e-3 of the small-batch losses (about
# 2.2 at B_local 8, where 1.6e-4 was seen on an H200); bf16's rule otherwise.
INFCL_VALUE_TOLERANCE = {"bf16": 3e-2, "f32": 3e-3}
# One GPU's share of a 128k global batch on 8 GPUs, and Inf-CL's figures
# for it (arXiv 2410.17243, 8 x A800, per GPU).
SHARE_B_LOCAL, SHARE_WORLD = 16384, 8
INFCL_GB, INFCL_OPENCLIP_GB = 0.72, 33.6
# Device time: a step slower than SLOW_S gets at most 3 timed repetitions,
# one slower than VERY_SLOW_S only its first (warm-up) time; once the run
# has taken --budget-s, the remaining rows are skipped (and say so).
SLOW_S, VERY_SLOW_S = 1.0, 5.0


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True,
                   help="folder for gpu_bench.json and gpu_bench.md")
    p.add_argument("--quick", action="store_true",
                   help="B_local %s (a smoke run)" % (QUICK_SIZES,))
    p.add_argument("--skip-without-cuda", action="store_true",
                   help="without CUDA, say so and exit 0")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--dtypes", default="bf16,f32")
    p.add_argument("--losses", default=",".join(LOSSES))
    p.add_argument("--b-local", default=None,
                   help="comma-separated sizes (default %s)" % (FULL_SIZES,))
    p.add_argument("--reps", type=int, default=5, help="timed steps at most")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--no-share", action="store_true",
                   help="skip the 128k-share measurement")
    p.add_argument("--budget-s", type=float, default=200,
                   help="skip the rows left after this many seconds")
    p.add_argument("--backend", default=None,
                   help="dloss.init's backend (default: nccl with --device "
                   "cuda, gloo with cpu; e.g. cpu:gloo,cuda:gloo)")
    args = p.parse_args()
    if args.backend is None:
        args.backend = "nccl" if args.device == "cuda" else "gloo"
    return args


# ---------------------------------------------------------------- the losses


def infonce(q, k, scale):
    """InfoNCE as a user writes it for @dloss.loss."""
    import torch
    import torch.nn.functional as F
    import dloss
    k_all = dloss.all_gather(k)
    labels = torch.arange(q.shape[0]) + dloss.shard_offset(q)
    return F.cross_entropy(scale * q @ k_all.T, labels)


def _clip_share(image, text, image_all, text_all, scale):
    """CLIP at one GPU's share: this GPU's rows (the first of the global
    batch) against every gathered row, both directions."""
    import torch
    import torch.nn.functional as F
    labels = torch.arange(image.shape[0], device=image.device)
    return (F.cross_entropy(scale * image @ text_all.T, labels) +
            F.cross_entropy(scale * text @ image_all.T, labels)) / 2


def clip_share():
    """The share as @dloss.loss: the gathered features are replicated
    inputs of any length (so --quick compiles the plan the full run uses)."""
    import dloss
    gathered_rows = dloss.Input(shape=(-1, DIM), replicated=True)
    _clip_share.__annotations__.update(image_all=gathered_rows,
                                       text_all=gathered_rows)
    return dloss.loss(_clip_share)


def gathered(x):
    """OpenCLIP's gather_features at one rank: all_gather (no gradient),
    then this rank's own slot put back so that its gradient flows."""
    import torch
    import torch.distributed as dist
    world, rank = dist.get_world_size(), dist.get_rank()
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x.detach())
    parts[rank] = x
    return torch.cat(parts)


def eager(name):
    """The OpenCLIP-style eager step of `name` (plain torch autograd)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    def labels_of(x):
        n = x.shape[0]
        return torch.arange(n, device=x.device) + n * dist.get_rank()

    def clip(image, text, scale):
        labels = labels_of(image)
        return (F.cross_entropy(scale * image @ gathered(text).T, labels) +
                F.cross_entropy(scale * text @ gathered(image).T, labels)) / 2

    def siglip(image, text, scale, bias):
        logits = scale * image @ gathered(text).T + bias
        z = -torch.ones_like(logits)
        z[torch.arange(image.shape[0]), labels_of(image)] = 1
        return -F.logsigmoid(z * logits).sum() / image.shape[0]

    def nce(q, k, scale):
        return F.cross_entropy(scale * q @ gathered(k).T, labels_of(q))

    return {"clip": clip, "siglip": siglip, "infonce": nce,
            "clip-share": _clip_share}[name]


def fused(name):
    import dloss
    if name == "clip":
        return dloss.ClipLoss()
    if name == "siglip":
        return dloss.SigLipLoss()
    if name == "infonce":
        return dloss.loss(infonce)
    return clip_share()


def infcl_clip(image, text, scale):
    """CLIP's symmetric loss with Inf-CL's ring (the default group's world
    size; labels arange(B_local), the scale applied here by the caller, as
    inf_cl's own example does). head_dim 256 (its default) splits d = 512
    into two heads whose dot products it adds: the full dot product."""
    import inf_cl
    return (inf_cl.cal_inf_loss(image, text, scale=scale) +
            inf_cl.cal_inf_loss(text, image, scale=scale)) / 2


def infcl_state(device, backend):
    """{"version", "rows", "why"}: whether the Inf-CL rows run and, if not,
    why (one line; never a traceback). Its backward sends each ring step's
    key gradient to the next rank even at world 1, to itself: NCCL takes
    that, Gloo refuses it ("Pair is not connected"), so the rows need NCCL
    for CUDA tensors."""
    state = {"version": None, "rows": False, "why": None}
    try:
        import inf_cl
    except Exception as e:  # noqa: B902 - ImportError, or triton's own
        state["why"] = "inf_cl does not import (%s: %s); gpu-check.sh " \
            "installs it from gpu-carry/wheels (scripts/gpu-prepare.sh), " \
            "and a CUDA torch brings triton" % (
                type(e).__name__, str(e).splitlines()[0][:200])
        return state
    try:
        from importlib import metadata
        state["version"] = metadata.version("inf-cl")
    except Exception:  # noqa: B902 - a report only
        state["version"] = getattr(inf_cl, "__version__", "unknown")
    if device != "cuda":
        state["why"] = ("inf_cl %s imports, but its kernels are Triton's, "
                        "CUDA only (--device %s)" % (state["version"], device))
    elif backend != "nccl" and "cuda:nccl" not in backend:
        state["why"] = ("inf_cl %s imports, but its ring sends to itself at "
                        "world 1, which Gloo refuses: it needs NCCL (the "
                        "backend is %s)" % (state["version"], backend))
    elif not hasattr(inf_cl, "cal_inf_loss"):
        state["why"] = "inf_cl %s has no cal_inf_loss" % state["version"]
    else:
        state["rows"] = True
    return state


def compiler_state():
    """None where the dloss compiler library loads, else why not. Without
    it, drop-ins run plans from the plan cache (DLOSS_CACHE_DIR); a
    @dloss.loss function cannot even be traced (the library gives each
    op's shape)."""
    import torch
    import dloss
    try:
        dloss.Graph("probe").input("x", torch.float32, [2]).shape
        return None
    except Exception as e:  # noqa: B902 - dloss.Error: the report
        return str(getattr(e, "problem", e)).splitlines()[0][:300]


def inputs(name, b_local, dtype, device, gen):
    """The step's leaves: unit rows and 0-d parameters, all with grad."""
    import torch
    import torch.nn.functional as F

    def rows(n):
        x = torch.randn(n, DIM, device=device, generator=gen)
        return F.normalize(x, dim=1).to(dtype)

    def param(v):
        return torch.tensor(v, dtype=dtype, device=device)

    if name == "clip-share":
        ts = [rows(b_local), rows(b_local), rows(b_local * SHARE_WORLD),
              rows(b_local * SHARE_WORLD), param(14.0)]
    elif name == "siglip":
        ts = [rows(b_local), rows(b_local), param(10.0), param(-10.0)]
    else:
        ts = [rows(b_local), rows(b_local), param(14.0)]
    return [t.requires_grad_() for t in ts]


# ---------------------------------------------------------------- measuring


class Clock:
    """Times a callable: CUDA events on the GPU, perf_counter on the CPU."""

    def __init__(self, device):
        import torch
        self.torch, self.cuda = torch, device == "cuda"

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def time_ms(self, fn):
        if not self.cuda:
            start = time.perf_counter()
            fn()
            return (time.perf_counter() - start) * 1e3
        start = self.torch.cuda.Event(enable_timing=True)
        end = self.torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    def peak_mb(self, fn, clear=None):
        """The peak memory fn allocates beyond what was allocated before
        (after clear(), which frees what fn would free first: the previous
        step's gradients, so that they count as this step's)."""
        if not self.cuda:
            fn()
            return None
        torch = self.torch
        if clear is not None:
            clear()
        self.sync()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        self.sync()
        return (torch.cuda.max_memory_allocated() - base) / 2 ** 20


def measure(clock, step, args, clear=None):
    """{median_ms, times_ms, loss_mem_mb}: one untimed step (a plan compiled
    on first use, cuBLAS's set-up), warm-ups, one step under the memory
    reset, then the timed steps (fewer when a step is slow)."""
    step()
    clock.sync()
    first = clock.time_ms(step)  # also the first warm-up
    if first > VERY_SLOW_S * 1e3:
        mem = clock.peak_mb(step, clear)
        return {"median_ms": first, "times_ms": [round(first, 3)],
                "loss_mem_mb": None if mem is None else round(mem, 1),
                "note": "one timed step (slow)"}
    for _ in range(args.warmup - 1):
        step()
    mem = clock.peak_mb(step, clear)
    reps = args.reps if first < SLOW_S * 1e3 else min(args.reps, 3)
    times = [clock.time_ms(step) for _ in range(reps)]
    return {"median_ms": statistics.median(times),
            "times_ms": [round(t, 3) for t in times],
            "loss_mem_mb": None if mem is None else round(mem, 1)}


def run_step(clock, fn, leaves, args):
    """Measures fn(*leaves).backward(); "OOM" when it runs out of memory."""
    import torch

    def clear():
        for t in leaves:
            t.grad = None

    last = []

    def step():
        clear()
        value = fn(*leaves)
        value.backward()
        last[:] = [value.detach()]

    try:
        row = measure(clock, step, args, clear)
        row["status"] = "ok"
        row["loss_value"] = float(last[0].float().sum())
    except torch.cuda.OutOfMemoryError:
        row = {"status": "OOM"}
    except Exception as e:  # noqa: B902 - the row says why
        row = {"status": "error: %s: %s" % (type(e).__name__,
                                             str(e).splitlines()[0][:300])}
    for t in leaves:
        t.grad = None
    if clock.cuda:
        torch.cuda.empty_cache()
    return row


def run_gemms(clock, b_local, b_global, dtype, device, args):
    """The fused step's four GEMMs at full shapes, each through
    torch.matmul (cuBLAS on the GPU)."""
    import torch
    rows = torch.randn(b_local, DIM, device=device, dtype=dtype)
    cols = torch.randn(b_global, DIM, device=device, dtype=dtype)

    def step():
        s = rows @ cols.T            # forward
        g = rows @ cols.T            # backward: S again, as the tiles do
        torch.matmul(g, cols)        # d rows
        torch.matmul(g.T, rows)      # d cols
        del s

    try:
        row = measure(clock, step, args)
        row["status"] = "ok"
    except torch.cuda.OutOfMemoryError:
        row = {"status": "OOM"}
    rows = cols = None  # The step's cells hold them: free them here.
    if clock.cuda:
        torch.cuda.empty_cache()
    return row


def flops(b_local, b_global, loss=""):
    """A fused step's GEMM flops: forward S, backward S again, G cols and
    G^T rows, 2 b_local b_global d each (clip-share: two similarities)."""
    return (16 if loss == "clip-share" else 8) * b_local * b_global * DIM


def fused_ops(fn, leaves):
    """The fused ops of the plan a dloss loss ran (the share's memory claim
    holds only if its similarities were fused); None if not found."""
    try:
        if hasattr(fn, "compiled"):  # @dloss.loss
            return list(fn.compiled(*leaves).fused_ops())
        return list(fn._loss(leaves[0].dtype).fused_ops())  # drop-ins
    except Exception:  # noqa: B902 - a report, never a failure
        return None


# ---------------------------------------------------------------- reporting


def ratio(a, b):
    if a is None or b is None or not b:
        return None
    return a / b


def fmt(v, spec="%.3g", none="-"):
    return none if v is None else spec % v


def summarise(rows):
    """One line per (loss, dtype, B_local): fused, eager, GEMM, Inf-CL (CLIP
    only, where it ran) and the ratios the targets are about."""
    by = {}
    for r in rows:
        by.setdefault((r["loss"], r["dtype"], r["b_local"]), {})[r["impl"]] = r
    out = []
    for (loss, dtype, b), impls in sorted(by.items(), key=lambda kv: (
            kv[0][0], kv[0][1], kv[0][2])):
        f, e, g, i = (impls.get(k, {}) for k in ("fused", "eager", "gemm",
                                                   "infcl"))
        ok = lambda r: r.get("status") == "ok"  # noqa: E731
        fm = f.get("median_ms") if ok(f) else None
        em = e.get("median_ms") if ok(e) else None
        gm = g.get("median_ms") if ok(g) else None
        im = i.get("median_ms") if ok(i) else None
        out.append({
            "loss": loss, "dtype": dtype, "b_local": b,
            "b_global": f.get("b_global", b),
            "fused_ms": fm, "eager_ms": em, "gemm_ms": gm,
            "fused_status": f.get("status"), "eager_status": e.get("status"),
            "fused_mb": f.get("loss_mem_mb") if ok(f) else None,
            "eager_mb": e.get("loss_mem_mb") if ok(e) else None,
            "time_vs_eager": ratio(fm, em),
            "mem_vs_eager": ratio(f.get("loss_mem_mb") if ok(f) else None,
                                  e.get("loss_mem_mb") if ok(e) else None),
            "gemm_fraction": ratio(gm, fm),
            "fused_tflops": None if fm is None else
            flops(b, f.get("b_global", b), loss) / fm / 1e9,
            "fused_ops": f.get("fused_ops"),
            "fused_value": f.get("loss_value") if ok(f) else None,
            "eager_value": e.get("loss_value") if ok(e) else None,
            "infcl_status": i.get("status"), "infcl_ms": im,
            "infcl_mb": i.get("loss_mem_mb") if ok(i) else None,
            "infcl_value": i.get("loss_value") if ok(i) else None,
            "time_vs_infcl": ratio(fm, im),
            "mem_vs_infcl": ratio(f.get("loss_mem_mb") if ok(f) else None,
                                  i.get("loss_mem_mb") if ok(i) else None),
        })
    return out


def relative(got, want):
    """|got - want| / |want|, and whether it is finite and within the
    dtype's tolerance."""
    error = abs(got - want) / max(abs(want), 1e-30)
    return error, math.isfinite(got) and math.isfinite(want)


def value_checks(summary):
    """Fused against eager loss values, and Inf-CL's against both, each
    PASS / FAIL; and whether any failed."""
    lines, failed = [], False
    for s in summary:
        f, e, i = s["fused_value"], s["eager_value"], s["infcl_value"]
        tolerance = VALUE_TOLERANCE[s["dtype"]]
        what = "%s %s B_local %d" % (s["loss"], s["dtype"], s["b_local"])
        if f is not None and e is not None:
            error, finite = relative(f, e)
            good = finite and error <= tolerance
            failed |= not good
            lines.append("value %s: fused %.7g, eager %.7g, relative %.2e "
                         "(<= %g): %s" % (what, f, e, error, tolerance,
                                          "PASS" if good else "FAIL"))
        if i is None or (f is None and e is None):
            continue
        # Inf-CL's against each of the others that ran, at TF32's rule.
        parts, good = [], True
        infcl_tolerance = INFCL_VALUE_TOLERANCE[s["dtype"]]
        for name, want in (("eager", e), ("dloss", f)):
            if want is None:
                continue
            error, finite = relative(i, want)
            good &= finite and error <= infcl_tolerance
            parts.append("%s %.7g, relative %.2e" % (name, want, error))
        failed |= not good
        lines.append("value %s: Inf-CL %.7g; %s (<= %g): %s" % (
            what, i, "; ".join(parts), infcl_tolerance,
            "PASS" if good else "FAIL"))
    return lines, failed


def verdicts(summary):
    """The targets, each PASS / FAIL / n/a with the numbers."""
    lines = []
    for s in summary:
        if s["loss"] == "clip-share":
            continue
        what = "%s %s B_local %d" % (s["loss"], s["dtype"], s["b_local"])
        t = s["time_vs_eager"]
        if s["eager_status"] == "OOM" and s["fused_ms"] is not None:
            lines.append("time  %s: eager OOM, fused %.1f ms: PASS" % (
                what, s["fused_ms"]))
        elif t is not None:
            lines.append("time  %s: fused/eager %.3f (<= %.2f): %s" % (
                what, t, TIME_TARGET, "PASS" if t <= TIME_TARGET else "FAIL"))
        g = s["gemm_fraction"]
        if g is not None:
            lines.append("tiles %s: %.3f of the GEMMs (>= %.2f): %s" % (
                what, g, GEMM_TARGET, "PASS" if g >= GEMM_TARGET else "FAIL"))
        lines += infcl_verdicts(s, what)
        if s["b_local"] == MEM_TARGET_B:
            m = s["mem_vs_eager"]
            if s["eager_status"] == "OOM" and s["fused_mb"] is not None:
                lines.append("mem   %s: eager OOM, fused %.1f MB: PASS" % (
                    what, s["fused_mb"]))
            elif m is not None:
                lines.append("mem   %s: fused/eager %.4f (<= 1/%d): %s" % (
                    what, m, round(1 / MEM_TARGET),
                    "PASS" if m <= MEM_TARGET else "FAIL"))
    return lines


def infcl_verdicts(s, what):
    """The issue's target against Inf-CL: dloss's step time and loss memory
    at most Inf-CL's at the same B_local (an Inf-CL OOM where dloss ran
    passes; no memory figures on the CPU)."""
    if s["infcl_status"] is None or s["fused_ms"] is None:
        return []
    lines = []
    if s["infcl_status"] == "OOM":
        return ["infcl %s: Inf-CL OOM, dloss %.1f ms, %s MB: PASS" % (
            what, s["fused_ms"], fmt(s["fused_mb"], "%.1f"))]
    if s["infcl_status"] != "ok":
        return ["infcl %s: not measured (Inf-CL: %s)" % (
            what, s["infcl_status"][:200])]
    if s["infcl_ms"] is not None:
        lines.append("infcl time %s: dloss %.2f ms, Inf-CL %.2f ms, "
                     "dloss/Inf-CL %.3f (<= 1): %s" % (
                         what, s["fused_ms"], s["infcl_ms"],
                         s["time_vs_infcl"], "PASS"
                         if s["fused_ms"] <= s["infcl_ms"] else "FAIL"))
    if s["fused_mb"] is not None and s["infcl_mb"] is not None:
        lines.append("infcl mem  %s: dloss %.1f MB, Inf-CL %.1f MB, "
                     "dloss/Inf-CL %s (<= 1): %s" % (
                         what, s["fused_mb"], s["infcl_mb"],
                         fmt(s["mem_vs_infcl"], "%.3f"), "PASS"
                         if s["fused_mb"] <= s["infcl_mb"] else "FAIL"))
    return lines


def memory_text(mb, status):
    if status != "ok":
        return status or "-"
    return "n/a (no memory on the CPU)" if mb is None else "%.2f GB" % (
        mb / 1024)


def share_line(summary):
    lines = []
    for s in summary:
        if s["loss"] != "clip-share":
            continue
        lines.append(
            "128k global batch, one GPU's share (B_local %d of %d, %s): "
            "dloss %s (an upper bound: the gathered features' gradients "
            "included; fused ops %s), eager OpenCLIP-style %s; Inf-CL "
            "reports %.2f GB and OpenCLIP %.1f GB per GPU (arXiv "
            "2410.17243, 8 x A800)" % (
                s["b_local"], s["b_global"], s["dtype"],
                memory_text(s["fused_mb"], s["fused_status"]),
                ", ".join(s["fused_ops"] or []) or "unknown",
                memory_text(s["eager_mb"], s["eager_status"]),
                INFCL_GB, INFCL_OPENCLIP_GB))
    return lines


def markdown(meta, summary, lines):
    out = ["# GPU bench (bench/gpu_bench.py)", "",
           "%s; torch %s; %s; d = %d; world 1 over %s; median of up to %d "
           "steps after %d warm-ups" % (meta["device_name"], meta["torch"],
                                        meta["when"], DIM, meta["backend"],
                                        meta["reps"], meta["warmup"]), ""]
    if meta["compiler_library"]:
        out += ["No compiler: %s. Plans came from the plan cache alone, "
                "and the @dloss.loss rows were skipped." %
                meta["compiler_library"], ""]
    out += [

           "| loss | dtype | B_local | fused ms | eager ms | fused/eager "
           "(<= %.1f) | fused MB | eager MB | mem fused/eager (<= 1/%d at "
           "%d) | GEMMs ms | tiles/GEMMs (>= %.1f) | fused TFLOP/s |" % (
               TIME_TARGET, round(1 / MEM_TARGET), MEM_TARGET_B,
               GEMM_TARGET),
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for s in summary:
        out.append("| %s | %s | %d | %s | %s | %s | %s | %s | %s | %s | %s "
                   "| %s |" % (
                       s["loss"], s["dtype"], s["b_local"],
                       fmt(s["fused_ms"], "%.2f", s["fused_status"] or "-"),
                       fmt(s["eager_ms"], "%.2f", s["eager_status"] or "-"),
                       fmt(s["time_vs_eager"], "%.3f"),
                       fmt(s["fused_mb"], "%.1f"), fmt(s["eager_mb"], "%.1f"),
                       fmt(s["mem_vs_eager"], "%.4f"),
                       fmt(s["gemm_ms"], "%.2f"),
                       fmt(s["gemm_fraction"], "%.3f"),
                       fmt(s["fused_tflops"], "%.1f")))
    out += ["", "## dloss against Inf-CL (CLIP, the same inputs)", ""]
    infcl = meta["infcl"]
    if not infcl["rows"]:
        out.append("No Inf-CL rows: %s." % infcl["why"])
    else:
        out += ["inf-cl %s, its ring at world 1; its kernels compute in "
                "float32 with TF32 dot products." % infcl["version"], "",
                "| dtype | B_local | dloss ms | Inf-CL ms | dloss/Inf-CL "
                "time (<= 1) | dloss MB | Inf-CL MB | dloss/Inf-CL mem "
                "(<= 1) | Inf-CL value | dloss value |",
                "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for s in summary:
            if s["infcl_status"] is None:
                continue
            out.append("| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s |"
                       % (s["dtype"], s["b_local"],
                          fmt(s["fused_ms"], "%.2f", s["fused_status"] or
                              "-"),
                          fmt(s["infcl_ms"], "%.2f", s["infcl_status"]),
                          fmt(s["time_vs_infcl"], "%.3f"),
                          fmt(s["fused_mb"], "%.1f"),
                          fmt(s["infcl_mb"], "%.1f"),
                          fmt(s["mem_vs_infcl"], "%.3f"),
                          fmt(s["infcl_value"], "%.7g"),
                          fmt(s["fused_value"], "%.7g")))
    out += ["", "## Targets", ""] + ["- " + l for l in lines["verdicts"]]
    out += ["", "## One GPU's share of a 128k batch", ""] + \
        ["- " + l for l in lines["share"]]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- main


def main():
    args = parse_args()
    import torch
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_bench: SKIPPED: no CUDA device (torch.cuda.is_available() "
              "is False); nothing measured")
        return 0 if args.skip_without_cuda else 1
    import torch.distributed as dist
    try:
        import dloss
    except ImportError as e:
        print("gpu_bench: cannot import dloss (%s): put the build's python "
              "folder on PYTHONPATH (build/python, or build-gpu/python on the "
              "GPU machine)" % e)
        return 1
    dloss.init(backend=args.backend)
    torch.set_grad_enabled(True)
    device = args.device
    print("gpu_bench: world %d over %s" % (dist.get_world_size(),
                                           args.backend))
    args.infcl = infcl_state(device, args.backend)
    if not args.infcl["rows"]:
        print("gpu_bench: no Inf-CL rows: %s" % args.infcl["why"])
    args.compiler = compiler_state()
    if args.compiler:
        print("gpu_bench: %s: plans come from the plan cache "
              "(DLOSS_CACHE_DIR) alone, and the @dloss.loss rows (infonce, "
              "clip-share) are skipped" % args.compiler)
    clock = Clock(device)
    sizes = [int(b) for b in args.b_local.split(",")] if args.b_local else \
        list(QUICK_SIZES if args.quick else FULL_SIZES)
    dtypes = [d for d in args.dtypes.split(",") if d]
    losses = [n for n in args.losses.split(",") if n]
    for d in dtypes:
        if d not in DTYPES:
            sys.exit("gpu_bench: unknown dtype %r (%s)" % (d, ", ".join(
                DTYPES)))
    for n in losses:
        if n not in LOSSES:
            sys.exit("gpu_bench: unknown loss %r (%s)" % (n, ", ".join(
                LOSSES)))
    world = dist.get_world_size()
    gen = torch.Generator(device=device).manual_seed(0)
    rows = []

    def over_budget():
        return time.monotonic() - STARTED > args.budget_s

    def record(row):
        rows.append(row)
        print("gpu_bench: %-10s %-6s %-5s B_local %6d: %s" % (
            row["loss"], row["impl"], row["dtype"], row["b_local"],
            "%.2f ms, %s MB" % (row["median_ms"], row["loss_mem_mb"])
            if row["status"] == "ok" else row["status"]), flush=True)
        # Written after every row: a run stopped at its limit keeps them.
        write(args, device, clock, rows)

    plan = [(n, d, b) for d in dtypes for b in sizes for n in losses]
    if not args.no_share:
        share_b = SHARE_B_LOCAL if not args.quick else sizes[-1]
        plan += [("clip-share", d, share_b) for d in dtypes]
    for name, dname, b in plan:
        dtype = getattr(torch, DTYPES[dname])
        b_global = b * (SHARE_WORLD if name == "clip-share" else world)
        base = {"loss": name, "dtype": dname, "b_local": b,
                "b_global": b_global, "d": DIM}
        skipped = "skipped: the run passed --budget-s %g" % args.budget_s
        impls = [("fused", fused), ("eager", eager)]
        if name == "clip" and args.infcl["rows"]:
            impls.append(("infcl", lambda _: infcl_clip))
        if over_budget():
            for impl, _ in impls + [("gemm", None)]:
                record(dict(base, impl=impl, status=skipped))
            continue
        leaves = inputs(name, b, dtype, device, gen)
        for impl, make in impls:
            row = dict(base, impl=impl)
            if over_budget():
                record(dict(row, status=skipped))
                continue
            if impl == "fused" and args.compiler and name in (
                    "infonce", "clip-share"):
                record(dict(row, status="skipped: @dloss.loss needs the "
                            "compiler library to trace (it does not load)"))
                continue
            fn = make(name)
            row.update(run_step(clock, fn, leaves, args))
            if impl == "fused":
                row["fused_ops"] = fused_ops(fn, leaves)
            record(row)
        del leaves
        if clock.cuda:
            torch.cuda.empty_cache()
        if name != "clip-share":
            row = dict(base, impl="gemm")
            row.update(run_gemms(clock, b, b_global, dtype, device, args)
                       if not over_budget() else {"status": skipped})
            record(row)

    summary, lines = write(args, device, clock, rows)
    for line in lines["verdicts"] + lines["share"]:
        print("gpu_bench: " + line)
    print("gpu_bench: wrote %s and gpu_bench.md (%.0f s)" % (
        os.path.join(args.out, "gpu_bench.json"),
        time.monotonic() - STARTED))
    # An error fails the run, except Inf-CL's: the reference, not the
    # subject (its values are checked all the same).
    failed = [r for r in rows if r["status"].startswith("error")]
    for r in failed:
        print("gpu_bench: %s: %s %s %s B_local %d: %s" % (
            "Inf-CL did not run (not a failure of this run)"
            if r["impl"] == "infcl" else "FAILED", r["loss"], r["impl"],
            r["dtype"], r["b_local"], r["status"]))
    failed = [r for r in failed if r["impl"] != "infcl"]
    _, wrong = value_checks(summary)
    if wrong:
        print("gpu_bench: FAILED: a loss value differs from the eager one "
              "(the value lines above)")
    return 1 if failed or wrong else 0


def write(args, device, clock, rows):
    """gpu_bench.json and gpu_bench.md of the rows so far; (summary, lines)."""
    import torch
    summary = summarise(rows)
    values, _ = value_checks(summary)
    lines = {"verdicts": verdicts(summary) + values,
             "share": share_line(summary)}
    meta = {"device": device,
            "device_name": torch.cuda.get_device_name() if clock.cuda else
            "CPU (%s, a dry run: times from perf_counter, no memory)" %
            platform.machine(),
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "reps": args.reps, "warmup": args.warmup, "quick": args.quick,
            "backend": args.backend, "infcl": args.infcl,
            "compiler_library": args.compiler,
            "seconds": round(time.monotonic() - STARTED, 1)}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "gpu_bench.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows, "summary": summary,
                   "lines": lines}, f, indent=1)
    with open(os.path.join(args.out, "gpu_bench.md"), "w") as f:
        f.write(markdown(meta, summary, lines))
    return summary, lines


if __name__ == "__main__":
    sys.exit(main())
