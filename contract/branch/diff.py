"""What a vLLM tree changes against the release it is compared with: files, and in each changed
Python file the functions (by qualified name) whose code differs.

Both sides are read as text and ``ast``; nothing is imported. A function is changed when its
``ast`` differs (comments, blank lines and moves within the file are not changes); statements
outside any function (imports, module constants, class attributes) are reported as the file's
module level.
"""

from __future__ import annotations

import ast
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

CHANGED, ADDED, REMOVED = "changed", "added", "removed"


@dataclass(frozen=True)
class FunctionChange:
    qualname: str  # "GPUModelRunner.initialize_kv_cache"
    kind: str  # changed, added, removed
    lines: tuple[int, int]  # in the tree; in the base for a removed function


@dataclass(frozen=True)
class FileChange:
    path: str  # relative to vllm/, with "/"
    kind: str
    functions: tuple[FunctionChange, ...] = ()
    module_level: bool = False  # statements outside functions differ
    unparsed: str = ""  # why the file could not be compared function by function

    @property
    def module(self) -> str:
        """The dotted module name (``vllm.v1.worker.gpu.cudagraph_utils``)."""
        stem = self.path[:-3] if self.path.endswith(".py") else self.path
        parts = ["vllm", *stem.split("/")]
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@dataclass(frozen=True)
class TreeDiff:
    files: tuple[FileChange, ...]

    @property
    def python(self) -> tuple[FileChange, ...]:
        return tuple(f for f in self.files if f.path.endswith(".py"))

    def functions(self) -> list[tuple[str, FunctionChange]]:
        return [(f.path, fn) for f in self.python for fn in f.functions]

    def summary(self) -> str:
        """``3 files differ (2 Python files, 4 functions)``."""
        if not self.files:
            return "no file differs"
        n_py, n_fn = len(self.python), len(self.functions())
        return (f"{len(self.files)} file{'s' if len(self.files) != 1 else ''} differ{'s' if len(self.files) == 1 else ''}"
                f" ({n_py} Python file{'s' if n_py != 1 else ''}, {n_fn} function{'s' if n_fn != 1 else ''})")


def _files(pkg: Path) -> dict[str, Path]:
    out = {}
    for root, dirs, names in os.walk(pkg):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
        for name in names:
            if name.endswith((".pyc", ".so")) or name.startswith("."):
                continue
            path = Path(root) / name
            out[path.relative_to(pkg).as_posix()] = path
    return out


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _defs(tree: ast.Module) -> dict[str, ast.AST]:
    """Every function by qualified name (methods as ``Class.method``, nested as ``f.<locals>.g``)."""
    found: dict[str, ast.AST] = {}

    def walk(body, prefix: str) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{node.name}"
                found[name] = node
                walk(node.body, f"{name}.<locals>.")
            elif isinstance(node, ast.ClassDef):
                walk(node.body, f"{prefix}{node.name}.")

    walk(tree.body, "")
    return found


def _shape(node: ast.AST) -> str:
    return ast.dump(node, annotate_fields=False, include_attributes=False)


def _module_level(tree: ast.Module) -> str:
    """The file without its function bodies: imports, constants, class attributes, signatures."""
    class Strip(ast.NodeTransformer):
        def visit_FunctionDef(self, node):
            return ast.Pass()

        visit_AsyncFunctionDef = visit_FunctionDef

    return _shape(Strip().visit(ast.parse(ast.unparse(tree))))


def _span(node: ast.AST) -> tuple[int, int]:
    first = min([d.lineno for d in getattr(node, "decorator_list", [])] + [node.lineno])
    return first, node.end_lineno or node.lineno


def _compare_python(path: str, tree_file: Path, base_file: Path) -> FileChange:
    try:
        mine = ast.parse(tree_file.read_text(encoding="utf-8"))
        theirs = ast.parse(base_file.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, ValueError) as exc:
        return FileChange(path, CHANGED, unparsed=f"{type(exc).__name__}: {exc}".splitlines()[0])
    a, b = _defs(mine), _defs(theirs)
    functions = []
    for name, node in a.items():
        if name not in b:
            functions.append(FunctionChange(name, ADDED, _span(node)))
        elif _shape(node) != _shape(b[name]):
            functions.append(FunctionChange(name, CHANGED, _span(node)))
    functions += [FunctionChange(name, REMOVED, _span(node)) for name, node in b.items() if name not in a]
    return FileChange(path, CHANGED, tuple(functions), _module_level(mine) != _module_level(theirs))


def compare(tree_pkg: Path, base_pkg: Path) -> TreeDiff:
    """The files of ``tree_pkg`` (a tree's ``vllm/``) that differ from ``base_pkg`` (the release's)."""
    mine, theirs = _files(tree_pkg), _files(base_pkg)
    changes = []
    for path in sorted(set(mine) | set(theirs)):
        if path not in theirs:
            changes.append(FileChange(path, ADDED))
        elif path not in mine:
            changes.append(FileChange(path, REMOVED))
        elif mine[path].stat().st_size != theirs[path].stat().st_size or _digest(mine[path]) != _digest(theirs[path]):
            if path.endswith(".py"):
                change = _compare_python(path, mine[path], theirs[path])
                if change.functions or change.module_level or change.unparsed:
                    changes.append(change)
            else:
                changes.append(FileChange(path, CHANGED))
    return TreeDiff(tuple(changes))


def count_differing(tree_pkg: Path, base_pkg: Path, paths: tuple[str, ...]) -> int:
    """How many of ``paths`` (relative to ``vllm/``) differ byte for byte between the two packages
    (a file missing on one side differs): cheap enough to compare a tree with every release."""
    n = 0
    for rel in paths:
        a, b = tree_pkg / rel, base_pkg / rel
        if a.is_file() != b.is_file() or (a.is_file() and _digest(a) != _digest(b)):
            n += 1
    return n
