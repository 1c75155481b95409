"""A vLLM tree with Model Runner V2 only (0.34 and later) as a policy: ``verify --vllm-src PATH``.

The release is read from ``CudaGraphManager.__init__`` (``v1/worker/gpu/cudagraph_utils.py``):
0.34.0 takes ``decode_query_lens`` (``34:…:166-176``), 0.33.0 ``decode_query_len`` (``33:…:151-160``).
The two rules that decide who captures PIECEWISE are read from the tree and run as the policy's
rules, so a branch that edits them is verified with its own expressions:

- ``self.use_breakable_cg = ...`` in ``CudaGraphManager.__init__`` (``34:…:228-231``);
- ``piecewise_capture_available = ...`` in ``GPUModelRunner.initialize_kv_cache``
  (``34:v1/worker/gpu/model_runner.py:783-786``).

Each expression is compiled as a function of the names it reads, bound to the scenario's answers;
an expression reading any other name is refused. Nothing is imported from the tree.
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import types
from pathlib import Path

from contract.core.modes import CUDAGraphMode
from contract.core.policy import Branch, BranchError
from contract.runners.mrv2.model.policies import built_in
from contract.runners.mrv2.model.policy import Mrv2Policy


MANAGER_FILE = "v1/worker/gpu/cudagraph_utils.py"
RUNNER_FILE = "v1/worker/gpu/model_runner.py"
# What verify --vllm-src reads of an MRV2 tree: (file, function) whose statements it reads.
READS = ((MANAGER_FILE, "CudaGraphManager.__init__"), (RUNNER_FILE, "GPUModelRunner.initialize_kv_cache"))

# The released expressions, as ast.dump of their source.
RELEASED = {
    "0.33": ("is_breakable_cudagraph_enabled() and self.cudagraph_mode.has_piecewise_cudagraphs()",
             "bool(envs.VLLM_USE_BREAKABLE_CUDAGRAPH or has_compiled_submodule(self.model))"),
    "0.34": ("is_breakable_cudagraph_enabled(self.compilation_config) and self.cudagraph_mode.has_piecewise_cudagraphs()",
             "bool(is_breakable_cudagraph_enabled(self.vllm_config.compilation_config) or has_compiled_submodule(self.model))"),
}
BOUND = {"is_breakable_cudagraph_enabled", "has_compiled_submodule", "envs", "self", "CUDAGraphMode"}


def _dump(source: str) -> str:
    return ast.dump(ast.parse(source, mode="eval").body)


def _parse(pkg: Path, rel: str) -> ast.Module:
    path = pkg / rel
    if not path.is_file():
        raise BranchError(f"{pkg}: no vllm/{rel}; --vllm-src reads it for Model Runner V2")
    try:
        return ast.parse(path.read_text(encoding="utf-8"), str(path))
    except (SyntaxError, UnicodeDecodeError, ValueError) as exc:
        raise BranchError(f"{path} cannot be parsed: {type(exc).__name__}: {exc}") from None


def _method(tree: ast.Module, cls: str, name: str) -> ast.FunctionDef | None:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    return item
    return None


def _assigned(method: ast.FunctionDef | None, target: str, where: str) -> ast.expr:
    """The value of the one assignment to ``target`` (``self.x`` or a local name) in ``method``."""
    found = []
    for node in ast.walk(method) if method is not None else ():
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            t = node.targets[0]
            name = f"self.{t.attr}" if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) \
                and t.value.id == "self" else getattr(t, "id", None)
            if name == target:
                found.append(node.value)
    if len(found) != 1:
        raise BranchError(f"{where}: expected one assignment to {target}, found {len(found)}")
    return found[0]


def _function(expr: ast.expr, path: str, where: str):
    names = {n.id for n in ast.walk(expr) if isinstance(n, ast.Name)} - set(dir(builtins))
    unknown = names - BOUND
    if unknown:
        raise BranchError(f"{where}: the expression reads {', '.join(sorted(unknown))}, which --vllm-src does not model")
    args = sorted(BOUND)
    lam = ast.Expression(ast.Lambda(
        args=ast.arguments(posonlyargs=[], args=[ast.arg(arg=a) for a in args], vararg=None, kwonlyargs=[],
                           kw_defaults=[], kwarg=None, defaults=[]), body=expr))
    ast.copy_location(lam.body, expr)
    return eval(compile(ast.fix_missing_locations(lam), path, "eval"), {"__builtins__": builtins}), args


def release_of(manager_tree: ast.Module, where: str) -> str:
    init = _method(manager_tree, "CudaGraphManager", "__init__")
    params = {a.arg for a in init.args.args} if init is not None else set()
    if "decode_query_lens" in params:
        return "0.34"
    if "decode_query_len" in params:
        return "0.33"
    raise BranchError(f"{where}: CudaGraphManager.__init__ takes neither decode_query_len (0.33) nor "
                      "decode_query_lens (0.34); this MRV2 revision is not modelled")


def load(pkg: Path, given: Path, *, as_policy: bool = False):
    """The tree as a policy: the release's built-in one when both rules are as released (unless
    ``as_policy``), else that release's policy with the tree's rules."""
    manager_path, runner_path = str(pkg / MANAGER_FILE), str(pkg / RUNNER_FILE)
    manager_tree, runner_tree = _parse(pkg, MANAGER_FILE), _parse(pkg, RUNNER_FILE)
    release = release_of(manager_tree, manager_path)
    breakable_expr = _assigned(_method(manager_tree, "CudaGraphManager", "__init__"), "self.use_breakable_cg",
                               f"{manager_path}: CudaGraphManager.__init__")
    available_expr = _assigned(_method(runner_tree, "GPUModelRunner", "initialize_kv_cache"),
                               "piecewise_capture_available", f"{runner_path}: GPUModelRunner.initialize_kv_cache")
    where = f"{manager_path}:{breakable_expr.lineno}, {runner_path}:{available_expr.lineno}"
    base: Mrv2Policy = built_in(f"mrv2_{release.replace('.', '_')}")
    released = tuple(_dump(s) for s in RELEASED[release])
    read = (ast.dump(breakable_expr), ast.dump(available_expr))
    rules = hashlib.sha256(repr((release, read)).encode()).hexdigest()
    if read == released and not as_policy:
        return Branch(base, where, f"{release}.0", given, pkg, rules, "Model Runner V2 rules")
    use_breakable_cg = _use_breakable_cg(*_function(breakable_expr, manager_path, where))
    available = _available(*_function(available_expr, runner_path, where))
    policy = base.mutate(f"branch@{given.resolve().name}",
                         f"the MRV2 rules of {pkg} (vLLM {release} layout), run as a policy",
                         use_breakable_cg=use_breakable_cg, piecewise_capture_available=available,
                         source=str(given))
    return Branch(policy, where, None, given, pkg, rules, "Model Runner V2 rules")


def _names(breakable: bool, mode: CUDAGraphMode, compiled: bool) -> dict:
    config = types.SimpleNamespace(use_breakable_cudagraph=breakable)
    return {
        "is_breakable_cudagraph_enabled": lambda *args, **kwargs: breakable,
        "has_compiled_submodule": lambda model: compiled,
        "envs": types.SimpleNamespace(VLLM_USE_BREAKABLE_CUDAGRAPH=breakable),
        "self": types.SimpleNamespace(cudagraph_mode=mode, compilation_config=config, model=object(),
                                      vllm_config=types.SimpleNamespace(compilation_config=config)),
        "CUDAGraphMode": CUDAGraphMode,
    }


def _use_breakable_cg(fn, args):
    def use_breakable_cg(breakable: bool, mode: CUDAGraphMode) -> bool:
        names = _names(breakable, mode, False)
        return bool(fn(*(names[a] for a in args)))
    return use_breakable_cg


def _available(fn, args):
    def piecewise_capture_available(breakable: bool, has_compiled_submodule: bool) -> bool:
        names = _names(breakable, CUDAGraphMode.NONE, has_compiled_submodule)
        return bool(fn(*(names[a] for a in args)))
    return piecewise_capture_available
