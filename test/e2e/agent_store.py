#!/usr/bin/env python3
"""dloss-run's ranks under a launcher that hosts the rendezvous store, as
torchrun's agent does with its default (static) rendezvous: the agent's
TCPStore listens on MASTER_PORT and every rank gets
TORCHELASTIC_USE_AGENT_STORE=True and TORCHELASTIC_RESTART_COUNT.

Hosts a c10d TCPStore here (torch's own, as the agent would), then starts
2 dloss-run ranks (no --world: each reads RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT) running examples/clip.mlir:

  attempt 0        every rank is a client; the run succeeds and both ranks
                   report the loss of `dloss-run --world 2` on the same inputs
  attempt 1        a restart on the same store succeeds (dloss's keys of
                   attempt 0 are under their own prefix)
  no agent flag    the same store without TORCHELASTIC_USE_AGENT_STORE: rank 0
                   cannot host a second store on the port and says which
                   variable is missing; rank 1 fails at its deadline; nobody
                   hangs

usage: agent_store.py DLOSS_RUN CLIP.mlir OUT_DIR
Exit 0 when every case passes, 1 when one fails, 77 without torch.
"""
import json
import os
import subprocess
import sys
from datetime import timedelta

import numpy as np

try:
    import torch.distributed as dist
except ImportError:  # pragma: no cover
    print("agent_store.py: torch is missing; skipping")
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "examples"))
import run_example  # noqa: E402

WORLD = 2


def run_ranks(dloss_run, example, inputs, out, env_extra, timeout_s):
    """Starts the ranks; returns [(exit status, output)] per rank."""
    procs = []
    for rank in range(WORLD):
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("TORCHELASTIC_")}
        env.update(MASTER_ADDR="127.0.0.1", RANK=str(rank),
                   WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(WORLD), OMP_NUM_THREADS="1",
                   **env_extra)
        cmd = [dloss_run, example, "--iters", "1", "--timeout",
               str(timeout_s), "--out", out]
        for i in inputs:
            cmd += ["--input", i]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    results = []
    for p in procs:
        try:
            output, _ = p.communicate(timeout=timeout_s + 60)
        except subprocess.TimeoutExpired:
            p.kill()
            output, _ = p.communicate()
            output += "\n(killed: still running %d s past its deadline)" % 60
        results.append((p.returncode, output))
    return results


def losses(out):
    found = []
    for r in range(WORLD):
        with open(os.path.join(out, "rank%d" % r, "result.json")) as f:
            found.append(json.load(f)["loss"])
    return found


def main():
    dloss_run, example, out = sys.argv[1:4]
    os.makedirs(out, exist_ok=True)
    inputs = run_example.make_inputs(example, [3, 2], 8, out,
                                     np.random.default_rng(0))
    reference_out = os.path.join(out, "world")
    cmd = [dloss_run, example, "--world", str(WORLD), "--iters", "1",
           "--out", reference_out]
    for i in inputs:
        cmd += ["--input", i]
    subprocess.run(cmd, check=True, capture_output=True, timeout=240)
    reference = losses(reference_out)

    store = dist.TCPStore("127.0.0.1", 0, WORLD, True, timedelta(seconds=120),
                          wait_for_workers=False)
    port = str(store.port)
    failed = False

    def report(name, ok, detail=""):
        nonlocal failed
        failed |= not ok
        print("%s: %s%s" % (name, "PASS" if ok else "FAIL",
                            "" if ok else "\n" + detail))

    for attempt in (0, 1):
        case_out = os.path.join(out, "attempt%d" % attempt)
        results = run_ranks(dloss_run, example, inputs, case_out,
                            dict(MASTER_PORT=port,
                                 TORCHELASTIC_USE_AGENT_STORE="True",
                                 TORCHELASTIC_RESTART_COUNT=str(attempt)),
                            timeout_s=60)
        ok = all(code == 0 for code, _ in results)
        detail = "\n".join("rank %d (exit %s):\n%s" % (r, code, text)
                           for r, (code, text) in enumerate(results))
        if ok:
            got = losses(case_out)
            ok = got == reference
            detail = "losses %s, --world %d gave %s" % (got, WORLD, reference)
        report("attempt %d on the launcher's store" % attempt, ok, detail)

    results = run_ranks(dloss_run, example, inputs,
                        os.path.join(out, "no-flag"),
                        dict(MASTER_PORT=port), timeout_s=4)
    (code0, text0), (code1, text1) = results
    ok = (code0 != 0 and code1 != 0 and
          "could not host the rendezvous store" in text0 and
          "TORCHELASTIC_USE_AGENT_STORE=True" in text0 and
          "rank 0 never joined" in text1)
    report("the launcher's store without TORCHELASTIC_USE_AGENT_STORE", ok,
           "rank 0 (exit %s):\n%s\nrank 1 (exit %s):\n%s" %
           (code0, text0, code1, text1))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
