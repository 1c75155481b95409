"""Blocks of an installed vLLM method, cut out with ``ast`` and run unchanged.

A block is a run of statements of one method (found by what their source starts with), compiled
as a function of ``self`` and the method's locals it reads, against the method's own module
globals, so the code that runs is the installed tree's, never a copy. The function returns its
locals. Each block is identified by the sha256 of its ``ast.dump`` (positions excluded).
"""

from __future__ import annotations

import ast
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from contract.real import overlay


class BlockNotFound(Exception):
    """The installed method has no statement the block starts or ends with; one line."""


@dataclass(frozen=True)
class Block:
    path: str
    method: str
    first_line: int
    last_line: int
    digest: str
    function: Callable[..., dict]

    @property
    def where(self) -> str:
        return f"{self.path.split('site-packages/')[-1]}:{self.first_line}-{self.last_line}"

    def __call__(self, runner, **local_values) -> dict:
        return self.function(runner, **local_values)


def _method(tree: ast.Module, path: str, cls: str | None, method: str) -> ast.FunctionDef:
    """``cls.method``, or the module's function ``method`` where ``cls`` is None."""
    if cls is None:
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name == method:
                return node
        raise BlockNotFound(f"{path}: no function {method}")
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == method:
                    return item
            raise BlockNotFound(f"{path}: {cls} has no method {method}")
    raise BlockNotFound(f"{path}: no class {cls}")


def _index(body: list[ast.stmt], path: str, method: str, starts: str, contains: str = "") -> int:
    for i, stmt in enumerate(body):
        text = ast.unparse(stmt)
        if text.startswith(starts) and contains in text:
            return i
    raise BlockNotFound(f"{path}: {method} has no statement starting {starts!r}")


def _statements(path: str, cls: str | None, method: str, ranges: list[tuple[str, str | None]],
                contains: str) -> list[ast.stmt]:
    tree = ast.parse(Path(path).read_text(encoding="utf-8"), path)
    body = _method(tree, path, cls, method).body
    statements: list[ast.stmt] = []
    for first, last in ranges:
        i = _index(body, path, method, first, contains)
        j = i if last is None else _index(body[i:], path, method, last) + i
        statements += body[i : j + 1]
    return statements


def _dump(statements: list[ast.stmt]) -> str:
    return ast.dump(ast.Module(body=statements, type_ignores=[]))


def cut(module, cls: str | None, method: str, ranges: list[tuple[str, str | None]], args: tuple[str, ...],
        contains: str = "") -> Block:
    """The statements of ``cls.method`` (of the function ``method`` where ``cls`` is None) in the
    module's file from each range's first statement to its last (``None``: the first alone), as
    ``f(self, *args) -> locals()``. From a tree's module
    whose method a branch changed, and where these statements are not the release's, the block
    records the method as run (``contract/real/overlay.py``)."""
    path = module.__file__
    statements = _statements(path, cls, method, ranges, contains)

    def differ(installed) -> bool:
        try:
            return _dump(_statements(str(installed), cls, method, ranges, contains)) != _dump(statements)
        except (OSError, SyntaxError, BlockNotFound):
            return True

    qualname = method if cls is None else f"{cls}.{method}"
    mark = overlay.marks(module, qualname, differ)
    returns = ast.Return(value=ast.Call(func=ast.Name("locals", ast.Load()), args=[], keywords=[]))
    function = ast.FunctionDef(
        name=f"{method}_block",
        args=ast.arguments(posonlyargs=[], args=[ast.arg(arg="self")], vararg=None,
                           kwonlyargs=[ast.arg(arg=a) for a in args], kw_defaults=[None] * len(args),
                           kwarg=None, defaults=[]),
        body=[*([ast.copy_location(mark, statements[0])] if mark is not None else []), *statements, returns],
        decorator_list=[], returns=None, type_params=[],
    )
    ast.copy_location(function, statements[0])
    tree = ast.fix_missing_locations(ast.Module(body=[function], type_ignores=[]))
    namespace = vars(module)  # the block reads the module's globals live, as the method does
    local: dict = {}
    exec(compile(tree, path, "exec"), namespace, local)
    digest = hashlib.sha256(_dump(statements).encode()).hexdigest()
    return Block(path, qualname, statements[0].lineno,
                 statements[-1].end_lineno or statements[-1].lineno, digest, local[function.name])
