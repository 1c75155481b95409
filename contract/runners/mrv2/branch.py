"""A vLLM tree with Model Runner V2 only (0.34 and later) as a policy: ``verify --vllm-src PATH``.

The release is read from ``CudaGraphManager.__init__`` (``v1/worker/gpu/cudagraph_utils.py``):
0.34.0 takes ``decode_query_lens`` (``34:…:166-176``), 0.33.0 ``decode_query_len`` (``33:…:151-160``).
The two rules that decide who captures PIECEWISE, and resolve's Mamba check, are read from the tree
and run as the policy's rules, so a branch that edits them is verified with its own expressions:

- ``self.use_breakable_cg = ...`` in ``CudaGraphManager.__init__`` (``34:…:228-231``);
- ``piecewise_capture_available = ...`` in ``GPUModelRunner.initialize_kv_cache``
  (``34:v1/worker/gpu/model_runner.py:783-786``);
- the test of resolve's Mamba check, the ``if`` of ``CompilationConfig.resolve_cudagraph_mode_and_sizes``
  that reads ``has_mamba_layers`` and raises (``34:config/compilation.py:1659-1681``); a tree without
  one never refuses a hybrid model's FULL graphs;
- ``CudaGraphManager._maybe_ubatch_twin``, a method rather than an expression (``branch_ubatch.py``).

Each expression is compiled as a function of the names it reads, bound to the scenario's answers;
an expression reading any other name is refused. The expressions run only in a child process
(``contract.core.child``), over every input the model asks (``use_breakable_cg``: breakable x the
five modes; ``piecewise_capture_available``: breakable x ``has_compiled_submodule``; the Mamba check:
the five modes x no Mamba layer or 1..``MAX_NUM_SEQS`` blocks x profiling or not), and the parent
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
from contract.core.scenario import MAX_NUM_SEQS
from contract.runners.mrv2 import branch_ubatch
from contract.runners.mrv2.model.policies import built_in
from contract.runners.mrv2.model.policy import Mrv2Policy


MANAGER_FILE = "v1/worker/gpu/cudagraph_utils.py"
RUNNER_FILE = "v1/worker/gpu/model_runner.py"
COMPILATION_FILE = "config/compilation.py"
RESOLVE = ("CompilationConfig", "resolve_cudagraph_mode_and_sizes")
# What verify --vllm-src reads of an MRV2 tree: (file, function) whose statements it reads.
READS = ((MANAGER_FILE, "CudaGraphManager.__init__"), (RUNNER_FILE, "GPUModelRunner.initialize_kv_cache"),
         (COMPILATION_FILE, ".".join(RESOLVE)), (MANAGER_FILE, ".".join(branch_ubatch.TWIN)))

# The released expressions, as ast.dump of their source.
RELEASED = {
    "0.33": ("is_breakable_cudagraph_enabled() and self.cudagraph_mode.has_piecewise_cudagraphs()",
             "bool(envs.VLLM_USE_BREAKABLE_CUDAGRAPH or has_compiled_submodule(self.model))"),
    "0.34": ("is_breakable_cudagraph_enabled(self.compilation_config) and self.cudagraph_mode.has_piecewise_cudagraphs()",
             "bool(is_breakable_cudagraph_enabled(self.vllm_config.compilation_config) or has_compiled_submodule(self.model))"),
}
BOUND = {"is_breakable_cudagraph_enabled", "has_compiled_submodule", "envs", "self", "CUDAGraphMode"}
# Resolve's Mamba check, the same in 0.33.0 and 0.34.0 (33:config/compilation.py:1517-1524, 34:…:1666-1673)
MAMBA_RELEASED = ("kv_cache_config is not None and max_num_reqs is not None and cudagraph_mode.has_full_cudagraphs() "
                  "and not is_profiling and kv_cache_config.has_mamba_layers "
                  "and max_num_reqs > kv_cache_config.num_blocks")
MAMBA_BOUND = {"kv_cache_config", "max_num_reqs", "cudagraph_mode", "is_profiling", "self", "CUDAGraphMode"}


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


def _check_names(expr: ast.expr, where: str, bound: set[str] = BOUND) -> None:
    names = {n.id for n in ast.walk(expr) if isinstance(n, ast.Name)} - set(dir(builtins))
    unknown = names - bound
    if unknown:
        raise BranchError(f"{where}: the expression reads {', '.join(sorted(unknown))}, which --vllm-src does not model")


def _function(expr: ast.expr, path: str, bound: set[str] = BOUND):
    """The expression as a function of ``bound``'s names (in the child: creating it runs none of it)."""
    args = sorted(bound)
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


def _mamba_check(tree: ast.Module, path: str) -> ast.expr | None:
    """The test of the ``if`` in resolve that reads ``has_mamba_layers`` and raises; None when there is none."""
    resolve = _method(tree, *RESOLVE)
    if resolve is None:
        raise BranchError(f"{path}: no {'.'.join(RESOLVE)}; --vllm-src reads its Mamba check")
    found = [node.test for node in ast.walk(resolve) if isinstance(node, ast.If)
             and any(isinstance(n, ast.Raise) for stmt in node.body for n in ast.walk(stmt))
             and any(isinstance(n, ast.Attribute) and n.attr == "has_mamba_layers" for n in ast.walk(node.test))]
    if len(found) > 1:
        raise BranchError(f"{path}: {'.'.join(RESOLVE)} has {len(found)} raising checks of has_mamba_layers; "
                          "--vllm-src reads one")
    return found[0] if found else None


def load(pkg: Path, given: Path, *, as_policy: bool = False):
    """The tree as a policy: the release's built-in one when its three rules are as released (unless
    ``as_policy``), else that release's policy with the tree's rules, as tables computed in a child."""
    manager_path, runner_path = str(pkg / MANAGER_FILE), str(pkg / RUNNER_FILE)
    compilation_path = str(pkg / COMPILATION_FILE)
    manager_tree, runner_tree = _parse(pkg, MANAGER_FILE), _parse(pkg, RUNNER_FILE)
    release = release_of(manager_tree, manager_path)
    breakable_expr, available_expr = _expressions(manager_tree, runner_tree, manager_path, runner_path)
    mamba_expr = _mamba_check(_parse(pkg, COMPILATION_FILE), compilation_path)
    where = (f"{manager_path}:{breakable_expr.lineno}, {runner_path}:{available_expr.lineno}, "
             + (f"{compilation_path}:{mamba_expr.lineno}" if mamba_expr is not None
                else f"{compilation_path} (no Mamba check)"))
    base: Mrv2Policy = built_in(f"mrv2_{release.replace('.', '_')}")
    released = (*(_dump(s) for s in RELEASED[release]), _dump(MAMBA_RELEASED))
    read = (ast.dump(breakable_expr), ast.dump(available_expr), None if mamba_expr is None else ast.dump(mamba_expr))
    twin = branch_ubatch.read(manager_tree)
    rules = hashlib.sha256(repr((release, read) + ((twin,) if twin is not None else ())).encode()).hexdigest()
    if read == released and branch_ubatch.as_released(twin) and not as_policy:
        return Branch(base, where, f"{release}.0", given, pkg, rules, "Model Runner V2 rules")
    _check_names(breakable_expr, where)
    _check_names(available_expr, where)
    if mamba_expr is not None:
        _check_names(mamba_expr, where, MAMBA_BOUND)
    read_twin = not branch_ubatch.as_released(twin)
    if read_twin:
        branch_ubatch.check_names(manager_tree, manager_path)
        where += f", {manager_path}:{_method(manager_tree, *branch_ubatch.TWIN).lineno}"
    use_breakable_cg, available, mamba, twin_table = _tables(pkg, manager_path, runner_path, compilation_path, where,
                                                             read_twin)
    policy = base.mutate(f"branch@{given.resolve().name}",
                         f"the MRV2 rules of {pkg} (vLLM {release} layout), run as a policy",
                         use_breakable_cg=use_breakable_cg, piecewise_capture_available=available,
                         mamba_blocks_rejected=mamba, source=str(given),
                         **({"ubatch_twin": twin_table} if twin_table is not None else {}))
    return Branch(policy, where, None, given, pkg, rules, "Model Runner V2 rules")


# The inputs each rule is asked for: use_breakable_cg(breakable, cudagraph_mode) and
# piecewise_capture_available(breakable, has_compiled_submodule).
BREAKABLE_INPUTS = [(b, m) for b in (False, True) for m in CUDAGraphMode]
AVAILABLE_INPUTS = [(b, c) for b in (False, True) for c in (False, True)]
# The Mamba check's: (resolved cudagraph_mode, mamba_cache_blocks, is_profiling) at max_num_seqs MAX_NUM_SEQS.
MAMBA_INPUTS = [(m, blocks, p) for m in CUDAGraphMode for blocks in (None, *range(1, MAX_NUM_SEQS + 1))
                for p in (False, True)]


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


def _mamba_names(mode: CUDAGraphMode, blocks: int | None, is_profiling: bool) -> dict:
    return {"kv_cache_config": types.SimpleNamespace(has_mamba_layers=blocks is not None, num_blocks=blocks or 0),
            "max_num_reqs": MAX_NUM_SEQS, "cudagraph_mode": mode, "is_profiling": is_profiling,
            "self": types.SimpleNamespace(), "CUDAGraphMode": CUDAGraphMode}


def _mamba_rows(payload: dict) -> list | str:
    """The tree's Mamba check for every input (all False where the tree has none); a problem's line."""
    path = payload["compilation_path"]
    expr = _mamba_check(ast.parse(payload["compilation_source"], path), path)
    if expr is None:
        return [[m.name, blocks, p, False] for m, blocks, p in MAMBA_INPUTS]
    fn, args = _function(expr, path, MAMBA_BOUND)
    rows = []
    for m, blocks, p in MAMBA_INPUTS:
        bound = _mamba_names(m, blocks, p)
        try:
            rows.append([m.name, blocks, p, bool(fn(*(bound[n] for n in args)))])
        except BaseException as exc:  # noqa: BLE001 - the tree's code: any failure is its message
            return f"the Mamba check raised {child.error_text(exc)} for ({m.name}, {blocks}, {p})"
    return rows


def rule_tables(payload: dict) -> dict:
    """In a child (``contract.core.child``): the tree's expressions evaluated for every input,
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
    mamba = _mamba_rows(payload)
    if isinstance(mamba, str):
        return {"problem": mamba}
    if forked():
        return {"problem": "the Mamba check forked a process; the expression must not start processes"}
    out["mamba_blocks_rejected"] = mamba
    if payload.get("read_twin"):
        twin = branch_ubatch.rows(payload["manager_source"], paths[0], forked)
        if isinstance(twin, str):
            return {"problem": twin}
        out["ubatch_twin"] = twin
    return out


class RuleTable:
    """A rule of the tree read from its checked table: ``(breakable, x) -> bool``."""

    def __init__(self, rule: str, rows: dict):
        self.rule, self.rows = rule, rows

    def __call__(self, breakable: bool, other) -> bool:
        return self.rows[(bool(breakable), other)]

    def __repr__(self) -> str:
        return f"RuleTable({self.rule})"


class MambaTable:
    """The tree's Mamba check read from its checked table: ``(mode, blocks, max_num_reqs, is_profiling) -> bool``."""

    def __init__(self, rows: dict):
        self.rows = rows

    def __call__(self, mode: CUDAGraphMode, mamba_cache_blocks: int | None, max_num_reqs: int,
                 is_profiling: bool) -> bool:
        if max_num_reqs != MAX_NUM_SEQS:
            raise ValueError(f"the Mamba check was read at max_num_seqs {MAX_NUM_SEQS}, not {max_num_reqs}")
        return self.rows[(mode.name, mamba_cache_blocks, bool(is_profiling))]

    def __repr__(self) -> str:
        return "MambaTable(mamba_blocks_rejected)"


def _checked_mamba(rows: object, what: str) -> MambaTable:
    want = sorted(repr([m.name, blocks, p]) for m, blocks, p in MAMBA_INPUTS)
    if (not isinstance(rows, list) or len(rows) != len(MAMBA_INPUTS)
            or any(not isinstance(r, list) or len(r) != 4 or type(r[3]) is not bool for r in rows)
            or sorted(repr(r[:3]) for r in rows) != want):
        raise BranchError(f"{what} reported a Mamba check table that is not one bool per input")
    return MambaTable({(r[0], r[1], r[2]): r[3] for r in rows})


def _checked(rule: str, rows: object, inputs: list, what: str) -> RuleTable:
    want = [[a, getattr(b, "name", b)] for a, b in inputs]
    if (not isinstance(rows, list) or len(rows) != len(inputs)
            or any(not isinstance(r, list) or len(r) != 3 or type(r[2]) is not bool for r in rows)
            or sorted(map(repr, (r[:2] for r in rows))) != sorted(map(repr, want))):
        raise BranchError(f"{what} reported a {rule} table that is not one bool per input")
    by_json = {repr(r[:2]): r[2] for r in rows}
    return RuleTable(rule, {(a, b): by_json[repr([a, getattr(b, "name", b)])] for a, b in inputs})


def _tables(pkg: Path, manager_path: str, runner_path: str, compilation_path: str,
            where: str, read_twin: bool) -> tuple[RuleTable, RuleTable, MambaTable, branch_ubatch.TwinTable | None]:
    what = f"the Model Runner V2 rules {where}"
    payload = {"manager_path": manager_path, "runner_path": runner_path, "compilation_path": compilation_path,
               "read_twin": read_twin,
               "manager_source": (pkg / MANAGER_FILE).read_text(encoding="utf-8"),
               "runner_source": (pkg / RUNNER_FILE).read_text(encoding="utf-8"),
               "compilation_source": (pkg / COMPILATION_FILE).read_text(encoding="utf-8")}
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
            _checked("piecewise_capture_available", value.get("piecewise_capture_available"), AVAILABLE_INPUTS, what),
            _checked_mamba(value.get("mamba_blocks_rejected"), what),
            branch_ubatch.checked(value.get("ubatch_twin"), what) if read_twin else None)


def _parse(pkg: Path, rel: str):
    return _parse_file(pkg, rel, "for Model Runner V2")
