"""The main job's training demo (scripts/demo.sh, README command 1) at a
reduced size: examples/python/train_clip.py and train_arcface.py on 4 ranks
through examples/python/launch.py, 4 steps each. Each must exit 0, print
PASS (dloss's parameters equal the single-process run's) and save its plot,
so the demo cannot rot unnoticed.

The output must also be clean (issue #51): every line, from all four ranks'
stdout and stderr, one of the kinds the demo prints (step lines, the timing
line, once, after them, the summaries, the plot, the check). A torch warning,
a `[W ...]` or `[c10d]` log line, a traceback or a C++ backtrace is none of
those: it fails the test, which prints it. No line's numbers are checked, so
a loaded machine passes as well as a quiet one."""

import os
import re
import subprocess
import sys
import tempfile
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
EXAMPLES = os.path.join(REPO, "examples", "python")

NUMBER = r"[-+0-9.e]+"
# The lines the demo prints (examples/python/train_*.py, demo_utils.py).
STEP = re.compile(r"\[(clip|arcface), (dloss|hand-written)\] step +\d+/\d+ "
                  r" loss +%s  batch [0-9+]+= *\d+ +%s ms  "
                  r"max\|param - 1 process\| %s$" % (NUMBER, NUMBER, NUMBER))
TIMING = re.compile(r"timing: at this size \(about \d+ samples per process, "
                    r"\d+ processes on \d+ cores\) .*\(bench/README\.md\)$")
EXPECTED = [
    STEP,
    TIMING,
    re.compile(r"CLIP, \d+ steps on \d+ ranks: max \|param - single-process "
               r"param\| dloss %s, hand-written gathering %s$" %
               (NUMBER, NUMBER)),
    re.compile(r"ArcFace, \d+ steps on \d+ ranks: max \|param - "
               r"single-process param\| \(backbone and W\) dloss %s, "
               r"hand-written %s$" % (NUMBER, NUMBER)),
    re.compile(r"ArcFace W \(outside DDP\), max difference between ranks: "
               r"dloss %s, hand-written %s$" % (NUMBER, NUMBER)),
    # What dloss says of the hand-written loss's W: the demo shows it.
    re.compile(r"dloss\.assert_grads_synced on the hand-written loss: dloss "
               r"error \[rank 0, op dloss\.assert_grads_synced at [^]]*\]: "
               r"gradients differ between ranks .*"),
    re.compile(r"plot: \S+\.png$"),
    re.compile(r"(CLIP|ArcFace) check \(.*\): PASS$"),
]


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
            self.assertClean(result.stdout)
            return result.stdout

    def assertClean(self, output):
        """Every line of `output` is one the demo prints, and the timing
        line comes once, after the step lines."""
        lines = output.splitlines()
        unexpected = [line for line in lines
                      if not any(p.match(line) for p in EXPECTED)]
        if unexpected:
            self.fail("the demo printed %d line(s) of no kind it prints:\n%s"
                      "\n\nits whole output:\n%s" %
                      (len(unexpected), "\n".join(unexpected), output))
        timing = [i for i, line in enumerate(lines) if TIMING.match(line)]
        steps = [i for i, line in enumerate(lines) if STEP.match(line)]
        self.assertEqual(len(timing), 1, output)
        self.assertGreater(timing[0], max(steps), output)

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
