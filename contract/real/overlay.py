"""A vLLM source tree run on an installed release: the tree's Python modules replace the release's
where they differ, everything else (compiled extensions, unchanged modules) is the release's.

``conform --vllm-src PATH --base 0.30.0`` replays the corpus twice in ``.venv-vllm-0.30.0``: once
as installed, once with this finder on ``sys.meta_path``, so a branch's edit to resolve, the
dispatcher, the wrappers or ``load_model`` runs as vLLM's own code. A module is taken from the tree
only when its bytes differ from the installed file, so an unedited copy replays the release exactly.

The functions a branch changes (``watch``: file under ``vllm/`` -> qualified names, as
``contract/branch/diff.py`` names them) get one statement first in their body, after the
docstring, that records the function as run (``reached``); nothing else of the tree's code
changes, its line numbers included. A change no replayed trace runs is then said, never taken for a
change that changes nothing.
"""

from __future__ import annotations

import ast
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from pathlib import Path

ENV = "CONTRACT_VLLM_SRC"
MARK = "__cudagraph_contract_reached__"


class _Marker(ast.NodeTransformer):
    """Puts ``MARK("qualname")`` first in every watched function's body."""

    def __init__(self, watched: set[str]):
        self.watched, self.prefix = watched, []

    def _visit_def(self, node):
        qualname = ".".join(self.prefix + [node.name])
        self.prefix.append(f"{node.name}.<locals>")
        self.generic_visit(node)
        self.prefix.pop()
        if qualname in self.watched:
            body = node.body
            first = 1 if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
                and isinstance(body[0].value.value, str) else 0
            at = body[first] if first < len(body) else body[-1]
            call = ast.Expr(ast.Call(ast.Name(MARK, ast.Load()), [ast.Constant(qualname)], []))
            node.body = body[:first] + [ast.copy_location(call, at)] + body[first:]
            ast.fix_missing_locations(node)
        return node

    visit_FunctionDef = visit_AsyncFunctionDef = _visit_def

    def visit_ClassDef(self, node):
        self.prefix.append(node.name)
        self.generic_visit(node)
        self.prefix.pop()
        return node


class _WatchingLoader(importlib.machinery.SourceFileLoader):
    """Loads a tree's module with its watched functions marked (``_Marker``). ``installed``, the
    release's file, lets code that runs part of a method (``contract/runners/mrv2/real/blocks.py``)
    tell whether that part is what the tree changed (``marks``)."""

    def __init__(self, fullname: str, path: str, watched: set[str], reached, installed: Path):
        super().__init__(fullname, path)
        self.watched, self.reached, self.installed = watched, reached, installed

    def source_to_code(self, data, path, *, _optimize=-1):
        tree = _Marker(self.watched).visit(ast.parse(data, filename=path))
        return compile(tree, path, "exec", dont_inherit=True, optimize=_optimize)

    def exec_module(self, module) -> None:
        module.__dict__[MARK] = self.reached.add
        super().exec_module(module)


class TreeFinder(importlib.abc.MetaPathFinder):
    def __init__(self, tree_pkg: Path, installed_pkg: Path, watch: dict[str, list[str]] | None = None):
        self.tree, self.installed = tree_pkg, installed_pkg
        self.taken: list[str] = []  # modules loaded from the tree, for the run's report
        self.watch = {path: set(names) for path, names in (watch or {}).items()}
        self.reached: set[str] = set()  # "path:qualname" of the watched functions that ran

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith("vllm."):
            return None
        parts = fullname.split(".")[1:]
        candidate = self.tree.joinpath(*parts).with_suffix(".py")
        if not candidate.is_file():
            return None
        installed = self.installed.joinpath(*parts).with_suffix(".py")
        if installed.is_file() and installed.read_bytes() == candidate.read_bytes():
            return None
        self.taken.append(fullname)
        rel = candidate.relative_to(self.tree).as_posix()
        if self.watch.get(rel):
            reached = _Prefixed(self.reached, rel)
            loader = _WatchingLoader(fullname, str(candidate), self.watch[rel], reached, installed)
            return importlib.util.spec_from_file_location(fullname, candidate, loader=loader)
        return importlib.util.spec_from_file_location(fullname, candidate)


class _Prefixed:
    """``add(qualname)`` records ``"path:qualname"`` in ``into``."""

    def __init__(self, into: set[str], path: str):
        self.into, self.path = into, path

    def add(self, qualname: str) -> None:
        self.into.add(f"{self.path}:{qualname}")


def install(tree_pkg: Path, watch: dict[str, list[str]] | None = None) -> TreeFinder:
    """Put the differing modules of the tree's ``vllm/`` package ahead of the installed release
    (before vLLM is imported), with ``watch``'s functions marked."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("vLLM is not installed in this environment")
    sys.dont_write_bytecode = True  # the tree is the person's: it gets no __pycache__ of ours
    finder = TreeFinder(Path(tree_pkg), Path(list(spec.submodule_search_locations)[0]), watch)
    sys.meta_path.insert(0, finder)
    return finder


def installed() -> TreeFinder | None:
    """The tree finder this process runs under, if any: what a process it starts must install too
    (``contract/real/ranks.py``)."""
    return next((f for f in sys.meta_path if isinstance(f, TreeFinder)), None)


def marks(module, qualname: str, statements_differ) -> ast.stmt | None:
    """The statement recording ``qualname`` as run, for code that runs part of a watched function
    from the tree's file itself: when ``statements_differ(installed_file)`` says that part is not
    the release's. None for a module of the release, an unwatched function or an unchanged part."""
    loader = getattr(getattr(module, "__spec__", None), "loader", None)
    if not isinstance(loader, _WatchingLoader) or qualname not in loader.watched:
        return None
    if not statements_differ(loader.installed):
        return None
    return ast.Expr(ast.Call(ast.Name(MARK, ast.Load()), [ast.Constant(qualname)], []))
