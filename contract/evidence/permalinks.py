"""The GitHub permalinks the pages cite, read back and checked against the releases' sources.

A permalink is ``https://github.com/vllm-project/vllm/blob/v<release>/vllm/<path>#L<a>[-L<b>]``. Its
*label* is what the page says the range is:

- **a function**: the link text is a code span holding a name (``[`VllmBackend.__call__`](…)``), or
  the link's text is a location and a code span holding a name stands right before it
  (``- `CudagraphDispatcher.dispatch` [`v1/cudagraph_dispatcher.py:235-324`](…)``). Such a range
  must start at that function's ``def`` or its first decorator;
- **a statement range** or **a block**: anything else, e.g. ``[`_dummy_run`, lines 6204-6213 (the
  `use_cudagraphs` condition)](…)`` or ``- `GPUModelRunner.load_model` (wrapping block) [`…`](…)``:
  only the range itself is checked (it exists in the file).
"""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass
from pathlib import Path

URL = re.compile(r"https://github\.com/vllm-project/vllm/blob/v(?P<release>\d+\.\d+\.\d+)/vllm/(?P<path>[^#\s)]+)"
                 r"#L(?P<first>\d+)(?:-L(?P<last>\d+))?")
LINK = re.compile(r"\[(?P<text>(?:[^\[\]]|\[[^\]]*\])*)\]\((?P<url>https://github\.com/vllm-project/vllm/blob/[^)\s]+)\)")
NAME = re.compile(r"`(?P<name>[A-Za-z_][\w]*(?:\.[A-Za-z_<>][\w<>]*)*)`")
BEFORE = re.compile(r"`(?P<name>[A-Za-z_][\w]*(?:\.[A-Za-z_][\w]*)*)`\s*$")


@dataclass(frozen=True)
class Permalink:
    file: str  # the page
    line: int
    text: str  # the link text ("" for a bare URL)
    release: str
    path: str  # under vllm/
    first: int
    last: int
    function: str | None  # the function the page says the range is, if it says one

    @property
    def url(self) -> str:
        return f"https://github.com/vllm-project/vllm/blob/v{self.release}/vllm/{self.path}#L{self.first}-L{self.last}"


def parse(text: str, file: str = "") -> list[Permalink]:
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        spans = []
        for m in LINK.finditer(line):
            spans.append((m.start("url"), m.end("url")))
            u = URL.match(m.group("url"))
            if u is None:
                continue
            function = None
            label = m.group("text").strip()
            whole = NAME.fullmatch(label)
            if whole:
                function = whole.group("name")
            elif re.fullmatch(r"`[^`]*:\d+(?:-\d+)?`", label):  # a location: the name stands before it
                before = BEFORE.search(line[: m.start()])
                if before:
                    function = before.group("name")
            first = int(u.group("first"))
            out.append(Permalink(file, number, label, u.group("release"), u.group("path"), first,
                                 int(u.group("last") or first), function))
        for u in URL.finditer(line):
            if not any(a <= u.start() < b for a, b in spans):  # a bare URL
                first = int(u.group("first"))
                out.append(Permalink(file, number, "", u.group("release"), u.group("path"), first,
                                     int(u.group("last") or first), None))
    return out


def pages(root: Path) -> list[Path]:
    """reports/**/*.md, README.md and docs/**/*.md."""
    found = sorted((root / "reports").rglob("*.md")) + sorted((root / "docs").rglob("*.md"))
    return ([root / "README.md"] if (root / "README.md").is_file() else []) + found


def collect(root: Path) -> list[Permalink]:
    out = []
    for page in pages(root):
        out += parse(page.read_text(encoding="utf-8"), page.relative_to(root).as_posix())
    return out


@functools.lru_cache(maxsize=None)
def _defs(filename: str) -> tuple[int, dict[str, list[tuple[int, int, int]]]]:
    """(number of lines, qualname -> [(first decorator line, def line, last line)])."""
    text = Path(filename).read_text(encoding="utf-8")
    tree = ast.parse(text)
    out: dict[str, list] = {}

    def walk(node, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                first = min([d.lineno for d in child.decorator_list] + [child.lineno])
                out.setdefault(name, []).append((first, child.lineno, child.end_lineno))
                walk(child, name + ".<locals>.")
            elif isinstance(child, ast.ClassDef):
                walk(child, prefix + child.name + ".")
            else:
                walk(child, prefix)

    walk(tree, "")
    return len(text.splitlines()), out


def problem(link: Permalink, package: Path) -> str | None:
    """Why the link is wrong against that release's source, or None."""
    filename = package / link.path
    if not filename.is_file():
        return f"{link.path} does not exist in {link.release}"
    count, defs = _defs(str(filename))
    if not 1 <= link.first <= link.last <= count:
        return f"lines {link.first}-{link.last} are outside {link.path} ({count} lines) in {link.release}"
    if link.function is None:
        return None
    spans = [s for name, found in defs.items() for s in found
             if name == link.function or name.endswith("." + link.function)]
    if not spans:
        return f"{link.path} defines no {link.function} in {link.release}"
    if any(link.first in (first, line) for first, line, _ in spans):
        return None
    holding = [s for s in spans if s[0] <= link.first <= s[2]]
    where = f"starts inside it at line {link.first}, its def is at line {holding[0][0]}" if holding \
        else f"starts at line {link.first}, its def is at line {spans[0][0]}"
    return f"labelled `{link.function}` but {where}"
