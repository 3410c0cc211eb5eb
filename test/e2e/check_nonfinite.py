#!/usr/bin/env python3
"""dloss-run --check fails where a result is not finite, and says where.

A NaN error compares false with every tolerance, so a check that takes the
largest error passes a NaN. On a small loss, sum(sqrt(x)) over the global
batch plus sqrt(a) for a replicated a, on 2 ranks:

  finite      x > 0, a > 0: the check passes (the harness can pass);
  grad-inf    a 0 in rank 1's x: the loss is finite, rank 1's grad_x (and the
              reference's) holds an Inf;
  grad-mean   a = 0: grad_a, checked as the mean over the ranks, is Inf;
  loss-nan    a NaN in rank 0's x: the loss is NaN on every rank, which is
              no disagreement between the ranks.

Each failing case must exit 3 with a FAIL verdict naming the value and the
side that holds the NaN or Inf.

usage: check_nonfinite.py DLOSS_RUN OUT_DIR
"""
import os
import re
import subprocess
import sys

import numpy as np

LOSS = """\
func.func @roots(%x: tensor<?xf32> {dloss.grad},
                 %a: tensor<f32> {dloss.grad, dloss.replicated}) -> tensor<f32>
    attributes {dloss.loss} {
  %r = dloss.sqrt %x : tensor<?xf32>
  %local = dloss.reduce sum %r axes [0] : tensor<?xf32>
  %total = dloss.all_reduce sum %local : tensor<f32>
  %ra = dloss.sqrt %a : tensor<f32>
  %loss = dloss.add %total, %ra : tensor<f32>, tensor<f32>
  return %loss : tensor<f32>
}
"""

VERDICT = r"^dloss-run --check: .*$"
FAIL = (r"worst relative gradient error inf \({what}: NaN or Inf in {side}\), "
        r"tolerance 1e-05: FAIL$")

# name: (rank 0's x, rank 1's x, a, the verdict it must print, exit status)
CASES = {
    "finite": ([1.0, 4.0, 2.0], [3.0, 0.5], "2.0", r"tolerance 1e-05: PASS$", 0),
    "grad-inf": ([1.0, 4.0, 2.0], [3.0, 0.0], "2.0",
                 FAIL.format(what="grad_x on rank 1",
                             side="the rank's gradient and the reference"), 3),
    "grad-mean": ([1.0, 4.0, 2.0], [3.0, 0.5], "0.0",
                  FAIL.format(what=r"grad_a \(mean over ranks\)",
                              side="the ranks' mean and the reference"), 3),
    "loss-nan": ([1.0, float("nan"), 2.0], [3.0, 0.5], "2.0",
                 FAIL.format(what="loss on rank 0",
                             side="the rank's loss and the reference"), 3),
}


def main():
    dloss_run, out = sys.argv[1:3]
    os.makedirs(out, exist_ok=True)
    loss = os.path.join(out, "roots.mlir")
    with open(loss, "w") as f:
        f.write(LOSS)
    env = dict(os.environ, OMP_NUM_THREADS="1",
               DLOSS_CACHE_DIR=os.path.join(out, "cache"))
    failed = []
    for name, (x0, x1, a, verdict, status) in CASES.items():
        case = os.path.join(out, name)
        os.makedirs(case, exist_ok=True)
        for r, x in enumerate((x0, x1)):
            np.save(os.path.join(case, "x%d.npy" % r), np.array(x, np.float32))
        cmd = [dloss_run, loss, "--world", "2", "--check", "--timeout", "60",
               "--input", "x=" + os.path.join(case, "x{rank}.npy"),
               "--input", "a=" + a, "--out", os.path.join(case, "run")]
        result = subprocess.run(cmd, env=env, capture_output=True, text=True,
                                timeout=240)
        found = re.search(VERDICT, result.stdout, re.M)
        line = found.group(0) if found else "(no verdict line)"
        ok = (result.returncode == status and found is not None
              and re.search(verdict, line) is not None)
        print("%s: exit status %d (expected %d), the verdict as expected: %s\n  %s"
              % (name, result.returncode, status, "PASS" if ok else "FAIL", line))
        if not ok:
            failed.append(name)
            print("  expected the verdict to match: " + verdict)
            print("+ " + " ".join(cmd) + "\n" + result.stdout + result.stderr)
    print("dloss-run --check on non-finite results, %d cases: %s" %
          (len(CASES), "FAIL (%s)" % ", ".join(failed) if failed else "PASS"))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
