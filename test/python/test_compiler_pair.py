"""`import dloss` and the dloss-compiler wheel: the pair must be of one
compiler's sources (dloss/_check.py, check_compiler_pair).

The wheel's version carries the compiler's identity as its local label
(packaging/dloss_build_metadata.py). Each case puts a real installed
distribution of dloss-compiler (the .dist-info folder pip writes, with the
version under test) on sys.path, where importlib.metadata finds it, and
points dloss at a library folder without a compiler library beside the JIT,
as in a pip install. A wheel of another identity fails with both versions and
the fix; the right one, none, or DLOSS_COMPILER_LIBRARY pass. The wheels'
own pairing is proved end to end by wheel-install and pip-install-sdist.
"""

import os
import sys
import tempfile
import unittest
from unittest import mock

import dloss
from dloss import _C, _check, _paths


class CompilerPairTest(unittest.TestCase):
    def setUp(self):
        self.site = tempfile.TemporaryDirectory()
        self.lib = tempfile.TemporaryDirectory()
        self.addCleanup(self.site.cleanup)
        self.addCleanup(self.lib.cleanup)
        # Not beside the JIT: the wheel's library would be the one loaded.
        patcher = mock.patch.object(_paths, "LIB_DIR", self.lib.name)
        patcher.start()
        self.addCleanup(patcher.stop)
        env = mock.patch.dict(os.environ)
        env.start()
        self.addCleanup(env.stop)
        os.environ.pop("DLOSS_COMPILER_LIBRARY", None)
        sys.path.insert(0, self.site.name)
        self.addCleanup(sys.path.remove, self.site.name)

    def install(self, version):
        """Writes dloss-compiler's metadata, as pip installs it, at VERSION."""
        info = os.path.join(self.site.name, f"dloss_compiler-{version}.dist-info")
        os.makedirs(info)
        with open(os.path.join(info, "METADATA"), "w") as f:
            f.write(f"Metadata-Version: 2.1\nName: dloss-compiler\nVersion: {version}\n")

    def test_a_wheel_of_other_sources_fails_at_import_naming_both(self):
        own = _C.compiler_identity[:12]
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
        self.install(f"0.1.0+{_C.compiler_identity[:12]}")
        _check.check_compiler_pair()

    def test_no_wheel_passes(self):
        # Cached plans still run; the first compile names what to install.
        _check.check_compiler_pair()

    def test_a_library_named_by_the_user_or_beside_the_jit_is_not_the_wheels(self):
        self.install("0.1.0+0123456789ab")
        os.environ["DLOSS_COMPILER_LIBRARY"] = "/somewhere/libdloss_compiler.so"
        _check.check_compiler_pair()
        del os.environ["DLOSS_COMPILER_LIBRARY"]
        open(os.path.join(self.lib.name, "libdloss_compiler.so"), "w").close()
        _check.check_compiler_pair()



class LibDirTest(unittest.TestCase):
    def test_lib_dir_is_where_the_jit_lies(self):
        # The check's "beside the JIT" is the folder the C++ loader looks in
        # (frontend/CompilerLibrary.cpp): the build tree's frontend/ here.
        jit = os.path.join(_paths.LIB_DIR, "libdloss_jit.so")
        self.assertTrue(os.path.exists(jit), f"{jit} (dloss/_paths.py LIB_DIR) does not exist")
        self.assertTrue(dloss.__file__)


if __name__ == "__main__":
    unittest.main()
