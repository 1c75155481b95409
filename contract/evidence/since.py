"""Since when a statement of vLLM's code has its current form, read from the releases' sources.

A statement found on one release (file under ``vllm/``, the enclosing function's qualname, its
lines) is looked up in every release whose source is at hand: the same function (in the same file,
or, where the file no longer defines it, the file of that release that does) holding a statement of
the same kind and the same normalised form (``ast.dump`` without positions: an ``if``/``elif``/
``while`` by its test, any other statement whole). The first release of the form is the oldest of
the unbroken run of releases, ending at the one it was found on, that hold it; *before* is the
release just before that run, *after* the first later release without the form, each with the
function's most similar statement there (``difflib`` on the unparsed statement) or a note where the
function or file is absent. Releases whose source is not at hand are listed as unchecked and do
not break a run.

Sources: ``.venv-vllm-<release>/lib/python*/site-packages/vllm`` under the project root, and any
folder named in ``CONTRACT_VLLM_SOURCES`` (``os.pathsep``-separated) holding ``<release>/vllm``
(a wheel's ``vllm/*.py`` unpacked there).
"""

from __future__ import annotations

import ast
import difflib
import functools
import os
from pathlib import Path

from contract.evidence.matrix import RELEASES

ENV = "CONTRACT_VLLM_SOURCES"


def sources(root: Path) -> dict[str, Path]:
    """release -> its ``vllm`` package folder, for every release whose source is at hand."""
    found: dict[str, Path] = {}
    for folder in filter(None, os.environ.get(ENV, "").split(os.pathsep)):
        for release in RELEASES:
            candidate = Path(folder) / release / "vllm"
            if candidate.is_dir():
                found[release] = candidate
    for release in RELEASES:
        for candidate in sorted((root / f".venv-vllm-{release}").glob("lib/python*/site-packages/vllm")):
            if candidate.is_dir():
                found[release] = candidate
    return found


@functools.lru_cache(maxsize=None)
def _tree(path: str) -> ast.Module | None:
    try:
        return ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None


def function(tree: ast.Module, qualname: str) -> ast.AST | None:
    """The ``def`` of ``qualname`` (``Class.method``, ``f.<locals>.g``) in a module."""
    parts = [p for p in qualname.split(".") if p != "<locals>"]
    nodes: list = [tree]
    for part in parts:
        nxt = []
        for node in nodes:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and child.name == part:
                    nxt.append(child)
        if not nxt:
            return None
        nodes = nxt
    found = [n for n in nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return found[-1] if found else None  # a redefinition wins, as at import


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def statements(fn: ast.AST) -> list[ast.stmt]:
    """The function's own statements, nested blocks included, nested functions excluded."""
    out, stack = [], list(fn.body)
    while stack:
        node = stack.pop()
        if isinstance(node, _SCOPES):
            continue
        out.append(node)
        for name in ("body", "orelse", "finalbody"):
            stack += [c for c in getattr(node, name, []) or [] if isinstance(c, ast.stmt)]
        for handler in getattr(node, "handlers", []) or []:
            stack += handler.body
        for case in getattr(node, "cases", []) or []:
            stack += case.body
    return sorted(out, key=lambda n: n.lineno)


def form(node: ast.stmt) -> str:
    """The normalised form: a compound statement by its header, any other statement whole."""
    if isinstance(node, (ast.If, ast.While)):
        return f"{type(node).__name__}:{ast.dump(node.test)}"
    if isinstance(node, (ast.For, ast.AsyncFor)):
        return f"For:{ast.dump(node.target)}:{ast.dump(node.iter)}"
    if isinstance(node, (ast.With, ast.AsyncWith)):
        return f"With:{ast.dump(ast.Tuple([i.context_expr for i in node.items], ast.Load()))}"
    if isinstance(node, (ast.Try,)):
        return "Try"
    return ast.dump(node)


def colon_line(node: ast.stmt, last: int, lines: list[str]) -> int:
    """The line holding a compound statement's ``:`` after its header expression ends on ``last``
    (a parenthesised condition closes on the next line): the header ends there."""
    body = getattr(node, "body", None)
    limit = body[0].lineno - 1 if body else last
    for number in range(last, max(limit, last) + 1):
        if lines[number - 1].split("#")[0].rstrip().endswith(":"):
            return number
    return last


def header(node: ast.stmt, lines: list[str]) -> tuple[int, int, str]:
    """(first line, last line, source) of the statement, a compound one by its header."""
    end = node.end_lineno
    if isinstance(node, (ast.If, ast.While)):
        end = colon_line(node, node.test.end_lineno, lines)
    elif isinstance(node, (ast.For, ast.AsyncFor)):
        end = colon_line(node, node.iter.end_lineno, lines)
    elif isinstance(node, (ast.With, ast.AsyncWith)):
        end = colon_line(node, node.items[-1].context_expr.end_lineno, lines)
    elif isinstance(node, ast.Try):
        end = node.lineno
    import textwrap

    return node.lineno, end, textwrap.dedent("".join(lines[node.lineno - 1:end])).rstrip()


def _text(node: ast.stmt) -> str:
    if isinstance(node, ast.If):
        return "if " + ast.unparse(node.test)
    if isinstance(node, ast.While):
        return "while " + ast.unparse(node.test)
    if isinstance(node, (ast.For, ast.AsyncFor, ast.With, ast.AsyncWith, ast.Try)):
        return ast.unparse(node).splitlines()[0]
    return ast.unparse(node)


@functools.lru_cache(maxsize=None)
def _index(package: Path) -> dict[str, set[Path]]:
    """Per class or function name, the files of a release that define it (read once per release)."""
    import re

    out: dict[str, set[Path]] = {}
    pattern = re.compile(r"^\s*(?:class|def|async def)\s+(\w+)", re.MULTILINE)
    for path in package.rglob("*.py"):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        for name in set(pattern.findall(text)):
            out.setdefault(name, set()).add(path)
    return out


def _files_defining(package: Path, qualname: str) -> list[Path]:
    """Files of a release that define both the outermost and innermost names of ``qualname``."""
    parts = [p for p in qualname.split(".") if p != "<locals>"]
    index = _index(package)
    return sorted(index.get(parts[0], set()) & index.get(parts[-1], set()))


def locate(package: Path, path: str, qualname: str) -> tuple[str, ast.AST, list[str]] | str:
    """(path under the package, the function's ``def``, the file's lines), or why not."""
    candidates = [package / path] + [p for p in _files_defining(package, qualname) if p != package / path]
    for candidate in candidates:
        if not candidate.is_file():
            continue
        tree = _tree(str(candidate))
        fn = function(tree, qualname) if tree is not None else None
        if fn is not None:
            lines = candidate.read_text(encoding="utf-8").splitlines(keepends=True)
            return candidate.relative_to(package).as_posix(), fn, lines
    if not (package / path).is_file():
        return f"{path} does not exist and no file defines {qualname}"
    return f"{path} has no {qualname}"


def find(package: Path, path: str, qualname: str, first_line: int) -> tuple[ast.stmt, list[str]] | None:
    """The statement starting at ``first_line`` in ``qualname`` of that release."""
    got = locate(package, path, qualname)
    if isinstance(got, str):
        return None
    _, fn, lines = got
    for node in statements(fn):
        if node.lineno == first_line:
            return node, lines
    return None


def _entry(release: str, package: Path, path: str, qualname: str, wanted: str, text: str) -> dict:
    """The release's statement of ``wanted`` form, or its most similar one, or a note."""
    got = locate(package, path, qualname)
    if isinstance(got, str):
        return {"release": release, "present": False, "note": got}
    where, fn, lines = got
    nodes = statements(fn)
    for node in nodes:
        if form(node) == wanted:
            first, last, source = header(node, lines)
            return {"release": release, "present": True, "path": where, "lines": [first, last], "text": source}
    best, ratio = None, 0.0
    kind = wanted.split(":")[0] if ":" in wanted and not wanted.startswith(("Assign(", "Expr(")) else None
    same = [n for n in nodes if type(n).__name__ == kind] if kind else []
    for node in same or nodes:  # a statement of the same kind (an `if` for an `if`) when there is one
        r = difflib.SequenceMatcher(None, text, _text(node)).ratio()
        if r > ratio:
            best, ratio = node, r
    if best is None:
        return {"release": release, "present": False, "note": f"{qualname} has no statements"}
    first, last, source = header(best, lines)
    return {"release": release, "present": False, "path": where, "lines": [first, last], "text": source,
            "similarity": round(ratio, 2)}


def since(release: str, path: str, qualname: str, lines: list[int], releases: dict[str, Path]) -> dict | None:
    """The history of one statement (module docstring); None where it cannot be read on ``release``."""
    if release not in releases:
        return None
    found = find(releases[release], path, qualname, lines[0])
    if found is None:
        return None
    node, _ = found
    wanted, text = form(node), _text(node)
    order = list(RELEASES)
    at = order.index(release)
    history = {r: _entry(r, releases[r], path, qualname, wanted, text) for r in order if r in releases}
    unchecked = [r for r in order if r not in releases]
    first, before = release, None
    for r in reversed(order[:at]):
        if r not in history:
            continue
        if history[r]["present"]:
            first = r
        else:
            before = history[r]
            break
    last, after = release, None
    for r in order[at + 1:]:
        if r not in history:
            continue
        if history[r]["present"]:
            last = r
        else:
            after = history[r]
            break
    return {"function": qualname, "first": first, "before": before, "last": last, "after": after,
            "oldest": next(r for r in order if r in releases), "unchecked": unchecked,
            "history": {r: {k: v for k, v in h.items() if k != "text"} for r, h in history.items()}}
