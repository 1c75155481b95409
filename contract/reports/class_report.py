"""One Markdown page per violation class, beside its JSON trace, and the differential page.

A page is a list of sections, one function each, so further sections (a runnable reproduction, a
vLLM-style test) are one more function in ``SECTIONS``. Pages are byte-stable: no times, no
absolute paths.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from contract.core.classes import ViolationClass, signatures
from contract.core.differential import LOST
from contract.evidence import decision_lines, matrix, serve, status
from contract.evidence.release_facts import committed
from contract.reports.markdown import mermaid, step_list
from contract.core.policy import Policy
from contract.core.properties import PROPERTIES, check
from contract.core.render import dispatch_summary
from contract.core.output import write_atomic
from contract.core.trace import replay


@dataclass
class ClassPage:
    """What every section reads: the class, the policy its witness runs under, the replay."""

    policy: Policy
    cls: ViolationClass
    trace_path: str  # the trace file, relative to the report folder
    status: str  # real-code replay status
    records: list
    step: int
    dispatch: object | None
    conformance: dict  # (release, runner) -> conformance JSON (``matrix.load_conformance``)


def page_context(policy: Policy, c: ViolationClass, trace_path: str, status: str,
                 conformance: dict | None = None) -> ClassPage:
    rep = replay(c.witness, policy)
    dispatch = None
    record = rep.records[c.step] if c.step < len(rep.records) else None
    if record is not None:
        for sig, v in signatures(record, check(record, c.witness.scenario, policy.runner)):
            if sig == c.signature and v is not None and v.dispatch is not None:
                dispatch = record.dispatches[v.dispatch]
                break
    return ClassPage(policy, c, trace_path, status, rep.records, c.step, dispatch, conformance or {})


def header(p: ClassPage) -> list[str]:
    c = p.cls
    prop = PROPERTIES.get(c.signature.property)
    lines = [f"# `{p.policy.name}`: {c.title}", ""]
    if prop is not None:
        lines += [f"**{c.signature.property} {prop.name}: {prop.protects}.**", ""]
    elif c.signature.property == LOST:
        lines += ["**Lost graphs: on the fixed serving script the branch serves fewer dispatches of this kind with a "
                  "CUDA graph than its base does.**", ""]
    else:
        lines += ["**vLLM stops on a step that violates no property.**", ""]
    lines += [
        f"- Severity: {c.severity_text}",
        f"- What happened: {c.signature.what}" + (f" ({c.signature.detail})" if c.signature.detail else ""),
        f"- Role and runtime mode: {c.signature.role}, {c.signature.runtime_mode}",
        f"- Smallest settings it occurs under: {c.where}",
        f"- Violation: {c.message}",
        f"- Shortest witness (breadth-first explorer): {c.length} events",
        f"- Real-code replay: {p.status}",
        f"- Policy: {p.policy.description}",
        "",
    ]
    return lines


def reproduce(p: ClassPage) -> list[str]:
    return ["Replay it:", "```", f"cudagraph-contract replay reports/{p.trace_path}", "```", ""]


def scenario(p: ClassPage) -> list[str]:
    facts = committed()[matrix.witness_release(p.cls.witness, p.conformance)]
    return ["## Reproduce it with vLLM", "", *serve.markdown(p.cls.witness, p.policy, facts), ""]


def events(p: ClassPage) -> list[str]:
    return ["## The events", "", *step_list(p.records, p.step), ""]


def stacks(p: ClassPage) -> list[str]:
    found = next((r.stacks for r in p.records if r.stacks), {})
    lines = ["## Wrapper stacks and the dispatch path", ""]
    if p.dispatch is not None:
        lines += [f"Dispatch at step {p.step}: {dispatch_summary(p.dispatch)}", ""]
    return lines + mermaid(found, p.dispatch) + [""]


def code_path(p: ClassPage) -> list[str]:
    return decision_lines.markdown(p.cls.witness, p.conformance, p.step, p.trace_path)


SECTIONS = [header, reproduce, scenario, events, stacks, code_path]


def class_page(p: ClassPage) -> str:
    return "\n".join(line for section in SECTIONS for line in section(p))


def write_class(out: Path, folder: str, policy: Policy, c: ViolationClass, conformance: dict) -> list[Path]:
    """``out/folder/<class id>.md`` and ``.json``; ``conformance`` is ``matrix.load_conformance``'s."""
    rel = f"{folder}/{c.id}"
    label = status.status(c.witness, conformance, f"{rel}.json").text
    page = class_page(page_context(policy, c, f"{rel}.json", label, conformance))
    trace, md = out / folder / f"{c.id}.json", out / folder / f"{c.id}.md"
    write_atomic(trace, c.witness.dumps())
    write_atomic(md, page)
    return [trace, md]


def class_index(policy_name: str, classes: list[ViolationClass]) -> list[str]:
    lines = [f"## `{policy_name}`: {len(classes)} classes", "",
             "| severity | property | role | runtime mode | what happened | smallest settings | witness |",
             "|---|---|---|---|---|---|---|"]
    for c in classes:
        s = c.signature
        what = s.what + (f" ({s.detail})" if s.detail else "")
        lines.append(f"| {c.severity_text} | {s.property} | {s.role} | {s.runtime_mode} | "
                     f"[{what}]({policy_name}/classes/{c.id}.md) | {c.where} | {c.length} events |")
    return lines + [""]


def rejections_index(policy_name: str, rejections: list[ViolationClass]) -> list[str]:
    """vLLM's accepted rejections under a policy: not classes (a ValueError with advice at start-up
    is vLLM refusing what it cannot run), each with the settings that reach it and why it counts."""
    from contract.core.halts import reason

    lines = [f"### `{policy_name}`: {len(rejections)} accepted rejection{'s' if len(rejections) != 1 else ''}", ""]
    if not rejections:
        return lines + ["- none", ""]
    lines += ["| vLLM refuses with | smallest settings | at | why it is accepted |", "|---|---|---|---|"]
    for c in rejections:
        at = c.witness.events[-1].kind if c.witness.events else "VllmConfig"
        lines.append(f"| {c.signature.detail} | {c.where} | {at} | {reason(c.message or c.signature.detail)} |")
    return lines + [""]


DIFFERENTIAL_SECTIONS = (
    ("new", "New in `{branch}`", "branch"),
    ("lost", "Lost graphs in `{branch}`", "branch"),
    ("traded", "Traded by `{branch}`", "base"),
    ("fixed", "Fixed by `{branch}`", "base"),
    ("inherited", "Inherited from `{base}`", "branch"),
)


def differential_page(d, chosen: str) -> str:
    lines = [f"# `{d.branch}` against `{d.base}`", "", chosen + ".", "",
             d.summary() + "." + (" Nothing new." if not d.new else "") + (" Graphs lost." if d.lost else ""), "",
             "A class is new when the base, in the same scenario, does not show it; fixed when the base shows it "
             "and the branch does not, and the branch serves as many dispatches with a graph there as the base; "
             "traded when the base shows it and the branch does not, but the branch serves fewer dispatches with a "
             "graph there (the violation went away because the graphs did); inherited when both do. Lost graphs: "
             "scenarios where the branch serves fewer dispatches of a kind (target mixed, target uniform decode, "
             "draft prefill, draft decode) with a graph than the base, on the same serving script. Worst severity "
             "first; each links to its page with the shortest witness.", ""]
    for key, heading, _ in DIFFERENTIAL_SECTIONS:
        classes = getattr(d, key)
        lines += [f"## {heading.format(branch=d.branch, base=d.base)}: {len(classes)}", ""]
        lines += [f"- {c.severity_text}: [{c.title}](differential/{key}/{c.id}.md) ({c.length} events)"
                  + (f" — {c.message}" if key == "lost" else "") for c in classes] or ["- none"]
        lines.append("")
    return "\n".join(lines)


def write_differential(out: Path, d, chosen: str, branch: Policy, base: Policy,
                       conformance: dict) -> list[Path]:
    """``out/<branch>/differential.md`` and a page per new, lost-graphs, traded, fixed and inherited class."""
    folder = out / d.branch
    written = []
    for key, _, side in DIFFERENTIAL_SECTIONS:
        policy = branch if side == "branch" else base
        for c in getattr(d, key):
            written += write_class(out, f"{d.branch}/differential/{key}", policy, c, conformance)
    write_atomic(folder / "differential.md", differential_page(d, chosen))
    write_atomic(folder / "differential.json", json.dumps({**d.to_json(), "base_chosen": chosen}, indent=2) + "\n")
    return written + [folder / "differential.md", folder / "differential.json"]
