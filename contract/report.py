"""Markdown reports under ``reports/``: the verdict table and one page per counterexample, written
atomically and byte-stable (no times, no absolute paths, sorted everything)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from contract.coverage import Cell
from contract.evidence import matrix, serve, status, vllm_test
from contract.evidence.release_facts import committed
from contract.expected import STATUS
from contract.mrv2.report import responsible_lines as mrv2_responsible_lines
from contract.explore import Exploration
from contract.markdown import mermaid, step_list
from contract.observation import Dispatch
from contract.policy import Policy
from contract.properties import PROPERTIES
from contract.render import dispatch_summary
from contract.scenario import Runner, Scenario
from contract.trace import Trace, replay, write_atomic
from contract.verify import Verdict

REGENERATE = "make verify  # = cudagraph-contract report --profile ci --out reports"


@dataclass
class PolicyResult:
    policy: Policy
    verdicts: dict[str, Verdict]
    exploration: Exploration
    cells: set[Cell]  # reached by the Hypothesis runs


# ---------------------------------------------------------------------------------------------
# Where in vLLM a violation comes from (vLLM 0.33.0 paths, spec citations)

WRAPPING = "`v1/worker/gpu_model_runner.py:5128-5165` (`load_model` wrapping)"


def responsible_lines(prop: str, scenario: Scenario, d: Dispatch | None) -> list[str]:
    if prop == "P6":
        return ["`compilation/cuda_graph.py:222-226` and `compilation/breakable_cudagraph.py:304-307` (`unwrap`)",
                "`v1/worker/gpu_ubatch_wrapper.py:117-119` (`UBatchWrapper.unwrap` does not recurse)",
                "`v1/worker/gpu_model_runner.py:3078-3097` (`get_model`)"]
    if d is None:
        return [WRAPPING]
    out = []
    if prop == "P4":
        out += ["`compilation/monitor.py:98-110` (the capture guard, False after `capture_model`)",
                "`v1/worker/gpu_model_runner.py:5812-5822` (the drafter captures only during target PIECEWISE capture)"]
        if d.role == "drafter":
            out.append("`v1/spec_decode/llm_base_proposer.py:420-435` (a FULL target maps the drafter to PIECEWISE)")
    elif prop == "P3":
        out += [WRAPPING, "`compilation/breakable_cudagraph.py:329-333` (the breakable wrapper's mode gate)"]
    elif prop == "P2":
        out += ["`compilation/cuda_graph.py:246-256` and `compilation/breakable_cudagraph.py:329-333` (NONE passes through)"]
    elif prop == "P5":
        out += ["`compilation/cuda_graph.py:259-263` and `compilation/breakable_cudagraph.py:337-343` "
                "(entries keyed by batch descriptor, not by mode)"]
    elif prop == "P1" and len(d.acting) > 1:
        out += [WRAPPING, "`compilation/breakable_cudagraph.py:329-333` (`runtime_mode=None` matches every mode)"]
    elif prop == "P1":
        if scenario.ubatching:
            out += ["`v1/worker/gpu_model_runner.py:5133` (no breakable wrapper under micro-batching)",
                    "`v1/worker/gpu_ubatch_wrapper.py:376-377` (PIECEWISE goes to the raw runnable)"]
        if scenario.breakable:
            out += ["`config/vllm.py:867-869` (breakable sets compilation mode NONE: no compiled piecewise wrappers)",
                    WRAPPING]
        else:
            out += ["`compilation/backends.py:678-682` (inner PIECEWISE wrappers decided at the first forward)",
                    "`config/compilation.py:1395-1466` (resolve adds PIECEWISE after `load_model` and compilation)"]
    return out


# ---------------------------------------------------------------------------------------------


def _violating_dispatch(trace: Trace, records) -> tuple[int, Dispatch | None, str]:
    for v in trace.expected_violations:
        if v["property"] == trace.property:
            rec = records[v["step"]]
            d = rec.dispatches[v["dispatch"]] if v.get("dispatch") is not None else None
            return v["step"], d, v["message"]
    return len(records) - 1, None, ""


def counterexample_page(result: PolicyResult, prop: str, trace: Trace, shrunk: int | None, confirmed: str,
                        conformance: dict[str, dict] | None = None) -> str:
    policy = result.policy
    conformance = conformance or {}
    rep = replay(trace, policy)
    step_index, d, message = _violating_dispatch(trace, rep.records)
    stacks = next((r.stacks for r in rep.records if r.stacks), {})
    p = PROPERTIES[prop]
    facts = committed()[matrix.witness_release(trace, conformance)]
    lines = [
        f"# `{policy.name}` violates {prop} {p.name}",
        "",
        f"**{p.protects}.** Terms: [glossary](../../docs/glossary.md).",
        "",
        f"- Violation: {message}",
        f"- Status: {confirmed}",
        f"- Shortest counterexample (breadth-first explorer): {len(trace.events)} events; "
        + (f"Hypothesis `ci` shrank its own to {shrunk} events." if shrunk is not None else "Hypothesis `ci` found none."),
        f"- Policy: {policy.description}",
        "",
        "Replay it:",
        "```",
        f"cudagraph-contract replay reports/{policy.name}/{prop}.json",
        "```",
        "",
        "## Reproduce it with vLLM",
        "",
        *serve.markdown(trace, policy, facts),
        "",
        "## Affected releases",
        "",
        *matrix.markdown(trace, conformance),
    ]
    if trace.scenario.runner is Runner.MRV1 and prop in vllm_test.CHECKS:
        name = vllm_test.file_name(trace)
        lines += ["", "## A failing test for vLLM's `tests/v1/cudagraph/`", "",
                  f"[`{name}`]({name}) replays these events on the installed vLLM's own code (CUDA graphs "
                  f"simulated on CPU) and asserts {prop} per dispatch: {matrix.outcomes(trace, conformance)}."]
    lines += ["", "## The events", "", *step_list(rep.records, step_index)]
    lines += ["", "## Wrapper stacks and the dispatch path", ""]
    if d is not None:
        lines += [f"Dispatch at step {step_index}: {dispatch_summary(d)}", ""]
    lines += mermaid(stacks, d)
    release = getattr(policy, "release", None)  # an MRV2 release
    lines += ["", f"## vLLM {release or '0.33'}.0 {'MRV2 ' if release else ''}lines responsible", ""]
    where = mrv2_responsible_lines(release, prop, trace.scenario, d) if release else responsible_lines(prop, trace.scenario, d)
    lines += [f"- {x}" for x in where]
    lines.append("")
    return "\n".join(lines)


def readme(results: list[PolicyResult], coverage: tuple[int, int], confirmations: dict) -> str:
    lines = [
        "# Verdicts",
        "",
        "Generated by `cudagraph-contract report`; regenerate with:",
        "```",
        REGENERATE,
        "```",
        "",
        "Each cell: the Hypothesis (`ci` profile) and breadth-first explorer verdict; a failing cell links to "
        "its shortest counterexample. *reading* marks a counterexample not yet confirmed on real vLLM.",
        "",
        "| policy | " + " | ".join(f"{pid} {p.name}" for pid, p in PROPERTIES.items()) + " |",
        "|---|" + "---|" * len(PROPERTIES),
    ]
    for r in results:
        cells = []
        for pid, v in r.verdicts.items():
            ex = r.exploration
            if v.holds and ex.holds(pid):
                cells.append("holds")
            elif ex.holds(pid):
                cells.append(f"Hypothesis only ({v.length}) — explorer disagrees")
            else:
                n = len(ex.counterexamples[pid].events)
                status = confirmations.get((r.policy.name, pid), STATUS.get((r.policy.name, pid), "reading"))
                tag = "" if status.startswith("confirmed") else " *reading*"
                hyp = f"{v.length}" if not v.holds else "not found"
                k = len(ex.classes_of(pid))
                classes = f", [{k} class{'es' if k != 1 else ''}](#{r.policy.name.replace('_', '')}-classes)" if k else ""
                cells.append(f"[fails: {n} events (Hypothesis {hyp})]({r.policy.name}/{pid}.md){classes}{tag}")
        lines.append(f"| `{r.policy.name}` | " + " | ".join(cells) + " |")
    reached, total = coverage
    lines += _classes_section(results)
    lines += [
        "",
        "## Exploration bound and coverage",
        "",
        "| policy | scenario classes | reachable states | transitions | within bound | Hypothesis `ci` cells / explorer cells |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        ex = r.exploration
        both = len(r.cells & ex.cells)
        lines.append(f"| `{r.policy.name}` | {ex.scenarios} | {ex.states} | {ex.transitions} | "
                     f"{'fixpoint reached' if ex.complete else f'cut at depth {ex.depth}'} | {both} / {len(ex.cells)} |")
    lines += [
        "",
        f"Overall the `ci` profile reaches {reached} of {total} reachable cells ({100 * reached / max(total, 1):.1f}%). "
        "A cell is (scenario class, resolved mode, target/drafter, runtime mode, acting layer and action); "
        "`coverage.md` lists the cells generation did not reach.",
        "",
    ]
    return "\n".join(lines)


def _classes_section(results: list[PolicyResult]) -> list[str]:
    """Every violation class the explorer enumerated, per policy, linked to its page."""
    from contract.class_report import class_index

    lines = ["", "## Violation classes", "",
             "One class per cause: the property, role, runtime mode and what happened, under the smallest "
             "scenario settings that show it (deviations from vLLM's defaults), each with its own shortest "
             "counterexample. *halt* classes are steps where vLLM stops without violating a property.", ""]
    for r in results:
        lines.append(f'<a id="{r.policy.name.replace("_", "")}-classes"></a>')
        lines.append("")
        lines += class_index(r.policy.name, r.exploration.classes)
    return lines[:-1]


def coverage_page(results: list[PolicyResult]) -> str:
    lines = ["# Cells the `ci` profile did not reach", "",
             "Each is reachable (the explorer visits it). They need a combination of several settings that the "
             "sampled scenarios rarely draw together (micro-batching, n-gram drafters and a drafter with "
             "`enforce_eager` are drawn less often, see `contract/machine.py`), or a serving step after a rare "
             "start-up; the explorer checks every property on them.", ""]
    for r in results:
        missing = sorted(r.exploration.cells - r.cells)
        lines += [f"## `{r.policy.name}`: {len(missing)} cells", ""]
        lines += [f"- {c}" for c in missing] or ["- none"]
        lines.append("")
    return "\n".join(lines)


def load_confirmations(reports: Path) -> dict[tuple[str, str], str]:
    """(policy, property) -> "confirmed on vLLM X ..." from committed conformance results."""
    out: dict[tuple[str, str], str] = {}
    for path in sorted((reports / "conformance").glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        for item in data.get("confirmations", []):
            key = (item.get("policy"), item.get("property"))
            if all(key):
                out[key] = item.get("status", "")
    return out


def write(out: Path, results: list[PolicyResult], conformance_reports: Path | None = None,
          differentials: dict | None = None) -> list[Path]:
    """``conformance_reports`` (default ``out``) holds the committed ``conformance/*.json``;
    ``differentials`` maps a policy name to (Differential, chosen-base line, branch, base)."""
    from contract.class_report import witness_confirmations, write_class, write_differential

    confirmations = load_confirmations(conformance_reports or out)
    by_witness = witness_confirmations(conformance_reports or out)
    conformance = matrix.load_conformance((conformance_reports or out) / "conformance")
    written = []
    for r in results:
        for c in r.exploration.classes:
            written += write_class(out, f"{r.policy.name}/classes", r.policy, c, by_witness)
    for d, chosen, branch, base in (differentials or {}).values():
        written += write_differential(out, d, chosen, branch, base, by_witness)
    for r in results:
        for pid, v in r.verdicts.items():
            trace = r.exploration.counterexamples.get(pid)
            if trace is None:
                continue
            label = status.status(trace, conformance).text
            page = counterexample_page(r, pid, trace, v.length, label, conformance)
            base = out / r.policy.name / pid
            write_atomic(base.with_suffix(".json"), trace.dumps())
            write_atomic(base.with_suffix(".md"), page)
            written += [base.with_suffix(".json"), base.with_suffix(".md")]
            if trace.scenario.runner is Runner.MRV1 and pid in vllm_test.CHECKS:
                test = base.parent / vllm_test.file_name(trace)
                write_atomic(test, vllm_test.vllm_test(trace, matrix.outcomes(trace, conformance)))
                written.append(test)
    total = sum(len(r.exploration.cells) for r in results)
    reached = sum(len(r.cells & r.exploration.cells) for r in results)
    write_atomic(out / "README.md", readme(results, (reached, total), confirmations))
    write_atomic(out / "coverage.md", coverage_page(results))
    return written + [out / "README.md", out / "coverage.md"]

