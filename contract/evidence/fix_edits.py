"""The statements of vLLM's code a root cause's patch edits: its deciding lines.

For each hunk of a patch (``fixes/<id>/vllm-<release>.patch``), the first line it changes in the
release's file (a removed line; for lines only added, the line they follow) and the innermost
statement of that file covering it, read with ``ast`` from the release's source
(``since.sources``): its first line, its text and the function that holds it. A patch that adds
arguments to a call edits the call; one that adds an ``if`` before a statement edits the statement
it follows.

``python -m contract.evidence.fix_edits`` writes them into every ``fix.json`` (``fix_edits``:
release -> edits, in the patch's order); ``tests/test_root_causes.py`` checks they are current and
that each lies inside its patch's hunks.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from contract.core.output import write_atomic
from contract.evidence.since import sources

ROOT = Path(__file__).resolve().parents[2]
TEXT = 110  # characters of a statement's text kept, on one line
HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+\d+(?:,\d+)? @@")


@dataclass(frozen=True)
class Hunk:
    path: str  # under vllm/
    old_start: int
    old_count: int
    first_change: int  # the old-file line the hunk first changes, or the line an addition follows


@dataclass(frozen=True)
class Edit:
    path: str
    function: str  # the enclosing def's qualname; "" at module level
    line: int  # the statement's first line in the release's file
    end: int  # its last line
    text: str  # its header (a compound statement's up to the colon), on one line


def hunks(patch_text: str) -> list[Hunk]:
    """The hunks of a unified diff, each with the first old-file line it removes, or, where it
    only adds, the line its first addition follows."""
    out: list[Hunk] = []
    path, old, start, count, removed, added = "", 0, 0, 0, None, None

    def close():
        if path and (removed or added) is not None:
            out.append(Hunk(path, start, count, removed if removed is not None else added))

    for line in patch_text.splitlines():
        if line.startswith("+++ "):
            close()
            path = line[4:].split("\t")[0].strip().removeprefix("b/").removeprefix("vllm/")
            removed = added = None
            continue
        m = HUNK.match(line)
        if m:
            close()
            start, count = int(m.group(1)), int(m.group(2) or 1)
            old, removed, added = start, None, None
            continue
        if line.startswith("--- ") or not path:
            continue
        if line.startswith("-"):
            removed = old if removed is None else removed
            old += 1
        elif line.startswith("+"):
            added = max(old - 1, start) if added is None else added
        else:
            old += 1
    close()
    return out


def _innermost(tree: ast.AST, line: int, owner: str = "", in_function: bool = False) -> tuple[ast.stmt | None, str]:
    """The innermost statement (not a ``def`` or ``class``) covering ``line``, and the qualname of
    the function holding it."""
    for node in ast.iter_child_nodes(tree):
        if not isinstance(node, ast.stmt) or not node.lineno <= line <= (node.end_lineno or node.lineno):
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = f"{owner}{'.<locals>' if in_function else ''}.{node.name}".lstrip(".")
            return _innermost(node, line, name, not isinstance(node, ast.ClassDef))
        inner, inner_owner = _innermost(node, line, owner, in_function)
        return (inner, inner_owner) if inner is not None else (node, owner)
    return None, owner


def edits(patch_text: str, package: Path) -> list[Edit]:
    """The statements the patch edits in the release whose ``vllm`` package is ``package``."""
    out: list[Edit] = []
    for h in hunks(patch_text):
        source = (package / h.path).read_text(encoding="utf-8")
        node, owner = _innermost(ast.parse(source), h.first_change)
        if node is None:
            continue
        body = getattr(node, "body", None)
        last = body[0].lineno - 1 if isinstance(body, list) and body else node.end_lineno or node.lineno
        text = " ".join(" ".join(source.splitlines()[node.lineno - 1:last]).split())
        text = text.replace("( ", "(").replace(" )", ")")
        edit = Edit(h.path, owner, node.lineno, node.end_lineno or node.lineno,
                    text if len(text) <= TEXT else text[:TEXT - 3] + "...")
        if edit not in out:
            out.append(edit)
    return out


def inside(edit: Edit, patch_text: str) -> bool:
    """Whether the statement overlaps a hunk of the patch on its file."""
    return any(h.path == edit.path and edit.line < h.old_start + max(h.old_count, 1) and h.old_start <= edit.end
               for h in hunks(patch_text))


def computed(folder: Path, found: dict[str, Path]) -> dict[str, list[dict]]:
    """release -> the edits of the folder's patch for it, for the releases whose source is at hand."""
    data = json.loads((folder / "fix.json").read_text(encoding="utf-8"))
    out = {}
    for release, name in sorted(data.get("patches", {}).items()):
        if release in found:
            out[release] = [asdict(e) for e in edits((folder / name).read_text(encoding="utf-8"), found[release])]
    return out


def main(argv: list[str]) -> int:
    found = sources(ROOT)
    for path in sorted((ROOT / "fixes").glob("*/fix.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        data["fix_edits"] = computed(path.parent, found)
        write_atomic(path, json.dumps(data, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
