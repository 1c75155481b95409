"""One conformance run: start vLLM's code, replay the corpus, collect results and findings."""

from __future__ import annotations

import gc
import sys
from collections import Counter

from contract.conformance import corpus as corpus_mod
from contract.conformance.compare import compare, predict
from contract.conformance.report import ConformanceRun, finding
from contract.policy import Policy
from contract.scenario import Runner
from contract.trace import Trace, TraceError


class ReplayProblem(Exception):
    """A trace the real code cannot be run on, or vLLM's code that cannot start; one line."""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def run(version: str, policy: Policy, files: list[tuple[Trace, str]], corpus: str) -> ConformanceRun:
    for trace, source in files:  # refuse a bad trace before the slow start of vLLM
        if trace.scenario.runner is Runner.MRV1 and trace.policy == policy.name:
            try:
                predict(trace, policy)
            except TraceError as exc:
                raise ReplayProblem(f"trace {source}: {exc}") from None
    from contract.conformance.replay import Session

    try:
        session = Session()
    except ModuleNotFoundError as exc:
        raise ReplayProblem(f"vLLM {version} needs the module {exc.name or exc}, which this environment lacks; "
                            f"complete it with conformance-env/make-env.sh {version} {sys.prefix}") from None
    except Exception as exc:  # noqa: BLE001 - any failure to start is an environment problem
        raise ReplayProblem(f"vLLM {version}'s code does not start on this machine: {_first_line(exc)}") from None
    revision = session.block.revision
    out = ConformanceRun(
        version=session.version,
        policy=policy.name,
        block={"where": session.block.where, "digest": session.block.digest,
               "revision": revision[0] if revision else None, "policy": revision[1] if revision else None},
        corpus=corpus,
    )
    for trace, source in files:
        result = _compare(session, trace, policy, source)
        out.results.append(result)
        if trace.policy == policy.name and result.violations:
            out.findings.append(finding(result, policy.name, result.violations, trace.scenario.ubatching))
    if corpus != "none":
        traces = corpus_mod.generated(policy)
        if corpus == "covering":
            traces = iter(corpus_mod.select(traces))
            # Held until replayed: out of reach of the collections vLLM 0.29.0's breakable capture
            # runs per capture (breakable_cudagraph.py:375), which would otherwise walk them all.
            gc.freeze()
        counts: Counter = Counter()
        for trace in traces:
            result = _compare(session, trace, policy, trace.name)
            out.generated["traces"] += 1
            out.generated["steps"] += result.steps
            out.generated["agreeing"] += result.agreeing
            counts.update({v["property"] for v in result.violations})
            if result.diffs:
                out.generated_diffs.append(result)
        out.generated["violations"] = dict(sorted(counts.items()))
    out.decisions = session.decisions.to_json()
    out.mirrored = session.mirrored()
    from contract.conformance.decisions import WHERE

    out.where = dict(sorted(WHERE.items()))
    return out


def _compare(session, trace: Trace, policy: Policy, source: str):
    from contract.conformance.replay import CannotBuild

    try:
        return compare(session, trace, policy, source)
    except CannotBuild as exc:
        raise ReplayProblem(f"trace {source}: {exc}") from None
    except TraceError as exc:
        raise ReplayProblem(f"trace {source}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - the adapter could not drive vLLM's code for this trace
        raise ReplayProblem(f"trace {source}: vLLM's code could not be run on it: {_first_line(exc)}") from None
