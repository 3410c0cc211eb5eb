#!/usr/bin/env python3
"""Small per-rank batches: dloss's fused losses under each schedule (ring,
gather, auto) against the hand-written originals, for the loss alone and
for a DDP step of a tiny model, with the messages one call sends.

On N local ranks (processes, Gloo on loopback, one intra-op thread each),
fp32, d features, for each world size, B_local, loss and mode it runs these
rows on the same ranks, interleaved in rounds (baseline, ring, gather, auto,
baseline, ...) so that drift on a shared machine hits every row alike:

  loss     row                 what runs
  clip     openclip-clip       open_clip.loss.ClipLoss(local_loss=True,
                               gather_with_grad=True, rank, world_size)
                               (OpenCLIP's exact mode; the baseline)
  siglip   openclip-siglip     open_clip.loss.SigLipLoss(rank, world_size)
                               (default dist_impl 'bidir'; the baseline)
  arcface  pml-arcface         pytorch_metric_learning's ArcFaceLoss(C, d)
                               on the global batch: embeddings gathered with
                               torch.distributed.nn.all_gather, labels with
                               dist.all_gather, and W's gradient averaged
                               by hand (all_reduce / N) after backward (the
                               baseline)
           pml-arcface-local   the same loss on this rank's rows only, W's
                               gradient averaged by hand: the same value and
                               gradients for even batches, without the
                               gather (the cheapest exact equivalent)
  each     dloss-ring          dloss.ClipLoss / SigLipLoss / ArcFaceLoss
           dloss-gather        with the process's schedule set to ring,
           dloss-auto          gather or auto (dloss.set_schedule, else
                               dloss._C.set_schedule) before the row's calls

Modes:
  loss  forward + backward of the loss alone on random unit-norm features
        [B_local, d] requiring grad (CLIP/SigLIP's scale and bias too).
  step  one DDP step of a tiny model: towers nn.Linear(64, d) (CLIP and
        SigLIP: image and text towers, logit scale (and bias) as model
        parameters; ArcFace: one tower, W in the loss) wrapped in
        DistributedDataParallel; forward, loss, backward (ArcFace's
        baselines then average W's gradient by hand), SGD step.

Timing: --warmup calls of every row, then --iters rounds (--iters-big at
B_local >= 1024), each round starting one row later than the last; a dloss
row's timed call follows an untimed call of the same row, as in a training
loop (its preflight then carries the rows: the fold), and before each timed
call the ranks line up (dist.barrier), so a call's time is its own. Reported: the median per rank, the worst rank,
and ratio = row / the baseline of the same (loss, mode, world, B_local).

Messages per call: after the timed calls each row makes one more call under
torch.profiler on every rank; rank 0's events named "gloo:..." are the Gloo
operations it started (gloo:send, gloo:recv, gloo:all_gather, ...: Gloo's
work items, recorded whether they come from torch.distributed or from
dloss's runtime), and for dloss rows the communicator's numbered collectives
(`collectives_started`, a ring exchange counting as one) started by the
call. The auto row's counts say which schedule it took.

Values: every row's first call (loss mode: the same inputs on every call;
step mode: the models before any update) is averaged over the ranks (the
originals' per-rank values average to the global loss for even batches;
dloss's value is the global loss on every rank) and checked against the
baseline's (a note when they differ by more than 1e-4 relative).

Writes OUT/small_batch.csv (after every case: an interrupted run keeps what it
measured), prints a table, the ring/gather crossover per
(loss, mode, world) and one verdict line per target (dloss-auto at most 1.0x
the baseline for the loss alone, at most 1.05x for the step).

usage: bench/small_batch_bench.py [--world 4,2] [--b-local 8,32,128,512,2048]
           [--dim 256] [--classes 1000] [--losses clip,siglip,arcface]
           [--modes loss,step] [--iters 20] [--iters-big 5] [--warmup 2]
           [--timeout 900] [--quick] [--build build] [--out DIR]
"""
import argparse
import collections
import csv
import math
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from python_clip_bench import (  # noqa: E402
    join_ranks, make_inputs, run_ranks, upstream, write_table)

BASELINE = {"clip": "openclip-clip", "siglip": "openclip-siglip",
            "arcface": "pml-arcface"}
EXTRA = {"arcface": ["pml-arcface-local"]}
SCHEDULES = ["ring", "gather", "auto"]
MODEL_INPUT = 64  # the towers' input features (step mode)
TARGET = {"loss": 1.0, "step": 1.05}  # dloss-auto / baseline, at most
BIG = 1024  # B_local from which --iters-big applies


def rows_of(loss):
    return [BASELINE[loss]] + EXTRA.get(loss, []) + \
        ["dloss-" + s for s in SCHEDULES]


def set_schedule(name):
    import dloss
    setter = getattr(dloss, "set_schedule", None) or dloss._C.set_schedule
    setter(name)


def _make_towers(loss, dim):
    """The tiny model of step mode, the same on every rank and row."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Towers(nn.Module):
        def __init__(self):
            super().__init__()
            self.image = nn.Linear(MODEL_INPUT, dim)
            if loss == "arcface":
                return
            self.text = nn.Linear(MODEL_INPUT, dim)
            # OpenCLIP keeps log(scale) (and SigLIP's bias) in the model.
            scale = math.log(10.0) if loss == "siglip" else math.log(1 / 0.07)
            self.logit_scale = nn.Parameter(torch.tensor(scale))
            if loss == "siglip":
                self.logit_bias = nn.Parameter(torch.tensor(-10.0))

        def forward(self, x_image, x_text=None):
            if loss == "arcface":
                return (self.image(x_image),)
            out = [F.normalize(self.image(x_image), dim=-1),
                   F.normalize(self.text(x_text), dim=-1),
                   self.logit_scale.exp()]
            if loss == "siglip":
                out.append(self.logit_bias)
            return out

    torch.manual_seed(0)
    return Towers()


def _arcface_data(rank, b_local, dim, classes, unit):
    """This rank's embeddings and labels, and W (the same on every
    rank)."""
    import torch
    import torch.nn.functional as F
    g = torch.Generator().manual_seed(rank)
    emb = torch.randn(b_local, dim, generator=g)
    if unit:
        emb = F.normalize(emb, dim=1)
    labels = torch.randint(0, classes, (b_local,), generator=g)
    W = torch.randn(dim, classes,
                    generator=torch.Generator().manual_seed(12345))
    return emb, labels, W


def _loss_module(row, loss, rank, world, dim, classes, W):
    """The loss object of `row`."""
    import dloss
    if row.startswith("dloss-"):
        if loss == "arcface":
            module = dloss.ArcFaceLoss(classes, dim)
            module.load_state_dict({"W": W.clone()})
            return module
        return {"clip": dloss.ClipLoss, "siglip": dloss.SigLipLoss}[loss]()
    if loss == "arcface":
        module = upstream().pml().losses.ArcFaceLoss(classes, dim)
        module.load_state_dict({"W": W.clone()})
        return module
    oc = upstream().open_clip_loss()
    if loss == "clip":
        return oc.ClipLoss(local_loss=True, gather_with_grad=True,
                           rank=rank, world_size=world)
    return oc.SigLipLoss(rank=rank, world_size=world)


def _arcface_call(row, module, world):
    """ArcFace's loss call: (embeddings, labels) -> loss, and what runs
    after backward (W's gradient averaged by hand, for the originals)."""
    import torch
    import torch.distributed as dist
    import torch.distributed.nn as dist_nn

    def average_w():
        if row.startswith("pml-"):
            dist.all_reduce(module.W.grad)
            module.W.grad.div_(world)

    if row == "pml-arcface":
        def call(emb, labels):
            everyone = torch.cat(dist_nn.all_gather(emb))
            gathered = [torch.empty_like(labels) for _ in range(world)]
            dist.all_gather(gathered, labels)
            return module(everyone, torch.cat(gathered))
    else:
        def call(emb, labels):
            return module(emb, labels)
    return call, average_w


def make_row(row, loss, mode, rank, world, b_local, dim, classes):
    """(prepare, step): prepare() runs before the row's calls, untimed (it
    sets dloss's schedule); step() runs one call and returns its value."""
    import torch
    schedule = row[len("dloss-"):] if row.startswith("dloss-") else None

    def prepare():
        if schedule:
            set_schedule(schedule)

    W = None
    if loss == "arcface":
        emb, labels, W = _arcface_data(rank, b_local, dim, classes,
                                       unit=(mode == "loss"))
    module = _loss_module(row, loss, rank, world, dim, classes, W)

    if mode == "loss":
        if loss == "arcface":
            x = emb.requires_grad_()
            call, after = _arcface_call(row, module, world)
            params = [x, module.W]

            def step():
                for t in params:
                    t.grad = None
                value = call(x, labels)
                value.backward()
                after()
                return value.item()
        else:
            tensors, _ = make_inputs(loss, rank, b_local, dim)

            def step():
                for t in tensors:
                    t.grad = None
                value = module(*tensors)
                value.backward()
                return value.item()
        return prepare, step

    from torch.nn.parallel import DistributedDataParallel
    model = DistributedDataParallel(_make_towers(loss, dim))
    g = torch.Generator().manual_seed(1000 + rank)
    x_image = torch.randn(b_local, MODEL_INPUT, generator=g)
    x_text = torch.randn(b_local, MODEL_INPUT, generator=g)
    params = list(model.parameters())
    if loss == "arcface":
        params.append(module.W)
        call, after = _arcface_call(row, module, world)
    optimizer = torch.optim.SGD(params, lr=0.01)

    def step():
        optimizer.zero_grad(set_to_none=True)
        if loss == "arcface":
            (features,) = model(x_image)
            value = call(features, labels)
        else:
            value = module(*model(x_image, x_text))
        value.backward()
        if loss == "arcface":
            after()
        optimizer.step()
        return value.item()
    return prepare, step


class _QuietStderr:
    """Silences file descriptor 2 (kineto's "profiler_start/stop" lines,
    written from C++) for the profiler's start and stop only."""

    def __enter__(self):
        sys.stderr.flush()
        self.saved = os.dup(2)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)

    def __exit__(self, *exc):
        os.dup2(self.saved, 2)
        os.close(self.saved)


def count_messages(prepare, step, comm):
    """One call under torch.profiler: the Gloo operations it started, by
    name, and the dloss communicator's numbered collectives (None when the
    row is not dloss's)."""
    import torch
    if comm is not None:
        # The steady state: after a call of the same loss (the fold).
        prepare()
        step()
    prepare()
    before = comm.collectives_started if comm is not None else None
    prof = torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU])
    with _QuietStderr():
        prof.start()
    try:
        step()
    finally:
        with _QuietStderr():
            prof.stop()
    gloo = collections.Counter(e.name for e in prof.events()
                               if e.name.startswith("gloo:"))
    numbered = comm.collectives_started - before if comm is not None \
        else None
    return dict(sorted(gloo.items())), numbered


def rank_main(loss, mode, rank, world, port, b_local, dim, classes, iters,
              warmup, queue):
    for name in ("MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[name] = "1"
    join_ranks(rank, world, port)
    import torch.distributed as dist
    import dloss

    names = rows_of(loss)
    rows = {name: make_row(name, loss, mode, rank, world, b_local, dim,
                           classes) for name in names}
    first = {}
    for _ in range(warmup):
        for name in names:
            prepare, step = rows[name]
            prepare()
            value = step()
            first.setdefault(name, value)
    times = {name: [] for name in names}
    for i in range(iters):
        # Each round starts one row later, so that no row always follows
        # the same one.
        for name in names[i % len(names):] + names[:i % len(names)]:
            prepare, step = rows[name]
            if name.startswith("dloss-"):
                # A training loop's call follows a call of the same loss,
                # whose preflight made room for this one's rows (the fold,
                # docs/Fusion.md); the row before it here was another.
                prepare()
                step()
            prepare()
            dist.barrier()
            start = time.perf_counter()
            value = step()
            times[name].append((time.perf_counter() - start) * 1000.0)
            first.setdefault(name, value)
    comm = dloss.group.communicator()
    messages = {}
    for name in names:
        dist.barrier()
        messages[name] = count_messages(
            *rows[name], comm if name.startswith("dloss-") else None)
    values = [None] * world
    dist.all_gather_object(values, first)
    set_schedule("auto")
    queue.put({"rank": rank,
               "median_ms": {n: statistics.median(t)
                             for n, t in times.items()},
               "value": {n: sum(v[n] for v in values) / world
                         for n in names},
               "messages": messages,
               "crossover_bytes": dloss._C.gather_crossover_bytes(world,
                                                                  "cpu")})
    dist.barrier()


def run_case(args, loss, mode, world, b_local):
    iters = args.iters_big if b_local >= BIG else args.iters
    per_rank = run_ranks(rank_main, world, args.timeout,
                         lambda r, port, queue: (
                             loss, mode, r, world, port, b_local, args.dim,
                             args.classes, iters, args.warmup, queue))
    rank0 = next(r for r in per_rank if r["rank"] == 0)
    out = []
    base = BASELINE[loss]
    base_ms = max(r["median_ms"][base] for r in per_rank)
    base_value = rank0["value"][base]
    messages = rank0["messages"]
    for name in rows_of(loss):
        ms = max(r["median_ms"][name] for r in per_rank)
        value = rank0["value"][name]
        gloo, numbered = messages[name]
        note = ""
        if abs(value - base_value) > 1e-4 * abs(base_value):
            note = "loss %.6g differs from the baseline's %.6g" % (
                value, base_value)
        out.append({
            "world": world, "loss": loss, "mode": mode, "b_local": b_local,
            "d": args.dim, "classes": args.classes if loss == "arcface"
            else "", "row": name, "baseline": base, "iters": iters,
            "status": "ran", "median_ms": round(ms, 3),
            "ratio": round(ms / base_ms, 3), "loss_value": value,
            "gloo_ops": sum(gloo.values()),
            "gloo_detail": " ".join("%s=%d" % (k[len("gloo:"):], v)
                                    for k, v in gloo.items()),
            "dloss_collectives": "" if numbered is None else numbered,
            "auto_took": "", "crossover_bytes": rank0["crossover_bytes"],
            "note": note})
    # Which schedule auto ran: the one whose Gloo operations it repeats.
    by_row = {r["row"]: r for r in out}
    auto = by_row["dloss-auto"]
    took = [s for s in ("ring", "gather")
            if by_row["dloss-" + s]["gloo_detail"] == auto["gloo_detail"]]
    if by_row["dloss-ring"]["gloo_detail"] == \
            by_row["dloss-gather"]["gloo_detail"]:
        took = ["either (same messages)"]
    if not took:
        took = [one_sided_label(by_row)]
    auto["auto_took"] = took[0] if len(took) == 1 else "?"
    return out


def gloo_count(row, op):
    """How many Gloo operations `op` ("all_gather", "send") a row started."""
    for part in row["gloo_detail"].split():
        name, _, count = part.partition("=")
        if name == op:
            return int(count)
    return 0


def one_sided_label(by_row):
    """What auto ran when its messages match neither forced row: CLIP's and
    SigLIP's forced gather gathers both sides, and auto, when both sides
    are above the crossover but the columns alone are not, the one-sided
    gather: the preflight carries the columns from a loop's second call
    on, and only the carries travel home, in fewer sends than the ring's
    (on Gloo every gather after the preflight is sends and receives too,
    so the all-gathers say nothing)."""
    auto, ring = by_row["dloss-auto"], by_row["dloss-ring"]
    if 0 < gloo_count(auto, "send") < gloo_count(ring, "send"):
        return "gather, one side"
    return "?"


def failed_rows(args, loss, mode, world, b_local, why):
    return [{"world": world, "loss": loss, "mode": mode, "b_local": b_local,
             "d": args.dim, "classes": args.classes if loss == "arcface"
             else "", "row": name, "baseline": BASELINE[loss], "iters": "",
             "status": "failed", "median_ms": "", "ratio": "",
             "loss_value": "", "gloo_ops": "", "gloo_detail": "",
             "dloss_collectives": "", "auto_took": "", "crossover_bytes": "",
             "note": why} for name in rows_of(loss)]


def _save(table, path):
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(table[0]))
        writer.writeheader()
        writer.writerows(table)


def crossovers(table):
    """Per (loss, mode, world): the B_local range where the ring starts to
    beat the gather, as measured."""
    lines = []
    groups = collections.OrderedDict()
    for r in table:
        if r["status"] == "ran" and r["row"] in ("dloss-ring",
                                                 "dloss-gather"):
            key = (r["loss"], r["mode"], r["world"])
            groups.setdefault(key, {}).setdefault(r["b_local"], {})[
                r["row"]] = r["median_ms"]
    same = {(r["loss"], r["mode"], r["world"]) for r in table
            if r["row"] == "dloss-auto" and r["auto_took"].startswith(
                "either")}
    for (loss, mode, world), sizes in groups.items():
        if (loss, mode, world) in same:
            lines.append("crossover %s %s world %d: none (ring and gather "
                         "send the same messages: no column operand "
                         "travels)" % (loss, mode, world))
            continue
        pairs = [(b, t["dloss-ring"] / t["dloss-gather"])
                 for b, t in sorted(sizes.items()) if len(t) == 2]
        text = ", ".join("%d: %.2f" % p for p in pairs)
        ring_from = next((b for b, q in pairs if q < 1.0), None)
        if ring_from is None:
            where = "gather faster at every size (crossover above %d)" % \
                pairs[-1][0]
        elif ring_from == pairs[0][0]:
            where = "ring faster from the smallest size, %d" % ring_from
        else:
            below = max(b for b, _ in pairs if b < ring_from)
            where = "between B_local %d (gather faster) and %d (ring " \
                "faster)" % (below, ring_from)
        if ring_from is not None and any(
                q >= 1.0 for b, q in pairs if b > ring_from):
            where += "; not monotonic"
        lines.append("crossover %s %s world %d: %s  [ring/gather: %s]" % (
            loss, mode, world, where, text))
    return lines


def verdicts(table):
    lines = []
    for mode, limit in TARGET.items():
        for loss in BASELINE:
            rows = [r for r in table if r["mode"] == mode and
                    r["loss"] == loss and r["row"] == "dloss-auto" and
                    r["status"] == "ran"]
            if not rows:
                continue
            worst = max(rows, key=lambda r: r["ratio"])
            met = worst["ratio"] <= limit
            lines.append(
                "verdict: %s %s: dloss-auto <= %.2fx %s at every size: %s "
                "(worst %.3fx at world %d, B_local %d)" % (
                    loss, mode, limit, BASELINE[loss],
                    "MET" if met else "NOT MET", worst["ratio"],
                    worst["world"], worst["b_local"]))
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--world", default="4,2",
                        help="world sizes, run in this order")
    parser.add_argument("--b-local", default="8,32,128,512,2048")
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--classes", type=int, default=1000,
                        help="ArcFace's classes (W is d x C)")
    parser.add_argument("--losses", default=",".join(BASELINE))
    parser.add_argument("--modes", default="loss,step")
    parser.add_argument("--iters", type=int, default=20,
                        help="timed rounds")
    parser.add_argument("--iters-big", type=int, default=5,
                        help="timed rounds at B_local >= %d" % BIG)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=900,
                        help="seconds one (world, B_local, loss, mode) may "
                        "take")
    parser.add_argument("--quick", action="store_true",
                        help="a dry run: world 2, B_local 8, 2 rounds, one "
                        "warm-up call")
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--out", default=os.path.join(ROOT, "bench",
                                                      "results"))
    args = parser.parse_args()
    if args.quick:
        args.world, args.b_local, args.iters, args.warmup = "2", "8", 2, 1
    losses = [s for s in args.losses.split(",") if s]
    modes = [s for s in args.modes.split(",") if s]
    for name in losses:
        if name not in BASELINE:
            raise SystemExit("--losses: unknown %r (%s)" % (
                name, ", ".join(BASELINE)))
    for name in modes:
        if name not in TARGET:
            raise SystemExit("--modes: unknown %r (loss, step)" % name)
    sys.path.insert(0, os.path.join(args.build, "python"))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(args.build, "python")] +
        [p for p in [os.environ.get("PYTHONPATH")] if p])
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS",
                 "OPENBLAS_NUM_THREADS"):
        os.environ[name] = "1"
    os.makedirs(args.out, exist_ok=True)

    # Every mode's rows for every world before the next mode: the loss
    # alone first, and the CSV is rewritten after each case, so an
    # interrupted run keeps what it measured.
    path = os.path.join(args.out, "small_batch.csv")
    table = []
    for mode in modes:
        for world in [int(w) for w in args.world.split(",")]:
            for b_local in sorted(int(b) for b in args.b_local.split(",")):
                for loss in losses:
                    start = time.time()
                    try:
                        rows = run_case(args, loss, mode, world, b_local)
                    except RuntimeError as e:
                        rows = failed_rows(args, loss, mode, world, b_local,
                                           str(e))
                    table += rows
                    print("world %d B_local %d %s %s (%.0f s): %s" % (
                        world, b_local, loss, mode, time.time() - start,
                        ", ".join(
                            "%s %s ms (%sx)" % (r["row"], r["median_ms"],
                                                r["ratio"])
                            if r["status"] == "ran" else
                            "%s failed (%s)" % (r["row"], r["note"])
                            for r in rows)), flush=True)
                    _save(table, path)
    print("\n%5s %-7s %-4s %7s %-17s %10s %7s %5s %-6s %s" % (
        "world", "loss", "mode", "B_local", "row", "median_ms", "ratio",
        "gloo", "dloss", "messages on rank 0 (auto took) / note"))
    for r in table:
        detail = r["gloo_detail"] + (" (took %s)" % r["auto_took"]
                                     if r["auto_took"] else "")
        print("%5d %-7s %-4s %7d %-17s %10s %7s %5s %-6s %s" % (
            r["world"], r["loss"], r["mode"], r["b_local"], r["row"],
            r["median_ms"], r["ratio"], r["gloo_ops"],
            r["dloss_collectives"], "; ".join(
                s for s in (detail, r["note"]) if s)))
    print()
    for line in crossovers(table) + verdicts(table):
        print(line)
    return write_table(table, path)


if __name__ == "__main__":
    sys.exit(main())
