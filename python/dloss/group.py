"""Which ranks dloss runs on: the script's own torch.distributed group.

dloss needs no rendezvous of its own. Every call runs on
``torch.distributed``'s default group, or on the ``group=`` it is given;
collectives go through that group's backend (Gloo for CPU tensors, NCCL for
CUDA tensors), and dloss's bookkeeping (collective numbers, deadlines, the
failure diagnosis that names the ranks that never arrived) goes through the
group's own store.

A process that has used dloss records in each group's store why it exits
(an uncaught exception: its type, message and the user's ``file:line``; or
a plain end), so that its peers fail at once and name it as the root cause,
and rank 0, which hosts the store, keeps it up on its way out while peers
still read it. `peer_exits` and `root_cause` read those records.
"""

import atexit
import os
import sys
import threading
from datetime import timedelta

import torch
import torch.distributed as dist

from . import _C
from .errors import make_error

_lock = threading.Lock()
# One communicator per group, so that every dloss call on a group shares one
# sequence of numbered collectives.
_communicators = {}
# The communicator of a process with no group (see runs_alone): one, so
# that its collectives share one numbering too.
_alone = {"comm": None}
_settings = {"timeout": None, "flight_dir": None}
# Whether the exit hooks are installed, and whether this process has
# recorded its exit.
_exit = {"hooked": False, "recorded": False}


def _default_timeout():
    if _settings["timeout"] is not None:
        return _settings["timeout"]
    value = os.environ.get("DLOSS_TIMEOUT_S")
    if value:
        try:
            seconds = float(value)
        except ValueError:
            seconds = -1.0
        if seconds <= 0:
            raise make_error(
                "DLOSS_TIMEOUT_S is %r, not a positive number of seconds" %
                value, "Set DLOSS_TIMEOUT_S=300, say, or unset it")
        return seconds
    return 300.0


def set_timeout(seconds=None, flight_dir=None):
    """Sets the deadline of every dloss collective (seconds; default 300, or
    ``DLOSS_TIMEOUT_S``) and where a failed collective writes its flight
    record (default: ``DLOSS_FLIGHT_DIR``, else the current directory;
    ``"off"``: nowhere). Applies to
    groups dloss has not used yet; call it on every rank."""
    if seconds is not None and not seconds > 0:
        raise make_error("timeout must be positive, got %r" % (seconds,),
                         "Pass a deadline in seconds, such as 300")
    _settings["timeout"] = seconds
    if flight_dir is not None:
        _settings["flight_dir"] = flight_dir


def _require_group(group):
    if not dist.is_available():
        raise make_error(
            "torch.distributed is not available in this torch build",
            "Use a torch with distributed support")
    if not dist.is_initialized():
        raise make_error(
            "no torch.distributed process group is initialised",
            "Call torch.distributed.init_process_group(...) first, or "
            "dloss.init(), which reads MASTER_ADDR, MASTER_PORT, RANK and "
            "WORLD_SIZE (a single process when they are unset)")
    if group is None or group is dist.group.WORLD:
        return dist.distributed_c10d._get_default_group()
    if group == dist.GroupMember.NON_GROUP_MEMBER:
        raise make_error(
            "this rank is not a member of the group it passed",
            "Call dloss only on the ranks of the group")
    return group


def _store_of(group):
    # torch keeps each group's store beside it (1.13: _pg_map; 2.x: also
    # _world.pg_map); dloss records its collectives there.
    c10d = dist.distributed_c10d
    table = getattr(c10d, "_pg_map", None)
    if table is None:
        world = getattr(c10d, "_world", None)
        table = getattr(world, "pg_map", {}) if world is not None else {}
    entry = table.get(group)
    return entry[1] if entry else None


class _Alone:
    """The type of ALONE."""

    def __repr__(self):
        return "dloss.group.ALONE"


# As a `group`: this process alone, a world of one, whatever groups exist.
# For a loss that is per rank by request (sentence-transformers'
# gather_across_devices=False): each rank gets the loss of its own batch,
# with no collective.
ALONE = _Alone()


def runs_alone(group=None):
    """Whether a call on `group` runs as one process: `group` is ALONE, or
    no group is given and there is no default group (torch.distributed not
    initialised, or not built into this torch). A one-GPU run, a notebook
    or a unit test then gets the loss of its own batch, as the original
    library computes it. Decided at every call, so a loss made before
    ``init_process_group`` runs on the group once it exists."""
    if group is ALONE or not dist.is_available():
        return True
    if group is not None and group is not dist.group.WORLD:
        return False
    return not dist.is_initialized()


def world_size(group=None):
    """The number of ranks a call on `group` runs on (1 with no group), read
    from torch.distributed, which torch.compile folds to a constant."""
    if runs_alone(group):
        return 1
    return dist.get_world_size(group)


def communicator(group=None):
    """The dloss communicator of `group` (default: the default group),
    made on first use and kept for the group's lifetime; with no group at
    all (`runs_alone`), the world of one, whose collectives are the
    identity."""
    if runs_alone(group):
        with _lock:
            if _alone["comm"] is None:
                _alone["comm"] = _C.single_process_communicator()
            return _alone["comm"]
    group = _require_group(group)
    with _lock:
        entry = _communicators.get(id(group))
        if entry is not None and entry[0] is group:
            return entry[1]
        flight_dir = _settings["flight_dir"] or os.environ.get(
            "DLOSS_FLIGHT_DIR", "")
        # Where the store is, for messages (env:// groups: the torchrun
        # variables); 0 when unknown.
        try:
            port = int(os.environ.get("MASTER_PORT", "0"))
        except ValueError:
            port = 0
        comm = _C.process_group_communicator(
            group, _store_of(group), _default_timeout(), flight_dir,
            os.environ.get("MASTER_ADDR", ""), port)
        _communicators[id(group)] = (group, comm)
        _hook_exit()
        return comm


def peer_exits(group=None):
    """Why ranks of `group` (default: the default group) exited, as they
    recorded it on their way out: ``{rank: reason}``, earliest first, such
    as ``{1: "exited after raising ValueError('bad batch') at
    train.py:20 in step"}``. Only processes that had used dloss on the
    group record (making the group's communicator, ``communicator(group)``,
    is enough); a rank that was killed or ended with os._exit records
    nothing. An exit that followed a failed dloss collective (a consequence,
    not a cause) ends with " (after its dloss collective failed)". Empty
    when the store cannot be read, and in a group of one rank, which
    records nothing (it has no peer to tell)."""
    exits = {}
    for rank, _, reason, after_failure in communicator(group).peer_exits():
        exits[rank] = reason + (" (after its dloss collective failed)"
                                if after_failure else "")
    return exits


def root_cause(group=None):
    """The first rank of `group` that left or failed on its own, not
    because a peer did, as the ranks recorded it in the store: a clause
    such as "rank 1 exited after raising ValueError('bad batch') at
    train.py:20 in step", or None when no rank recorded such an exit or a
    failure outside a collective. The rule dloss's own errors lead with
    (they also name ranks that died without a word)."""
    return communicator(group).root_cause() or None


def _hook_exit():
    """Installs, once, what records this process's exit: a sys.excepthook
    (chained to the one before it) for an uncaught exception, and an atexit
    handler for a plain end, which then lets rank 0 keep the store up while
    its peers read it."""
    if _exit["hooked"]:
        return
    _exit["hooked"] = True
    previous = sys.excepthook

    def excepthook(kind, value, traceback):
        try:
            _record_exit(_exit_reason(kind, value, traceback), raised=True)
        finally:
            previous(kind, value, traceback)

    sys.excepthook = excepthook
    # Registered after torch's own handlers, so it runs before them.
    atexit.register(_at_exit)


def _exit_reason(kind, value, traceback):
    """"exited after raising ValueError('...') at train.py:20 in step"."""
    from .errors import raised_at
    module = getattr(kind, "__module__", "")
    name = getattr(kind, "__qualname__", str(kind))
    if module.split(".")[0] == "dloss":
        name = "dloss." + name
    elif module not in ("builtins", "__main__", ""):
        name = module + "." + name
    message = str(value)
    if len(message) > 200:
        message = message[:200] + "..."
    where = raised_at(traceback)
    return "exited after raising %s(%r)%s" % (name, message,
                                              " at " + where if where else "")


def _record_exit(reason, raised):
    if _exit["recorded"]:
        return
    _exit["recorded"] = True
    for _, comm in list(_communicators.values()):
        try:
            comm.record_exit(reason, raised)
        except Exception:  # noqa: BLE001 - the process is on its way out
            pass


def _at_exit():
    _record_exit("exited without an exception (its script ended, or called "
                 "sys.exit)", raised=False)
    for _, comm in list(_communicators.values()):
        try:
            comm.keep_store_for_peers()
        except Exception:  # noqa: BLE001 - the process is on its way out
            pass


def init(backend=None, timeout=None):
    """Initialises torch.distributed for a script that has no group yet.

    Reads the torchrun variables MASTER_ADDR, MASTER_PORT, RANK and
    WORLD_SIZE (all four, or none: then this process is a world of one, with
    no port). `backend` defaults to ``"nccl"`` when CUDA is available and
    ``"gloo"`` otherwise. `timeout` (seconds) is both the group's and dloss's
    deadline. Does nothing but set the deadline when a group exists already.
    Returns ``(rank, world_size)``.
    """
    if timeout is not None:
        set_timeout(timeout)
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    names = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")
    present = [n for n in names if os.environ.get(n)]
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    kwargs = {}
    if timeout is not None:
        kwargs["timeout"] = timedelta(seconds=timeout)
    if not present:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0,
                                world_size=1, **kwargs)
        return 0, 1
    missing = [n for n in names if n not in present]
    if missing:
        raise make_error(
            "dloss.init() found %s but not %s" %
            (", ".join(present), ", ".join(missing)),
            "Set all four of MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE "
            "(as torchrun does), or none for a single process")
    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        int(os.environ["MASTER_PORT"])
    except ValueError:
        raise make_error(
            "RANK, WORLD_SIZE and MASTER_PORT must be integers (got %r, %r, "
            "%r)" % (os.environ["RANK"], os.environ["WORLD_SIZE"],
                     os.environ["MASTER_PORT"]),
            "Fix the launcher's environment") from None
    if not 0 <= rank < world:
        raise make_error("RANK=%d is not in [0, WORLD_SIZE=%d)" % (rank, world),
                         "Fix the launcher's environment")
    dist.init_process_group(backend, init_method="env://", rank=rank,
                            world_size=world, **kwargs)
    return rank, world
