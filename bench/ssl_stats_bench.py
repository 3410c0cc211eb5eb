#!/usr/bin/env python3
"""Barlow Twins and VICReg across ranks: dloss.lightly's drop-ins, which
all-reduce the global batch's statistics, against lightly's own
gather_distributed=True forms, on the same ranks.

On N local ranks (processes, Gloo on loopback, one intra-op thread each),
fp32, d features, B_local rows of two views per rank (random, requiring
grad), for each B_local these rows run forward + backward:

  row                   what runs
  lightly-barlowtwins   lightly.loss.BarlowTwinsLoss(gather_distributed=True)
                        (each rank batch-normalises its own rows; the d x d
                        cross-correlations are all-reduced: the baseline)
  dloss-barlowtwins     dloss.lightly.BarlowTwinsLoss(gather_distributed=True)
                        (the global batch's normalisation: O(d) all-reduces,
                        then the cross-correlation's O(d^2) one)
  lightly-vicreg        lightly.loss.VICRegLoss(gather_distributed=True)
                        (every rank's rows gathered: the baseline)
  dloss-vicreg          dloss.lightly.VICRegLoss(gather_distributed=True)
                        (O(d) and O(d^2) all-reduces; no row moves)

Reported per row: the median time of one call, from one run of both rows
on the same ranks, calls alternating (the ranks line up before each timed
call, so a call's time is its own; rows launched apart drift with the
machine's state by more than the difference measured), the loss's memory
per rank (peak RSS minus the RSS right before the first call, the peak
reset through /proc/self/clear_refs), from a launch of the row alone, both
the worst rank's, and their ratios against the baseline of the same loss
and B_local. `alone_ms` is the row's time in its own launch. Targets
(#48): memory O(d^2) whatever the world size, and no slower than lightly's
form.

Runs where lightly imports (it needs torchvision): the CUDA torch's venv,
.venv-cuda, with the CUDA build's dloss, e.g.

  DLOSS_COMPILER_LIBRARY=build/frontend/libdloss_compiler.so \\
  PYTHONPATH=build-cuda/python .venv-cuda/bin/python bench/ssl_stats_bench.py

Writes OUT/ssl_stats.csv.

usage: bench/ssl_stats_bench.py [--world 4] [--b-local 256,1024,4096]
           [--dim 2048] [--losses barlowtwins,vicreg] [--iters 5]
           [--warmup 1] [--timeout 1800] [--out DIR]
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from python_clip_bench import (join_ranks, measure, run_ranks,  # noqa: E402
                               write_table)

CLASSES = {"barlowtwins": "BarlowTwinsLoss", "vicreg": "VICRegLoss"}


def make_step(impl, loss, rank, b_local, dim):
    """One call of `impl`'s loss (forward + backward) on this rank's two
    views, returning the loss value."""
    import torch
    if impl == "dloss":
        import dloss.lightly as module
    else:
        import lightly.loss as module
    fn = getattr(module, CLASSES[loss])(gather_distributed=True)
    g = torch.Generator().manual_seed(rank)
    a = torch.randn(b_local, dim, generator=g).requires_grad_()
    b = (a.detach() + torch.randn(b_local, dim, generator=g)) \
        .requires_grad_()

    def step():
        a.grad = b.grad = None
        value = fn(a, b)
        value.backward()
        return value.item()
    return step


def paired_main(loss, rank, world, port, b_local, dim, iters, warmup, queue):
    """Both rows on the same ranks, calls alternating (which goes first
    alternates too): the median time of each."""
    import torch.distributed as dist
    join_ranks(rank, world, port)
    steps = {impl: make_step(impl, loss, rank, b_local, dim)
             for impl in ("lightly", "dloss")}
    for _ in range(warmup):
        for step in steps.values():
            step()
    times = {impl: [] for impl in steps}
    for i in range(iters):
        for impl in (("lightly", "dloss") if i % 2 == 0
                     else ("dloss", "lightly")):
            dist.barrier()
            start = time.perf_counter()
            steps[impl]()
            times[impl].append((time.perf_counter() - start) * 1000.0)
    queue.put({"rank": rank, **{impl: statistics.median(t)
                                for impl, t in times.items()}})


def rank_main(row, rank, world, port, b_local, dim, iters, warmup, queue):
    import torch.distributed as dist
    join_ranks(rank, world, port)
    impl, loss = row.split("-")
    step = make_step(impl, loss, rank, b_local, dim)
    value, median_ms, loss_mem_mb, reset = measure(step, iters, warmup,
                                                   dist.barrier)
    values = [None] * world
    dist.all_gather_object(values, value)
    queue.put({"impl": row, "rank": rank, "b_local": b_local,
               "loss": sum(values) / world, "median_ms": median_ms,
               "loss_mem_mb": loss_mem_mb, "hwm_reset": reset})


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--b-local", default="256,1024,4096")
    parser.add_argument("--dim", type=int, default=2048)
    parser.add_argument("--losses", default="barlowtwins,vicreg")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()
    table = []
    for b_local in [int(v) for v in args.b_local.split(",")]:
        for loss in args.losses.split(","):
            base = None

            def launch(target, what):
                """`target(what, rank, ...)` on the ranks, for this
                B_local."""
                return run_ranks(target, args.world, args.timeout,
                                 lambda r, port, queue: (
                                     what, r, args.world, port, b_local,
                                     args.dim, args.iters, args.warmup,
                                     queue))
            try:
                paired = launch(paired_main, loss)
            except RuntimeError as e:
                print("%s B_local=%d, both rows: failed: %s" % (
                    loss, b_local, e))
                paired = None
            for impl in ("lightly", "dloss"):
                row = "%s-%s" % (impl, loss)
                try:
                    ranks = launch(rank_main, row)
                except RuntimeError as e:
                    print("%s B_local=%d failed: %s" % (row, b_local, e))
                    table.append({"loss": loss, "impl": impl,
                                  "world": args.world, "b_local": b_local,
                                  "dim": args.dim, "median_ms": "",
                                  "alone_ms": "",
                                  "loss_mem_mb": "", "time_ratio": "",
                                  "mem_ratio": "", "loss_value": "",
                                  "status": "failed"})
                    continue
                alone = max(r["median_ms"] for r in ranks)
                ms = max(r[impl] for r in paired) if paired else alone
                mem = max(r["loss_mem_mb"] for r in ranks)
                if impl == "lightly":
                    base = (ms, mem)
                entry = {"loss": loss, "impl": impl, "world": args.world,
                         "b_local": b_local, "dim": args.dim,
                         "median_ms": "%.1f" % ms,
                         "alone_ms": "%.1f" % alone,
                         "loss_mem_mb": "%.1f" % mem,
                         "time_ratio": "%.2f" % (ms / base[0]) if base
                         else "",
                         "mem_ratio": "%.3f" % (mem / base[1])
                         if base and base[1] > 0 else "",
                         "loss_value": "%.6g" % ranks[0]["loss"],
                         "status": "ok" if paired else "failed"}
                table.append(entry)
                print("%-20s B_local %5d: %8.1f ms (alone %8.1f)  %8.1f MB  "
                      "time x%s  memory x%s  loss %s" % (
                          row, b_local, ms, alone, mem, entry["time_ratio"],
                          entry["mem_ratio"], entry["loss_value"]),
                      flush=True)
                os.makedirs(args.out, exist_ok=True)
                write_table(table, os.path.join(args.out, "ssl_stats.csv"))
    return 1 if any(r["status"] == "failed" for r in table) else 0


if __name__ == "__main__":
    sys.exit(main())
