"""Where in the user's code: every op, value and error of a @dloss.loss
trace carries the user's (file, line), and every error names it."""

import linecache

from ..errors import make_error, user_frame


def _user_location():
    """(file, line) of the innermost frame outside torch and dloss."""
    return user_frame(2) or ("<unknown>", 0)


def _text(loc):
    return "%s:%d" % loc


def _code(loc):
    line = linecache.getline(loc[0], loc[1]).strip()
    return "`%s`" % line if line else "this line"


def fail(problem, hint, loc, op=""):
    raise make_error(problem, hint, op=op, location=_text(loc))
