"""scikit-build-core's dynamic metadata for dloss's two wheels (a local
provider: each pyproject.toml's [tool.scikit-build.metadata]).

The version has one source, ``project(dloss VERSION ...)`` in CMakeLists.txt,
for both wheels. The compiler's identity, the hash of its sources that the
plan cache keys on and the loader checks (cmake/DlossCompilerIdentity.cmake),
ties the pair:

- ``version``: the project's, ``0.1.0`` (dloss); with ``compiler-label =
  true`` in the settings, the identity's label as its local label,
  ``0.1.0+6faee17dffa7`` (dloss-compiler);
- ``dependencies`` (dloss): ``torch==`` the release the extension is built
  against, and ``dloss-compiler==`` that compiler's version, so that pip
  installs no other torch or compiler beside this runtime.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _cmake():
    """cmake from PATH, else PyPI's cmake package (a build requirement)."""
    found = shutil.which("cmake")
    if found:
        return found
    try:
        import cmake  # noqa: PLC0415

        return os.path.join(cmake.CMAKE_BIN_DIR, "cmake")
    except ImportError:
        sys.exit("dloss: building needs cmake 3.20 or later: pip install cmake")


def compiler_label():
    """The compiler identity's label, from the one script that computes it."""
    out = subprocess.run(
        [_cmake(), f"-DSOURCE_DIR={ROOT}", "-DLABEL=ON", "-P",
         str(ROOT / "cmake" / "DlossCompilerIdentity.cmake")],
        check=True, capture_output=True, text=True).stdout.strip()
    if not re.fullmatch(r"[0-9a-f]+", out):
        raise RuntimeError(f"cmake/DlossCompilerIdentity.cmake printed {out!r}, not a hex label")
    return out


def project_version():
    """The project's version: project(dloss VERSION ...) in CMakeLists.txt."""
    text = (ROOT / "CMakeLists.txt").read_text()
    return re.search(r"project\(dloss VERSION ([0-9.]+)", text).group(1)


def compiler_version():
    """dloss-compiler's version: the project's, with the identity's label."""
    return f"{project_version()}+{compiler_label()}"


def torch_requirement():
    """torch of the release the extension builds against (the build is
    --no-build-isolation: this Python's torch is CMake's, cmake/DlossTorch.cmake).
    The release without its local label: PEP 440 then matches every build of
    it (2.13.0+cpu, 2.13.0+cu128), which share the C++ ABI; `import dloss`
    compares the same release (python/dloss/_check.py)."""
    try:
        import torch  # noqa: PLC0415
    except ImportError as e:
        sys.exit(f"dloss: building needs torch in the building Python ({sys.executable}: {e}). "
                 f"dloss's extension builds against the torch it will run with: install "
                 f"torch, then build without isolation: pip install --no-build-isolation .")
    return f"torch=={torch.__version__.partition('+')[0]}"


def dynamic_metadata(field, settings):
    if field == "version":
        return compiler_version() if settings.get("compiler-label") else project_version()
    if field == "dependencies":
        return [torch_requirement(), f"dloss-compiler=={compiler_version()}"]
    raise RuntimeError(f"dloss_build_metadata provides version and dependencies, not {field}")
