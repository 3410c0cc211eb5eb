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

Sends and recvs are checked per pair: each end records its op when it is
posted and compares it with its peer's before its wait.

Mechanism: the guard registers a C++ backend (runtime/comm/GuardedBackend.h)
on the user's own group, in place of its Gloo and NCCL backends. torch
dispatches every op of a group to its backend, so every holder of the group
is covered: the user's ``torch.distributed`` calls, Lightning's ``sync_dist``
reductions and barriers, DDP's reducer (a DDP module built before the guard
included), FSDP2's all-gathers and reduce-scatters, and dloss's runtime.
Before each collective, the backend exchanges a 62-bit fingerprint of the op
(its description and who calls it: the user, DDP's reducer, FSDP2, dloss)
with every rank, in one small all-reduce on a Gloo backend of the guard's
own over the group's ranks, in C++ without the GIL. Only when the
fingerprints differ, or a rank waits longer than a poll interval, does this
module run: it records the op and the user's line in the group's store,
through a connection of the guard's own whose operations end at the
guard's deadline, and reads the other ranks' records to say who called
what where. See docs/Lightning.md for its cost and its limits.
"""

import importlib.abc
import importlib.util
import itertools
import os
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

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
    """Lightning's sync_dist reductions run after the self.log that asked
    for them, so dloss.lightning remembers where that was: from a guard's
    install when Lightning is loaded, else from Lightning's import on."""
    global _lightning_hooked
    if _lightning_hooked:
        return
    if "lightning.pytorch" in sys.modules:
        _lightning_hooked = True
        from .lightning import _remember_log_sites
        _remember_log_sites()
    elif not any(isinstance(f, _OnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _OnImport())


class _OnImport(importlib.abc.MetaPathFinder):
    """Hooks Lightning (_hook_lightning) once lightning.pytorch has been
    imported, for a guard installed before it."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "lightning.pytorch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or \
                not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _hook_lightning()

        spec.loader.exec_module = exec_module
        return spec


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


def _python_caller(hook):
    """The Python frame under the guard's `hook` (the frame that called
    into torch, which called the group's backend), and whether it is on
    this thread: an op that C++ starts on a thread of its own (the CUDA
    autograd engine's, for DDP's reducer) has no Python frame under it, and
    the main thread's stack says where the user is."""
    if hook.f_back is not None:
        return hook.f_back, True
    main = sys._current_frames().get(threading.main_thread().ident)
    return main, False


def _op_site():
    """The user's site of the op whose guard hook calls this."""
    return _user_site(_python_caller(sys._getframe(1))[0])


def _fsdp_name(param_group):
    """"module 'encoder.layers.0' (Linear)" of an FSDP2 parameter group,
    as the guard names its all-gathers and reduce-scatters."""
    name = getattr(param_group, "_dloss_origin", None)
    if name is None:
        modules = param_group.modules
        # fully_shard makes each module's class a subclass ("FSDPLinear")
        # of the user's.
        kind = next((k.__name__ for k in type(modules[0]).__mro__
                     if not k.__name__.startswith("FSDP")), "?")
        fqn = param_group._module_fqn
        name = "%s (%s)" % ("module '%s'" % fqn if fqn else
                            "the root module", kind)
        param_group._dloss_origin = name
    return name


def _hook_fsdp():
    """Once: FSDP2 parameter groups name themselves, for the guard, around
    their unshard (all-gathers) and gradient reduction (reduce-scatters):
    one call into dloss per parameter group and step, not per op."""
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_param_group import \
            FSDPParamGroup
    except ImportError:  # a torch without FSDP2: nothing to name
        return
    for method in ("unshard", "post_backward"):
        original = getattr(FSDPParamGroup, method, None)
        if original is None or getattr(original, "_dloss_guard", False):
            continue

        def named(self, *args, _original=original, **kwargs):
            previous = _C.set_guard_origin(_fsdp_name(self))
            try:
                return _original(self, *args, **kwargs)
            finally:
                _C.set_guard_origin(previous)

        named.__wrapped__ = original
        named.__doc__ = original.__doc__
        named._dloss_guard = True
        setattr(FSDPParamGroup, method, named)


class _Checker:
    """The slow paths of a guarded group's backend
    (runtime/comm/GuardedBackend.h), which calls them with the GIL on the
    op's own thread: a collective that waits longer than a poll interval,
    one whose fingerprint differs between ranks or that misses the
    deadline, every op after a refusal; and the per-pair check of sends
    and recvs. Each record is ``call + "\n" + site`` under
    ``<prefix><collective number>/<rank>``."""

    def __init__(self, group, store, timeout, label, broken=None):
        self._inner = group
        self._store = store
        self.timeout = timeout
        self._label = label
        self._rank = group.rank()
        self._world = group.size()
        self._prefix = "dloss/guard/%d/" % next(_generations)
        self._broken = broken  # the refusal's text, once refused
        # Point to point: posts per (src, dst, tag), and the posted ops
        # not yet verified, by token.
        self._posts = {}
        self._pending = {}
        self._tokens = itertools.count()

    @property
    def poll(self):
        """Seconds a rank waits in a collective before it records it."""
        return min(1.0, self.timeout / 4)

    # -- the collective hooks ----------------------------------------------
    def waiting(self, seq, call, first):
        site = _op_site()
        try:
            if first:
                self._record(seq, call, site)
            elif self._store.check([self._prefix + "abort"]):
                self._refuse(self._store.get(self._prefix + "abort").decode(),
                             "", site, stored=True)
        except ConnectionError as e:
            self._lost_store(e, "collective #%d: %s" % (seq, call), site)

    def passed(self, seq):
        try:
            self._store.delete_key(self._keys(seq)[self._rank])
        except ConnectionError:
            pass  # a later op that needs the store says so

    def timed_out(self, seq, call):
        site = _op_site()
        keys = self._keys(seq)
        store = self._store
        try:
            self._record(seq, call, site)
            # A rank that came records its op within a poll interval of
            # coming: wait that long for every rank's record (by checks:
            # torch logs a warning for each store wait that times out).
            grace = time.monotonic() + self.poll + 0.25
            while True:
                present = [store.check([k]) for k in keys]
                if all(present) or time.monotonic() > grace:
                    break
                time.sleep(0.05)
            came = [None if v is None else v.decode().split("\n", 1)
                    for v in _fill(store, keys, present)]
        except ConnectionError as e:
            self._lost_store(e, "collective #%d: %s" % (seq, call), site)
        aborted = [c for c in came if c is not None and
                   c[0].startswith(_ABORT)]
        if aborted:
            self._refuse(aborted[0][0][len(_ABORT):] + "\n" + aborted[0][1],
                         "", site, stored=True)
        missing = [r for r, c in enumerate(came) if c is None]
        self._abort(
            keys, self._cause() + "collective #%d on %s: %s never "
            "reached it within %g s, while %s" % (
                seq, self._label, _ranks(missing) if missing else "no rank",
                self.timeout, _by_rank(came)),
            _hint([c for c in came if c is not None], missing=True), site)

    def disagreed(self, seq, call):
        site = _op_site()
        keys = self._keys(seq)
        try:
            self._record(seq, call, site)
            # Every rank has come (the exchange ended): each records its
            # op now.
            self._store.wait(keys, timedelta(seconds=self.timeout))
            values = [v.decode() for v in self._store.multi_get(keys)]
        except TimeoutError:
            values = None
        except ConnectionError as e:
            self._lost_store(e, "collective #%d: %s" % (seq, call), site)
        if values is None:
            self._abort(keys, "the ranks reached different collectives as "
                        "collective #%d on %s (this rank: %s at %s); not "
                        "every rank said which within %g s" %
                        (seq, self._label, call, site, self.timeout),
                        _hint([]), site)
        for value in values:
            if value.startswith(_ABORT):
                self._refuse(value[len(_ABORT):], "", site, stored=True)
        calls = [v.split("\n", 1) for v in values]
        self._abort(keys, "the ranks reached different collectives as "
                    "collective #%d on %s: %s" %
                    (seq, self._label, _by_rank(calls)), _hint(calls), site)

    def refused(self, call):
        site = _op_site()
        # The ranks disagree on the order from here on: any op would pair
        # with the wrong one or hang.
        self._refuse(self._broken or "%s was refused earlier on this rank" %
                     self._label, "", site, stored=True)

    # -- point to point ----------------------------------------------------
    def post(self, call, peer, send, tag):
        site = _op_site()
        src, dst = (self._rank, peer) if send else (peer, self._rank)
        pair = (src, dst, tag)
        n = self._posts.get(pair, 0)
        self._posts[pair] = n + 1
        base = self._prefix + "p2p/%d-%d/%d/%d/" % (src, dst, tag, n)
        mine, theirs = (base + "s", base + "r") if send else \
            (base + "r", base + "s")
        try:
            self._store.set(mine, call + "\n" + site)
        except ConnectionError as e:
            self._lost_store(e, call, site)
        token = next(self._tokens)
        self._pending[token] = (theirs, call, site, peer, n)
        return token

    def verify(self, token):
        entry = self._pending.pop(token, None)
        if entry is None:
            return
        theirs, call, site, peer, n = entry
        store = self._store
        try:
            try:
                store.wait([theirs], timedelta(seconds=self.timeout))
            except TimeoutError:
                self._abort([], self._cause() +
                            "%s #%d with rank %d on %s (%s at %s) met no "
                            "matching %s on rank %d within %g s" % (
                                call.split(" ")[0], n, peer, self._label,
                                call, site,
                                "recv" if call.startswith("send") else "send",
                                peer, self.timeout),
                            _hint([], missing=True), site)
            other = store.get(theirs).decode().split("\n", 1)
            store.delete_key(theirs)
        except ConnectionError as e:
            self._lost_store(e, call, site)
        if other[0].split(" ", 1)[1:] != call.split(" ", 1)[1:]:
            mine = (self._rank, call, site)
            pair = sorted([mine, (peer, other[0], other[1])])
            self._abort([],
                        "a send and its recv disagree on %s: %s" % (
                            self._label, "; ".join(
                                "rank %d: %s at %s" % p for p in pair)),
                        "A send and the recv that pairs with it (the same "
                        "peers and tag, in posting order) must move the "
                        "same dtype and shape: fix the side that differs",
                        site)

    # -- records and refusals ----------------------------------------------
    def _keys(self, seq):
        base = self._prefix + "%d/" % seq
        return [base + str(r) for r in range(self._world)]

    def _record(self, seq, call, site):
        """Writes this rank's record of collective #seq, unless an abort
        filled it already: then refuses with the abort's text."""
        _hook_lightning()
        found = self._store.compare_set(self._keys(seq)[self._rank], "",
                                        call + "\n" + site)
        found = found.decode() if isinstance(found, bytes) else found
        if found.startswith(_ABORT):
            self._refuse(found[len(_ABORT):], "", site, stored=True)

    def _lost_store(self, error, call, site):
        self._refuse(
            "%s: the group's store stopped answering while this rank "
            "checked %s at %s (%s): the process that hosts it (rank 0 for "
            "env:// groups and mp.spawn, torchrun's agent) has exited, or "
            "this host is cut off from it" % (
                self._label, call, site, str(error).splitlines()[0]),
            "Look at that process's output for why it stopped, and at the "
            "network between the hosts", site)

    def _cause(self):
        """"<root cause> (the first rank that left or failed); because of
        it, " when a rank recorded why it left, else ""."""
        cause = root_cause(self._inner)
        return cause + " (the first rank that left or failed); because of " \
            "it, " if cause else ""

    def _abort(self, keys, problem, hint, site):
        """Raises `problem` here and on every rank waiting for, or coming
        later to, collective `keys`: the first rank to abort writes its text
        under the abort key, which the waiting ranks poll, and into the
        records of the ranks that never came."""
        text = problem + "\n" + hint
        try:
            stored = self._store.compare_set(self._prefix + "abort", "", text)
            stored = stored.decode() if isinstance(stored, bytes) else stored
            for key in keys:
                self._store.compare_set(key, "", _ABORT + stored)
        except ConnectionError:
            stored = text  # the others cannot learn it: this rank still can
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


# The guards installed on each group while it checks, outermost first.
_installed = {}

# Each group's side backend (_side_backend), and how many it has had.
_sides = {}
_side_counts = {}


# The guard's own connection to each group's store, made once per group:
# guards come and go (one per Lightning stage, or per test), connections
# stay.
_connections = {}


def _own_connection(group, store, timeout):
    """The guard's connection to `group`'s `store` (a clone of its own, so
    that the group's connection and timeout stay the user's; the store
    itself where it has no clone), every operation of which ends within
    `timeout` and a margin (runtime/comm/BoundedStore.h): a wait that runs
    out raises TimeoutError, a store that stopped answering
    ConnectionError."""
    connection = _connections.get(group)
    if connection is None:
        connection = _C.BoundedStore(store, timeout)
        _connections[group] = connection
    connection.set_deadline(timeout)
    return connection


def _side_backend(group, store, timeout):
    """The guard's own Gloo backend over `group`'s ranks, on which the
    fingerprints travel (its own connections: they never queue behind the
    group's ops). Made once per group, by every rank at the same point
    (a rendezvous on the group's store), and kept across guards; a guard
    that refused leaves it behind, since an exchange may still be posted on
    it."""
    side = _sides.get(group)
    if side is None:
        n = _side_counts.get(group, 0)
        _side_counts[group] = n + 1
        options = dist.ProcessGroupGloo._Options()
        options._timeout = timedelta(seconds=max(timeout, 30))
        options._devices = [dist.ProcessGroupGloo.create_default_device()]
        # One op at a time: one worker thread is all it needs.
        options._threads = 1
        side = dist.ProcessGroupGloo(
            dist.PrefixStore("dloss/guard/side/%d/" % n, store),
            group.rank(), group.size(), options)
        _sides[group] = side
    return side


class Guard:
    """An installed guard (see guard()): ``group`` is the guarded group,
    ``close()`` (or the end of a ``with`` block) removes it.

    Guards of one group nest: an inner guard's deadline holds until it
    closes, then the outer one's again."""

    def __init__(self, group, timeout):
        if not (isinstance(timeout, (int, float)) and timeout > 0):
            raise make_error("dloss.guard: timeout must be a positive number "
                             "of seconds, got %r" % (timeout,),
                             "Pass timeout=30, say")
        group = _require_group(group)
        self.group = None
        store = _store_of(group)
        if store is None:
            raise make_error(
                "dloss.guard: torch keeps no store for this group",
                "Guard a group made by torch.distributed.init_process_group "
                "or new_group")
        self.timeout = float(timeout)
        communicator(group)  # its exit hooks record why a rank left
        _hook_lightning()
        _hook_fsdp()
        stack = _installed.setdefault(group, [])
        stack.append(self)
        self.group = group
        _install(group, store)

    def close(self):
        """Stops checking (the group gets its own backends back), or, for a
        guard inside another of the same group, gives the outer one's
        deadline back."""
        group, self.group = self.group, None
        if group is None:
            return
        stack = _installed.get(group, [])
        if self in stack:
            stack.remove(self)
        if stack:
            _install(group, _store_of(group))
            return
        _installed.pop(group, None)
        checker = _checkers.pop(group, None)
        if checker is not None and checker._broken is not None:
            _sides.pop(group, None)
        _C.unguard_group(group)

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.close()


# What checks each guarded group now.
_checkers = {}


def _install(group, store):
    """Guards `group` with the deadline of its innermost guard: a new
    checker (its records under a new prefix; a refusal carries over) and
    a new config in the group's backend (GuardedBackend.h)."""
    timeout = _installed[group][-1].timeout
    label = "the default group" if \
        group is dist.distributed_c10d._get_default_group() else \
        "group %s" % group.group_name
    previous = _checkers.get(group)
    checker = _Checker(group, _own_connection(group, store, timeout),
                       timeout, label,
                       previous._broken if previous is not None else None)
    side = _side_backend(group, store, timeout)
    _C.guard_group(group, checker, side, timeout, checker.poll,
                   checker._broken is not None)
    _checkers[group] = checker


def guard(group=None, timeout=_DEFAULT_TIMEOUT):
    """Checks every collective on `group` (default: torch.distributed's
    default group) before it runs: every rank must reach the same op with
    the same sizes and dtype, within `timeout` seconds of the first. A
    mismatch or a missing rank raises dloss.Error on every rank that waits,
    with each rank's call site. Sends and recvs are checked per pair.
    Call it on every rank, after the group is initialised; it guards the
    group itself, so a DDP module or an FSDP2 mesh on the group is covered
    whenever it was built.

    As a call it guards until the end of the process (or ``.close()``); as
    a context, ``with dloss.guard(): ...``, until the block ends.
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
