"""dloss.guard's cost on CPU ranks (Gloo on loopback, one thread each),
guarded and unguarded in the same run, alternating, as the ratio guarded /
unguarded:

- per step at --ranks (4): a DDP training step (a small MLP with
  dloss.ClipLoss, DDP's gradient all-reduce in 1 bucket or several) and an
  FSDP2 step (the same MLP, each Linear and the root under fully_shard: its
  all-gathers and reduce-scatters). Target: at most 1.05x each;
- per collective (an all_reduce of one float) at each of --worlds: the
  guard's added cost must grow no faster than the collective's own (the
  last column: added / unguarded, flat or falling), not linearly in the
  world size.

The numbers go to docs/Lightning.md.

    python bench/guard_bench.py [--ranks 4] [--steps 40] [--collectives 400]
                                [--worlds 2,4,8,16,32] [--only-collectives]
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _rank(rank, world, port, args, queue, only_collectives):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    import dloss
    dloss.init(backend="gloo")
    torch.manual_seed(0)

    def collectives():
        t = torch.ones(1)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(args.collectives):
            dist.all_reduce(t)
        return (time.perf_counter() - start) / args.collectives

    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(),
                                torch.nn.Linear(256, 64))
    loss_fn = dloss.ClipLoss()
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(128, 64, generator=g)
    y = torch.randn(128, 64, generator=g)
    scale = torch.tensor(10.0)

    def timed(wrapped):
        """Seconds per training step of `wrapped` (DDP or FSDP2)."""
        opt = torch.optim.SGD(wrapped.parameters(), lr=0.01)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(args.steps):
            opt.zero_grad()
            loss_fn(wrapped(x), y, scale).backward()
            opt.step()
        return (time.perf_counter() - start) / args.steps

    def steps(bucket_cap_mb):
        ddp = torch.nn.parallel.DistributedDataParallel(
            model, bucket_cap_mb=bucket_cap_mb)
        return timed(ddp)

    def fsdp_steps():
        import copy

        from torch.distributed.fsdp import fully_shard
        sharded = copy.deepcopy(model)
        fully_shard(sharded[0])
        fully_shard(sharded[2])
        fully_shard(sharded)
        return timed(sharded)

    out = {}
    for repeat in range(2):
        for guarded in (False, True):
            guard = dloss.guard(timeout=60) if guarded else None
            key = "guarded" if guarded else "plain"
            out.setdefault(("collective", key), []).append(collectives())
            if not only_collectives:
                out.setdefault(("step, 1 bucket", key), []).append(steps(25))
                out.setdefault(("step, 4 buckets", key), []).append(
                    steps(0.02))
                out.setdefault(("FSDP2 step", key), []).append(fsdp_steps())
            if guard is not None:
                guard.close()
    queue.put((rank, out))
    dist.barrier()


def _run(world, args, only_collectives):
    """Rank 0's figures of one run of `world` ranks (every rank waits for
    the slowest)."""
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, world, port, args, queue,
                                             only_collectives))
             for r in range(world)]
    for p in procs:
        p.start()
    results = {}
    try:
        while len(results) < world:
            try:
                rank, out = queue.get(timeout=1)
                results[rank] = out
            except Exception:  # queue.Empty: is a rank dead?
                failed = [p for p in procs if p.exitcode not in (None, 0)]
                if failed:
                    raise SystemExit("guard_bench: a rank failed (exit code "
                                     "%s); see its output above" %
                                     failed[0].exitcode)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return results[0]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--collectives", type=int, default=400)
    parser.add_argument("--worlds", default="2,4,8,16,32")
    parser.add_argument("--only-collectives", action="store_true",
                        help="the per-collective sweep alone")
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = "1"
    if not args.only_collectives:
        _steps_table(args)
    _sweep_table(args)


def _steps_table(args):
    out = _run(args.ranks, args, False)
    print("%d ranks, best of 2 alternating runs" % args.ranks)
    print("| figure | unguarded (ms) | guarded (ms) | added (ms) | ratio |")
    print("|---|---:|---:|---:|---:|")
    for name in ("collective", "step, 1 bucket", "step, 4 buckets",
                 "FSDP2 step"):
        plain = min(out[(name, "plain")]) * 1e3
        guarded = min(out[(name, "guarded")]) * 1e3
        print("| %s | %.3f | %.3f | %.3f | %.2f |" %
              (name, plain, guarded, guarded - plain, guarded / plain),
              flush=True)
    print()


def _sweep_table(args):
    print("per collective (all_reduce of one float), best of 2")
    print("| ranks | unguarded (ms) | guarded (ms) | added (ms) | "
          "added / unguarded |")
    print("|---:|---:|---:|---:|---:|")
    for world in (int(w) for w in args.worlds.split(",") if w):
        # Fewer collectives as the world grows: each takes longer.
        sweep = argparse.Namespace(**vars(args))
        sweep.collectives = max(40, args.collectives * 4 // world)
        out = _run(world, sweep, True)
        plain = min(out[("collective", "plain")]) * 1e3
        guarded = min(out[("collective", "guarded")]) * 1e3
        print("| %d | %.3f | %.3f | %.3f | %.2f |" %
              (world, plain, guarded, guarded - plain,
               (guarded - plain) / plain), flush=True)


if __name__ == "__main__":
    sys.exit(main())
