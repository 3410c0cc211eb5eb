#!/usr/bin/env python3
"""Cross-checks dloss::npy against real NumPy: numpy writes, dloss-npy-roundtrip loads and saves, numpy reads back.

usage: npy_numpy_check.py PATH/TO/dloss-npy-roundtrip
Exits 77 (ctest SKIP_RETURN_CODE) when this interpreter has no numpy.
"""
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
except ImportError:
    print("SKIP: numpy is not installed for", sys.executable)
    sys.exit(77)


def cases():
    rng = np.random.default_rng(1234)
    floats = rng.standard_normal((3, 5)) * 1000
    floats[0, :4] = [np.inf, -np.inf, np.nan, -0.0]
    yield "float32", floats.astype(np.float32)
    yield "float64", floats
    yield "float16", floats.astype(np.float16)
    yield "int64", rng.integers(-2**62, 2**62, (4, 3), dtype=np.int64)
    yield "int32", rng.integers(-2**31, 2**31, (2, 3, 4), dtype=np.int32)
    yield "int16", rng.integers(-2**15, 2**15, (7,), dtype=np.int16)
    yield "int8", rng.integers(-128, 128, (4, 4), dtype=np.int8)
    yield "uint8", rng.integers(0, 256, (5, 2), dtype=np.uint8)
    yield "bool", rng.integers(0, 2, (3, 3)).astype(np.bool_)
    yield "scalar_0d", np.array(3.25, dtype=np.float64)
    yield "bool_0d", np.array(True)
    yield "zero_size", np.zeros((3, 0, 2), dtype=np.float32)
    yield "empty_1d", np.zeros((0,), dtype=np.int64)
    yield "wide_header", np.zeros((1,) * 30, dtype=np.uint8)
    yield "fortran_2d", np.asfortranarray(np.arange(12, dtype=np.int32).reshape(3, 4))
    yield "fortran_3d", np.asfortranarray(rng.standard_normal((2, 3, 4)))
    yield "non_contiguous_view", np.arange(40, dtype=np.float32).reshape(5, 8)[:, ::3]


# Inputs dloss must refuse with a clear error (exit 1, file named), not load.
def rejected():
    yield "big_endian", np.arange(3, dtype=">f4"), "big-endian"
    yield "complex", np.zeros(2, dtype=np.complex64), "unsupported dtype '<c8'"
    yield "uint32", np.zeros(2, dtype=np.uint32), "unsupported dtype '<u4'"
    yield "structured", np.zeros(2, dtype=[("a", "<f4"), ("b", "<i4")]), "structured"


def run(tool, src, dst):
    return subprocess.run([tool, src, dst], capture_output=True, text=True)


def main():
    tool = sys.argv[1]
    failures = []
    with tempfile.TemporaryDirectory(prefix="dloss-npy-check-") as tmp:
        for name, array in cases():
            src = os.path.join(tmp, name + ".in.npy")
            dst = os.path.join(tmp, name + ".out.npy")
            np.save(src, array)
            result = run(tool, src, dst)
            if result.returncode != 0:
                failures.append(f"{name}: exit {result.returncode}: {result.stderr.strip()}")
                continue
            back = np.load(dst)
            # (np.ascontiguousarray would turn 0-d arrays into 1-d ones.)
            expected = np.array(array, order="C")
            if back.dtype != expected.dtype or back.shape != expected.shape:
                failures.append(f"{name}: got {back.dtype}{back.shape}, expected {expected.dtype}{expected.shape}")
            elif back.tobytes() != expected.tobytes():
                failures.append(f"{name}: element bytes differ")
            # For C-ordered input our file must be numpy's, byte for byte.
            elif array.flags.c_contiguous:
                with open(src, "rb") as a, open(dst, "rb") as b:
                    if a.read() != b.read():
                        failures.append(f"{name}: file differs from numpy.save's")
            print(f"ok   {name} {array.dtype}{array.shape}")

        # numpy writes format 2.0 when the header exceeds 65535 bytes; make
        # one by hand-rewriting a 1.0 file as 2.0 (and 3.0) with the same header.
        array = np.arange(6, dtype=np.float32).reshape(2, 3)
        for major in (2, 3):
            src = os.path.join(tmp, f"v{major}.in.npy")
            dst = os.path.join(tmp, f"v{major}.out.npy")
            with open(src, "wb") as f:
                np.lib.format.write_array(f, array, version=(major, 0))
            result = run(tool, src, dst)
            if result.returncode != 0 or not np.array_equal(np.load(dst), array):
                failures.append(f"version {major}.0: exit {result.returncode}: {result.stderr.strip()}")
            else:
                print(f"ok   version {major}.0")

        for name, array, phrase in rejected():
            src = os.path.join(tmp, name + ".in.npy")
            dst = os.path.join(tmp, name + ".out.npy")
            np.save(src, array)
            result = run(tool, src, dst)
            message = result.stderr.strip()
            if result.returncode != 1 or src not in message or phrase not in message:
                failures.append(f"{name}: expected exit 1 naming the file and '{phrase}', got exit {result.returncode}: {message}")
            elif os.path.exists(dst):
                failures.append(f"{name}: an output file was written")
            else:
                print(f"ok   {name} rejected: {message}")

    for failure in failures:
        print("FAIL", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
