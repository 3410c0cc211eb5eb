"""Runs a function on N local ranks (processes, Gloo on loopback) for the
Python tests: torchrun's variables are set by hand (Debian's torchrun is
broken), each rank initialises torch.distributed with dloss.init(), runs
`fn(rank, world, *args)` and sends back what it returns (tensors included)
or the exception it raised (`outcome` turns a dloss.Error into its text). A
rank that neither returns nor raises within `timeout` seconds fails the run:
a test can never hang.
"""

import json
import os
import socket
import subprocess
import sys
import time
import traceback

import torch
import torch.multiprocessing as mp


_HELD_PORTS = []


def free_port():
    """A port for one job's store, held (bound, never listening) until this
    process exits: the kernel gives a bound port to no other bind(port 0),
    so jobs started at once never share one, and rank 0's store (which sets
    SO_REUSEADDR) can still listen on it."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    _HELD_PORTS.append(s)
    return s.getsockname()[1]


class RankFailure(Exception):
    """What a rank raised: its type name, message and traceback."""

    def __init__(self, rank, type_name, message, trace):
        super().__init__("rank %d raised %s: %s\n%s" %
                         (rank, type_name, message, trace))
        self.rank, self.type_name, self.message = rank, type_name, message


def _rank_main(fn, rank, world, port, args, queue, done, dloss_timeout,
               backend, environ, init):
    # The caller's environment as it is now (a test may have just set
    # DLOSS_GUARD), not the fork server's.
    os.environ.clear()
    os.environ.update(environ)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    start = time.monotonic()
    try:
        import dloss
        if init:
            dloss.init(backend=backend, timeout=dloss_timeout)
        else:
            dloss.set_timeout(dloss_timeout)
        result = fn(rank, world, *args)
        queue.put((rank, "ok", result, time.monotonic() - start))
    except BaseException as e:  # noqa: B902 - everything goes back
        dloss = sys.modules.get("dloss")
        is_dloss = dloss is not None and isinstance(e, getattr(
            dloss, "Error", ()))
        info = (type(e).__name__, str(e), traceback.format_exc(), is_dloss)
        queue.put((rank, "error", info, time.monotonic() - start))
    # The queue's feeder thread must deliver before os._exit.
    queue.close()
    queue.join_thread()
    # Rank 0 hosts the store: every rank stays until all have reported, so
    # that none loses the store while it still needs it.
    done.wait(timeout=600)
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: a group whose peer failed may wait for its
    # own timeout in its destructor.
    os._exit(0)


def run(world, fn, *args, timeout=120, dloss_timeout=60.0, backend="gloo",
        expect_errors=False, init=True):
    """Runs fn on `world` ranks. Returns a list of per-rank results, or,
    with expect_errors, a list of per-rank ("ok", result, seconds) or
    ("error", (type, message, trace, is_dloss_error), seconds). With
    init=False the ranks start with no group: fn calls dloss.init()."""
    # A fork server with torch imported once: a rank starts in about 0.06 s
    # of CPU, where a spawned one (a fresh interpreter importing torch) takes
    # 1.2 s. Each rank imports dloss itself (its import reads DLOSS_GUARD).
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch"])
    queue = ctx.Queue()
    done = ctx.Event()
    port = free_port()
    procs = [ctx.Process(target=_rank_main,
                         args=(fn, r, world, port, args, queue, done, dloss_timeout,
                               backend, dict(os.environ), init))
             for r in range(world)]
    for p in procs:
        p.start()
    results = {}
    deadline = time.monotonic() + timeout
    try:
        while len(results) < world:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                rank, status, value, seconds = queue.get(timeout=min(left, 1))
            except Exception:
                if all(not p.is_alive() for p in procs) and queue.empty():
                    break
                continue
            results[rank] = (status, value, seconds)
    finally:
        done.set()
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
    missing = [r for r in range(world) if r not in results]
    if missing:
        dead = [r for r in missing if procs[r].exitcode not in (None, 0)]
        raise AssertionError(
            "ranks %s neither returned nor raised within %d s%s" %
            (missing, timeout, " (ranks %s died: exit codes %s)" % (
                dead, [procs[r].exitcode for r in dead]) if dead else ""))
    ordered = [results[r] for r in range(world)]
    if expect_errors:
        return ordered
    for r, (status, value, _) in enumerate(ordered):
        if status == "error":
            raise RankFailure(r, value[0], value[1], value[2])
    return [value for _, value, _ in ordered]


def script_dir(text, prefix):
    """(directory, script path, out directory) of a fresh temporary
    directory holding `text` as train.py, for script ranks to report into
    out/rank<r>.json (`reports`)."""
    import tempfile
    directory = tempfile.mkdtemp(prefix=prefix)
    script = os.path.join(directory, "train.py")
    with open(script, "w") as f:
        f.write(text)
    out = os.path.join(directory, "out")
    os.mkdir(out)
    return directory, script, out


def finish(procs, start, limit):
    """({rank: exit code}, {rank: stderr}) of script ranks started as
    subprocesses (stderr piped) at `start`; a rank still running `limit`
    seconds after it is killed."""
    codes, stderr = {}, {}
    for r, p in enumerate(procs):
        try:
            _, stderr[r] = p.communicate(
                timeout=max(1, limit - (time.monotonic() - start)))
        except subprocess.TimeoutExpired:
            p.kill()
            _, stderr[r] = p.communicate()
        codes[r] = p.returncode
    return codes, stderr


def reports(out, world):
    """{rank: the JSON report a script rank left as out/rank<r>.json}."""
    found = {}
    for r in range(world):
        path = os.path.join(out, "rank%d.json" % r)
        if os.path.exists(path):
            with open(path) as f:
                found[r] = json.load(f)
    return found


def outcome(fn):
    """What a rank's call did: the text of the dloss.Error fn() raised, or
    None when it returned (any other exception propagates)."""
    import dloss
    try:
        fn()
        return None
    except dloss.Error as e:
        return str(e)


def line_of(path, marker):
    """The line of the test file `path` that holds `# marker`: a test names
    its own call sites by marker, never by number."""
    with open(path) as f:
        lines = [i + 1 for i, text in enumerate(f) if "# " + marker in text]
    assert len(lines) == 1, marker
    return lines[0]
