"""The differential verdict on a terminal and as JSON: new classes, lost graphs, traded, fixed and
inherited classes, each list worst severity first."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape

from contract.core.differential import Differential

SECTIONS = (
    ("new", "new in {branch}", "bold red"),
    ("lost", "lost graphs in {branch} (fewer serving dispatches served by a graph than {base})", "bold red"),
    ("traded", "traded by {branch} (gone where it lost graphs)", "magenta"),
    ("fixed", "fixed by {branch}", "green"),
    ("inherited", "inherited from {base}", "yellow"),
)


def print_differential(console: Console, d: Differential) -> None:
    console.print(f"[bold]{escape(d.branch)}[/] against base [bold]{escape(d.base)}[/]: {d.summary()}"
                  + ("" if d.new else " — nothing new") + ("" if not d.lost else " — graphs lost"), soft_wrap=True)
    for key, heading, style in SECTIONS:
        classes = getattr(d, key)
        if not classes:
            continue
        console.print(f"  [{style}]{heading.format(branch=escape(d.branch), base=escape(d.base))}:[/]")
        for c in classes:
            console.print(f"    [{escape(c.severity_text)}] {escape(c.title)}", soft_wrap=True)
            if key not in ("inherited",):
                console.print(f"      witness ({c.length} events): {escape(c.events_text)}", soft_wrap=True)
                console.print(f"      {escape(c.message)}", soft_wrap=True)


def differential_json(d: Differential, chosen: str) -> dict:
    return {**d.to_json(), "base_chosen": chosen}
