"""``CudagraphDispatcher`` (``v1/cudagraph_dispatcher.py`` in vLLM 0.33.0) as pure functions over
an immutable dispatcher state, and the drafter's mode mapping (spec §6, §7)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from contract.modes import FULL, NONE, PIECEWISE, CUDAGraphMode
from contract.scenario import MAX_NUM_SEQS


@dataclass(frozen=True, order=True)
class BatchDescriptor:
    """``forward_context.py:29-57``. LoRA fields are left out: the modelled scenarios have no LoRA,
    so ``has_lora`` is always False and ``num_active_loras`` always 0."""

    num_tokens: int
    num_reqs: int | None = None
    uniform: bool = False

    def __str__(self) -> str:
        if self.num_reqs is None and not self.uniform:
            return f"BD({self.num_tokens})"
        return f"BD({self.num_tokens},{self.num_reqs}{',uniform' if self.uniform else ''})"

    def to_json(self) -> dict:
        return {"num_tokens": self.num_tokens, "num_reqs": self.num_reqs, "uniform": self.uniform}

    @classmethod
    def from_json(cls, data: dict) -> BatchDescriptor:
        if not isinstance(data, dict) or not isinstance(data.get("num_tokens"), int):
            raise ValueError("batch_descriptor needs an integer num_tokens")
        num_reqs = data.get("num_reqs")
        if num_reqs is not None and not isinstance(num_reqs, int):
            raise ValueError("batch_descriptor num_reqs must be an integer or null")
        return cls(data["num_tokens"], num_reqs, bool(data.get("uniform", False)))


@dataclass(frozen=True)
class DispatcherState:
    """The fields of one ``CudagraphDispatcher`` instance that dispatch reads."""

    uniform_decode_query_len: int  # set in __init__ to 1 + num_speculative_tokens (:36)
    cudagraph_mode: CUDAGraphMode = NONE  # NONE until keys are initialized (:69)
    keys_initialized: bool = False
    keys: frozenset[tuple[CUDAGraphMode, BatchDescriptor]] = frozenset()
    cudagraph_capture_sizes: tuple[int, ...] = ()
    max_cudagraph_capture_size: int | None = None


def padded_size(num_tokens: int, capture_sizes: tuple[int, ...]) -> int:
    """``_compute_bs_to_padded_graph_size`` (``:71-108``): the smallest capture size >= n."""
    return min(s for s in capture_sizes if s >= num_tokens) if num_tokens else 0


def _padded_batch_descriptor(d: DispatcherState, num_tokens: int, uniform_decode: bool) -> BatchDescriptor:
    """``_create_padded_batch_descriptor`` (``:130-154``); uses the ``__init__`` query length."""
    padded = padded_size(num_tokens, d.cudagraph_capture_sizes)
    if uniform_decode and d.cudagraph_mode.has_mode(FULL):
        assert padded % d.uniform_decode_query_len == 0, "num_tokens_padded % uniform_decode_query_len != 0"
        return BatchDescriptor(padded, min(padded // d.uniform_decode_query_len, MAX_NUM_SEQS), True)
    return BatchDescriptor(padded, min(padded, MAX_NUM_SEQS), False)


def initialize_cudagraph_keys(
    d: DispatcherState,
    cudagraph_mode: CUDAGraphMode,
    capture_sizes: tuple[int, ...],
    uniform_decode_query_len: int = 1,
) -> DispatcherState:
    """``initialize_cudagraph_keys`` (``:164-231``). Keys are added to the existing sets, never
    replaced: only ``profile_cudagraph_memory`` clears them."""
    d = replace(
        d,
        cudagraph_mode=cudagraph_mode,
        cudagraph_capture_sizes=capture_sizes,
        max_cudagraph_capture_size=max(capture_sizes) if capture_sizes else None,
    )
    if cudagraph_mode == NONE:
        return replace(d, keys_initialized=True)
    keys = set(d.keys)
    mixed = cudagraph_mode.mixed_mode()
    if mixed != NONE:
        for size in capture_sizes:
            desc = _padded_batch_descriptor(d, size, False)
            if mixed == PIECEWISE:
                desc = replace(desc, num_reqs=None, uniform=False)
            keys.add((mixed, desc))
    if cudagraph_mode.decode_mode() == FULL and cudagraph_mode.separate_routine():
        q = uniform_decode_query_len
        for size in capture_sizes:
            if q <= size <= q * MAX_NUM_SEQS:
                keys.add((FULL, _padded_batch_descriptor(d, size, True)))
    return replace(d, keys=frozenset(keys), keys_initialized=True)


def clear_keys(d: DispatcherState) -> DispatcherState:
    """``profile_cudagraph_memory`` clears the target dispatcher's keys (``gpu_model_runner.py:6397``)."""
    return replace(d, keys=frozenset(), keys_initialized=False)


def dispatch(
    d: DispatcherState,
    num_tokens: int,
    uniform_decode: bool = False,
    valid_modes: Iterable[CUDAGraphMode] | None = None,
    invalid_modes: Iterable[CUDAGraphMode] | None = None,
) -> tuple[CUDAGraphMode, BatchDescriptor]:
    """``dispatch`` (``:233-322``)."""
    allowed = set(valid_modes or CUDAGraphMode.valid_runtime_modes())
    if invalid_modes:
        allowed -= set(invalid_modes)
    assert allowed, "No allowed cudagraph modes"
    if (
        not d.keys_initialized
        or d.cudagraph_mode == NONE
        or d.max_cudagraph_capture_size is None
        or num_tokens > d.max_cudagraph_capture_size
        or allowed <= {NONE}
    ):
        return NONE, BatchDescriptor(num_tokens)
    uniform = uniform_decode and d.cudagraph_mode.separate_routine()
    desc = _padded_batch_descriptor(d, num_tokens, uniform)
    if FULL in allowed and (FULL, desc) in d.keys:
        return FULL, desc
    relaxed = replace(desc, num_reqs=None, uniform=False)
    if PIECEWISE in allowed and (PIECEWISE, relaxed) in d.keys:
        return PIECEWISE, relaxed
    assert NONE in allowed, "No matching cudagraph found and NONE is not allowed"
    return NONE, BatchDescriptor(num_tokens)


def get_capture_descs(d: DispatcherState) -> list[tuple[CUDAGraphMode, list[BatchDescriptor]]]:
    """``get_capture_descs`` (``:324-348``): PIECEWISE first, then FULL, largest first."""
    if not d.keys_initialized or d.cudagraph_mode == NONE:
        return []
    out = []
    for mode in (PIECEWISE, FULL):
        descs = sorted((desc for m, desc in d.keys if m == mode), key=lambda b: b.num_tokens, reverse=True)
        if descs:
            out.append((mode, descs))
    return out


def drafter_cudagraph_mode(target_mode: CUDAGraphMode, spec_enforce_eager: bool) -> CUDAGraphMode:
    """``SpecDecodeBaseProposer.initialize_cudagraph_keys`` (``v1/spec_decode/llm_base_proposer.py:420-435``):
    PIECEWISE iff not ``speculative_config.enforce_eager`` and the target's mixed mode is
    PIECEWISE or FULL, else NONE. A FULL target therefore gives a PIECEWISE drafter."""
    if not spec_enforce_eager and target_mode.mixed_mode() in (PIECEWISE, FULL):
        return PIECEWISE
    return NONE
