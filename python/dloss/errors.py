"""dloss.Error: how every dloss failure reaches Python."""

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


def caller_location(depth=2):
    """``file:line`` of the user's code that called into dloss: the first
    frame outside the dloss package, at least `depth` frames up."""
    import os
    import sys

    package = os.path.dirname(os.path.abspath(__file__))
    frame = sys._getframe(depth)
    while frame is not None and os.path.dirname(
            os.path.abspath(frame.f_code.co_filename)) == package:
        frame = frame.f_back
    if frame is None:
        return ""
    return "%s:%d" % (frame.f_code.co_filename, frame.f_lineno)
