"""Model Runner V1's scenario space and event alphabet: what the explorer enumerates and the
Hypothesis machine draws for an MRV1 policy."""

from __future__ import annotations

from hypothesis import strategies as st

from contract.core.events import START_UP, ExecuteModel, Propose, batch_requests, on_ranks
from contract.core.lora import LORA_SETTINGS
from contract.core.modes import (
    FULL,
    FULL_AND_PIECEWISE,
    FULL_DECODE_ONLY,
    NONE,
    PIECEWISE,
    AttentionCGSupport,
    CompilationMode,
    CUDAGraphMode,
)
from contract.core.scenario import (
    MAX_DATA_PARALLEL_SIZE,
    MAX_NUM_SEQS,
    MAX_UBATCH_SIZE,
    NUM_TOKENS_DOMAIN,
    ConfigRejected,
    ConfigRevision,
    DrafterKind,
    Runner,
    Scenario,
    SplittingOps,
    all_scenarios,
)
from contract.runners.mrv1.model.cudagraph_dispatcher import normalise


def alphabet(scenario: Scenario) -> tuple:
    """Every event the runner could take, batch sizes by class; on several DP ranks every step the
    ranks can bring (``on_ranks``), whose every rank drafts in it where there is a drafter; with LoRA
    each batch also with every count of active adapters its requests can ask for."""
    q = scenario.uniform_decode_query_len
    batches = [(n, uniform, eager) for n in NUM_TOKENS_DOMAIN for uniform in (False, True)
               if not uniform or n % q == 0 for eager in (False, True)]
    if scenario.data_parallel_size > 1:
        return START_UP + on_ranks(batches, scenario.data_parallel_size)
    serving = [ExecuteModel(*b) for b in batches]
    serving += [ExecuteModel(n, uniform, eager, num_active_loras=k) for n, uniform, eager in batches
                for k in range(1, min(scenario.max_loras, batch_requests(ExecuteModel(n, uniform), q, MAX_NUM_SEQS)) + 1)]
    return START_UP + tuple(serving) + tuple(Propose(n) for n in NUM_TOKENS_DOMAIN)


def _weighted(*pairs):
    """``sampled_from`` with integer weights; the first value is the one Hypothesis shrinks to."""
    return st.sampled_from([value for value, weight in pairs for _ in range(weight)])


# Built once: Hypothesis works out a strategy's properties on first use, which a strategy built per
# draw would pay on every example.
_DRAFTER = _weighted((DrafterKind.NONE, 2), (DrafterKind.WITH_MODEL, 2), (DrafterKind.WITHOUT_MODEL, 1))
_RARE = _weighted((False, 3), (True, 1))
_BOOL = st.booleans()
_CUDAGRAPH_MODE = st.sampled_from(CUDAGraphMode)
_COMPILATION_MODE = st.sampled_from(CompilationMode)
_SPLITTING_OPS = _weighted((SplittingOps.DEFAULT, 2), (SplittingOps.ATTENTION, 1), (SplittingOps.EMPTY, 1))
_ATTENTION_SUPPORT = st.sampled_from(AttentionCGSupport)
_QUERY_LEN = st.sampled_from((2, 3))
_DATA_PARALLEL_SIZE = st.sampled_from((1,) * 12 + tuple(range(2, MAX_DATA_PARALLEL_SIZE + 1)))
_UBATCHING = st.sampled_from((False, True, True, True))
# A DBO lane's mode: those with a FULL uniform decode graph to split most; two ranks most (on more, some
# rank's batch is more often below the threshold and nothing splits)
_DBO_MODE = st.sampled_from((FULL_AND_PIECEWISE, FULL_AND_PIECEWISE, FULL_DECODE_ONLY, FULL, PIECEWISE, NONE))
_DBO_RANKS = st.sampled_from((2, 2, 2, 3, 4))
_UBATCH_SIZE = st.sampled_from((0, MAX_UBATCH_SIZE))  # two micro-batches and three alike
_DRAFT_RANKS = st.sampled_from((2, 2, 2, 3, 4))


@st.composite
def scenarios(draw) -> Scenario:
    """Every modelled MRV1 setting, field by field; only combinations vLLM can express.

    Rarely used settings (micro-batching, n-gram drafters, ``speculative_config.enforce_eager``)
    are drawn less often, so sampling spends its examples where deployments are; the explorer
    enumerates every combination regardless.
    """
    drafter = draw(_DRAFTER)
    has_spec = drafter is not DrafterKind.NONE
    breakable, ubatching = draw(_BOOL), draw(_RARE)
    fields = dict(
        runner=Runner.MRV1,
        breakable=breakable,
        ubatching=ubatching,
        cudagraph_mode=draw(_CUDAGRAPH_MODE),
        compilation_mode=draw(_COMPILATION_MODE),
        splitting_ops=draw(_SPLITTING_OPS),
        drafter=drafter,
        attention_support=draw(_ATTENTION_SUPPORT),
        spec_enforce_eager=has_spec and draw(_RARE),
        uniform_decode_query_len=draw(_QUERY_LEN) if has_spec else 1,
        # several DP ranks without a drafter or micro-batching, one such lane in five (a drafter's: below)
        data_parallel_size=1 if has_spec or ubatching else draw(_DATA_PARALLEL_SIZE),
    )
    # a weaker draft-only backend, where one applies, one draw in two (drawn last: the other fields'
    # draws, and what the ci profile finds with them, stay as they were)
    draft_only = (drafter is DrafterKind.WITH_MODEL and fields["attention_support"] is not AttentionCGSupport.ALWAYS
                  and draw(_BOOL))
    # micro-batching in three of four multi-rank lanes, with a mode, ranks and micro-batch count drawn
    # again (drawn last, as the draft-only backend)
    if fields["data_parallel_size"] > 1 and draw(_UBATCHING):
        fields.update(ubatching=True, cudagraph_mode=draw(_DBO_MODE), data_parallel_size=draw(_DBO_RANKS),
                      ubatch_size=draw(_UBATCH_SIZE))
    # EAGLE's drafter on several ranks in one lane in four with one taking graphs, not micro-batching
    # (drawn last, as the draft-only backend; the explorer has an eager drafter on two ranks); LoRA in
    # one of the others in four, its setting read off the query length (a strategy of its own, or a
    # draw on every lane, moves the ci profile's examples off three mutants' kills)
    drafting = drafter is DrafterKind.WITH_MODEL and not ubatching and not fields["spec_enforce_eager"]
    if drafting and draw(_RARE):
        fields.update(data_parallel_size=draw(_DRAFT_RANKS))
    elif drafting and draw(_RARE):
        fields.update(zip(("max_loras", "specialize_active_lora"), LORA_SETTINGS[fields["uniform_decode_query_len"] > 2]))
    return Scenario(**fields, attention_support_draft_only=draft_only)


def behaviour_key(scenario: Scenario, revision: ConfigRevision) -> tuple:
    """Scenarios with equal keys behave identically in the model: the runner reads the normalised
    config, not the raw compilation fields."""
    try:
        config = normalise(scenario, revision)
    except ConfigRejected as exc:
        config = str(exc)
    return (scenario.runner, scenario.breakable, scenario.ubatching, config, scenario.drafter,
            scenario.attention_support, scenario.spec_enforce_eager, scenario.uniform_decode_query_len,
            scenario.data_parallel_size, scenario.attention_support_draft_only, scenario.ubatch_size,
            scenario.max_loras, scenario.specialize_active_lora)


def canonical_scenarios_of(revision: ConfigRevision = ConfigRevision.V0_30) -> list[Scenario]:
    """One scenario per behaviour class, the first (most default-like) of each, in order."""
    seen: dict[tuple, Scenario] = {}
    for s in [*all_scenarios(Runner.MRV1), *on_two_ranks(), *micro_batched_on_two_ranks(), *drafting_on_two_ranks(),
              *with_lora()]:
        seen.setdefault(behaviour_key(s, revision), s)
    return list(seen.values())


def on_two_ranks() -> list[Scenario]:
    """Two DP ranks: every mode at vLLM's other defaults."""
    return [Scenario(runner=Runner.MRV1, cudagraph_mode=mode, data_parallel_size=2) for mode in CUDAGraphMode]


def drafting_on_two_ranks() -> list[Scenario]:
    """Two DP ranks with EAGLE's drafter (each rank's proposer syncs its own passes): every mode, one
    and two speculative tokens, and ``speculative_config.enforce_eager`` under FULL_AND_PIECEWISE."""
    return [Scenario(runner=Runner.MRV1, cudagraph_mode=mode, data_parallel_size=2, drafter=DrafterKind.WITH_MODEL,
                     uniform_decode_query_len=q, spec_enforce_eager=eager)
            for mode in CUDAGraphMode for q in (2, 3) for eager in (False, True)
            if not eager or mode == FULL_AND_PIECEWISE]


def with_lora() -> list[Scenario]:
    """LoRA on one rank: every mode, without a drafter and with EAGLE's (whose capture runs sit inside
    the target's LoRA cases), at each of ``LORA_SETTINGS``, the rest at vLLM's defaults."""
    return [Scenario(runner=Runner.MRV1, cudagraph_mode=mode, drafter=drafter, uniform_decode_query_len=q,
                     max_loras=loras, specialize_active_lora=specialize)
            for mode in CUDAGraphMode for drafter, q in ((DrafterKind.NONE, 1), (DrafterKind.WITH_MODEL, 2))
            for loras, specialize in LORA_SETTINGS]


def micro_batched_on_two_ranks() -> list[Scenario]:
    """Two DP ranks micro-batching (``UBatchWrapper``'s own graphs): every mode, under --enable-dbo's
    two micro-batches and --ubatch-size 3."""
    return [Scenario(runner=Runner.MRV1, cudagraph_mode=mode, data_parallel_size=2, ubatching=True, ubatch_size=n)
            for mode in CUDAGraphMode for n in (0, MAX_UBATCH_SIZE)]


def canonical_scenarios(policy) -> list[Scenario]:
    return canonical_scenarios_of(policy.config_revision)
