"""The differential verdict on a terminal and as JSON: new, fixed and inherited classes."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape

from contract.core.differential import Differential

SECTIONS = (
    ("new", "new in {branch}", "bold red"),
    ("fixed", "fixed by {branch}", "green"),
    ("inherited", "inherited from {base}", "yellow"),
)


def print_differential(console: Console, d: Differential) -> None:
    console.print(f"[bold]{escape(d.branch)}[/] against base [bold]{escape(d.base)}[/]: "
                  f"{len(d.new)} new, {len(d.fixed)} fixed, {len(d.inherited)} inherited"
                  + ("" if d.new else " — nothing new"), soft_wrap=True)
    for key, heading, style in SECTIONS:
        classes = getattr(d, key)
        if not classes:
            continue
        console.print(f"  [{style}]{heading.format(branch=escape(d.branch), base=escape(d.base))}:[/]")
        for c in classes:
            console.print(f"    {escape(c.title)}", soft_wrap=True)
            if key != "inherited":
                console.print(f"      witness ({c.length} events): {escape(c.events_text)}", soft_wrap=True)
                console.print(f"      {escape(c.message)}", soft_wrap=True)


def differential_json(d: Differential, chosen: str) -> dict:
    return {**d.to_json(), "base_chosen": chosen}
