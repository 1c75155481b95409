"""One conformance run's results: per trace, the model's steps against vLLM's, and the findings
(counterexamples against the release, confirmed or refuted by vLLM's own observation)."""

from __future__ import annotations

from dataclasses import dataclass, field

from contract.core.forward_context import BatchDescriptor
from contract.real.compare import NOT_REPLAYED_MRV2, TraceResult
from contract.real.decisions import share


class ReplayProblem(Exception):
    """A trace the real code cannot be run on, or vLLM's code that cannot start; one line."""


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
# (coordinate_batch_across_dp returns at once on one rank, 33:v1/worker/dp_utils.py:222-224), and
# vLLM's DBO needs several ranks: a one-rank trace runs UBatchWrapper's non-micro-batched path alone.
PARTLY_UBATCHING = ("partly replayed: the micro-batched UBatchWrapper path (DP > 1, should_ubatch) "
                    "did not run on one rank; its non-micro-batched path did")


@dataclass
class ConformanceRun:
    version: str
    policy: str
    block: dict
    corpus: str
    results: list[TraceResult] = field(default_factory=list)  # file traces, each kept
    generated: dict = field(default_factory=lambda: {"traces": 0, "steps": 0, "agreeing": 0, "violations": {}})
    # [traces, sides, agreeing sides] of the traces on several DP ranks and on several PP stages
    ranks: list[int] = field(default_factory=lambda: [0, 0, 0])
    stages: list[int] = field(default_factory=lambda: [0, 0, 0])
    generated_diffs: list[TraceResult] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    decisions: list[dict] = field(default_factory=list)  # decisions.Log.to_json()
    mirrored: list[dict] = field(default_factory=list)  # point, digest, whether this release's is known
    where: dict = field(default_factory=dict)  # point -> owner, function, path, lines (``decisions.WHERE``)
    sizes: dict | None = None  # the capture-size check (``contract/real/sizes.py``), where the family has one

    @property
    def steps(self) -> int:
        return sum(r.steps for r in self.results) + self.generated["steps"]

    @property
    def agreeing(self) -> int:
        return sum(r.agreeing for r in self.results) + self.generated["agreeing"]

    def count_ranks(self, result: TraceResult) -> None:
        for mine, theirs in ((self.ranks, result.ranks), (self.stages, result.stages)):
            if theirs[0]:
                mine[:] = [mine[0] + 1, mine[1] + theirs[0], mine[2] + theirs[1]]

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
            "capture_sizes": self.sizes,
            **({"data_parallel": dict(zip(("traces", "rank_steps", "agreeing_rank_steps"), self.ranks))}
               if self.ranks[0] else {}),
            **({"pipeline_parallel": dict(zip(("traces", "stage_steps", "agreeing_stage_steps"), self.stages))}
               if self.stages[0] else {}),
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
        identically on vLLM, else ``refuted on vLLM X ...`` (read by ``contract/reports/report.py``)."""
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
