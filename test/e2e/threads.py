#!/usr/bin/env python3
"""dloss-run's intra-op threads per rank: --threads, else OMP_NUM_THREADS,
else the machine's cores divided by the local ranks (at least 1). Runs
examples/clip.mlir on 2 ranks in each case and reads every rank's
result.json ("intra_op_threads", what ATen reports inside the rank).

usage: threads.py DLOSS_RUN CLIP.mlir OUT_DIR
"""
import json
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "examples"))
import run_example  # noqa: E402


def threads_of(dloss_run, example, out, inputs, extra, env):
    cmd = [dloss_run, example, "--world", "2", "--iters", "1", "--out", out]
    for i in inputs:
        cmd += ["--input", i]
    cmd += extra
    result = subprocess.run(cmd, env=env, capture_output=True, text=True,
                            timeout=240)
    if result.returncode != 0:
        sys.exit("FAIL: %s\n%s%s" % (" ".join(cmd), result.stdout,
                                     result.stderr))
    counts = []
    for r in range(2):
        with open(os.path.join(out, "rank%d" % r, "result.json")) as f:
            counts.append(json.load(f)["intra_op_threads"])
    return counts, result.stdout


def main():
    dloss_run, example, out = sys.argv[1:4]
    os.makedirs(out, exist_ok=True)
    inputs = run_example.make_inputs(example, [3, 2], 8, out,
                                     np.random.default_rng(0))
    base = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    cores = os.cpu_count()
    cases = [
        ("default: cores / local ranks", [], base, max(1, cores // 2)),
        ("OMP_NUM_THREADS=3", [], dict(base, OMP_NUM_THREADS="3"), 3),
        ("--threads 2 over OMP_NUM_THREADS=3", ["--threads", "2"],
         dict(base, OMP_NUM_THREADS="3"), 2),
    ]
    failed = False
    for name, extra, env, expected in cases:
        counts, stdout = threads_of(dloss_run, example,
                                    os.path.join(out, str(len(extra))) +
                                    name.split()[0].strip(":"), inputs,
                                    extra, env)
        ok = counts == [expected, expected] and (
            "%d intra-op thread" % expected) in stdout
        failed |= not ok
        print("%s: ranks report %s, expected %d: %s" %
              (name, counts, expected, "PASS" if ok else "FAIL"))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
