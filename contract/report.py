"""Markdown reports under ``reports/``: the verdict table and one page per counterexample, written
atomically and byte-stable (no times, no absolute paths, sorted everything)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from contract.coverage import Cell
from contract.events import ProfileCudagraphMemory, describe_event
from contract.expected import STATUS
from contract.mrv2.report import METHOD
from contract.mrv2.report import responsible_lines as mrv2_responsible_lines
from contract.explore import Exploration
from contract.modes import NONE
from contract.observation import Action, Dispatch
from contract.policy import Policy
from contract.properties import PROPERTIES
from contract.render import dispatch_summary, step_outcome
from contract.scenario import DrafterKind, Runner, Scenario, SplittingOps
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
# The scenario as a vLLM user sets it


def user_settings(s: Scenario, events: list) -> list[str]:
    env = [f"VLLM_USE_V2_MODEL_RUNNER={'1' if s.runner is Runner.MRV2 else '0'}"]
    if s.breakable:
        env.append("VLLM_USE_BREAKABLE_CUDAGRAPH=1")
    compilation = {
        "mode": s.compilation_mode.name,
        "cudagraph_mode": s.cudagraph_mode.name,
        "cudagraph_capture_sizes": [2, 4],
        "max_cudagraph_capture_size": 4,
    }
    if s.splitting_ops is SplittingOps.EMPTY:
        compilation["splitting_ops"] = []
    elif s.splitting_ops is SplittingOps.ATTENTION:
        compilation["splitting_ops"] = "<every attention op, e.g. vllm::unified_attention_with_output>"
    skips_memory_profile = s.runner is Runner.MRV1 and not any(isinstance(e, ProfileCudagraphMemory) for e in events)
    lines = [
        "```",
        " ".join(env) + " \\",
        "vllm serve <model> --max-num-seqs 4" + (" --kv-cache-memory-bytes <bytes>" if skips_memory_profile else "") + " \\",
        f"  --compilation-config '{json.dumps(compilation)}'" + (" \\" if s.drafter is not DrafterKind.NONE or s.ubatching else ""),
    ]
    if s.drafter is not DrafterKind.NONE:
        spec = {"method": METHOD[s.speculator] if s.drafter is DrafterKind.WITH_MODEL else "ngram",
                "num_speculative_tokens": s.uniform_decode_query_len - 1}
        if s.spec_enforce_eager:
            spec["enforce_eager"] = True
        if s.adaptive_verification:
            spec["enable_adaptive_verification"] = True
        lines.append(f"  --speculative-config '{json.dumps(spec)}'" + (" \\" if s.ubatching else ""))
    if s.ubatching:
        lines.append("  --enable-dbo")
    lines.append("```")
    lines.append(f"Attention backends: the minimum `AttentionCGSupport` over the model's backends is "
                 f"`{s.attention_support.name}`.")
    for name, compiled in (("model", s.model_compiled), ("draft model", s.draft_compiled)):
        if not compiled:
            lines.append(f"The {name}'s class has no active `@support_torch_compile` submodule.")
    return lines


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
# Mermaid: the stacks with the dispatch path


def mermaid(stacks: dict[str, str], d: Dispatch | None) -> list[str]:
    lines = ["```mermaid", "flowchart LR"]
    for role, text in stacks.items():
        names = text.split(" -> ")
        ids = [f"{role}{i}" for i in range(len(names))]
        acted = {}
        if d is not None and d.role == role:
            for a in d.layers:
                acted[a.layer.split(":", 1)[1]] = a.action
        for node_id, name in zip(ids, names):
            label = name
            action = acted.get(name)
            if action is not None:
                label += f"<br/>{action.value}"
            lines.append(f'  {node_id}["{label}"]')
        for a, b in zip(ids, ids[1:]):
            lines.append(f"  {a} --> {b}")
        if d is not None and d.role == role:
            if not d.acting and d.runtime_mode != NONE:
                lines.append(f'  {role}miss(("no capturer:<br/>{d.runtime_mode.name} runs eager"))')
                lines.append(f"  {ids[-1]} -.- {role}miss")
                lines.append(f"  style {role}miss fill:#fdd,stroke:#c00")
            for node_id, name in zip(ids, names):
                if acted.get(name) in (Action.CAPTURED, Action.REPLAYED, Action.RAISED):
                    lines.append(f"  style {node_id} fill:#fdd,stroke:#c00")  # implicated in the violation
            extra = [a for a in d.acting if a.layer.endswith(":compiled")]
            for a in extra:
                lines.append(f'  {role}c["compiled PIECEWISE wrappers<br/>{a.action.value}"]')
                lines.append(f"  {ids[-1]} --> {role}c")
    lines.append("```")
    return lines


# ---------------------------------------------------------------------------------------------


def _violating_dispatch(trace: Trace, records) -> tuple[int, Dispatch | None, str]:
    for v in trace.expected_violations:
        if v["property"] == trace.property:
            rec = records[v["step"]]
            d = rec.dispatches[v["dispatch"]] if v.get("dispatch") is not None else None
            return v["step"], d, v["message"]
    return len(records) - 1, None, ""


def counterexample_page(result: PolicyResult, prop: str, trace: Trace, shrunk: int | None, confirmed: str) -> str:
    policy = result.policy
    rep = replay(trace, policy)
    step_index, d, message = _violating_dispatch(trace, rep.records)
    stacks = next((r.stacks for r in rep.records if r.stacks), {})
    p = PROPERTIES[prop]
    lines = [
        f"# `{policy.name}` violates {prop} {p.name}",
        "",
        f"**{p.protects}.**",
        "",
        f"- Violation: {message}",
        f"- Real-code replay: {confirmed}",
        f"- Shortest counterexample (breadth-first explorer): {len(trace.events)} events; "
        + (f"Hypothesis `ci` shrank its own to {shrunk} events." if shrunk is not None else "Hypothesis `ci` found none."),
        f"- Policy: {policy.description}",
        "",
        "Replay it:",
        "```",
        f"cudagraph-contract replay reports/{policy.name}/{prop}.json",
        "```",
        "",
        "## Scenario, as a vLLM user sets it",
        "",
        *user_settings(trace.scenario, trace.events),
        "",
        "## The events",
        "",
        "| # | event | what happened | model state changed |",
        "|---|---|---|---|",
    ]
    for r in rep.records:
        mark = " **←**" if r.index == step_index else ""
        what = "<br>".join(step_outcome(r)) or "-"
        changes = "<br>".join(r.changes) or "-"
        lines.append(f"| {r.index} | `{describe_event(r.event)}`{mark} | {what} | {changes} |")
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
                cells.append(f"[fails: {n} events (Hypothesis {hyp})]({r.policy.name}/{pid}.md){tag}")
        lines.append(f"| `{r.policy.name}` | " + " | ".join(cells) + " |")
    reached, total = coverage
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


def write(out: Path, results: list[PolicyResult], conformance_reports: Path | None = None) -> list[Path]:
    """``conformance_reports`` (default ``out``) holds the committed ``conformance/*.json``."""
    confirmations = load_confirmations(conformance_reports or out)
    written = []
    for r in results:
        for pid, v in r.verdicts.items():
            trace = r.exploration.counterexamples.get(pid)
            if trace is None:
                continue
            status = confirmations.get((r.policy.name, pid), STATUS.get((r.policy.name, pid), "reading: not replayed on real vLLM"))
            page = counterexample_page(r, pid, trace, v.length, status)
            base = out / r.policy.name / pid
            write_atomic(base.with_suffix(".json"), trace.dumps())
            write_atomic(base.with_suffix(".md"), page)
            written += [base.with_suffix(".json"), base.with_suffix(".md")]
    total = sum(len(r.exploration.cells) for r in results)
    reached = sum(len(r.cells & r.exploration.cells) for r in results)
    write_atomic(out / "README.md", readme(results, (reached, total), confirmations))
    write_atomic(out / "coverage.md", coverage_page(results))
    return written + [out / "README.md", out / "coverage.md"]

