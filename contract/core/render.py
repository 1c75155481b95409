"""Plain-text views of steps and dispatches, shared by the terminal and the Markdown reports."""

from __future__ import annotations

from rich.table import Table

from contract.core.events import describe_event
from contract.core.observation import GLOBAL_POOL, Action, Dispatch, StepRecord
from contract.core.properties import Violation


def dispatch_summary(d: Dispatch) -> str:
    acting = d.acting
    if not acting:
        who = "no capturer (eager)" if d.runtime_mode.name != "NONE" else "eager"
    else:
        who = "; ".join(f"{a.layer.split(':', 1)[1]} {a.action.value}"
                        + (f" (depth {a.depth})" if a.action is Action.CAPTURED and a.depth else "")
                        + (f" into the {a.pool} pool" if a.action is Action.CAPTURED and a.pool != GLOBAL_POOL else "")
                        for a in acting)
    text = f"{d.role} {d.runtime_mode.name} {d.batch_descriptor}: {who}"
    return text + (f" — {d.error}" if d.error and d.error not in who else "")


def step_outcome(r: StepRecord) -> list[str]:
    lines = []
    if r.stacks:
        lines += [f"{role}: {stack}" for role, stack in r.stacks.items()]
    if r.cudagraph_mode is not None:
        lines.append(f"cudagraph_mode = {r.cudagraph_mode.name}"
                     + (f", drafter {r.drafter_cudagraph_mode.name}" if r.drafter_cudagraph_mode else ""))
    lines += [dispatch_summary(d) for d in r.dispatches]
    if r.halted:
        lines.append(f"vLLM stops: {r.halted}")
    return lines


def shown_steps(count: int, marked: list[int], limit: int) -> list[int]:
    """At most ``limit`` of ``count`` steps: the first, the last, and the ``marked`` ones (violating,
    differing from the recording) in order as far as the limit allows."""
    if count <= limit:
        return list(range(count))
    ends = {0, count - 1}
    middle = [i for i in sorted(set(marked)) if i not in ends][: max(limit - len(ends), 0)]
    return sorted(ends | set(middle))


def steps_table(records: list[StepRecord], violations: list[Violation], only: list[int] | None = None) -> Table:
    """One row per step; with ``only`` (sorted indices), those steps and a row saying how many are
    left out between them."""
    by_step: dict[int, list[Violation]] = {}
    for v in violations:
        by_step.setdefault(v.step, []).append(v)
    table = Table(show_lines=True)
    table.add_column("#", justify="right")
    table.add_column("event")
    table.add_column("what happened")
    table.add_column("violations")
    previous = -1
    for i in (range(len(records)) if only is None else only):
        if i - previous > 1:
            gap = i - previous - 1
            table.add_row("…", "", f"[dim]{gap:,} step{'s' if gap != 1 else ''} not shown[/]", "")
        previous = i
        r = records[i]
        table.add_row(
            str(r.index),
            describe_event(r.event),
            "\n".join(step_outcome(r)) or "-",
            "\n".join(f"[red]{v.property}[/]: {v.message}" for v in by_step.get(r.index, [])) or "",
        )
    if only is not None and len(records) - 1 > previous:
        gap = len(records) - 1 - previous
        table.add_row("…", "", f"[dim]{gap:,} step{'s' if gap != 1 else ''} not shown[/]", "")
    return table
