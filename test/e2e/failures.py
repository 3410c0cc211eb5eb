#!/usr/bin/env python3
"""dloss-run when processes die: a rank killed mid-run, the launcher stopped or killed.

Runs `dloss-run examples/clip.mlir --world 4 --timeout 20 --iters 1000000`
(small inputs: the ranks are busy in collectives all the time) and, once the
ranks run, does one of:

  rank-killed        SIGKILL rank 2. The survivors must fail fast (closed
                     connections, well before the 20 s deadline), each with one
                     line naming the failed collective and rank 2 and giving its
                     flight record; the launcher exits non-zero and leaves no
                     process behind.
  launcher-stopped   SIGTERM the launcher: it stops every rank and exits 143.
  launcher-killed    SIGKILL the launcher: the ranks die with it (no orphans).

Every case prints `time-to-error: X s` (from the signal to the end of the run).

usage: failures.py DLOSS_RUN CLIP.mlir --case NAME [--out DIR]
Exit 0 when the case passes, 1 when it fails, 77 without numpy.
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

WORLD = 4
TIMEOUT_ARG = 20     # --timeout given to dloss-run
FAST_LIMIT = 10.0    # a peer's death must be reported well before the deadline
STARTUP_LIMIT = 60.0 # the ranks must be up and running by then
HARD_KILL = 90

try:
    import numpy as np
except ImportError:  # pragma: no cover
    print("failures.py: numpy is missing; skipping")
    sys.exit(77)


def write_inputs(out):
    rng = np.random.default_rng(0)
    for r in range(WORLD):
        for name in ("image", "text"):
            x = rng.standard_normal((4, 16))
            x /= np.linalg.norm(x, axis=1, keepdims=True)
            np.save(os.path.join(out, f"{name}{r}.npy"), x.astype(np.float32))
    return [f"image={os.path.join(out, 'image')}{{rank}}.npy",
            f"text={os.path.join(out, 'text')}{{rank}}.npy",
            "scale=14.285714"]


def children_of(pid):
    """Pids whose parent is `pid` (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name may hold spaces: fields follow the last ')'.
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 1 and int(fields[1]) == pid:
            found.append(int(entry))
    return found


def rank_of(pid):
    """The rank of a process dloss-run forked: it names it dloss-rank<r>."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            m = re.fullmatch(r"dloss-rank(\d+)", f.read().strip())
    except OSError:
        return None
    return int(m.group(1)) if m else None


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("dloss_run")
    parser.add_argument("mlir")
    parser.add_argument("--case", required=True,
                        choices=["rank-killed", "launcher-stopped", "launcher-killed"])
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    out = os.path.abspath(args.out or tempfile.mkdtemp(prefix="dloss-failures-"))
    os.makedirs(out, exist_ok=True)
    run_out = os.path.join(out, "run")
    cmd = [os.path.abspath(args.dloss_run), os.path.abspath(args.mlir),
           "--world", str(WORLD), "--timeout", str(TIMEOUT_ARG),
           "--iters", "1000000", "--out", run_out]
    for i in write_inputs(out):
        cmd += ["--input", i]
    print("+", " ".join(cmd), flush=True)

    failures = []

    def expect(ok, what):
        print(f"   [{'ok' if ok else 'FAIL'}] {what}", flush=True)
        if not ok:
            failures.append(what)

    env = dict(os.environ)
    env.pop("DLOSS_FLIGHT_DIR", None)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, cwd=out, env=env)
    # stderr lines with the time they arrived, for each rank's time to error.
    arrivals = []
    warm = threading.Event()

    def read_stderr():
        for line in proc.stderr:
            arrivals.append((time.monotonic(), line.rstrip("\n")))

    def read_stdout():
        for line in proc.stdout:
            if line.startswith("dloss-run: warm-up call done"):
                warm.set()

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    threading.Thread(target=read_stdout, daemon=True).start()
    # The ranks are in the loss once rank 0 ends its warm-up call: it needs
    # every rank's data for that, so each is past the connection check. No
    # sleep or socket count can say that under load.
    start = time.monotonic()
    warm.wait(STARTUP_LIMIT)
    ranks = {rank_of(p): p for p in children_of(proc.pid)}
    ranks.pop(None, None)
    print(f"   ranks in the loss after {time.monotonic() - start:.1f} s", flush=True)
    running = warm.is_set() and proc.poll() is None and len(ranks) == WORLD
    expect(running, f"the {WORLD} ranks are running (pids {sorted(ranks.values())})")
    if not running:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        reader.join(5)
        sys.stdout.write("\n".join(line for _, line in arrivals) + "\n")
        sys.exit(1)

    t0 = time.monotonic()
    if args.case == "rank-killed":
        os.kill(ranks[2], signal.SIGKILL)
    elif args.case == "launcher-stopped":
        os.kill(proc.pid, signal.SIGTERM)
    else:
        os.kill(proc.pid, signal.SIGKILL)

    # When each rank process ended, so that a slow end names the rank that
    # lingered (a rank may end long after printing its error).
    ended = {}

    def watch_ranks():
        while len(ended) < len(ranks) and time.monotonic() - t0 < HARD_KILL:
            for r, p in ranks.items():
                if r not in ended and not alive(p):
                    ended[r] = time.monotonic() - t0
            time.sleep(0.02)

    watcher = threading.Thread(target=watch_ranks, daemon=True)
    watcher.start()
    hung = False
    try:
        proc.wait(timeout=HARD_KILL)
    except subprocess.TimeoutExpired:
        hung = True
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    launcher_wall = time.monotonic() - t0
    reader.join(5)
    stderr = "\n".join(line for _, line in arrivals) + "\n"
    for at, line in arrivals:
        m = re.match(r"^dloss-run: rank (\d+): ", line)
        if m and at >= t0:
            print(f"time-to-error rank {m.group(1)}: {at - t0:.2f} s")
    # The ranks must be gone too (the launcher may be gone first).
    while any(alive(p) for p in ranks.values()) and time.monotonic() - t0 < HARD_KILL:
        time.sleep(0.05)
    wall = time.monotonic() - t0
    watcher.join(1)
    for r in sorted(ended):
        print(f"rank {r} process ended after {ended[r]:.2f} s")
    # A failed rank's teardown is bounded (RankRunner.cpp); when the bound
    # ended one, say so: the run passes, but its teardown waited on something.
    for _, line in arrivals:
        if "after its failure took over" in line:
            print("note: " + line)
    leftovers = [p for p in ranks.values() if alive(p)]
    for p in leftovers:
        os.kill(p, signal.SIGKILL)
    sys.stdout.write("-- stderr --\n" + stderr + ("" if stderr.endswith("\n") else "\n"))
    print(f"time-to-error: {wall:.2f} s (launcher exit after {launcher_wall:.2f} s)")

    expect(not hung, "the launcher ended by itself")
    expect(not leftovers, f"no rank process outlives the run (left: {leftovers})")
    expect(wall < FAST_LIMIT,
           f"everything ended {wall:.1f} s after the signal, well before the "
           f"{TIMEOUT_ARG} s deadline")

    if args.case == "launcher-killed":
        expect(proc.returncode == -signal.SIGKILL, f"the launcher was killed ({proc.returncode})")
    elif args.case == "launcher-stopped":
        expect(proc.returncode == 128 + signal.SIGTERM,
               f"the launcher exits 143 (exit {proc.returncode})")
        expect("stopping the ranks" in stderr, "the launcher says it stops the ranks")
    else:
        expect(proc.returncode not in (0, None), f"the launcher exits non-zero ({proc.returncode})")
        expect("rank 2 was killed by signal 9" in stderr,
               "the launcher reports that rank 2 was killed")
        lines = {}
        for line in stderr.splitlines():
            m = re.match(r"^dloss-run: rank (\d+): (.*)$", line)
            if m:
                lines.setdefault(int(m.group(1)), []).append(m.group(2))
        survivors = [r for r in range(WORLD) if r != 2]
        expect(sorted(lines) == survivors,
               f"each survivor {survivors} reports an error (got {sorted(lines)})")
        for r in survivors:
            message = " ".join(lines.get(r, []))
            expect(len(lines.get(r, [])) == 1, f"rank {r} reports one line")
            # In a plan step, or in the call's preflight (no step yet), or in
            # the line-up before a timed call (CallTiming.h): rank 2 may die
            # after its call's last collective and before the next line-up.
            in_step = re.search(r"collective #\d+ \w+ \(in @clip_grad\) failed on rank "
                                f"{r} of {WORLD}", message)
            in_preflight = re.search(r"collective #\d+ allGatherInts \((preflight|line-up "
                                     r"before timing) of "
                                     rf"@clip_grad\) failed on rank {r} of {WORLD}", message)
            expect(in_step or in_preflight,
                   f"rank {r} names the collective, its number and the function")
            if in_step:
                expect(re.search(r"\[rank \d+, op dloss\.\w+ at [^\]]*clip\.mlir:\d+:\d+\]",
                                 message) is not None,
                       f"rank {r} names the op and its IR location")
            expect(re.search(r"rank 2 (never arrived|reached it)[^;]*(may have died|it died)",
                             message) is not None,
                   f"rank {r} names rank 2 as the rank that went silent")
            record = os.path.join(run_out, f"rank{r}", f"dloss-flight-rank{r}.json")
            expect(record in message, f"rank {r} gives its flight record {record}")
            ok = False
            try:
                with open(record) as f:
                    text = f.read()
                ok = '"state": "failed"' in text and '"op": "dloss.' in text
            except OSError:
                pass
            expect(ok, f"rank {r}'s flight record holds the failed collective")

    print(f"failures.py {args.case}: {'PASS' if not failures else 'FAIL'}")
    sys.exit(0 if not failures else 1)


if __name__ == "__main__":
    main()
