#!/usr/bin/env python3
"""Starts a training script on N local processes, as torchrun does.

    python3 launch.py --nproc 4 train_clip.py [ARGS...]

does what ``torchrun --nproc_per_node 4 train_clip.py [ARGS...]`` does for
a CPU job on one machine (use torchrun itself where it works; Debian's
crashes): every process gets MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE and
LOCAL_RANK, which ``dloss.init()`` (or ``torch.distributed.init_process_group
("gloo")``) reads, and OMP_NUM_THREADS=1 so that the ranks do not fight over
the cores. Like torchrun's agent, the launcher hosts the rendezvous store on a
port the kernel picks and tells the ranks so (TORCHELASTIC_USE_AGENT_STORE):
the port is never free between being chosen and being used, so launches
started at once never meet. If one rank fails, the others are stopped (they would otherwise
wait for it until their collectives time out) and the launcher exits
non-zero.
"""

import argparse
import os
import subprocess
import sys
import time
from datetime import timedelta

import torch.distributed as dist


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nproc", type=int, default=4,
                        help="number of ranks (processes)")
    parser.add_argument("script", help="the training script")
    parser.add_argument("args", nargs=argparse.REMAINDER,
                        help="the script's arguments")
    args = parser.parse_args()

    # Up until the launcher exits; the ranks' own deadlines bound their waits.
    store = dist.TCPStore("127.0.0.1", 0, args.nproc, True,
                          timedelta(seconds=300), wait_for_workers=False)
    procs = []
    for rank in range(args.nproc):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(store.port), RANK=str(rank),
                   WORLD_SIZE=str(args.nproc), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(args.nproc), OMP_NUM_THREADS="1",
                   TORCHELASTIC_USE_AGENT_STORE="True",
                   TORCHELASTIC_RESTART_COUNT="0")
        procs.append(subprocess.Popen(
            [sys.executable, args.script] + args.args, env=env))

    while all(p.poll() in (None, 0) for p in procs):
        if all(p.returncode == 0 for p in procs):
            sys.exit(0)
        time.sleep(0.05)
    time.sleep(2)  # A rank failed: let its peers report, then stop them.
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        p.wait()
    failed = ["rank %d (%s)" % (r, "stopped" if p.returncode < 0 else
                                "exit status %d" % p.returncode)
              for r, p in enumerate(procs) if p.returncode != 0]
    print("launch.py: failed: " + ", ".join(failed), file=sys.stderr)
    status = max(p.returncode for p in procs)
    sys.exit(status if status > 0 else 1)


if __name__ == "__main__":
    main()
