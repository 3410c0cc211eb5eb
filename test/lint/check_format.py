"""The `format` test: every C++ and CUDA source file git tracks is as the
pinned clang-format (test/requirements.txt) writes it, under the repository's
.clang-format.

    python test/lint/check_format.py          # exit 1, naming each file and its first change
    python test/lint/check_format.py --fix    # rewrite them (scripts/format.sh)
"""
import difflib
import pathlib
import shutil
import subprocess
import sys

from tracked import ROOT, tracked

SUFFIXES = (".cpp", ".h", ".cu", ".cuh")


def pinned_version():
    for line in (ROOT / "test" / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line.startswith("clang-format=="):
            return line.split("==", 1)[1]
    sys.exit("test/requirements.txt pins no clang-format: add `clang-format==X.Y.Z`")


def clang_format(version):
    """The clang-format of the Python running this (scripts/setup.sh puts the
    pinned one in the venv), checked to be the pinned version."""
    here = pathlib.Path(sys.executable).parent / "clang-format"
    tool = str(here) if here.exists() else shutil.which("clang-format")
    setup = ("Run `bash scripts/setup.sh` (it installs the pinned clang-format into "
             "the venv), or `pip install clang-format==%s` into %s" % (version, sys.prefix))
    if tool is None:
        sys.exit("format: no clang-format next to %s or on PATH. %s" % (sys.executable, setup))
    found = subprocess.run([tool, "--version"], capture_output=True, text=True).stdout
    if ("version %s" % version) not in found:
        sys.exit("format: %s is `%s`, not the pinned %s: another version formats "
                 "differently. %s" % (tool, found.strip(), version, setup))
    return tool


def main(argv):
    fix = "--fix" in argv
    tool = clang_format(pinned_version())
    paths = tracked(suffixes=SUFFIXES)
    changed = []
    for path in paths:
        text = (ROOT / path).read_text()
        formatted = subprocess.run([tool, "--style=file", "--assume-filename=" + path],
                                   input=text, capture_output=True, text=True,
                                   cwd=ROOT, check=True).stdout
        if formatted == text:
            continue
        changed.append(path)
        if fix:
            (ROOT / path).write_text(formatted)
            continue
        diff = list(difflib.unified_diff(text.splitlines(), formatted.splitlines(),
                                         path, path + " (formatted)", n=0, lineterm=""))
        hunks = sum(1 for line in diff if line.startswith("@@"))
        print("%s: %d hunk(s) differ from clang-format; the first:" % (path, hunks))
        hunk = diff[2:]  # past the two file-name lines
        end = next((i for i, line in enumerate(hunk[1:], 1) if line.startswith("@@")),
                   len(hunk))
        print("\n".join("    " + line for line in hunk[:min(end, 12)]))
    if fix:
        print("format: rewrote %d file(s)" % len(changed))
        return 0
    if changed:
        print("format: %d of %d C++/CUDA files are not as clang-format writes them. "
              "Run `bash scripts/format.sh` and commit the result." % (
                  len(changed), len(paths)))
        return 1
    print("format: all %d C++/CUDA files are formatted" % len(paths))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
