"""GitHub rendering: steps as nested lists, Mermaid readable in dark mode with the failing path."""

from __future__ import annotations

import re
from pathlib import Path

from contract.families import for_trace
from contract.reports.markdown import CLASS_DEFS, mermaid, step_list
from contract.reports.report import _violating_dispatch
from contract.core.trace import load, replay

ROOT = Path(__file__).resolve().parents[1]


def witness(policy: str, prop: str):
    trace = load(ROOT / "reports" / policy / f"{prop}.json")
    rep = replay(trace, for_trace(trace.policy, "t"))
    step, d, _ = _violating_dispatch(trace, rep.records)
    return rep.records, step, d, next(r.stacks for r in rep.records if r.stacks)


def test_steps_are_lists_not_table_rows():
    records, step, _, _ = witness("vllm_0_30", "P1")
    lines = step_list(records, step)
    text = "\n".join(lines)
    assert "<br>" not in text and not any(line.startswith("|") for line in lines)
    assert [line.split(".")[0] for line in lines if not line.startswith(" ")] == [str(r.index) for r in records]
    assert f"{step}. **`profile_cudagraph_memory` ← the violation**" in lines
    assert "   - target PIECEWISE BD(4): no capturer (eager)" in lines


def test_every_node_has_a_class_with_its_own_text_colour():
    for policy, prop in (("vllm_0_30", "P1"), ("vllm_0_29", "P3"), ("vllm_0_29", "P4")):
        _, _, d, stacks = witness(policy, prop)
        lines = mermaid(stacks, d)
        nodes = [line for line in lines if re.match(r"\s+\w+[\[(]", line)]
        assert nodes and all(re.search(r":::(layer|onpath|fail)$", n) for n in nodes)
        assert all("color:#" in c for c in CLASS_DEFS)
        assert "style " not in "\n".join(lines)  # no per-node light fills


def test_the_failing_path_is_drawn():
    _, _, d, stacks = witness("vllm_0_30", "P1")  # PIECEWISE reaches no capturer
    lines = mermaid(stacks, d)
    assert '  targetM(("no capturer:<br/>PIECEWISE runs eagerly")):::fail' in lines
    thick = [line for line in lines if "==>" in line]
    assert thick == ["  targetD ==> target0", "  target0 ==> target1", "  target1 ==> targetM"]
    assert lines[-2] == "  linkStyle 0,1,2 stroke:#f59e0b,stroke-width:3px"
    _, _, d, stacks = witness("vllm_0_29", "P3")  # the wrong capturer is the red node
    assert '  target0["BreakableCUDAGraphWrapper(None)<br/>captured"]:::fail' in mermaid(stacks, d)
