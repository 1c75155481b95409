"""One Model Runner V2 conformance run: start vLLM's MRV2 code, replay the corpus, collect results.

The generated corpus is every MRV2 scenario without a speculator or with a replayed one
(``scenario.all_scenarios(Runner.MRV2)``, with ``model_compiled`` and ``draft_compiled`` both ways, and
``extensible_kv_cache`` both ways for a release that reads it) under the MRV1 corpus's event script,
as far as the model's runner takes it; ``covering`` keeps one trace per new observation cell
(``corpus.select``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from collections.abc import Iterator

from contract.core import progress
from contract.real import corpus as corpus_mod
from contract.real.compare import TraceResult, compare, predict
from contract.real.errors import first_line
from contract.real.run import ConformanceRun, ReplayProblem, finding
from contract.core.policy import Policy
from contract.core.modes import FULL_AND_PIECEWISE, AttentionCGSupport
from contract.core.scenario import (
    MAX_DATA_PARALLEL_SIZE,
    MAX_PIPELINE_PARALLEL_SIZE,
    DrafterKind,
    Runner,
    Scenario,
    SplittingOps,
    Speculator,
    all_scenarios,
)
from contract.core.sizes import grid
from contract.core.trace import Trace, TraceError
from contract.real.sizes import conformance as size_conformance
from contract.runners.mrv2.real import sizes
from contract.runners.mrv2.real.modules import NOT_REPLAYED_SPECULATOR, NOT_REPLAYED_WITHOUT_MODEL, REPLAYED_SPECULATORS
from contract.runners.mrv2.model import space
from contract.runners.mrv2.model.space import adaptive_attention

NOT_REPLAYED_RANKS_ON_CUDA = "not replayed (several data-parallel ranks or pipeline stages replay on CPU only)"

# The n-gram and suffix speculators build no CUDA-graph manager and capture nothing
# (33:…/ngram/speculator.py:209-213, 34:…/suffix/speculator.py:620-624); the n-gram one is built
# from the runner's request states, which the stand-in runner does not keep.


def scenarios(policy: Policy) -> Iterator:
    """MRV2 scenarios, each with a compiled-class model and with an undecorated one
    (``model_compiled``); with a replayed speculator, each with a compiled and an uncompiled draft
    class (``draft_compiled``, lead L2), with a weaker draft-only backend where one applies, and with
    and without adaptive verification (with it, each declared varlen bound); under a release
    whose memory profiling reads the extensible KV cache (0.34.0), each again with it off, where
    ``profile_cudagraph_memory`` captures. Under ``spec_enforce_eager``, the model space's scenarios
    of a replayed speculator (``space.all_scenarios``: the rarer settings at vLLM's defaults), and
    so on several data-parallel ranks (each trace one process per rank, ``dp_utils.replay_ranks``),
    pipeline stages (one process per stage, ``ranks.replay_stages``), with LoRA (each KV-cache setting
    again), a hybrid model with fewer Mamba cache blocks than ``max_num_seqs`` and, last, three
    micro-batches (``ubatch_size``) on several ranks."""
    kv_cache = (True, False) if getattr(policy, "extensible_kv_cache_skips_profiling", False) else (True,)
    for extensible in kv_cache:
        for s in all_scenarios(Runner.MRV2):
            s = replace(s, extensible_kv_cache=extensible)
            if s.drafter is DrafterKind.NONE:
                yield s
                yield replace(s, model_compiled=False)
            elif (s.drafter is DrafterKind.WITH_MODEL and not s.spec_enforce_eager
                  and not s.attention_support_draft_only):  # the loop below sets it
                for speculator in sorted(REPLAYED_SPECULATORS, key=lambda v: v.name):
                    for draft_compiled, adaptive in ((True, False), (False, False), (True, True)):
                        # each draft-only backend, and under adaptive verification each varlen bound
                        for bound, draft_only in adaptive_attention(adaptive, s.drafter, s.attention_support):
                            # without adaptive verification a draft-only backend reaches resolve alone: once
                            if draft_only and not adaptive and (speculator, draft_compiled) != (Speculator.EAGLE, True):
                                continue
                            try:
                                yield replace(s, speculator=speculator, draft_compiled=draft_compiled,
                                              adaptive_verification=adaptive, varlen_decode_bound=bound,
                                              attention_support_draft_only=draft_only)
                            except ValueError:
                                continue
        for s in space.all_scenarios():
            if s.spec_enforce_eager and s.speculator in REPLAYED_SPECULATORS:
                yield replace(s, extensible_kv_cache=extensible)
    # the ranks' agreement reads no KV-cache setting: once, at its default; vLLM's defaults on 3 and 4 ranks
    on_ranks = [s for s in space.all_scenarios() if s.data_parallel_size > 1]
    yield from _on_more_ranks([s for s in on_ranks if not s.ubatch_size])
    # PP stages: one scenario per behaviour class on two stages; vLLM's defaults on 3 and 4 stages,
    # the weakest backend on stage 1 (a middle stage from 3 on)
    yield from (s for s in space.canonical_scenarios(policy) if s.pipeline_parallel_size > 1)
    yield from (Scenario(runner=Runner.MRV2, splitting_ops=SplittingOps.EMPTY, attention_support=support,
                         pipeline_parallel_size=n, attention_support_stage=stage)
                for n in range(3, MAX_PIPELINE_PARALLEL_SIZE + 1)
                for support, stage in ((AttentionCGSupport.ALWAYS, None), (AttentionCGSupport.NEVER, 1)))
    yield from (replace(s, extensible_kv_cache=extensible) for extensible in kv_cache for s in space.all_scenarios()
                if s.max_loras)
    yield from (s for s in space.all_scenarios() if s.mamba_cache_blocks is not None)
    yield from _on_more_ranks([s for s in on_ranks if s.ubatch_size])


def _on_more_ranks(on_ranks: list[Scenario]) -> Iterator[Scenario]:
    """The scenarios, then vLLM's default mode of each on 3 and 4 ranks."""
    yield from on_ranks
    yield from (replace(s, data_parallel_size=n) for n in range(3, MAX_DATA_PARALLEL_SIZE + 1) for s in on_ranks
                if s.cudagraph_mode is FULL_AND_PIECEWISE)


def generated(policy: Policy) -> Iterator[Trace]:
    for i, scenario in enumerate(scenarios(policy)):
        yield corpus_mod.runnable_trace(scenario, policy, f"mrv2-covering-{i:04d}", {"engine": "conformance-corpus"})


def session():
    """A replay session on the installed vLLM (imports vLLM and torch: the release's environment only)."""
    from contract.runners.mrv2.real.replay import Session

    return Session()


def run(version: str, policy: Policy, files: list[tuple[Trace, str]], corpus: str) -> ConformanceRun:
    replayable = []
    for trace, source in files:
        if trace.scenario.runner is not Runner.MRV2:
            replayable.append((trace, source))
            continue
        try:
            predict(trace, policy)
        except TraceError as exc:
            if trace.policy == policy.name:
                raise ReplayProblem(f"trace {source}: {exc}") from None
        replayable.append((trace, source))
    from contract.runners.mrv2.real.replay import Session

    try:
        session = Session()
    except Exception as exc:  # noqa: BLE001 - any failure to start is an environment problem
        raise ReplayProblem(f"vLLM {version}'s MRV2 code does not start on this machine: {first_line(exc)}") from None
    out = ConformanceRun(
        version=session.version, policy=policy.name,
        block={"where": ", ".join(f"{k} {v}" for k, v in session.blocks.where().items()),
               "digest": "", "revision": None, "policy": None, "runner": "MRV2",
               "blocks": session.blocks.where(), "digests": session.blocks.digests()},
        corpus=corpus,
    )
    progress.stage("trace files", len(replayable), f"vLLM {session.version}")
    for trace, source in replayable:
        result = _compare(session, trace, policy, source)
        out.results.append(result)
        out.count_ranks(result)
        if trace.policy == policy.name and result.violations:
            out.findings.append(finding(result, policy.name, result.violations))
        progress.advance()
    if corpus != "none":
        traces = generated(policy)
        if corpus == "covering":
            progress.stage("", None, "choosing the covering traces")
            chosen = corpus_mod.select(traces)
            traces, total = iter(chosen), len(chosen)
        else:
            total = sum(1 for _ in scenarios(policy))  # one generated trace per scenario
        progress.stage("generated traces", total, f"vLLM {session.version}")
        counts: Counter = Counter()
        for trace in traces:
            result = _compare(session, trace, policy, trace.name)
            out.count_ranks(result)
            out.generated["traces"] += 1
            out.generated["steps"] += result.steps
            out.generated["agreeing"] += result.agreeing
            counts.update({v["property"] for v in result.violations})
            if result.diffs:
                out.generated_diffs.append(result)
            progress.advance()
        out.generated["violations"] = dict(sorted(counts.items()))
    settings = grid()
    progress.stage("capture-size settings", None, f"vLLM {session.version}")
    release = ".".join(session.version.split(".")[:2])
    out.sizes = size_conformance(sizes.SIZES, release, settings, sizes.observe(session, settings))
    from contract.real.decisions import WHERE
    from contract.runners.mrv2.real import decision_points

    out.decisions = session.decisions.to_json()
    out.where = dict(sorted(WHERE.items()))
    out.mirrored = decision_points.mirrored(session.version)
    return out


def _compare(session, trace: Trace, policy: Policy, source: str):
    from contract.runners.mrv2.real.replay import CannotBuild

    if trace.scenario.runner is Runner.MRV2 and trace.scenario.drafter is DrafterKind.WITHOUT_MODEL:
        return TraceResult(trace.name or source, source, trace.policy, NOT_REPLAYED_WITHOUT_MODEL)
    if (trace.scenario.runner is Runner.MRV2 and trace.scenario.drafter is DrafterKind.WITH_MODEL
            and trace.scenario.speculator not in REPLAYED_SPECULATORS):
        return TraceResult(trace.name or source, source, trace.policy,
                           NOT_REPLAYED_SPECULATOR.format(trace.scenario.speculator.name))
    if (trace.scenario.data_parallel_size > 1 or trace.scenario.pipeline_parallel_size > 1) and session.device == "cuda":
        # the ranks are forked from the replay's process, which a CUDA context cannot follow
        return TraceResult(trace.name or source, source, trace.policy, NOT_REPLAYED_RANKS_ON_CUDA)
    try:
        return compare(session, trace, policy, source, Runner.MRV2)
    except (CannotBuild, TraceError) as exc:
        raise ReplayProblem(f"trace {source}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - the adapter could not drive vLLM's code for this trace
        raise ReplayProblem(f"trace {source}: vLLM's MRV2 code could not be run on it: {first_line(exc)}") from None
