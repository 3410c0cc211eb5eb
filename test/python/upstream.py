"""The real packages the drop-ins replace, as the tests import them: OpenCLIP's
loss module, pytorch-metric-learning and torchmetrics, at the versions
test/requirements*.txt pins (scripts/setup.sh installs them).

OpenCLIP's package import pulls in torchvision, which pairs only with the
torch it was built for; beside the CPU torch 2.13.0 there is none. Where
`import open_clip` fails, open_clip/loss.py (it imports only torch) is loaded
from the installed package by path: the same file, the same classes.

A missing package fails the test that needs it, naming the fix: a skip would
let a drop-in drift from its original unnoticed."""

import importlib
import importlib.metadata
import importlib.util
import os
import pathlib

_ROOT = pathlib.Path(__file__).resolve().parents[2]


def _pins():
    pins = {}
    for name in ("requirements.txt", "requirements-no-deps.txt"):
        for line in (_ROOT / "test" / name).read_text().splitlines():
            line = line.split("#")[0].strip()
            if line:
                package, version = line.split("==")
                pins[package] = version
    return pins


PINS = _pins()


def _missing(package, why):
    return ImportError(
        "the test compares dloss with the real %s %s, which %s; run "
        "`bash scripts/setup.sh` (it installs test/requirements*.txt)" %
        (package, PINS[package], why))


def _check_version(package):
    try:
        version = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        raise _missing(package, "is not installed") from None
    if version != PINS[package]:
        raise _missing(package, "is not the installed version (%s)" % version)


# How open_clip's loss module was imported: "package" or "by path".
OPEN_CLIP_IMPORT = None


def open_clip_loss():
    """OpenCLIP's open_clip.loss module (ClipLoss, SigLipLoss,
    DistillClipLoss, CoCaLoss, gather_features, the neighbour exchanges)."""
    global OPEN_CLIP_IMPORT
    _check_version("open_clip_torch")
    try:
        module = importlib.import_module("open_clip.loss")
        OPEN_CLIP_IMPORT = "package"
        return module
    except ImportError:
        pass  # torchvision does not import beside this torch: by path.
    spec = importlib.util.find_spec("open_clip")
    if spec is None or not spec.submodule_search_locations:
        raise _missing("open_clip_torch", "cannot be found")
    path = os.path.join(list(spec.submodule_search_locations)[0], "loss.py")
    loss_spec = importlib.util.spec_from_file_location("open_clip_loss", path)
    module = importlib.util.module_from_spec(loss_spec)
    loss_spec.loader.exec_module(module)
    OPEN_CLIP_IMPORT = "by path (%s)" % path
    return module


def pml():
    """pytorch_metric_learning (its losses, distances, reducers, utils)."""
    _check_version("pytorch-metric-learning")
    import pytorch_metric_learning.losses  # noqa: F401
    import pytorch_metric_learning.utils.distributed  # noqa: F401
    import pytorch_metric_learning
    return pytorch_metric_learning


def torchmetrics():
    """torchmetrics (Metric, utilities.distributed.gather_all_tensors)."""
    _check_version("torchmetrics")
    import torchmetrics
    import torchmetrics.utilities.distributed  # noqa: F401
    return torchmetrics
