"""Markdown that renders well on GitHub in light and dark mode: a trace's steps as nested lists
(no wide table rows with ``<br>`` stacks) and the wrapper stacks as a Mermaid diagram with the
failing dispatch's path through the stack highlighted."""

from __future__ import annotations

from contract.core.events import describe_event
from contract.core.modes import NONE
from contract.core.observation import Action, Dispatch, StepRecord
from contract.core.render import step_outcome

# Fills dark enough for white text and light enough to stand out on GitHub's dark background.
CLASS_DEFS = (
    "  classDef layer fill:#334155,stroke:#94a3b8,color:#f8fafc",
    "  classDef onpath fill:#1d4ed8,stroke:#93c5fd,color:#ffffff",
    "  classDef fail fill:#b91c1c,stroke:#fecaca,color:#ffffff,stroke-width:3px",
)
PATH_LINK = "stroke:#f59e0b,stroke-width:3px"


def step_list(records: list[StepRecord], violating_step: int | None) -> list[str]:
    """One numbered item per event; what happened and what changed as sub-items."""
    lines = []
    for r in records:
        head = f"`{describe_event(r.event)}`"
        if r.index == violating_step:
            head = f"**{head} ← the violation**"
        lines.append(f"{r.index}. {head}")
        for text in step_outcome(r):
            lines.append(f"   - {text}")
        for text in r.changes:
            lines.append(f"   - *state:* {text}")
    return lines


def _label(text: str) -> str:
    return text.replace('"', "'")


def mermaid(stacks: dict[str, str], d: Dispatch | None) -> list[str]:
    """The stacks left to right; the failing dispatch enters its role's stack, thick edges mark the
    path it took, red marks the layers that captured, replayed or raised, or the missing capturer."""
    lines = ["```mermaid", "flowchart LR", *CLASS_DEFS]
    edges = 0
    path_edges = []
    for role, text in stacks.items():
        names = text.split(" -> ")
        ids = [f"{role}{i}" for i in range(len(names))]
        on_path = d is not None and d.role == role
        acted = {a.layer.split(":", 1)[1]: a.action for a in d.layers} if on_path else {}
        if on_path:
            lines.append(f'  {role}D(["{role} dispatch<br/>{d.runtime_mode.name} {d.batch_descriptor}"]):::onpath')
        for node_id, name in zip(ids, names):
            action = acted.get(name)
            label = _label(name) + (f"<br/>{action.value}" if action is not None else "")
            cls = ("fail" if action in (Action.CAPTURED, Action.REPLAYED, Action.RAISED)
                   else "onpath" if on_path else "layer")
            lines.append(f'  {node_id}["{label}"]:::{cls}')
        chain = [f"{role}D", *ids] if on_path else ids
        for a, b in zip(chain, chain[1:]):
            lines.append(f"  {a} {'==>' if on_path else '-->'} {b}")
            if on_path:
                path_edges.append(edges)
            edges += 1
        if not on_path:
            continue
        for a in d.acting:
            if a.layer.endswith(":compiled"):
                lines.append(f'  {role}C["compiled PIECEWISE wrappers<br/>{a.action.value}"]:::fail')
                lines.append(f"  {ids[-1]} ==> {role}C")
                path_edges.append(edges)
                edges += 1
        if not d.acting and d.runtime_mode != NONE:
            lines.append(f'  {role}M(("no capturer:<br/>{d.runtime_mode.name} runs eagerly")):::fail')
            lines.append(f"  {ids[-1]} ==> {role}M")
            path_edges.append(edges)
            edges += 1
    if path_edges:
        lines.append(f"  linkStyle {','.join(map(str, path_edges))} {PATH_LINK}")
    lines.append("```")
    return lines
