#!/usr/bin/env python3
"""dloss-run compiles a .mlir loss through the plan cache and the compiler
library (libdloss_compiler, loaded by the JIT), never by running dlossc.

On examples/clip.mlir, 2 ranks, a fresh DLOSS_CACHE_DIR:
  1. the first run compiles (the library is there) and leaves one entry;
  2. a second run with DLOSS_COMPILER_LIBRARY pointing at no file runs the
     cached plan: it compiled nothing (it could not load a compiler), and
     every rank's loss equals the first run's;
  3. other options (--no-fuse) are another key: without the library that is
     a clear error naming the cache key and the directory, before any rank
     starts;
  4. --general-fusion-only is part of the key too: a new entry;
  5. a truncated entry is reported, removed and compiled again, never run.

usage: plan_cache.py DLOSS_RUN CLIP.mlir OUT_DIR
"""
import glob
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "examples"))
import run_example  # noqa: E402

failures = []


def check(ok, what):
    print("%s: %s" % ("ok" if ok else "FAIL", what))
    if not ok:
        failures.append(what)


def run(dloss_run, example, out, inputs, extra, env):
    cmd = [dloss_run, example, "--world", "2", "--iters", "1", "--timeout",
           "60", "--out", out] + extra
    for i in inputs:
        cmd += ["--input", i]
    return subprocess.run(cmd, env=env, capture_output=True, text=True,
                          timeout=240)


def losses(out):
    result = []
    for r in range(2):
        with open(os.path.join(out, "rank%d" % r, "result.json")) as f:
            result.append(json.load(f)["loss"])
    return result


def main():
    dloss_run, example, out = sys.argv[1:4]
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    cache = os.path.join(out, "cache")
    inputs = run_example.make_inputs(example, [3, 2], 8, out,
                                     np.random.default_rng(0))
    env = dict(os.environ, DLOSS_CACHE_DIR=cache, OMP_NUM_THREADS="1")
    env.pop("DLOSS_COMPILER_LIBRARY", None)
    no_compiler = dict(env, DLOSS_COMPILER_LIBRARY=os.path.join(
        out, "no-such-dir", "libdloss_compiler.so"))
    entries = lambda: sorted(glob.glob(os.path.join(cache, "*.plan")))

    first = run(dloss_run, example, os.path.join(out, "first"), inputs, [], env)
    check(first.returncode == 0,
          "the first run compiles and runs\n" + first.stdout + first.stderr)
    if first.returncode != 0:
        sys.exit("FAIL")
    check(len(entries()) == 1, "it left one cache entry: %s" % entries())
    check(os.path.getsize(os.path.join(out, "first", "loss.plan")) > 0,
          "it wrote OUT/loss.plan")

    second = run(dloss_run, example, os.path.join(out, "second"), inputs, [],
                 no_compiler)
    check(second.returncode == 0,
          "without the compiler library the cached plan runs\n" +
          second.stdout + second.stderr)
    if second.returncode == 0:
        check(losses(os.path.join(out, "second")) ==
              losses(os.path.join(out, "first")),
              "the cached plan gives the first run's losses, bit for bit")

    third = run(dloss_run, example, os.path.join(out, "third"), inputs,
                ["--no-fuse"], no_compiler)
    key = re.search(r"not in the plan cache \(key ([0-9a-f]{32}) in (\S+)\)",
                    third.stderr)
    check(third.returncode == 1 and key is not None and
          key.group(2) == cache and
          "DLOSS_COMPILER_LIBRARY" in third.stderr and
          not os.path.exists(os.path.join(out, "third", "rank0")),
          "other options without the compiler: an error naming the key and "
          "the cache, before any rank starts\n" + third.stderr)
    if key:
        check(not os.path.exists(os.path.join(cache, key.group(1) + ".plan")),
              "the key it names is a new one")

    general = run(dloss_run, example, os.path.join(out, "general"), inputs,
                  ["--general-fusion-only"], env)
    check(general.returncode == 0 and len(entries()) == 2,
          "--general-fusion-only is another entry: %s\n%s" %
          (entries(), general.stderr))

    # Truncate the default plan's entry (it ends with the plan bytes of
    # OUT/loss.plan): detected, recompiled, never run.
    with open(os.path.join(out, "first", "loss.plan"), "rb") as f:
        plan = f.read()
    truncated = None
    for entry in entries():
        with open(entry, "rb") as f:
            data = f.read()
        if data.endswith(plan):
            with open(entry, "wb") as f:
                f.write(data[:len(data) - len(plan) // 2])
            truncated = entry
    check(truncated is not None, "found the default plan's entry")
    fourth = run(dloss_run, example, os.path.join(out, "fourth"), inputs, [],
                 env)
    check(fourth.returncode == 0 and
          "is truncated or has trailing bytes; it was removed and the loss "
          "is compiled again" in fourth.stderr,
          "a truncated entry is reported and compiled again\n" +
          fourth.stderr)
    if fourth.returncode == 0:
        check(losses(os.path.join(out, "fourth")) ==
              losses(os.path.join(out, "first")),
              "the recompiled plan gives the first run's losses")
    check(len(entries()) == 2, "the entry was replaced: %s" % entries())

    if failures:
        sys.exit("FAIL: %d check(s)" % len(failures))
    print("PASS")


if __name__ == "__main__":
    main()
