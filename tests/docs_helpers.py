"""Read the docs as the suite checks them: code blocks and their marks, links, headings' anchors.

The convention (docs/contributing.md): a fenced block's info string is its language, then its marks.

- ```` ```sh run ````: a shell script, run with bash (``set -euo pipefail``); it must exit 0.
- ```` ```console run ````: ``$ `` lines are commands, the lines after each its output, compared exactly
  (trailing spaces aside; a line ``...`` stands for any lines, ``...`` in a line for any text). Exit 2 is expected when the output shows a
  ``stagewise ...: error:`` line, else 0.
- ```` ```python run ````: a script, run with the suite's Python; multi-rank examples start their ranks
  themselves (``stagewise.launch``).
- ```` ```python signatures ```` (docs/api.md): each entry is checked against
  ``inspect.signature``.

Every block of one page runs in order in one scratch folder holding a copy of what the docs read
(``SCRATCH``), as a user would in the repository root. A block with no mark is only shown, but each
``stagewise`` command in it is still parsed by the CLI's own parser and each ``python DIR/FILE.py`` of the
repository must exist.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).parents[1]
#: the pages whose blocks run and whose links are checked
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: what the docs read, copied into each page's scratch folder (paths relative to the repository root)
SCRATCH = ("README.md", "data", "examples", "tests/data")

FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})(.*)$")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  #: 1-based line of the opening fence
    lang: str
    marks: tuple[str, ...]
    text: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """Every fenced code block of a Markdown page, in order."""
    out, lines, i = [], page.read_text().splitlines(), 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, info = m.groups()
        body, j = [], i + 1
        while j < len(lines) and not (lines[j].strip().startswith(fence) and lines[j].strip().strip(fence[0]) == ""):
            body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j].lstrip())
            j += 1
        words = info.split()
        out.append(Block(page, i + 1, words[0] if words else "", tuple(words[1:]), "\n".join(body) + "\n"))
        i = j + 1
    return out


def prose(page: Path) -> str:
    """The page without its code blocks (blank lines in their place, so line numbers stay)."""
    lines = page.read_text().splitlines()
    for b in blocks(page):
        for k in range(b.line - 1, b.line + b.text.count("\n") + 1):
            if k < len(lines):
                lines[k] = ""
    return "\n".join(lines)


# ---- console blocks: commands and the output shown

def console(text: str) -> list[tuple[str, list[str]]]:
    """(command, shown output lines) of each ``$ `` line of a console block; ``\\`` continues a command."""
    out: list[tuple[str, list[str]]] = []
    cont = False
    for line in text.splitlines():
        if cont:
            out[-1] = (out[-1][0] + "\n" + line, out[-1][1])
        elif line.startswith("$ "):
            out.append((line[2:], []))
        elif out:
            out[-1][1].append(line)
        cont = line.endswith("\\") and (cont or line.startswith("$ "))
    return out


def same_line(shown: str, got: str) -> bool:
    """Equal, or, where ``shown`` has ``...``, equal around it (a time, a run id: what changes between runs)."""
    if "..." not in shown:
        return shown == got
    return re.fullmatch(".*".join(map(re.escape, shown.split("..."))), got) is not None


def matches(shown: list[str], got: list[str]) -> bool:
    """``got`` equals ``shown`` line by line (trailing spaces aside); a shown ``...`` line matches any lines,
    ``...`` inside a line any text."""
    shown, got = [s.rstrip() for s in shown], [g.rstrip() for g in got]
    while shown and not shown[-1]:
        shown.pop()
    while got and not got[-1]:
        got.pop()

    def at(i: int, j: int) -> bool:
        if i == len(shown):
            return j == len(got)
        if shown[i] == "...":
            return any(at(i + 1, k) for k in range(j, len(got) + 1))
        return j < len(got) and same_line(shown[i], got[j]) and at(i + 1, j + 1)

    return at(0, 0)


def expected_rc(shown: list[str]) -> int:
    return 2 if any(re.match(r"stagewise( [\w-]+)?: error: ", s) for s in shown) else 0


# ---- shown (unmarked) blocks: commands a user may type

def commands(block: Block) -> list[str]:
    """The command lines of a shell or console block (continuations joined; output and comments left out)."""
    if block.lang == "console":
        return [c.replace("\\\n", " ") for c, _ in console(block.text)]
    text = re.sub(r"\\\n\s*", " ", block.text)
    return [ln for ln in (x.strip() for x in text.splitlines()) if ln and not ln.startswith("#")]


def stagewise_argv(command: str) -> list[list[str]]:
    """The arguments of each ``stagewise`` (or ``python -m stagewise``, ``torchrun ... -m stagewise``) call."""
    try:
        words = shlex.split(command, comments=True)
    except ValueError:
        return []
    out, i = [], 0
    while i < len(words):
        w = words[i]
        start = i + 1 if w == "stagewise" or w.endswith("/stagewise") else \
            i + 2 if w == "-m" and i + 1 < len(words) and words[i + 1] == "stagewise" else None
        if start is None:
            i += 1
            continue
        end = next((k for k in range(start, len(words)) if words[k] in ("|", "||", "&&", ";", ">", "2>&1")),
                   len(words))
        out.append(words[start:end])
        i = end
    return out


def python_files(command: str) -> list[str]:
    """The script of each ``python FILE.py`` call in a command."""
    words = shlex.split(command, comments=True) if command.count('"') % 2 == 0 else command.split()
    return [words[k + 1] for k, w in enumerate(words[:-1])
            if re.fullmatch(r"(\S*/)?python3?", w) and words[k + 1].endswith(".py")]


# ---- links and anchors

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def links(page: Path) -> list[tuple[int, str]]:
    """(line, target) of every Markdown link and image outside code blocks and inline code."""
    out = []
    for n, line in enumerate(prose(page).splitlines(), 1):
        line = re.sub(r"`[^`]*`", "", line)
        out += [(n, m.group(1)) for m in LINK.finditer(line)]
    return out


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped (not - or _), spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor (a repeated one gets -1, -2... as on GitHub), and explicit ``<a id=...>``."""
    seen: dict[str, int] = {}
    out = set()
    text = prose(page)
    for line in text.splitlines():
        m = HEADING.match(line)
        if not m:
            continue
        s = slug(m.group(2))
        out.add(s if s not in seen else f"{s}-{seen[s]}")
        seen[s] = seen.get(s, 0) + 1
    out |= set(re.findall(r"<a (?:id|name)=\"([^\"]+)\"", text))
    return out
