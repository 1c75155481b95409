"""The events the verifier sequences: the MRV1/MRV2 start-up steps and the serving steps.

Start-up follows the worker's call order (spec §8.3): ``load_model``, the first forward
(``profile_run``, where Dynamo compiles), optionally ``profile_cudagraph_memory``, the mode
resolution in ``initialize_kv_cache``, then ``capture_model``. Capture windows
(``set_cudagraph_capturing_enabled``) and ``clear_all_graphs`` happen inside the two capture
steps exactly where vLLM puts them, so a capture outside a window is a finding, not an artefact
of an order vLLM never runs.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import ClassVar, Union


@dataclass(frozen=True)
class LoadModel:
    """``GPUModelRunner.load_model``: wrappers installed from the load-time mode (``:5128-5165``)."""

    kind: ClassVar[str] = "load_model"


@dataclass(frozen=True)
class ProfileRun:
    """``profile_run`` → ``_dummy_run(is_profile=True)``: the first forward, a NONE dispatch, where
    Dynamo compiles and decides the inner PIECEWISE wrappers from the current mode (spec §5.1)."""

    kind: ClassVar[str] = "profile_run"


@dataclass(frozen=True)
class ProfileCudagraphMemory:
    """``profile_cudagraph_memory`` (``gpu_model_runner.py:6661-6828`` in 0.30.0): first resolve,
    capture window, at most two descriptors per mode, window closed, all graphs of both wrapper
    classes cleared, target dispatcher keys cleared."""

    kind: ClassVar[str] = "profile_cudagraph_memory"


@dataclass(frozen=True)
class Resolve:
    """``_check_and_update_cudagraph_mode`` (``:6760-6815``): resolve the mode against the minimum
    attention-backend support, then initialise the target and drafter dispatcher keys."""

    kind: ClassVar[str] = "resolve"


@dataclass(frozen=True)
class CaptureModel:
    """``capture_model`` (``:6830-6935``): window opened, every ``get_capture_descs()`` descriptor
    captured (PIECEWISE first), the drafter's ``dummy_run`` after each, window closed."""

    kind: ClassVar[str] = "capture_model"


@dataclass(frozen=True)
class Peer:
    """Another data-parallel rank's batch in the same step, read as the event's own; ``num_tokens``
    0 is an idle rank, which runs the worker's dummy batch (``execute_dummy_batch``)."""

    num_tokens: int
    uniform_decode: bool = False
    force_eager: bool = False

    @property
    def idle(self) -> bool:
        return self.num_tokens == 0

    def to_json(self) -> list:
        return [self.num_tokens, self.uniform_decode, self.force_eager]

    def __str__(self) -> str:
        if self.idle:
            return "idle"
        return f"{self.num_tokens}{'u' if self.uniform_decode else ''}{'e' if self.force_eager else ''}"


@dataclass(frozen=True)
class ExecuteModel:
    """A target batch: ``_determine_batch_execution_and_padding`` → dispatch → forward. Under data
    parallelism ``peers`` holds the other ranks' batches of the same step, rank 1 first.
    ``num_active_loras``: the distinct LoRA adapters its requests ask for (``--enable-lora``), the
    count ``get_num_active_loras_for_dispatch`` reads (``34:v1/worker/gpu/lora_utils.py:38-48``)."""

    num_tokens: int
    uniform_decode: bool = False
    force_eager: bool = False
    peers: tuple[Peer, ...] = ()
    num_active_loras: int = 0
    kind: ClassVar[str] = "execute_model"


@dataclass(frozen=True)
class Propose:
    """A drafter batch: ``SpecDecodeBaseProposer`` dispatch (``llm_base_proposer.py:1797-1805``).
    MRV2 drafts after a target batch of ``num_tokens``; ``uniform_decode``: every request of it has
    ``uniform_decode_query_len`` tokens, so the draft prefill can take a FULL decode graph
    (``33:v1/worker/gpu/spec_decode/target_dependent_ar/speculator.py:250-267``). MRV1 ignores it."""

    num_tokens: int
    uniform_decode: bool = False
    kind: ClassVar[str] = "propose"


Event = Union[LoadModel, ProfileRun, ProfileCudagraphMemory, Resolve, CaptureModel, ExecuteModel, Propose]
EVENT_TYPES: dict[str, type] = {
    cls.kind: cls
    for cls in (LoadModel, ProfileRun, ProfileCudagraphMemory, Resolve, CaptureModel, ExecuteModel, Propose)
}


def event_to_json(event: Event) -> dict:
    out: dict = {"event": event.kind}
    if isinstance(event, ExecuteModel):
        out.update(num_tokens=event.num_tokens, uniform_decode=event.uniform_decode, force_eager=event.force_eager)
        if event.peers:
            out.update(peers=[p.to_json() for p in event.peers])
        if event.num_active_loras:
            out.update(num_active_loras=event.num_active_loras)
    elif isinstance(event, Propose):
        out.update(num_tokens=event.num_tokens)
        if event.uniform_decode:
            out.update(uniform_decode=True)
    return out


def event_from_json(data: dict) -> Event:
    if not isinstance(data, dict) or "event" not in data:
        raise ValueError("each event must be an object with an 'event' name")
    name = data["event"]
    cls = EVENT_TYPES.get(name) if isinstance(name, str) else None
    if cls is None:
        raise ValueError(f"unknown event {name!r}; expected one of: {', '.join(EVENT_TYPES)}")
    args = {k: v for k, v in data.items() if k != "event"}
    if cls in (ExecuteModel, Propose):
        n = args.get("num_tokens")
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"event {name}: num_tokens must be a positive integer")
        for flag in ("uniform_decode", "force_eager"):
            if flag in args and not isinstance(args[flag], bool):
                raise ValueError(f"event {name}: {flag} must be true or false")
        allowed = {"num_tokens", "uniform_decode", "force_eager"} if cls is ExecuteModel else {"num_tokens", "uniform_decode"}
        if cls is ExecuteModel and "peers" in args:
            allowed.add("peers")
            args["peers"] = _peers_from_json(args["peers"])
        if cls is ExecuteModel and "num_active_loras" in args:
            allowed.add("num_active_loras")
            loras = args["num_active_loras"]
            if not isinstance(loras, int) or isinstance(loras, bool) or loras < 0:
                raise ValueError(f"event {name}: num_active_loras must be a non-negative integer")
    else:
        allowed = set()
    extra = set(args) - allowed
    if extra:
        raise ValueError(f"event {name}: unknown field(s) {', '.join(sorted(extra))}")
    return cls(**args)


def _peers_from_json(data) -> tuple[Peer, ...]:
    ok = isinstance(data, list) and data and all(
        isinstance(p, list) and len(p) == 3 and isinstance(p[0], int) and not isinstance(p[0], bool) and p[0] >= 0
        and isinstance(p[1], bool) and isinstance(p[2], bool) for p in data)
    if not ok:
        raise ValueError("event execute_model: peers must be a list of [num_tokens >= 0, uniform_decode, force_eager], "
                         "one per other data-parallel rank")
    return tuple(Peer(*p) for p in data)


def on_ranks(batches: list[tuple[int, bool, bool]], data_parallel_size: int) -> tuple[ExecuteModel, ...]:
    """Every step ``data_parallel_size`` ranks can bring, each of ``batches`` (``(num_tokens,
    uniform_decode, force_eager)``) beside each multiset of the others' (those batches or idle): the
    agreement reads the ranks' batches as a multiset (a minimum, a maximum, an all-equal), so the
    peers are taken in sorted order, C(b + n - 1, n - 1) peer sets for b batches on n ranks."""
    peers = [Peer(0), *(Peer(*b) for b in batches)]
    return tuple(ExecuteModel(*b, peers=tuple(ps)) for b in batches
                 for ps in itertools.combinations_with_replacement(peers, data_parallel_size - 1))


def ranks_problem(events: list[Event], data_parallel_size: int, ubatching: bool = False) -> str | None:
    """Why ``events`` cannot run on ``data_parallel_size`` ranks: every ``execute_model`` names each
    other rank's batch, and the draft steps run on one rank only (several ranks' ``propose`` is not
    modelled). Under micro-batching no serving batch needs eager: its one source is an
    encoder-decoder model's encoder step (``34:v1/worker/gpu/model_runner.py:1887-1892``), and vLLM
    refuses DBO with encoder-decoder models (``34:config/vllm.py:3397-3400``)."""
    for i, event in enumerate(events):
        if ubatching and isinstance(event, ExecuteModel) and any(b.force_eager for b in (event, *event.peers)):
            return (f"event {i} (execute_model) forces eager on a micro-batching scenario: vLLM refuses DBO with "
                    "the encoder-decoder models whose encoder steps need eager")
        if isinstance(event, ExecuteModel) and len(event.peers) != data_parallel_size - 1:
            return (f"event {i} (execute_model) names {len(event.peers)} peer batch(es); data_parallel_size "
                    f"{data_parallel_size} needs {data_parallel_size - 1}")
        if isinstance(event, Propose) and data_parallel_size > 1:
            return f"event {i} (propose): draft steps on several data-parallel ranks are not modelled"
    return None


def batch_requests(event: ExecuteModel, q: int, max_num_seqs: int) -> int:
    """The requests of a batch as both runners read an event: ``num_tokens / q`` decodes of ``q``
    tokens, else as many requests as ``max_num_seqs`` and the tokens allow."""
    return event.num_tokens // q if event.uniform_decode else min(event.num_tokens, max_num_seqs)


def lora_problem(events: list[Event], max_loras: int, q: int, max_num_seqs: int) -> str | None:
    """Why ``events`` cannot run with ``--max-loras max_loras`` (0: LoRA off): a batch asks for at
    most ``max_loras`` distinct adapters (the scheduler's bound, ``34:v1/core/sched/scheduler.py:1130-1139``),
    one per request at most."""
    for i, event in enumerate(events):
        if isinstance(event, ExecuteModel) and event.num_active_loras > min(
                max_loras, batch_requests(event, q, max_num_seqs)):
            return (f"event {i} (execute_model) asks for {event.num_active_loras} active LoRA adapter(s); "
                    + ("LoRA is off (max_loras 0)" if not max_loras else
                       f"at most max_loras ({max_loras}) and one per request"))
    return None


def describe_event(event: Event) -> str:
    if isinstance(event, ExecuteModel):
        flags = [f"num_tokens={event.num_tokens}"]
        if event.uniform_decode:
            flags.append("uniform_decode")
        if event.force_eager:
            flags.append("force_eager")
        if event.peers:
            flags.append(f"peers=({', '.join(map(str, event.peers))})")
        if event.num_active_loras:
            flags.append(f"num_active_loras={event.num_active_loras}")
        return f"execute_model({', '.join(flags)})"
    if isinstance(event, Propose):
        return f"propose(num_tokens={event.num_tokens}{', uniform_decode' if event.uniform_decode else ''})"
    return event.kind


__all__ = [
    "CaptureModel",
    "Event",
    "ExecuteModel",
    "LoadModel",
    "Peer",
    "ProfileCudagraphMemory",
    "ProfileRun",
    "Propose",
    "Resolve",
]


# The worker's start-up order (spec §8.3), as the explorer tries it.
START_UP = (LoadModel(), ProfileRun(), ProfileCudagraphMemory(), Resolve(), CaptureModel())
