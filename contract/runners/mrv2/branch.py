"""A vLLM tree with Model Runner V2 only (0.34 and later) as a policy: ``verify --vllm-src PATH``.

The release is read from ``CudaGraphManager.__init__`` (``v1/worker/gpu/cudagraph_utils.py``):
0.34.0 takes ``decode_query_lens`` (``34:…:166-176``), 0.33.0 ``decode_query_len`` (``33:…:151-160``).
The two rules that decide who captures PIECEWISE are read from the tree and run as the policy's
rules, so a branch that edits them is verified with its own expressions:

- ``self.use_breakable_cg = ...`` in ``CudaGraphManager.__init__`` (``34:…:228-231``);
- ``piecewise_capture_available = ...`` in ``GPUModelRunner.initialize_kv_cache``
  (``34:v1/worker/gpu/model_runner.py:783-786``).

Each expression is compiled as a function of the names it reads, bound to the scenario's answers;
an expression reading any other name is refused. The expressions run only in a child process
(``contract.core.child``), over every input the model asks (``use_breakable_cg``: breakable x the
five modes; ``piecewise_capture_available``: breakable x ``has_compiled_submodule``), and the parent
runs the checked tables: an expression that exits, hangs or forks is one line. Nothing is imported
from the tree.
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import types
from pathlib import Path

from contract.core import child
from contract.core.modes import CUDAGraphMode
from contract.core.tree_source import method as _method
from contract.core.tree_source import parse as _parse_file
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


def _check_names(expr: ast.expr, where: str) -> None:
    names = {n.id for n in ast.walk(expr) if isinstance(n, ast.Name)} - set(dir(builtins))
    unknown = names - BOUND
    if unknown:
        raise BranchError(f"{where}: the expression reads {', '.join(sorted(unknown))}, which --vllm-src does not model")


def _function(expr: ast.expr, path: str):
    """The expression as a function of ``BOUND``'s names (in the child: creating it runs none of it)."""
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


def _expressions(manager_tree: ast.Module, runner_tree: ast.Module, manager_path: str,
                 runner_path: str) -> tuple[ast.expr, ast.expr]:
    breakable_expr = _assigned(_method(manager_tree, "CudaGraphManager", "__init__"), "self.use_breakable_cg",
                               f"{manager_path}: CudaGraphManager.__init__")
    available_expr = _assigned(_method(runner_tree, "GPUModelRunner", "initialize_kv_cache"),
                               "piecewise_capture_available", f"{runner_path}: GPUModelRunner.initialize_kv_cache")
    return breakable_expr, available_expr


def load(pkg: Path, given: Path, *, as_policy: bool = False):
    """The tree as a policy: the release's built-in one when both rules are as released (unless
    ``as_policy``), else that release's policy with the tree's rules, as tables computed in a child."""
    manager_path, runner_path = str(pkg / MANAGER_FILE), str(pkg / RUNNER_FILE)
    manager_tree, runner_tree = _parse(pkg, MANAGER_FILE), _parse(pkg, RUNNER_FILE)
    release = release_of(manager_tree, manager_path)
    breakable_expr, available_expr = _expressions(manager_tree, runner_tree, manager_path, runner_path)
    where = f"{manager_path}:{breakable_expr.lineno}, {runner_path}:{available_expr.lineno}"
    base: Mrv2Policy = built_in(f"mrv2_{release.replace('.', '_')}")
    released = tuple(_dump(s) for s in RELEASED[release])
    read = (ast.dump(breakable_expr), ast.dump(available_expr))
    rules = hashlib.sha256(repr((release, read)).encode()).hexdigest()
    if read == released and not as_policy:
        return Branch(base, where, f"{release}.0", given, pkg, rules, "Model Runner V2 rules")
    _check_names(breakable_expr, where)
    _check_names(available_expr, where)
    use_breakable_cg, available = _tables(pkg, manager_path, runner_path, where)
    policy = base.mutate(f"branch@{given.resolve().name}",
                         f"the MRV2 rules of {pkg} (vLLM {release} layout), run as a policy",
                         use_breakable_cg=use_breakable_cg, piecewise_capture_available=available,
                         source=str(given))
    return Branch(policy, where, None, given, pkg, rules, "Model Runner V2 rules")


# The inputs each rule is asked for: use_breakable_cg(breakable, cudagraph_mode) and
# piecewise_capture_available(breakable, has_compiled_submodule).
BREAKABLE_INPUTS = [(b, m) for b in (False, True) for m in CUDAGraphMode]
AVAILABLE_INPUTS = [(b, c) for b in (False, True) for c in (False, True)]


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


def rule_tables(payload: dict) -> dict:
    """In a child (``contract.core.child``): both expressions of the tree evaluated for every input,
    ``{"problem": one line}`` when one raises or forks."""
    forked = child.refuse_forks()
    paths = payload["manager_path"], payload["runner_path"]
    trees = [ast.parse(payload[key], path) for key, path in zip(("manager_source", "runner_source"), paths)]
    breakable_expr, available_expr = _expressions(*trees, *paths)
    out: dict = {}
    for rule, expr, path, inputs, names in (
            ("use_breakable_cg", breakable_expr, paths[0], BREAKABLE_INPUTS, lambda b, m: _names(b, m, False)),
            ("piecewise_capture_available", available_expr, paths[1], AVAILABLE_INPUTS,
             lambda b, c: _names(b, CUDAGraphMode.NONE, c))):
        fn, args = _function(expr, path)
        rows = []
        for a, b in inputs:
            bound = names(a, b)
            try:
                value = bool(fn(*(bound[n] for n in args)))
            except BaseException as exc:  # noqa: BLE001 - the tree's code: any failure is its message
                return {"problem": f"{rule} = ... raised {child.error_text(exc)} for ({a}, {getattr(b, 'name', b)})"}
            if forked():
                return {"problem": f"{rule} = ... forked a process; the expression must not start processes"}
            rows.append([a, getattr(b, "name", b), value])
        out[rule] = rows
    return out


class RuleTable:
    """A rule of the tree read from its checked table: ``(breakable, x) -> bool``."""

    def __init__(self, rule: str, rows: dict):
        self.rule, self.rows = rule, rows

    def __call__(self, breakable: bool, other) -> bool:
        return self.rows[(bool(breakable), other)]

    def __repr__(self) -> str:
        return f"RuleTable({self.rule})"


def _checked(rule: str, rows: object, inputs: list, what: str) -> RuleTable:
    want = [[a, getattr(b, "name", b)] for a, b in inputs]
    if (not isinstance(rows, list) or len(rows) != len(inputs)
            or any(not isinstance(r, list) or len(r) != 3 or type(r[2]) is not bool for r in rows)
            or sorted(map(repr, (r[:2] for r in rows))) != sorted(map(repr, want))):
        raise BranchError(f"{what} reported a {rule} table that is not one bool per input")
    by_json = {repr(r[:2]): r[2] for r in rows}
    return RuleTable(rule, {(a, b): by_json[repr([a, getattr(b, "name", b)])] for a, b in inputs})


def _tables(pkg: Path, manager_path: str, runner_path: str, where: str) -> tuple[RuleTable, RuleTable]:
    what = f"the Model Runner V2 rules {where}"
    payload = {"manager_path": manager_path, "runner_path": runner_path,
               "manager_source": (pkg / MANAGER_FILE).read_text(encoding="utf-8"),
               "runner_source": (pkg / RUNNER_FILE).read_text(encoding="utf-8")}
    try:
        value = child.run("contract.runners.mrv2.branch:rule_tables", payload, what=what,
                          timeout=child.time_limit()).value
        if not isinstance(value, dict):
            raise child.ChildProblem(f"{what} reported no tables")
        if "problem" in value:
            problem = value["problem"] if isinstance(value["problem"], str) else repr(value["problem"])
            raise child.ChildProblem(f"{what}: {problem[:1000]}")
    except child.ChildProblem as exc:
        raise BranchError(f"{exc}; each rule must be an expression giving a bool") from None
    return (_checked("use_breakable_cg", value.get("use_breakable_cg"), BREAKABLE_INPUTS, what),
            _checked("piecewise_capture_available", value.get("piecewise_capture_available"), AVAILABLE_INPUTS, what))


def _parse(pkg: Path, rel: str):
    return _parse_file(pkg, rel, "for Model Runner V2")
