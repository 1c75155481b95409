"""One conformance run: start vLLM's code, replay the corpus, collect results and findings."""

from __future__ import annotations

import gc
import itertools
import sys
from collections import Counter
from collections.abc import Iterator

from contract.core import progress
from contract.real import corpus as corpus_mod
from contract.real.compare import compare, predict
from contract.real.errors import first_line
from contract.real.run import ConformanceRun, ReplayProblem, finding
from contract.core.policy import Policy
from contract.core.modes import AttentionCGSupport, CompilationMode, CUDAGraphMode
from contract.core.scenario import (
    MAX_DATA_PARALLEL_SIZE,
    DrafterKind,
    Runner,
    Scenario,
    Speculator,
    SplittingOps,
    all_scenarios,
)
from contract.core.sizes import grid
from contract.core.trace import Trace, TraceError
from contract.real.sizes import conformance as size_conformance
from contract.runners.mrv1.model.space import drafting_on_two_ranks, micro_batched_on_two_ranks, on_two_ranks, with_lora
from contract.runners.mrv1.real import sizes


def scenarios() -> Iterator[Scenario]:
    """Every MRV1 scenario, in a fixed order; then the model space's on two data-parallel ranks
    (each trace one process per rank, ``contract/real/ranks.py``), and vLLM's defaults on 3 and 4;
    then a weaker draft-only backend (``attention_support_draft_only``) under every mode, compilation,
    splitting and breakable setting; then the draft model's proposer (``method: draft_model``) under
    every mode, compilation, splitting and breakable setting; then two ranks micro-batching under
    every mode; then two ranks drafting with EAGLE; then LoRA on one rank."""
    fields = itertools.product(
        (False, True), (False, True), CUDAGraphMode, CompilationMode, SplittingOps, AttentionCGSupport,
    )
    for breakable, ubatching, mode, compilation_mode, splitting_ops, support in fields:
        for drafter in DrafterKind:
            has_spec = drafter is not DrafterKind.NONE
            for q in corpus_mod.SPEC_QUERY_LENS if has_spec else (1,):
                for spec_enforce_eager in (False, True) if has_spec else (False,):
                    yield Scenario(
                        runner=Runner.MRV1, breakable=breakable, ubatching=ubatching, cudagraph_mode=mode,
                        compilation_mode=compilation_mode, splitting_ops=splitting_ops, drafter=drafter,
                        attention_support=support, spec_enforce_eager=spec_enforce_eager,
                        uniform_decode_query_len=q,
                    )
    yield from on_two_ranks()
    yield from (Scenario(runner=Runner.MRV1, data_parallel_size=n) for n in range(3, MAX_DATA_PARALLEL_SIZE + 1))
    # the draft model's layers on the weaker backend, the target's on an ALWAYS one
    yield from (s for s in all_scenarios(Runner.MRV1) if s.attention_support_draft_only)
    yield from draft_model_scenarios()
    yield from micro_batched_on_two_ranks()
    yield from drafting_on_two_ranks()
    yield from with_lora()


def draft_model_scenarios() -> Iterator[Scenario]:
    """``DraftModelProposer`` where the runner's checks name ``uses_draft_model()`` beside
    ``use_eagle()``: one speculative token, the target's backend."""
    for breakable, mode, compilation_mode, splitting_ops in itertools.product(
            (False, True), CUDAGraphMode, CompilationMode, SplittingOps):
        yield Scenario(runner=Runner.MRV1, breakable=breakable, cudagraph_mode=mode, compilation_mode=compilation_mode,
                       splitting_ops=splitting_ops, drafter=DrafterKind.WITH_MODEL, uniform_decode_query_len=2,
                       speculator=Speculator.STANDALONE_AR)


def generated(policy: Policy) -> Iterator[Trace]:
    for i, scenario in enumerate(scenarios()):
        yield corpus_mod.runnable_trace(scenario, policy, f"covering-{i:04d}", {"engine": "conformance-corpus"})


def session():
    """A replay session on the installed vLLM (imports vLLM and torch: the release's environment only)."""
    from contract.runners.mrv1.real.replay import Session

    return Session()


def run(version: str, policy: Policy, files: list[tuple[Trace, str]], corpus: str) -> ConformanceRun:
    for trace, source in files:  # refuse a bad trace before the slow start of vLLM
        if trace.scenario.runner is Runner.MRV1 and trace.policy == policy.name:
            try:
                predict(trace, policy)
            except TraceError as exc:
                raise ReplayProblem(f"trace {source}: {exc}") from None
    from contract.runners.mrv1.real.replay import Session

    try:
        session = Session()
    except ModuleNotFoundError as exc:
        raise ReplayProblem(f"vLLM {version} needs the module {exc.name or exc}, which this environment lacks; "
                            f"complete it with cudagraph-contract env make {version} --dir {sys.prefix}") from None
    except Exception as exc:  # noqa: BLE001 - any failure to start is an environment problem
        raise ReplayProblem(f"vLLM {version}'s code does not start on this machine: {first_line(exc)}") from None
    revision = session.block.revision
    out = ConformanceRun(
        version=session.version,
        policy=policy.name,
        block={"where": session.block.where, "digest": session.block.digest,
               "revision": revision[0] if revision else None, "policy": revision[1] if revision else None},
        corpus=corpus,
    )
    progress.stage("trace files", len(files), f"vLLM {session.version}")
    for trace, source in files:
        result = _compare(session, trace, policy, source)
        out.results.append(result)
        out.count_ranks(result)
        if trace.policy == policy.name and result.violations:
            out.findings.append(finding(result, policy.name, result.violations,
                                            trace.scenario.ubatching and trace.scenario.data_parallel_size == 1))
        progress.advance()
    if corpus != "none":
        traces = generated(policy)
        if corpus == "covering":
            progress.stage("", None, "choosing the covering traces")
            chosen = corpus_mod.select(traces)
            traces, total = iter(chosen), len(chosen)
            # Held until replayed: out of reach of the collections vLLM 0.29.0's breakable capture
            # runs per capture (breakable_cudagraph.py:375), which would otherwise walk them all.
            gc.freeze()
        else:
            total = sum(1 for _ in scenarios())  # one generated trace per scenario
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
    if sizes.SIZES.models(session.version):
        settings = grid()
        progress.stage("capture-size settings", None, f"vLLM {session.version}")
        release = ".".join(session.version.split(".")[:2])
        out.sizes = size_conformance(sizes.SIZES, release, settings, sizes.observe(session, settings))
    out.decisions = session.decisions.to_json()
    out.mirrored = session.mirrored()
    from contract.real.decisions import WHERE

    out.where = dict(sorted(WHERE.items()))
    return out


def _compare(session, trace: Trace, policy: Policy, source: str):
    from contract.runners.mrv1.real.replay import CannotBuild

    try:
        return compare(session, trace, policy, source)
    except CannotBuild as exc:
        raise ReplayProblem(f"trace {source}: {exc}") from None
    except TraceError as exc:
        raise ReplayProblem(f"trace {source}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - the adapter could not drive vLLM's code for this trace
        raise ReplayProblem(f"trace {source}: vLLM's code could not be run on it: {first_line(exc)}") from None
