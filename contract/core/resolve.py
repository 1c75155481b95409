"""``CompilationConfig.resolve_cudagraph_mode_and_sizes`` (``config/compilation.py:1376-1535`` in
vLLM 0.33.0), for the inputs the modelled scenarios vary."""

from __future__ import annotations

from dataclasses import dataclass

from contract.core.modes import FULL, FULL_AND_PIECEWISE, FULL_DECODE_ONLY, NONE, PIECEWISE, AttentionCGSupport, CompilationMode, CUDAGraphMode
from contract.core.scenario import Config


class ResolveRejected(Exception):
    """``resolve_cudagraph_mode_and_sizes`` raised ``ValueError``: the engine does not start."""


@dataclass(frozen=True)
class Resolved:
    cudagraph_mode: CUDAGraphMode
    cudagraph_capture_sizes: tuple[int, ...]


def _round_up(x: int, multiple: int) -> int:
    return (x + multiple - 1) // multiple * multiple


def adjust_cudagraph_sizes_for_spec_decode(sizes: tuple[int, ...], q: int) -> tuple[int, ...]:
    """``adjust_cudagraph_sizes_for_spec_decode`` (``:1537-1565``) without sequence parallelism."""
    if not sizes or q <= 1:
        return sizes
    limit = max(sizes)
    rounded = sorted({_round_up(s, q) for s in sizes if _round_up(s, q) <= limit})
    if not rounded and q <= limit:
        rounded = [q]
    if not rounded:
        raise ResolveRejected(f"No valid cudagraph sizes after rounding to multiple of {q}")
    return tuple(rounded)


def resolve_cudagraph_mode_and_sizes(
    mode: CUDAGraphMode,
    config: Config,
    min_cg_support: AttentionCGSupport,
    uniform_decode_query_len: int,
    use_v2_model_runner: bool,
    capture_sizes: tuple[int, ...],
    piecewise_capture_available: bool = True,
) -> Resolved:
    """The steps of spec §8.2, in source order.

    Step 2 is the late upgrade: FULL with less than ALWAYS support becomes FULL_AND_PIECEWISE when
    ``splitting_ops_contain_attention()`` (``:1395-1419``), else FULL_DECODE_ONLY. It runs after
    ``load_model`` has wrapped and after the first forward has compiled, so a policy that decided
    on "has piecewise" at load time misses the upgrade.
    """
    if mode == NONE:
        return Resolved(NONE, capture_sizes)
    support = min_cg_support.value
    if mode.mixed_mode() == FULL and min_cg_support != AttentionCGSupport.ALWAYS:
        if min_cg_support == AttentionCGSupport.NEVER:
            raise ResolveRejected(f"CUDAGraphMode.{mode.name} is not supported (support: NEVER)")
        mode = FULL_AND_PIECEWISE if config.splitting_ops_contain_attention else FULL_DECODE_ONLY
    if mode.decode_mode() == FULL and min_cg_support == AttentionCGSupport.NEVER:
        compiled_piecewise = (
            config.compilation_mode == CompilationMode.VLLM_COMPILE and config.splitting_ops_contain_attention
        )
        mode = PIECEWISE if compiled_piecewise else NONE
    if (
        mode.decode_mode() == FULL
        and uniform_decode_query_len > 1
        and support < AttentionCGSupport.UNIFORM_BATCH.value
    ):
        mode = PIECEWISE if config.splitting_ops_contain_attention else NONE
    if not piecewise_capture_available and mode.requires_piecewise_compilation():
        mode = mode.without_piecewise()
    if mode.has_full_cudagraphs() and min_cg_support == AttentionCGSupport.NEVER:
        raise ResolveRejected(f"CUDAGraphMode.{mode.name} is not supported (support: NEVER)")
    if not use_v2_model_runner and mode.decode_mode() == FULL and uniform_decode_query_len > 1:
        capture_sizes = adjust_cudagraph_sizes_for_spec_decode(capture_sizes, uniform_decode_query_len)
    return Resolved(mode, capture_sizes)


def mamba_blocks_rejected(mode: CUDAGraphMode, mamba_cache_blocks: int | None, max_num_reqs: int,
                          is_profiling: bool) -> bool:
    """Resolve's last check, on the mode it resolved (``34:config/compilation.py:1659-1681``,
    ``33:…:1510-1532``): a hybrid model's FULL graphs run the Mamba decode kernel on one cache block per
    request, up to ``max_num_seqs`` requests; memory profiling's minimal cache is not checked."""
    return (mamba_cache_blocks is not None and mode.has_full_cudagraphs() and not is_profiling
            and max_num_reqs > mamba_cache_blocks)


def mamba_blocks_rejection(max_num_reqs: int, mamba_cache_blocks: int) -> str:
    """The refusal's text, as ``contract/real/errors.py`` writes vLLM's ``ValueError``."""
    return f"max_num_seqs ({max_num_reqs}) exceeds available Mamba cache blocks ({mamba_cache_blocks})"
