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


def _sentence(text):
    text = text.strip()
    return text if text.endswith((".", "!", "?")) else text + "."


def make_error(problem, hint="", rank=None, op="", location=""):
    """A dloss.Error rendered as the C++ runtime renders its errors."""
    where = []
    if rank is not None:
        where.append("rank %d" % rank)
    if op and location:
        where.append("op %s at %s" % (op, location))
    elif op:
        where.append("op " + op)
    elif location:
        where.append("at " + location)
    message = "dloss error"
    if where:
        message += " [" + ", ".join(where) + "]"
    message += ": " + _sentence(problem)
    if hint:
        message += " " + _sentence(hint)
    error = Error(message)
    error.problem, error.hint, error.rank = problem, hint, rank
    error.op, error.location = op, location
    return error


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
