"""Compiles on the CPU every plan that test_cuda.py's CUDA classes
(CudaDropInTest, CudaRanksTest) compile on a GPU, into the plan cache
(DLOSS_CACHE_DIR), for a GPU machine whose dloss compiler library does not
load (scripts/gpu-prepare.sh carries the cache; docs/Cuda.md).

A plan's cache key is its source (a drop-in's graph recording, which holds
the dtype; a @dloss.loss function's trace, which holds its file and line),
the gradient mode, fuse, general-only, the plan format and the compiler's
identity (runtime/plan/PlanCache.cpp): never the device, the world size or
the tile (DLOSS_TILE is read at run time). So those classes' own test
methods, run here with each check's device "cuda" made "cpu" and NCCL made
Gloo, compile exactly their plans; the CPU dry run (CpuDryRunTest) does
not: it skips bfloat16 for ArcFaceLoss and PartialFC. On the CPU every
check compares a CPU call with the same CPU call, so it passes whatever the
kernels do: what this proves is that every plan is found (or compiled).

    cd test/python && PYTHONPATH=../../build/python:. python cuda_plans.py
        [--cache-only]

Exits 1 if a check failed. --cache-only is the proof that a filled cache
serves a machine without the compiler (run it with DLOSS_COMPILER_LIBRARY
pointing nowhere): a plan missing from the cache fails, and so does any
other failure, except that a loss traced from Python (NTXentLoss,
SupConLoss, @dloss.loss InfoNCE: dloss/trace.py) cannot run there at all,
whatever the cache holds: tracing asks the library for each op's shape, and
its plan's key holds the absolute paths of dloss's and the caller's files.
Those failures are counted and listed, not failed. The drop-ins built in
C++ (ClipLoss, SigLipLoss, ArcFaceLoss, PartialFC) must all pass.
"""

import functools
import sys
import unittest

import test_cuda

CUDA_CLASSES = (test_cuda.CudaDropInTest, test_cuda.CudaRanksTest)


def on_cpu(check):
    """`check` with its device "cuda" made "cpu" and backend "nccl" made
    "gloo" (NCCL has no CPU tensors)."""
    @functools.wraps(check)
    def run(test, device, *args, **kwargs):
        if kwargs.get("backend") == "nccl":
            kwargs["backend"] = "gloo"
        return check(test, "cpu" if device == "cuda" else device, *args,
                     **kwargs)
    return run


def traced_without_library(text):
    """Whether a failure's traceback is a loss traced from Python that
    could not load the compiler library (not a plan missing from the
    cache, whose message says so)."""
    return ("dloss/trace.py" in text and
            "compiler library could not be loaded" in text and
            "is not in the plan cache" not in text)


def main():
    cache_only = "--cache-only" in sys.argv[1:]
    for name in ("check_drop_ins", "check_autograd", "check_ranks"):
        setattr(test_cuda, name, on_cpu(getattr(test_cuda, name)))
    suite = unittest.TestSuite()
    for cls in CUDA_CLASSES:
        # The class's skip without a GPU; a test's own skips stay.
        cls.__unittest_skip__ = False
        suite.addTests(unittest.defaultTestLoader.loadTestsFromTestCase(cls))
    result = unittest.TextTestRunner(verbosity=1).run(suite)
    failures = result.failures + result.errors
    traced = [t for t, text in failures
              if cache_only and traced_without_library(text)]
    other = [t for t, text in failures
             if not (cache_only and traced_without_library(text))]
    from dloss import _C
    stats = _C.plan_cache_stats()
    print("cuda_plans: %d tests, %d failed, %d skipped; this process "
          "compiled %d plans, read %d from %s (the ranks' processes not "
          "counted)" % (result.testsRun, len(failures), len(result.skipped),
                        stats["compiled"], stats["disk_hits"],
                        stats["directory"]))
    if cache_only:
        print("cuda_plans: %d need the compiler library to trace (not a "
              "cache miss): %s" % (len(traced), briefly(traced)))
        print("cuda_plans: %d other failures: %s" % (len(other),
                                                     briefly(other)))
    return 1 if other else 0


def briefly(tests):
    """Tests by name, subtests counted by their loss (the `what` up to its
    device)."""
    counts = {}
    for t in tests:
        what = getattr(t, "params", {}).get("what")
        name = what.split(" cpu ")[0] if what else t.id().split(".")[-1]
        counts[name] = counts.get(name, 0) + 1
    return ", ".join("%s x%d" % kv for kv in sorted(counts.items())) or \
        "none"


if __name__ == "__main__":
    sys.exit(main())
