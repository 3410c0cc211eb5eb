#!/usr/bin/env python3
"""Bad calls of dloss-run on real processes: every rank must fail the same way.

Runs `dloss-run examples/clip.mlir --world 4 --timeout 20` with one wrong
input and checks that

  - the launcher exits non-zero, within 30 s and before the 20 s deadline
    (a validation error must never wait out a collective's deadline);
  - no process of the run is left behind;
  - EVERY rank prints one whole line `dloss-run: rank <r>: <message>` and the
    messages are identical (the preflight's promise: the same clear error on
    every rank), or, where the brief allows it, the launcher refuses the call
    before any rank starts;
  - the message says what is wrong, where (rank, argument) and what to do.

usage: bad_calls.py DLOSS_RUN CLIP.mlir [--case NAME] [--out DIR]
Without --case every case runs. Exit 0 when all pass, 1 otherwise.
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

WORLD = 4
ROWS = 4
DIM = 16
TIMEOUT_ARG = 20   # --timeout given to dloss-run
WALL_LIMIT = 30.0  # the brief's bound on the whole run
HARD_KILL = 90     # we kill the run ourselves after this (never hang ctest)

try:
    import numpy as np
except ImportError:  # pragma: no cover
    print("bad_calls.py: numpy is missing; skipping")
    sys.exit(77)


def save(path, array):
    np.save(path, array)
    return path


def features(rng, rows, dim, dtype=np.float32):
    x = rng.standard_normal((rows, dim))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(dtype)


def good_inputs(out, rng, skip=()):
    """Writes image{r}.npy and text{r}.npy; returns the --input arguments."""
    for r in range(WORLD):
        save(os.path.join(out, f"image{r}.npy"), features(rng, ROWS, DIM))
        save(os.path.join(out, f"text{r}.npy"), features(rng, ROWS, DIM))
    args = {
        "image": f"image={os.path.join(out, 'image')}{{rank}}.npy",
        "text": f"text={os.path.join(out, 'text')}{{rank}}.npy",
        "scale": "scale=14.285714",
    }
    return {k: v for k, v in args.items() if k not in skip}


# Every case: (description, make(out, rng) -> list of --input values,
#              mode, [(what the check means, regex on the message)]).
# mode "every-rank": every rank must print the same message.
# mode "launcher-or-every-rank": the launcher may refuse the call before any
#      rank starts (no rank lines), else every rank prints the same message.


def case_feature_dim(out, rng):
    args = good_inputs(out, rng)
    save(os.path.join(out, "text2.npy"), features(rng, ROWS, 24))
    return list(args.values())


def case_dtype(out, rng):
    args = good_inputs(out, rng)
    save(os.path.join(out, "image1.npy"), features(rng, ROWS, DIM, np.float64))
    return list(args.values())


def case_rank(out, rng):
    args = good_inputs(out, rng)
    save(os.path.join(out, "text3.npy"), features(rng, 1, DIM)[0])  # shape [16]
    return list(args.values())


def case_missing_input(out, rng):
    return list(good_inputs(out, rng, skip=("text",)).values())


def case_unknown_input(out, rng):
    args = good_inputs(out, rng, skip=("text",))
    return list(args.values()) + [f"txt={os.path.join(out, 'text')}{{rank}}.npy"]


def case_unreadable_npy(out, rng):
    # Beyond the brief: one rank cannot read its file. The error is known
    # locally before any collective, so the preflight should carry it to
    # every rank (DESIGN.md: "local validation status") instead of leaving
    # the peers to wait out the rendezvous deadline.
    args = good_inputs(out, rng)
    os.remove(os.path.join(out, "text3.npy"))
    return list(args.values())


def case_nan_check(out, rng):
    # Check mode (DLOSS_CHECK=1, set by CASE_ENV): NaN inputs are a
    # preflight error on every rank.
    args = good_inputs(out, rng)
    text = features(rng, ROWS, DIM)
    text.reshape(-1)[[1, 5, 9]] = np.nan
    save(os.path.join(out, "text2.npy"), text)
    return list(args.values())


# Environment variables a case runs with.
CASE_ENV = {"nan-check": {"DLOSS_CHECK": "1"}}

SHAPE = lambda *d: r"\[\s*" + r"\s*,\s*".join(str(x) for x in d) + r"\s*\]"

CASES = {
    "feature-dim": (
        "rank 2's text has d=24, the others d=16",
        case_feature_dim, "every-rank", [
            ("is a dloss error", r"dloss error"),
            ("names the offending rank (rank 2)", r"\brank 2\b"),
            ("names the argument (text)", r"\btext\b"),
            ("gives rank 2's shape [4, 24]", SHAPE(ROWS, 24)),
            ("gives the others' shape [4, 16]", SHAPE(ROWS, DIM)),
            ("says what may differ (only the batch dimension)",
             r"(?i)(batch|dimension 0|dim 0)"),
        ]),
    "dtype": (
        "rank 1's image is float64",
        case_dtype, "every-rank", [
            ("is a dloss error", r"dloss error"),
            ("names the offending rank (rank 1)", r"\brank 1\b"),
            ("names the argument (image)", r"\bimage\b"),
            ("gives the dtype passed (f64)", r"(?i)\b(f64|float64|double)\b"),
            ("gives the dtype expected (f32)", r"(?i)\b(f32|float32|float)\b"),
            ("says what to do", r"(?i)\b(pass|cast|convert|use|save)\b"),
        ]),
    "rank": (
        "rank 3's text is 1-D [16]",
        case_rank, "every-rank", [
            ("is a dloss error", r"dloss error"),
            ("names the offending rank (rank 3)", r"\brank 3\b"),
            ("names the argument (text)", r"\btext\b"),
            ("gives what was passed (1-D, [16])",
             r"(?i)(\b1 dims?\b|\b1-d\b|" + SHAPE(DIM) + ")"),
            ("gives what is expected (2-D)",
             r"(?i)(\[\s*\?\s*,\s*\?\s*\]|\b2 dims\b|\b2-d\b)"),
            ("says what to do", r"(?i)\b(pass|reshape|use|save)\b"),
        ]),
    "missing-input": (
        "no --input for text",
        case_missing_input, "launcher-or-every-rank", [
            ("is a dloss error", r"dloss"),
            ("names the argument (text)", r"\btext\b"),
            ("says what to do (--input text=...)", r"--input text="),
        ]),
    "unknown-input": (
        "--input txt=... (no such argument), text missing",
        case_unknown_input, "launcher-or-every-rank", [
            ("is a dloss error", r"dloss"),
            ("names the wrong name (txt)", r"\btxt\b"),
            ("lists the real argument image", r"\bimage\b"),
            ("lists the real argument text", r"\btext\b"),
            ("lists the real argument scale", r"\bscale\b"),
        ]),
    "unreadable-npy": (
        "rank 3's text file does not exist (beyond the brief)",
        case_unreadable_npy, "every-rank", [
            ("is a dloss error", r"dloss error"),
            ("names the offending rank (rank 3)", r"\brank 3\b"),
            ("names the file (text3.npy)", r"text3\.npy"),
            ("says what is wrong", r"(?i)(no such file|cannot open|not found|does not exist)"),
        ]),
    "nan-check": (
        "rank 2's text holds 3 NaN values, DLOSS_CHECK=1",
        case_nan_check, "every-rank", [
            ("is a dloss error", r"dloss error"),
            ("names the offending rank, argument and count",
             r"\brank 2 passed argument 1 \(text\) with 3 NaN values\b"),
            ("says what to do", r"DLOSS_CHECK=1"),
        ]),
}

RANK_LINE = re.compile(r"^dloss-run: rank (\d+): (.*)$")


def run(dloss_run, mlir, inputs, out, env=None):
    cmd = [dloss_run, mlir, "--world", str(WORLD), "--timeout", str(TIMEOUT_ARG),
           "--out", os.path.join(out, "run")]
    for i in inputs:
        cmd += ["--input", i]
    print("+", " ".join(cmd), flush=True)
    start = time.monotonic()
    # Own session: the ranks are the launcher's children; we can then check
    # that none outlives the launcher, and kill them all if it hangs.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, cwd=out,
                            env=dict(os.environ, **(env or {})))
    hung = False
    try:
        stdout, stderr = proc.communicate(timeout=HARD_KILL)
    except subprocess.TimeoutExpired:
        hung = True
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
    wall = time.monotonic() - start
    leftovers = False
    try:
        os.killpg(proc.pid, 0)
        leftovers = True
        time.sleep(1.0)  # give exiting ranks a moment, then check again
        try:
            os.killpg(proc.pid, 0)
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            leftovers = False
    except ProcessLookupError:
        pass
    return proc.returncode, stdout, stderr, wall, hung, leftovers


def check_case(name, dloss_run, mlir, out):
    description, make, mode, message_checks = CASES[name]
    print(f"== case {name}: {description}")
    case_out = os.path.join(out, name)
    os.makedirs(case_out, exist_ok=True)
    rng = np.random.default_rng(0)
    inputs = make(case_out, rng)
    rc, stdout, stderr, wall, hung, leftovers = run(dloss_run, mlir, inputs, case_out,
                                                    CASE_ENV.get(name))
    print(f"   time-to-error: {wall:.2f} s (the whole run)")
    sys.stdout.write("-- stderr --\n" + stderr + ("" if stderr.endswith("\n") else "\n"))
    failures = []

    def expect(ok, what):
        print(f"   [{'ok' if ok else 'FAIL'}] {what}")
        if not ok:
            failures.append(what)

    expect(not hung, f"the launcher ended by itself (killed by the test after {HARD_KILL} s)")
    expect(rc not in (0, None), f"the launcher exits non-zero (exit {rc})")
    expect(wall < WALL_LIMIT, f"the run ends within {WALL_LIMIT:.0f} s ({wall:.1f} s)")
    expect(wall < TIMEOUT_ARG,
           f"the run does not wait out the {TIMEOUT_ARG} s deadline ({wall:.1f} s)")
    expect(not leftovers, "no rank process outlives the launcher")
    expect("did not stop" not in stderr and "killed by signal" not in stderr,
           "no rank had to be killed")

    lines = stderr.splitlines()
    garbled = [l for l in lines if l.count("dloss-run: rank") > 1 or
               (l.startswith("dloss-run: rank") and not RANK_LINE.match(l)
                and "did not stop" not in l and "killed by signal" not in l)]
    expect(not garbled, "every rank's message is one whole line (no interleaved writes)"
           + (f"; garbled: {garbled!r}" if garbled else ""))

    per_rank = {}
    for l in lines:
        m = RANK_LINE.match(l)
        if m:
            per_rank.setdefault(int(m.group(1)), []).append(m.group(2))

    messages = []
    if mode == "launcher-or-every-rank" and not per_rank:
        # Refused before any rank started: one launcher message.
        launcher = [l for l in lines if l.startswith("dloss-run:")]
        expect(bool(launcher), "the launcher prints an error before starting the ranks")
        messages = [" ".join(launcher)]
        print("   (refused by the launcher before any rank started)")
    else:
        expect(sorted(per_rank) == list(range(WORLD)),
               f"every rank 0..{WORLD - 1} reports an error (got ranks {sorted(per_rank)})")
        expect(all(len(v) == 1 for v in per_rank.values()),
               "each rank reports exactly one error line")
        distinct = {m for v in per_rank.values() for m in v}
        expect(len(distinct) == 1,
               f"all ranks report the same message ({len(distinct)} distinct)"
               + ("" if len(distinct) <= 1 else ":\n      " + "\n      ".join(sorted(distinct))))
        messages = sorted(distinct)

    for what, pattern in message_checks:
        ok = bool(messages) and all(re.search(pattern, m) for m in messages)
        expect(ok, f"the message {what}")
    print(f"== case {name}: {'PASS' if not failures else 'FAIL'}", flush=True)
    return not failures


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("dloss_run")
    parser.add_argument("mlir")
    parser.add_argument("--case", choices=sorted(CASES), action="append")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    out = args.out or tempfile.mkdtemp(prefix="dloss-bad-calls-")
    os.makedirs(out, exist_ok=True)
    dloss_run = os.path.abspath(args.dloss_run)
    mlir = os.path.abspath(args.mlir)
    results = {c: check_case(c, dloss_run, mlir, out) for c in (args.case or list(CASES))}
    print("bad_calls.py: " + ", ".join(f"{c} {'PASS' if ok else 'FAIL'}"
                                        for c, ok in results.items()))
    sys.exit(0 if all(results.values()) else 1)


if __name__ == "__main__":
    main()
