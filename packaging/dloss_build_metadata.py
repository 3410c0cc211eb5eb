"""scikit-build-core's dynamic metadata for dloss's two wheels (a local
provider: each pyproject.toml's [tool.scikit-build.metadata]).

The version has one source, ``project(dloss VERSION ...)`` in CMakeLists.txt,
for both wheels. The compiler's identity, the hash of its sources that the
plan cache keys on and the loader checks (cmake/DlossCompilerIdentity.cmake),
ties the pair:

- ``version``: the project's, ``0.1.0`` (dloss); with ``compiler-label =
  true`` in the settings, the identity's label as its local label,
  ``0.1.0+6faee17dffa7`` (dloss-compiler);
- ``dependencies`` (dloss): the settings' ``requires`` plus
  ``dloss-compiler==`` that compiler's version, so that pip installs no
  other compiler beside this runtime.
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


def dynamic_metadata(field, settings):
    if field == "version":
        return compiler_version() if settings.get("compiler-label") else project_version()
    if field == "dependencies":
        return [*settings.get("requires", []), f"dloss-compiler=={compiler_version()}"]
    raise RuntimeError(f"dloss_build_metadata provides version and dependencies, not {field}")
