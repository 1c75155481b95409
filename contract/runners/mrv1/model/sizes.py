"""The capture sizes Model Runner V1 serves from and the graphs its ``CudagraphDispatcher`` keys
for them (vLLM 0.33.0), and so the best graph each batch could be served with: the reference P8
holds vLLM's dispatch to (``contract/core/sizes.py``).

The sizes: ``VllmConfig``'s derivation (``contract/core/capture_sizes.py``, 0.33), then, when the
runner resolves a FULL decode mode with speculative decoding, ``adjust_cudagraph_sizes_for_spec_decode``
rounds them up to multiples of ``q`` within the largest (``33:config/compilation.py:1496-1508``,
``:1537-1565``; MRV2 skips it). The graphs follow ``initialize_cudagraph_keys``
(``33:v1/cudagraph_dispatcher.py:164-231``) without LoRA: the mixed mode's graph at every capture
size, holding ``min(size, max_num_seqs)`` requests when FULL; and, when the decode routine is
separate and FULL, uniform decode graphs at the capture sizes from ``q`` to ``max_num_seqs * q``,
holding ``min(size // q, max_num_seqs)`` requests.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from contract.core.capture_sizes import Derived, derive
from contract.core.modes import FULL, NONE, CUDAGraphMode
from contract.core.resolve import ResolveRejected, adjust_cudagraph_sizes_for_spec_decode
from contract.core.sizes import Batch, SizeSetting


def sizes(s: SizeSetting, release: str) -> Derived:
    """The lists the dispatcher keys from: the derivation, then the runner's spec-decode rounding."""
    d = derive(s, release)
    mode = CUDAGraphMode[d.cudagraph_mode]
    if d.rejected is not None or mode.decode_mode() != FULL or s.q <= 1 or not d.cudagraph_capture_sizes:
        return d  # 33:config/compilation.py:1538-1540: nothing to round
    try:
        rounded = adjust_cudagraph_sizes_for_spec_decode(d.cudagraph_capture_sizes, s.q)
    except ResolveRejected as exc:
        return Derived(rejected=f"ValueError: {exc}")
    return replace(d, cudagraph_capture_sizes=rounded, max_cudagraph_capture_size=max(rounded))


@dataclass(frozen=True)
class Graphs:
    """The dispatcher's keys: uniform decode token counts (FULL) and token counts of ``mixed_mode``."""

    decode: tuple[int, ...]
    mixed_mode: CUDAGraphMode
    tokens: tuple[int, ...]


def graphs(s: SizeSetting, derived: Derived) -> Graphs:
    mode = CUDAGraphMode[derived.cudagraph_mode]
    if mode == NONE:
        return Graphs((), NONE, ())
    decode: tuple[int, ...] = ()
    if mode.separate_routine() and mode.decode_mode() == FULL:
        decode = tuple(x for x in derived.cudagraph_capture_sizes if s.q <= x <= s.max_num_seqs * s.q)
    mixed = mode.mixed_mode()
    return Graphs(decode, mixed, derived.cudagraph_capture_sizes if mixed != NONE else ())


def best(s: SizeSetting, g: Graphs, b: Batch) -> CUDAGraphMode:
    """The strongest mode a keyed graph could serve ``b`` with."""
    if b.kind == "decode" and b.uniform_token_count == s.q and any(
            t >= b.num_tokens and min(t // s.q, s.max_num_seqs) >= b.num_reqs for t in g.decode):
        return FULL
    for t in g.tokens:
        if t >= b.num_tokens and (g.mixed_mode != FULL or min(t, s.max_num_seqs) >= b.num_reqs):
            return g.mixed_mode
    return NONE


def reference(s: SizeSetting, derived: Derived, release: str):
    """``best`` over the graphs of ``derived``: the family's ``best_graph``."""
    g = graphs(s, derived)
    return lambda b: best(s, g, b)
