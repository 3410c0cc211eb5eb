"""An installed dloss compiles a loss written in plain PyTorch (@dloss.loss)
on this machine, with the compiler library of the dloss-compiler wheel: an
empty plan cache, so nothing is found there. One process (a Gloo group of
one); the loss and gradients against eager torch. Run from a folder outside
the source tree with DLOSS_CACHE_DIR set to an empty folder. Prints PASS."""
import glob
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F


def main():
    import dloss
    import dloss_compiler

    cache = os.environ["DLOSS_CACHE_DIR"]
    if glob.glob(os.path.join(cache, "*.plan")):
        sys.exit(f"FAIL: the plan cache {cache} is not empty: nothing would be compiled")
    print("compiler library:", os.path.realpath(dloss_compiler.LIBRARY))
    if dloss_compiler.identity() != dloss._C.compiler_identity:
        sys.exit("FAIL: the dloss-compiler wheel's identity is not dloss's")

    @dloss.loss
    def infonce(query, key, scale):
        key_all = dloss.all_gather(key)
        labels = torch.arange(query.shape[0]) + dloss.shard_offset(query)
        return F.cross_entropy(query @ key_all.T * scale, labels)

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    g = torch.Generator().manual_seed(0)
    query = F.normalize(torch.randn(6, 8, generator=g), dim=1)
    key = F.normalize(torch.randn(6, 8, generator=g), dim=1)
    scale = torch.tensor(7.0)
    got = [x.clone().requires_grad_() for x in (query, key, scale)]
    want = [x.clone().requires_grad_() for x in (query, key, scale)]
    loss = infonce(*got)
    loss.backward()
    ref = F.cross_entropy(want[0] @ want[1].T * want[2], torch.arange(6))
    ref.backward()
    dist.destroy_process_group()

    errors = [float((loss.detach() - ref.detach()).abs() / ref.detach().abs())]
    errors += [float((a.grad - b.grad).abs().max() / b.grad.abs().max())
               for a, b in zip(got, want)]
    print("@dloss.loss InfoNCE: relative errors", ", ".join(f"{e:.3g}" for e in errors))
    plans = glob.glob(os.path.join(cache, "*.plan"))
    print(f"plans compiled into {cache}: {len(plans)}")
    if not plans:
        sys.exit("FAIL: no plan was compiled into the cache")
    if max(errors) > 1e-5:
        sys.exit("FAIL: the compiled loss differs from eager torch")
    print("PASS")


if __name__ == "__main__":
    main()
