"""Runs a module as ``__main__`` (``python cpu_ddp.py MODULE ARGS...``) with
torch's DistributedDataParallel taking a CPU device in ``device_ids`` as no
device_ids: OpenCLIP's trainer passes ``device_ids=[cpu]`` on a CPU run,
which torch 2.14 refuses. That is OpenCLIP's bug; the trainer test works
around it here, outside dloss.open_clip_train, so that the module under test
runs exactly as on GPUs. docs/Migration.md ("OpenCLIP's trainer") says so."""

import runpy
import sys

import torch

_DDP = torch.nn.parallel.DistributedDataParallel


class CpuDeviceIdsDDP(_DDP):
    """DDP, with ``device_ids`` of CPU devices dropped (as torch wants)."""

    def __init__(self, module, device_ids=None, *args, **kwargs):
        if device_ids and all(torch.device(d).type == "cpu"
                              for d in device_ids):
            device_ids = None
        super().__init__(module, device_ids, *args, **kwargs)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: cpu_ddp.py MODULE [ARGS...]")
    torch.nn.parallel.DistributedDataParallel = CpuDeviceIdsDDP
    module = sys.argv[1]
    sys.argv = [module] + sys.argv[2:]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
