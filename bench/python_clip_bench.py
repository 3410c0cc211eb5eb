#!/usr/bin/env python3
"""Python rows of the CLIP benchmark: dloss.ClipLoss against OpenCLIP-style
eager Python on the same ranks, and the Python layer's overhead over the C++
JIT it wraps.

On N local ranks (processes, Gloo on loopback, one intra-op thread each),
features [B_local, d] fp32, for each B_local it runs
  * py-eager:  OpenCLIP's ClipLoss with local_loss=True, gather_with_grad=True
               in eager PyTorch on the script's torch.distributed group (the
               gather with gradient is the exact one: forward all_gather,
               backward all_reduce(sum) and this rank's rows, as
               torch.distributed.nn.all_gather does), the baseline;
  * py-dloss:  dloss.ClipLoss() on the same group (the fused plan);
  * cpp-jit:   build/bin/dloss-bench-jit-clip --world N: the same loss through
               dloss::jit from C++ (its own Gloo group), the reference of the
               Python layer's overhead;
and reports the median time of one forward + backward (the ranks line up
before each timed call, so a call's time is its own) and the loss's memory
per rank (peak RSS minus the RSS right before the first call, with the peak
reset through /proc/self/clear_refs), as ratios against py-eager of the same
B_local, and py-dloss / cpp-jit - 1 as the overhead. Every number is the
worst rank's. Writes OUT/python_clip.csv.

usage: bench/python_clip_bench.py [--b-local 1024,4096] [--dim 256]
           [--world 4] [--iters 10] [--warmup 2] [--build build] [--out DIR]
"""
import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def rss_mb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def reset_peak():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def rank_main(impl, rank, world, port, b_local, dim, iters, warmup, queue):
    # The parent hosts the store, as torchrun's agent does (run_python).
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      RANK=str(rank), WORLD_SIZE=str(world),
                      OMP_NUM_THREADS="1", TORCHELASTIC_USE_AGENT_STORE="True",
                      TORCHELASTIC_RESTART_COUNT="0")
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    torch.set_num_threads(1)
    dist.init_process_group("gloo")

    class GatherWithGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            parts = [torch.empty_like(x) for _ in range(world)]
            dist.all_gather(parts, x.contiguous())
            ctx.rows = x.shape[0]
            return torch.cat(parts)

        @staticmethod
        def backward(ctx, grad):
            grad = grad.contiguous().clone()
            dist.all_reduce(grad)
            return grad[rank * ctx.rows:(rank + 1) * ctx.rows]

    torch.manual_seed(rank)
    image = F.normalize(torch.randn(b_local, dim), dim=1).requires_grad_()
    text = F.normalize(torch.randn(b_local, dim), dim=1).requires_grad_()
    scale = torch.tensor(14.285714, requires_grad=True)
    labels = torch.arange(b_local) + b_local * rank

    if impl == "py-dloss":
        import dloss
        loss_fn = dloss.ClipLoss()

        def call():
            return loss_fn(image, text, scale)
    else:
        def call():
            all_image = GatherWithGrad.apply(image)
            all_text = GatherWithGrad.apply(text)
            return (F.cross_entropy(scale * image @ all_text.T, labels) +
                    F.cross_entropy(scale * text @ all_image.T, labels)) / 2

    def step():
        for t in (image, text, scale):
            t.grad = None
        loss = call()
        loss.backward()
        return loss.item()

    before = rss_mb("VmRSS")
    reset = reset_peak()
    for _ in range(warmup):
        step()
    times = []
    for _ in range(iters):
        dist.barrier()
        start = time.perf_counter()
        loss = step()
        times.append((time.perf_counter() - start) * 1000.0)
    hwm = rss_mb("VmHWM")
    queue.put({"impl": impl, "rank": rank, "b_local": b_local, "loss": loss,
               "median_ms": statistics.median(times),
               "loss_mem_mb": hwm - before, "hwm_reset": reset})
    dist.barrier()


def run_python(impl, args, b_local):
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    from datetime import timedelta
    import torch.distributed as dist
    store = dist.TCPStore("127.0.0.1", 0, args.world, True,
                          timedelta(seconds=600), wait_for_workers=False)
    port = store.port
    procs = [ctx.Process(target=rank_main,
                         args=(impl, r, args.world, port, b_local, args.dim,
                               args.iters, args.warmup, queue))
             for r in range(args.world)]
    for p in procs:
        p.start()
    rows = [queue.get(timeout=args.timeout) for _ in procs]
    for p in procs:
        p.join()
    return rows


def run_jit(args, b_local):
    binary = os.path.join(args.build, "bin", "dloss-bench-jit-clip")
    env = {k: v for k, v in os.environ.items() if k != "MASTER_PORT"}
    env["OMP_NUM_THREADS"] = "1"  # the binary reserves its own port
    out = subprocess.run(
        [binary, "--world", str(args.world), "--b-local", str(b_local),
         "--dim", str(args.dim), "--iters", str(args.iters), "--warmup",
         str(args.warmup), "--threads", "1"],
        env=env, capture_output=True, text=True, timeout=args.timeout)
    if out.returncode != 0:
        raise SystemExit("dloss-bench-jit-clip failed:\n" + out.stderr)
    rows = [json.loads(line) for line in out.stdout.splitlines()
            if line.startswith("{")]
    for row in rows:
        row["impl"] = "cpp-jit"
    return rows


def worst(rows):
    return {"median_ms": max(r["median_ms"] for r in rows),
            "loss_mem_mb": max(r["loss_mem_mb"] for r in rows),
            "loss": rows[0]["loss"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--b-local", default="1024,4096")
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--out", default=os.path.join(ROOT, "bench",
                                                      "results"))
    args = parser.parse_args()
    sys.path.insert(0, os.path.join(args.build, "python"))
    os.makedirs(args.out, exist_ok=True)

    table = []
    for b_local in [int(b) for b in args.b_local.split(",")]:
        results = {
            "py-eager": worst(run_python("py-eager", args, b_local)),
            "py-dloss": worst(run_python("py-dloss", args, b_local)),
            "cpp-jit": worst(run_jit(args, b_local)),
        }
        base = results["py-eager"]
        for impl, r in results.items():
            table.append({
                "impl": impl, "b_local": b_local, "d": args.dim,
                "world": args.world, "median_ms": round(r["median_ms"], 3),
                "loss_mem_mb": round(r["loss_mem_mb"], 2),
                "time_vs_py_eager": round(r["median_ms"] / base["median_ms"],
                                          3),
                "mem_vs_py_eager": round(
                    r["loss_mem_mb"] / base["loss_mem_mb"], 4)
                if base["loss_mem_mb"] > 0 else "",
                "loss": r["loss"]})
        overhead = results["py-dloss"]["median_ms"] / \
            results["cpp-jit"]["median_ms"] - 1
        print("B_local %d: py-dloss %.1f ms, %.1f MB; py-eager %.1f ms, "
              "%.1f MB; cpp-jit %.1f ms; Python overhead over the C++ JIT "
              "%+.1f%%" % (b_local, results["py-dloss"]["median_ms"],
                           results["py-dloss"]["loss_mem_mb"],
                           base["median_ms"], base["loss_mem_mb"],
                           results["cpp-jit"]["median_ms"], 100 * overhead),
              flush=True)
    path = os.path.join(args.out, "python_clip.csv")
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(table[0]))
        writer.writeheader()
        writer.writerows(table)
    print("\n%-9s %7s %10s %11s %8s %8s" % ("impl", "B_local", "median_ms",
                                            "loss_mem_mb", "time_x",
                                            "mem_x"))
    for row in table:
        print("%-9s %7d %10.1f %11.1f %8s %8s" % (
            row["impl"], row["b_local"], row["median_ms"],
            row["loss_mem_mb"], row["time_vs_py_eager"],
            row["mem_vs_py_eager"]))
    print("wrote", path)


if __name__ == "__main__":
    main()
