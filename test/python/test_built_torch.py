"""`import dloss` under another torch release than the one dloss._C is built
against (dloss/_check.py, check_built_torch): an ImportError naming both
versions and what to install, raised before _C loads, since under another
torch _C may fail to load with a bare undefined symbol. The same release of
another build (2.13.0+cpu against 2.13.0+cu128) passes, as the wheel's
requirement, torch==<release>, lets pip install it.

The build's own torch is recorded by CMake (dloss/_built_against.py); the
wheel's pin on it is checked end to end by wheel-install.
"""

import os
import subprocess
import sys
import unittest
from unittest import mock

import torch

from dloss import _check

OTHER = "1.13.1+cpu"  # a release dloss never builds against (it needs 2.x)


class BuiltTorchTest(unittest.TestCase):
    def test_the_build_records_this_torch(self):
        # The tests run with the torch the build tree was configured with.
        self.assertEqual(_check.BUILT_TORCH, torch.__version__)
        _check.check_built_torch()

    def test_another_release_fails_naming_both_and_the_fix(self):
        with mock.patch.object(_check, "BUILT_TORCH", OTHER):
            with self.assertRaises(ImportError) as caught:
                _check.check_built_torch()
        message = str(caught.exception)
        print(message)
        self.assertIn(f"built against torch {OTHER}", message)
        self.assertIn(f"runs torch {torch.__version__}", message)
        self.assertIn('pip install "torch==1.13.1"', message)
        self.assertIn("--no-build-isolation", message)

    def test_another_build_of_the_same_release_passes(self):
        label = "cpu" if not torch.__version__.endswith("+cpu") else "cu128"
        built = f"{_check.release(torch.__version__)}+{label}"
        with mock.patch.object(_check, "BUILT_TORCH", built):
            _check.check_built_torch()

    def test_import_fails_before_the_extension_loads(self):
        # A fresh interpreter whose dloss says it was built against OTHER.
        code = (
            "import sys, types\n"
            "fake = types.ModuleType('dloss._built_against')\n"
            f"fake.TORCH_VERSION = {OTHER!r}\n"
            "sys.modules['dloss._built_against'] = fake\n"
            "try:\n"
            "    import dloss\n"
            "except ImportError as e:\n"
            "    print('ImportError:', e)\n"
            "print('_C loaded:', 'dloss._C' in sys.modules)\n")
        run = subprocess.run([sys.executable, "-c", code], capture_output=True,
                             text=True, timeout=300, env=os.environ.copy())
        print(run.stdout, run.stderr)
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertIn(f"ImportError: dloss was built against torch {OTHER}", run.stdout)
        self.assertIn("_C loaded: False", run.stdout)


if __name__ == "__main__":
    unittest.main()
