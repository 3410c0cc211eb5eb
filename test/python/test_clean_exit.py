"""A successful multi-rank run ends clean: no torch warning about a store
connection and no C++ backtrace in its output.

At exit each rank writes its exit record to the group's store (hosted by
rank 0) and to the records' mirror (hosted by the last rank). A host that
left first made every later write log torch's "[c10d] sendBytes failed ...
Broken pipe" with a backtrace through dloss's store (issue #50). The hosts
now wait a bounded time for their peers' exit records, a plain exit raises
no alarm, and a stopping store drops its queued posts. Three runs on 4 CPU
Gloo ranks, each failing on any such line in its combined output:

- the README demo's training (examples/python/train_clip.py through
  launch.py) at 3 steps;
- the Lightning example (examples/lightning/clip_lightning.py) at 3 steps;
- a script whose store hosts (ranks 0 and 3) end first and whose other ranks
  end 1.5 s later: the order that broke the pipe every time.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

import multiproc

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
WORLD = 4
# What torch prints when a store write finds its host gone, and the C++
# backtrace it appends.
DIRTY = re.compile(r"sendBytes|Broken pipe|Connection reset|"
                   r"Exception raised from|frame #")

HOSTS_LEAVE_FIRST = '''\
import os, time
import torch
import dloss

rank, world = dloss.init(backend="gloo", timeout=60)
torch.set_num_threads(1)
loss = dloss.ClipLoss()
gen = torch.Generator().manual_seed(rank)
for _ in range(3):
    image = torch.randn(3 + rank, 8, generator=gen, requires_grad=True)
    text = torch.randn(3 + rank, 8, generator=gen, requires_grad=True)
    loss(image, text, 10.0).backward()
if rank not in (0, world - 1):
    time.sleep(1.5)  # the store hosts end first
print("rank %d done" % rank, flush=True)
'''


class CleanExitTest(unittest.TestCase):

    def assertClean(self, output, what):
        dirty = [line for line in output.splitlines() if DIRTY.search(line)]
        self.assertEqual(dirty, [], "%s printed %d line(s) of a store failure "
                         "at exit:\n%s" % (what, len(dirty), output[-6000:]))

    def run_example(self, path, *args):
        """The combined output of examples/`path` run with `args`, which
        must exit 0, print PASS and nothing of a store failure."""
        result = subprocess.run(
            [sys.executable, os.path.join(REPO, "examples", path)] +
            list(args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, timeout=180, env=dict(os.environ, OMP_NUM_THREADS="1"))
        self.assertEqual(result.returncode, 0, result.stdout[-6000:])
        self.assertIn(": PASS", result.stdout)
        self.assertClean(result.stdout, path)

    def test_the_demo_training(self):
        with tempfile.TemporaryDirectory() as out:
            self.run_example(
                os.path.join("python", "launch.py"), "--nproc", str(WORLD),
                os.path.join(REPO, "examples", "python", "train_clip.py"),
                "--steps", "3", "--out", out)

    def test_the_lightning_example(self):
        self.run_example(os.path.join("lightning", "clip_lightning.py"),
                         "--steps", "3", "--devices", str(WORLD))

    def test_the_store_hosts_end_first(self):
        directory, script, _ = multiproc.script_dir(HOSTS_LEAVE_FIRST,
                                                    "dloss-clean-exit-")
        port = multiproc.free_port()
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   WORLD_SIZE=str(WORLD), OMP_NUM_THREADS="1")
        procs = [subprocess.Popen(
            [sys.executable, script],
            env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for r in range(WORLD)]
        outputs = []
        try:
            for p in procs:
                outputs.append(p.communicate(timeout=120)[0])
        finally:
            for p in procs:  # a rank that hangs fails the test
                if p.poll() is None:
                    p.kill()
                    p.wait()
            shutil.rmtree(directory, ignore_errors=True)
        for r, p in enumerate(procs):
            self.assertEqual(p.returncode, 0, outputs[r][-3000:])
            self.assertIn("rank %d done" % r, outputs[r])
            self.assertClean(outputs[r], "rank %d" % r)


if __name__ == "__main__":
    unittest.main()
