"""An installed wheel on 2 real Gloo ranks: dloss.ClipLoss with uneven batches
(3 and 5 rows), every rank's loss and gradients against one process on the
concatenated global batch (ddp contract: rank r gets N * dF/dx_r). Run from
a folder outside the source tree. Prints PASS. Usage: check_wheel.py"""
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

SIZES = [3, 5]
DIM = 4


def data():
    g = torch.Generator().manual_seed(0)
    n = sum(SIZES)
    image = F.normalize(torch.randn(n, DIM, generator=g), dim=1)
    text = F.normalize(torch.randn(n, DIM, generator=g), dim=1)
    return image, text, torch.tensor(10.0)


def rank_main(rank, port, queue):
    import dloss
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=len(SIZES))
    image, text, scale = data()
    lo = sum(SIZES[:rank])
    mine = slice(lo, lo + SIZES[rank])
    i = image[mine].clone().requires_grad_()
    t = text[mine].clone().requires_grad_()
    s = scale.clone().requires_grad_()
    loss = dloss.ClipLoss()(i, t, s)
    loss.backward()
    # Plain values: a tensor would travel as a file descriptor that dies with
    # this process.
    queue.put((rank, loss.item(), i.grad.tolist(), t.grad.tolist(),
               s.grad.item(), os.path.realpath(dloss.__file__)))
    dist.destroy_process_group()


def main():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, port, queue))
             for r in range(len(SIZES))]
    for p in procs:
        p.start()
    results = sorted(queue.get(timeout=300) for _ in procs)
    for p in procs:
        p.join(60)
        if p.exitcode != 0:
            print(f"FAIL: a rank exited with {p.exitcode}")
            return 1
    print("dloss imported from", results[0][5])

    image, text, scale = (x.clone().requires_grad_() for x in data())
    logits = scale * image @ text.t()
    labels = torch.arange(sum(SIZES))
    want = (F.cross_entropy(logits, labels) +
            F.cross_entropy(logits.t(), labels)) / 2
    want.backward()

    n = len(SIZES)
    ok = True

    def check(what, got, ref):
        nonlocal ok
        error = float((got - ref).abs().max() /
                      ref.abs().max().clamp_min(1e-30))
        print(f"{what}: relative error {error:.3g}")
        ok = ok and error < 1e-5

    for rank, loss, gi, gt, gs, _ in results:
        lo = sum(SIZES[:rank])
        mine = slice(lo, lo + SIZES[rank])
        check(f"rank {rank} loss", torch.tensor(loss), want.detach())
        check(f"rank {rank} d image", torch.tensor(gi), n * image.grad[mine])
        check(f"rank {rank} d text", torch.tensor(gt), n * text.grad[mine])
    # ddp: each rank's share of N * dF/dscale; their mean is the gradient.
    check("mean d scale", torch.tensor(sum(r[4] for r in results) / n),
          scale.grad)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
