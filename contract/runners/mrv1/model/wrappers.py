"""The wrapper stack that ``load_model`` builds: immutable nodes that read like vLLM's constructors.

A policy writes ``CUDAGraphWrapper(BreakableCUDAGraphWrapper(model, runtime_mode=PIECEWISE),
runtime_mode=FULL)`` exactly as ``v1/worker/gpu_model_runner.py:5128-5165`` does, minus the
``vllm_config`` argument.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from contract.core.modes import NONE, CUDAGraphMode


@dataclass(frozen=True)
class RawModel:
    """The loaded ``nn.Module`` (``self.model`` or ``drafter.model`` before wrapping). Whether
    it holds compiled inner PIECEWISE wrappers is decided later, at its first forward."""

    name: str = "model"

    @property
    def label(self) -> str:
        return self.name


@dataclass(frozen=True)
class CUDAGraphWrapper:
    """``compilation/cuda_graph.py:145-362``: acts iff the forward-context mode equals
    ``runtime_mode`` (``:246-256``); ``unwrap()`` recurses from 0.30.0 on (``:222-226``)."""

    runnable: Runnable
    runtime_mode: CUDAGraphMode
    recursive_unwrap: bool = True

    def __post_init__(self) -> None:
        if self.runtime_mode == NONE:
            raise AssertionError("CUDAGraphWrapper requires runtime_mode != NONE (cuda_graph.py:196)")

    @property
    def label(self) -> str:
        return f"CUDAGraphWrapper({self.runtime_mode.name})"


@dataclass(frozen=True)
class BreakableCUDAGraphWrapper:
    """``compilation/breakable_cudagraph.py:247-433``: acts iff the mode is not NONE and, when
    ``runtime_mode`` is set, equals it (``:329-333``). ``runtime_mode=None`` is "match any
    non-NONE mode", the only behaviour before #56312 and the one MRV2 relies on."""

    runnable: Runnable
    runtime_mode: CUDAGraphMode | None = None
    recursive_unwrap: bool = True

    @property
    def label(self) -> str:
        mode = "None" if self.runtime_mode is None else self.runtime_mode.name
        return f"BreakableCUDAGraphWrapper({mode})"


@dataclass(frozen=True)
class UBatchWrapper:
    """``v1/worker/gpu_ubatch_wrapper.py:65-456``: builds a *sibling* ``CUDAGraphWrapper`` on the
    same runnable when ``runtime_mode`` is not NONE (``:84-88``) and sends FULL to it; NONE and
    PIECEWISE go to the runnable (``:376-380``). A micro-batched forward (the forward context's
    ``ubatch_slices``) it runs itself: under FULL it captures a graph of all the micro-batches once
    per token count and replays it after, else it runs them eagerly (``:382-456``). ``unwrap()`` is
    not recursive in any release (``:117-119``); a branch may make it so (``recursive_unwrap``)."""

    runnable: Runnable
    runtime_mode: CUDAGraphMode
    recursive_unwrap: bool = False

    @property
    def label(self) -> str:
        return f"UBatchWrapper({self.runtime_mode.name})"

    @property
    def cudagraph_wrapper_label(self) -> str:
        return f"{self.label}.cudagraph_wrapper"


Wrapper = Union[CUDAGraphWrapper, BreakableCUDAGraphWrapper, UBatchWrapper]
Runnable = Union[Wrapper, RawModel]


@dataclass(frozen=True)
class Stacks:
    """What ``load_model`` leaves in ``self.model`` and ``drafter.model`` (None: no drafter
    with a ``.model``)."""

    target: Runnable
    drafter: Runnable | None = None


def layers(node: Runnable) -> list[Runnable]:
    """Outermost first, ending with the raw model."""
    out = [node]
    while not isinstance(node, RawModel):
        node = node.runnable
        out.append(node)
    return out


def describe(node: Runnable | None) -> str:
    if node is None:
        return "-"
    return " -> ".join(n.label for n in layers(node))


def unwrap(node: Runnable) -> Runnable:
    """``get_model()`` (``gpu_model_runner.py:3078-3097``): ``self.model.unwrap()`` for a wrapper.

    Each wrapper's ``unwrap`` returns ``runnable.unwrap()`` when it recurses and the runnable has
    ``unwrap``, else the runnable itself; the raw model has no ``unwrap``.
    """
    if isinstance(node, RawModel):
        return node
    inner = node.runnable
    recursive = getattr(node, "recursive_unwrap", False)
    if recursive and not isinstance(inner, RawModel):
        return unwrap(inner)
    return inner


@dataclass(frozen=True)
class LoadContext:
    """What ``GPUModelRunner.load_model`` reads when it wraps (``gpu_model_runner.py:5128-5165``)."""

    cudagraph_mode: CUDAGraphMode  # self.compilation_config.cudagraph_mode at load time
    breakable: bool  # is_breakable_cudagraph_enabled()
    use_ubatching: bool  # self.parallel_config.use_ubatching
    model: RawModel  # self.model
    drafter_model: RawModel | None  # drafter.model when a drafter with a .model exists


def wrapper_acts(node: object, mode: CUDAGraphMode) -> bool:
    """The match rule of both wrapper classes (``cuda_graph.py:246-256``,
    ``breakable_cudagraph.py:329-333``)."""
    if mode == NONE:
        return False
    if isinstance(node, CUDAGraphWrapper):
        return mode == node.runtime_mode
    if isinstance(node, BreakableCUDAGraphWrapper):
        return node.runtime_mode is None or mode == node.runtime_mode
    return False


def entry_key(kind: str, mode: CUDAGraphMode, batch_descriptor: object) -> object:
    """Both wrappers key entries by batch descriptor alone, not by mode (``cuda_graph.py:259-263``,
    ``breakable_cudagraph.py:337-343``)."""
    return batch_descriptor


def ubatch_key(num_tokens: int, num_ubatches: int) -> int:
    """The token count ``_capture_ubatches`` stores a micro-batched graph under: the sum over its
    micro-batches, the padded count ``__call__`` looks it up by (``33:v1/worker/gpu_ubatch_wrapper.py:163``,
    ``:385``)."""
    return num_tokens
