"""What one step shows: per dispatch, the (mode, descriptor) chosen and what every capturing layer
on the path did. This is the currency the properties judge and the real-code replay compares."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from functools import cached_property
from typing import ClassVar

from contract.core.forward_context import BatchDescriptor
from contract.core.modes import CUDAGraphMode


class Action(enum.Enum):
    PASSED = "passed"  # mode mismatch or NONE: called its runnable
    CAPTURED = "captured"  # began a capture (first call for the key)
    REPLAYED = "replayed"  # replayed an entry; its runnable was not called
    RAISED = "raised"  # a capture attempt raised (capture guard, nested breakable capture)


ACTING = (Action.CAPTURED, Action.REPLAYED, Action.RAISED)

# The graph memory pool a capture went into: the platform's persistent global pool (the graphs
# served), another pool (memory profiling's throwaway pool), or none given (torch's own pool).
GLOBAL_POOL, THROWAWAY_POOL, PRIVATE_POOL = "global", "throwaway", "private"
PROFILING_CONTEXT = "profile_cudagraph_memory"  # the dispatch context of memory profiling's captures
PROFILE_RUN_CONTEXT = "profile_run"  # the eager dummy pass that sizes activations


class LayerKind(enum.Enum):
    CUDAGraphWrapper = "CUDAGraphWrapper"
    BreakableCUDAGraphWrapper = "BreakableCUDAGraphWrapper"
    UBatchWrapper = "UBatchWrapper"
    compiled = "compiled"  # the compiled model's per-piece CUDAGraphWrapper(PIECEWISE)s, one layer
    CudaGraphManager = "CudaGraphManager"  # MRV2: FULL graphs owned by the manager


@dataclass(frozen=True)
class LayerAction:
    layer: str  # "target[0]:CUDAGraphWrapper(FULL)"
    kind: LayerKind
    runtime_mode: CUDAGraphMode | None  # the layer's own mode (None: match-any)
    action: Action
    depth: int = 0  # capture nesting depth when a capture began (0: outermost)
    entry_mode: CUDAGraphMode | None = None  # replay: the mode the replayed entry was captured under
    entry_key: BatchDescriptor | None = None  # replay: the descriptor it was captured for (``Dispatch.key``)
    error: str | None = None
    entry_context: str | None = None  # replay: the dispatch context the entry was captured in
    pool: str = GLOBAL_POOL  # captured: the pool the graph went into

    def to_json(self) -> dict:
        out = {"layer": self.layer, "action": self.action.value}
        if self.action is Action.CAPTURED:
            out["depth"] = self.depth
            if self.pool != GLOBAL_POOL:
                out["pool"] = self.pool
        if self.entry_mode is not None:
            out["entry_mode"] = self.entry_mode.name
        if self.error:
            out["error"] = self.error
        return out


@dataclass(frozen=True)
class Dispatch:
    role: str  # "target" or "drafter"
    context: str  # "profile_run", "profile_cudagraph_memory", "capture_model", "execute_model", "propose"
    runtime_mode: CUDAGraphMode
    batch_descriptor: BatchDescriptor
    layers: tuple[LayerAction, ...]
    capture_phase: bool  # inside profile_cudagraph_memory or capture_model
    capturing_enabled: bool | None  # vLLM's process-global capture flag at dispatch time; None: no guard (MRV2)
    ran_eager: bool  # the raw model ran outside any capture
    error: str | None = None
    previously_captured: bool = False  # this (role, mode, descriptor) completed a capture before
    spec_step_idx: int | None = None  # MRV2 multi-module MTP: the module step this forward ran
    # A breakable capture under PIECEWISE ran the attention op inside a graph segment instead of
    # breaking the graph at it (no ``eager_break_during_capture`` on the op).
    attention_captured: bool = False
    # The dummy LoRA adapters ``capture_model`` had selected when a capture-phase forward ran
    # (``maybe_select_dummy_loras``, ``33:v1/worker/lora_model_runner_mixin.py:152-256``); 0: none.
    selected_loras: int = 0

    @cached_property  # read by most properties, for every dispatch of every step the explorer takes
    def acting(self) -> tuple[LayerAction, ...]:
        return tuple(a for a in self.layers if a.action in ACTING)

    @property
    def key(self) -> object:
        """What a replayed entry must have been captured for: the descriptor, and the module step
        where one exists."""
        return self.batch_descriptor if self.spec_step_idx is None else (self.batch_descriptor, self.spec_step_idx)

    def to_json(self) -> dict:
        out = {
            "role": self.role,
            "context": self.context,
            "runtime_mode": self.runtime_mode.name,
            "batch_descriptor": self.batch_descriptor.to_json(),
            "layers": [a.to_json() for a in self.layers],
            "capture_phase": self.capture_phase,
            "ran_eager": self.ran_eager,
        }
        if self.spec_step_idx is not None:
            out["spec_step_idx"] = self.spec_step_idx
        if self.attention_captured:
            out["attention_captured"] = True
        if self.selected_loras:
            out["selected_loras"] = self.selected_loras
        if self.error:
            out["error"] = self.error
        return out


@dataclass(frozen=True)
class RankServed:
    """One data-parallel rank's (or pipeline stage's) side of a step: the runtime mode and token count
    ``dispatch_cg_and_sync_dp`` gave it; where a trace runs, the batch it brought (``[num_reqs,
    num_tokens, uniform_token_count]``; an idle rank's is vLLM's dummy batch) and whether it needed
    eager (``need_eager``); or the first line of what its code raised (``raised``: ``no answer``
    for a rank that never answered)."""

    runtime_mode: CUDAGraphMode
    num_tokens: int
    batch: tuple[int, int, int | None] | tuple[()] = ()
    need_eager: bool = False
    idle: bool = False
    raised: str | None = None

    NO_ANSWER: ClassVar[str] = "no answer"

    @classmethod
    def stopped(cls, raised: str) -> RankServed:
        return cls(CUDAGraphMode.NONE, 0, raised=raised)

    def to_json(self) -> dict:
        if self.raised is not None:
            return {"raised": self.raised}
        out = {"runtime_mode": self.runtime_mode.name, "num_tokens": self.num_tokens}
        if self.batch:  # a serving step's; none at start-up
            out = {"batch": list(self.batch), **out}
        if self.need_eager:
            out["need_eager"] = True
        if self.idle:
            out["idle"] = True
        return out

    @classmethod
    def from_json(cls, data: dict) -> RankServed:
        if "raised" in data:
            return cls.stopped(str(data["raised"]))
        return cls(CUDAGraphMode[data["runtime_mode"]], int(data["num_tokens"]), tuple(data.get("batch", ())),
                   bool(data.get("need_eager", False)), bool(data.get("idle", False)))


@dataclass(frozen=True)
class StepRecord:
    """One event's outcome. ``stacks``/``unwrap`` after ``load_model``; ``cudagraph_mode`` after a
    resolve; ``halted`` when vLLM would stop (a config/resolve rejection or a raised capture)."""

    index: int
    event: object
    dispatches: tuple[Dispatch, ...] = ()
    stacks: dict[str, str] = field(default_factory=dict)
    unwrap: dict[str, str] = field(default_factory=dict)
    cudagraph_mode: CUDAGraphMode | None = None
    drafter_cudagraph_mode: CUDAGraphMode | None = None
    halted: str | None = None
    changes: tuple[str, ...] = ()  # model-state changes, for reports
    # At capture_model: the (role, runtime mode name) pairs memory profiling captured graphs of, so
    # that its estimate covers them; None where nothing was profiled to estimate graphs (the trace
    # has no profile_cudagraph_memory, or the release returns 0 by design). Rebuilt from the
    # sequence on the real side (``contract/real/judge.py``), never written.
    profiled: frozenset[tuple[str, str]] | None = None
    # Under data parallelism, at execute_model: per rank (rank 0 first) what it brought and ran.
    ranks: tuple[RankServed, ...] = ()
    # Under pipeline parallelism, at execute_model: per stage (stage 0 first) the mode and padded
    # token count it ran, or what its code raised.
    stages: tuple[RankServed, ...] = ()

    def to_json(self) -> dict:
        from contract.core.events import event_to_json

        out: dict = {"event": event_to_json(self.event)}
        if self.stacks:
            out["stacks"] = dict(self.stacks)
        if self.unwrap:
            out["unwrap"] = dict(self.unwrap)
        if self.cudagraph_mode is not None:
            out["cudagraph_mode"] = self.cudagraph_mode.name
        if self.drafter_cudagraph_mode is not None:
            out["drafter_cudagraph_mode"] = self.drafter_cudagraph_mode.name
        if self.dispatches:
            out["dispatches"] = [d.to_json() for d in self.dispatches]
        if self.halted:
            out["halted"] = self.halted
        if self.ranks:
            out["ranks"] = [r.to_json() for r in self.ranks]
        if self.stages:
            out["stages"] = [r.to_json() for r in self.stages]
        return out
