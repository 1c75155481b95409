"""What a vLLM tree changes against the release it is compared with: files, and in each changed
Python file the functions (by qualified name) whose code differs.

Both sides are read as text and ``ast``; nothing is imported. A function is changed when its
``ast`` differs (comments, blank lines and moves within the file are not changes); statements
outside any function (imports, module constants, class attributes) are reported as the file's
module level.

A tree is data from a person: only regular files are read (a FIFO, a device or a socket in it, or a
link to one, is refused before it is opened), a Python file larger than ``MAX_SOURCE`` is refused,
other files are digested in chunks, and reading stops after ``TIME_LIMIT_S``. Each refusal, and a
file or folder that cannot be read, is a ``TreeReadError``: one line.
"""

from __future__ import annotations

import ast
import hashlib
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from contract.core.policy import BranchError

MAX_SOURCE = 16 << 20  # vLLM's largest Python file is a few hundred KiB
TIME_LIMIT_S = 300.0


class TreeReadError(BranchError):
    """A file or folder of a tree that is not read: not a regular file, too large, unreadable, or the
    reading ran out of time; one line."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder")):
        if test(mode):
            return name
    return "not a regular file"


def _open(path: Path) -> int:
    """A descriptor of ``path`` once it is known to be a regular file (followed through links,
    opened without blocking so a FIFO cannot hold the reader)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise TreeReadError(f"{path} cannot be read: {exc.strerror or exc}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise TreeReadError(f"{path} is {_kind(mode)}, not a regular file; a vLLM tree holds regular files only")
    return fd


def read_bytes(path: Path, limit: int = MAX_SOURCE) -> bytes:
    """The content of a regular file of at most ``limit`` bytes."""
    fd = _open(path)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise TreeReadError(f"{path} is {size >> 20} MiB; a source file of vLLM's is far smaller (at most "
                                f"{limit >> 20} MiB is read)")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
    except OSError as exc:
        raise TreeReadError(f"{path} cannot be read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise TreeReadError(f"{path} grew past {limit >> 20} MiB while it was read")
    return data

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


class _Clock:
    def __init__(self, what: Path):
        self.what, self.deadline = what, time.monotonic() + TIME_LIMIT_S

    def check(self) -> None:
        if time.monotonic() > self.deadline:
            raise TreeReadError(f"reading {self.what} took longer than {TIME_LIMIT_S:g} s; pass a vLLM source tree")


def _unreadable(exc: OSError) -> None:
    raise TreeReadError(f"{exc.filename} cannot be read: {exc.strerror or exc}")


def _files(pkg: Path, clock: _Clock) -> dict[str, Path]:
    out = {}
    for root, dirs, names in os.walk(pkg, onerror=_unreadable):
        clock.check()
        dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
        for name in names:
            if name.endswith((".pyc", ".so")) or name.startswith("."):
                continue
            path = Path(root) / name
            out[path.relative_to(pkg).as_posix()] = path
    return out


def _digest(path: Path, clock: _Clock | None = None) -> str:
    """The sha256 of a regular file, read in chunks."""
    h = hashlib.sha256()
    fd = _open(path)
    try:
        while chunk := os.read(fd, 1 << 20):
            h.update(chunk)
            if clock is not None:
                clock.check()
    except OSError as exc:
        raise TreeReadError(f"{path} cannot be read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    return h.hexdigest()


def _open_regular(path: Path) -> None:
    """A file only one side has is still one the tree may hold: a regular file."""
    os.close(_open(path))


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError as exc:
        raise TreeReadError(f"{path} cannot be read: {exc.strerror or exc}") from None


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
        mine = ast.parse(read_bytes(tree_file).decode("utf-8"))
        theirs = ast.parse(read_bytes(base_file).decode("utf-8"))
    except (SyntaxError, UnicodeDecodeError, ValueError, RecursionError, MemoryError) as exc:
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
    clock = _Clock(tree_pkg)
    mine, theirs = _files(tree_pkg, clock), _files(base_pkg, clock)
    changes = []
    for path in sorted(set(mine) | set(theirs)):
        clock.check()
        if path not in theirs:
            _open_regular(mine[path])
            changes.append(FileChange(path, ADDED))
        elif path not in mine:
            changes.append(FileChange(path, REMOVED))
        elif _size(mine[path]) != _size(theirs[path]) or _digest(mine[path], clock) != _digest(theirs[path], clock):
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
        if os.path.lexists(a) != os.path.lexists(b) or (os.path.lexists(a) and _digest(a) != _digest(b)):
            n += 1
    return n
