"""Who acted on a dispatch, read from the real objects.

Pass-through spies on ``__call__`` of vLLM's three wrapper classes keep the chain of wrapper
calls in progress; the simulated CUDA layer reports each capture begin and replay, which is
charged to the innermost wrapper call in progress (the one whose ``torch.cuda.graph`` or
``BreakableCUDAGraphCapture`` it is). An exception leaving a wrapper call is charged to the
innermost call it left. The spies change nothing: they call the original ``__call__`` with the
same arguments and return or raise what it did.

The result is a dispatch in exactly the model's format (``Dispatch.to_json`` in
``contract/core/observation.py``): one entry per wrapper call in call order, labelled as the model
labels layers (``target[0]:CUDAGraphWrapper(FULL)``, ``target[0]:UBatchWrapper(FULL).cudagraph_wrapper``,
``target:compiled`` for the compiled model's per-piece ``CUDAGraphWrapper(PIECEWISE)``s, which
act together and so count as one layer, listed only when they acted, as in the model).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from contract.core.observation import GLOBAL_POOL
from contract.real.errors import normalise
from contract.real.simcuda import SimCuda, SimGraph

COMPILED = "compiled"


@dataclass
class Call:
    """One wrapper ``__call__`` during a dispatch."""

    label: str
    kind: str  # "CUDAGraphWrapper", "BreakableCUDAGraphWrapper", "UBatchWrapper" or COMPILED
    capture_depth: int | None = None  # open captures around its first capture_begin
    pool: str = GLOBAL_POOL  # the pool of its first capture (``SimCuda.pool_kind``)
    replayed_mode: str | None = None  # mode the replayed graph was captured under
    error: str | None = None


@dataclass
class Recorder:
    labels: dict[int, tuple[str, str]] = field(default_factory=dict)  # id(wrapper) -> (label, kind)
    active: list[Call] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    ran_eager: bool = False
    attention_captured: bool = False
    runtime_mode: str = "NONE"

    def label(self, wrapper: object, label: str, kind: str) -> None:
        self.labels[id(wrapper)] = (label, kind)

    def start(self, runtime_mode: str) -> None:
        self.calls, self.active = [], []
        self.ran_eager, self.attention_captured, self.runtime_mode = False, False, runtime_mode

    def enter(self, wrapper: object) -> Call:
        label, kind = self.labels.get(id(wrapper), (f"?:{type(wrapper).__name__}", type(wrapper).__name__))
        call = Call(label, kind)
        self.calls.append(call)
        self.active.append(call)
        return call

    def leave(self, call: Call) -> None:
        self.active.pop()

    def raised(self, call: Call, exc: BaseException) -> None:
        if not getattr(exc, "_conformance_charged", False):
            exc._conformance_charged = True
            call.error = normalise(exc)

    def graph_event(self, kind: str, graph: SimGraph) -> None:
        if kind == "end":
            return
        if not self.active:  # a graph event outside any wrapper: shown, never dropped
            self.calls.append(Call("?:outside-any-wrapper", "unknown"))
            owner = self.calls[-1]
        else:
            owner = self.active[-1]
        if kind == "begin":
            graph.tag = self.runtime_mode
            if owner.capture_depth is None:
                owner.capture_depth = graph.depth - 1
                owner.pool = SimCuda.pool_kind(graph.pool)
        elif kind == "replay" and owner.replayed_mode is None:
            owner.replayed_mode = graph.tag

    def compute_ran(self) -> None:
        if SimCuda.depth == 0:
            self.ran_eager = True

    def attention_ran(self, breakable_capture_open: bool) -> None:
        """The attention op ran: inside a graph segment of an open breakable capture, under a
        mode other than FULL, it was captured instead of breaking the graph."""
        if breakable_capture_open and SimCuda.depth > 0 and self.runtime_mode != "FULL":
            self.attention_captured = True

    def dispatch_fields(self, capture_phase: bool) -> dict:
        """What the forward showed, in ``Dispatch.to_json``'s keys."""
        out = {"layers": self.layers(), "capture_phase": capture_phase, "ran_eager": self.ran_eager}
        if self.attention_captured:
            out["attention_captured"] = True
        return out

    def layers(self) -> list[dict]:
        out: list[dict] = []
        merged: dict | None = None
        for call in self.calls:
            entry = _layer(call)
            if call.kind != COMPILED:
                out.append(entry)
                continue
            if merged is None:
                merged = entry
                out.append(merged)
            elif merged["action"] == "passed" or entry["action"] == "raised":
                merged.clear()
                merged.update(entry)
        # The model lists the compiled layer only when it acts (runner.py _Walk._raw).
        return [e for e in out if not (e["layer"].endswith(":" + COMPILED) and e["action"] == "passed")]


def _layer(call: Call) -> dict:
    out: dict = {"layer": call.label}
    if call.error and call.kind != "UBatchWrapper":
        out["action"] = "raised"
        out["error"] = call.error
    elif call.capture_depth is not None:
        out["action"] = "captured"
        out["depth"] = call.capture_depth
        if call.pool != GLOBAL_POOL:
            out["pool"] = call.pool
    elif call.replayed_mode is not None:
        out["action"] = "replayed"
        out["entry_mode"] = call.replayed_mode
    else:
        out["action"] = "passed"
    return out


RECORDER: Recorder | None = None


def _spy(original):
    def __call__(self, *args, **kwargs):
        recorder = RECORDER
        if recorder is None:
            return original(self, *args, **kwargs)
        call = recorder.enter(self)
        try:
            return original(self, *args, **kwargs)
        except BaseException as exc:
            recorder.raised(call, exc)
            raise
        finally:
            recorder.leave(call)

    __call__.__wrapped__ = original
    return __call__


def install(recorder: Recorder) -> None:
    """Spy on the wrapper classes (once) and route simulated graph events to ``recorder``."""
    global RECORDER
    from vllm.compilation.breakable_cudagraph import BreakableCUDAGraphWrapper
    from vllm.compilation.cuda_graph import CUDAGraphWrapper
    from vllm.v1.worker.gpu_ubatch_wrapper import UBatchWrapper

    for cls in (CUDAGraphWrapper, BreakableCUDAGraphWrapper, UBatchWrapper):
        if not hasattr(cls.__call__, "__wrapped__"):
            cls.__call__ = _spy(cls.__call__)
    RECORDER = recorder
    SimCuda.listener = recorder.graph_event
