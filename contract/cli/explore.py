"""``cudagraph-contract explore``: the exhaustive explorer, with every violation class."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from contract.cli.common import (
    TIMEOUT_OPTION,
    set_time_limit,
    checked_base,
    ALLOW_LOST_OPTION,
    BASE_OPTION,
    differential_exit,
    base_differentials,
    check_out,
    classes_note,
    err,
    out,
    parse_policies,
    write_class_traces,
    writing,
)
from contract.cli.progress import progress
from contract.core.properties import PROPERTIES


def explore(
    policy: Optional[list[str]] = typer.Option(None, "--policy", "-p", help="Built-in policy name or a .py policy file; repeatable."),
    depth: int = typer.Option(12, min=1, max=64, help="Event-depth bound of the breadth-first search."),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="Write each shortest counterexample as a JSON trace here."),
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print nothing; use the exit code."),
    base: Optional[str] = BASE_OPTION,
    allow_lost_graphs: bool = ALLOW_LOST_OPTION,
    timeout: float = TIMEOUT_OPTION,
) -> None:
    """Enumerate every scenario class and event sequence up to DEPTH: a proof within the bound where
    the contract holds, the shortest counterexample where it does not, and every violation class
    with its own shortest counterexample.

    Example: [bold]cudagraph-contract explore --policy vllm_0_30 --depth 10[/]
    """
    from contract.core.explore import explore as run_explore
    from contract.core.output import write_atomic

    set_time_limit(timeout)
    base = checked_base(base)
    policies = parse_policies(policy)
    check_out(out_dir)
    results = []
    with progress(len(policies), "policies", quiet, "explore") as advance:
        for p in policies:
            results.append(run_explore(p, depth, classify=True))
            advance()
    differentials = base_differentials(policies, base, {r.policy: r for r in results}, None,
                                   None if quiet else (err if as_json else out))
    from contract.core.expected import expected_holds

    unexpected = []
    with writing(out_dir) as folder:
        for p, r in zip(policies, results):
            for pid in PROPERTIES:
                want = expected_holds(p.name, pid)
                if (want is None and not r.holds(pid)) or (want is not None and want != r.holds(pid)):
                    unexpected.append((p.name, pid))
                if folder is not None and not r.holds(pid):
                    write_atomic(folder / f"{p.name}-{pid}.json", r.counterexamples[pid].dumps())
        if folder is not None:
            write_class_traces(folder, results, differentials)
    if as_json:
        from contract.cli.diffview import differential_json

        payload = {r.policy: {"states": r.states, "transitions": r.transitions, "complete": r.complete,
                              "depth": r.depth, "scenarios": r.scenarios,
                              "verdicts": {pid: (None if r.holds(pid) else len(r.counterexamples[pid].events))
                                           for pid in PROPERTIES},
                              "classes": [c.to_json() for c in r.classes]}
                   | ({"differential": differential_json(*differentials[r.policy])} if r.policy in differentials else {})
                   for r in results}
        sys.stdout.write(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    elif not quiet:
        table = Table(title=f"exhaustive exploration (depth {depth})")
        table.add_column("policy")
        table.add_column("states")
        for pid, prop in PROPERTIES.items():
            table.add_column(f"{pid} {prop.name}")
        for r in results:
            row = ["[green]holds[/]" if r.holds(pid) else
                   f"[yellow]fails ({len(r.counterexamples[pid].events)})[/]{classes_note(r, pid)}"
                   for pid in PROPERTIES]
            table.add_row(r.policy, f"{r.states}{'' if r.complete else ' (cut)'}", *row)
        out.print(table)
        for r in results:
            for c in r.classes:
                out.print(f"{r.policy}: [{c.severity_text}] {c.length} events  {c.title}", soft_wrap=True, markup=False)
        if differentials:
            from contract.cli.diffview import print_differential

            for d, _ in differentials.values():
                print_differential(out, d)
    if differentials:
        raise typer.Exit(differential_exit(differentials, allow_lost_graphs))
    raise typer.Exit(1 if unexpected else 0)
