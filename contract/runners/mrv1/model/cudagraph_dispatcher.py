"""``CudagraphDispatcher`` (``v1/cudagraph_dispatcher.py`` in vLLM 0.33.0) as pure functions over
an immutable dispatcher state, and the drafter's mode mapping (spec §6, §7)."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable
from dataclasses import dataclass, replace
from itertools import product

from contract.core.modes import FULL, NONE, PIECEWISE, CUDAGraphMode
from contract.core.forward_context import BatchDescriptor
from contract.core.modes import CompilationMode
from contract.core.scenario import MAX_NUM_SEQS, Config, ConfigRejected, ConfigRevision, Scenario, post_init


@dataclass(frozen=True)
class DispatcherState:
    """The fields of one ``CudagraphDispatcher`` instance that dispatch reads."""

    uniform_decode_query_len: int  # set in __init__ to 1 + num_speculative_tokens (:36)
    cudagraph_mode: CUDAGraphMode = NONE  # NONE until keys are initialized (:69)
    keys_initialized: bool = False
    keys: frozenset[tuple[CUDAGraphMode, BatchDescriptor]] = frozenset()
    cudagraph_capture_sizes: tuple[int, ...] = ()
    max_cudagraph_capture_size: int | None = None
    # ``_get_lora_cases`` (``:110-128``): ``(0,)`` without LoRA; both the target's and the drafter's
    # dispatcher read the same ``lora_config``, but the drafter dispatches without adapters
    lora_cases: tuple[int, ...] = (0,)


def padded_size(num_tokens: int, capture_sizes: tuple[int, ...]) -> int:
    """``_compute_bs_to_padded_graph_size`` (``:71-108``): the smallest capture size >= n."""
    return min(s for s in capture_sizes if s >= num_tokens) if num_tokens else 0


def _padded_batch_descriptor(d: DispatcherState, num_tokens: int, uniform_decode: bool,
                             num_active_loras: int = 0) -> BatchDescriptor:
    """``_create_padded_batch_descriptor`` (``:130-154``); uses the ``__init__`` query length.
    ``has_lora`` is ``num_active_loras > 0`` wherever vLLM builds one."""
    padded = padded_size(num_tokens, d.cudagraph_capture_sizes)
    lora = {"has_lora": num_active_loras > 0, "num_active_loras": num_active_loras}
    if uniform_decode and d.cudagraph_mode.has_mode(FULL):
        if padded % d.uniform_decode_query_len != 0:
            raise AssertionError("num_tokens_padded % uniform_decode_query_len != 0")
        return BatchDescriptor(padded, min(padded // d.uniform_decode_query_len, MAX_NUM_SEQS), True, **lora)
    return BatchDescriptor(padded, min(padded, MAX_NUM_SEQS), False, **lora)


def initialize_cudagraph_keys(
    d: DispatcherState,
    cudagraph_mode: CUDAGraphMode,
    capture_sizes: tuple[int, ...],
    uniform_decode_query_len: int = 1,
) -> DispatcherState:
    """``initialize_cudagraph_keys`` (``:164-231``): every key once per LoRA case
    (``product(sizes, lora_cases)``). Keys are added to the existing sets, never replaced: only
    ``profile_cudagraph_memory`` clears them."""
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
        for size, loras in product(capture_sizes, d.lora_cases):
            desc = _padded_batch_descriptor(d, size, False, loras)
            if mixed == PIECEWISE:
                desc = replace(desc, num_reqs=None, uniform=False)
            keys.add((mixed, desc))
    if cudagraph_mode.decode_mode() == FULL and cudagraph_mode.separate_routine():
        q = uniform_decode_query_len
        for size, loras in product(capture_sizes, d.lora_cases):
            if q <= size <= q * MAX_NUM_SEQS:
                keys.add((FULL, _padded_batch_descriptor(d, size, True, loras)))
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
    num_active_loras: int = 0,
) -> tuple[CUDAGraphMode, BatchDescriptor]:
    """``dispatch`` (``:233-322``). A batch of k active adapters looks up the smallest captured
    LoRA case >= k (``bisect_left`` over ``captured_lora_counts``, ``:281-298``; without
    ``specialize_active_lora`` the one case is ``max_loras + 1``, the same lookup)."""
    allowed = set(valid_modes or CUDAGraphMode.valid_runtime_modes())
    if invalid_modes:
        allowed -= set(invalid_modes)
    if not allowed:
        raise AssertionError("No allowed cudagraph modes")
    if (
        not d.keys_initialized
        or d.cudagraph_mode == NONE
        or d.max_cudagraph_capture_size is None
        or num_tokens > d.max_cudagraph_capture_size
        or allowed <= {NONE}
    ):
        return NONE, BatchDescriptor(num_tokens)
    captured = sorted(c for c in d.lora_cases if c)
    i = bisect_left(captured, num_active_loras)
    loras = captured[i] if num_active_loras > 0 and i < len(captured) else num_active_loras
    uniform = uniform_decode and d.cudagraph_mode.separate_routine()
    desc = _padded_batch_descriptor(d, num_tokens, uniform, loras)
    if FULL in allowed and (FULL, desc) in d.keys:
        return FULL, desc
    relaxed = replace(desc, num_reqs=None, uniform=False)
    if PIECEWISE in allowed and (PIECEWISE, relaxed) in d.keys:
        return PIECEWISE, relaxed
    if NONE not in allowed:
        raise AssertionError("No matching cudagraph found and NONE is not allowed")
    return NONE, BatchDescriptor(num_tokens)


def get_capture_descs(d: DispatcherState) -> list[tuple[CUDAGraphMode, list[BatchDescriptor]]]:
    """``get_capture_descs`` (``:324-348``): PIECEWISE first, then FULL, largest first, the largest
    LoRA case first within a size."""
    if not d.keys_initialized or d.cudagraph_mode == NONE:
        return []
    out = []
    for mode in (PIECEWISE, FULL):
        descs = sorted((desc for m, desc in d.keys if m == mode), key=lambda b: (b.num_tokens, b.num_active_loras),
                       reverse=True)
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


def normalise(scenario: Scenario, revision: ConfigRevision = ConfigRevision.V0_30) -> Config:
    """``post_init``, then the MRV1 ``CudagraphDispatcher`` constructor assert (``v1/cudagraph_dispatcher.py:48-60``),
    an ``AssertionError`` raised while ``GPUModelRunner.__init__`` builds the dispatcher."""
    config = post_init(scenario, revision)
    mode = config.cudagraph_mode
    attention_compiled_piecewise = (config.compilation_mode == CompilationMode.VLLM_COMPILE
                                    and config.splitting_ops_contain_attention)
    if mode.requires_piecewise_compilation() and not (attention_compiled_piecewise or scenario.breakable):
        # An assert in the runner's constructor, after VllmConfig accepted the settings: a crash
        # at start-up (P0), not a rejection. No modelled scenario reaches it.
        raise ConfigRejected(
            "Compilation mode should be CompilationMode.VLLM_COMPILE when cudagraph_mode piecewise cudagraphs is "
            f"used, and attention should be in splitting_ops (CudagraphDispatcher, cudagraph_mode={mode.name})",
            assertion=True,
        )
    return config
