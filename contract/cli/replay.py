"""``cudagraph-contract replay``: a trace on the model, step by step."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from contract.cli.common import (
    TIMEOUT_OPTION,
    set_time_limit,
    fail,
    out,
)
from contract.core.output import OutputError
from contract.core.policy import PolicyError
from contract.core.trace import TraceError
from contract.families import for_trace

# Per-step rows printed without --all: the first step, the violating and differing ones, the last.
SHOWN_STEPS = 40
SHOWN_MISMATCHES = 10


def replay(
    trace_file: Path = typer.Argument(..., help="A trace JSON file (from verify, explore or tests/traces)."),
    policy: Optional[str] = typer.Option(None, "--policy", "-p", help="Replay under this policy instead of the trace's."),
    as_json: bool = typer.Option(False, "--json", help="Print the replayed steps as JSON."),
    update: bool = typer.Option(False, "--update", help="Re-record the trace's expected observations from the model (for a new or changed regression trace)."),
    trust_policy_files: bool = typer.Option(False, "--trust-policy-files", help="Run the policy file a trace names; without it only --policy FILE runs a file."),
    show_all: bool = typer.Option(False, "--all", help=f"Print every step (default: at most {SHOWN_STEPS}: the first, "
                                  "the violating and differing ones, the last)."),
    timeout: float = TIMEOUT_OPTION,
) -> None:
    """Replay a trace on the model: a summary (steps, violations, whether it matches the recorded
    observations) and what the first, the violating and the last steps did.

    Exit 0 when the replay matches the trace's recorded observations, 1 when it does not.
    Example: [bold]cudagraph-contract replay reports/vllm_0_30/P4.json[/]
    """
    set_time_limit(timeout)
    from contract.core import trace as tr
    from contract.core.output import write_atomic

    try:
        t = tr.load(trace_file)
        p = for_trace(t.policy, str(trace_file), named=policy, trust_files=trust_policy_files)
        if update:
            fresh = tr.record(t.scenario, p, t.events, name=t.name, prop=t.property, origin=t.origin)
            fresh.policy = t.policy
            write_atomic(trace_file, fresh.dumps())
            t = fresh
        result = tr.replay(t, p)
    except (TraceError, PolicyError, OutputError) as exc:
        fail(str(exc))
    if as_json:
        sys.stdout.write(json.dumps({"steps": [r.to_json() for r in result.records],
                                     "violations": [v.to_json() for v in result.violations],
                                     "mismatches": result.mismatches}, indent=2) + "\n")
    else:
        from contract.core.render import shown_steps, steps_table

        records, violations = result.records, result.violations
        only = None if show_all else shown_steps(len(records), [v.step for v in violations] + result.mismatched_steps,
                                                  SHOWN_STEPS)
        out.print(steps_table(records, violations, only))
        out.print(_summary(trace_file, p.name, result, only), soft_wrap=True, highlight=False)
        mismatches = result.mismatches if show_all else result.mismatches[:SHOWN_MISMATCHES]
        for m in mismatches:
            out.print(f"[red]mismatch:[/] {m}")
        if len(mismatches) < len(result.mismatches):
            out.print(f"[red]mismatch:[/] and {len(result.mismatches) - len(mismatches):,} more (--all lists them)")
        if not result.mismatches:
            out.print("[green]replay matches the recorded observations[/]")
    raise typer.Exit(1 if result.mismatches else 0)


def _summary(trace_file: Path, policy: str, result, only: list[int] | None) -> str:
    """One line: steps, violations by property, where the first is, what of the steps is shown."""
    from collections import Counter

    steps = len(result.records)
    text = f"{trace_file}: {steps:,} step{'s' if steps != 1 else ''} under {policy}; "
    if result.violations:
        by_property = Counter(v.property for v in result.violations)
        at = sorted({v.step for v in result.violations})
        text += (f"{len(result.violations):,} violation{'s' if len(result.violations) != 1 else ''} ("
                 + ", ".join(f"{k} {n:,}" for k, n in sorted(by_property.items()))
                 + f") at {len(at):,} step{'s' if len(at) != 1 else ''}, the first at step {at[0]}")
    else:
        text += "no violation"
    if only is not None and len(only) < steps:
        text += f"; {len(only)} steps shown above, --all shows every step"
    return text
