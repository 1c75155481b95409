"""``cudagraph-contract verify``: the Hypothesis machine and the explorer on policies or a vLLM tree."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from contract.branch.review import VERIFY
from contract.cli.common import (
    RUNNER_OPTION,
    TIMEOUT_OPTION,
    set_time_limit,
    unique_names,
    checked_base,
    load_tree,
    resolve_base,
    say_review,
    ALLOW_LOST_OPTION,
    BASE_OPTION,
    differential_exit,
    base_differentials,
    check_out,
    classes_note,
    err,
    out,
    parse_policies,
    profile_settings,
    verdicts_json,
    write_class_traces,
    writing,
)
from contract.cli.progress import progress
from contract.core.properties import PROPERTIES


def _shortest(verdict, exploration):
    """The explorer's shortest counterexample, else Hypothesis's own (drawn, unshrunk)."""
    shortest = exploration.counterexamples.get(verdict.property)
    return verdict.trace if shortest is None else shortest


def _cell(verdict, exploration) -> str:
    if verdict.holds:
        text = "holds"
    elif exploration.holds(verdict.property):
        text = f"fails ({verdict.length} events, Hypothesis only, unshrunk)"
    else:
        text = f"fails ({len(_shortest(verdict, exploration).events)} events)"
    if verdict.expected is not None and not verdict.as_expected:
        return f"[bold red]{text} UNEXPECTED[/]"
    return f"[green]{text}[/]" if verdict.holds else f"[yellow]{text}[/]"


def _verdict_table(profile: str, rows) -> Table:
    """One row per (policy name, verdicts, exploration): each property's verdict and its classes."""
    table = Table(title=f"verdicts (profile {profile})")
    table.add_column("policy")
    for pid, prop in PROPERTIES.items():
        table.add_column(f"{pid} {prop.name}")
    for name, verdicts, exploration in rows:
        table.add_row(name, *(_cell(v, exploration) + classes_note(exploration, pid) for pid, v in verdicts.items()))
    return table


def _hypothesis_classes(verdict, policy) -> list:
    """The classes the counterexample Hypothesis drew shows (none where it drew none)."""
    from contract.core.classes import of_trace

    return of_trace(verdict.trace, policy) if verdict.drawn is not None else []


def _print_hypothesis_classes(results, explored, policies) -> None:
    """What Hypothesis's own counterexamples show, against the explorer's classes of the same run:
    a violation the explorer's classes lack would be a disagreement between the two engines."""
    by_name = {p.name: p for p in policies}
    for name, verdicts in results.items():
        shown = {c.signature: c for v in verdicts.values() for c in _hypothesis_classes(v, by_name[name])}
        if not shown:
            continue
        known = {c.signature for c in explored[name].classes}
        outside = [c.title for sig, c in shown.items() if sig not in known]
        out.print(f"{name}: Hypothesis's counterexamples show {len(shown)} kind{'s' if len(shown) != 1 else ''} of "
                  "violation, "
                  + ("all among the explorer's classes" if not outside else
                     f"{len(outside)} outside the explorer's classes: " + "; ".join(outside)), soft_wrap=True)


def verify(
    policy: Optional[list[str]] = typer.Option(None, "--policy", "-p", help="Built-in policy name or a .py policy file; repeatable. Default: every built-in policy."),
    profile: str = typer.Option("ci", help="Hypothesis profile: ci (deterministic), dev (quick), thorough (nightly)."),
    seed: Optional[int] = typer.Option(None, help="Seed for the Hypothesis run; the same seed replays the same result."),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="Write each failing property's shortest counterexample (POLICY-PROPERTY.json) and each class's witness (POLICY-CLASS.json) into this folder."),
    as_json: bool = typer.Option(False, "--json", help="Print the verdicts as JSON."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print nothing; use the exit code."),
    vllm_src: Optional[Path] = typer.Option(None, "--vllm-src", help="A vLLM source tree (or its vllm/ package): verify the rules its runner family reads (MRV1: load_model's wrapping block; MRV2: the managers' rules), run as a policy."),
    base: Optional[str] = BASE_OPTION,
    allow_lost_graphs: bool = ALLOW_LOST_OPTION,
    runner: str = RUNNER_OPTION,
    timeout: float = TIMEOUT_OPTION,
) -> None:
    """Run the Hypothesis state machine against each policy and print the verdict table.

    With --base (the default for --vllm-src: auto), the exit code says whether the branch adds a
    violation class the base does not have.

    Example: [bold]cudagraph-contract verify --policy vllm_0_30 --policy my_branch.py[/]
    """
    from contract.core.output import write_atomic
    from contract.core.stream import run_seed, seed_for
    from contract.core.verify import verify_policy, with_explorer

    set_time_limit(timeout)
    settings = profile_settings(profile)
    drawn = seed_for(settings, seed) is None
    seed = run_seed(settings, seed)
    base = checked_base(base or ("auto" if vllm_src is not None else None))
    check_out(out_dir)
    # --vllm-src alone verifies just that tree; with --policy, both.
    policies = parse_policies(policy) if policy or vllm_src is None else []
    resolved = {}
    if vllm_src is not None:
        found = load_tree(vllm_src, runner)
        resolved[found.policy.name] = resolve_base(base, found.policy, found)
        if not quiet:
            say_review(err if as_json else out, found, resolved[found.policy.name], VERIFY)
        policies.append(found.policy)
        unique_names(policies)
    from contract.core.explore import explore as run_explore

    results, coverage, explored = {}, {}, {}
    with progress(len(policies), "policies", quiet, "verify") as advance:
        for p in policies:
            cells: set = set()
            explored[p.name] = run_explore(p, classify=True)
            results[p.name] = with_explorer(verify_policy(p, settings, seed, cells=cells, shrink=False), explored[p.name])
            reachable = explored[p.name].cells
            coverage[p.name] = (len(cells & reachable), len(reachable))
            advance()
    differentials = base_differentials(policies, base, explored, found if vllm_src is not None else None,
                                       None if quiet else (err if as_json else out), resolved)
    unexpected = [v for verdicts in results.values() for v in verdicts.values() if not v.as_expected]
    if out_dir is not None:
        with writing(out_dir) as folder:
            for name, verdicts in results.items():
                for v in verdicts.values():
                    if v.trace is not None:
                        write_atomic(folder / f"{v.policy}-{v.property}.json", _shortest(v, explored[name]).dumps())
            write_class_traces(folder, explored.values(), differentials)
    if as_json:
        from contract.cli.diffview import differential_json

        by_name = {p.name: p for p in policies}
        payload = {
            name: {pid: data | {"hypothesis_classes": [c.title for c in _hypothesis_classes(verdicts[pid], by_name[name])],
                                "classes": [c.id for c in explored[name].classes_of(pid)]}
                   for pid, data in verdicts_json(verdicts).items()}
            | {"coverage": {"reached": coverage[name][0], "reachable": coverage[name][1]}}
            | ({"differential": differential_json(*differentials[name])} if name in differentials else {})
            for name, verdicts in results.items()
        }
        sys.stdout.write(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    elif not quiet:
        out.print(_verdict_table(profile, [(name, verdicts, explored[name]) for name, verdicts in results.items()]))
        if drawn:
            out.print(f"seed {seed} (drawn for this run; --seed {seed} replays it)", soft_wrap=True, markup=False)
        for name, (reached, reachable) in coverage.items():
            out.print(f"{name}: the {profile} profile reached {reached} of {reachable} cells the explorer "
                      f"finds reachable ({100 * reached / max(reachable, 1):.1f}%)")
        _print_hypothesis_classes(results, explored, policies)
        if differentials:
            from contract.cli.diffview import print_differential

            for d, _ in differentials.values():
                print_differential(out, d)
        elif unexpected:
            for v in unexpected:
                out.print(f"[red]{v.policy} {v.property}:[/] "
                          + (v.message if not v.holds else "expected a counterexample, none found"))
    if differentials:
        raise typer.Exit(differential_exit(differentials, allow_lost_graphs))
    raise typer.Exit(1 if unexpected else 0)
