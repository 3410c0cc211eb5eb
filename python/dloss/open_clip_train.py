"""OpenCLIP's own trainer with dloss's losses: the command OpenCLIP's users
launch, with ``-m dloss.open_clip_train`` in place of ``-m
open_clip_train.main`` and the same arguments::

    torchrun --nproc_per_node 8 -m dloss.open_clip_train \\
        --train-data data.csv --model ViT-B-32 --batch-size 256 ...

Mechanism: ``open_clip_train.main`` is OpenCLIP's module, run unchanged,
except that the name ``create_loss`` it imported from ``open_clip`` is
replaced by `create_loss` below, which reads the same arguments and returns
the dloss drop-in for the loss OpenCLIP would have made: ``--distill``
DistillClipLoss, a CoCa model (``coca`` in ``--model``) CoCaLoss,
``--siglip`` SigLipLoss (every ``--loss-dist-impl``), else ClipLoss. Nothing
else of OpenCLIP's behaviour changes (its DDP setup, data, precision,
``--accum-freq``, ``--torchcompile``, checkpoints).

What changes in the logs: the logged ``Contrastive_loss`` (and the other
loss terms) is the loss of the global batch, the same on every rank, where
OpenCLIP logs rank 0's local loss; its gradients are exact whatever
``--local-loss`` and ``--gather-with-grad`` say. One run of one process
(``--nproc_per_node 1``, no process group) computes the loss of its batch,
as OpenCLIP does.

Limits: the tested open_clip_torch is `TESTED`. Another version runs only
where its ``create_loss`` reads the same arguments and makes the same
classes (checked at start: otherwise a dloss.Error names both versions).
Horovod is refused (dloss runs on torch.distributed).
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import inspect
import logging
import sys
import textwrap

from .errors import make_error

__all__ = ["TESTED", "create_loss", "main"]

# The open_clip_torch this module is tested with (test/requirements-open-clip-train.txt).
TESTED = "3.3.0"

# What open_clip.create_loss reads from the arguments and which classes it
# makes, in the tested version: another version is accepted when its
# create_loss reads and makes exactly these.
_ARGUMENTS = frozenset((
    "coca_caption_loss_weight", "coca_contrastive_loss_weight", "distill",
    "gather_with_grad", "horovod", "local_loss", "loss_dist_impl", "model",
    "rank", "siglip", "world_size"))
_CLASSES = frozenset(("ClipLoss", "CoCaLoss", "DistillClipLoss",
                      "SigLipLoss"))

# dloss's extra (pyproject.toml) installs open_clip_torch[training]==TESTED.
_INSTALL = ('pip install "dloss[open-clip-train]" (or "open_clip_torch'
            '[training]==%s", the version dloss is tested with)' % TESTED)


def _installed_version() -> str:
    try:
        return importlib.metadata.version("open_clip_torch")
    except importlib.metadata.PackageNotFoundError:
        return ""


def _what_create_loss_uses(create_loss) -> tuple[set, set]:
    """(the attributes of its argument it reads, the names it calls)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(create_loss)))
    function = tree.body[0]
    args = function.args.args[0].arg if function.args.args else None
    read, called = set(), set()
    for node in ast.walk(function):
        if isinstance(node, ast.Attribute) and \
                isinstance(node.value, ast.Name) and node.value.id == args:
            read.add(node.attr)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            called.add(node.func.id)
    return read, called


def _trainer():
    """OpenCLIP's ``open_clip_train.main`` module, checked against what
    `create_loss` knows."""
    version = _installed_version()
    try:
        trainer = importlib.import_module("open_clip_train.main")
    except ImportError as e:
        raise make_error(
            "dloss.open_clip_train runs OpenCLIP's trainer "
            "(open_clip_train.main), which %s: %s" % (
                "is not installed" if not version else
                "open_clip_torch %s could not import" % version, e),
            "Install it: %s" % _INSTALL) from None
    original = getattr(trainer, "create_loss", None)
    if original is create_loss:
        return trainer  # main() ran in this process already
    if not callable(getattr(trainer, "main", None)) or original is None:
        raise make_error(
            "open_clip_torch %s's open_clip_train.main has no %s; dloss "
            "replaces its create_loss and calls its main (tested with %s)" %
            (version or "(version unknown)", "main" if original else
             "create_loss", TESTED),
            "Install the tested version: %s" % _INSTALL)
    try:
        read, called = _what_create_loss_uses(original)
    except (OSError, TypeError, SyntaxError, IndexError):
        read, called = None, None
    if read != _ARGUMENTS or not _CLASSES <= called:
        differences = []
        if read is None:
            differences.append("its source cannot be read")
        else:
            new = sorted(read - _ARGUMENTS)
            gone = sorted(_ARGUMENTS - read)
            if new:
                differences.append("it also reads args." + ", args.".join(new))
            if gone:
                differences.append("it no longer reads args." +
                                   ", args.".join(gone))
            missing = sorted(_CLASSES - called)
            if missing:
                differences.append("it no longer makes " +
                                   ", ".join(missing))
        raise make_error(
            "open_clip_torch %s's create_loss differs from the tested %s's: "
            "%s" % (version or "(version unknown)", TESTED,
                    "; ".join(differences)),
            "Install the tested version: %s" % _INSTALL)
    return trainer


def create_loss(args):
    """The dloss loss for OpenCLIP's training arguments, chosen as
    ``open_clip.create_loss`` chooses (the same arguments, in the same
    order of precedence)."""
    import dloss

    if args.horovod:
        raise make_error(
            "dloss.open_clip_train runs on torch.distributed, not Horovod",
            "Drop --horovod and launch with torchrun")
    if args.distill:
        loss, original = dloss.DistillClipLoss(), "DistillClipLoss"
    elif "coca" in args.model.lower():
        loss = dloss.CoCaLoss(
            caption_loss_weight=args.coca_caption_loss_weight,
            clip_loss_weight=args.coca_contrastive_loss_weight)
        original = "CoCaLoss"
    elif args.siglip:
        loss = dloss.SigLipLoss(dist_impl=args.loss_dist_impl)
        original = "SigLipLoss"
    else:
        loss, original = dloss.ClipLoss(), "ClipLoss"
    if getattr(args, "rank", 0) == 0:
        logged = {"DistillClipLoss": "Contrastive_loss and Distill_loss are",
                  "CoCaLoss": "Contrastive_loss and Caption_loss are"}.get(
                      original, "Contrastive_loss is")
        logging.info(
            "dloss.open_clip_train: dloss.%s replaces open_clip.%s (exact "
            "gradients on %d rank(s), whatever --local-loss and "
            "--gather-with-grad say); the logged %s now the loss of the "
            "global batch, not rank 0's local one", type(loss).__name__,
            original, getattr(args, "world_size", 1), logged)
    return loss


def main(argv: list[str] | None = None):
    """Runs OpenCLIP's trainer (``open_clip_train.main.main``) on `argv`
    (default: this command's arguments) with `create_loss` in place of
    OpenCLIP's."""
    trainer = _trainer()
    trainer.create_loss = create_loss
    return trainer.main(sys.argv[1:] if argv is None else list(argv))


if __name__ == "__main__":
    from .errors import Error
    try:
        _trainer()  # a trainer that is missing or differs: its message alone
    except Error as e:
        sys.exit(str(e))
    main()
