#!/usr/bin/env python3
"""The host-side cost of one small dloss call, step by step (issue #47,
item 3): what a loss call costs before any arithmetic or transfer matters.

One process, one intra-op thread, B_local 8 and d 256 by default, fp32. For
each setting (`none`: no process group, dloss's single-process
communicator; `gloo`: a Gloo process group of world 1 in this process, the
path `torchrun --nproc_per_node 1` takes) and each loss (CLIP, SigLIP), it
times every layer of a call by calling it alone, best of --repeat runs of
--iters calls each, and names each step by difference:

  step                  forward + backward through the drop-in
                        (dloss.ClipLoss / SigLipLoss)
  backward              step - forward: autograd's engine, the node's
                        backward (the gradients scaled by the incoming one)
                        and the accumulation into .grad
  drop-in wrapper       forward - autograd call: the module call, argument
                        checks (logit scale to a 0-d tensor), the call site
  autograd node         autograd call - op run: dloss.compiled._EagerLoss
                        (the node, save_for_backward, fresh outputs)
  key lookup            the loss's key to its C++ callable (_ops._target,
                        _callable): the plan is resolved once per module
  runtime               CompiledLoss.run through pybind: the preflight, the
                        plan's steps and fused kernels, every collective
  - collectives         the runtime's collectives per call (the
                        communicator's count) x the time of one
                        all_gather_ints of 3 values on that communicator
  - the rest            runtime - collectives: the executor, the kernels'
                        ATen calls and allocations

and, for comparison, OpenCLIP's own loss (ClipLoss(local_loss=True,
gather_with_grad=True) / SigLipLoss, rank 0 of world 1) through the same
forward + backward. Also counted per call (one call under torch.profiler):
ATen operations (aten::* events, nested ones included) for dloss and
OpenCLIP.

Writes OUT/host_cost.csv and OUT/host_cost.md and prints the table. No
target: the numbers say where a small call's fixed cost goes (bench/README.md,
"Host cost of a small call").

usage: bench/host_cost_bench.py [--b-local 8] [--dim 256]
           [--losses clip,siglip] [--groups none,gloo] [--iters 2000]
           [--repeat 3] [--build build] [--out DIR]
"""

import argparse
import collections
import csv
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def best_us(fn, iters, repeat):
    """The best per-call time of `fn` in microseconds over `repeat` runs of
    `iters` calls, after a tenth of that many untimed calls."""
    for _ in range(max(iters // 10, 1)):
        fn()
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        best = min(best, (time.perf_counter() - start) / iters * 1e6)
    return best


def aten_ops(fn):
    """ATen operations one call of `fn` dispatches (nested ones included)."""
    import torch
    fn()
    with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return sum(1 for e in prof.events() if e.name.startswith("aten::"))


def measure(loss, group, args):
    """One (loss, group) setting's rows: [(step name, microseconds, note)]."""
    import dloss
    from dloss import _ops, compiled
    from python_clip_bench import make_inputs, upstream

    tensors, _ = make_inputs(loss, 0, args.b_local, args.dim)
    oc = upstream().open_clip_loss()
    if loss == "clip":
        mine = dloss.ClipLoss()
        theirs = oc.ClipLoss(local_loss=True, gather_with_grad=True, rank=0,
                             world_size=1)
    else:
        mine = dloss.SigLipLoss()
        theirs = oc.SigLipLoss(rank=0, world_size=1)

    def zero():
        for t in tensors:
            t.grad = None

    def step(module):
        def run():
            zero()
            out = module(*tensors)
            out = out["contrastive_loss"] if isinstance(out, dict) else out
            out.backward()
        return run

    step(mine)()
    key = mine._op_key + "/"
    # The runtime's inputs as the drop-in passes them: features, then the
    # scalars as 0-d tensors of the features' dtype.
    inputs = list(tensors)
    flags = [True] * len(inputs)
    site = "host_cost_bench.py:1"
    target = _ops._target(key, inputs)
    fn = target._callable()
    comm = dloss.group.communicator()

    it, rep = args.iters, args.repeat
    t_step = best_us(step(mine), it, rep)
    t_forward = best_us(lambda: mine(*tensors), it, rep)
    t_call = best_us(lambda: compiled.call(key, inputs, site), it, rep)
    t_run = best_us(lambda: _ops.run(key, inputs, flags, site), it, rep)
    t_lookup = best_us(lambda: _ops._target(key, inputs)._callable(), it,
                       rep)
    t_runtime = best_us(lambda: fn.run(inputs, flags, site), it, rep)
    before = comm.collectives_started
    fn.run(inputs, flags, site)
    collectives = comm.collectives_started - before
    t_one = best_us(lambda: comm.all_gather_ints([1, 2, 3]), it, rep)
    t_theirs = best_us(step(theirs), it, rep)
    t_theirs_forward = best_us(lambda: theirs(*tensors), it, rep)

    rows = [
        ("step", t_step, "forward + backward"),
        ("backward", t_step - t_forward, ""),
        ("forward", t_forward, ""),
        ("drop-in wrapper", t_forward - t_call, ""),
        ("autograd node", t_call - t_run, ""),
        ("key lookup", t_lookup, ""),
        ("runtime", t_runtime, ""),
        ("- collectives", collectives * t_one,
         "%d x %.1f us" % (collectives, t_one)),
        ("- the rest", t_runtime - collectives * t_one, ""),
        ("ATen ops per step", aten_ops(step(mine)), "count"),
        ("OpenCLIP step", t_theirs, "forward + backward"),
        ("OpenCLIP forward", t_theirs_forward, ""),
        ("OpenCLIP backward", t_theirs - t_theirs_forward, ""),
        ("OpenCLIP ATen ops per step", aten_ops(step(theirs)), "count"),
        ("dloss / OpenCLIP step", t_step / t_theirs, "ratio"),
    ]
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--b-local", type=int, default=8)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--losses", default="clip,siglip")
    parser.add_argument("--groups", default="none,gloo")
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[name] = "1"
    sys.path.insert(0, os.path.join(args.build, "python"))
    import torch
    torch.set_num_threads(1)
    import torch.distributed as dist

    losses = [x for x in args.losses.split(",") if x]
    groups = [x for x in args.groups.split(",") if x]
    for name in groups:
        if name not in ("none", "gloo"):
            parser.error("--groups takes none and gloo, got %r" % name)
    if groups != sorted(groups, key=["none", "gloo"].index):
        parser.error("--groups: none runs before gloo (a process group, "
                     "once made, stays)")
    table = collections.OrderedDict()
    for group in groups:
        if group == "gloo":
            store = dist.HashStore()
            dist.init_process_group("gloo", store=store, rank=0,
                                    world_size=1)
        for loss in losses:
            for step, us, note in measure(loss, group, args):
                table.setdefault(step, {})[(group, loss)] = (us, note)
    if dist.is_initialized():
        dist.destroy_process_group()

    columns = [(g, l) for g in groups for l in losses]
    head = "| step | " + " | ".join("%s, %s" % c for c in columns) + " |"
    lines = [
        "# Host cost of a small call (bench/host_cost_bench.py)", "",
        "torch %s; B_local %d, d %d, fp32, one thread; microseconds per call "
        "(best of %d x %d), `none`: no process group, `gloo`: a Gloo group "
        "of world 1" % (torch.__version__, args.b_local, args.dim,
                        args.repeat, args.iters), "",
        head, "|---|" + "---:|" * len(columns)]
    csv_rows = []
    for step, cells in table.items():
        out = []
        for column in columns:
            us, note = cells[column]
            if note == "count":
                text = "%d" % us
            elif note == "ratio":
                text = "%.2fx" % us
            else:
                text = "%.1f" % us
                if note and not note.startswith("forward"):
                    text += " (%s)" % note
            out.append(text)
            csv_rows.append({"group": column[0], "loss": column[1],
                             "step": step, "value": round(us, 3),
                             "note": note})
        lines.append("| %s | %s |" % (step, " | ".join(out)))
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "host_cost.md"), "w") as f:
            f.write(text)
        with open(os.path.join(args.out, "host_cost.csv"), "w",
                  newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(csv_rows[0]))
            writer.writeheader()
            writer.writerows(csv_rows)
        print("wrote", os.path.join(args.out, "host_cost.csv"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
