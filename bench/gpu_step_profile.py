#!/usr/bin/env python3
"""Where a small step's time goes on the GPU: one forward + backward of
dloss's fused loss and of the eager (OpenCLIP-style) loss of
bench/gpu_bench.py, at small B_local, under torch.profiler.

For each (loss, B_local) it reports the step's wall time (perf_counter
around the step and a device synchronisation, median of --reps), and the
profiler's top operations by host time with their device time, so that a
fixed cost (host work, synchronisations, NCCL at world 1) is named. Runs
where bench/gpu_bench.py runs (dloss.init on one rank; scripts/gpu-check.sh
sets the paths), and on the CPU as a dry run (--device cpu).

usage: bench/gpu_step_profile.py --out DIR [--device cuda] [--dtype f32]
           [--losses clip,siglip] [--b-local 8,512] [--reps 30] [--top 25]
           [--backend nccl]
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gpu_bench  # noqa: E402


def wall_ms(step, sync, reps):
    """The median wall time of `step` (and a synchronisation), ms."""
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        step()
        sync()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--dtype", default="f32", choices=("f32", "bf16"))
    p.add_argument("--losses", default="clip,siglip")
    p.add_argument("--b-local", default="8,512")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--backend", default=None)
    args = p.parse_args()
    import torch
    import dloss

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_step_profile: no CUDA device")
        return 1
    dloss.init(backend=args.backend)
    device = args.device
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    os.makedirs(args.out, exist_ok=True)
    lines = ["# One small step under torch.profiler (bench/gpu_step_profile.py)",
             "", "%s; torch %s; %s; world 1" % (
                 torch.cuda.get_device_name() if device == "cuda" else "CPU",
                 torch.__version__, args.dtype), ""]
    summary = ["| loss | B_local | row | wall ms (median of %d) |" % args.reps,
               "|---|---:|---|---:|"]
    for name in [x for x in args.losses.split(",") if x]:
        for b_local in [int(x) for x in args.b_local.split(",") if x]:
            gen = torch.Generator(device=device).manual_seed(0)
            leaves = gpu_bench.inputs(name, b_local, dtype, device, gen)
            for row, fn in (("dloss", gpu_bench.fused(name)),
                            ("eager", gpu_bench.eager(name))):
                def step():
                    for t in leaves:
                        t.grad = None
                    fn(*leaves).backward()
                for _ in range(5):
                    step()
                sync()
                ms = wall_ms(step, sync, args.reps)
                summary.append("| %s | %d | %s | %.3f |" % (name, b_local,
                                                           row, ms))
                with torch.profiler.profile(activities=activities) as prof:
                    step()
                    sync()
                sort = "self_cpu_time_total"
                table = prof.key_averages().table(sort_by=sort,
                                                  row_limit=args.top)
                lines += ["## %s, B_local %d, %s: %.3f ms a step" % (
                    name, b_local, row, ms), "", "```", table, "```", ""]
                print("gpu_step_profile: %s B_local %d %s: %.3f ms" % (
                    name, b_local, row, ms), flush=True)
    text = "\n".join(lines[:4] + summary + [""] + lines[4:]) + "\n"
    with open(os.path.join(args.out, "gpu_step_profile.md"), "w") as f:
        f.write(text)
    print("\n".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
