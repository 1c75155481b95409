"""The traces the conformance replay runs: the regression traces, the counterexamples under
``reports/``, and a covering set generated from the model.

Each runner family generates its corpus (``contract/runners/*/real/conform.py``): its scenarios
under one fixed event script (``contract/core/graphs.py``'s ``script``, on which graph coverage is
counted): start-up (``load_model``, ``profile_run``, ``profile_cudagraph_memory`` where the runner runs it,
``resolve``, ``capture_model``), then ``execute_model`` for every token count of the domain,
uniform or not (uniform only where the count is a multiple of the query length), with and
without ``force_eager`` at 2 tokens, then ``propose`` for every token count when a drafter with a
model exists. A trace ends where the model halts.

``cells`` names what a trace exercises: per dispatch, the scenario's config-time class, the
resolved mode, the role, the runtime mode and the acting layer with its action. ``select``
keeps, in enumeration order, each trace that adds a cell, so a subset replays every cell the
full set has.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from contract.core.graphs import FORCE_EAGER_AT, script
from contract.core.policy import Policy
from contract.core.scenario import DrafterKind, Scenario
from contract.core.trace import SCHEMA, Trace, record_runnable

SPEC_QUERY_LENS = (2, 3)
__all__ = ["FORCE_EAGER_AT", "script"]


def file_traces(root: Path) -> list[Path]:
    """``tests/traces/*.json`` and every trace under ``reports/`` (conformance reports excluded)."""
    paths = sorted((root / "tests" / "traces").glob("*.json"))
    reports = root / "reports"
    for path in sorted(reports.rglob("*.json")) if reports.is_dir() else []:
        if "conformance" in path.relative_to(reports).parts:
            continue
        try:
            if json.loads(path.read_text(encoding="utf-8")).get("schema") == SCHEMA:
                paths.append(path)
        except (ValueError, UnicodeDecodeError, AttributeError):
            continue
    return paths


def runnable_trace(scenario: Scenario, policy: Policy, name: str = "", origin: dict | None = None) -> Trace:
    """The script's events the model's runner takes, up to where it halts, as a trace."""
    return record_runnable(scenario, policy, script(scenario), name=name, origin=origin)


def cells(trace: Trace) -> set[tuple]:
    s = trace.scenario
    scenario_class = (s.breakable, s.ubatching, s.ubatch_size, s.cudagraph_mode.name, s.compilation_mode.name,
                      s.splitting_ops.name, s.drafter.name, s.spec_enforce_eager, s.extensible_kv_cache)
    if s.drafter is DrafterKind.WITH_MODEL:
        # MRV2 builds a different speculator per method, each with its own managers and steps; MRV1
        # a different proposer class, which the runner's checks name apart.
        scenario_class += (s.speculator.name,)

    resolved = None
    out: set[tuple] = set()
    stages = s.pipeline_parallel_size > 1
    for step in trace.expected_steps:
        resolved = step.get("cudagraph_mode", resolved)
        if stages:  # stage 0's forwards are one rank's, which the one-stage traces cover
            if step.get("stages"):  # whether each stage ran a graph, ran eagerly or stopped, in stage order
                out.add(("stages", tuple("raised" if "raised" in r else "eager" if r["runtime_mode"] == "NONE"
                                         else "graph" for r in step["stages"])))
            continue
        lora_batch = step["event"].get("num_active_loras", 0) > 0
        for d in step.get("dispatches", []):
            acting = tuple((layer["layer"], layer["action"]) for layer in d["layers"] if layer["action"] != "passed")
            out.add((scenario_class, resolved, d["role"], d["runtime_mode"], acting, d["ran_eager"]))
            if lora_batch:  # a batch with LoRA adapters, whatever else the scenario sets
                out.add(("lora", s.specialize_active_lora, resolved, d["role"], d["runtime_mode"], acting,
                         d["ran_eager"]))
        if step.get("halted"):
            out.add((scenario_class, resolved, "halted", step["halted"]))
        if step.get("ranks"):  # what the data-parallel ranks ran, in rank order, whatever the settings
            # (an idle rank's dummy batch: its uniform token count, which the agreement compares)
            out.add(("ranks", resolved, tuple((r["runtime_mode"], r["batch"][2] if "idle" in r else None,
                                               "need_eager" in r) for r in step["ranks"])))
    # at least one trace per property the model says a trace violates, and per adaptive-verification
    # attention setting (their observations are other scenarios', their verdicts and checks are not)
    out |= {("violates", v["property"]) for v in trace.expected_violations}
    out |= {("setting", name) for name in ("varlen_decode_bound", "attention_support_draft_only") if getattr(s, name)}
    if s.max_loras:  # LoRA beside a drafter, which runs no adapter
        out.add(("setting", "max_loras", s.drafter.name))
    if s.mamba_cache_blocks is not None:  # a hybrid model: resolve's Mamba check reads the mode it resolved
        out.add(("setting", "mamba_cache_blocks", s.mamba_cache_blocks, s.cudagraph_mode.name, s.drafter.name))
    return out


def select(traces: Iterator[Trace]) -> list[Trace]:
    seen: set[tuple] = set()
    kept = []
    for trace in traces:
        new = cells(trace) - seen
        if new:
            seen |= new
            kept.append(trace)
    return kept

