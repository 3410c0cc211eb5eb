"""`import dloss` from an installed prefix: CLIP (dloss.ClipLoss, or dloss._C
where the Python layer lacks it) on a one-rank gloo group, checked against
eager torch. Usage: check_python.py PREFIX"""
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F


def main(prefix):
    import dloss
    from dloss import _C

    prefix = os.path.realpath(prefix)
    for module in (dloss, _C):
        where = os.path.realpath(module.__file__)
        if not where.startswith(prefix + os.sep):
            sys.exit(f"FAIL: {module.__name__} imported from {where}, "
                     f"not from the prefix {prefix}")

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0,
                            world_size=1)
    if hasattr(dloss, "ClipLoss"):
        # The public API, on the default group.
        loss = dloss.ClipLoss()
        call = lambda image, text, scale: loss(image, text, scale)
        print("through dloss.ClipLoss")
    else:
        group = dist.group.WORLD
        store = dist.distributed_c10d._pg_map[group][1]
        comm = _C.process_group_communicator(group, store, 30.0)
        graph = _C.clip_graph()
        plan = _C.compile_plan(graph.to_mlir(), "", graph.name, True)
        compiled = _C.CompiledLoss(plan, comm, "clip")
        call = lambda image, text, scale: compiled([image, text, scale])
        print("through dloss._C")

    torch.manual_seed(0)
    image = F.normalize(torch.randn(8, 4), dim=1).requires_grad_()
    text = F.normalize(torch.randn(8, 4), dim=1).requires_grad_()
    scale = torch.tensor(10.0).requires_grad_()
    value = call(image, text, scale)
    value.backward()

    i2, t2, s2 = (x.detach().clone().requires_grad_()
                  for x in (image, text, scale))
    logits = s2 * i2 @ t2.t()
    labels = torch.arange(8)
    want = (F.cross_entropy(logits, labels) +
            F.cross_entropy(logits.t(), labels)) / 2
    want.backward()

    ok = True
    for what, got, ref in (("loss", value.detach(), want.detach()),
                           ("d image", image.grad, i2.grad),
                           ("d text", text.grad, t2.grad),
                           ("d scale", scale.grad, s2.grad)):
        if got is None:
            print(f"{what}: missing")
            ok = False
            continue
        error = ((got - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
        print(f"{what}: relative error {error:.3g}")
        ok = ok and error < 1e-5
    dist.destroy_process_group()
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
