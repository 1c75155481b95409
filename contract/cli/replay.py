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


def replay(
    trace_file: Path = typer.Argument(..., help="A trace JSON file (from verify, explore or tests/traces)."),
    policy: Optional[str] = typer.Option(None, "--policy", "-p", help="Replay under this policy instead of the trace's."),
    as_json: bool = typer.Option(False, "--json", help="Print the replayed steps as JSON."),
    update: bool = typer.Option(False, "--update", help="Re-record the trace's expected observations from the model (for a new or changed regression trace)."),
    trust_policy_files: bool = typer.Option(False, "--trust-policy-files", help="Run the policy file a trace names; without it only --policy FILE runs a file."),
    timeout: float = TIMEOUT_OPTION,
) -> None:
    """Replay a trace on the model and print what each step did.

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
        from contract.core.render import steps_table

        out.print(steps_table(result.records, result.violations))
        for m in result.mismatches:
            out.print(f"[red]mismatch:[/] {m}")
        if not result.mismatches:
            out.print("[green]replay matches the recorded observations[/]")
    raise typer.Exit(1 if result.mismatches else 0)
