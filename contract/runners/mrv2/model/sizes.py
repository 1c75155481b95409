"""Which graphs MRV2's ``CudaGraphManager`` captures for derived capture sizes
(``contract/core/capture_sizes.py``), and so the best graph each batch could be served with: the
reference P8 holds vLLM's dispatch to (``contract/core/sizes.py``).

Graphs follow ``_init_candidates`` without LoRA, micro-batching or adaptive verification:

- uniform decode graphs, when ``cudagraph_mode`` has a separate decode routine with a graph mode:
  0.33 rounds every capture size up to a multiple of each decode query length (``q``, or every
  length dynamic speculative decoding's schedule runs, ``33:v1/worker/gpu/cudagraph_utils.py:273-300``)
  and keeps those within ``max_num_seqs * q`` tokens, the largest capture size and ``max_num_seqs``
  requests (``33:…:319-343``); 0.34 takes the ``(num_reqs, query length)`` shapes of the decode
  request sizes within the recorded maximum (``34:…:335-357``);
- token-keyed graphs of the mixed mode at every capture size (0.33, ``33:…:351-369``) or prefill
  size (0.34, ``34:…:359-380``), holding ``min(tokens, max_num_seqs)`` requests when FULL.
"""

from __future__ import annotations

from dataclasses import dataclass

from contract.core.capture_sizes import Derived, cdiv, decode_cudagraph_capture_shapes
from contract.core.modes import FULL, NONE, CUDAGraphMode
from contract.core.sizes import Batch, SizeSetting


@dataclass(frozen=True)
class Graphs:
    """The graphs a manager holds: decode ``(num_reqs, q)`` shapes of ``decode_mode`` and token
    counts of ``mixed_mode``."""

    decode_mode: CUDAGraphMode
    decode: tuple[tuple[int, int], ...]
    mixed_mode: CUDAGraphMode
    tokens: tuple[int, ...]


def graphs(s: SizeSetting, derived: Derived, release: str) -> Graphs:
    mode = CUDAGraphMode[derived.cudagraph_mode]
    if mode == NONE:
        return Graphs(NONE, (), NONE, ())
    q, mns = s.q, s.max_num_seqs
    decode: tuple[tuple[int, int], ...] = ()
    if mode.separate_routine() and mode.decode_mode() != NONE:
        if release == "0.33":  # every query length the schedule runs (33:…:276-300)
            rounded = {(cdiv(x, ql) * ql, ql) for x in derived.cudagraph_capture_sizes for ql in s.query_lens()}
            decode = tuple(sorted((t // ql, ql) for t, ql in rounded
                                  if t <= mns * q and t <= derived.max_cudagraph_capture_size and t // ql <= mns))
        else:
            decode = tuple(decode_cudagraph_capture_shapes(derived.decode_cudagraph_capture_request_sizes or (),
                                                           s.query_lens(), derived.max_cudagraph_capture_size))
    tokens = derived.cudagraph_capture_sizes if release == "0.33" else derived.prefill_cudagraph_capture_token_sizes
    mixed = mode.mixed_mode()
    return Graphs(mode.decode_mode(), decode, mixed, tuple(sorted(tokens or ())) if mixed != NONE else ())


def best(s: SizeSetting, g: Graphs, b: Batch) -> CUDAGraphMode:
    """The strongest mode a captured graph could serve ``b`` with: a decode graph of its query length
    (a partial batch too, where dynamic speculative decoding runs at its length), else a token-keyed one."""
    if g.decode_mode == FULL and any(n >= b.num_reqs and qq == b.uniform_token_count for n, qq in g.decode):
        return FULL
    for t in g.tokens:
        if t >= b.num_tokens and (g.mixed_mode != FULL or min(t, s.max_num_seqs) >= b.num_reqs):
            return g.mixed_mode
    return NONE


def reference(s: SizeSetting, derived: Derived, release: str):
    """``best`` over the graphs of ``derived``: the family's ``best_graph``."""
    g = graphs(s, derived, release)
    return lambda b: best(s, g, b)
