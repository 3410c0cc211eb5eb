"""`import dloss` and the dloss-compiler wheel: the pair must be of one
compiler's sources (dloss/_check.py, check_compiler_pair).

The wheel's version carries the compiler's identity as its local label
(packaging/dloss_build_metadata.py). Each case puts a real installed
distribution of dloss-compiler (the .dist-info folder pip writes, with the
version under test) on sys.path, where importlib.metadata finds it, and
makes the loader's choice (_C.compiler_library_path) that wheel's library, as
in a pip install. A wheel of another identity fails with both versions and
the fix; the right one, none, or another library chosen (DLOSS_COMPILER_LIBRARY,
one beside the JIT) pass. The wheels'
own pairing is proved end to end by wheel-install and pip-install-sdist.
"""

import os
import sys
import tempfile
import unittest
from unittest import mock

import dloss
from dloss import _C, _check


class CompilerPairTest(unittest.TestCase):
    def setUp(self):
        self.site = tempfile.TemporaryDirectory()
        self.lib = tempfile.TemporaryDirectory()
        self.addCleanup(self.site.cleanup)
        self.addCleanup(self.lib.cleanup)
        # The loader would take the wheel's library.
        self.loaded = os.path.join(self.site.name, _check.WHEEL_LIBRARY)
        patcher = mock.patch.object(_C, "compiler_library_path",
                                    lambda: self.loaded)
        patcher.start()
        self.addCleanup(patcher.stop)
        sys.path.insert(0, self.site.name)
        self.addCleanup(sys.path.remove, self.site.name)

    def install(self, version):
        """Writes dloss-compiler's metadata, as pip installs it, at VERSION."""
        info = os.path.join(self.site.name, f"dloss_compiler-{version}.dist-info")
        os.makedirs(info)
        with open(os.path.join(info, "METADATA"), "w") as f:
            f.write(f"Metadata-Version: 2.1\nName: dloss-compiler\nVersion: {version}\n")

    def test_a_wheel_of_other_sources_fails_at_import_naming_both(self):
        own = _C.compiler_label
        other = "0123456789ab" if own != "0123456789ab" else "ba9876543210"
        self.install(f"0.1.0+{other}")
        with self.assertRaises(ImportError) as caught:
            _check.check_compiler_pair()
        message = str(caught.exception)
        print(message)
        self.assertIn(f"dloss-compiler 0.1.0+{other}", message)
        self.assertIn(f"identity {own}", message)
        self.assertIn(f"dloss-compiler==0.1.0+{own}", message)
        self.assertIn("pip wheel packaging/compiler", message)

    def test_a_wheel_without_an_identity_fails(self):
        self.install("0.1.0")
        with self.assertRaisesRegex(ImportError, "of no identity"):
            _check.check_compiler_pair()

    def test_the_wheel_of_these_sources_passes(self):
        self.install(f"0.1.0+{_C.compiler_label}")
        _check.check_compiler_pair()

    def test_the_label_is_the_identitys_start(self):
        # The wheel's label and the loader's identity are one hash
        # (cmake/DlossCompilerIdentity.cmake cuts the one from the other).
        self.assertRegex(_C.compiler_label, r"^[0-9a-f]+$")
        self.assertTrue(_C.compiler_identity.startswith(_C.compiler_label),
                        (_C.compiler_label, _C.compiler_identity))

    def test_no_wheel_passes(self):
        # Cached plans still run; the first compile names what to install.
        _check.check_compiler_pair()

    def test_another_library_loaded_is_not_the_wheels(self):
        # DLOSS_COMPILER_LIBRARY, or one beside the JIT: the wheel's
        # library is not the one loaded, whatever its version.
        self.install("0.1.0+0123456789ab")
        self.loaded = os.path.join(self.lib.name, "libdloss_compiler.so")
        _check.check_compiler_pair()


class LibraryPathTest(unittest.TestCase):
    """_C.compiler_library_path is the loader's own choice."""

    def test_it_follows_the_environment_then_the_jit(self):
        with mock.patch.dict(os.environ):
            os.environ["DLOSS_COMPILER_LIBRARY"] = "/somewhere/libdloss_compiler.so"
            self.assertEqual(_C.compiler_library_path(),
                             "/somewhere/libdloss_compiler.so")
            del os.environ["DLOSS_COMPILER_LIBRARY"]
            # The build tree: beside the JIT (frontend/), where it was built.
            path = _C.compiler_library_path()
        self.assertTrue(os.path.exists(path), path)
        self.assertTrue(os.path.exists(os.path.join(os.path.dirname(path),
                                                    "libdloss_jit.so")), path)
        self.assertTrue(dloss.__file__)


if __name__ == "__main__":
    unittest.main()
