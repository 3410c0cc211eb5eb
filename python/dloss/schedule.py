"""Which schedule the fused ops run: the process default
(``dloss.set_schedule``, ``DLOSS_SCHEDULE``) and the check of a loss's own
``schedule=``.

The fused ops (``ring_softmax_ce`` for CLIP, ``ring_sigmoid_pairs`` for
SigLIP, ``fused_similarity`` for the general family: NT-Xent, SupCon,
sentence-transformers' losses) move the other ranks' columns past each
rank's rows in one of two ways, which compute the same sums in the same
order:

- ``"ring"``: the column chunks travel round the ranks, N-1 hops each
  overlapped with a chunk's tiles; a rank holds two chunks at once.
- ``"gather"``: one all-gather of every rank's chunk, then one exchange that
  sends each chunk's column carry to its owner; a rank holds the whole
  global operand. Fewer messages, no overlap.
- ``"auto"`` (the default): per call, the gather when the global batch's
  travelling operands are at most ``dloss._C.gather_crossover_bytes(world
  size, device)`` bytes (small batches, where every hop is latency), else
  the ring. Every rank sees the same sizes, so every rank chooses alike.

The setting is the C++ runtime's (runtime/fused/Schedule.h); this module
checks names before they reach it, so that a mistake is raised where it is
made, not at the loss's first call. docs/Fusion.md, "Choosing the
schedule", has the cost model.
"""

from __future__ import annotations

from . import _C
from .errors import make_error

__all__ = ["SCHEDULES", "get_schedule", "set_schedule"]

# The settings, as the runtime names them.
SCHEDULES = ("auto", "ring", "gather")


def check_schedule(schedule: str | None, owner: str) -> str | None:
    """`schedule` if it is None or a setting's name; otherwise raises
    dloss.Error naming `owner` (such as ``"dloss.ClipLoss"``)."""
    if schedule is None or _is_setting(schedule):
        return schedule
    raise make_error(
        "%s: schedule must be None, 'auto', 'ring' or 'gather', got %r" %
        (owner, schedule),
        "Pass schedule='auto' (the cost model chooses per call), 'ring', "
        "'gather', or None to follow the process default "
        "(dloss.set_schedule, DLOSS_SCHEDULE); see "
        "docs/Fusion.md#choosing-the-schedule")


def _is_setting(schedule) -> bool:
    return isinstance(schedule, str) and schedule in SCHEDULES


def set_schedule(schedule: str) -> None:
    """Sets the process's default schedule of the fused ops, which every
    loss made without ``schedule=`` (or with ``schedule=None``) follows from
    its next call on.

    Call it alike on every rank: a call whose ranks run with different
    settings raises dloss.Error on every rank ("ranks run with different
    schedule settings"). It replaces ``DLOSS_SCHEDULE``, which sets the
    default when the process first reads it.

    Args:
        schedule: ``"ring"`` (the column chunks travel round the ranks:
            N-1 hops overlapped with the tiles, two chunks held per rank),
            ``"gather"`` (one all-gather of every rank's chunk and one
            exchange of the column carries: fewer messages, the whole
            global operand held per rank) or ``"auto"`` (per call, the
            gather when the global batch's travelling operands are at most
            ``dloss._C.gather_crossover_bytes(world_size, device)`` bytes,
            else the ring). Both schedules compute the same sums in the
            same order.

    Raises:
        dloss.Error: `schedule` is not one of the three names.
    """
    if not _is_setting(schedule):
        raise make_error(
            "dloss.set_schedule: schedule must be 'auto', 'ring' or "
            "'gather', got %r" % (schedule,),
            "Pass 'auto' (the cost model chooses per call), 'ring' or "
            "'gather'; see docs/Fusion.md#choosing-the-schedule")
    _C.set_schedule(schedule)


def get_schedule() -> str:
    """The process's default schedule of the fused ops.

    Returns:
        ``"auto"``, ``"ring"`` or ``"gather"``: what dloss.set_schedule last
        set, else ``DLOSS_SCHEDULE``, else ``"auto"``.

    Raises:
        dloss.Error: ``DLOSS_SCHEDULE`` is set to another name (when the
            process reads it first).
    """
    return _C.get_schedule()
