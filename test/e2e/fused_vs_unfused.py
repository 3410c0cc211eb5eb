#!/usr/bin/env python3
"""Fused and unfused plans of one loss give the same loss and gradients.

For each --sizes (repeatable: one launch checks several world sizes), runs
`dloss-run EXAMPLE --world N` twice on the same per-rank inputs (made by
examples/run_example.py's recipes, from the same seed for every size): once as
compiled by default (with dloss-fuse-gather-similarity's ring ops) and once
with `--no-fuse`. Every rank's loss and every gradient (.npy) must agree
within the tolerance, relative to the largest magnitude of the unfused
tensor; the script also fails when the fused run did not use a fused op (the
plan text is checked), so it cannot pass by comparing two unfused runs.

With --check the fused run is also `dloss-run --check` (run_example.py's
check: every rank against one process on the global batch), which must print
PASS at the same tolerance.

usage: fused_vs_unfused.py DLOSS_RUN DLOSSC EXAMPLE.mlir --sizes 5,3,7,1
                           [--sizes 5,3 ...] [--grad-mode ddp|global] [--dim 16]
                           [--tolerance 1e-5] [--general] [--schedule S] [--check] [--out DIR]

The last line is the verdict of every size together:
  fused vs unfused, EXAMPLE.mlir, K runs: worst relative error E, tolerance T: PASS
"""
import argparse
import glob
import json
import math
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "examples"))
from run_example import make_inputs  # noqa: E402

FUSED_OPS = ("dloss.ring_softmax_ce", "dloss.ring_sigmoid_pairs", "dloss.sharded_softmax",
             "dloss.fused_similarity")


def run(cmd, what):
    print("+ " + " ".join(cmd), flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=240)
    if p.returncode != 0:
        sys.exit(f"fused_vs_unfused.py: {what} failed ({p.returncode}):\n{p.stdout}")
    return p.stdout


def results(out, world):
    ranks = []
    for r in range(world):
        d = os.path.join(out, f"rank{r}")
        grads = {os.path.basename(p)[len("grad_"):-len(".npy")]: np.load(p)
                 for p in sorted(glob.glob(os.path.join(d, "grad_*.npy")))}
        ranks.append((json.load(open(os.path.join(d, "result.json")))["loss"], grads))
    return ranks


def rel(a, b):
    """The largest relative difference; inf where either side is not finite
    (a NaN would otherwise compare below every tolerance)."""
    scale = max(float(np.max(np.abs(b))) if b.size else 0.0, 1e-30)
    error = float(np.max(np.abs(a - b))) / scale if a.size else 0.0
    return error if math.isfinite(error) else math.inf


def compare(a, sizes, out, mode, general):
    """Runs one world size fused and unfused; returns the worst relative error."""
    world = len(sizes)
    label = f"world {world} (sizes {','.join(map(str, sizes))})"
    os.makedirs(out, exist_ok=True)
    # A generator of its own per size: the inputs of a size do not depend on
    # which other sizes run in the same launch.
    inputs = make_inputs(a.example, sizes, a.dim, out, np.random.default_rng(a.seed))

    runs = {}
    schedule = ["--schedule", a.schedule] if a.schedule else []
    for name, extra in (("fused", general + schedule +
                         (["--check", "--tolerance", str(a.tolerance)]
                          if a.check else [])),
                        ("unfused", ["--no-fuse"])):
        d = os.path.join(out, name)
        cmd = [a.dloss_run, a.example, "--world", str(world), "--iters", "1",
               "--timeout", "60", "--out", d] + mode + extra
        for i in inputs:
            cmd += ["--input", i]
        output = run(cmd, f"{label}: the {name} run")
        if name == "fused" and a.check:
            verdict = re.search(r"^dloss-run --check: .*$", output, re.M)
            if not verdict or not verdict.group(0).endswith(f"tolerance {a.tolerance:g}: PASS"):
                sys.exit(f"fused_vs_unfused.py: {label}: dloss-run --check did not pass "
                         f"at tolerance {a.tolerance:g}:\n{output}")
            print(f"{label}: {verdict.group(0)}")
        runs[name] = results(d, world)

    worst = 0.0
    for r, ((lf, gf), (lu, gu)) in enumerate(zip(runs["fused"], runs["unfused"])):
        errors = {"loss": abs(lf - lu) / max(abs(lu), 1e-30)}
        if sorted(gf) != sorted(gu):
            sys.exit(f"{label}, rank {r}: fused gradients {sorted(gf)} vs unfused {sorted(gu)}")
        for name in gu:
            errors[name] = rel(gf[name].astype(np.float64), gu[name].astype(np.float64))
        print(f"{label}, rank {r}: " + ", ".join(f"{k} {v:.2e}" for k, v in errors.items()))
        worst = max(worst, *errors.values())
    print(f"{label}: fused vs unfused worst relative error {worst:.2e}: "
          + ("within" if worst <= a.tolerance else "OVER") + " the tolerance", flush=True)
    return worst


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("dloss_run")
    parser.add_argument("dlossc")
    parser.add_argument("example")
    parser.add_argument("--sizes", required=True, action="append",
                        help="rows per rank, e.g. 5,3,7,1; repeatable")
    parser.add_argument("--grad-mode", default="")
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--tolerance", type=float, default=1e-5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="")
    parser.add_argument("--schedule", default="",
                        help="the fused run's schedule (dloss-run --schedule): "
                             "ring or gather; default auto, which gathers at "
                             "these sizes")
    parser.add_argument("--general", action="store_true",
                        help="fuse with --general-fusion-only: CLIP, SigLIP and "
                             "PartialFC through dloss.fused_similarity too")
    parser.add_argument("--check", action="store_true",
                        help="the fused run is also dloss-run --check (against one "
                             "process on the global batch)")
    a = parser.parse_args()

    out = a.out or tempfile.mkdtemp(prefix="dloss-fused-")
    mode = ["--grad-mode", a.grad_mode] if a.grad_mode else []
    general = ["--general-fusion-only"] if a.general else []
    plan = run([a.dlossc, a.example, "--emit=plan-text"] + mode + general, "dlossc")
    wanted = ("dloss.fused_similarity",) if a.general else FUSED_OPS
    if not any(op in plan for op in wanted):
        sys.exit(f"fused_vs_unfused.py: the default plan of {a.example} has no fused op; "
                 "dloss-fuse-gather-similarity did not match it")

    worst = {}
    for text in a.sizes:
        sizes = [int(s) for s in text.split(",")]
        worst[text] = compare(a, sizes, os.path.join(out, "sizes-" + text.replace(",", "-")),
                              mode, general)
    over = [s for s, e in worst.items() if e > a.tolerance]
    verdict = "PASS" if not over else "FAIL (sizes " + " | ".join(over) + ")"
    print(f"fused vs unfused, {os.path.basename(a.example)}, {len(worst)} runs: worst relative "
          f"error {max(worst.values()):.2e}, tolerance {a.tolerance:g}: {verdict}")
    sys.exit(0 if not over else 1)


if __name__ == "__main__":
    main()
