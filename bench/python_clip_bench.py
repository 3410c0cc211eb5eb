#!/usr/bin/env python3
"""Python rows of the CLIP benchmark: dloss's fused drop-ins against the real
originals their users run (OpenCLIP, pytorch-metric-learning), wrapped as
those users wrap them, on the same ranks; and the Python layer's overhead
over the C++ JIT it wraps.

On N local ranks (processes, Gloo on loopback, one intra-op thread each),
fp32, d features, for each B_local it runs these rows (--impls picks them,
by row or by loss), each with its baseline, the original:

  loss    row              what runs
  clip    openclip-clip    open_clip.loss.ClipLoss(local_loss=True,
                           gather_with_grad=True, rank, world_size)
                           (the baseline)
          dloss-clip       dloss.ClipLoss()
          dloss-clip-compiled
                           dloss.ClipLoss() called in a function compiled
                           with torch.compile(fullgraph=True) (Inductor; the
                           compile falls in the warm-up calls)
          cpp-jit          build/bin/dloss-bench-jit-clip --world N: the same
                           loss through dloss::jit from C++ (its own Gloo
                           group), the reference of the Python overhead
  siglip  openclip-siglip  open_clip.loss.SigLipLoss(rank, world_size)
                           (default dist_impl 'bidir'; scale 10, bias -10)
          dloss-siglip     dloss.SigLipLoss()
  ntxent  pml-ntxent       pytorch_metric_learning's DistributedLossWrapper(
                           losses.NTXentLoss()) (efficient=False, default)
          dloss-ntxent     dloss.NTXentLoss()
  supcon  pml-supcon       DistributedLossWrapper(losses.SupConLoss())
          dloss-supcon     dloss.SupConLoss()

Inputs per rank: CLIP/SigLIP image and text [B_local, d] unit rows; NTXent
SimCLR-style: B_local embeddings, two views of B_local / 2 images, each
image's id on both (every label twice in the global batch, both views on
one rank); SupCon: B_local embeddings, labels uniform over 1000 classes
(ImageNet-1k). Every row of a loss draws the same inputs (seeded by rank),
and its loss is checked against the baseline's (a note if they differ by
more than 1e-4 relative; PML's wrapper returns world * the global loss, and
the originals' per-rank values are averaged over ranks).

It reports the median time of one forward + backward (the ranks line up
before each timed call, so a call's time is its own) and the loss's memory
per rank (peak RSS minus the RSS right before the first call, with the peak
reset through /proc/self/clear_refs), as ratios against the baseline of the
same loss and B_local, and dloss-clip / cpp-jit - 1 as the overhead. Every
number is the worst rank's. A row whose estimated loss memory for N ranks
exceeds MemAvailable is skipped, with the estimate (--force runs it).
Writes OUT/python_clip.csv.

usage: bench/python_clip_bench.py [--b-local 1024,4096] [--dim 256]
           [--world 4] [--impls clip,siglip,ntxent,supcon] [--iters 10]
           [--warmup 2] [--force] [--mem-available-mb M] [--dry-run]
           [--build build] [--out DIR]
"""
import argparse
import collections
import csv
import importlib.util
import json
import os
import queue as queue_mod
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# loss -> (baseline row, the other rows).
LOSSES = collections.OrderedDict([
    ("clip", ("openclip-clip", ["dloss-clip", "dloss-clip-compiled",
                                "cpp-jit"])),
    ("siglip", ("openclip-siglip", ["dloss-siglip"])),
    ("ntxent", ("pml-ntxent", ["dloss-ntxent"])),
    ("supcon", ("pml-supcon", ["dloss-supcon"])),
])
LOSS_OF = {row: loss for loss, (base, rows) in LOSSES.items()
           for row in [base] + rows}
SUPCON_CLASSES = 1000

# The skip rule's estimate of a row's loss memory per rank: PRIOR_BYTES
# bytes per element of the row's dominant tensors (elements(), below), or,
# once this run measured the row at a smaller B_local, its measured
# MiB per element there (which also holds the fixed part: an overestimate).
# The priors round up this script's measurements (bench/README.md): 21 B at
# B_local 4096 (CLIP), 16 B at 4096 (SigLIP), 57 B at 1024 (SupCon), 17 B at
# 128 (NTXent). dloss's rows hold no B_local x B_global matrix and are never
# skipped.
PRIOR_BYTES = {"openclip-clip": 24, "openclip-siglip": 20,
               "pml-ntxent": 20, "pml-supcon": 60}


def elements(row, b_local, world):
    """The element count the row's memory grows with, per rank:
    CLIP: the two B_local x B_global logits; SigLIP (bidir): N blocks of
    B_local x B_local logits; PML's wrapper (efficient=False) computes the
    whole global batch's loss on every rank: SupCon holds B_global x
    B_global matrices (the similarities, the masks, the int64 pair
    indices); NTXent's _compute_loss builds an [P, Q] matrix (P positive
    pairs, Q negative pairs of the global batch: `a2 == a1[:, None]`),
    cubic in the batch."""
    b_global = b_local * world
    if row == "openclip-clip":
        return b_local * b_global
    if row == "openclip-siglip":
        return world * b_local * b_local
    if row == "pml-supcon":
        return b_global * b_global
    if row == "pml-ntxent":
        # SimCLR labels: every label twice, so each row has one positive.
        positive = b_global
        negative = b_global * (b_global - 2)
        return positive * negative
    return None


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


def mem_available_mb():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024.0
    return float("inf")


def upstream():
    """test/python/upstream.py, the tests' import of the real originals
    (OpenCLIP's loss module by path where `import open_clip` fails, PML at
    its pinned version)."""
    path = os.path.join(ROOT, "test", "python", "upstream.py")
    spec = importlib.util.spec_from_file_location("dloss_bench_upstream",
                                                  path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_inputs(loss, rank, b_local, dim):
    """The rank's inputs for `loss`, the same for every row of it."""
    import torch
    import torch.nn.functional as F
    g = torch.Generator().manual_seed(rank)
    if loss in ("clip", "siglip"):
        image = F.normalize(torch.randn(b_local, dim, generator=g), dim=1)
        text = F.normalize(torch.randn(b_local, dim, generator=g), dim=1)
        if loss == "clip":
            params = [torch.tensor(14.285714)]
        else:
            params = [torch.tensor(10.0), torch.tensor(-10.0)]
        return [image.requires_grad_(), text.requires_grad_()] + \
            [p.requires_grad_() for p in params], None
    emb = torch.randn(b_local, dim, generator=g).requires_grad_()
    if loss == "ntxent":
        # SimCLR: two views of this rank's b_local / 2 images.
        ids = torch.arange(b_local // 2) + rank * (b_local // 2)
        labels = torch.cat([ids, ids])
    else:
        labels = torch.randint(0, SUPCON_CLASSES, (b_local,), generator=g)
    return [emb], labels


def make_call(row, rank, world, tensors, labels):
    """(call, how to turn the rank's value into the global loss)."""
    import dloss
    if row == "dloss-clip-compiled":
        import torch
        clip = dloss.ClipLoss()
        fn = torch.compile(lambda *args: clip(*args), fullgraph=True)
    elif row.startswith("dloss-"):
        fn = {"dloss-clip": dloss.ClipLoss, "dloss-siglip": dloss.SigLipLoss,
              "dloss-ntxent": dloss.NTXentLoss,
              "dloss-supcon": dloss.SupConLoss}[row]()
    elif row.startswith("openclip-"):
        oc = upstream().open_clip_loss()
        if row == "openclip-clip":
            fn = oc.ClipLoss(local_loss=True, gather_with_grad=True,
                             rank=rank, world_size=world)
        else:
            fn = oc.SigLipLoss(rank=rank, world_size=world)
    else:
        pml = upstream().pml()
        cls = pml.losses.NTXentLoss if row == "pml-ntxent" \
            else pml.losses.SupConLoss
        fn = pml.utils.distributed.DistributedLossWrapper(cls())
    if labels is not None:
        def call():
            return fn(tensors[0], labels)
    else:
        def call():
            return fn(*tensors)
    # PML's wrapper returns world * the global loss; OpenCLIP's per-rank
    # values average to it over ranks (even batches).
    scale = 1.0 / world if row.startswith("pml-") else 1.0
    return call, scale


def join_ranks(rank, world, port):
    """A rank started by run_ranks joins the group: Gloo, one intra-op
    thread, the store in the parent (as torchrun's agent hosts it)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      RANK=str(rank), WORLD_SIZE=str(world),
                      OMP_NUM_THREADS="1", TORCHELASTIC_USE_AGENT_STORE="True",
                      TORCHELASTIC_RESTART_COUNT="0")
    import warnings
    import torch
    import torch.distributed as dist
    # OpenCLIP 3.3 and sentence-transformers call
    # torch.distributed.nn.all_gather, deprecated in 2.x.
    warnings.filterwarnings("ignore", category=FutureWarning)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")


def rank_main(row, rank, world, port, b_local, dim, iters, warmup, queue):
    import torch.distributed as dist
    join_ranks(rank, world, port)

    tensors, labels = make_inputs(LOSS_OF[row], rank, b_local, dim)
    call, scale = make_call(row, rank, world, tensors, labels)

    def step():
        for t in tensors:
            t.grad = None
        loss = call()
        loss.backward()
        return loss.item()

    loss, median_ms, loss_mem_mb, reset = measure(step, iters, warmup,
                                                  dist.barrier)
    values = [None] * world
    dist.all_gather_object(values, loss * scale)
    queue.put({"impl": row, "rank": rank, "b_local": b_local,
               "loss": sum(values) / world, "median_ms": median_ms,
               "loss_mem_mb": loss_mem_mb, "hwm_reset": reset})
    dist.barrier()


def measure(step, iters, warmup, barrier):
    """Runs `step` `warmup` times, then `iters` timed times, each after
    `barrier()` (the ranks line up, so a call's time is its own). Returns
    the last step's value, the median time in ms, and the loss's memory:
    the peak RSS over all the calls minus the RSS before the first (MB),
    and whether the peak could be reset first."""
    before = rss_mb("VmRSS")
    reset = reset_peak()
    for _ in range(warmup):
        step()
    times = []
    for _ in range(iters):
        barrier()
        start = time.perf_counter()
        value = step()
        times.append((time.perf_counter() - start) * 1000.0)
    return (value, statistics.median(times), rss_mb("VmHWM") - before,
            reset)


def write_table(table, path):
    """Writes the rows (dicts with the same keys) to the CSV file `path`;
    the exit status: 1 if a row failed."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(table[0]))
        writer.writeheader()
        writer.writerows(table)
    print("wrote", path)
    return 1 if any(r["status"] == "failed" for r in table) else 0


def run_ranks(target, world, timeout, rank_args):
    """Runs `target(*rank_args(rank, port, queue))` on `world` ranks and
    returns what each put on the queue (one dict per rank). The parent hosts
    the store, as torchrun's agent does. A fork server with torch imported
    once is reused by every row: a rank starts in about 0.1 s of CPU, where
    a spawned one (a fresh interpreter importing torch) takes 1.5 s. Each
    rank still imports what its row needs itself; the loss's memory is
    measured from a reset peak."""
    import torch.multiprocessing as mp
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch"])
    queue = ctx.Queue()
    from datetime import timedelta
    import torch.distributed as dist
    store = dist.TCPStore("127.0.0.1", 0, world, True,
                          timedelta(seconds=600), wait_for_workers=False)
    procs = [ctx.Process(target=target, args=rank_args(r, store.port, queue))
             for r in range(world)]
    for p in procs:
        p.start()
    rows, deadline = [], time.time() + timeout
    while len(rows) < len(procs):
        try:
            rows.append(queue.get(timeout=5))
            continue
        except queue_mod.Empty:
            pass
        dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
        if dead or time.time() > deadline:
            for p in procs:
                if p.is_alive():
                    p.kill()
            for p in procs:
                p.join()
            raise RuntimeError(
                "a rank exited with %s" % dead[0] if dead else
                "timed out after %g s" % timeout)
    for p in procs:
        p.join()
    return rows


def run_python(row, args, b_local):
    return run_ranks(rank_main, args.world, args.timeout,
                     lambda r, port, queue: (
                         row, r, args.world, port, b_local, args.dim,
                         args.iters, args.warmup, queue))


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
        raise RuntimeError("dloss-bench-jit-clip failed: " +
                           (out.stderr.strip().splitlines() or ["?"])[-1])
    rows = [json.loads(line) for line in out.stdout.splitlines()
            if line.startswith("{")]
    for row in rows:
        row["impl"] = "cpp-jit"
    return rows


def worst(rows):
    return {"median_ms": max(r["median_ms"] for r in rows),
            "loss_mem_mb": max(r["loss_mem_mb"] for r in rows),
            "loss": rows[0]["loss"]}


def selected_rows(spec):
    """--impls: loss names (every row of that loss) or row names; a row
    without its loss's baseline runs with the baseline added, as every
    ratio needs it."""
    rows = []
    for name in [s for s in spec.split(",") if s]:
        if name in LOSSES:
            base, others = LOSSES[name]
            rows += [base] + others
        elif name in LOSS_OF:
            rows += [LOSSES[LOSS_OF[name]][0], name]
        else:
            raise SystemExit("--impls: unknown %r (losses: %s; rows: %s)" % (
                name, ", ".join(LOSSES), ", ".join(LOSS_OF)))
    order = [r for loss in LOSSES.values() for r in [loss[0]] + loss[1]]
    return [r for r in order if r in rows]


def estimate_mb(row, b_local, args, measured):
    """(MiB per rank, how) or (None, None) for rows never skipped."""
    n = elements(row, b_local, args.world)
    if n is None:
        return None, None
    smaller = [(b, mb) for b, mb in measured.get(row, []) if b < b_local]
    if smaller:
        b, mb = max(smaller)
        per = mb / elements(row, b, args.world)
        return n * per, "scaled from %.0f MiB measured at B_local %d" % (
            mb, b)
    return n * PRIOR_BYTES[row] / 2.0 ** 20, \
        "prior %d B per element" % PRIOR_BYTES[row]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--b-local", default="1024,4096")
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--impls", default=",".join(LOSSES),
                        help="losses (%s) or rows (%s)" % (
                            ", ".join(LOSSES), ", ".join(LOSS_OF)))
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--force", action="store_true",
                        help="run rows the memory estimate would skip")
    parser.add_argument("--mem-available-mb", type=float, default=None,
                        help="RAM the skip rule allows for N ranks "
                        "(default MemAvailable)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print what would run or be skipped")
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--out", default=os.path.join(ROOT, "bench",
                                                      "results"))
    args = parser.parse_args()
    sys.path.insert(0, os.path.join(args.build, "python"))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(args.build, "python")] +
        [p for p in [os.environ.get("PYTHONPATH")] if p])
    rows_wanted = selected_rows(args.impls)
    sizes = sorted(int(b) for b in args.b_local.split(","))
    if not args.dry_run:
        os.makedirs(args.out, exist_ok=True)

    table, measured = [], {}
    for b_local in sizes:
        results = collections.OrderedDict()
        for row in rows_wanted:
            est, how = estimate_mb(row, b_local, args, measured)
            avail = args.mem_available_mb if args.mem_available_mb \
                else mem_available_mb()
            r = {"status": "ran", "est_loss_mem_mb": "" if est is None
                 else round(est, 1), "note": "" if est is None else how}
            if est is not None and est * args.world > avail and \
                    not args.force:
                r.update(status="skipped", note="est. %.1f GiB per rank x "
                         "%d ranks > %.1f GiB available (%s)" % (
                             est / 1024, args.world, avail / 1024, how))
            elif args.dry_run:
                r["status"] = "would run"
            else:
                try:
                    r.update(worst(run_jit(args, b_local) if row == "cpp-jit"
                                   else run_python(row, args, b_local)))
                    measured.setdefault(row, []).append(
                        (b_local, r["loss_mem_mb"]))
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    r.update(status="failed", note=str(e))
            results[row] = r
            print("B_local %d %s: %s" % (
                b_local, row, "%.1f ms, %.1f MB" % (
                    r["median_ms"], r["loss_mem_mb"]) if r["status"] == "ran"
                else "%s (%s)" % (r["status"], r["note"])), flush=True)
        for row, r in results.items():
            base = results.get(LOSSES[LOSS_OF[row]][0], {})
            ran = r["status"] == "ran" and base.get("status") == "ran"
            note = r["note"]
            if ran and row != LOSSES[LOSS_OF[row]][0] and abs(
                    r["loss"] - base["loss"]) > 1e-4 * abs(base["loss"]):
                note += "; loss %.6g differs from the baseline's %.6g" % (
                    r["loss"], base["loss"])
            table.append({
                "loss": LOSS_OF[row], "impl": row, "baseline":
                LOSSES[LOSS_OF[row]][0], "b_local": b_local, "d": args.dim,
                "world": args.world, "iters": args.iters,
                "status": r["status"],
                "median_ms": round(r["median_ms"], 3)
                if "median_ms" in r else "",
                "loss_mem_mb": round(r["loss_mem_mb"], 2)
                if "loss_mem_mb" in r else "",
                "time_vs_baseline": round(r["median_ms"] / base["median_ms"],
                                          3) if ran else "",
                "mem_vs_baseline": round(
                    r["loss_mem_mb"] / base["loss_mem_mb"], 4)
                if ran and base["loss_mem_mb"] > 0 else "",
                "est_loss_mem_mb": r["est_loss_mem_mb"],
                "loss_value": r.get("loss", ""), "note": note.strip("; ")})
        if all(results.get(k, {}).get("status") == "ran"
               for k in ("dloss-clip", "cpp-jit")):
            overhead = results["dloss-clip"]["median_ms"] / \
                results["cpp-jit"]["median_ms"] - 1
            print("B_local %d: Python overhead over the C++ JIT "
                  "(dloss-clip / cpp-jit - 1) %+.1f%%" % (
                      b_local, 100 * overhead), flush=True)
        if all(results.get(k, {}).get("status") == "ran"
               for k in ("dloss-clip", "dloss-clip-compiled")):
            print("B_local %d: the compiled step over the eager one "
                  "(dloss-clip-compiled / dloss-clip - 1) %+.1f%%" % (
                      b_local, 100 * (
                          results["dloss-clip-compiled"]["median_ms"] /
                          results["dloss-clip"]["median_ms"] - 1)),
                  flush=True)
    print("\n%-15s %7s %-9s %10s %11s %8s %8s  %s" % (
        "impl", "B_local", "status", "median_ms", "loss_mem_mb", "time_x",
        "mem_x", "note"))
    for row in table:
        print("%-15s %7d %-9s %10s %11s %8s %8s  %s" % (
            row["impl"], row["b_local"], row["status"], row["median_ms"],
            row["loss_mem_mb"], row["time_vs_baseline"],
            row["mem_vs_baseline"], row["note"]))
    if args.dry_run:
        return 0
    return write_table(table, os.path.join(args.out, "python_clip.csv"))


if __name__ == "__main__":
    sys.exit(main())
