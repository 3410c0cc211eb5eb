"""The `hints` test: a hint is a capitalised sentence (runtime/support/Error.h).

A dloss error has a problem ("input 'x' has 3 dims, expected 2") and a hint, what
to do about it ("Pass a [batch, dim] tensor"). This finds every hint written as
a string literal that starts with a lower-case letter, in the places where an
argument is a hint by its position:

- C++: `Error(problem, hint)`, `ErrorInfo{problem, hint, ...}`,
  `GraphError{message, hint, ...}`, `.withHint(hint)`, the two-argument
  `fail(problem, hint)` (runtime/support/Error.h, fused/FusedArgs.h) and the
  four-argument `fail(op, at, what, hint)` (compiler/GraphBuilder.cpp);
- Python: `make_error(problem, hint, ...)`, `fail(problem, hint, loc)`
  (python/dloss/_trace/locations.py), `hint=` and names ending in `_HINT`.

Either branch of a conditional hint counts. A hint built from a variable is not
seen; a literal found is always a hint, so the test has no false alarms.

    python test/lint/check_hints.py
"""
import ast
import re
import sys

from tracked import ROOT, tracked

# Product code: tests make lower-case hints on purpose (ErrorTest).
FOLDERS = ("runtime/", "frontend/", "compiler/", "tools/", "python/", "driver/",
           "report/", "passes/", "dialect/", "bench/")
CPP_SUFFIXES = (".cpp", ".h", ".cu", ".cuh")

# Callee -> {number of arguments (None: any): which one is the hint}.
CPP_HINT = {"Error": {2: 1}, "ErrorInfo": {None: 1}, "GraphError": {None: 1},
            "withHint": {1: 0}, "fail": {2: 1, 4: 3}}
CPP_CALL = re.compile(r"(?<![\w:])(?:dloss::)?(Error|ErrorInfo|GraphError|fail|"
                      r"withHint)\s*[({]")
LITERAL = re.compile(r'"((?:[^"\\]|\\.)*)"')


def without_comments(text):
    """C++ text with comments blanked (newlines kept), strings untouched."""
    out, i, n = [], 0, len(text)
    while i < n:
        if text.startswith("//", i):
            end = text.find("\n", i)
            i = n if end < 0 else end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append("\n" * text.count("\n", i, end))
            i = end
        elif text[i] == '"' or (text[i] == "'" and not text[i - 1:i].isalnum()):
            quote, j = text[i], i + 1
            while j < n and text[j] != quote:
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def arguments(text, open_at):
    """The top-level arguments of the call whose bracket is at `open_at`."""
    args, current, depth, i = [], [], 0, open_at
    while i < len(text):
        c = text[i]
        if c in "\"'" and not (c == "'" and text[i - 1:i].isalnum()):
            j = i + 1
            while j < len(text) and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            current.append(text[i:j + 1])
            i = j + 1
            continue
        if c in "([{":
            depth += 1
            if depth == 1:
                i += 1
                continue
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                args.append("".join(current))
                return args
        elif c == "," and depth == 1:
            args.append("".join(current))
            current = []
            i += 1
            continue
        current.append(c)
        i += 1
    return args


def leading_literals(expression):
    """The literals a C++ hint expression can start with: its own, or each
    branch's of a conditional (`cond ? "a" : "b" + x`)."""
    expression = expression.strip()
    branches = [expression]
    # A top-level conditional: split at its `?` and `:` outside strings.
    depth, question, colon, i = 0, -1, -1, 0
    while i < len(expression):
        c = expression[i]
        if c == '"':
            j = i + 1
            while j < len(expression) and expression[j] != '"':
                j += 2 if expression[j] == "\\" else 1
            i = j + 1
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif depth == 0 and c == "?" and question < 0:
            question = i
        elif (depth == 0 and c == ":" and question >= 0 and colon < 0
              and expression[i - 1] != ":" and expression[i + 1:i + 2] != ":"):
            colon = i
        i += 1
    if question >= 0 and colon > question:
        branches = [expression[question + 1:colon], expression[colon + 1:]]
    found = []
    for branch in branches:
        branch = re.sub(r"^\(*\s*(?:std::string\s*\(\s*)?", "", branch.strip())
        match = LITERAL.match(branch)
        if match:
            found.append(match.group(1))
    return found


def cpp_hints(path):
    """(path:line, literal) of every hint literal in a C++ file."""
    text = without_comments((ROOT / path).read_text(errors="replace"))
    for match in CPP_CALL.finditer(text):
        args = arguments(text, match.end() - 1)
        positions = CPP_HINT[match.group(1)]
        where = positions.get(len(args), positions.get(None))
        if where is None or len(args) <= where:
            continue
        line = text.count("\n", 0, match.start()) + 1
        for literal in leading_literals(args[where]):
            yield "%s:%d" % (path, line), literal


def python_leading(node):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr) and node.values:
        first = node.values[0]
        return [first.value] if isinstance(first, ast.Constant) else []
    if isinstance(node, ast.BinOp):
        return python_leading(node.left)
    if isinstance(node, ast.IfExp):
        return python_leading(node.body) + python_leading(node.orelse)
    return []


def python_hints(path):
    """(path:line, literal) of every hint literal in a Python file."""
    tree = ast.parse((ROOT / path).read_text(), filename=path)
    for node in ast.walk(tree):
        hints = []
        if isinstance(node, ast.Call):
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            if name in ("make_error", "fail") and len(node.args) >= 2:
                hints.append(node.args[1])
            hints += [k.value for k in node.keywords if k.arg == "hint"]
        elif isinstance(node, ast.Assign):
            if any(getattr(t, "id", "").endswith("_HINT") for t in node.targets):
                hints.append(node.value)
        for hint in hints:
            for literal in python_leading(hint):
                yield "%s:%d" % (path, node.lineno), literal


# Fewer hint literals than this means the patterns above stopped matching
# the code (the tree holds about 80), not that the hints are fine.
MIN_HINTS = 50


def main():
    hints = []
    for path in tracked(FOLDERS, CPP_SUFFIXES):
        hints += cpp_hints(path)
    for path in tracked(FOLDERS, (".py",)):
        hints += python_hints(path)
    problems = ["%s: %s" % (where, literal) for where, literal in hints
                if literal[:1].islower()]
    for problem in problems:
        print("hints: %s: a hint starts with a lower-case letter; write it as a "
              "capitalised sentence (runtime/support/Error.h)" % problem)
    if problems:
        print("hints: %d hint(s) to capitalise" % len(problems))
        return 1
    if len(hints) < MIN_HINTS:
        print("hints: found only %d hint literals, fewer than %d: the patterns "
              "in test/lint/check_hints.py no longer match how errors are "
              "raised; update them" % (len(hints), MIN_HINTS))
        return 1
    print("hints: all %d hint literals are capitalised sentences" % len(hints))
    return 0

if __name__ == "__main__":
    sys.exit(main())
