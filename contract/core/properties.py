"""The contract, as named checks over one step's observations.

Each check returns the violations a step shows. They are judged per step, in the order the runner
produced the dispatches, so the first violation found is the first one a user would hit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from contract.core import halts
from contract.core.events import CaptureModel, ExecuteModel, LoadModel, batch_requests
from contract.core.modes import FULL, NONE, PIECEWISE, AttentionCGSupport, CUDAGraphMode
from contract.core.observation import (
    GLOBAL_POOL,
    PROFILE_RUN_CONTEXT,
    PROFILING_CONTEXT,
    Action,
    Dispatch,
    LayerAction,
    LayerKind,
    StepRecord,
)
from contract.core.scenario import MAX_NUM_SEQS, DrafterKind, Runner, Scenario


@dataclass(frozen=True)
class Violation:
    property: str
    step: int
    message: str
    dispatch: int | None = None  # index into the step's dispatches

    def to_json(self) -> dict:
        out = {"property": self.property, "step": self.step, "message": self.message}
        if self.dispatch is not None:
            out["dispatch"] = self.dispatch
        return out


@dataclass(frozen=True)
class Property:
    id: str
    name: str
    protects: str
    check: Callable[[Scenario, Runner, StepRecord], list[Violation]]


def _per_dispatch(fn: Callable[[Scenario, Runner, Dispatch], str | None], pid: str):
    def check(scenario: Scenario, runner: Runner, record: StepRecord) -> list[Violation]:
        out = []
        for i, d in enumerate(record.dispatches):
            message = fn(scenario, runner, d)
            if message:
                out.append(Violation(pid, record.index, message, i))
        return out

    return check


def _where(d: Dispatch) -> str:
    return f"{d.role} {d.context} {d.runtime_mode.name} {d.batch_descriptor}"


def one_capturer(scenario: Scenario, runner: Runner, d: Dispatch) -> str | None:
    if d.runtime_mode == NONE:
        return None
    acting = d.acting
    if not acting:
        return f"{_where(d)}: no layer captured or replayed it (silent eager fallback)"
    if len(acting) > 1:
        return f"{_where(d)}: {len(acting)} capturing layers ({', '.join(a.layer for a in acting)}): nested capture"
    return None


def none_is_eager(scenario: Scenario, runner: Runner, d: Dispatch) -> str | None:
    if d.runtime_mode == NONE and d.acting:
        return f"{_where(d)}: {d.acting[0].layer} {d.acting[0].action.value} a NONE dispatch"
    return None


def _intended(scenario: Scenario, runner: Runner, d: Dispatch) -> tuple[str, Callable]:
    if d.runtime_mode == FULL:
        # MRV1 installs CUDAGraphWrapper(FULL); MRV2 has no such wrapper and its manager owns FULL graphs.
        if any(a.kind is LayerKind.CudaGraphManager for a in d.layers):
            return "the CudaGraphManager", lambda a: a.kind is LayerKind.CudaGraphManager
        if getattr(d.batch_descriptor, "num_ubatches", 1) > 1:  # MRV1: the wrapper runs the micro-batches
            return "the UBatchWrapper", lambda a: a.kind is LayerKind.UBatchWrapper
        return "CUDAGraphWrapper(FULL)", lambda a: a.kind is LayerKind.CUDAGraphWrapper and a.runtime_mode == FULL
    if scenario.breakable:
        return "a BreakableCUDAGraphWrapper", lambda a: a.kind is LayerKind.BreakableCUDAGraphWrapper
    return "the compiled PIECEWISE wrappers", lambda a: a.kind is LayerKind.compiled


def capturer_identity(scenario: Scenario, runner: Runner, d: Dispatch) -> str | None:
    if d.runtime_mode not in (FULL, PIECEWISE) or not d.acting:
        return None
    wanted, ok = _intended(scenario, runner, d)
    first = d.acting[0]
    if not ok(first):
        return f"{_where(d)}: {first.action.value} by {first.layer}, intended {wanted}"
    return None


def capture_legality(scenario: Scenario, runner: Runner, d: Dispatch) -> str | None:
    if d.capture_phase:
        return None
    for a in d.acting:
        if a.action is Action.RAISED and a.error and "inappropriate time" in a.error:
            return f"{_where(d)}: {a.layer} tried to capture outside capture_model: {a.error}"
        if a.action is Action.CAPTURED and a.kind is LayerKind.UBatchWrapper:
            return (f"{_where(d)}: {a.layer} captured at runtime, outside capture_model: its micro-batched capture "
                    "reads no capture flag")
        if a.action is Action.CAPTURED and d.capturing_enabled is None:
            return (f"{_where(d)}: {a.layer} captured at runtime, outside capture_model and memory profiling: "
                    "a silent runtime capture (this runner has no capture guard)")
        if a.action is Action.CAPTURED:
            return f"{_where(d)}: {a.layer} captured outside capture_model (capture flag still on)"
    return None


LORA_SELECTED = "captured with dummy LoRA adapters its key does not name"


def replay_stability(scenario: Scenario, runner: Runner, d: Dispatch) -> str | None:
    """A graph replays only what it was captured for: its mode and key, outside profiling's
    discarded pool, and the LoRA adapters of its key. A capture run with ``capture_model``'s dummy
    adapters selected (``maybe_dummy_run_with_lora``) records them into a graph whose key names none
    (a drafter's: it dispatches without adapters), which is then replayed without them (vLLM #28334:
    an illegal memory access)."""
    for a in d.acting:
        if (a.action is Action.CAPTURED and d.selected_loras
                and not getattr(d.batch_descriptor, "num_active_loras", 0)):
            return (f"{_where(d)}: {a.layer} {LORA_SELECTED} ({d.selected_loras} selected by the capture run); "
                    "it is replayed without them")
        if (a.action is Action.REPLAYED and a.entry_context == "profile_cudagraph_memory"
                and d.context != "profile_cudagraph_memory"):
            return (f"{_where(d)}: {a.layer} replayed a graph captured during memory profiling, whose pool "
                    "profile_cudagraph_memory discards")
        if a.action is Action.REPLAYED and (a.entry_mode != d.runtime_mode or a.entry_key != d.key):
            return (
                f"{_where(d)}: {a.layer} replayed an entry captured for "
                f"{a.entry_mode.name} {a.entry_key}"
            )
        if a.action in (Action.CAPTURED, Action.RAISED) and d.previously_captured:
            return f"{_where(d)}: captured before, {a.layer} captures it again"
    return None


def liveness(scenario: Scenario, runner: Runner, record: StepRecord) -> list[Violation]:
    """vLLM does not stop on a configuration its own validation accepted. An accepted rejection
    (a ``ValueError`` with advice from ``VllmConfig``, resolve or adaptive verification's check,
    ``contract/core/halts.py``) is not a violation; any other stop is, at start-up or when serving
    by the step it raises in."""
    if not record.halted or halts.kind(record.halted) is halts.HaltKind.REJECTED:
        return []
    where = halts.phase(record.event.kind)
    dispatch = next((i for i, d in enumerate(record.dispatches) if d.error), None)
    return [Violation("P0", record.index, f"vLLM stops {'when serving' if where == 'serving' else 'at start-up'} "
                      f"({record.event.kind}) on a configuration its validation accepted: {record.halted}",
                      dispatch)]


def layers_support(scenario: Scenario, role: str) -> AttentionCGSupport:
    """The minimum ``AttentionCGSupport`` of the backends a forward of ``role`` runs: the scenario's
    minimum, except for the target's layers when the weaker backend serves the draft layers only;
    under pipeline parallelism the recorded forwards are stage 0's."""
    if role == "target" and scenario.attention_support_draft_only:
        return AttentionCGSupport.ALWAYS
    return scenario.stage_support(0)


def attention_roles(scenario: Scenario) -> tuple[str, ...]:
    """The roles whose layers hold attention groups: the target's, and a drafter's with a model."""
    return ("target", "drafter") if scenario.drafter is DrafterKind.WITH_MODEL else ("target",)


def attention_levels(scenario: Scenario) -> frozenset[AttentionCGSupport]:
    """Every level the replay builds an attention group of: each role's layers (stage 0's), and each
    later pipeline stage's."""
    return frozenset({layers_support(scenario, role) for role in attention_roles(scenario)}
                     | {scenario.stage_support(stage) for stage in range(1, scenario.pipeline_parallel_size)})


def resolved_support(scenario: Scenario, reads_draft_layers: bool = True) -> AttentionCGSupport:
    """The support resolve reads: the minimum over every attention group, the draft model's
    included (``get_attn_cg_support``, ``34:v1/worker/gpu/attn_utils.py:322-347``;
    ``_check_and_update_cudagraph_mode``, ``33:v1/worker/gpu_model_runner.py:6771-6785``); the
    target's layers alone where a policy reads no draft group."""
    return scenario.stage_support(0) if reads_draft_layers else layers_support(scenario, "target")


def served_batch(desc) -> tuple[str, int | None]:
    """What batches a FULL graph keyed by ``desc`` is replayed for: ``("uniform", k)`` (k tokens per
    request), ``("varlen", L)`` (decode batches of 1..L tokens per request) or ``("any", None)``.
    MRV1 ``BatchDescriptor``: ``uniform`` keys hold ``num_tokens / num_reqs`` tokens per request
    (``v1/cudagraph_dispatcher.py:130-154``); MRV2 ``BatchExecutionDescriptor``: ``uniform_token_count``,
    else ``max_query_len`` (``34:v1/worker/gpu/cudagraph_utils.py:115-142``)."""
    utc = getattr(desc, "uniform_token_count", None)
    if utc is not None:
        return "uniform", utc
    if getattr(desc, "uniform", False) and desc.num_reqs:
        return "uniform", desc.num_tokens // desc.num_reqs
    mql = getattr(desc, "max_query_len", None)
    if mql is not None:
        return "varlen", mql
    return "any", None


def allows(support: AttentionCGSupport, batch: tuple[str, int | None], varlen_bound: bool) -> bool:
    """``AttentionCGSupport`` (``34:v1/attention/backend.py:545-563``): ALWAYS any batch,
    UNIFORM_BATCH uniform batches, UNIFORM_SINGLE_TOKEN_DECODE uniform batches of one token per
    request, NEVER none; a varlen-decode graph needs ALWAYS or a declared varlen bound
    (``get_varlen_cudagraph_unsupported_backend``, ``34:v1/worker/gpu/attn_utils.py:371-402``)."""
    shape, k = batch
    if support is AttentionCGSupport.ALWAYS:
        return True
    if shape == "uniform":
        return support is AttentionCGSupport.UNIFORM_BATCH or (
            support is AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE and k == 1)
    if shape == "varlen":
        return varlen_bound and support is not AttentionCGSupport.NEVER
    return False


def shape_legality(scenario: Scenario, runner: Runner, d: Dispatch) -> str | None:
    if d.runtime_mode != FULL or not any(a.action in (Action.CAPTURED, Action.REPLAYED) for a in d.acting):
        return None
    support = layers_support(scenario, d.role)
    batch = served_batch(d.batch_descriptor)
    if allows(support, batch, scenario.varlen_decode_bound):
        return None
    shape, k = batch
    served = {"uniform": f"uniform batches of {k} token{'s' if k != 1 else ''} per request",
              "varlen": f"decode batches of 1..{k} tokens per request" + (
                  "" if scenario.varlen_decode_bound else " (no backend declares a varlen bound)"),
              "any": "any batch"}[shape]
    action = next(a for a in d.acting if a.action in (Action.CAPTURED, Action.REPLAYED)).action.value
    return (f"{_where(d)}: a FULL graph {action} for {served}, which the {d.role}'s attention "
            f"({support.name}) cannot replay")


def lora_legality(scenario: Scenario, record: StepRecord) -> list[Violation]:
    """A serving batch of k active LoRA adapters is served only by a graph captured for a LoRA case
    of at least k (``_build_lora_dispatch_map``: the smallest captured case >= k,
    ``34:v1/worker/gpu/cudagraph_utils.py:236-260``): a graph captured for fewer adapters, or for
    none, computes the batch without some of its adapters. The drafter runs none
    (``34:v1/worker/gpu/spec_decode/eagle/utils.py:92-94``)."""
    k = getattr(record.event, "num_active_loras", 0)
    if not k:
        return []
    out = []
    for i, d in enumerate(record.dispatches):
        if (d.role != "target" or d.context != "execute_model" or d.runtime_mode == NONE
                or not any(a.action in (Action.CAPTURED, Action.REPLAYED) for a in d.acting)):
            continue
        case = getattr(d.batch_descriptor, "num_active_loras", 0)
        if case < k:
            out.append(Violation("P7", record.index, f"{_where(d)}: a graph {LORA_CASE} {case} served a batch of "
                                 f"{k} active LoRA adapter(s)", i))
    return out


LORA_CASE = "captured for the LoRA case"
LORA_UNSELECTED = "captured without the dummy adapters of its case"


def lora_capture_adapters(scenario: Scenario, runner: Runner, d: Dispatch) -> str | None:
    """A target graph captured for the LoRA case k records the LoRA kernels of the adapters selected
    while it is captured, ``min(k, max_loras)`` of them (``maybe_select_dummy_loras``,
    ``34:v1/worker/lora_model_runner_mixin.py:161-173``, which ``capture_model`` calls before each
    capture: ``34:v1/worker/gpu/cudagraph_utils.py:739-741``, vLLM #35536; MRV1's
    ``maybe_dummy_run_with_lora``). Captured with fewer, the batches of k adapters it serves replay
    kernels that skip some of theirs. A capture when serving records the batch's own adapters."""
    k = getattr(d.batch_descriptor, "num_active_loras", 0)
    if (d.role != "target" or not k or not d.capture_phase
            or not any(a.action is Action.CAPTURED for a in d.acting)):
        return None
    wanted = min(k, scenario.max_loras)
    if d.selected_loras >= wanted:
        return None
    return (f"{_where(d)}: a graph {LORA_CASE} {k} {LORA_UNSELECTED} ({d.selected_loras} of {wanted} "
            f"selected): batches of {k} active adapters replay it without some of theirs")


ATTENTION_IN_SEGMENT = "attention op captured inside a breakable graph segment"


def breakable_attention(scenario: Scenario, runner: Runner, d: Dispatch) -> str | None:
    """A breakable PIECEWISE capture must break at the attention op, which reads the batch's own
    metadata at each replay: an op captured into a segment replays the capture's batch
    (``eager_break_during_capture``, ``34:compilation/breakable_cudagraph.py:75-124``, on
    ``unified_attention_with_output``, ``34:model_executor/layers/attention/attention.py:800``)."""
    if not d.attention_captured:
        return None
    return (f"{_where(d)}: {ATTENTION_IN_SEGMENT} (no eager_break_during_capture on it): every replay "
            f"reruns the capture's attention metadata")


PADDED_REQUESTS = "breakable PIECEWISE graph replayed for a batch padded with empty requests"


def breakable_requests(scenario: Scenario, runner: Runner, record: StepRecord) -> list[Violation]:
    """MRV2's PIECEWISE descriptors carry ``num_reqs=None``: a breakable graph's break-point ops (the
    attention op and the kernels marked like it) run eagerly and read the real batch from the forward
    context, so a descriptor padded to more requests than the batch has hands them zero-length
    requests (``34:v1/worker/gpu/cudagraph_utils.py:364-372``; vLLM #49302 restored it after #48822)."""
    if runner is not Runner.MRV2 or not isinstance(record.event, ExecuteModel):
        return []
    if record.ranks and record.ranks[0].batch:
        requests = record.ranks[0].batch[0]
    else:
        requests = batch_requests(record.event, scenario.uniform_decode_query_len, MAX_NUM_SEQS)
    out = []
    for i, d in enumerate(record.dispatches):
        padded = getattr(d.batch_descriptor, "num_reqs", None)
        if (d.role == "target" and d.context == "execute_model" and d.runtime_mode == PIECEWISE
                and padded is not None and padded > requests
                and any(a.kind is LayerKind.BreakableCUDAGraphWrapper for a in d.acting)):
            out.append(Violation("P7", record.index, f"{_where(d)}: a {PADDED_REQUESTS} ({padded} for its "
                                 f"{requests}): its eager break-point ops read the padded batch", i))
    return out


MAMBA_BLOCKS = "FULL graph of more requests than the Mamba cache has blocks"


def mamba_blocks(scenario: Scenario, runner: Runner, d: Dispatch) -> str | None:
    """A hybrid model's FULL graph runs the Mamba decode kernel (``causal_conv1d_update``) on one cache
    block per request of its descriptor, which asserts ``num_cache_lines >= batch`` while the graph is
    captured, before any replay (vLLM #34094; resolve refuses the configuration since #34571,
    ``34:config/compilation.py:1659-1681``). The target's layers hold the Mamba cache; memory
    profiling's captures run on its own minimal cache, which resolve leaves unchecked (``is_profiling``)."""
    blocks = scenario.mamba_cache_blocks
    if blocks is None or d.role != "target" or d.runtime_mode != FULL or d.context == PROFILING_CONTEXT:
        return None
    requests = getattr(d.batch_descriptor, "num_reqs", None)
    if requests is None or requests <= blocks or not any(a.action is Action.CAPTURED for a in d.acting):
        return None
    return (f"{_where(d)}: a {MAMBA_BLOCKS} ({requests} requests, {blocks} blocks) captured: "
            f"causal_conv1d_update asserts num_cache_lines >= batch")


UBATCH_MIXED = "micro-batched FULL graph replayed for a batch that is not a uniform batch of its query length"


def ubatch_legality(scenario: Scenario, runner: Runner, record: StepRecord) -> list[Violation]:
    """A FULL graph captured for several micro-batches replays the capture's split: each micro-batch
    holds the requests of a uniform batch of the graph's query length. vLLM keys the twin by that
    length (``_maybe_ubatch_twin``, ``34:v1/worker/gpu/cudagraph_utils.py:262-287``), so a mixed batch,
    or one of another length, takes no such graph. MRV1's ``UBatchWrapper`` keys its graphs by token
    count alone, and ``capture_model`` captures them for uniform decodes
    (``33:v1/worker/gpu_model_runner.py:6600-6613``): a replay is judged as one of a uniform decode's
    graph, legal for a uniform decode alone (a graph captured when serving for one mixed batch
    replays for the next of its count); MRV1 replayed one for mixed batches and hung (vLLM #25625)."""
    if not isinstance(record.event, ExecuteModel) or not record.ranks or not record.ranks[0].batch:
        return []
    utc = record.ranks[0].batch[2]
    out = []
    for i, d in enumerate(record.dispatches):
        desc = d.batch_descriptor
        graph = getattr(desc, "uniform_token_count", scenario.uniform_decode_query_len)
        if (d.role == "target" and d.context == "execute_model" and d.runtime_mode == FULL
                and getattr(desc, "num_ubatches", 1) > 1 and (graph is None or graph != utc)
                and any(a.action is Action.REPLAYED for a in d.acting)):
            held = "a mixed batch" if utc is None else f"a uniform batch of {utc} tokens per request"
            out.append(Violation("P7", record.index, f"{_where(d)}: a {UBATCH_MIXED} ({held}, graph "
                                 f"{'of any' if graph is None else graph}): "
                                 "its micro-batches split at the capture's request boundaries", i))
    return out


DECODE_GRAPH_FOR_PREFILL = "FULL uniform-decode graph replayed for a batch that is not a uniform decode"


def decode_graph_for_decodes(scenario: Scenario, runner: Runner, record: StepRecord) -> list[Violation]:
    """A FULL graph captured for uniform decode batches records the decode kernels and the persistent
    metadata of decoding requests; a batch whose requests are prefilling (a prompt chunk of q tokens
    per request has the same shape) replays them over prompt tokens while its own attention metadata
    describes a prefill. vLLM decides by the requests' phase, not the shape alone: ``decode_graph_eligible``
    (``34:v1/worker/gpu/model_runner.py:1426-1438``, vLLM #51865; #50532: the prompt's recurrent state
    is never written). Judged for a model with recurrent per-request state (a hybrid model's Mamba or GDN
    layers: ``mamba_cache_blocks``): a dense model's attention over a fresh sequence computes what its
    prefill would (#50532). A micro-batched twin is ``ubatch_legality``'s."""
    if (scenario.mamba_cache_blocks is None or not isinstance(record.event, ExecuteModel)
            or record.event.uniform_decode):
        return []
    out = []
    for i, d in enumerate(record.dispatches):
        shape, k = served_batch(d.batch_descriptor)
        if (d.role == "target" and d.context == "execute_model" and d.runtime_mode == FULL and shape == "uniform"
                and getattr(d.batch_descriptor, "num_ubatches", 1) == 1
                and any(a.action in (Action.CAPTURED, Action.REPLAYED) for a in d.acting)):
            n = record.event.num_tokens
            out.append(Violation("P7", record.index, f"{_where(d)}: a {DECODE_GRAPH_FOR_PREFILL} (a batch of "
                                 f"{n} token{'s' if n != 1 else ''} whose requests are not all decoding, graph of "
                                 f"{k} token{'s' if k != 1 else ''} per request): it replays decode kernels over "
                                 "prompt tokens", i))
    return out


_shape_legality = _per_dispatch(shape_legality, "P7")
_breakable_attention = _per_dispatch(breakable_attention, "P7")
_mamba_blocks = _per_dispatch(mamba_blocks, "P7")
_lora_capture_adapters = _per_dispatch(lora_capture_adapters, "P7")


def shape_and_lora_legality(scenario: Scenario, runner: Runner, record: StepRecord) -> list[Violation]:
    return (_shape_legality(scenario, runner, record) + lora_legality(scenario, record)
            + _lora_capture_adapters(scenario, runner, record)
            + _breakable_attention(scenario, runner, record) + breakable_requests(scenario, runner, record)
            + _mamba_blocks(scenario, runner, record) + ubatch_legality(scenario, runner, record)
            + decode_graph_for_decodes(scenario, runner, record))


def unwrap_reaches_raw(scenario: Scenario, runner: Runner, record: StepRecord) -> list[Violation]:
    if not isinstance(record.event, LoadModel):
        return []
    out = []
    for role, raw in (("target", "model"), ("drafter", "drafter.model")):
        got = record.unwrap.get(role)
        if got is not None and got != raw:
            out.append(Violation("P6", record.index, f"get_model() of the {role} returns {got}, not the raw {raw}"))
    return out


def _configured_allows(configured: CUDAGraphMode, runtime_mode: CUDAGraphMode) -> bool:
    """Mode monotonicity over traces: FULL graphs only where the configured mode has them; PIECEWISE
    where it has piecewise graphs or full ones, which resolve may turn into PIECEWISE graphs and
    logs it (the FULL -> FULL_AND_PIECEWISE upgrade and the downgrades of full modes an attention
    backend cannot serve, ``34:config/compilation.py:1585-1625``)."""
    if runtime_mode == FULL:
        return configured.has_full_cudagraphs()
    if runtime_mode == PIECEWISE:
        return configured.has_piecewise_cudagraphs() or configured.has_full_cudagraphs()
    return True


def intent(scenario: Scenario, runner: Runner, d: Dispatch) -> str | None:
    """P8's intent over traces: no graph where vLLM means none. ``--enforce-eager`` sets
    ``cudagraph_mode`` to NONE for the target and every drafter (``34:config/vllm.py:1697-1699``);
    ``profile_run``'s dummy pass runs eagerly (``need_eager=is_profile``,
    ``34:v1/worker/gpu/model_runner.py:1902``; ``force_eager=is_profile``,
    ``33:v1/worker/gpu_model_runner.py:5565``), and so does the drafter it proposes with; and
    ``speculative_config.enforce_eager`` asks for an eager drafter whatever the target runs
    ("Override the default enforce_eager from model_config", ``34:config/speculative.py:452-453``;
    MRV1 honours it, ``33:v1/spec_decode/llm_base_proposer.py:427``,
    ``33:v1/worker/gpu_model_runner.py:5821``)."""
    if d.runtime_mode == NONE and not d.acting:
        return None
    how = f"{d.acting[0].layer} {d.acting[0].action.value} it" if d.acting else "a graph mode"
    configured = scenario.cudagraph_mode
    if configured == NONE:
        return f"{_where(d)}: {how} under cudagraph_mode NONE (--enforce-eager), which asks for no graph"
    if not _configured_allows(configured, d.runtime_mode):
        return f"{_where(d)}: {how}, a runtime mode cudagraph_mode {configured.name} does not name"
    if d.context == PROFILE_RUN_CONTEXT:
        return f"{_where(d)}: {how} in profile_run, whose dummy pass vLLM runs eagerly"
    if scenario.spec_enforce_eager and d.role == "drafter":
        return f"{_where(d)}: {how} under speculative_config.enforce_eager, which asks for an eager drafter"
    return None


def profiled_pairs(record: StepRecord) -> frozenset[tuple[str, str]]:
    """The (role, runtime mode) pairs a step captured graphs of."""
    return frozenset((d.role, d.runtime_mode.name) for d in record.dispatches
                     if d.runtime_mode != NONE and any(a.action is Action.CAPTURED for a in d.acting))


def misplaced_capture(d: Dispatch) -> LayerAction | None:
    """A capture outside the pool its phase intends: memory profiling captures into a throwaway
    pool, never the persistent global one ("Profiling graphs captured into the persistent global
    pool and then discarded would drop its use_count to 0", ``34:v1/worker/gpu/cudagraph_utils.py:1014-1022``;
    ``33:v1/worker/gpu_model_runner.py:6306-6315``), and every other capture into the global pool."""
    for a in d.acting:
        if a.action is Action.CAPTURED and (a.pool == GLOBAL_POOL) == (d.context == PROFILING_CONTEXT):
            return a
    return None


def accounting(scenario: Scenario, runner: Runner, record: StepRecord) -> list[Violation]:
    """P10: every graph ``capture_model`` captures was estimated by memory profiling, which captures
    each kind into a throwaway pool before the KV cache is sized (MRV1 the two widest descriptors
    per mode, ``33:v1/worker/gpu_model_runner.py:6329-6357``; MRV2 every PIECEWISE and speculator
    graph and the two widest FULL, ``34:v1/worker/gpu/cudagraph_utils.py:988-1080``), profiling
    estimated no kind ``capture_model`` does not capture, and each capture went into the pool its
    phase intends (``misplaced_capture``)."""
    out = [Violation("P10", record.index, f"{_where(d)}: {a.layer} captured into the {a.pool} pool: " + (
               "memory profiling's graphs, discarded, drop the global pool's use count to 0, which c10's "
               "create_or_incref_pool asserts on when capture_model reuses it" if d.context == PROFILING_CONTEXT
               else "capture_model's graphs belong in the global pool profiling estimated"), i)
           for i, d in enumerate(record.dispatches) if (a := misplaced_capture(d)) is not None]
    if record.profiled is None or not isinstance(record.event, CaptureModel):
        return out
    seen: set = set()
    for i, d in enumerate(record.dispatches):
        pair = (d.role, d.runtime_mode.name)
        if (d.runtime_mode != NONE and any(a.action is Action.CAPTURED for a in d.acting)
                and pair not in record.profiled and pair not in seen):
            seen.add(pair)
            out.append(Violation("P10", record.index, f"{_where(d)}: capture_model captures {d.role} "
                                 f"{d.runtime_mode.name} graphs memory profiling never captured: the KV cache was "
                                 "sized without their memory", i))
    for role, mode in sorted(record.profiled - profiled_pairs(record)):
        out.append(Violation("P10", record.index, f"memory profiling captured {role} {mode} graphs capture_model "
                             "does not capture: the KV cache was sized for other graphs"))
    return out


def rank_agreement(scenario: Scenario, runner: Runner, record: StepRecord) -> list[Violation]:
    """DP ranks run every forward together (``dispatch_cg_and_sync_dp``, ``34:v1/worker/gpu/dp_utils.py:49-353``):
    every rank runs one runtime mode, NONE where any rank needs eager (``need_eager``), and where
    it is a graph the same padded token count; an idle rank's dummy batch is a uniform decode of
    ``q`` tokens per request, the shape a busy rank's decode batch has, or the agreement drops the
    uniform token count and every rank's decode graph with it (vLLM #35376)."""
    if record.stages:
        return stage_agreement(record)
    if not record.ranks:
        return []
    q = scenario.uniform_decode_query_len
    stopped = [i for i, r in enumerate(record.ranks) if r.raised is not None]
    if stopped:
        r = record.ranks[stopped[0]]
        return [Violation("P9", record.index, f"rank {stopped[0]} stopped ({r.raised}): the ranks never answered "
                          "each other's collectives again, leaving the others waiting")]
    problems = []
    modes = sorted({r.runtime_mode.name for r in record.ranks})
    if len(modes) > 1:
        problems.append(f"ranks run different runtime modes ({' and '.join(modes)})")
    elif modes[0] != NONE.name and len({r.num_tokens for r in record.ranks}) > 1:
        problems.append(f"ranks run {modes[0]} graphs of different token counts "
                        f"({', '.join(str(r.num_tokens) for r in record.ranks)})")
    eager = [i for i, r in enumerate(record.ranks) if r.need_eager and r.runtime_mode != NONE]
    if eager:
        problems.append(f"rank {eager[0]} needs eager and runs {record.ranks[eager[0]].runtime_mode.name}")
    unaligned = [i for i, r in enumerate(record.ranks) if r.idle and r.batch[2] != q]
    if unaligned:
        r = record.ranks[unaligned[0]]
        problems.append(f"idle rank {unaligned[0]}'s dummy batch is {r.batch[0]} request(s) of {r.batch[1]} token(s), "
                        f"not a uniform decode of {q}")
    return [Violation("P9", record.index, "; ".join(problems))] if problems else []


def stage_agreement(record: StepRecord) -> list[Violation]:
    """PP stages run every step in turn, each from its own resolve and dispatch
    (``contract/runners/mrv2/model/pp_utils.py``): a stage that raises leaves the stages around it
    waiting on a send or receive. Stages that run different modes break nothing by themselves: each
    stage resolves as one rank would (an eager stage is its own resolve's logged downgrade, as on one
    rank), and a later stage padding to fewer rows than it receives copies what it needs."""
    stopped = [i for i, r in enumerate(record.stages) if r.raised is not None]
    if stopped:
        r = record.stages[stopped[0]]
        return [Violation("P9", record.index, f"PP stage {stopped[0]} stopped ({r.raised}): the stages before it "
                          "never see their sends received, leaving the others waiting")]
    return []


PROPERTIES: dict[str, Property] = {
    p.id: p
    for p in (
        Property("P0", "liveness",
                 "vLLM does not stop on a configuration its validation accepted: a ValueError with advice from "
                 "VllmConfig, resolve or adaptive verification's check is an accepted rejection; an assertion, the "
                 "capture guard's RuntimeError or any later exception stops vLLM at start-up or when serving",
                 liveness),
        Property("P1", "one-capturer",
                 "every non-NONE dispatch is captured or replayed by exactly one capturing layer: 0 is a "
                 "silent eager fallback, 2 or more a nested capture",
                 _per_dispatch(one_capturer, "P1")),
        Property("P2", "none-is-eager", "a NONE dispatch reaches no capturing layer",
                 _per_dispatch(none_is_eager, "P2")),
        Property("P3", "capturer-identity",
                 "FULL is captured by CUDAGraphWrapper(FULL) (MRV2: the CudaGraphManager); PIECEWISE by the "
                 "breakable wrapper when VLLM_USE_BREAKABLE_CUDAGRAPH=1, else by the compiled piecewise wrappers",
                 _per_dispatch(capturer_identity, "P3")),
        Property("P4", "capture-legality",
                 "no capture outside profile_cudagraph_memory/capture_model; MRV1 raises 'CUDA graph capturing "
                 "detected at an inappropriate time' once the window is closed, MRV2 has no guard and "
                 "captures silently",
                 _per_dispatch(capture_legality, "P4")),
        Property("P5", "replay-stability",
                 "a repeated (mode, descriptor) replays the graph captured for it: no re-capture, no replay of "
                 "an entry captured under another mode, descriptor or module step, or into memory "
                 "profiling's discarded pool",
                 _per_dispatch(replay_stability, "P5")),
        Property("P6", "unwrap", "get_model()/unwrap() of the target and drafter stacks reaches the raw model",
                 unwrap_reaches_raw),
        Property("P7", "shape-legality",
                 "a FULL graph is captured or replayed only for batches the minimum AttentionCGSupport of the "
                 "backends it runs allows (ALWAYS any, UNIFORM_BATCH uniform, UNIFORM_SINGLE_TOKEN_DECODE one token "
                 "per request, NEVER none); a varlen-decode graph needs ALWAYS or a declared varlen bound; a "
                 "batch of k active LoRA adapters is served only by a graph captured for a LoRA case of at least k, "
                 "with that case's dummy adapters selected; a "
                 "breakable PIECEWISE capture breaks at the attention op (eager_break_during_capture) instead of "
                 "capturing it, and (MRV2) a breakable PIECEWISE graph serves its batch unpadded in requests; a "
                 "hybrid model's FULL graph holds no more requests than the Mamba cache has blocks; a FULL "
                 "uniform-decode graph of a hybrid model replays only for a batch of decoding requests, never a "
                 "prefill of its shape",
                 shape_and_lora_legality),
        Property("P8", "graph-coverage",
                 "each batch is served by the strongest graph the documented capture sizes give it, in a mode "
                 "the configuration names (capture sizes: contract/core/sizes.py); over traces, its intent: no graph "
                 "under cudagraph_mode NONE or in profile_run's eager pass, none of a mode the configured one does "
                 "not name, no drafter graph under speculative_config.enforce_eager",
                 _per_dispatch(intent, "P8")),
        Property("P9", "rank-agreement",
                 "on several data-parallel ranks every rank runs the same runtime mode, NONE where any rank needs "
                 "eager, and where it is a graph the same padded token count; an idle rank's dummy batch is a "
                 "uniform decode of q tokens per request; no rank raises or leaves the others waiting "
                 "(severity hang). No pipeline stage pads beyond the rows the stage before sent (its copy "
                 "raises: hang)",
                 rank_agreement),
        Property("P10", "start-up-accounting",
                 "every kind of graph capture_model captures (role, runtime mode) was captured by memory "
                 "profiling, whose estimate the KV cache is sized with, and profiling estimated no other kind; "
                 "profiling captures into a throwaway pool, every other capture into the global pool",
                 accounting),
    )
}


def check(record: StepRecord, scenario: Scenario, runner: Runner, only: frozenset[str] | None = None) -> list[Violation]:
    out: list[Violation] = []
    for pid, prop in PROPERTIES.items():
        if only is None or pid in only:
            out.extend(prop.check(scenario, runner, record))
    return out


def verdict_difference(mine: list[Violation], theirs: list[Violation], record, base_record, base_name: str) -> Violation | None:
    """How a mutant's step differs from its base's: a property violated by one only, or a halt."""
    mine_ids, theirs_ids = {v.property for v in mine}, {v.property for v in theirs}
    for v in mine:
        if v.property not in theirs_ids:
            return Violation(v.property, v.step, f"new violation (not under {base_name}): {v.message}", v.dispatch)
    for v in theirs:
        if v.property not in mine_ids:
            return Violation(v.property, v.step, f"masks a violation of {base_name}: {v.message}", v.dispatch)
    if (record.halted is None) != (base_record.halted is None):
        which = record.halted or base_record.halted
        side = "the mutant" if record.halted else base_name
        return Violation("halt", record.index, f"only {side} stops here: {which}")
    return None
