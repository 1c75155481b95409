"""Conformance reports: ``reports/conformance/vllm-<version>.md`` and ``.json`` for one run, and
``reports/findings.md`` from every version's JSON present.

A disagreement is shown with both columns: the model's step and vLLM's, as ``StepRecord.to_json``.
A finding is a counterexample the model reports under the policy of a released vLLM; it is
*confirmed* when vLLM's observation of the violating step equals the model's, else *refuted*.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from contract.conformance.compare import NOT_REPLAYED_MRV2, TraceResult
from contract.conformance.decisions import HARNESS, VLLM, share
from contract.dispatcher import BatchDescriptor
from contract.output import write_atomic

# The three (reading) rows of the capturer table (docs/capturer-table.md) the model turned into
# counterexamples.
LEADS = {
    "lead1": "capturer table, target row U on, B on: a PIECEWISE dispatch reaches no capturer (eager)",
    "lead2": "capturer table, target row compiled under L=FULL, R-mode F&P: PIECEWISE has no capturer (eager)",
    "lead3": "capturer table, drafter row R-mode FULL, B on: the first runtime drafter PIECEWISE dispatch raises",
}


@dataclass
class Finding:
    name: str
    source: str
    policy: str
    violations: list[dict]
    outcome: str  # "confirmed" or "refuted"
    evidence: list[str]
    partly: str = ""  # what of the scenario the replay could not run, when something

    def to_json(self) -> dict:
        out = {"name": self.name, "source": self.source, "policy": self.policy, "violations": self.violations,
               "outcome": self.outcome, "evidence": self.evidence}
        if self.partly:
            out["partly_replayed"] = self.partly
        return out


# Micro-batching needs should_ubatch, which only DP coordination across ranks sets
# (coordinate_batch_across_dp, gpu_model_runner.py:4022-4033); the replay runs one rank.
PARTLY_UBATCHING = ("partly replayed: the micro-batched UBatchWrapper path (DP > 1, should_ubatch) "
                    "did not run; its non-micro-batched path did")


@dataclass
class ConformanceRun:
    version: str
    policy: str
    block: dict
    corpus: str
    results: list[TraceResult] = field(default_factory=list)  # file traces, each kept
    generated: dict = field(default_factory=lambda: {"traces": 0, "steps": 0, "agreeing": 0, "violations": {}})
    generated_diffs: list[TraceResult] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    decisions: list[dict] = field(default_factory=list)  # decisions.Log.to_json()
    mirrored: list[dict] = field(default_factory=list)  # point, digest, whether this release's is known
    where: dict = field(default_factory=dict)  # point -> owner, function, path, lines (``decisions.WHERE``)

    @property
    def steps(self) -> int:
        return sum(r.steps for r in self.results) + self.generated["steps"]

    @property
    def agreeing(self) -> int:
        return sum(r.agreeing for r in self.results) + self.generated["agreeing"]

    @property
    def disagreeing(self) -> list[TraceResult]:
        return [r for r in self.results if r.diffs] + self.generated_diffs

    def summary(self) -> dict:
        steps = self.steps
        return {
            "vllm": self.version,
            "policy": self.policy,
            "load_model_block": self.block,
            "corpus": self.corpus,
            "trace_files": len(self.results),
            "not_replayed_mrv2": sum(r.status == NOT_REPLAYED_MRV2 for r in self.results),
            "not_replayed_other": sum(r.status not in ("replayed", NOT_REPLAYED_MRV2) for r in self.results),
            "generated_traces": self.generated["traces"],
            "steps": steps,
            "agreeing_steps": self.agreeing,
            "agreement": (self.agreeing / steps) if steps else None,
            "disagreeing_traces": len(self.disagreeing),
        }

    def to_json(self) -> dict:
        return {
            **self.summary(),
            "generated": self.generated,
            "traces": [r.to_json() for r in self.results],
            "disagreements": [r.to_json() for r in self.disagreeing],
            "findings": [f.to_json() for f in self.findings],
            "confirmations": self.confirmations(),
            "decision_points": {"share_vllm": share(self.decisions), "mirrored": self.mirrored,
                                "steps": self.decisions, "where": self.where},
        }

    def confirmations(self) -> list[dict]:
        """Per (policy, property): ``confirmed on vLLM X ...`` when every trace showing it replays
        identically on vLLM, else ``refuted on vLLM X ...`` (read by ``contract/report.py``)."""
        grouped: dict[tuple[str, str], list[Finding]] = {}
        for f in self.findings:
            for prop in sorted({v["property"] for v in f.violations}):
                grouped.setdefault((f.policy, prop), []).append(f)
        out = []
        for (policy, prop), found in sorted(grouped.items()):
            refuted = [f.name for f in found if f.outcome != "confirmed"]
            outcome = "refuted" if refuted else "confirmed"
            names = ", ".join(refuted or [f.name for f in found])
            # Partly replayed only when no fully replayed trace shows the property too.
            partly = "" if refuted or any(not f.partly for f in found) else f"; {found[0].partly}"
            out.append({"policy": policy, "property": prop,
                        "status": f"{outcome} on vLLM {self.version} by the real-code replay ({names}){partly}"})
        return out


def evidence(result: TraceResult, violation: dict) -> str:
    """vLLM's side of a violating step, in words."""
    step = result.real_steps[violation["step"]] if violation["step"] < len(result.real_steps) else None
    if step is None:
        return f"step {violation['step']}: vLLM stopped before it"
    if "dispatch" not in violation:
        return f"step {violation['step']}: vLLM's get_model() gives {step.get('unwrap')}"
    dispatches = step.get("dispatches", [])
    if violation["dispatch"] >= len(dispatches):
        return f"step {violation['step']}: vLLM made no dispatch #{violation['dispatch']}"
    d = dispatches[violation["dispatch"]]
    where = f"{d['role']} {d['context']} {d['runtime_mode']} {BatchDescriptor.from_json(d['batch_descriptor'])}"
    acting = [f"{a['layer']} {a['action']}" + (f" ({a['error']})" if a.get("error") else "")
              for a in d["layers"] if a["action"] != "passed"]
    if acting:
        what = "; ".join(acting)
    elif d["ran_eager"]:
        what = "no wrapper captured or replayed; the model ran eagerly"
    else:
        what = "no wrapper acted"
    return f"step {violation['step']}: {where}: {what}" + (f"; vLLM raised {d['error']}" if d.get("error") else "")


def finding(result: TraceResult, policy: str, violations: list[dict], ubatching: bool = False) -> Finding:
    steps = {v["step"] for v in violations}
    same = all(s < len(result.real_steps) and s < len(result.model_steps)
               and result.real_steps[s] == result.model_steps[s] for s in steps)
    return Finding(result.name, result.source, policy, violations, "confirmed" if same else "refuted",
                   [evidence(result, v) for v in violations], PARTLY_UBATCHING if ubatching else "")


def _leaves(obj, path: str = "") -> dict[str, object]:
    if isinstance(obj, dict):
        out: dict[str, object] = {}
        for key, value in obj.items():
            out.update(_leaves(value, f"{path}.{key}" if path else str(key)))
        return out
    if isinstance(obj, list):
        out = {}
        for i, value in enumerate(obj):
            out.update(_leaves(value, f"{path}[{i}]"))
        return out or {path: []}
    return {path: obj}


def _cell(value) -> str:
    return "—" if value is _MISSING else f"`{json.dumps(value)}`"


_MISSING = object()


def diff_rows(model: dict | None, real: dict | None) -> list[str]:
    """One table row per field where the two steps differ (``—``: the field is absent there)."""
    if model is None or real is None:
        return [f"| (the whole step) | {'not reached' if model is None else 'reached'} "
                f"| {'not reached' if real is None else 'reached'} |"]
    left, right = _leaves(model), _leaves(real)
    keys = list(left) + [k for k in right if k not in left]
    return [f"| `{k}` | {_cell(left.get(k, _MISSING))} | {_cell(right.get(k, _MISSING))} |"
            for k in keys if left.get(k, _MISSING) != right.get(k, _MISSING)]


def markdown(run: ConformanceRun) -> str:
    s = run.summary()
    lines = [
        f"# Conformance: the model against vLLM {run.version}",
        "",
        "Generated by `cudagraph-contract conform`. vLLM's own config normalisation, mode resolution, "
        "`load_model` wrapping block, runner orchestration (`profile_run`, `_dummy_run`, "
        "`profile_cudagraph_memory`, `capture_model`), dispatchers, wrapper classes and capture guard ran "
        "on CPU with a simulated CUDA graph layer; the model ran under the policy of this release. "
        "Decision points: `README.md` beside this file.",
        "",
        f"- vLLM {run.version}, compared with policy `{run.policy}`",
        f"- `load_model` wrapping block: {run.block['where']} — "
        + (f"known revision {run.block['revision']} (policy `{run.block['policy']}`)" if run.block["revision"]
           else f"**unknown revision** (ast sha256 {run.block['digest']}); compared by version only"),
        f"- traces: {s['trace_files']} files ({s['not_replayed_mrv2']} MRV2 and {s['not_replayed_other']} "
        f"others not replayed) and "
        f"{s['generated_traces']} generated ({run.corpus} covering set)",
        f"- steps: **{s['agreeing_steps']} of {s['steps']} agree"
        + (f" ({100 * s['agreement']:.2f}%)**" if s["steps"] else "**"),
        f"- decision points made by vLLM's code: {_pct(share(run.decisions))} of the step × point pairs "
        f"(harness-mirrored points match this release's source: "
        f"{', '.join(_mirrored_label(m) + (': yes' if m['known'] else ': **no**') for m in run.mirrored) or 'none'})",
        "",
        "| trace | recorded under | steps | agree |",
        "|---|---|---|---|",
    ]
    for r in run.results:
        if r.status != "replayed":
            lines.append(f"| {r.name} | {r.trace_policy} | — | {r.status}" + (f": {r.note}" if r.note else "") + " |")
        else:
            lines.append(f"| {r.name} | {r.trace_policy} | {r.steps} | {r.agreeing}"
                         + (f" — {r.note}" if r.note else "") + " |")
    g = run.generated
    if g["traces"]:
        lines.append(f"| generated covering set ({g['traces']} traces) | {run.policy} "
                     f"| {g['steps']} | {g['agreeing']} |")
    if g.get("violations"):
        counts = ", ".join(f"{k}: {v}" for k, v in sorted(g["violations"].items()))
        lines += ["", f"Generated traces showing a violation under `{run.policy}`, by property: {counts}."]
    lines.append("")
    if not run.disagreeing:
        lines.append("No disagreement: every replayed step of vLLM equals the model's prediction.")
    lines.append("")
    for r in run.disagreeing:
        lines += [f"## Disagreement: {r.name}", "", f"Source: `{r.source}`", ""]
        for d in r.diffs:
            lines += [f"### step {d.index}: {d.event}", "", "| field | model | vLLM |", "|---|---|---|",
                      *diff_rows(d.model, d.real), ""]
    if run.findings:
        lines += ["## Findings checked against this release", ""]
        for f in run.findings:
            lines.append(f"- **{f.name}** ({', '.join(sorted({v['property'] for v in f.violations}))}): {f.outcome}"
                         + (f" ({f.partly})" if f.partly else ""))
    return "\n".join(lines) + "\n"


def write(run: ConformanceRun, reports: Path) -> Path:
    folder = reports / "conformance"
    name = f"vllm-{run.version}" + ("-mrv2" if run.block.get("runner") == "MRV2" else "")
    md = folder / f"{name}.md"
    write_atomic(md, markdown(run))
    write_atomic(folder / f"{name}.json", json.dumps(run.to_json(), indent=1) + "\n")
    write_atomic(reports / "findings.md", findings_markdown(folder))
    write_atomic(folder / "README.md", decisions_markdown(folder))
    return md


def _mirrored_label(m: dict) -> str:
    """A mirrored point, with the vLLM function it mirrors where one point mirrors several (MRV2)."""
    return f"{m['point']} ({m['where']})" if "where" in m else m["point"]


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _runs(folder: Path) -> list[dict]:
    runs = []
    for path in sorted(folder.glob("vllm-*.json")):
        try:
            runs.append(json.loads(path.read_text(encoding="utf-8")))
        except ValueError:
            continue
    return runs


def _release(run: dict) -> str:
    """A run's release, with its runner where the release has both (0.33.0 replays either)."""
    mrv2 = (run.get("load_model_block") or {}).get("runner") == "MRV2"
    return f"{run['vllm']} (MRV2)" if mrv2 else run["vllm"]


def decisions_markdown(folder: Path) -> str:
    """Per release: which decision points the replayed steps reached, and whose code made them."""
    runs = [r for r in _runs(folder) if (r.get("decision_points") or {}).get("steps")]
    lines = [
        "# Conformance runs: whose code made each decision",
        "",
        "Each replayed step reaches decision points: functions whose outcome shapes the observation. "
        f"**{VLLM}**: the installed release's own code ran (its code object lives in the `vllm` package). "
        f"**{HARNESS}**: the harness's code mirrors vLLM's lines; each such point is guarded by "
        "`tests/test_decisions.py`, which compares the mirrored statements' `ast` with every supported "
        "release's source. A cell counts the steps in which the point was made; the share counts "
        "step × point pairs. Model Runner V2 rows (MRV2): the blocks of `v1/worker/gpu/model_runner.py` "
        "cut with `ast` and run unchanged count as vLLM's (their code is the installed file's); the "
        "harness's point is the scheduler's side of a step (`contract/conformance/mrv2/decision_points.py`).",
        "",
    ]
    if not runs:
        return "\n".join(lines + ["No conformance run with decision points yet."]) + "\n"
    lines += ["| release | steps | share made by vLLM's code | harness-mirrored points |", "|---|---|---|---|"]
    for r in runs:
        dp = r["decision_points"]
        changed = {m["point"] for m in dp["mirrored"] if not m["known"]}
        points = list(dict.fromkeys(m["point"] for m in dp["mirrored"]))  # one per point, in order
        mirrored = ", ".join(p + (" (**source changed**)" if p in changed else "") for p in points)
        lines.append(f"| {_release(r)} | {r['steps']} | **{_pct(dp['share_vllm'])}** | {mirrored} |")
    for r in runs:
        entries = r["decision_points"]["steps"]
        events = sorted({e["event"] for e in entries})
        lines += ["", f"## vLLM {_release(r)}", "", "| decision point | owner | " + " | ".join(events) + " |",
                  "|---|---|" + "---|" * len(events)]
        table: dict[tuple[str, str], dict[str, int]] = {}
        for e in entries:
            table.setdefault((e["point"], e["owner"]), {})[e["event"]] = e["steps"]
        for (point, who), cells in sorted(table.items(), key=lambda kv: (kv[0][1] != HARNESS, kv[0][0])):
            lines.append(f"| `{point}` | {who} | " + " | ".join(str(cells.get(ev, "")) for ev in events) + " |")
    return "\n".join(lines) + "\n"


def _code_at_violation(data: dict, finding: dict) -> list[str]:
    """The vLLM functions the replay ran at the finding's first violating step, linked at the release."""
    from contract.evidence import decision_lines

    entry = next((t for t in data.get("traces", []) if t.get("name") == finding["name"]), None)
    path = (entry or {}).get("decision_path") or []
    step = finding["violations"][0]["step"]
    where = (data.get("decision_points") or {}).get("where") or {}
    ran = decision_lines.at_step(data["vllm"], path, where, step) if path else []
    return [f"vLLM's code at step {step}:", "", *[f"- {r}" for r in ran], ""] if ran else []


def findings_markdown(folder: Path) -> str:
    runs = _runs(folder)
    lines = [
        "# Findings: the model's counterexamples against released vLLM, checked on vLLM's own code",
        "",
        "Each counterexample the model reports under the policy of a released vLLM (the regression "
        "traces and any trace under `reports/`) was replayed on that release's real code "
        "(`cudagraph-contract conform`). **Confirmed**: vLLM's observation of the violating step "
        "equals the model's, so vLLM itself shows the violation (the real exception or the real eager "
        "fallback is quoted). **Refuted**: it differs, and the model is wrong about vLLM. The replay runs "
        "on CPU with CUDA graphs simulated; see the [glossary](../docs/glossary.md) for what ran.",
        "",
    ]
    lead_outcomes: dict[str, list[str]] = {}
    for data in runs:
        lines += [f"## vLLM {data['vllm']} (policy `{data['policy']}`)", ""]
        s = data.get("steps") or 0
        lines += [f"Conformance: {data['agreeing_steps']} of {s} steps agree "
                  f"over {data['trace_files']} trace files and {data['generated_traces']} generated traces.", ""]
        if not data.get("findings"):
            lines += ["No counterexample under this release's policy in the replayed traces.", ""]
        for f in data.get("findings", []):
            props = ", ".join(sorted({v["property"] for v in f["violations"]}))
            lines += [f"### {f['name']} — {props} — **{f['outcome']}**", "", f"Trace: `{f['source']}`", ""]
            if f.get("partly_replayed"):
                lines += [f"Replay: {f['partly_replayed']}.", ""]
            for key, text in LEADS.items():
                if f["name"].startswith(key):
                    lines += [f"Lead: {text}.", ""]
                    lead_outcomes.setdefault(key, []).append(
                        f"{f['outcome']} on {data['vllm']}" + (" (partly replayed)" if f.get("partly_replayed") else ""))
            for v, e in zip(f["violations"], f["evidence"]):
                lines += [f"- model: step {v['step']}: {v['message']}", f"  - vLLM {data['vllm']}: {e}"]
            lines.append("")
            lines += _code_at_violation(data, f)
        counts = (data.get("generated") or {}).get("violations") or {}
        if counts:
            lines += ["Generated covering set, traces with a violation under this policy (all replayed "
                      "step for step by the same run): "
                      + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) + ".", ""]
    lines += ["## The three leads of the [capturer table](../docs/capturer-table.md)", ""]
    for key, text in LEADS.items():
        outcome = "; ".join(lead_outcomes.get(key, [])) or "not replayed yet"
        lines.append(f"- {key}: {text} — {outcome}")
    return "\n".join(lines) + "\n"
