#!/usr/bin/env python3
"""dloss-run on a loss with state (dloss.state): a centred sum of squares
whose centre takes the EMA of the global batch's mean. On 3 ranks with
uneven batches (4, 1, 3 rows), --check compares each rank's loss, gradient
and new centre with one process on the global batch; every rank writes the
same new centre (state_c.npy), and it is the EMA of the global mean.

usage: state_check.py DLOSS_RUN OUT_DIR
"""
import os
import subprocess
import sys

import numpy as np

LOSS = """\
func.func @centred(%x: tensor<?x4xf32> {dloss.grad},
                   %c: tensor<4xf32> {dloss.replicated, dloss.state})
    -> (tensor<f32>, tensor<4xf32>) attributes {dloss.loss} {
  %e = dloss.expand %c axes [0] like %x : tensor<4xf32>, tensor<?x4xf32>
  %d = dloss.sub %x, %e : tensor<?x4xf32>, tensor<?x4xf32>
  %q = dloss.mul %d, %d : tensor<?x4xf32>, tensor<?x4xf32>
  %l = dloss.reduce sum %q axes [0, 1] : tensor<?x4xf32>
  %loss = dloss.all_reduce sum %l : tensor<f32>
  %s = dloss.reduce sum %x axes [0] : tensor<?x4xf32>
  %t = dloss.all_reduce sum %s : tensor<4xf32>
  %n = dloss.global_size %x axis 0 : tensor<?x4xf32>
  %nf = dloss.cast %n : index to tensor<f32>
  %m = dloss.div %t, %nf : tensor<4xf32>, tensor<f32>
  %ms = dloss.stop_gradient %m : tensor<4xf32>
  %k = arith.constant dense<0.75> : tensor<f32>
  %a = dloss.mul %c, %k : tensor<4xf32>, tensor<f32>
  %j = arith.constant dense<0.25> : tensor<f32>
  %b = dloss.mul %ms, %j : tensor<4xf32>, tensor<f32>
  %new = dloss.add %a, %b : tensor<4xf32>, tensor<4xf32>
  return %loss, %new : tensor<f32>, tensor<4xf32>
}
"""


def main():
    dloss_run, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(3)
    sizes = [4, 1, 3]
    rows = [rng.standard_normal((n, 4)).astype(np.float32) for n in sizes]
    centre = rng.standard_normal(4).astype(np.float32)
    for r, x in enumerate(rows):
        np.save(os.path.join(out, "x%d.npy" % r), x)
    np.save(os.path.join(out, "c.npy"), centre)
    with open(os.path.join(out, "centred.mlir"), "w") as f:
        f.write(LOSS)
    done = subprocess.run(
        [dloss_run, os.path.join(out, "centred.mlir"), "--world", "3",
         "--input", "x=" + os.path.join(out, "x{rank}.npy"),
         "--input", "c=" + os.path.join(out, "c.npy"), "--check",
         "--iters", "1", "--out", os.path.join(out, "run")],
        capture_output=True, text=True, timeout=200)
    print(done.stdout + done.stderr)
    assert done.returncode == 0, "dloss-run failed"
    assert "tolerance 1e-05: PASS" in done.stdout, "--check did not pass"
    want = 0.75 * centre + 0.25 * np.concatenate(rows).mean(0)
    got = [np.load(os.path.join(out, "run", "rank%d" % r, "state_c.npy"))
           for r in range(3)]
    for r, g in enumerate(got):
        assert np.array_equal(g, got[0]), "rank %d's centre differs" % r
    error = float(np.abs(got[0] - want).max() / np.abs(want).max())
    print("new centre against the EMA of the global mean: %.2e" % error)
    assert error < 1e-6, error
    print("state: PASS")


if __name__ == "__main__":
    main()
