"""``VllmConfig._set_cudagraph_sizes`` and 0.34's ``_split_cudagraph_capture_sizes`` as pure functions:
the capture size lists vLLM derives from a ``SizeSetting`` (``contract/core/sizes.py``).

The path modelled is the one a user without a Blackwell GPU takes: the ``balanced`` performance
mode, no adaptive verification, and of 0.34's split settings only
``decode_cudagraph_capture_request_sizes`` given (not ``prefill_cudagraph_capture_token_sizes`` nor
the maxima); dynamic speculative decoding's schedule is read per batch size
(``SizeSetting.query_lens``). Line numbers: ``33:config/vllm.py``
and ``34:config/vllm.py`` of the releases, ``34:config/compilation.py`` for the grids.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from contract.core.modes import NONE, CUDAGraphMode
from contract.core.sizes import DEFAULT_MAX_GRAPH_SIZE, SizeSetting

RELEASES = ("0.33", "0.34")
TRUNCATING = "Truncating max_cudagraph_capture_size to {}"  # 33:…:2626-2629, 34:…:2525-2528
# Speculators whose draft steps after the first run one-token decode graphs (34:config/vllm.py:711-730):
# the replay's drafter is EAGLE.
DRAFT_DECODE_MIN_TOKENS = 2


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Derived:
    """What ``compilation_config`` holds after the derivation; ``rejected`` is vLLM's
    ``ValueError`` (then nothing else is set) and ``logged`` the downgrades it logs."""

    cudagraph_mode: str = NONE.name
    cudagraph_capture_sizes: tuple[int, ...] = ()
    max_cudagraph_capture_size: int = 0
    prefill_cudagraph_capture_token_sizes: tuple[int, ...] | None = None  # 0.34
    decode_cudagraph_capture_request_sizes: tuple[int, ...] | None = None  # 0.34
    logged: tuple[str, ...] = ()
    rejected: str | None = None

    def lists(self) -> dict:
        """The derived fields the real side reports, by vLLM's names (0.33 has no split)."""
        out = {"cudagraph_capture_sizes": list(self.cudagraph_capture_sizes),
               "max_cudagraph_capture_size": self.max_cudagraph_capture_size}
        if self.prefill_cudagraph_capture_token_sizes is not None:
            out["prefill_cudagraph_capture_token_sizes"] = list(self.prefill_cudagraph_capture_token_sizes)
            out["decode_cudagraph_capture_request_sizes"] = list(self.decode_cudagraph_capture_request_sizes or ())
        return out


def _walk_grid(limit: int, step: Callable[[int], float]) -> list[int]:
    """``34:config/compilation.py:78-86``."""
    grid, size = [], 1
    while size < limit:
        grid.append(size)
        stride = 1 << max(0, math.floor(math.log2(max(1.0, step(size)))))
        size = (size // stride + 1) * stride
    return [*grid, limit] if limit else []


def decode_cudagraph_capture_grid(max_requests: int) -> list[int]:
    """``34:config/compilation.py:122-126``."""
    return _walk_grid(max_requests, lambda n: 0.65 * n ** (2 / 3))


def decode_cudagraph_capture_shapes(sizes: Iterable[int], query_lens: Mapping[int, int],
                                    max_tokens: int) -> list[tuple[int, int]]:
    """``34:config/compilation.py:54-68``: the ``(num_reqs, q)`` uniform decode graphs."""
    sizes = sorted(set(sizes))
    shapes: set[tuple[int, int]] = set()
    for q, max_reqs in query_lens.items():
        limit = min(max_reqs, max_tokens // q)
        reachable = sizes[: bisect.bisect_left(sizes, limit) + 1]
        shapes.update((min(n, limit), q) for n in reachable if limit >= 1)
    return sorted(shapes, key=lambda s: (s[1], s[0]))


def _request_counts(max_reqs: int) -> list[int]:
    """The request grid of speculative decode sizes (``34:config/vllm.py:2425-2432``)."""
    max_reqs = min(max_reqs, DEFAULT_MAX_GRAPH_SIZE)
    counts = [n for n in (1, 2, 4) if n <= max_reqs]
    counts += list(range(8, min(max_reqs + 1, 256), 8))
    counts += list(range(256, max_reqs + 1, 16))
    return sorted(set(counts + [max_reqs]))


def _shared(s: SizeSetting) -> Derived:
    """The shared sizes, alike in both releases (``33:…:2447-2650``, ``34:…:2367-2554``)."""
    q, mns, tokens = s.q, s.max_num_seqs, s.max_num_batched_tokens
    max_size = s.max_cudagraph_capture_size
    uniform_decode_sizes: list[int] = []
    if max_size is None:
        max_size = min(mns * q * 2, DEFAULT_MAX_GRAPH_SIZE)
        if q > 1:  # each decode query length up to the widest batch running at it
            uniform_decode_sizes = sorted({n * ql for ql, widest in s.query_lens().items()
                                           for n in _request_counts(widest) if n * ql <= max_size})
        elif mns <= max_size:
            uniform_decode_sizes = [mns]
    max_size = min(tokens, max_size)
    if max_size < 1:
        raise AssertionError("Maximum cudagraph size should be greater than or equal to 1 when using cuda graph.")
    if s.cudagraph_capture_sizes is not None:
        sizes = sorted({i for i in s.cudagraph_capture_sizes if i <= tokens})
    else:
        sizes = [i for i in (1, 2, 4) if i <= max_size]
        if max_size >= 8:
            sizes += list(range(8, min(max_size + 1, 256), 8))
        if max_size >= 256:
            sizes += list(range(256, max_size + 1, 16))
        if tokens <= max_size and tokens not in sizes:
            sizes.append(tokens)
        sizes += [x for x in uniform_decode_sizes if x <= tokens]
        sizes = sorted(set(sizes))
    valid_max = sizes[-1] if sizes else 0
    logged: tuple[str, ...] = ()
    if s.max_cudagraph_capture_size is not None and s.max_cudagraph_capture_size != valid_max:
        if s.cudagraph_capture_sizes is not None:
            return Derived(rejected=f"ValueError: customized max_cudagraph_capture_size(={s.max_cudagraph_capture_size}) "
                                    f"should be consistent with the max value of cudagraph_capture_sizes(={valid_max})")
        logged = (TRUNCATING.format(valid_max),)
    return Derived(s.cudagraph_mode, tuple(sizes), valid_max, logged=logged)


def _split(s: SizeSetting, shared: Derived) -> Derived:
    """``_split_cudagraph_capture_sizes`` off Blackwell (``34:config/vllm.py:2558-2737``): prefill
    tokens are the shared sizes, decode requests the given ones within ``max_num_seqs``, else what
    each shared size rounds up to within the shared maximum; the recorded sizes are every graph's
    token count (decode shapes, the drafter's one-token decode shapes, prefill sizes)."""
    mns, tokens = s.max_num_seqs, s.max_num_batched_tokens
    legacy = s.cudagraph_capture_sizes is not None or s.max_cudagraph_capture_size is not None
    shared_sizes, shared_max = shared.cudagraph_capture_sizes, shared.max_cudagraph_capture_size
    prefill = tuple(shared_sizes)
    query_lens = s.query_lens()
    if s.decode_cudagraph_capture_request_sizes is not None:  # given: kept within [1, max_num_seqs] (34:…:2613-2654)
        decode = tuple(sorted({n for n in s.decode_cudagraph_capture_request_sizes if 1 <= n <= mns}))
    else:
        decode = tuple(sorted({min(cdiv(x, ql), mns) for x in shared_sizes for ql in query_lens
                               if cdiv(x, ql) * ql <= shared_max}))
    decode_tokens = {n * qq for n, qq in decode_cudagraph_capture_shapes(decode, query_lens, tokens)}
    if s.num_speculative_tokens >= DRAFT_DECODE_MIN_TOKENS and decode:
        decode_tokens |= {n for n, _ in decode_cudagraph_capture_shapes(decode_cudagraph_capture_grid(mns),
                                                                      {1: mns}, tokens)}
    token_sizes = decode_tokens | set(prefill)
    split = s.decode_cudagraph_capture_request_sizes is not None
    if not (legacy and not split) and CUDAGraphMode[s.cudagraph_mode].mixed_mode() == NONE:
        token_sizes = set(decode_tokens)  # 34:…:2713-2716
    if legacy and split:  # the deprecated sizes stand only where they are what the split records (34:…:2717-2730)
        if list(shared_sizes) not in (sorted(decode_tokens | set(prefill)), sorted(decode_tokens)):
            return Derived(rejected="ValueError: The deprecated cudagraph_capture_sizes and max_cudagraph_capture_size "
                                    "cannot be combined with the prefill and decode CUDA graph capture sizes")
        token_sizes = set(shared_sizes)
    mode = s.cudagraph_mode if token_sizes else NONE.name  # 34:…:2733-2737
    return Derived(mode, tuple(sorted(token_sizes)), max(token_sizes, default=0), prefill, decode, shared.logged)


def derive(s: SizeSetting, release: str) -> Derived:
    """The lists ``release`` ("0.33", "0.34") derives from ``s``."""
    if CUDAGraphMode[s.cudagraph_mode] == NONE or s.enforce_eager:  # 34:config/vllm.py:1915-1919, :2371-2375
        return Derived()
    if release == "0.33" and s.decode_cudagraph_capture_request_sizes is not None:
        return Derived(rejected="ValueError: CompilationConfig has no field decode_cudagraph_capture_request_sizes")
    shared = _shared(s)
    if shared.rejected is not None or release == "0.33":
        return shared
    return _split(s, shared)
