"""The main job's training demo (scripts/demo.sh, README command 1) at a
reduced size: examples/python/train_clip.py and train_arcface.py on 4 ranks
through examples/python/launch.py, 4 steps each. Each must exit 0, print
PASS (dloss's parameters equal the single-process run's) and save its plot,
so the demo cannot rot unnoticed."""

import os
import subprocess
import sys
import tempfile
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
EXAMPLES = os.path.join(REPO, "examples", "python")


class DemoTest(unittest.TestCase):

    def run_demo(self, script, plot):
        with tempfile.TemporaryDirectory() as out:
            result = subprocess.run(
                [sys.executable, os.path.join(EXAMPLES, "launch.py"),
                 "--nproc", "4", os.path.join(EXAMPLES, script),
                 "--steps", "4", "--out", out],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))
            self.assertEqual(result.returncode, 0, result.stdout)
            self.assertIn("): PASS", result.stdout, result.stdout)
            self.assertIn("step  4/4", result.stdout, result.stdout)
            self.assertTrue(os.path.getsize(os.path.join(out, plot)) > 0)
            return result.stdout

    def test_clip(self):
        out = self.run_demo("train_clip.py", "loss_clip.png")
        self.assertIn("hand-written gathering", out)

    def test_arcface(self):
        out = self.run_demo("train_arcface.py", "loss_arcface.png")
        # dloss keeps W identical on every rank; the per-rank loss does not.
        self.assertIn("between ranks: dloss 0.00e+00, hand-written", out)
        self.assertIn("W differs", out)


if __name__ == "__main__":
    unittest.main()
