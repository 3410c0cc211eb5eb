"""`python -m dloss.open_clip_train` where OpenCLIP's trainer cannot run: in
this venv (the CPU torch 2.13.0) open_clip_train is installed but cannot
import, since torchvision has no build that pairs with this torch. The
command must say so in one message with the install command, not a
traceback. The trainer itself is tested where it runs:
test/open_clip_train/test_trainer.py (scripts/cuda-build.sh)."""

import os
import subprocess
import sys
import unittest

import upstream


class TrainerThatCannotImport(unittest.TestCase):
    def test_names_the_version_and_the_install_command(self):
        upstream.open_clip_loss()  # open_clip_torch 3.3.0 is installed
        try:
            import open_clip_train.main  # noqa: F401
            self.fail("open_clip_train imports beside this torch: the "
                      "refusal cannot be checked here")
        except ImportError:
            pass
        done = subprocess.run(
            [sys.executable, "-m", "dloss.open_clip_train", "--help"],
            capture_output=True, text=True, timeout=120,
            env=dict(os.environ, OMP_NUM_THREADS="1"))
        self.assertEqual(done.returncode, 1, done.stderr)
        self.assertNotIn("Traceback", done.stderr)
        self.assertIn("OpenCLIP's trainer (open_clip_train.main), which "
                      "open_clip_torch 3.3.0 could not import", done.stderr)
        self.assertIn('pip install "dloss[open-clip-train]"', done.stderr)


if __name__ == "__main__":
    unittest.main()
