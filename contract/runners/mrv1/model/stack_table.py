"""``load_model`` as a table: named code (a policy file, a tree's wrapping block) is evaluated in a
child process for every ``LoadContext`` the model can ask, and the parent runs the table.

``GPUModelRunner.load_model`` reads four things when it wraps (``v1/worker/gpu_model_runner.py:
5128-5165`` in 0.33.0): the load-time ``cudagraph_mode``, ``is_breakable_cudagraph_enabled()``,
``parallel_config.use_ubatching`` and whether a drafter with a ``.model`` exists; the table has one
row per combination (5 x 2 x 2 x 2 = 40). A row is each stack as a list of layers, outermost first,
ending at the raw model it was given (``{"kind": "RawModel", "of": "model"|"drafter"}``), so a
table holds no object of the named code and no cycle, and is bounded in depth.

The child side (``to_json``) walks what ``load_model`` returned without calling it again, with
``type(...) is`` checks (a subclass could change what a node does), and says in one line what is
wrong. The parent side (``from_json``) trusts nothing the child wrote: it checks every row again and
builds ``StackTable``, the callable the ``Policy`` runs.
"""

from __future__ import annotations

import itertools

from contract.core.modes import NONE, CUDAGraphMode
from contract.runners.mrv1.model.wrappers import (
    BreakableCUDAGraphWrapper,
    CUDAGraphWrapper,
    LoadContext,
    RawModel,
    Runnable,
    Stacks,
    UBatchWrapper,
)

# vLLM nests at most three wrappers (UBatch/CUDAGraph over Breakable over the model); a stack
# deeper than this is a mistake, and the bound keeps every walk of it finite.
MAX_WRAPPERS = 16
WRAPPERS = {cls.__name__: cls for cls in (CUDAGraphWrapper, BreakableCUDAGraphWrapper, UBatchWrapper)}
RETURNS = ("Stacks(target, drafter) of CUDAGraphWrapper, BreakableCUDAGraphWrapper and UBatchWrapper "
           "ending at ctx.model and ctx.drafter_model")
MODEL, DRAFTER = RawModel("model"), RawModel("drafter.model")


class TableError(Exception):
    """What ``load_model`` returned, or a table, is not a wrapper stack; one line."""


def contexts(model: RawModel = MODEL, drafter: RawModel = DRAFTER) -> list[LoadContext]:
    """Every ``LoadContext`` the model can ask, in a fixed order."""
    return [LoadContext(mode, breakable, ubatching, model, drafter if has_drafter else None)
            for mode, breakable, ubatching, has_drafter
            in itertools.product(CUDAGraphMode, (False, True), (False, True), (False, True))]


def key(ctx: LoadContext) -> tuple[str, bool, bool, bool]:
    return (ctx.cudagraph_mode.name, ctx.breakable, ctx.use_ubatching, ctx.drafter_model is not None)


def said(ctx: LoadContext) -> str:
    return (f"LoadContext(cudagraph_mode={ctx.cudagraph_mode.name}, breakable={ctx.breakable}, "
            f"use_ubatching={ctx.use_ubatching}, drafter={'yes' if ctx.drafter_model is not None else 'no'})")


# -- the child's side: what load_model returned, as JSON --------------------------------------------

def _type_name(value: object) -> str:
    return "None" if value is None else f"a {type(value).__name__}"


def _layers(node: object, leaf: RawModel, role: str) -> list[dict]:
    out: list[dict] = []
    seen: set[int] = set()
    while True:
        if id(node) in seen:
            raise TableError(f"a {role} stack that is a cycle (a wrapper whose runnable leads back to it)")
        seen.add(id(node))
        kind = type(node)
        if kind is RawModel:
            if node != leaf:
                raise TableError(f"a {role} stack ending at RawModel({node.name!r}), not at "
                                 f"{'ctx.model' if role == 'target' else 'ctx.drafter_model'}")
            out.append({"kind": "RawModel", "of": "model" if role == "target" else "drafter"})
            return out
        if kind not in WRAPPERS.values():
            raise TableError(f"{_type_name(node)} inside the {role} stack" if out else f"{_type_name(node)} as the "
                             f"{role} stack")
        if len(out) == MAX_WRAPPERS:
            raise TableError(f"a {role} stack more than {MAX_WRAPPERS} wrappers deep")
        layer = {"kind": kind.__name__, "runtime_mode": _mode(node.runtime_mode, kind, role)}
        if type(node.recursive_unwrap) is not bool:
            raise TableError(f"a {kind.__name__} in the {role} stack whose recursive_unwrap is not a bool")
        layer["recursive_unwrap"] = node.recursive_unwrap
        out.append(layer)
        node = node.runnable


def _mode(mode: object, kind: type, role: str) -> str | None:
    if mode is None and kind is BreakableCUDAGraphWrapper:
        return None
    if type(mode) is not CUDAGraphMode:
        raise TableError(f"a {kind.__name__} in the {role} stack whose runtime_mode is {_type_name(mode)}, "
                         "not a CUDAGraphMode")
    if kind is CUDAGraphWrapper and mode == NONE:
        raise TableError(f"a CUDAGraphWrapper(NONE) in the {role} stack (vLLM asserts runtime_mode != NONE, "
                         "compilation/cuda_graph.py:196)")
    return mode.name


def to_json(stacks: object, ctx: LoadContext) -> dict:
    """One row: ``stacks`` as ``load_model(ctx)`` returned it, checked; ``TableError`` says what is
    wrong (the caller adds the context)."""
    if type(stacks) is not Stacks:
        raise TableError(f"{_type_name(stacks)}, not Stacks")
    target = _layers(stacks.target, ctx.model, "target")
    if ctx.drafter_model is None:
        if stacks.drafter is not None:
            raise TableError("a drafter stack, but the context has no drafter (ctx.drafter_model is None)")
        drafter = None
    else:
        drafter = _layers(stacks.drafter, ctx.drafter_model, "drafter")
    return {"context": list(key(ctx)), "target": target, "drafter": drafter}


# -- the parent's side: a table the child wrote, checked, as load_model ------------------------------

def _node(layers: object, role: str) -> tuple:
    """A checked stack as nested tuples, innermost (the raw model's role) last."""
    if not isinstance(layers, list) or not 1 <= len(layers) <= MAX_WRAPPERS + 1:
        raise TableError(f"a {role} stack that is not a list of 1 to {MAX_WRAPPERS + 1} layers")
    *wrappers, raw = layers
    if raw != {"kind": "RawModel", "of": "model" if role == "target" else "drafter"}:
        raise TableError(f"a {role} stack that does not end at its raw model")
    checked = []
    for layer in wrappers:
        if not isinstance(layer, dict) or layer.get("kind") not in WRAPPERS:
            raise TableError(f"a {role} layer that is not a wrapper")
        kind = layer["kind"]
        mode = layer.get("runtime_mode")
        if not (mode is None and kind == "BreakableCUDAGraphWrapper") and mode not in CUDAGraphMode.__members__:
            raise TableError(f"a {kind} with runtime_mode {mode!r}")
        if kind == "CUDAGraphWrapper" and mode == "NONE":
            raise TableError("a CUDAGraphWrapper(NONE)")
        if set(layer) != {"kind", "runtime_mode", "recursive_unwrap"} or type(layer["recursive_unwrap"]) is not bool:
            raise TableError(f"a {kind} layer with fields {sorted(layer)}")
        checked.append((kind, None if mode is None else CUDAGraphMode[mode], layer["recursive_unwrap"]))
    return tuple(checked)


def _build(layers: tuple, leaf: RawModel) -> Runnable:
    node: Runnable = leaf
    for kind, mode, recursive in reversed(layers):
        node = WRAPPERS[kind](node, mode, recursive_unwrap=recursive)
    return node


class StackTable:
    """``load_model`` read from a checked table: the stacks of the row for ``ctx``, ending at
    ``ctx.model`` and ``ctx.drafter_model``."""

    def __init__(self, rows: dict[tuple, tuple[tuple, tuple | None]], source: str):
        self.rows, self.source = rows, source

    def __call__(self, ctx: LoadContext) -> Stacks:
        target, drafter = self.rows[key(ctx)]
        return Stacks(_build(target, ctx.model),
                      None if drafter is None or ctx.drafter_model is None else _build(drafter, ctx.drafter_model))

    def __repr__(self) -> str:
        return f"StackTable({self.source})"


def from_json(rows: object, source: str) -> StackTable:
    """The table a child wrote for ``source``: a row for every context, each stack checked;
    ``TableError`` otherwise."""
    want = {key(ctx) for ctx in contexts()}
    if not isinstance(rows, list) or len(rows) != len(want):
        raise TableError(f"a table that is not a list of {len(want)} rows")
    table: dict = {}
    for row in rows:
        if not isinstance(row, dict) or set(row) != {"context", "target", "drafter"}:
            raise TableError("a row that is not {context, target, drafter}")
        k = tuple(row["context"]) if isinstance(row["context"], list) else None
        if k not in want or k in table:
            raise TableError(f"a row for an unknown or repeated context {row['context']!r}")
        has_drafter = k[3]
        if (row["drafter"] is None) == has_drafter:
            raise TableError(f"a row for {k} whose drafter stack does not match the context")
        table[k] = (_node(row["target"], "target"), _node(row["drafter"], "drafter") if has_drafter else None)
    return StackTable(table, source)
