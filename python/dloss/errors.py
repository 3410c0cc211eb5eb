"""dloss.Error: how every dloss failure reaches Python."""

import functools

from . import _C


class Error(RuntimeError):
    """A dloss failure: what went wrong, where, and what to do.

    ``str(error)`` is the whole message. The parts are attributes too:

    - ``problem``: what went wrong, one sentence;
    - ``hint``: what to do about it ("" when there is no advice);
    - ``rank``: the rank that raised it (None when unknown);
    - ``op``: the dloss op or collective being run ("dloss.all_gather");
    - ``location``: where that op is in the loss's source (IR location, or
      the Python ``file:line`` that called it).

    It is a ``RuntimeError``, so existing ``except RuntimeError`` handlers
    keep working. A failure that every rank waits on (a peer's bad input, a
    rank that skipped a call) is raised on every rank.
    """

    problem = ""
    hint = ""
    rank = None
    op = ""
    location = ""


_C.set_error_type(Error)


def make_error(problem, hint="", rank=None, op="", location=""):
    """A dloss.Error rendered as the C++ runtime renders its errors (the
    same dloss::Error::format)."""
    return _C.make_error(problem, hint, rank, op, location)


@functools.lru_cache(maxsize=16)
def _is_users(skip=()):
    """A test of a code object's file name: whether it is the user's code,
    outside the dloss package, outside torch (a drop-in is called through
    torch.nn.Module.__call__) and outside the directories in `skip` (a
    framework between the user and dloss)."""
    import os
    import sys

    import torch

    # The package's folder, its private subpackages (dloss/_trace) included.
    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    skip = (package, os.path.dirname(os.path.abspath(torch.__file__)) +
            os.sep) + tuple(skip)
    # torch wraps some of its API (all_gather_into_tensor,
    # reduce_scatter_tensor) in typing_extensions' @deprecated, whose
    # wrapper's frame sits between the user and torch.
    extensions = sys.modules.get("typing_extensions")
    if getattr(extensions, "__file__", None):
        skip += (os.path.abspath(extensions.__file__),)

    # Asked for every frame between the user and dloss on every call: each
    # file's answer is worked out once.
    known = {}

    def test(filename):
        users = known.get(filename)
        if users is None:
            users = known[filename] = not os.path.abspath(filename).startswith(
                skip)
        return users
    return test


_FRAMEWORKS = ("lightning", "pytorch_lightning", "lightning_fabric")


def framework_dirs():
    """Directories of the frameworks that stand between the user and dloss
    and are loaded in this process (Lightning's packages), for `skip`.
    Called per collective under dloss.guard: the paths are worked out once
    per set of loaded frameworks."""
    import sys

    return _framework_dirs(tuple(name for name in _FRAMEWORKS
                                 if name in sys.modules))


@functools.lru_cache(maxsize=8)
def _framework_dirs(loaded):
    import os
    import sys

    dirs = []
    for name in loaded:
        module = sys.modules.get(name)
        if module is not None and getattr(module, "__file__", None):
            dirs.append(os.path.dirname(os.path.abspath(module.__file__)) +
                        os.sep)
    return tuple(dirs)


def split_stack(frame, skip=()):
    """(the innermost frame of the user's code (_is_users) at or above
    `frame`, or None; the frames inside it, innermost first)."""
    users = _is_users(tuple(skip))
    inner = []
    while frame is not None and not users(frame.f_code.co_filename):
        inner.append(frame)
        frame = frame.f_back
    return frame, inner


def user_frame(depth=2, skip=()):
    """(file, line) of the innermost frame of the user's code (_is_users),
    at least `depth` frames up; None when every frame is theirs."""
    import sys

    frame, _ = split_stack(sys._getframe(depth), skip)
    return (frame.f_code.co_filename, frame.f_lineno) if frame else None


def raised_at(traceback):
    """``file:line in function`` of the innermost frame of the user's code
    (_is_users) in an exception's `traceback`, where it was raised or, for
    an exception from dloss or torch, the user's call into them; "" when
    the traceback has no such frame."""
    users = _is_users()
    found = ""
    while traceback is not None:
        code = traceback.tb_frame.f_code
        if users(code.co_filename):
            found = "%s:%d in %s" % (code.co_filename, traceback.tb_lineno,
                                     code.co_name)
        traceback = traceback.tb_next
    return found


def caller_location(depth=2):
    """``file:line`` of the user's code that called into dloss (user_frame),
    or "" when unknown."""
    frame = user_frame(depth + 1)
    return "%s:%d" % frame if frame else ""


def is_dloss_location(location):
    """Whether an IR location is in dloss's own sources (the graphs of its
    drop-ins: "frontend/Losses.cpp:36", "dloss/losses.py:250", or a path in
    the installed package) rather than in the user's loss: the runtime's
    rule (runtime/comm/CallSite.h), which also locates such steps' records
    at the user's call."""
    from . import _C

    return bool(location) and _C.is_own_location(location)
