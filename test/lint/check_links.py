"""The `links` test: every relative link in the documentation resolves.

Reads every Markdown file git tracks (README.md, CONTRIBUTING.md, docs/, the
folders' READMEs) and checks each link that is not a URL:

- its path exists, inside the repository (a link out of it breaks in every
  clone and on every package index);
- its `#anchor`, in this file or in another Markdown file, is one of that
  file's headings as GitHub writes its anchors (lower case, punctuation
  dropped, spaces as hyphens, `-1`, `-2` for repeats).

Links inside fenced code blocks and inline code are not links.

    python test/lint/check_links.py
"""
import functools
import re
import sys
from urllib.parse import unquote

from tracked import ROOT, tracked

# [text](target) and [text](target "title"); images too. The text may hold
# one level of brackets ([`x[0]`](...)).
INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
# [label]: target
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s{0,3}(```|~~~)")


def outside_fences(text):
    """(line number, line) of the lines outside fenced code blocks."""
    fence = None
    for number, line in enumerate(text.splitlines(), 1):
        match = FENCE.match(line)
        if match:
            if fence is None:
                fence = match.group(1)
            elif match.group(1) == fence:
                fence = None
        elif fence is None:
            yield number, line


def prose_lines(text):
    """outside_fences, with inline code blanked."""
    for number, line in outside_fences(text):
        yield number, re.sub(r"(`+)(?:(?!\1).)+?\1", lambda m: " " * len(m.group(0)), line)


def slug(heading):
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = re.sub(r"<[^>]+>", "", text).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@functools.lru_cache(maxsize=None)
def anchors(path):
    """The anchors of a Markdown file's headings, repeats numbered."""
    found, seen = set(), {}
    for _, line in outside_fences(path.read_text()):
        match = HEADING.match(line)
        if match:
            base = slug(match.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else "%s-%d" % (base, count))
    return found


def problems_in(doc):
    path = ROOT / doc
    out = []
    for number, line in prose_lines(path.read_text()):
        targets = [m.group(1) for m in INLINE.finditer(line)]
        match = REFERENCE.match(line)
        if match:
            targets.append(match.group(1))
        for target in targets:
            if not target or re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
                continue  # a URL (https:, mailto:)
            where = "%s:%d: [..](%s)" % (doc, number, target)
            file_part, _, anchor = target.partition("#")
            resolved = (path.parent / unquote(file_part)).resolve() if file_part else path
            try:
                resolved.relative_to(ROOT)
            except ValueError:
                out.append("%s leads out of the repository: link to a file inside it" % where)
                continue
            if not resolved.exists():
                out.append("%s: %s does not exist: fix the path" % (where, file_part))
                continue
            if anchor and resolved.suffix == ".md" and resolved.is_file():
                if unquote(anchor).lower() not in anchors(resolved):
                    out.append("%s: %s has no heading with the anchor #%s: link to one of "
                               "its headings" % (where, resolved.relative_to(ROOT), anchor))
    return out


def main():
    docs = tracked(suffixes=(".md",))
    problems = [p for doc in docs for p in problems_in(doc)]
    if problems:
        print("\n".join("links: " + p for p in problems))
        print("links: %d broken link(s) in %d Markdown files" % (len(problems), len(docs)))
        return 1
    print("links: every relative link in the %d Markdown files resolves" % len(docs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
