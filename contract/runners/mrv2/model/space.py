"""Model Runner V2's scenario space and event alphabet: what the explorer enumerates and the
Hypothesis machine draws for an MRV2 policy."""

from __future__ import annotations

import itertools

from hypothesis import strategies as hst

from contract.core.events import START_UP, ExecuteModel, Propose, batch_requests, on_ranks
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
from contract.core.lora import LORA_SETTINGS
from contract.core.scenario import (
    MAX_DATA_PARALLEL_SIZE,
    MAX_LORAS,
    MAX_NUM_SEQS,
    MAX_PIPELINE_PARALLEL_SIZE,
    MAX_UBATCH_SIZE,
    NUM_TOKENS_DOMAIN,
    ConfigRejected,
    DrafterKind,
    Runner,
    Scenario,
    Speculator,
    SplittingOps,
)
from contract.runners.mrv2.model.model_runner import has_compiled_submodule, skips_profiling


def alphabet(scenario: Scenario) -> tuple:
    q = scenario.uniform_decode_query_len
    batches = [(n, uniform, eager) for n in NUM_TOKENS_DOMAIN for uniform in (False, True)
               if not uniform or n % q == 0 for eager in ((False,) if scenario.ubatching else (False, True))]
    if scenario.data_parallel_size > 1:
        return START_UP + on_ranks(batches, scenario.data_parallel_size)
    serving = [ExecuteModel(*b) for b in batches]
    serving += [ExecuteModel(n, uniform, eager, num_active_loras=k) for n, uniform, eager in batches
                for k in range(1, min(scenario.max_loras, batch_requests(ExecuteModel(n, uniform), q, MAX_NUM_SEQS)) + 1)]
    serving += [Propose(n, uniform) for n in NUM_TOKENS_DOMAIN for uniform in (False, True) if not uniform or n % q == 0]
    return START_UP + tuple(serving)


def behaviour_key(scenario: Scenario, policy) -> tuple:
    try:
        config = policy.post_init(scenario, policy.config_revision)
        compiled = (has_compiled_submodule(scenario, config), has_compiled_submodule(scenario, config, draft=True))
    except ConfigRejected as exc:
        config, compiled = str(exc), None
    # MRV2 reads the model classes only through has_compiled_submodule. It never reads
    # speculative_config.enforce_eager under v1/worker/gpu/ (0.33.0, 0.34.0), but P8 judges the
    # drafter's graphs by it, so it stays in the key.
    return (scenario.breakable, config, compiled, scenario.drafter, scenario.speculator, scenario.spec_enforce_eager,
            scenario.attention_support, scenario.uniform_decode_query_len, scenario.adaptive_verification,
            skips_profiling(scenario, policy), scenario.varlen_decode_bound, scenario.attention_support_draft_only,
            scenario.data_parallel_size, scenario.pipeline_parallel_size, scenario.attention_support_stage,
            scenario.max_loras, scenario.specialize_active_lora, scenario.mamba_cache_blocks, scenario.ubatching,
            scenario.ubatch_size)


def all_scenarios() -> list[Scenario]:
    """Every valid MRV2 scenario, vLLM's defaults first."""
    out = []
    drafters = [(DrafterKind.NONE, Speculator.EAGLE, True)] + [
        (DrafterKind.WITH_MODEL, spec, dc) for spec in Speculator for dc in (True, False)] + [
        (DrafterKind.WITHOUT_MODEL, Speculator.EAGLE, True)]
    for (breakable, mode, cmode, split, (drafter, spec, dc), support, q, mc, av, ext) in itertools.product(
            (False, True), (FULL_AND_PIECEWISE, PIECEWISE, FULL, FULL_DECODE_ONLY, NONE),
            (CompilationMode.VLLM_COMPILE, CompilationMode.NONE), tuple(SplittingOps), drafters,
            tuple(AttentionCGSupport), (1, 2, 3), (True, False), (False, True), (True, False)):
        fields = dict(runner=Runner.MRV2, breakable=breakable, cudagraph_mode=mode, compilation_mode=cmode,
                      splitting_ops=split, drafter=drafter, speculator=spec, draft_compiled=dc,
                      attention_support=support, uniform_decode_query_len=q, model_compiled=mc,
                      adaptive_verification=av, extensible_kv_cache=ext)
        for bound, draft_only in adaptive_attention(av, drafter, support):
            # without adaptive verification a draft-only backend changes no step, only how P7 judges each
            # role: once per mode, compilation, splitting and support, the rest at vLLM's defaults
            if draft_only and not av and (breakable, spec, dc, q, mc, ext) != (False, Speculator.EAGLE, True, 2,
                                                                               True, True):
                continue
            try:
                out.append(Scenario(**fields, varlen_decode_bound=bound, attention_support_draft_only=draft_only))
            except ValueError:
                continue
    # speculative_config.enforce_eager: every mode, speculator, draft class and query length, the
    # rarer settings at vLLM's defaults (it doubles the drafter scenarios otherwise).
    for mode, spec, dc, q in itertools.product((FULL_AND_PIECEWISE, PIECEWISE, FULL, FULL_DECODE_ONLY, NONE),
                                               Speculator, (True, False), (2, 3)):
        out.append(Scenario(runner=Runner.MRV2, cudagraph_mode=mode, drafter=DrafterKind.WITH_MODEL, speculator=spec,
                            draft_compiled=dc, uniform_decode_query_len=q, spec_enforce_eager=True))
    # Several DP ranks: every mode, without a drafter and with one (the query length an idle rank's
    # dummy batch must match), the rest at vLLM's defaults, on two ranks (more are Hypothesis's: the
    # agreement's min, max and all-equal show on two, and three ranks cost the explorer ten times as many
    # events).
    for mode, (drafter, q), dp in itertools.product((FULL_AND_PIECEWISE, PIECEWISE, FULL, FULL_DECODE_ONLY, NONE),
                                                    ((DrafterKind.NONE, 1), (DrafterKind.WITH_MODEL, 2)), DP_SIZES):
        out.append(Scenario(runner=Runner.MRV2, cudagraph_mode=mode, drafter=drafter, uniform_decode_query_len=q,
                            data_parallel_size=dp))
    # Several PP stages: every mode and splitting, every stage on the same backend or the weakest
    # backend on the first or the last stage, on two stages (a middle stage is a last stage to the
    # one before it and a first to the one after).
    for mode, split, (support, stage) in itertools.product(
            (FULL_AND_PIECEWISE, PIECEWISE, FULL, FULL_DECODE_ONLY, NONE), tuple(SplittingOps),
            ((AttentionCGSupport.ALWAYS, None), *((support, stage) for support in (AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE, AttentionCGSupport.NEVER)
                                                  for stage in (0, 1)))):
        out.append(Scenario(runner=Runner.MRV2, cudagraph_mode=mode, splitting_ops=split, attention_support=support,
                            pipeline_parallel_size=PP_SIZE, attention_support_stage=stage))
    # LoRA: every mode, compilation and breakable setting, without a drafter and with one (which runs
    # no adapter), at one adapter (cases 0 and 2) and at three specialised ones (cases 0, 1, 2 and 4,
    # where 3 active adapters round up), the rest at vLLM's defaults.
    for mode, cmode, breakable, (drafter, q), (loras, specialize) in itertools.product(
            (FULL_AND_PIECEWISE, PIECEWISE, FULL, FULL_DECODE_ONLY, NONE),
            (CompilationMode.VLLM_COMPILE, CompilationMode.NONE), (False, True),
            ((DrafterKind.NONE, 1), (DrafterKind.WITH_MODEL, 2)), LORA_SETTINGS):
        out.append(Scenario(runner=Runner.MRV2, cudagraph_mode=mode, compilation_mode=cmode, breakable=breakable,
                            drafter=drafter, uniform_decode_query_len=q, max_loras=loras,
                            specialize_active_lora=specialize))
    # A hybrid model whose Mamba cache has fewer blocks than max_num_seqs (resolve refuses FULL graphs) and
    # as many (its FULL graphs serve, prefills of a decode's shape among the batches): every mode, without
    # a drafter and with one, the rest at vLLM's defaults.
    for blocks, mode, (drafter, q) in itertools.product(
            (FEW_MAMBA_BLOCKS, MAX_NUM_SEQS), (FULL_AND_PIECEWISE, PIECEWISE, FULL, FULL_DECODE_ONLY, NONE),
            ((DrafterKind.NONE, 1), (DrafterKind.WITH_MODEL, 2))):
        out.append(Scenario(runner=Runner.MRV2, cudagraph_mode=mode, drafter=drafter, uniform_decode_query_len=q,
                            mamba_cache_blocks=blocks))
    # Micro-batching on two DP ranks, two micro-batches (--enable-dbo) and three (--ubatch-size 3): every
    # mode vLLM accepts with it, without a drafter.
    for size, mode, dp in itertools.product((0, MAX_UBATCH_SIZE), (FULL_AND_PIECEWISE, FULL, FULL_DECODE_ONLY, NONE),
                                            DP_SIZES):
        out.append(Scenario(runner=Runner.MRV2, cudagraph_mode=mode, data_parallel_size=dp, ubatching=True,
                            ubatch_size=size))
    return out


FEW_MAMBA_BLOCKS = MAX_NUM_SEQS // 2  # a hybrid model's Mamba cache blocks, fewer than max_num_seqs
DP_SIZES = (2,)  # the explorer's; Hypothesis draws up to MAX_DATA_PARALLEL_SIZE
PP_SIZE = 2  # the explorer's; Hypothesis draws up to MAX_PIPELINE_PARALLEL_SIZE


def adaptive_attention(adaptive: bool, drafter: DrafterKind, support: AttentionCGSupport) -> list[tuple[bool, bool]]:
    """(varlen_decode_bound, attention_support_draft_only) pairs a scenario can take: both off, a
    weaker draft-only backend (a drafter with a model, support below ALWAYS), and under adaptive
    verification a declared varlen bound (UNIFORM_BATCH)."""
    out = [(False, False)]
    draft_only = drafter is DrafterKind.WITH_MODEL and support is not AttentionCGSupport.ALWAYS
    bound = adaptive and support is AttentionCGSupport.UNIFORM_BATCH
    out += [(True, False)] if bound else []
    out += [(False, True)] if draft_only else []
    out += [(True, True)] if bound and draft_only else []
    return out


def canonical_scenarios(policy) -> list[Scenario]:
    """One scenario per behaviour class, the first (most default-like) of each."""
    seen: dict[tuple, Scenario] = {}
    for s in all_scenarios():
        seen.setdefault(behaviour_key(s, policy), s)
    return list(seen.values())


# Built once: Hypothesis works out a strategy's properties on first use, which a strategy built per
# draw would pay on every example.
_DRAFTER = hst.sampled_from([DrafterKind.NONE, DrafterKind.WITH_MODEL, DrafterKind.WITH_MODEL,
                             DrafterKind.WITHOUT_MODEL])
_ATTENTION_SUPPORT = hst.sampled_from(AttentionCGSupport)
_BOOL = hst.booleans()
_OFF_OR_ON = hst.sampled_from((False, True))
_CUDAGRAPH_MODE = hst.sampled_from(CUDAGraphMode)
_COMPILATION_MODE = hst.sampled_from(CompilationMode)
_SPLITTING_OPS = hst.sampled_from(SplittingOps)
_QUERY_LEN = hst.sampled_from((2, 3))
_SPECULATOR = hst.sampled_from((Speculator.EAGLE, *Speculator))
_MOSTLY_ON = hst.sampled_from((True, True, False))
_RARE = hst.sampled_from((False, False, False, True))
_DATA_PARALLEL_SIZE = hst.sampled_from((1,) * 6 + tuple(range(2, MAX_DATA_PARALLEL_SIZE + 1)))  # one lane in three
# one lane without a drafter on one DP rank in three
_PIPELINE_PARALLEL_SIZE = hst.sampled_from((1,) * 6 + tuple(range(2, MAX_PIPELINE_PARALLEL_SIZE + 1)))
# LoRA off in two draws of three; on, each of the (max_loras, specialize_active_lora) settings alike
_LORA = hst.sampled_from(((0, False),) * 2 * (2 * MAX_LORAS) + tuple(
    (n, specialize) for n in range(1, MAX_LORAS + 1) for specialize in (False, True)))
# no Mamba layer in three draws of four; a hybrid model's cache with fewer blocks than max_num_seqs, or as many
_MAMBA_CACHE_BLOCKS = hst.sampled_from((None,) * 6 + (FEW_MAMBA_BLOCKS, MAX_NUM_SEQS))
_UBATCHING = hst.sampled_from((False, True, True, True))  # three of four multi-rank lanes without a drafter
# A DBO lane's mode and ranks, drawn again: FULL (whose token-keyed graphs get twins) most, two ranks most
# (on more, some rank's batch is more often below the threshold and nothing splits)
_DBO_MODE = hst.sampled_from((FULL, FULL, FULL, FULL_AND_PIECEWISE, FULL_DECODE_ONLY, NONE))
_DBO_RANKS = hst.sampled_from((2, 2, 2, 3, 4))
_UBATCH_SIZE = hst.sampled_from((0, 0, 0, MAX_UBATCH_SIZE))  # --enable-dbo's two micro-batches most
_WEAK_STAGE = {pp: hst.sampled_from((None, *range(pp))) for pp in range(2, MAX_PIPELINE_PARALLEL_SIZE + 1)}
# Under adaptive verification only the pairs that apply are drawn, a weaker draft-only backend most
# often: a field-by-field draw would rarely reach them. Without it, the draft-only backend is drawn
# last (_draw_scenario), so the other fields' draws stay what they were before it applied there.
_ADAPTIVE_PAIRS = {
    (adaptive, drafter, support): hst.sampled_from(pairs + [p for p in pairs if p[1]])
    for adaptive in (False, True) for drafter in DrafterKind for support in AttentionCGSupport
    for pairs in [adaptive_attention(adaptive, drafter, support)] if adaptive
} | {
    (False, drafter, support): hst.sampled_from(adaptive_attention(False, drafter, support))
    for drafter in DrafterKind for support in AttentionCGSupport
}


@hst.composite
def _draw_scenario(draw) -> Scenario:
    drafter = draw(_DRAFTER)
    has_spec = drafter is not DrafterKind.NONE
    with_model = drafter is DrafterKind.WITH_MODEL
    support = draw(_ATTENTION_SUPPORT)
    adaptive = has_spec and draw(_OFF_OR_ON)
    bound, draft_only = draw(_ADAPTIVE_PAIRS[(adaptive, drafter, support)])
    dp = draw(_DATA_PARALLEL_SIZE)
    pp = draw(_PIPELINE_PARALLEL_SIZE) if not has_spec and dp == 1 else 1
    weak_stage = draw(_WEAK_STAGE[pp]) if pp > 1 and support is not AttentionCGSupport.ALWAYS else None
    fields = dict(
        runner=Runner.MRV2,
        breakable=draw(_BOOL),
        cudagraph_mode=draw(_CUDAGRAPH_MODE),
        compilation_mode=draw(_COMPILATION_MODE),
        splitting_ops=draw(_SPLITTING_OPS),
        drafter=drafter,
        attention_support=support,
        uniform_decode_query_len=draw(_QUERY_LEN) if has_spec else 1,
        speculator=draw(_SPECULATOR) if with_model else Speculator.EAGLE,
        model_compiled=draw(_MOSTLY_ON),
        draft_compiled=draw(_BOOL) if with_model else True,
        spec_enforce_eager=with_model and draw(_RARE),
        adaptive_verification=adaptive,
        extensible_kv_cache=draw(_MOSTLY_ON),
        varlen_decode_bound=bound,
        attention_support_draft_only=draft_only,
        data_parallel_size=dp,
        pipeline_parallel_size=pp,
        attention_support_stage=weak_stage,
    )
    # drawn last, so the other fields' draws stay what they were before LoRA was modelled
    loras, specialize = draw(_LORA) if dp == 1 and pp == 1 else (0, False)
    mamba = draw(_MAMBA_CACHE_BLOCKS) if dp == 1 and pp == 1 else None
    ubatching = dp > 1 and not has_spec and draw(_UBATCHING)
    if ubatching:
        fields.update(cudagraph_mode=draw(_DBO_MODE), data_parallel_size=draw(_DBO_RANKS),
                      ubatch_size=draw(_UBATCH_SIZE))
    return Scenario(**fields, max_loras=loras, specialize_active_lora=specialize, mamba_cache_blocks=mamba,
                    ubatching=ubatching)


def scenarios():
    """The Hypothesis strategy for MRV2 scenarios: every modelled setting, field by field."""
    return _draw_scenario()
