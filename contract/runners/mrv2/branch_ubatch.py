"""What ``verify --vllm-src`` reads of a tree's ``CudaGraphManager._maybe_ubatch_twin``
(``34:v1/worker/gpu/cudagraph_utils.py:262-287``, ``33:…:229-254``): the micro-batch twin of each
FULL descriptor.

A method as released keeps the model's rule (``model/ubatch_utils.ubatch_twin``), and so does a tree
without one. An edited method runs in a child (``contract.core.child``) over every (micro-batching,
descriptor) input the model asks, the names it reads bound to the model's (``replace``,
``CUDAGraphMode``, ``get_num_ubatches``, ``check_ubatch_thresholds``, and ``self`` holding a
micro-batch runner and the ``parallel_config`` fields micro-batching reads), and the parent runs the
checked table (:class:`TwinTable`). A method that reads another name is refused; one that raises or
forks is one line. Nothing is imported from the tree.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import types

from contract.core import child
from contract.core.modes import FULL, PIECEWISE, CUDAGraphMode
from contract.core.policy import BranchError
from contract.core.tree_source import method
from contract.core.scenario import (
    DBO_DECODE_TOKEN_THRESHOLD,
    DBO_NUM_UBATCHES,
    DBO_PREFILL_TOKEN_THRESHOLD,
    MAX_NUM_SEQS,
    MAX_UBATCH_SIZE,
)
from contract.runners.mrv2.model.cudagraph_utils import BED
from contract.core.ubatch_utils import UBatching, check_ubatch_thresholds

TWIN = ("CudaGraphManager", "_maybe_ubatch_twin")
# The body as released, the same in 0.33.0 and 0.34.0 (its docstring aside).
RELEASED = """
if self.ubatch_runner is None or desc.cg_mode != CUDAGraphMode.FULL:
    return None
if desc.num_reqs is None:
    return None
uniform_token_count, remainder = divmod(desc.num_tokens, desc.num_reqs)
if remainder or desc.uniform_token_count not in (None, uniform_token_count):
    return None
parallel_config = self.vllm_config.parallel_config
num_ubatches = get_num_ubatches(parallel_config)
if desc.num_tokens < num_ubatches:
    return None
if not check_ubatch_thresholds(parallel_config, desc.num_tokens, uniform_decode=True):
    return None
return replace(desc, num_ubatches=num_ubatches, uniform_token_count=uniform_token_count)
"""
BOUND = {"CUDAGraphMode", "get_num_ubatches", "check_ubatch_thresholds", "replace"}
QUERY_LENS = (1, 2, 3)
# The micro-batching the model builds (ubatch_utils.ubatching): every modelled micro-batch count n,
# the thresholds at least n, and raised to n * q under speculative decoding as 0.34.0 does.
UBATCH_INPUTS = sorted({UBatching(n, max(DBO_DECODE_TOKEN_THRESHOLD, n, n * q),
                                   max(DBO_PREFILL_TOKEN_THRESHOLD, n, n * q))
                         for n in range(DBO_NUM_UBATCHES, MAX_UBATCH_SIZE + 1) for q in QUERY_LENS},
                       key=dataclasses.astuple)
DESC_INPUTS = [BED(m, n, r, u) for m in (FULL, PIECEWISE) for n in range(1, MAX_NUM_SEQS * max(QUERY_LENS) + 1)
               for r in (None, *range(1, MAX_NUM_SEQS + 1)) for u in (None, *QUERY_LENS)]


def _body(method: ast.FunctionDef) -> list[ast.stmt]:
    body = method.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    return body


def read(tree: ast.Module) -> str | None:
    """The method's body (``ast.dump``), or None when the tree has none."""
    found = method(tree, *TWIN)
    return None if found is None else ast.dump(ast.Module(_body(found), []))


def as_released(dumped: str | None) -> bool:
    return dumped is None or dumped == ast.dump(ast.parse(RELEASED))


def check_names(tree: ast.Module, where: str) -> None:
    found = method(tree, *TWIN)
    args = {a.arg for a in found.args.args}
    nodes = [n for stmt in _body(found) for n in ast.walk(stmt)]  # its annotations name vLLM's types, never run
    stored = {n.id for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    loaded = {n.id for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    unknown = loaded - args - stored - set(dir(builtins)) - BOUND
    if unknown:
        raise BranchError(f"{where}: {'.'.join(TWIN)} reads {', '.join(sorted(unknown))}, which --vllm-src does not "
                          "model")


def _callable(tree: ast.Module, path: str):
    """The method as a plain function of (self, desc), its annotations dropped (they name vLLM's types)."""
    found = method(tree, *TWIN)
    args = ast.arguments(posonlyargs=[], args=[ast.arg(a.arg) for a in found.args.args], vararg=None,
                         kwonlyargs=[], kw_defaults=[], kwarg=None, defaults=[])
    fn = ast.FunctionDef(name=found.name, args=args, body=_body(found), decorator_list=[], returns=None,
                         **{f: [] for f in ("type_params",) if f in ast.FunctionDef._fields})  # Python 3.12+
    module = ast.fix_missing_locations(ast.Module([ast.copy_location(fn, found)], []))
    scope = {"__builtins__": builtins, "CUDAGraphMode": CUDAGraphMode, "replace": dataclasses.replace,
             "get_num_ubatches": lambda parallel_config: parallel_config.num_ubatches,
             "check_ubatch_thresholds": check_ubatch_thresholds}
    exec(compile(module, path, "exec"), scope)
    return scope[found.name]


def _key(u: UBatching, desc: BED) -> str:
    return repr((dataclasses.astuple(u), desc.cg_mode.name, desc.to_json()))


def rows(source: str, path: str, forked) -> list | str:
    """In the child: per input, the twin the tree's method returns (its mode and ``to_json``) or None;
    a one-line problem when it raises, forks or returns something other than a descriptor or None."""
    fn = _callable(ast.parse(source, path), path)
    out = []
    for u in UBATCH_INPUTS:
        manager = types.SimpleNamespace(ubatch_runner=object(), vllm_config=types.SimpleNamespace(parallel_config=u))
        for desc in DESC_INPUTS:
            try:
                twin = fn(manager, desc)
            except BaseException as exc:  # noqa: BLE001 - the tree's code: any failure is its message
                return f"{'.'.join(TWIN)} raised {child.error_text(exc)} for {desc}"
            if forked():
                return f"{'.'.join(TWIN)} forked a process; it must not start processes"
            if twin is not None and not isinstance(twin, BED):
                return f"{'.'.join(TWIN)} returned {type(twin).__name__}, neither a descriptor nor None"
            out.append([_key(u, desc), None if twin is None else [twin.cg_mode.name, twin.to_json()]])
    return out


class TwinTable:
    """The tree's ``_maybe_ubatch_twin`` read from its checked table: ``(micro-batching, descriptor) -> twin``."""

    def __init__(self, table: dict):
        self.table = table

    def __call__(self, u: UBatching | None, desc: BED) -> BED | None:
        if u is None:  # no micro-batch runner: the method's first test
            return None
        key = _key(u, desc)
        if key not in self.table:
            raise ValueError(f"{'.'.join(TWIN)} was read for the modelled descriptors, not for {desc} under {u}")
        found = self.table[key]
        return None if found is None else BED.from_json(found[1], CUDAGraphMode[found[0]])

    def __repr__(self) -> str:
        return "TwinTable(ubatch_twin)"


def checked(value: object, what: str) -> TwinTable:
    want = sorted(_key(u, d) for u in UBATCH_INPUTS for d in DESC_INPUTS)
    if (not isinstance(value, list) or any(not isinstance(r, list) or len(r) != 2 for r in value)
            or sorted(r[0] for r in value) != want):
        raise BranchError(f"{what} reported a {'.'.join(TWIN)} table that is not one result per input")
    table = {}
    for key, result in value:
        if result is not None:
            try:
                BED.from_json(result[1], CUDAGraphMode[result[0]])
            except (KeyError, TypeError, IndexError, ValueError):
                raise BranchError(f"{what} reported a {'.'.join(TWIN)} result that is no descriptor") from None
        table[key] = result
    return TwinTable(table)
