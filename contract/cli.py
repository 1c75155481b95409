"""``cudagraph-contract``: verify policies, explore, replay traces, write reports.

Exit codes: 0 the contract holds as expected; 1 a counterexample where none was expected (or an
expected one no longer found); 2 bad input or environment.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from contract.policy import BUILT_IN, PolicyError, load_policy
from contract.properties import PROPERTIES
from contract.trace import TraceError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode="rich",
    help="Verify vLLM's CUDA-graph dispatch contract: every non-NONE dispatch has exactly one capturer.",
    epilog="Exit codes: 0 contract holds as expected · 1 counterexample · 2 bad input or environment.",
)
out = Console(highlight=False)
err = Console(stderr=True, highlight=False)


class BadInput(Exception):
    """One line for the user; exit code 2."""


def _fail(message: str) -> None:
    err.print(f"[bold red]error:[/] {message}", markup=True, soft_wrap=True)
    raise typer.Exit(2)


def _policies(specs: list[str] | None):
    try:
        return [load_policy(s) for s in (specs or list(BUILT_IN))]
    except PolicyError as exc:
        _fail(str(exc))


def _settings(profile: str):
    from contract.profiles import get

    try:
        return get(profile)
    except ValueError as exc:
        _fail(str(exc))


def _cell(verdict) -> str:
    if verdict.holds:
        text = "holds"
    else:
        text = f"fails ({verdict.length} events)"
    if verdict.expected is not None and not verdict.as_expected:
        return f"[bold red]{text} UNEXPECTED[/]"
    return f"[green]{text}[/]" if verdict.holds else f"[yellow]{text}[/]"


@app.command()
def verify(
    policy: Optional[list[str]] = typer.Option(None, "--policy", "-p", help="Built-in policy name or a .py policy file; repeatable. Default: every built-in policy."),
    profile: str = typer.Option("ci", help="Hypothesis profile: ci (deterministic), dev (quick), thorough (nightly)."),
    seed: Optional[int] = typer.Option(None, help="Seed for the Hypothesis run; the same seed replays the same result."),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="Write one JSON trace per counterexample into this folder."),
    as_json: bool = typer.Option(False, "--json", help="Print the verdicts as JSON."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print nothing; use the exit code."),
) -> None:
    """Run the Hypothesis state machine against each policy and print the verdict table.

    Example: [bold]cudagraph-contract verify --policy vllm_0_30 --policy my_branch.py[/]
    """
    from contract.trace import write_atomic
    from contract.verify import verify_policy

    settings = _settings(profile)
    policies = _policies(policy)
    results = {}
    with err.status("verifying", spinner="dots") if not (quiet or as_json) and err.is_terminal else _null():
        for p in policies:
            results[p.name] = verify_policy(p, settings, seed)
    unexpected = [v for verdicts in results.values() for v in verdicts.values() if not v.as_expected]
    if out_dir is not None:
        for verdicts in results.values():
            for v in verdicts.values():
                if v.trace is not None:
                    write_atomic(out_dir / f"{v.policy}-{v.property}.json", v.trace.dumps())
    if as_json:
        payload = {
            name: {pid: {"holds": v.holds, "expected": v.expected, "length": v.length, "message": v.message}
                   for pid, v in verdicts.items()}
            for name, verdicts in results.items()
        }
        sys.stdout.write(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    elif not quiet:
        table = Table(title=f"verdicts (profile {profile})")
        table.add_column("policy")
        for pid, prop in PROPERTIES.items():
            table.add_column(f"{pid} {prop.name}")
        for name, verdicts in results.items():
            table.add_row(name, *(_cell(v) for v in verdicts.values()))
        out.print(table)
        for v in unexpected:
            out.print(f"[red]{v.policy} {v.property}:[/] "
                      + (v.message if not v.holds else "expected a counterexample, none found"))
    raise typer.Exit(1 if unexpected else 0)


@app.command()
def replay(
    trace_file: Path = typer.Argument(..., help="A trace JSON file (from verify, explore or tests/traces)."),
    policy: Optional[str] = typer.Option(None, "--policy", "-p", help="Replay under this policy instead of the trace's."),
    as_json: bool = typer.Option(False, "--json", help="Print the replayed steps as JSON."),
    update: bool = typer.Option(False, "--update", help="Re-record the trace's expected observations from the model (for a new or changed regression trace)."),
) -> None:
    """Replay a trace on the model and print what each step did.

    Exit 0 when the replay matches the trace's recorded observations, 1 when it does not.
    Example: [bold]cudagraph-contract replay reports/vllm_0_30/P4.json[/]
    """
    from contract import trace as tr

    try:
        t = tr.load(trace_file)
        p = load_policy(policy or t.policy)
        if update:
            fresh = tr.record(t.scenario, p, t.events, name=t.name, prop=t.property, origin=t.origin)
            fresh.policy = t.policy
            tr.write_atomic(trace_file, fresh.dumps())
            t = fresh
        result = tr.replay(t, p)
    except (TraceError, PolicyError) as exc:
        _fail(str(exc))
    if as_json:
        sys.stdout.write(json.dumps({"steps": [r.to_json() for r in result.records],
                                     "violations": [v.to_json() for v in result.violations],
                                     "mismatches": result.mismatches}, indent=2) + "\n")
    else:
        from contract.render import steps_table

        out.print(steps_table(result.records, result.violations))
        for m in result.mismatches:
            out.print(f"[red]mismatch:[/] {m}")
        if not result.mismatches:
            out.print("[green]replay matches the recorded observations[/]")
    raise typer.Exit(1 if result.mismatches else 0)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        err.print("interrupted; reports already written are intact")
        sys.exit(130)


if __name__ == "__main__":
    main()
