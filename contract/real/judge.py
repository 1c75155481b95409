"""The contract judged on vLLM's own observations, not the model's.

The replay (``replay.py``) reports each step in ``StepRecord.to_json`` form, read from the real
wrappers and the simulated CUDA layer. Here those dicts become ``StepRecord``s again and go
through the same P0–P7 checks (``contract/core/properties.py``) and class signatures
(``contract/core/classes.py``), so a branch's change in resolve, the dispatcher or the wrappers shows
up as a class even where the model has no such change.

Two facts the JSON form does not carry are rebuilt from the sequence: whether a (role, mode,
descriptor) completed a capture before (a capturing layer acted and the dispatch raised nothing;
``profile_cudagraph_memory`` ends with ``clear_all_graphs``, ``gpu_model_runner.py:6382-6397`` in
0.30.0), and a replayed entry's key, which the simulated graph does not record (taken as the
dispatch's own descriptor, so P5 judges the entry's mode only).
"""

from __future__ import annotations

import re

from contract.core.events import CaptureModel, Event, ProfileCudagraphMemory
from contract.core.modes import PIECEWISE, CUDAGraphMode
from contract.core.observation import GLOBAL_POOL, Action, Dispatch, LayerAction, LayerKind, RankServed, StepRecord
from contract.core.properties import Violation, check, profiled_pairs
from contract.core.scenario import Scenario

_MODE = re.compile(r"\((\w+)\)")


def _mode(text: str | None) -> CUDAGraphMode | None:
    """A mode name; None for none or for a label's non-mode qualifier (``CudaGraphManager(prefill)``)."""
    return None if text in (None, "None") or text not in CUDAGraphMode.__members__ else CUDAGraphMode[text]


def layer_kind(label: str) -> tuple[LayerKind, CUDAGraphMode | None]:
    """Kind and own mode from the label the model and the spies both write."""
    name = label.split(":", 1)[-1]
    found = _MODE.search(name)
    mode = _mode(found.group(1)) if found else None
    if name == "compiled":
        return LayerKind.compiled, PIECEWISE
    if name.endswith(".cudagraph_wrapper") or name.startswith("CUDAGraphWrapper("):
        return LayerKind.CUDAGraphWrapper, mode
    if name.startswith("BreakableCUDAGraphWrapper(") or name == "breakable_cg_runner":
        return LayerKind.BreakableCUDAGraphWrapper, mode
    if name.startswith("UBatchWrapper("):
        return LayerKind.UBatchWrapper, mode
    if name.startswith("CudaGraphManager"):
        return LayerKind.CudaGraphManager, mode
    return LayerKind.CUDAGraphWrapper, None  # a graph outside any known wrapper: never the intended one


def _dispatch(data: dict, capture_phase_graphs: set, descriptor_from_json) -> Dispatch:
    mode = CUDAGraphMode[data["runtime_mode"]]
    desc = descriptor_from_json(data["batch_descriptor"], mode)
    layers = []
    for layer in data.get("layers", []):
        kind, own = layer_kind(layer["layer"])
        action = Action(layer["action"])
        layers.append(LayerAction(layer["layer"], kind, own, action, depth=layer.get("depth", 0),
                                  entry_mode=_mode(layer.get("entry_mode")),
                                  entry_key=desc if action is Action.REPLAYED else None,
                                  error=layer.get("error"), pool=layer.get("pool", GLOBAL_POOL)))
    return Dispatch(data["role"], data["context"], mode, desc, tuple(layers), bool(data.get("capture_phase")),
                    capturing_enabled=True, ran_eager=bool(data.get("ran_eager")), error=data.get("error"),
                    previously_captured=(data["role"], mode, desc) in capture_phase_graphs,
                    attention_captured=bool(data.get("attention_captured")),
                    selected_loras=data.get("selected_loras", 0))


def records(steps: list[dict], events: list[Event], descriptor_from_json, *, profiling_skipped: bool) -> list[StepRecord]:
    """Observed steps as ``StepRecord``s (only the fields the properties read); a dispatch's batch
    descriptor is read by the runner family's ``descriptor_from_json`` (MRV1 ``BatchDescriptor``,
    MRV2 ``BatchExecutionDescriptor``). ``capture_model``'s record carries what memory profiling
    captured (``StepRecord.profiled``), unless the release's profiling returns 0 by design for the
    scenario (``profiling_skipped``: the family's ``profiling_skipped``)."""
    out: list[StepRecord] = []
    graphs: set = set()
    profiled = None
    for index, (step, event) in enumerate(zip(steps, events)):
        dispatches = []
        for data in step.get("dispatches", []):
            d = _dispatch(data, graphs, descriptor_from_json)
            dispatches.append(d)
            if not d.error and any(a.action is Action.CAPTURED for a in d.acting):
                graphs.add((d.role, d.runtime_mode, d.batch_descriptor))
        record = StepRecord(index, event, tuple(dispatches), dict(step.get("stacks", {})),
                            dict(step.get("unwrap", {})), halted=step.get("halted"),
                            profiled=profiled if isinstance(event, CaptureModel) else None,
                            ranks=tuple(RankServed.from_json(r) for r in step.get("ranks", [])),
                            stages=tuple(RankServed.from_json(r) for r in step.get("stages", [])))
        if isinstance(event, ProfileCudagraphMemory):
            graphs.clear()
            if not profiling_skipped and not record.halted:
                profiled = profiled_pairs(record)
        out.append(record)
    return out


def violations(steps: list[dict], events: list[Event], scenario: Scenario,
               descriptor_from_json, *, profiling_skipped: bool) -> tuple[list[StepRecord], list[Violation]]:
    recs = records(steps, events, descriptor_from_json, profiling_skipped=profiling_skipped)
    return recs, [v for r in recs for v in check(r, scenario, scenario.runner)]
