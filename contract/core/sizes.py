"""Capture sizes against the scheduler's limits, and P8, graph coverage, over the graph vLLM's own
code serves each batch with.

A ``SizeSetting`` is what a user passes (``--max-num-seqs``, ``--max-num-batched-tokens``, the
speculative token count, ``cudagraph_mode`` and the capture sizes or their maximum); vLLM derives the
capture size lists from it (``VllmConfig._set_cudagraph_sizes``, ``34:config/vllm.py:2322-2556``,
``33:config/vllm.py:2398-2656``; modelled in ``contract/core/capture_sizes.py``) and the runner's
manager picks a graph per batch (``CudaGraphManager.dispatch``,
``34:v1/worker/gpu/cudagraph_utils.py:558-602``). The grid holds the boundary values where that
derivation has steps: one request, sizes of the 8-stride ladder and one past them, ``max_num_seqs``
off the stride, ``max_num_batched_tokens`` off the stride and under the capture ceiling, query
lengths that do not divide the ladder, an explicit list and an explicit maximum. Every batch up to
one past the ceiling is dispatched: each is a dictionary lookup.

**P8** (graph coverage): each batch is served by a graph at least as strong (NONE < PIECEWISE <
FULL) as the best one the release's documented sizes give for it (the model's derivation and the
graphs its manager captures from them: ``best``), never by a graph smaller than the batch, and never
in a runtime mode the configured ``cudagraph_mode`` does not name for the batch's routine
(monotonicity: FULL_DECODE_ONLY names FULL for uniform decode batches and nothing for mixed ones,
FULL_AND_PIECEWISE FULL or PIECEWISE for uniform decode batches and PIECEWISE for mixed ones). A weaker graph is a silent eager fallback: PIECEWISE runs attention eagerly, NONE everything. What vLLM
logs when it serves fewer batches than the settings ask for (``DOWNGRADES``) is part of the
documented derivation, listed with the setting, never a violation.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from contract.core.modes import FULL, FULL_AND_PIECEWISE, NONE, PIECEWISE, CUDAGraphMode

DEFAULT_MAX_GRAPH_SIZE = 512  # 34:config/vllm.py:2401-2403 (1024 on Blackwell, which the replay is not)
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192  # where the grid leaves it: above every ceiling

# What vLLM logs when it serves fewer batches with graphs than the settings ask for, with where. P8
# excuses nothing by them: the model derives the same lists, so they are listed with their setting.
DOWNGRADES = {
    "truncated": (re.compile(r"Truncating max_cudagraph_capture_size to (\d+)"),
                  "34:config/vllm.py:2525-2528, 33:config/vllm.py:2626-2629; vLLM #54933"),
    "overridden": (re.compile(r"cudagraph_capture_sizes specified in compilation_config .* is overridden by config"),
                   "34:config/vllm.py:2538-2545, 33:config/vllm.py:2639-2646"),
    "none left": (re.compile(r"No CUDA graph capture sizes are left; setting cudagraph_mode to NONE"),
                  "34:config/vllm.py:2733-2737"),
}


@dataclass(frozen=True)
class SizeSetting:
    """What the user sets, named as ``vllm serve`` and ``CompilationConfig`` name it."""

    max_num_seqs: int
    num_speculative_tokens: int = 0
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    cudagraph_mode: str = FULL_AND_PIECEWISE.name
    cudagraph_capture_sizes: tuple[int, ...] | None = None
    max_cudagraph_capture_size: int | None = None
    enforce_eager: bool = False  # --enforce-eager: no graph at all (intent)
    # Dynamic speculative decoding: (first batch size, last, speculative tokens) ranges
    # (``34:config/speculative.py:570``), the token count of a batch read off them.
    num_speculative_tokens_per_batch_size: tuple[tuple[int, int, int], ...] | None = None
    # 0.34's decode request counts (``34:config/compilation.py:775-790``); 0.33 has no such field
    decode_cudagraph_capture_request_sizes: tuple[int, ...] | None = None

    @property
    def mode(self) -> CUDAGraphMode:
        return CUDAGraphMode[self.cudagraph_mode]

    @property
    def q(self) -> int:
        """``uniform_decode_query_len`` (``34:config/vllm.py:657-675``): the widest decode."""
        return 1 + self.num_speculative_tokens

    def query_len(self, num_reqs: int) -> int:
        """The tokens per request of a decode batch of ``num_reqs`` requests: ``q``, or under dynamic
        speculative decoding one more than the schedule's count for that batch size."""
        if self.num_speculative_tokens_per_batch_size is None:
            return self.q
        return 1 + dense_schedule(self.num_speculative_tokens_per_batch_size, self.max_num_seqs,
                                  self.num_speculative_tokens)[num_reqs]

    def query_lens(self) -> dict[int, int]:
        """Each decode query length and the widest batch that runs at it
        (``34:config/vllm.py:677-705``, ``33:config/vllm.py:2504-2539``)."""
        return {self.query_len(n): n for n in range(1, self.max_num_seqs + 1)}

    def ceiling(self) -> int:
        """The largest batch, in tokens, the settings ask graphs for: the explicit maximum, else the
        largest explicit size, else vLLM's default ``min(max_num_seqs * q * 2, 512)``
        (``34:config/vllm.py:2401-2408``), within ``max_num_batched_tokens``."""
        if self.max_cudagraph_capture_size is not None:
            asked = self.max_cudagraph_capture_size
        elif self.cudagraph_capture_sizes:
            asked = max(self.cudagraph_capture_sizes)
        else:
            asked = min(self.max_num_seqs * self.q * 2, DEFAULT_MAX_GRAPH_SIZE)
        return min(asked, self.max_num_batched_tokens)

    def flags(self) -> str:
        """The ``vllm serve`` flags that set it (a drafter named by its token count only)."""
        out = [f"--max-num-seqs {self.max_num_seqs}"] + ["--enforce-eager"] * self.enforce_eager
        if self.max_num_batched_tokens != DEFAULT_MAX_NUM_BATCHED_TOKENS:
            out.append(f"--max-num-batched-tokens {self.max_num_batched_tokens}")
        if self.num_speculative_tokens:
            schedule = self.num_speculative_tokens_per_batch_size
            dynamic = (f", \"num_speculative_tokens_per_batch_size\": {[list(r) for r in schedule]}"
                       if schedule is not None else "")
            k = self.num_speculative_tokens
            out.append(f"--speculative-config '{{\"num_speculative_tokens\": {k}{dynamic}, ...}}'")
        cc = [f'"cudagraph_mode": "{self.cudagraph_mode}"']
        if self.cudagraph_capture_sizes is not None:
            cc.append(f'"cudagraph_capture_sizes": {list(self.cudagraph_capture_sizes)}')
        if self.max_cudagraph_capture_size is not None:
            cc.append(f'"max_cudagraph_capture_size": {self.max_cudagraph_capture_size}')
        if self.decode_cudagraph_capture_request_sizes is not None:
            cc.append(f'"decode_cudagraph_capture_request_sizes": {list(self.decode_cudagraph_capture_request_sizes)}')
        out.append(f"--compilation-config '{{{', '.join(cc)}}}'")
        return " ".join(out)

    def to_json(self) -> dict:
        out = {"max_num_seqs": self.max_num_seqs, "num_speculative_tokens": self.num_speculative_tokens,
               "max_num_batched_tokens": self.max_num_batched_tokens, "cudagraph_mode": self.cudagraph_mode}
        if self.cudagraph_capture_sizes is not None:
            out["cudagraph_capture_sizes"] = list(self.cudagraph_capture_sizes)
        if self.max_cudagraph_capture_size is not None:
            out["max_cudagraph_capture_size"] = self.max_cudagraph_capture_size
        if self.enforce_eager:
            out["enforce_eager"] = True
        if self.num_speculative_tokens_per_batch_size is not None:
            out["num_speculative_tokens_per_batch_size"] = [list(r) for r in self.num_speculative_tokens_per_batch_size]
        if self.decode_cudagraph_capture_request_sizes is not None:
            out["decode_cudagraph_capture_request_sizes"] = list(self.decode_cudagraph_capture_request_sizes)
        return out

    @classmethod
    def from_json(cls, data: dict) -> SizeSetting:
        sizes, schedule = data.get("cudagraph_capture_sizes"), data.get("num_speculative_tokens_per_batch_size")
        decode = data.get("decode_cudagraph_capture_request_sizes")
        return cls(int(data["max_num_seqs"]), int(data["num_speculative_tokens"]), int(data["max_num_batched_tokens"]),
                   str(data["cudagraph_mode"]), tuple(int(s) for s in sizes) if sizes is not None else None,
                   data.get("max_cudagraph_capture_size"), bool(data.get("enforce_eager", False)),
                   tuple(tuple(int(x) for x in r) for r in schedule) if schedule is not None else None,
                   tuple(int(x) for x in decode) if decode is not None else None)


def dense_schedule(schedule: tuple[tuple[int, int, int], ...], max_batch_size: int, max_tokens: int) -> list[int]:
    """``build_dynamic_sd_schedule_lookup`` (``34:v1/spec_decode/dynamic/utils.py:77-147``) for a
    valid schedule: per batch size (index 0 unused) its speculative tokens, within ``max_tokens``; a
    gap and the tail carry the previous range's count forward."""
    dense = [0] * (max_batch_size + 1)
    ranges = sorted(schedule)
    for i, (start, end, k) in enumerate(ranges):
        stop = ranges[i + 1][0] - 1 if i + 1 < len(ranges) else max_batch_size
        for n in range(start, min(stop, max_batch_size) + 1):
            dense[n] = min(max_tokens, k)
    return dense


def grid() -> list[SizeSetting]:
    """The boundary settings, in a fixed order (module docstring)."""
    out = []
    for mode in (FULL_AND_PIECEWISE, CUDAGraphMode.FULL_DECODE_ONLY, FULL, PIECEWISE):
        for mns, k in itertools.product((1, 6, 8, 9, 100, 128, 256), (0, 1, 2, 6)):
            out.append(SizeSetting(mns, k, cudagraph_mode=mode.name))
        # max_num_batched_tokens off the stride and under the ceiling (vLLM refuses it under max_num_seqs)
        for mns, tokens in ((64, 100), (256, 300), (100, 150)):
            out.append(SizeSetting(mns, 0, tokens, mode.name))
        out.append(SizeSetting(16, 2, cudagraph_mode=mode.name, cudagraph_capture_sizes=(1, 2, 4, 8, 16, 24)))
        out.append(SizeSetting(6, 6, cudagraph_mode=mode.name, max_cudagraph_capture_size=42))
        out.append(SizeSetting(100, 0, cudagraph_mode=mode.name, max_cudagraph_capture_size=100))
        out += [SizeSetting(8, 0, cudagraph_mode=mode.name, enforce_eager=True),
                SizeSetting(100, 2, cudagraph_mode=mode.name, enforce_eager=True)]
        # dynamic speculative decoding: narrower drafts for wider batches, a gap carried forward, and
        # a tier without drafts (query length 1)
        out += [SizeSetting(16, 3, cudagraph_mode=mode.name,
                            num_speculative_tokens_per_batch_size=((1, 4, 3), (5, 16, 1))),
                SizeSetting(100, 2, cudagraph_mode=mode.name,
                            num_speculative_tokens_per_batch_size=((1, 8, 2), (20, 64, 1), (65, 100, 0)))]
        # 0.34's decode request counts: one past max_num_seqs (dropped), and one size alone
        out += [SizeSetting(100, 2, cudagraph_mode=mode.name,
                            decode_cudagraph_capture_request_sizes=(1, 4, 50, 100, 150)),
                SizeSetting(8, 0, cudagraph_mode=mode.name, decode_cudagraph_capture_request_sizes=(3,))]
    return out


@dataclass(frozen=True)
class Batch:
    """One batch a step can bring: ``decode`` is ``num_reqs`` requests of ``q`` tokens each,
    ``partial`` ``num_reqs`` requests of ``q - 1`` (drafts partly accepted, or fewer proposed),
    ``mixed`` ``num_tokens`` tokens over ``min(num_tokens, max_num_seqs)`` requests of which one is
    prefilling."""

    kind: str
    num_tokens: int
    num_reqs: int

    @property
    def uniform_token_count(self) -> int | None:
        """Tokens per request where every request has as many: decode and partial batches."""
        return None if self.kind == "mixed" else self.num_tokens // self.num_reqs


def batches(s: SizeSetting) -> Iterator[Batch]:
    """Every decode batch (1..``max_num_seqs`` requests, each of its batch size's query length),
    every partial one under speculative decoding, and every mixed batch up to one past the ceiling."""
    for n in range(1, s.max_num_seqs + 1):
        if n * s.query_len(n) <= s.max_num_batched_tokens:
            yield Batch("decode", n * s.query_len(n), n)
    for n in range(1, s.max_num_seqs + 1):
        if s.query_len(n) > 1 and n * (s.query_len(n) - 1) <= s.max_num_batched_tokens:
            yield Batch("partial", n * (s.query_len(n) - 1), n)
    for t in range(1, min(s.ceiling() + 1, s.max_num_batched_tokens) + 1):
        yield Batch("mixed", t, min(t, s.max_num_seqs))


@dataclass(frozen=True)
class Served:
    """The descriptor vLLM picked: its mode and the graph's token and request counts."""

    mode: str
    num_tokens: int
    num_reqs: int | None


STRENGTH = {NONE.name: 0, PIECEWISE.name: 1, FULL.name: 2}  # a runtime mode's graph: none, pieces, whole


@dataclass(frozen=True, order=True)
class Gap:
    """A P8 signature: a batch kind served by ``served`` where a ``wanted`` graph could serve it."""

    kind: str
    wanted: str
    served: str
    what: str  # WEAKER, SMALLER, UNCONFIGURED, UNWANTED, or one of HANGS (P9)

    @property
    def title(self) -> str:
        if self.kind in PHASES:
            return f"P0 vLLM stops {PHASES[self.kind]}: {self.what}"
        if self.what in HANGS:
            return f"P9 {self.kind} steps on two DP ranks: {self.what} ({self.served})"
        noun = "steps on two DP ranks" if "+" in self.kind else "batches"  # contract/core/ranks.py
        if self.what == SMALLER:
            return f"P8 {self.kind} {noun} replay a {self.served} graph smaller than the batch"
        if self.what == UNCONFIGURED:
            return f"P8 {self.kind} {noun} take {self.served} graphs, a mode cudagraph_mode {self.wanted} does not name"
        if self.what == UNWANTED:
            return f"P8 {self.kind} {noun} take {self.served} graphs under --enforce-eager"
        if self.served == NONE.name:
            return f"P8 {self.kind} {noun} a {self.wanted} graph could serve run eagerly"
        return f"P8 {self.kind} {noun} a {self.wanted} graph could serve take {self.served} graphs"

    @property
    def severity(self) -> str:
        if self.kind in PHASES:
            return f"crash {PHASES[self.kind]}"
        if self.what in HANGS:
            return "hang"
        if self.what in (UNCONFIGURED, UNWANTED):  # the user's choice keeps graphs from what cannot take them
            return "graph of a mode not configured"
        return "wrong result" if self.what == SMALLER else "silent eager fallback"

    @property
    def property(self) -> str:
        return "P0" if self.kind in PHASES else "P9" if self.what in HANGS else "P8"

    def to_json(self) -> dict:
        return {"property": self.property, "kind": self.kind, "wanted": self.wanted, "served": self.served,
                "what": self.what, "title": self.title, "severity": self.severity}


WEAKER = "weaker graph"
SMALLER = "graph smaller than the batch"
UNCONFIGURED = "a mode the configuration does not name"
UNWANTED = "a graph where the configuration asks for none"
PHASES = {"config": "at start-up", "dispatch": "when serving"}  # where vLLM's code raised
# P9 on several DP ranks (contract/core/ranks.py): a step's kind is its ranks' batch kinds, "decode+idle"
DIFFERENT_MODES = "ranks run different runtime modes"
DIFFERENT_TOKENS = "ranks run graphs of different token counts"
RANK_HUNG = "a rank raised or never answered, leaving the others waiting"
HANGS = (DIFFERENT_MODES, DIFFERENT_TOKENS, RANK_HUNG)
DP_SIZE = 2  # the ranks a step runs on


def class_flags(s: SizeSetting, kind: str) -> str:
    """The ``vllm serve`` flags of a setting a class of ``kind`` shows on: its own, and for a step
    kind (``decode+idle``) the DP ranks."""
    return s.flags() + (f" --data-parallel-size {DP_SIZE}" if "+" in kind else "")


def crash(phase: str, raised: str, at: str | None) -> Gap:
    """vLLM's code raised deriving the sizes (``config``) or dispatching a batch (``dispatch``): P0."""
    return Gap(phase, "-", "-", f"{raised} at {at or 'an unknown line'}")


@dataclass
class Judged:
    """One setting on one side: its gaps (signature -> the batches showing it) and the downgrades
    vLLM logged for it (``DOWNGRADES``), which P8 takes as said."""

    gaps: dict[Gap, list[Batch]] = field(default_factory=dict)
    documented: list[str] = field(default_factory=list)


def judge(served: dict[Batch, Served], best: Callable[[Batch], CUDAGraphMode], logged: list[str],
          setting: SizeSetting) -> Judged:
    """P8 over what vLLM served each batch of ``setting`` with: no graph at all under
    ``--enforce-eager`` (intent: ``VllmConfig.__post_init__`` sets the mode to NONE,
    ``34:config/vllm.py:1697-1699``, ``:1915-1919``); never a runtime mode the configured
    ``cudagraph_mode`` does not name for the batch's routine (monotonicity: the mixed mode for any
    batch, the decode mode for a uniform decode batch too); never a graph smaller than the batch; and
    at least as strong as ``best``, the strongest mode a graph the release's documented sizes give
    could serve it with (``contract/runners/<runner>/model/sizes.py``)."""
    out = Judged(documented=[f"{line} ({where})" for line in logged for p, where in DOWNGRADES.values()
                             if p.search(line)])
    configured = setting.mode
    mixed = {NONE.name, configured.mixed_mode().name}
    decode = mixed | {configured.decode_mode().name}
    query_lens = setting.query_lens()
    for b, got in served.items():
        want = best(b)
        # a partial batch at a query length dynamic speculative decoding runs is a decode batch there
        named = decode if b.kind == "decode" or b.uniform_token_count in query_lens else mixed
        if setting.enforce_eager and got.mode != NONE.name:
            out.gaps.setdefault(Gap(b.kind, NONE.name, got.mode, UNWANTED), []).append(b)
        elif got.mode not in named:
            out.gaps.setdefault(Gap(b.kind, configured.name, got.mode, UNCONFIGURED), []).append(b)
        elif got.mode != NONE.name and (got.num_tokens < b.num_tokens or (got.num_reqs is not None
                                                                         and got.num_reqs < b.num_reqs)):
            out.gaps.setdefault(Gap(b.kind, want.name, got.mode, SMALLER), []).append(b)
        elif STRENGTH[got.mode] < STRENGTH[want.name]:
            out.gaps.setdefault(Gap(b.kind, want.name, got.mode, WEAKER), []).append(b)
    return out


class RunsError(ValueError):
    """The real side's runs do not cover the setting's batches exactly."""


def served_from(s: SizeSetting, runs: list) -> dict[Batch, Served]:
    """Each batch of ``batches(s)`` with its descriptor, from the runs ``[kind, first tokens, last
    tokens, mode, tokens, requests]`` the real side reports (consecutive batches of a kind, of rising
    token counts, served alike); ``RunsError`` unless they cover exactly those batches."""
    out: dict[Batch, Served] = {}
    expected_batches = list(batches(s))
    queue = iter(expected_batches)
    for run in runs:
        if not (isinstance(run, list) and len(run) == 6 and run[3] in STRENGTH):
            raise RunsError(f"a run {run!r} is not [kind, first, last, mode, tokens, requests]")
        kind, first, last, mode, tokens, reqs = run
        got = Served(mode, int(tokens), None if reqs is None else int(reqs))
        while True:
            b = next(queue, None)
            if b is None or b.kind != kind or not first <= b.num_tokens <= last:
                raise RunsError(f"the runs do not follow the batches of {s.flags()}")
            out[b] = got
            if b.num_tokens == last:
                break
    if len(out) != len(expected_batches):
        raise RunsError(f"the runs cover {len(out)} of the {len(expected_batches)} batches of {s.flags()}")
    return out


WITNESS_SCHEMA = "cudagraph-contract.size-witness"


class WitnessError(ValueError):
    """A file is not a size witness this tool wrote; one line."""


def witness_json(setting: SizeSetting, gap: Gap, shown: list[Batch], vllm: str) -> dict:
    """What a size class is witnessed by: its setting (replayed by ``conform --vllm-src --traces``),
    the ``vllm serve`` flags, the signature and the batches that show it."""
    return {"schema": WITNESS_SCHEMA, "setting": setting.to_json(), "flags": class_flags(setting, gap.kind), "class": gap.to_json(),
            "batches": [b.num_tokens for b in shown], "vllm": vllm}


def is_witness(data) -> bool:
    return isinstance(data, dict) and data.get("schema") == WITNESS_SCHEMA


def witness_setting(data: dict, where: str) -> SizeSetting:
    """The setting of a size witness read from ``where``, checked field by field."""
    s = data.get("setting")
    ints = ("max_num_seqs", "num_speculative_tokens", "max_num_batched_tokens")
    try:
        if not isinstance(s, dict) or set(s) - {*ints, "cudagraph_mode", "cudagraph_capture_sizes",
                                                "max_cudagraph_capture_size", "enforce_eager",
                                                "num_speculative_tokens_per_batch_size",
                                                "decode_cudagraph_capture_request_sizes"}:
            raise ValueError("its setting has other fields than a size setting's")
        if any(not isinstance(s.get(k), int) or isinstance(s.get(k), bool) or s[k] < (0 if k == ints[1] else 1)
               for k in ints):
            raise ValueError(f"its setting needs {', '.join(ints)} as positive integers")
        if s.get("cudagraph_mode") not in CUDAGraphMode.__members__:
            raise ValueError(f"cudagraph_mode {s.get('cudagraph_mode')!r} is not one of vLLM's modes")
        for name in ("cudagraph_capture_sizes", "decode_cudagraph_capture_request_sizes"):
            sizes = s.get(name)
            if sizes is not None and (not isinstance(sizes, list) or not sizes or not all(
                    isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in sizes)):
                raise ValueError(f"{name} must be a list of positive integers")
        if not isinstance(s.get("enforce_eager", False), bool):
            raise ValueError("enforce_eager must be true or false")
        schedule = s.get("num_speculative_tokens_per_batch_size")
        if schedule is not None and not _valid_schedule(schedule, s["num_speculative_tokens"]):
            raise ValueError("num_speculative_tokens_per_batch_size must be [first, last, tokens] ranges of positive "
                             "batch sizes from 1, in order and apart, under speculative decoding")
        top = s.get("max_cudagraph_capture_size")
        if top is not None and (not isinstance(top, int) or isinstance(top, bool) or top < 1):
            raise ValueError("max_cudagraph_capture_size must be a positive integer")
        return SizeSetting.from_json(s)
    except ValueError as exc:
        raise WitnessError(f"{where} is not a size witness: {exc}") from None


def _valid_schedule(schedule, num_speculative_tokens: int) -> bool:
    """What ``validate_and_normalize_dynamic_sd_schedule`` accepts (``34:v1/spec_decode/dynamic/utils.py:7-74``)."""
    if not (isinstance(schedule, list) and schedule and num_speculative_tokens > 0):
        return False
    if not all(isinstance(r, list) and len(r) == 3 and all(isinstance(x, int) and not isinstance(x, bool) for x in r)
               and 0 < r[0] <= r[1] and r[2] >= 0 for r in schedule):
        return False
    ranges = sorted(schedule)
    return ranges[0][0] == 1 and all(b[0] > a[1] for a, b in zip(ranges, ranges[1:]))
