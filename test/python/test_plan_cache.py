"""The plan cache on disk: a second process compiles nothing (counted, not
timed); a truncated or corrupt entry is detected, reported, recompiled and
replaced, never executed; other options get other keys; DLOSS_CACHE_DIR=off
turns it off; a process without the compiler library (DLOSS_COMPILER_LIBRARY
naming none) runs the cached plans and names the key of one that is not
cached. Each case runs real processes, as users run jobs."""

import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
CLIP_MLIR = os.path.join(ROOT, "examples", "clip.mlir")

# One process: compile examples/clip.mlir, run it once on one rank (so a plan
# read from the cache is one that executes), print the cache counts as JSON.
PROGRAM = r"""
import json, sys, torch, torch.nn.functional as F
import dloss
from dloss import _C
dloss.init()  # a world of one: no launcher variables are set
loss_fn = dloss.compile(sys.argv[1], grad_mode=sys.argv[2])
g = torch.Generator().manual_seed(0)
image = F.normalize(torch.randn(4, 3, generator=g), dim=1).requires_grad_()
text = F.normalize(torch.randn(4, 3, generator=g), dim=1).requires_grad_()
loss = loss_fn(image, text, torch.tensor(10.0, requires_grad=True))
loss.backward()
stats = _C.plan_cache_stats()
stats["loss"] = float(loss)
stats["grad"] = float(image.grad.abs().sum())
print("STATS " + json.dumps(stats))
"""


# The same for a drop-in (a dloss.Graph built in C++, cached under its
# recording): OpenCLIP's ClipLoss signature, one rank.
DROP_IN = r"""
import json, torch, torch.nn.functional as F
import dloss
from dloss import _C
dloss.init()
g = torch.Generator().manual_seed(0)
image = F.normalize(torch.randn(4, 3, generator=g), dim=1).requires_grad_()
text = F.normalize(torch.randn(4, 3, generator=g), dim=1).requires_grad_()
loss = dloss.ClipLoss()(image, text, torch.tensor(10.0))
loss.backward()
stats = _C.plan_cache_stats()
stats["loss"] = float(loss)
stats["grad"] = float(image.grad.abs().sum())
print("STATS " + json.dumps(stats))
"""

# A machine without the compiler library, as far as the loader can tell.
NO_COMPILER = "/nonexistent/libdloss_compiler.so"


def start(cache_dir, grad_mode="ddp", compiler=None, program=PROGRAM):
    env = dict(os.environ, DLOSS_CACHE_DIR=cache_dir)
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        env.pop(name, None)
    if compiler:
        env["DLOSS_COMPILER_LIBRARY"] = compiler
    return subprocess.run(
        [sys.executable, "-c", program, CLIP_MLIR, grad_mode],
        env=env, capture_output=True, text=True, timeout=300)


def run(cache_dir, grad_mode="ddp", compiler=None, program=PROGRAM):
    done = start(cache_dir, grad_mode, compiler, program)
    if done.returncode != 0:
        raise AssertionError(f"the process failed:\n{done.stdout}\n{done.stderr}")
    line = [l for l in done.stdout.splitlines() if l.startswith("STATS ")][-1]
    return json.loads(line[len("STATS "):]), done.stderr


def entries(cache_dir):
    return sorted(f for f in os.listdir(cache_dir) if f.endswith(".plan"))


class PlanCacheTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="dloss-plan-cache-")

    def test_second_process_compiles_nothing(self):
        first, _ = run(self.dir)
        self.assertEqual(first["compiled"], 1)
        self.assertEqual(first["disk_hits"], 0)
        self.assertEqual(first["stored"], 1)
        self.assertEqual(first["directory"], self.dir)
        self.assertEqual(len(entries(self.dir)), 1)
        second, _ = run(self.dir)
        self.assertEqual(second["compiled"], 0)
        self.assertEqual(second["disk_hits"], 1)
        self.assertEqual(second["stored"], 0)
        # The cached plan is the same plan: same loss and gradient.
        self.assertEqual(second["loss"], first["loss"])
        self.assertEqual(second["grad"], first["grad"])

    def test_options_get_their_own_entry(self):
        from dloss import _C
        text = open(CLIP_MLIR).read()
        keys = {_C.plan_cache_key(text, "ddp"), _C.plan_cache_key(text, "global"),
                _C.plan_cache_key(text, "ddp", fuse=False),
                _C.plan_cache_key(text + " ", "ddp"),
                _C.plan_cache_key(text, "ddp", name="other.mlir")}
        self.assertEqual(len(keys), 5)
        self.assertEqual(_C.plan_cache_key(text, "ddp"),
                         _C.plan_cache_key(text, "ddp"))
        run(self.dir, "ddp")
        stats, _ = run(self.dir, "global")
        self.assertEqual(stats["compiled"], 1)
        self.assertEqual(len(entries(self.dir)), 2)

    def corrupt_and_rerun(self, damage):
        reference, _ = run(self.dir)
        path = os.path.join(self.dir, entries(self.dir)[0])
        with open(path, "rb") as f:
            data = bytearray(f.read())
        with open(path, "wb") as f:
            f.write(damage(data))
        stats, stderr = run(self.dir)
        self.assertEqual(stats["corrupt"], 1)
        self.assertEqual(stats["compiled"], 1)
        self.assertEqual(stats["disk_hits"], 0)
        self.assertIn("dloss: the cached plan '" + path, stderr)
        self.assertIn("compiled again", stderr)
        self.assertEqual(stats["loss"], reference["loss"])
        self.assertEqual(stats["grad"], reference["grad"])
        # Replaced by a good entry: the next process reads it.
        again, _ = run(self.dir)
        self.assertEqual((again["compiled"], again["disk_hits"]), (0, 1))
        return stderr

    def test_truncated_entry_is_recompiled(self):
        stderr = self.corrupt_and_rerun(lambda data: data[:len(data) // 2])
        self.assertIn("truncated", stderr)

    def test_flipped_byte_is_recompiled(self):
        def flip(data):
            data[-40] ^= 0x5A  # inside the plan, past every header
            return data
        stderr = self.corrupt_and_rerun(flip)
        self.assertIn("checksum", stderr)

    def test_foreign_file_is_recompiled(self):
        stderr = self.corrupt_and_rerun(lambda data: b"not a plan at all")
        self.assertIn("bad header", stderr)

    def test_off_writes_nothing(self):
        stats, _ = run("off")
        self.assertIsNone(stats["directory"])
        self.assertEqual((stats["compiled"], stats["stored"]), (1, 0))
        stats, _ = run("off")
        self.assertEqual(stats["compiled"], 1)

    def test_unwritable_directory_is_reported_and_ignored(self):
        blocker = os.path.join(self.dir, "file")
        open(blocker, "w").close()  # a file where the directory should be
        stats, stderr = run(os.path.join(blocker, "cache"))
        self.assertEqual((stats["compiled"], stats["stored"]), (1, 0))
        self.assertIn("cannot write the plan cache", stderr)

    def test_a_machine_without_the_compiler_runs_cached_plans(self):
        reference, _ = run(self.dir)
        stats, _ = run(self.dir, compiler=NO_COMPILER)
        self.assertEqual((stats["compiled"], stats["disk_hits"]), (0, 1))
        self.assertEqual(stats["loss"], reference["loss"])
        self.assertEqual(stats["grad"], reference["grad"])

    def test_a_machine_without_the_compiler_runs_cached_drop_ins(self):
        reference, _ = run(self.dir, program=DROP_IN)
        self.assertEqual(reference["compiled"], 1)
        stats, _ = run(self.dir, compiler=NO_COMPILER, program=DROP_IN)
        self.assertEqual((stats["compiled"], stats["disk_hits"]), (0, 1))
        self.assertEqual(stats["loss"], reference["loss"])
        self.assertEqual(stats["grad"], reference["grad"])
        # Without the cache, the same drop-in says what it would need.
        done = start(tempfile.mkdtemp(prefix="dloss-empty-cache-"),
                     compiler=NO_COMPILER, program=DROP_IN)
        self.assertNotEqual(done.returncode, 0)
        self.assertIn("is not in the plan cache (key ", done.stderr)

    def test_without_the_compiler_an_uncached_plan_names_its_key(self):
        from dloss import _C
        run(self.dir, "ddp")
        done = start(self.dir, "global", compiler=NO_COMPILER)
        self.assertNotEqual(done.returncode, 0)
        key = _C.plan_cache_key(open(CLIP_MLIR).read(), "global", name=CLIP_MLIR)
        self.assertIn("is not in the plan cache (key %s in %s)" % (key, self.dir),
                      done.stderr)
        self.assertIn("this machine cannot compile it", done.stderr)
        self.assertIn(NO_COMPILER, done.stderr)
        self.assertIn("DLOSS_CACHE_DIR", done.stderr)


if __name__ == "__main__":
    unittest.main()
