"""vLLM's own ``load_model`` wrapping block, read from the installed ``gpu_model_runner.py`` and run.

``GPUModelRunner.load_model`` ends with the rule that wraps ``self.model`` and ``drafter.model``
(``v1/worker/gpu_model_runner.py:5456-5495`` in 0.30.0, ``:5511-5541`` in 0.29.0): the statements
from ``cudagraph_mode = self.compilation_config.cudagraph_mode`` to the end of the method. They
are parsed with ``ast``, compiled as a function of ``self`` against the module's own globals
(``CUDAGraphMode``, the wrapper classes, ``is_breakable_cudagraph_enabled``, ``get_offloader``)
and called on a stand-in runner, so the rule that runs is the installed release's, never a copy.

The block is also identified: its ``ast.dump`` (positions excluded) is hashed and compared with
the revisions the policies model, so an unknown revision is reported instead of being mapped to
a policy by its version number alone.
"""

from __future__ import annotations

import ast
import hashlib
from dataclasses import dataclass
from pathlib import Path

from contract.real import overlay

FIRST_STATEMENT = "cudagraph_mode = self.compilation_config.cudagraph_mode"

# sha256 of ast.dump(ast.Module(block)) under Python 3.11 (the pinned venvs' interpreter) -> the
# release whose block it is and the policy modelling it. 0.33.0's block (:5128-5167) has the
# 0.30.0 digest.
KNOWN_REVISIONS = {
    "192dd1dfbce7efe71fd569e55f7c15a9e0ab38a23bdaa35ee9a3ea3f45bc6e63": ("0.29.0", "vllm_0_29"),
    "12208096cae6be8f97ee7a5542c614df2848d3a6f0f3836511bfc8c09ebc2be5": ("0.30.0", "vllm_0_30"),
}


@dataclass(frozen=True)
class WrappingBlock:
    path: str
    first_line: int
    last_line: int
    digest: str
    function: object  # load_model_wrapping(self)

    @property
    def revision(self) -> tuple[str, str] | None:
        """(release, policy) of the known revision this block is, or None."""
        return KNOWN_REVISIONS.get(self.digest)

    @property
    def where(self) -> str:
        path = self.path.split("site-packages/")[-1]
        return f"{path}:{self.first_line}-{self.last_line}"


class WrappingBlockNotFound(Exception):
    pass


def block_statements(source: str, path: str = "<gpu_model_runner.py>") -> list[ast.stmt]:
    tree = ast.parse(source, path)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "GPUModelRunner":
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "load_model":
                    for i, stmt in enumerate(item.body):
                        if ast.unparse(stmt) == FIRST_STATEMENT:
                            return item.body[i:]
                    raise WrappingBlockNotFound(f"{path}: load_model has no statement {FIRST_STATEMENT!r}")
            raise WrappingBlockNotFound(f"{path}: GPUModelRunner has no load_model")
    raise WrappingBlockNotFound(f"{path}: no class GPUModelRunner (no Model Runner V1 in this vLLM)")


def digest(statements: list[ast.stmt]) -> str:
    return hashlib.sha256(ast.dump(ast.Module(body=statements, type_ignores=[])).encode()).hexdigest()


def load(module) -> WrappingBlock:
    """The block of the imported ``vllm.v1.worker.gpu_model_runner`` module, ready to call."""
    path = module.__file__
    statements = block_statements(Path(path).read_text(encoding="utf-8"), path)

    def differ(installed) -> bool:  # the tree's block, not the release's: a change it runs
        try:
            return digest(block_statements(Path(installed).read_text(encoding="utf-8"))) != digest(statements)
        except (OSError, SyntaxError, WrappingBlockNotFound):
            return True

    mark = overlay.marks(module, "GPUModelRunner.load_model", differ)
    function = ast.FunctionDef(
        name="load_model_wrapping",
        args=ast.arguments(posonlyargs=[], args=[ast.arg(arg="self")], vararg=None, kwonlyargs=[],
                           kw_defaults=[], kwarg=None, defaults=[]),
        body=[*([ast.copy_location(mark, statements[0])] if mark is not None else []), *statements],
        decorator_list=[],
        returns=None,
        type_params=[],
    )
    ast.copy_location(function, statements[0])
    tree = ast.fix_missing_locations(ast.Module(body=[function], type_ignores=[]))
    namespace = dict(vars(module))  # the names the block reads are gpu_model_runner's globals
    exec(compile(tree, path, "exec"), namespace)
    return WrappingBlock(
        path=path,
        first_line=statements[0].lineno,
        last_line=statements[-1].end_lineno or statements[-1].lineno,
        digest=digest(statements),
        function=namespace["load_model_wrapping"],
    )
