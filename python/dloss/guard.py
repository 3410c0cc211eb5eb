"""dloss.guard: every collective on a group checked, before it runs, against
what the other ranks are calling.

A collective that runs on some ranks only hangs the job until torch's
timeout (30 minutes), or is paired by the backend with a different
collective on the other ranks. Under the guard, each collective on the
group first records on the group's store what this rank calls (the op, its
tensors' sizes and dtype) and where (the user's ``file:line``; "DDP gradient
all-reduce, bucket k" for DDP's own), then waits for every rank's record of
the same collective number:

- all agree: the collective runs;
- they differ: every rank raises the same dloss.Error, naming each rank's
  call and call site;
- a rank has not come by the deadline: the ranks that wait raise, naming
  the ranks that never came, and a rank that comes later raises the same
  error.

Mechanism: the guarded group is a ``torch.distributed.ProcessGroup``
written in Python around the group's own backends, and becomes torch's
default group. Every collective of the public API that goes through a
ProcessGroup method reaches it: the user's ``torch.distributed`` calls,
Lightning's ``sync_dist`` reductions and barriers, DDP's C++ reducer, and
dloss's runtime. See docs/Lightning.md for why, its cost, and its limits.
"""

import itertools
import os
import sys
import threading
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from . import _C
from .errors import framework_dirs, make_error, split_stack
from .group import _require_group, _store_of, communicator, root_cause

__all__ = ["Guard", "guard"]

_DEFAULT_TIMEOUT = 30.0
# A record that an aborting rank wrote in place of a rank that never came:
# the abort's text follows.
_ABORT = "!abort "
# One number per guard installed in this process: installs happen in the
# same order on every rank, so a new guard's records never meet an old one's.
_generations = itertools.count()


# Functions of the frames between the guard and the user's (innermost
# first) that name a framework's deferred call better than its caller's line
# (dloss.lightning: a self.log(..., sync_dist=True) that Lightning reduces
# later); each returns the site's text or None.
site_hooks = []


_lightning_hooked = False


def _hook_lightning():
    """Once Lightning is loaded: its sync_dist reductions run after the
    self.log that asked for them, so dloss.lightning remembers where that
    was, from the first guarded collective on."""
    global _lightning_hooked
    if not _lightning_hooked and "lightning.pytorch" in sys.modules:
        _lightning_hooked = True
        from .lightning import _remember_log_sites
        _remember_log_sites()


def _frame_text(frame):
    return "%s:%d in %s" % (frame.f_code.co_filename, frame.f_lineno,
                            frame.f_code.co_name)


# torch's own plumbing between the user and a collective, never named as
# what the user called: Module.__call__ (skipped), and the API's wrappers.
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
_MODULE_CALL = os.path.join(_TORCH_DIR, "nn", "modules", "module.py")
_API = (os.path.join(_TORCH_DIR, "distributed", "c10d_logger.py"),
        os.path.join(_TORCH_DIR, "distributed", "distributed_c10d.py"))


def _user_site(start):
    """``file:line in function`` of the user's innermost frame at or above
    `start`, and the library function it called when that is not
    torch.distributed's API itself (", through Trainer.fit")."""
    frame, inner = split_stack(start, framework_dirs())
    for hook in site_hooks:
        text = hook(inner)
        if text:
            return text
    if frame is None:
        return "an unknown line"
    text = _frame_text(frame)
    for callee in reversed(inner):
        path = os.path.abspath(callee.f_code.co_filename)
        if path == _MODULE_CALL:
            continue
        if path not in _API:
            text += ", through " + getattr(callee.f_code, "co_qualname",
                                           callee.f_code.co_name)
        break
    return text


def _python_caller(override):
    """The frame that called the guarded method `override`, and whether it
    is on this thread: a collective that C++ starts on a thread of its own
    (the CUDA autograd engine's, for DDP's reducer) has no Python caller,
    and the main thread's stack says where the user is."""
    if override.f_back is not None:
        return override.f_back, True
    main = sys._current_frames().get(threading.main_thread().ident)
    return main, False


def _tensors(tensors):
    if not tensors:
        return "[]"
    dtypes = {str(t.dtype).replace("torch.", "") for t in tensors}
    shapes = ",".join("[%s]" % "x".join(str(s) for s in t.shape)
                      for t in tensors)
    return "%s%s" % ("/".join(sorted(dtypes)), shapes)


def _reduce_op(opts):
    op = getattr(opts, "reduceOp", None)
    text = str(getattr(op, "op", op))
    return text.split(".")[-1].split(":")[0].strip("<>")


class _GuardedGroup(ProcessGroup):
    """The group `inner`, each collective checked first (see the module's
    docstring). Ops that a Python ProcessGroup cannot override go straight
    to `inner`'s backends, unchecked."""

    def __init__(self, inner, store, timeout, label):
        super().__init__(inner.rank(), inner.size())
        self._inner = inner
        self._store = store
        self._timeout = timeout
        self._label = label
        self._rank = inner.rank()
        self._world = inner.size()
        self._prefix = "dloss/guard/%d/" % next(_generations)
        self._seq = 0
        self.enabled = True
        self._broken = None  # the refusal's text, once refused
        self._ddp_task = (None, 0)  # (autograd graph task, next bucket)
        for device in inner._device_types:
            backend = inner._get_backend(device)
            kind = {"gloo": ProcessGroup.BackendType.GLOO,
                    "nccl": ProcessGroup.BackendType.NCCL}.get(
                        backend.name(), ProcessGroup.BackendType.CUSTOM)
            self._register_backend(device, kind, backend)
        if inner.bound_device_id is not None:
            self.bound_device_id = inner.bound_device_id
        self._set_group_name(inner.group_name)
        self._set_group_desc(inner.group_desc)

    def getBackendName(self):  # noqa: N802 - torch's name
        return self._inner.name()

    # -- the checked collectives ----------------------------------------
    def allreduce(self, tensors, opts):
        self._check("all_reduce %s %s" % (_tensors(tensors), _reduce_op(opts)))
        return self._inner.allreduce(tensors, opts)

    def allreduce_coalesced(self, tensors, opts):
        self._check("all_reduce_coalesced %s %s" %
                    (_tensors(tensors), _reduce_op(opts)))
        return self._inner.allreduce_coalesced(tensors, opts)

    def allgather(self, outputs, inputs, opts):
        self._check("all_gather %s" % _tensors(inputs))
        return self._inner.allgather(outputs, inputs, opts)

    def all_gather_single_coalesced(self, outputs, inputs, opts):
        self._check("all_gather_into_tensor_coalesced %s" % _tensors(inputs))
        return self._inner.allgather_into_tensor_coalesced(outputs, inputs,
                                                           opts)

    def broadcast(self, tensors, opts):
        self._check("broadcast %s from rank %d" %
                    (_tensors(tensors), opts.rootRank))
        return self._inner.broadcast(tensors, opts)

    def barrier(self, opts):
        self._check("barrier")
        return self._inner.barrier(opts)

    def reduce_scatter(self, outputs, inputs, opts):
        self._check("reduce_scatter %s %s" %
                    (_tensors(outputs), _reduce_op(opts)))
        return self._inner.reduce_scatter(outputs, inputs, opts)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts):
        self._check("reduce_scatter_tensor_coalesced %s %s" %
                    (_tensors(outputs), _reduce_op(opts)))
        return self._inner.reduce_scatter_tensor_coalesced(outputs, inputs,
                                                           opts)

    def all_to_all_single(self, output, input, output_splits, input_splits,
                          opts):
        # The split sizes differ between ranks by design: only the dtype
        # and the trailing dimensions must agree.
        self._check("all_to_all_single %s[*x%s]" % (
            str(input.dtype).replace("torch.", ""),
            "x".join(str(s) for s in input.shape[1:])))
        return self._inner.alltoall_base(output, input, output_splits,
                                         input_splits, opts)

    # -- the check --------------------------------------------------------
    def _origin(self, caller, on_this_thread):
        """Who makes the call, when not the user's own code: dloss's
        runtime, or DDP's reducer (a collective the autograd engine starts,
        from Python's backward call or on a thread of its own). Part of
        what the ranks must agree on."""
        dloss_site = _C.current_call_site()
        if dloss_site is not None:
            function, op, _, phase = dloss_site
            return " (dloss @%s, %s)" % (function, op or phase)
        if not on_this_thread or (caller is not None and
                                  caller.f_code.co_filename.endswith((
                                      os.path.join("torch", "autograd",
                                                   "graph.py"),
                                      os.path.join("torch", "autograd",
                                                   "__init__.py")))):
            task = torch._C._current_graph_task_id()
            last, bucket = self._ddp_task
            bucket = bucket if last == task else 0
            self._ddp_task = (task, bucket + 1)
            return " (DDP gradient all-reduce, bucket %d)" % bucket
        return ""

    def _check(self, call):
        if not self.enabled:
            return
        _hook_lightning()
        if self._broken is not None:
            # The ranks disagree on the order from here on: any collective
            # would pair with the wrong one or hang.
            self._refuse(self._broken, "",
                         _user_site(_python_caller(sys._getframe(1))[0]),
                         stored=True)
        seq = self._seq
        self._seq += 1
        base = self._prefix + "%d/" % seq
        keys = [base + str(r) for r in range(self._world)]
        caller, on_this_thread = _python_caller(sys._getframe(1))
        call += self._origin(caller, on_this_thread)
        site = _user_site(caller)
        store = self._store
        try:
            # An abort may have filled this rank's record already.
            record = call + "\n" + site
            found = store.compare_set(keys[self._rank], "", record)
            found = found.decode() if isinstance(found, bytes) else found
            if found.startswith(_ABORT):
                self._refuse(found[len(_ABORT):], "", site, stored=True)
            values = self._gather(seq, keys, site)
        except dist.DistStoreError as e:
            self._refuse(
                "collective #%d on %s: the group's store stopped answering "
                "while this rank checked %s at %s (%s): the rank that hosts "
                "it (rank 0 for torchrun and env:// groups) has probably "
                "exited" % (seq, self._label, call, site,
                            str(e).splitlines()[0]),
                "Look at that rank's output for why it stopped", site)
        if seq > 0:
            # Every rank wrote #seq, so every rank has read #seq-1.
            store.delete_key(self._prefix + "%d/%d" % (seq - 1, self._rank))
        calls = [v.split("\n", 1) for v in values]
        if any(c[0] != calls[0][0] for c in calls):
            self._abort(keys, "the ranks reached different collectives as "
                        "collective #%d on %s: %s" %
                        (seq, self._label, _by_rank(calls)),
                        _hint(calls), site)

    def _gather(self, seq, keys, site):
        """Every rank's record of collective #seq: one blocking wait on the
        store, until all are there (an abort fills the missing ones) or the
        deadline."""
        store = self._store
        try:
            store.wait(keys, timedelta(seconds=self._timeout))
        except dist.DistStoreError as e:
            if "timeout" not in str(e).lower() and \
                    "timed out" not in str(e).lower():
                raise
            present = [store.check([k]) for k in keys]
            came = [None if v is None else v.decode().split("\n", 1)
                    for v in _fill(store, keys, present)]
            aborted = [c for c in came if c is not None and
                       c[0].startswith(_ABORT)]
            if aborted:
                self._refuse(aborted[0][0][len(_ABORT):] + "\n" + aborted[0][1],
                             "", site, stored=True)
            missing = [r for r, c in enumerate(came) if c is None]
            # A rank that left recorded why (dloss.group's exit hooks).
            cause = root_cause(self._inner)
            cause = cause + " (the first rank that left or failed); " \
                "because of it, " if cause else ""
            self._abort(
                keys, cause + "collective #%d on %s: %s never reached it "
                "within %g s, "
                "while %s" % (seq, self._label, _ranks(missing),
                              self._timeout, _by_rank(came)),
                _hint([c for c in came if c is not None], missing=True), site)
        values = [v.decode() for v in store.multi_get(keys)]
        for value in values:
            if value.startswith(_ABORT):
                self._refuse(value[len(_ABORT):], "", site, stored=True)
        return values

    def _abort(self, keys, problem, hint, site):
        """Raises `problem` here and on every rank waiting for, or coming
        later to, this collective: the first rank to abort writes its text
        into the records of the ranks that never came, which ends the
        others' waits."""
        text = problem + "\n" + hint
        stored = self._store.compare_set(self._prefix + "abort", "", text)
        stored = stored.decode() if isinstance(stored, bytes) else stored
        for key in keys:
            self._store.compare_set(key, "", _ABORT + stored)
        self._refuse(stored, "", site, stored=True)

    def _refuse(self, problem, hint, site, stored=False):
        self._broken = problem + ("\n" + hint if not stored else "")
        if stored:
            problem, _, hint = problem.partition("\n")
        error = make_error(problem, hint, self._rank, "dloss.guard",
                           site.split(" in ")[0])
        if _C.current_call_site() is not None:
            # Inside a dloss call: its runtime raises this error as it is.
            _C.refuse_collective(error)
        raise error


def _fill(store, keys, present):
    """The values of the present keys, None for the others."""
    got = iter(store.multi_get([k for k, ok in zip(keys, present) if ok]))
    return [next(got) if ok else None for ok in present]


def _ranks(ranks):
    return ("rank %d" % ranks[0] if len(ranks) == 1 else
            "ranks " + ", ".join(str(r) for r in ranks))


def _by_rank(calls):
    """"rank 0: barrier at a.py:3 in f; ranks 1, 2: ..." from each rank's
    [call, site] (None: the rank never came), ranks with the same call and
    site together."""
    groups = {}
    for rank, entry in enumerate(calls):
        if entry is not None:
            groups.setdefault(tuple(entry), []).append(rank)
    return "; ".join("%s: %s at %s" % (_ranks(ranks), call, site)
                     for (call, site), ranks in
                     sorted(groups.items(), key=lambda kv: kv[1][0]))


def _hint(calls, missing=False):
    text = ("A collective must run on every rank of the group, in the same "
            "order: call it on every rank")
    if any("sync_dist=True" in c[1] for c in calls):
        text += (", or log a value that rank 0 alone computes with "
                 "self.log(..., rank_zero_only=True) and no sync_dist (a "
                 "dloss loss is already global: log it without sync_dist)")
    elif missing:
        text += (", or raise the deadline (dloss.guard(timeout=...)) if a "
                 "rank legitimately works this long alone")
    return text


class Guard:
    """An installed guard (see guard()): ``group`` is the guarded group,
    ``close()`` (or the end of a ``with`` block) removes it."""

    def __init__(self, group, timeout):
        if not (isinstance(timeout, (int, float)) and timeout > 0):
            raise make_error("dloss.guard: timeout must be a positive number "
                             "of seconds, got %r" % (timeout,),
                             "Pass timeout=30, say")
        original = _require_group(group)
        if isinstance(original, _GuardedGroup) and original.enabled:
            # Guarded already (a Lightning setup() runs once per stage):
            # the new deadline applies; the first guard keeps ownership.
            original._timeout = float(timeout)
            self.group, self._original = None, None
            return
        store = _store_of(original)
        if store is None:
            raise make_error(
                "dloss.guard: torch keeps no store for this group",
                "Guard a group made by torch.distributed.init_process_group "
                "or new_group")
        default = dist.distributed_c10d._get_default_group()
        self._is_default = original is default
        label = "the default group" if self._is_default else \
            "group %s" % original.group_name
        self._original = original
        communicator(original)  # its exit hooks record why a rank left
        self.group = _GuardedGroup(original, store, float(timeout), label)
        world = dist.distributed_c10d._world
        for table in _tables():
            if original in table:
                table[self.group] = table[original]
        if self._is_default:
            world.default_pg = self.group

    def close(self):
        """Stops checking and gives torch back the original group (a DDP
        module made under the guard keeps the guarded one, unchecked)."""
        if self.group is None:
            return
        self.group.enabled = False
        world = dist.distributed_c10d._world
        if self._is_default and world.default_pg is self.group:
            world.default_pg = self._original
        for table in _tables():
            table.pop(self.group, None)
        self.group = None

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.close()


def _tables():
    """torch's per-group tables that every collective and query reads (those
    this torch has: pg_to_tag is a 2.x addition)."""
    world = dist.distributed_c10d._world
    names = ("pg_map", "pg_names", "pg_group_ranks", "pg_backend_config",
             "pg_to_tag")
    return tuple(table for table in (getattr(world, n, None) for n in names)
                 if table is not None)


def guard(group=None, timeout=_DEFAULT_TIMEOUT):
    """Checks every collective on `group` (default: torch.distributed's
    default group) before it runs: every rank must reach the same op with
    the same sizes and dtype, within `timeout` seconds of the first. A
    mismatch or a missing rank raises dloss.Error on every rank that waits,
    with each rank's call site. Call it on every rank, after the group is
    initialised, and before DDP wraps the model (DDP keeps the group it was
    given).

    As a call it guards until the end of the process (or ``.close()``); as
    a context, ``with dloss.guard(): ...``, until the block ends. For the
    default group torch itself then hands out the guarded group; for
    another group, use the returned guard's ``.group`` in its place.
    ``DLOSS_GUARD=<seconds>`` (or ``1``: 30 s) guards the default group of a
    script that imports dloss, from its init_process_group on."""
    return Guard(group, timeout)


def _timeout_from_environment():
    value = os.environ.get("DLOSS_GUARD", "").strip().lower()
    if value in ("", "0", "off", "false", "no"):
        return None
    if value in ("1", "on", "true", "yes"):
        return _DEFAULT_TIMEOUT
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise make_error("DLOSS_GUARD is %r, not a number of seconds" % value,
                         "Set DLOSS_GUARD=30 (seconds), 1 (30 s) or 0 (off)")
    return seconds


def install_from_environment():
    """``DLOSS_GUARD``: guard the default group now, or as soon as
    torch.distributed.init_process_group makes it."""
    timeout = _timeout_from_environment()
    if timeout is None:
        return
    if dist.is_available() and dist.is_initialized():
        guard(timeout=timeout)
        return
    original = dist.init_process_group
    if getattr(original, "_dloss_guard", False):
        return

    def init_process_group(*args, **kwargs):
        result = original(*args, **kwargs)
        guard(timeout=timeout)
        return result

    init_process_group.__doc__ = original.__doc__
    init_process_group.__wrapped__ = original
    init_process_group._dloss_guard = True
    dist.init_process_group = init_process_group
