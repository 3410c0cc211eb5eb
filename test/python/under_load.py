"""Runs unittest modules with every core busy: one spinning process per
core beside them, for as long as they run. The flake check: a
multi-process test that passes only on an idle machine fails here, as it
would one day in CI beside the CUDA build.

    python under_load.py test_root_cause [more modules]
"""

import multiprocessing
import os
import sys
import unittest


def _spin():
    while True:
        pass


def main(modules):
    spinners = [multiprocessing.Process(target=_spin, daemon=True)
                for _ in range(os.cpu_count() or 2)]
    for spinner in spinners:
        spinner.start()
    try:
        suite = unittest.defaultTestLoader.loadTestsFromNames(modules)
        result = unittest.TextTestRunner(verbosity=2).run(suite)
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.join()
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
