"""``CudaGraphManager`` (``v1/worker/gpu/cudagraph_utils.py``, vLLM 0.33.0 and 0.34.0) as pure
functions over an immutable manager value.

A manager owns the FULL graphs it captured around a NONE-mode forward (``self.graphs``, keyed by
``BatchExecutionDescriptor``) and, for PIECEWISE, routes to its breakable runner or to the model.
Candidates follow ``_init_candidates``; dispatch follows ``dispatch`` and ``_is_compatible``. Every
descriptor is built once per LoRA capture case (``lora_cases``; ``(0,)`` without LoRA and for every
speculator manager); under micro-batching each FULL one that splits gets its twin
(``ubatch_utils.py``), and ``num_ubatches`` is written out only when above 1.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from itertools import groupby

from contract.core.capture_sizes import cdiv, decode_cudagraph_capture_shapes
from contract.core.modes import FULL, NONE, PIECEWISE, CUDAGraphMode
from contract.core.scenario import MAX_NUM_SEQS
from contract.core.ubatch_utils import UBatching
from contract.runners.mrv2.model.ubatch_utils import ubatch_twin

RELEASES = ("0.33", "0.34")


@dataclass(frozen=True)
class BatchExecutionDescriptor:
    """``33:…/cudagraph_utils.py:70-85``, ``34:…:74-89``; ``num_active_loras`` is written out only
    when not 0, ``num_ubatches`` only when above 1."""

    cg_mode: CUDAGraphMode
    num_tokens: int
    num_reqs: int | None = None
    uniform_token_count: int | None = None
    max_query_len: int | None = None
    num_active_loras: int = 0
    num_ubatches: int = 1

    def __str__(self) -> str:
        extra = "".join(f",{k}={v}" for k, v in (("utc", self.uniform_token_count), ("mql", self.max_query_len),
                                                   ("loras", self.num_active_loras or None),
                                                   ("ubatches", self.num_ubatches if self.num_ubatches > 1 else None))
                        if v is not None)
        reqs = "" if self.num_reqs is None else f",{self.num_reqs}"
        return f"BED({self.cg_mode.name},{self.num_tokens}{reqs}{extra})"

    def to_json(self) -> dict:
        out = {"num_tokens": self.num_tokens, "num_reqs": self.num_reqs,
               "uniform_token_count": self.uniform_token_count, "max_query_len": self.max_query_len}
        if self.num_active_loras:
            out["num_active_loras"] = self.num_active_loras
        if self.num_ubatches > 1:
            out["num_ubatches"] = self.num_ubatches
        return out

    @classmethod
    def from_json(cls, data: dict, cg_mode: CUDAGraphMode) -> BatchExecutionDescriptor:
        """The descriptor a dispatch recorded; its ``cg_mode`` is the dispatch's runtime mode."""
        return cls(cg_mode, data["num_tokens"], data.get("num_reqs"), data.get("uniform_token_count"),
                   data.get("max_query_len"), data.get("num_active_loras", 0), data.get("num_ubatches", 1))


BED = BatchExecutionDescriptor


def is_compatible(desc: BED, num_reqs: int, num_tokens: int, uniform_token_count: int | None,
                  max_query_len: int | None, num_active_loras: int = 0, num_ubatches: int = 1) -> bool:
    """``_is_compatible`` (``33:…:111-138``, ``34:…:115-142``)."""
    return (
        (desc.uniform_token_count is None or desc.uniform_token_count == uniform_token_count)
        and (desc.max_query_len is None or (max_query_len is not None and desc.max_query_len >= max_query_len))
        and (desc.num_reqs is None or desc.num_reqs >= num_reqs)
        and desc.num_tokens >= num_tokens
        and desc.num_active_loras == num_active_loras
        and desc.num_ubatches == num_ubatches
    )


def effective_loras(lora_cases: tuple[int, ...], num_active_loras: int) -> int:
    """``_resolve_effective_loras`` over ``_build_lora_dispatch_map`` (``33:…:203-227``,
    ``34:…:236-260``): the smallest captured case >= k, the largest beyond it; 0 stays 0."""
    if num_active_loras <= 0:
        return num_active_loras
    with_lora = sorted(c for c in lora_cases if c > 0)
    if not with_lora:
        return num_active_loras
    return next((c for c in with_lora if c >= num_active_loras), with_lora[-1])


def round_up(x: int, multiple: int) -> int:
    return (x + multiple - 1) // multiple * multiple


@dataclass(frozen=True)
class CudaGraphManager:
    """The fields of one manager instance that capture and dispatch read."""

    layer: str  # "target:CudaGraphManager", "drafter:CudaGraphManager(prefill)", ...
    cudagraph_mode: CUDAGraphMode
    built_from: tuple  # the inputs of _init_candidates; the three tables below are a function of them
    capture_descs: tuple[tuple[CUDAGraphMode, tuple[BED, ...]], ...] = field(compare=False)  # PIECEWISE first
    # `_candidates[(num_tokens, loras)]`: per LoRA case (lora_cases' order), index = num_tokens
    candidates: tuple[tuple[tuple[BED, ...], ...], ...] = field(compare=False)
    decode_descs: tuple[tuple[tuple[int, int, int], tuple[BED, ...]], ...] = field(compare=False)  # 0.34 by (q, loras, ubatches)
    use_breakable_cg: bool = False
    breakable_runner: bool = False  # init_breakable_cg_runner ran
    key_fn: bool = False  # the breakable runner keys entries by (BD, spec_step_idx % num_layers)
    graphs: frozenset[BED] = frozenset()
    graphs_captured: bool = False
    lora_cases: tuple[int, ...] = (0,)  # self.lora_capture_cases
    ubatching: UBatching | None = None  # the micro-batch runner's settings; None: no runner

    @property
    def runner_layer(self) -> str:
        return self.layer.split(":")[0] + ":breakable_cg_runner"


def split_decode_request_sizes(capture_sizes: tuple[int, ...], target_q: int) -> list[int]:
    """``_split_cudagraph_capture_sizes`` for the legacy shared sizes (``34:config/vllm.py:2660-2668``):
    the request counts each target query length rounds the shared sizes up to."""
    shared_max = max(capture_sizes, default=0)
    return sorted({min(cdiv(s, target_q), MAX_NUM_SEQS) for s in capture_sizes if cdiv(s, target_q) * target_q <= shared_max})


def _varlen_sizes(release: str, capture_sizes: tuple[int, ...], q: int, target_q: int) -> list[int]:
    """Adaptive verification's varlen FULL decode sizes: 0.33 the capture sizes up to
    ``max_num_reqs * q`` (``33:…:310-318``); 0.34 ``get_varlen_decode_cudagraph_token_sizes``,
    the grid 1, 2, 4, 8, … up to ``max_decode_cudagraph_capture_requests * q``
    (``34:config/vllm.py:732-747``, ``34:config/compilation.py:102-116``)."""
    if release == "0.33":
        return [n for n in sorted(capture_sizes) if n <= MAX_NUM_SEQS * q]
    max_requests = max(split_decode_request_sizes(capture_sizes, target_q), default=0)
    # min() with max_num_batched_tokens (34:config/vllm.py:741-747) never binds at these sizes.
    return varlen_decode_cudagraph_capture_grid(max_requests * q)


def varlen_decode_cudagraph_capture_grid(max_tokens: int) -> list[int]:
    """``34:config/compilation.py:102-119``: 1, 2, 4, then four sizes per doubling from 8, every
    size below ``max_tokens`` and ``max_tokens`` itself (so 3 and 6 are captured at q = 3)."""
    grid = {1, 2, 4, 8}
    low = 8
    while low < 1024:
        grid.update(range(low + low // 4, 2 * low + 1, low // 4))
        low *= 2
    return sorted({n for n in grid if n < max_tokens} | {max_tokens}) if max_tokens else []


def build(layer: str, release: str, mode: CUDAGraphMode, capture_sizes: tuple[int, ...], q: int, *,
          target_q: int, use_breakable_cg: bool, varlen_decode: bool = False,
          decode_request_sizes: list[int] | None = None, lora_cases: tuple[int, ...] = (0,),
          breakable_pads_requests: bool = False, ubatching: UBatching | None = None,
          twin: Callable = ubatch_twin) -> CudaGraphManager:
    """``CudaGraphManager.__init__`` + ``_init_candidates`` (``33:…:256-394``, ``34:…:289-426``): each
    descriptor once per LoRA case, the case varying fastest (``product(sizes, lora_capture_cases)``).
    Token-keyed PIECEWISE descriptors pad no requests (``num_reqs=None``, ``33:…:355-363``,
    ``34:…:364-372``): break-point kernels read the real batch; ``breakable_pads_requests`` pads them
    under a breakable runner as FULL ones are (vLLM #48822, mutants only). Each FULL descriptor's
    micro-batch twin follows it (``_maybe_ubatch_twin`` after each ``append``, ``33:…:345-348,372-374``,
    ``34:…:353-355,381-383``)."""
    pads = use_breakable_cg and breakable_pads_requests
    token_keyed, decode = _descs_0_33(mode, capture_sizes, q, varlen_decode, lora_cases, pads) if release == "0.33" \
        else _descs_0_34(mode, capture_sizes, q, target_q, varlen_decode, decode_request_sizes, lora_cases, pads)
    if ubatching is not None:
        token_keyed = _with_twins(token_keyed, ubatching, twin, dedup=False)
        decode = _with_twins(decode, ubatching, twin, dedup=release == "0.33")
    by_mode: dict[CUDAGraphMode, list[BED]] = {}
    for d in decode + token_keyed:
        by_mode.setdefault(d.cg_mode, []).append(d)
    capture = tuple((m, tuple(sorted(by_mode[m], key=lambda d: d.num_tokens, reverse=True)))
                    for m in (PIECEWISE, FULL) if m in by_mode)
    # 0.33 puts decode descriptors among the token-keyed FULL groups; 0.34 keeps them apart.
    keyed = token_keyed + decode if release == "0.33" else token_keyed
    limit = max((d.num_tokens for d in keyed), default=0)
    candidates = []
    for loras in lora_cases:
        per_tokens: list[list[BED]] = [[] for _ in range(limit + 1)]
        for m in (FULL, PIECEWISE):
            mode_descs = sorted((d for d in keyed if d.cg_mode == m and d.num_active_loras == loras),
                                key=lambda d: d.num_tokens)
            start = 0
            for num_tokens, group in groupby(mode_descs, lambda d: d.num_tokens):
                matching = list(group)
                for i in range(start, num_tokens + 1):
                    per_tokens[i].extend(matching)
                start = num_tokens + 1
        candidates.append(tuple(tuple(c) for c in per_tokens))
    tables = []
    if release == "0.34":
        for key in sorted({(d.uniform_token_count, d.num_active_loras, d.num_ubatches) for d in decode}):
            table: list[BED] = []
            for d in sorted((d for d in decode if (d.uniform_token_count, d.num_active_loras, d.num_ubatches) == key),
                            key=lambda d: d.num_tokens):
                table.extend([d] * (d.num_reqs + 1 - len(table)))
            tables.append((key, tuple(table)))
    built_from = (release, capture_sizes, q, target_q, varlen_decode,
                  None if decode_request_sizes is None else tuple(decode_request_sizes), lora_cases, ubatching,
                  twin)
    return CudaGraphManager(layer, mode, built_from, capture, tuple(candidates), tuple(tables),
                            use_breakable_cg=use_breakable_cg, lora_cases=lora_cases, ubatching=ubatching)


def _with_twins(descs: list[BED], u: UBatching, twin_of: Callable, dedup: bool) -> list[BED]:
    """Each descriptor, then its micro-batch twin where it has one; 0.33's decode loop skips a twin
    already listed (``33:…:345-348``). Varlen decode descriptors get none (``33:…:309-317``,
    ``34:…:314-329``)."""
    out: list[BED] = []
    for d in descs:
        out.append(d)
        twin = None if d.max_query_len is not None else twin_of(u, d)
        if twin is not None and not (dedup and twin in out):
            out.append(twin)
    return out


def _descs_0_33(mode, sizes, q, varlen, lora_cases, pads=False):
    token_keyed: list[BED] = []
    decode: list[BED] = []
    if not (mode and sizes):
        return token_keyed, decode
    max_decode_tokens = MAX_NUM_SEQS * q
    max_capture = max(sizes)
    decode_mode, mixed_mode = mode.decode_mode(), mode.mixed_mode()
    separate = mode.separate_routine()
    for n in sorted(sizes):
        for loras in lora_cases:
            if separate and decode_mode and varlen and n <= max_decode_tokens:
                token_keyed.append(BED(decode_mode, n, min(n, MAX_NUM_SEQS), max_query_len=q, num_active_loras=loras))
            elif separate and decode_mode and not varlen:
                rn = round_up(n, q)
                if not (rn > max_decode_tokens or rn > max_capture or rn // q > MAX_NUM_SEQS):
                    d = BED(decode_mode, rn, rn // q, uniform_token_count=q, num_active_loras=loras)
                    if d not in decode:
                        decode.append(d)
            if mixed_mode:
                token_keyed.append(BED(mixed_mode, n, min(n, MAX_NUM_SEQS) if mixed_mode == FULL or pads else None,
                                       num_active_loras=loras))
    return token_keyed, decode


def _descs_0_34(mode, sizes, q, target_q, varlen, decode_request_sizes, lora_cases, pads=False):
    token_keyed: list[BED] = []
    decode: list[BED] = []
    if mode == NONE:
        return token_keyed, decode
    decode_mode, mixed_mode = mode.decode_mode(), mode.mixed_mode()
    max_tokens = max(sizes, default=0)
    if mode.separate_routine() and decode_mode != NONE:
        if varlen:
            token_keyed += [BED(decode_mode, n, min(n, MAX_NUM_SEQS), max_query_len=q, num_active_loras=loras)
                            for n in _varlen_sizes("0.34", sizes, q, target_q) for loras in lora_cases]
        else:
            request_sizes = decode_request_sizes
            if request_sizes is None:
                request_sizes = split_decode_request_sizes(sizes, target_q)
            for n, uq in decode_cudagraph_capture_shapes(request_sizes, {q: MAX_NUM_SEQS}, max_tokens):
                decode += [BED(decode_mode, n * uq, n, uniform_token_count=uq, num_active_loras=loras)
                           for loras in lora_cases]
    if mixed_mode:
        for n in sorted(sizes):
            token_keyed += [BED(mixed_mode, n, min(n, MAX_NUM_SEQS) if mixed_mode == FULL or pads else None,
                                num_active_loras=loras) for loras in lora_cases]
    return token_keyed, decode


def dispatch(m: CudaGraphManager | None, num_reqs: int, num_tokens: int, uniform_token_count: int | None,
             max_query_len: int | None = None, num_active_loras: int = 0, num_ubatches: int = 1) -> BED:
    """``dispatch`` (``33:…:523-553``, ``34:…:558-602``): NONE until ``_graphs_captured``; 0.34
    tries the decode table of the batch's query length (and micro-batch count) first; k active
    adapters look up the LoRA case ``effective_loras`` gives, and a NONE descriptor carries it and
    the micro-batch count too."""
    loras = num_active_loras if m is None or not num_active_loras else effective_loras(m.lora_cases, num_active_loras)
    if m is not None and m.graphs_captured and num_tokens > 0:
        by_tokens = m.candidates[0] if not loras else m.candidates[m.lora_cases.index(loras)] \
            if loras in m.lora_cases else ()
        candidates = list(by_tokens[num_tokens]) if num_tokens < len(by_tokens) else []
        if uniform_token_count is not None:
            table = dict(m.decode_descs).get((uniform_token_count, loras, num_ubatches), ())
            n = cdiv(num_tokens, uniform_token_count)
            if n < len(table):
                candidates = [table[n], *candidates]
        for desc in candidates:
            if is_compatible(desc, num_reqs, num_tokens, uniform_token_count, max_query_len, loras, num_ubatches):
                return desc
    return BED(NONE, num_tokens, num_reqs, num_active_loras=loras, num_ubatches=num_ubatches)


def specialize_spec_tokens(m: CudaGraphManager, desc: BED) -> BED:
    """``SpeculatorCudaGraphManager.specialize_spec_tokens`` (``33:…/target_dependent_ar/cudagraph_utils.py:37-47``):
    without dynamic speculative decoding a captured FULL descriptor is kept; a FULL descriptor
    with no graph becomes NONE instead of reaching ``run_fullgraph``'s assertion."""
    if desc.cg_mode != FULL or desc in m.graphs:
        return desc
    return replace(desc, cg_mode=NONE)
