"""The files the lint checks read: those git tracks, and new ones git does
not ignore, as paths from the repository root."""
import pathlib
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[2]


def tracked(folders=(), suffixes=None):
    """The files under `folders` (all when empty) whose names end in one of
    `suffixes` (any when None), sorted."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z",
         "--", *folders],
        cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return sorted({p for p in listed.split("\0")
                   if p and (suffixes is None or p.endswith(suffixes))
                   and (ROOT / p).exists()})
