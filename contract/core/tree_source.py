"""A vLLM tree's Python files read with ``ast``, never imported: what each runner family's
``branch.py`` reads of a ``--vllm-src`` tree."""

from __future__ import annotations

import ast
from pathlib import Path

from contract.core.policy import BranchError


def parse(pkg: Path, rel: str, why: str) -> ast.Module:
    """``pkg/rel`` (``pkg`` the tree's ``vllm/``) parsed; one line when it is missing (``why`` says
    what needs it) or is not Python."""
    path = pkg / rel
    if not path.is_file():
        raise BranchError(f"{pkg}: no vllm/{rel}; --vllm-src reads it {why}")
    try:
        return ast.parse(path.read_text(encoding="utf-8"), str(path))
    except (SyntaxError, UnicodeDecodeError, ValueError) as exc:
        raise BranchError(f"{path} cannot be parsed: {type(exc).__name__}: {exc}") from None


def method(tree: ast.Module, cls: str, name: str) -> ast.FunctionDef | None:
    """``cls.name`` at the module's top level, or None."""
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    return item
    return None
