"""``cudagraph-contract``: verify policies, explore, replay traces, write reports.

Exit codes: 0 the contract holds as expected; 1 a counterexample where none was expected (or an
expected one no longer found); 2 bad input or environment.
"""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from contract.output import OutputError, one_line
from contract.policy import BUILT_IN, PolicyError, for_trace, load_policy
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


def _error(message: str) -> None:
    from rich.markup import escape

    err.print(f"[bold red]error:[/] {escape(one_line(message))}", soft_wrap=True)


def _fail(message: str) -> None:
    _error(message)
    raise typer.Exit(2)


def _policy(spec: str):
    """A built-in name or a policy file; a trace given instead names the policy to pass."""
    if Path(spec).suffix == ".json":
        from contract.policy import check_trusted
        from contract.trace import load

        t = load(spec)
        check_trusted(t.policy, spec)
        raise PolicyError(f"{spec} is a trace, not a policy: pass --policy {t.policy} to check the policy it "
                          f"was recorded under, or replay it with `cudagraph-contract replay {spec}`")
    return load_policy(spec)


def _policies(specs: list[str] | None):
    try:
        return [_policy(s) for s in (specs or list(BUILT_IN))]
    except (PolicyError, TraceError) as exc:
        _fail(str(exc))


def _check_out(folder: Path | None, option: str = "--out") -> None:
    from contract.output import check_folder

    if folder is not None:
        try:
            check_folder(folder, option)
        except OutputError as exc:
            _fail(str(exc))


@contextmanager
def _writing():
    """The command's files land together or not at all; a failure to write is one line."""
    from contract.output import transaction

    try:
        with transaction():
            yield
    except OutputError as exc:
        _fail(str(exc))


def _settings(profile: str):
    from contract.profiles import get

    try:
        return get(profile)
    except ValueError as exc:
        _fail(str(exc))


def _verdicts_json(verdicts) -> dict:
    return {pid: {"holds": v.holds, "expected": v.expected, "length": v.length, "message": v.message,
                  "trace": v.trace.to_json() if v.trace is not None else None}
            for pid, v in verdicts.items()}


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
    vllm_src: Optional[Path] = typer.Option(None, "--vllm-src", help="A vLLM source tree (or its vllm/ package): verify its load_model wrapping block, as the known revision it is or run as a policy."),
) -> None:
    """Run the Hypothesis state machine against each policy and print the verdict table.

    Example: [bold]cudagraph-contract verify --policy vllm_0_30 --policy my_branch.py[/]
    """
    from contract.trace import write_atomic
    from contract.verify import verify_policy

    settings = _settings(profile)
    _check_out(out_dir)
    # --vllm-src alone verifies just that tree; with --policy, both.
    policies = _policies(policy) if policy or vllm_src is None else []
    if vllm_src is not None:
        from contract import branch

        try:
            found = branch.load(vllm_src)
        except PolicyError as exc:
            _fail(str(exc))
        if not quiet:
            (err if as_json else out).print(found.recognised, soft_wrap=True)
        policies.append(found.policy)
    from contract.explore import explore as run_explore

    results, coverage = {}, {}
    with _progress(len(policies), "verifying", quiet or as_json) as advance:
        for p in policies:
            cells: set = set()
            results[p.name] = verify_policy(p, settings, seed, cells=cells)
            reachable = run_explore(p).cells
            coverage[p.name] = (len(cells & reachable), len(reachable))
            advance()
    unexpected = [v for verdicts in results.values() for v in verdicts.values() if not v.as_expected]
    if out_dir is not None:
        with _writing():
            for verdicts in results.values():
                for v in verdicts.values():
                    if v.trace is not None:
                        write_atomic(out_dir / f"{v.policy}-{v.property}.json", v.trace.dumps())
    if as_json:
        payload = {
            name: _verdicts_json(verdicts)
            | {"coverage": {"reached": coverage[name][0], "reachable": coverage[name][1]}}
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
        for name, (reached, reachable) in coverage.items():
            out.print(f"{name}: the {profile} profile reached {reached} of {reachable} cells the explorer "
                      f"finds reachable ({100 * reached / max(reachable, 1):.1f}%)")
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
    trust_policy_files: bool = typer.Option(False, "--trust-policy-files", help="Run the policy file a trace names; without it only --policy FILE runs a file."),
) -> None:
    """Replay a trace on the model and print what each step did.

    Exit 0 when the replay matches the trace's recorded observations, 1 when it does not.
    Example: [bold]cudagraph-contract replay reports/vllm_0_30/P4.json[/]
    """
    from contract import trace as tr

    try:
        t = tr.load(trace_file)
        p = for_trace(t.policy, str(trace_file), named=policy, trust_files=trust_policy_files)
        if update:
            fresh = tr.record(t.scenario, p, t.events, name=t.name, prop=t.property, origin=t.origin)
            fresh.policy = t.policy
            tr.write_atomic(trace_file, fresh.dumps())
            t = fresh
        result = tr.replay(t, p)
    except (TraceError, PolicyError, OutputError) as exc:
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


@app.command()
def explore(
    policy: Optional[list[str]] = typer.Option(None, "--policy", "-p", help="Built-in policy name or a .py policy file; repeatable."),
    depth: int = typer.Option(12, min=1, max=64, help="Event-depth bound of the breadth-first search."),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="Write each shortest counterexample as a JSON trace here."),
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print nothing; use the exit code."),
) -> None:
    """Enumerate every scenario class and event sequence up to DEPTH: a proof within the bound where
    the contract holds, the shortest counterexample where it does not.

    Example: [bold]cudagraph-contract explore --policy vllm_0_30 --depth 10[/]
    """
    from contract.explore import explore as run_explore
    from contract.trace import write_atomic

    policies = _policies(policy)
    _check_out(out_dir)
    results = []
    with _progress(len(policies), "exploring", quiet or as_json) as advance:
        for p in policies:
            results.append(run_explore(p, depth))
            advance()
    from contract.expected import expected_holds

    unexpected = []
    with _writing():
        for p, r in zip(policies, results):
            for pid in PROPERTIES:
                want = expected_holds(p.name, pid)
                if (want is None and not r.holds(pid)) or (want is not None and want != r.holds(pid)):
                    unexpected.append((p.name, pid))
                if out_dir is not None and not r.holds(pid):
                    write_atomic(out_dir / f"{p.name}-{pid}.json", r.counterexamples[pid].dumps())
    if as_json:
        payload = {r.policy: {"states": r.states, "transitions": r.transitions, "complete": r.complete,
                              "depth": r.depth, "scenarios": r.scenarios,
                              "verdicts": {pid: (None if r.holds(pid) else len(r.counterexamples[pid].events))
                                           for pid in PROPERTIES}}
                   for r in results}
        sys.stdout.write(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    elif not quiet:
        table = Table(title=f"exhaustive exploration (depth {depth})")
        table.add_column("policy")
        table.add_column("states")
        for pid, prop in PROPERTIES.items():
            table.add_column(f"{pid} {prop.name}")
        for r in results:
            row = ["[green]holds[/]" if r.holds(pid) else f"[yellow]fails ({len(r.counterexamples[pid].events)})[/]"
                   for pid in PROPERTIES]
            table.add_row(r.policy, f"{r.states}{'' if r.complete else ' (cut)'}", *row)
        out.print(table)
    raise typer.Exit(1 if unexpected else 0)


@app.command()
def report(
    profile: str = typer.Option("ci", help="Hypothesis profile for the sampled verdicts and coverage."),
    out_dir: Path = typer.Option(Path("reports"), "--out", help="Folder the reports go to."),
    seed: Optional[int] = typer.Option(None, help="Seed for the Hypothesis runs (default: the ci profile's seed 0); the same seed writes the same bytes."),
    as_json: bool = typer.Option(False, "--json", help="Also print the verdicts as JSON (as verify --json does)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print nothing; use the exit code."),
) -> None:
    """Verify every built-in policy (Hypothesis + explorer) and write reports/: the verdict table,
    one page and one JSON trace per counterexample, the coverage gaps.

    Example: [bold]cudagraph-contract report --out reports[/]
    """
    from contract.explore import explore as run_explore
    from contract.report import PolicyResult, write
    from contract.verify import verify_policy

    settings = _settings(profile)
    _check_out(out_dir)
    policies = _policies(None)
    results = []
    with _progress(len(policies), "verifying", quiet) as advance:
        for p in policies:
            cells: set = set()
            verdicts = verify_policy(p, settings, seed, cells=cells)
            results.append(PolicyResult(p, verdicts, run_explore(p), cells))
            advance()
    with _writing():
        write(out_dir, results)
    unexpected = [(r.policy.name, pid) for r in results for pid, v in r.verdicts.items()
                  if not v.as_expected or v.holds != r.exploration.holds(pid)]
    if as_json:
        payload = {r.policy.name: _verdicts_json(r.verdicts)
                   | {"explorer": {pid: (None if r.exploration.holds(pid)
                                         else len(r.exploration.counterexamples[pid].events))
                                   for pid in PROPERTIES}}
                   for r in results}
        sys.stdout.write(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    elif not quiet:
        out.print(f"wrote {out_dir}/README.md")
        for name, pid in unexpected:
            out.print(f"[red]{name} {pid}: verdict differs from the expected table or from the explorer[/]")
    raise typer.Exit(1 if unexpected else 0)


class _progress:
    """A rich progress bar on a terminal; nothing otherwise (output stays byte-stable in CI)."""

    def __init__(self, total: int, what: str, quiet: bool):
        self.total, self.what, self.quiet = total, what, quiet or not err.is_terminal

    def __enter__(self):
        if self.quiet:
            return lambda: None
        from rich.progress import Progress

        self.bar = Progress(console=err, transient=True)
        self.bar.__enter__()
        task = self.bar.add_task(self.what, total=self.total)
        return lambda: self.bar.advance(task)

    def __exit__(self, *exc):
        if not self.quiet:
            self.bar.__exit__(*exc)
        return False


from contract.conformance.command import conform  # noqa: E402
app.command()(conform)


def main(argv: list[str] | None = None) -> None:
    # typer 0.29 carries its own click (pinned in pyproject.toml). Its usage errors, a mistyped
    # command, option or value, are one line here like every other bad input.
    from typer._click.exceptions import ClickException, NoArgsIsHelpError

    try:
        code = app(args=argv, prog_name="cudagraph-contract", standalone_mode=False)
    except NoArgsIsHelpError:  # the help is already printed
        code = 2
    except ClickException as exc:
        ctx = getattr(exc, "ctx", None)
        _error(exc.format_message() + (f" (see {ctx.command_path} --help)" if ctx is not None else ""))
        code = 2
    except KeyboardInterrupt:
        code = 130
    if code == 130:
        err.print("interrupted; reports already written are intact")
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
