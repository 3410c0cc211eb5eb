"""The `layout` test: CONTRIBUTING.md's layout table names every source file's job.

The table (CONTRIBUTING.md, `## Layout`) has one row per folder, `| \\`folder/\\` | what |`.
Each source file git tracks under the code folders must be named, in backticks,
in the row of the deepest folder that holds it: by its name (`Plan.fbs`), its
stem (`Executor` for Executor.h and Executor.cpp), brace form
(`ShapeFunctions.{h,cpp}`) or a path from the folder (`cuda/FusedTiles.cu`).
A row that names a file with a source suffix that no longer exists fails too,
as does a row for a folder that is gone.

    python test/lint/check_layout.py
"""
import re
import sys

from tracked import ROOT, tracked

# The folders whose every file has its job in the table.
CODE = ("dialect/", "passes/", "driver/", "compiler/", "report/", "runtime/",
        "frontend/", "python/", "tools/", "cmake/", "scripts/")
SUFFIXES = (".cpp", ".h", ".cu", ".cuh", ".py", ".td", ".fbs", ".sh", ".cmake",
            ".inc", ".in")
# The document that holds the table.
TABLE = "CONTRIBUTING.md"
# Build glue, not a job of its own.
EXEMPT = ("CMakeLists.txt",)


def table():
    """{folder: row text} from CONTRIBUTING.md's layout table."""
    text = (ROOT / TABLE).read_text()
    start = text.find("\n## Layout")
    if start < 0:
        sys.exit("layout: %s has no `## Layout` section" % TABLE)
    end = text.find("\n## ", start + 1)
    rows = {}
    for line in text[start:end].splitlines():
        cells = line.split("|")
        if len(cells) < 4 or not cells[1].strip().startswith("`"):
            continue
        folders = re.findall(r"`([^`]+/)`", cells[1])
        if len(folders) != 1:
            sys.exit("layout: %s's row `%s` must name one folder, as `folder/`"
                     % (TABLE, cells[1].strip()))
        rows[folders[0]] = "|".join(cells[2:])
    return rows


def names(row):
    """The backticked names of a row, braces expanded."""
    out = set()
    for token in re.findall(r"`([^`]+)`", row):
        token = token.strip()
        match = re.fullmatch(r"(.*)\{([^}]*)\}(.*)", token)
        if match:
            out.update(match.group(1) + part + match.group(3)
                       for part in match.group(2).split(","))
        else:
            out.add(token)
    return out


def listed_in(path, folder, known):
    inner = path[len(folder):]
    name = inner.rsplit("/", 1)[-1]
    stem = name.split(".", 1)[0]
    return bool({inner, name, stem} & known)


def main():
    rows = table()
    files = tracked()
    problems = []
    for folder in rows:
        if not (ROOT / folder).is_dir():
            problems.append("the row `%s` names a folder that does not exist: "
                            "remove the row" % folder)
    for path in files:
        if not path.startswith(CODE) or path.rsplit("/", 1)[-1] in EXEMPT:
            continue
        owners = [f for f in rows if path.startswith(f)]
        if not owners:
            problems.append("%s: no row for its folder: add `| `%s` | ... |`"
                            % (path, path.rsplit("/", 1)[0] + "/"))
            continue
        folder = max(owners, key=len)
        if not listed_in(path, folder, names(rows[folder])):
            problems.append("%s: not named in the row `%s`: say its job there, as `%s`"
                            % (path, folder, path[len(folder):].rsplit("/", 1)[-1]))
    for folder, row in rows.items():
        inside = [p[len(folder):] for p in files if p.startswith(folder)]
        for name in sorted(names(row)):
            if not name.endswith(SUFFIXES) or " " in name or name.startswith(("-", "$")):
                continue
            if not any(p == name or p.endswith("/" + name) for p in inside):
                problems.append("the row `%s` names `%s`, which is not in %s: "
                                "fix or remove it" % (folder, name, folder))
    if problems:
        print("\n".join("layout: " + p for p in problems))
        print("layout: %d problem(s) in %s's layout table" % (len(problems), TABLE))
        return 1
    print("layout: " + TABLE + "'s layout table names all %d files of its %d folders"
          % (sum(1 for p in files if p.startswith(CODE)), len(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
