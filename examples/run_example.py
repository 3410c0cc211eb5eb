#!/usr/bin/env python3
"""Runs an example loss on N local ranks with dloss-run --check.

Makes the per-rank inputs (uneven batches allowed) with numpy, runs
`dloss-run --world N --check`, and fails unless every rank's gradients match
one process on the concatenated global batch, per the gradient contract.

usage: run_example.py DLOSS_RUN EXAMPLE.mlir --sizes 5,3,7,1 [--grad-mode global]
                      [--dim 16] [--iters 1] [--out DIR]

The compiler-level demo (scripts/compiler-demo.sh) and the end-to-end tests
(test/e2e) both use it.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np


def make_inputs(example, sizes, dim, out, rng):
    """Writes NAME{rank}.npy files and returns the --input arguments."""
    name = os.path.basename(example)
    inputs = []

    def save(prefix, arrays):
        for r, a in enumerate(arrays):
            np.save(os.path.join(out, f"{prefix}{r}.npy"), a)
        inputs.append(f"{prefix}={os.path.join(out, prefix)}{{rank}}.npy")

    def features():
        arrays = []
        for n in sizes:
            x = rng.standard_normal((n, dim)).astype(np.float32)
            arrays.append(x / np.linalg.norm(x, axis=1, keepdims=True))
        return arrays

    if name == "clip.mlir":
        save("image", features())
        save("text", features())
        inputs.append("scale=14.285714")
    elif name == "siglip.mlir":
        save("image", features())
        save("text", features())
        inputs += ["log_t=2.302585", "bias=-10.0"]
    elif name == "arcface.mlir":
        classes = 11
        save("embeddings", [rng.standard_normal((n, dim)).astype(np.float32) for n in sizes])
        save("labels", [rng.integers(0, classes, size=(n,)).astype(np.int64) for n in sizes])
        # Replicated: the same weights on every rank.
        w = rng.standard_normal((classes, dim)).astype(np.float32)
        np.save(os.path.join(out, "weights.npy"), w)
        inputs.append(f"weights={os.path.join(out, 'weights.npy')}")
    elif name == "partialfc.mlir":
        # Class-sharded weights: rank r owns an uneven block of the classes.
        shards = [3 + (2 * r) % 5 for r in range(len(sizes))]
        classes = sum(shards)
        save("embeddings", [rng.standard_normal((n, dim)).astype(np.float32) for n in sizes])
        save("labels", [rng.integers(0, classes, size=(n,)).astype(np.int64) for n in sizes])
        save("weights", [rng.standard_normal((c, dim)).astype(np.float32) for c in shards])
    elif name in ("ntxent.mlir", "infonce.mlir", "dcl.mlir"):
        # Two views (or queries and keys), unit-norm per row.
        for view in {"ntxent.mlir": ("z1", "z2")}.get(name, ("q", "k")):
            save(view, features())
        if name != "ntxent.mlir":
            inputs.append("scale=14.285714")
    elif name == "supcon.mlir":
        save("z", features())
        # Labels from 3 classes, so rows share classes across ranks.
        save("y", [rng.integers(0, 3, size=(n,)).astype(np.int64) for n in sizes])
    else:
        sys.exit(f"run_example.py: no input recipe for {name}")
    return inputs


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("dloss_run")
    parser.add_argument("example")
    parser.add_argument("--sizes", required=True, help="rows per rank, e.g. 5,3,7,1")
    parser.add_argument("--grad-mode", default="")
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--out", default="")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--iters", type=int, default=1)
    args = parser.parse_args()

    sizes = [int(s) for s in args.sizes.split(",")]
    out = args.out or tempfile.mkdtemp(prefix="dloss-e2e-")
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    inputs = make_inputs(args.example, sizes, args.dim, out, rng)

    cmd = [args.dloss_run, args.example, "--world", str(len(sizes)), "--check",
           "--iters", str(args.iters), "--timeout", "60", "--out", out]
    for i in inputs:
        cmd += ["--input", i]
    if args.grad_mode:
        cmd += ["--grad-mode", args.grad_mode]
    print("+", " ".join(cmd), flush=True)
    result = subprocess.run(cmd, timeout=240)
    sys.exit(result.returncode)


if __name__ == "__main__":
    main()
