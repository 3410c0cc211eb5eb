#!/usr/bin/env python3
"""sentence-transformers' MultipleNegativesRankingLoss (MNRL) with one hard
negative, gathered across ranks: dloss's drop-ins against
sentence-transformers' own, the loss alone, on the same ranks and inputs.

On N local ranks (processes, Gloo on loopback, one intra-op thread each),
fp32, d features, for each B_local it runs these rows (--impls picks them;
the baseline always runs, as every ratio needs it):

  row          what runs (each rank, one timed call)
  st-mnrl      sentence_transformers.sentence_transformer.losses.
               MultipleNegativesRankingLoss(None, gather_across_devices=True)
               .compute_loss_from_embeddings([a, p, n], None), .backward()
               (the baseline)
  st-cmnrl     ...losses.CachedMultipleNegativesRankingLoss(model,
               mini_batch_size=32, gather_across_devices=True)
               .calculate_loss(reps, None, with_backward=True): GradCache's
               loss stage, reps = each column cut into mini-batches of 32
               rows (detached leaves with requires_grad, as its
               forward_cached makes them); it gathers once, then runs one
               backward per mini-batch, each through the gathers' backward
  dloss-mnrl   dloss.sentence_transformers.MultipleNegativesRankingLoss(
               None, gather_across_devices=True), the same call as st-mnrl
  dloss-cmnrl  dloss.sentence_transformers.CachedMultipleNegativesRankingLoss(
               model, mini_batch_size=32, gather_across_devices=True), the
               same call as st-cmnrl (one fused call over the whole batch)

`model` is torch.nn.Sequential(torch.nn.Linear(1, 1)): the cached losses'
constructors only index model[0] (has_static_embedding_input), and the loss
stage never calls it. No row embeds anything.

Inputs per rank: anchor, positive and hard negative, three float32 [B_local,
d] randn leaves with requires_grad, seeded by rank, the same for every row.
Each row's loss is checked against the baseline's (a note if they differ by
more than 1e-4 relative): sentence-transformers returns each rank's mean
over its own rows, averaged here over the ranks (equal batches: the global
loss); dloss returns the global loss on every rank.

It reports the median time of one forward + backward (the ranks line up
before each timed call, so a call's time is its own) and the loss's memory
per rank (peak RSS minus the RSS right before the first call at B_local,
with the peak reset through /proc/self/clear_refs; every row first makes
one untimed call on 8 rows per rank, so that what a process pays once,
dloss's plan compile and compiler library or torch's lazy set-up, is not
counted as the loss's memory), each the worst rank's, as ratios
against st-mnrl of the same B_local (and, for the dloss rows, against the
sentence-transformers row they replace). It also counts the collectives
one call makes through torch.distributed's Python API (an extra, untimed
call): sentence-transformers' all make theirs there; dloss's run in its C++
runtime and are not counted. Writes OUT/st_mnrl.csv.

usage: bench/st_mnrl_bench.py [--b-local 256,1024] [--dim 384] [--world 4]
           [--impls st-mnrl,st-cmnrl,dloss-mnrl,dloss-cmnrl]
           [--mini-batch 32] [--iters 10] [--warmup 2] [--build build]
           [--out DIR]
"""
import argparse
import collections
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
# The CLIP bench's memory probes (the module has no import-time effects).
from python_clip_bench import (  # noqa: E402
    join_ranks, measure, run_ranks, write_table)

BASELINE = "st-mnrl"
ROWS = ["st-mnrl", "st-cmnrl", "dloss-mnrl", "dloss-cmnrl"]
# The sentence-transformers row each dloss row replaces.
ORIGINAL = {"st-mnrl": "st-mnrl", "st-cmnrl": "st-cmnrl",
            "dloss-mnrl": "st-mnrl", "dloss-cmnrl": "st-cmnrl"}
# torch.distributed's Python collectives, counted per call (the ones
# torch.distributed.nn's all_gather and its Gloo backward use, and more).
COUNTED = ["all_gather", "all_gather_into_tensor", "all_reduce",
           "all_to_all", "all_to_all_single", "broadcast", "gather",
           "reduce", "reduce_scatter", "reduce_scatter_tensor", "scatter",
           "send", "recv", "isend", "irecv", "batch_isend_irecv"]


# The rows per rank of the untimed first call (rank_main).
WARM_ROWS = 8


def make_loss(row, mini_batch):
    import torch
    if row.startswith("dloss-"):
        import dloss.sentence_transformers as losses
    else:
        from sentence_transformers.sentence_transformer import losses
    if row.endswith("-cmnrl"):
        model = torch.nn.Sequential(torch.nn.Linear(1, 1))
        return losses.CachedMultipleNegativesRankingLoss(
            model, mini_batch_size=mini_batch, gather_across_devices=True)
    return losses.MultipleNegativesRankingLoss(
        None, gather_across_devices=True)


def make_call(row, loss, tensors, mini_batch):
    """(call, the leaves whose .grad a call fills): one forward + backward."""
    if row.endswith("-cmnrl"):
        reps = [[c.detach().requires_grad_()
                 for c in t.detach().split(mini_batch)] for t in tensors]
        leaves = [c for column in reps for c in column]

        def call():
            return loss.calculate_loss(reps, None, with_backward=True)
        return call, leaves

    def call():
        value = loss.compute_loss_from_embeddings(tensors, None)
        value.backward()
        return value
    return call, tensors


def count_collectives(call):
    """{name: count} of torch.distributed's Python collectives one call
    makes (torch.distributed.nn calls them through the module)."""
    import torch.distributed as dist
    counts = collections.Counter()
    saved = {}
    for name in COUNTED:
        fn = getattr(dist, name, None)
        if fn is None:
            continue
        saved[name] = fn

        def counting(*args, _name=name, _fn=fn, **kwargs):
            counts[_name] += 1
            return _fn(*args, **kwargs)
        setattr(dist, name, counting)
    try:
        call()
    finally:
        for name, fn in saved.items():
            setattr(dist, name, fn)
    return dict(counts)


def rank_main(row, rank, world, port, b_local, dim, mini_batch, iters,
              warmup, queue):
    import torch
    import torch.distributed as dist
    join_ranks(rank, world, port)

    g = torch.Generator().manual_seed(rank)
    loss_fn = make_loss(row, mini_batch)
    # One untimed call on a few rows first: what a process pays once (dloss
    # compiling or loading its plan, which is shape-generic, and the
    # compiler library; torch's lazy set-up) is not the loss's memory.
    small = [torch.randn(WARM_ROWS, dim, generator=g).requires_grad_()
             for _ in range(3)]
    make_call(row, loss_fn, small, mini_batch)[0]()
    del small
    tensors = [torch.randn(b_local, dim, generator=g).requires_grad_()
               for _ in range(3)]  # anchor, positive, hard negative
    call, leaves = make_call(row, loss_fn, tensors, mini_batch)

    def step():
        for t in leaves:
            t.grad = None
        return call().item()

    value, median_ms, loss_mem_mb, reset = measure(step, iters, warmup,
                                                   dist.barrier)
    dist.barrier()
    counts = count_collectives(step)
    values = [None] * world
    dist.all_gather_object(values, value)
    queue.put({"impl": row, "rank": rank, "b_local": b_local,
               "loss": sum(values) / world, "median_ms": median_ms,
               "loss_mem_mb": loss_mem_mb, "hwm_reset": reset,
               "collectives": counts})
    dist.barrier()


def run_row(row, args, b_local):
    return run_ranks(rank_main, args.world, args.timeout,
                     lambda r, port, queue: (
                         row, r, args.world, port, b_local, args.dim,
                         args.mini_batch, args.iters, args.warmup, queue))


def worst(rows):
    counts = rows[0]["collectives"]
    return {"median_ms": max(r["median_ms"] for r in rows),
            "loss_mem_mb": max(r["loss_mem_mb"] for r in rows),
            "loss": rows[0]["loss"],
            "hwm_reset": all(r["hwm_reset"] for r in rows),
            "py_collectives": sum(counts.values()),
            "collectives": " ".join("%s:%d" % kv
                                    for kv in sorted(counts.items()))}


def ratio(a, b, digits):
    return round(a / b, digits) if b else ""


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--b-local", default="256,1024")
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--impls", default=",".join(ROWS),
                        help="rows (%s); st-mnrl is always added" %
                        ", ".join(ROWS))
    parser.add_argument("--mini-batch", type=int, default=32,
                        help="the cached losses' mini_batch_size")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--out", default=os.path.join(ROOT, "bench",
                                                      "results"))
    args = parser.parse_args()
    sys.path.insert(0, os.path.join(args.build, "python"))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(args.build, "python")] +
        [p for p in [os.environ.get("PYTHONPATH")] if p])
    wanted = [s for s in args.impls.split(",") if s]
    for name in wanted:
        if name not in ROWS:
            raise SystemExit("--impls: unknown %r (rows: %s)" % (
                name, ", ".join(ROWS)))
    rows_wanted = [r for r in ROWS if r in wanted or r == BASELINE]
    sizes = sorted(int(b) for b in args.b_local.split(","))
    os.makedirs(args.out, exist_ok=True)

    table = []
    for b_local in sizes:
        results = collections.OrderedDict()
        for row in rows_wanted:
            r = {"status": "ran", "note": ""}
            try:
                r.update(worst(run_row(row, args, b_local)))
                if not r["hwm_reset"]:
                    r["note"] = "peak RSS not reset (no clear_refs)"
            except RuntimeError as e:
                r.update(status="failed", note=str(e))
            results[row] = r
            print("B_local %d %s: %s" % (
                b_local, row, "%.1f ms, %.1f MB, %d Python collectives" % (
                    r["median_ms"], r["loss_mem_mb"], r["py_collectives"])
                if r["status"] == "ran" else "failed (%s)" % r["note"]),
                flush=True)
        base = results[BASELINE]
        for row, r in results.items():
            orig = results.get(ORIGINAL[row], {})
            ran = r["status"] == "ran" and base["status"] == "ran"
            ran_orig = r["status"] == "ran" and orig.get("status") == "ran"
            note = r["note"]
            if ran and row != BASELINE and abs(
                    r["loss"] - base["loss"]) > 1e-4 * abs(base["loss"]):
                note += "; loss %.6g differs from the baseline's %.6g" % (
                    r["loss"], base["loss"])
            table.append({
                "impl": row, "baseline": BASELINE,
                "original": ORIGINAL[row], "b_local": b_local,
                "b_global": b_local * args.world, "d": args.dim,
                "world": args.world, "mini_batch": args.mini_batch
                if row.endswith("-cmnrl") else "", "iters": args.iters,
                "status": r["status"],
                "median_ms": round(r["median_ms"], 3) if ran else "",
                "loss_mem_mb": round(r["loss_mem_mb"], 2) if ran else "",
                "time_vs_baseline": ratio(r["median_ms"], base["median_ms"],
                                          3) if ran else "",
                "mem_vs_baseline": ratio(r["loss_mem_mb"],
                                         base["loss_mem_mb"], 4)
                if ran else "",
                "time_vs_original": ratio(r["median_ms"], orig["median_ms"],
                                          3) if ran_orig else "",
                "mem_vs_original": ratio(r["loss_mem_mb"],
                                         orig["loss_mem_mb"], 4)
                if ran_orig else "",
                "py_collectives": r.get("py_collectives", "")
                if row.startswith("st-") else "",
                "collectives": r.get("collectives", "")
                if row.startswith("st-") else "(dloss's C++ runtime)",
                "loss_value": r.get("loss", ""), "note": note.strip("; ")})
    print("\n%-12s %7s %-7s %10s %11s %7s %7s %7s %7s %6s  %s" % (
        "impl", "B_local", "status", "median_ms", "loss_mem_mb", "time_x",
        "mem_x", "t_orig", "m_orig", "colls", "note"))
    for row in table:
        print("%-12s %7d %-7s %10s %11s %7s %7s %7s %7s %6s  %s" % (
            row["impl"], row["b_local"], row["status"], row["median_ms"],
            row["loss_mem_mb"], row["time_vs_baseline"],
            row["mem_vs_baseline"], row["time_vs_original"],
            row["mem_vs_original"], row["py_collectives"], row["note"]))
    return write_table(table, os.path.join(args.out, "st_mnrl.csv"))


if __name__ == "__main__":
    sys.exit(main())
