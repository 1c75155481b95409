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


_BASE_OPTION = typer.Option(
    None, "--base",
    help="Compare with a base and report new, fixed and inherited violation classes: auto (the release the "
         "branch is or starts from), a release (0.30.0), a built-in policy, a .py policy file or a vLLM tree. "
         "Exit 0 when nothing is new, 1 when something is.")


def _differentials(policies, base, explored, tree, say) -> dict:
    """policy name -> (Differential, the line saying which base was chosen); ``say`` prints that
    line (a console, or None)."""
    if base is None:
        return {}
    from contract import base as base_mod
    from contract.differential import compare

    found = {}
    for p in policies:
        try:
            base_policy, chosen = base_mod.resolve(base, p, tree if tree is not None and tree.policy is p else None)
            explored_base = next((explored[q.name] for q in policies
                                  if (q.name, q.source) == (base_policy.name, base_policy.source)), None)
            found[p.name] = (compare(p, base_policy, branch_exploration=explored.get(p.name),
                                     base_exploration=explored_base), chosen)
        except PolicyError as exc:
            _fail(str(exc))
        if say is not None:
            say.print(f"{p.name}: {chosen}", soft_wrap=True)
    return found


def _classes_note(exploration, pid: str) -> str:
    n = len(exploration.classes_of(pid))
    return f" · {n} class{'es' if n != 1 else ''}" if n else ""


def _verdict_table(profile: str, rows) -> Table:
    """One row per (policy name, verdicts, exploration): each property's verdict and its classes."""
    table = Table(title=f"verdicts (profile {profile})")
    table.add_column("policy")
    for pid, prop in PROPERTIES.items():
        table.add_column(f"{pid} {prop.name}")
    for name, verdicts, exploration in rows:
        table.add_row(name, *(_cell(v) + _classes_note(exploration, pid) for pid, v in verdicts.items()))
    return table


def _verdict_line(name: str, verdicts, exploration) -> str:
    """One line per policy, readable at any terminal width: what fails, how short, how many
    classes, and what holds; an unexpected verdict is marked."""
    fails, holds = [], []
    for pid, v in verdicts.items():
        mark = " [bold red]UNEXPECTED[/]" if v.expected is not None and not v.as_expected else ""
        if v.holds and exploration.holds(pid):
            holds.append(pid + mark)
            continue
        shortest = exploration.counterexamples.get(pid)
        n = len(exploration.classes_of(pid))
        detail = [f"{len(shortest.events)} events" if shortest is not None else "Hypothesis only"]
        detail += [f"{n} class{'es' if n != 1 else ''}"] if n else []
        fails.append(f"{pid} fails ({', '.join(detail)}){mark}")
    return f"  {name}: " + "; ".join(fails + ([f"holds {' '.join(holds)}"] if holds else []))


def _print_hypothesis_classes(results, policies) -> None:
    from contract.classes import of_trace

    by_name = {p.name: p for p in policies}
    for name, verdicts in results.items():
        found = [c for v in verdicts.values() if v.trace is not None for c in of_trace(v.trace, by_name[name])]
        if found:
            out.print(f"{name}: Hypothesis found {len(found)} class{'es' if len(found) != 1 else ''}: "
                      + "; ".join(c.title for c in found), soft_wrap=True)


def _write_class_traces(out_dir: Path, explorations, differentials) -> None:
    """One trace per class (``POLICY-CLASS.json``) and per new class against the base."""
    from contract.output import write_atomic

    for ex in explorations:
        for c in ex.classes:
            write_atomic(out_dir / f"{c.witness.name}.json", c.witness.dumps())
    for d, _ in differentials.values():
        for c in d.new:
            write_atomic(out_dir / "new" / f"{c.witness.name}.json", c.witness.dumps())


@app.command()
def verify(
    policy: Optional[list[str]] = typer.Option(None, "--policy", "-p", help="Built-in policy name or a .py policy file; repeatable. Default: every built-in policy."),
    profile: str = typer.Option("ci", help="Hypothesis profile: ci (deterministic), dev (quick), thorough (nightly)."),
    seed: Optional[int] = typer.Option(None, help="Seed for the Hypothesis run; the same seed replays the same result."),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="Write one JSON trace per counterexample into this folder."),
    as_json: bool = typer.Option(False, "--json", help="Print the verdicts as JSON."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print nothing; use the exit code."),
    vllm_src: Optional[Path] = typer.Option(None, "--vllm-src", help="A vLLM source tree (or its vllm/ package): verify its load_model wrapping block, as the known revision it is or run as a policy."),
    base: Optional[str] = _BASE_OPTION,
) -> None:
    """Run the Hypothesis state machine against each policy and print the verdict table.

    With --base (the default for --vllm-src: auto), the exit code says whether the branch adds a
    violation class the base does not have.

    Example: [bold]cudagraph-contract verify --policy vllm_0_30 --policy my_branch.py[/]
    """
    from contract.output import write_atomic
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
        base = base or "auto"
    from contract.explore import explore as run_explore

    results, coverage, explored = {}, {}, {}
    with _progress(len(policies), "verifying", quiet or as_json) as advance:
        for p in policies:
            cells: set = set()
            results[p.name] = verify_policy(p, settings, seed, cells=cells)
            explored[p.name] = run_explore(p, classify=True)
            reachable = explored[p.name].cells
            coverage[p.name] = (len(cells & reachable), len(reachable))
            advance()
    differentials = _differentials(policies, base, explored, found if vllm_src is not None else None,
                                   None if quiet else (err if as_json else out))
    unexpected = [v for verdicts in results.values() for v in verdicts.values() if not v.as_expected]
    if out_dir is not None:
        with _writing():
            for verdicts in results.values():
                for v in verdicts.values():
                    if v.trace is not None:
                        write_atomic(out_dir / f"{v.policy}-{v.property}.json", v.trace.dumps())
            _write_class_traces(out_dir, explored.values(), differentials)
    if as_json:
        from contract.classes import of_trace
        from contract.diffview import differential_json

        by_name = {p.name: p for p in policies}
        payload = {
            name: {pid: data | {"hypothesis_classes": [c.title for c in (of_trace(verdicts[pid].trace, by_name[name])
                                                                      if verdicts[pid].trace else [])],
                                "classes": [c.id for c in explored[name].classes_of(pid)]}
                   for pid, data in _verdicts_json(verdicts).items()}
            | {"coverage": {"reached": coverage[name][0], "reachable": coverage[name][1]}}
            | ({"differential": differential_json(*differentials[name])} if name in differentials else {})
            for name, verdicts in results.items()
        }
        sys.stdout.write(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    elif not quiet:
        out.print(_verdict_table(profile, [(name, verdicts, explored[name]) for name, verdicts in results.items()]))
        for name, (reached, reachable) in coverage.items():
            out.print(f"{name}: the {profile} profile reached {reached} of {reachable} cells the explorer "
                      f"finds reachable ({100 * reached / max(reachable, 1):.1f}%)")
        _print_hypothesis_classes(results, policies)
        if differentials:
            from contract.diffview import print_differential

            for d, _ in differentials.values():
                print_differential(out, d)
        elif unexpected:
            for v in unexpected:
                out.print(f"[red]{v.policy} {v.property}:[/] "
                          + (v.message if not v.holds else "expected a counterexample, none found"))
    if differentials:
        raise typer.Exit(1 if any(d.new for d, _ in differentials.values()) else 0)
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
    from contract.output import write_atomic

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
    base: Optional[str] = _BASE_OPTION,
) -> None:
    """Enumerate every scenario class and event sequence up to DEPTH: a proof within the bound where
    the contract holds, the shortest counterexample where it does not, and every violation class
    with its own shortest counterexample.

    Example: [bold]cudagraph-contract explore --policy vllm_0_30 --depth 10[/]
    """
    from contract.explore import explore as run_explore
    from contract.output import write_atomic

    policies = _policies(policy)
    _check_out(out_dir)
    results = []
    with _progress(len(policies), "exploring", quiet or as_json) as advance:
        for p in policies:
            results.append(run_explore(p, depth, classify=True))
            advance()
    differentials = _differentials(policies, base, {r.policy: r for r in results}, None,
                                   None if quiet else (err if as_json else out))
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
        if out_dir is not None:
            _write_class_traces(out_dir, results, differentials)
    if as_json:
        from contract.diffview import differential_json

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
                   f"[yellow]fails ({len(r.counterexamples[pid].events)})[/]{_classes_note(r, pid)}"
                   for pid in PROPERTIES]
            table.add_row(r.policy, f"{r.states}{'' if r.complete else ' (cut)'}", *row)
        out.print(table)
        for r in results:
            for c in r.classes:
                out.print(f"{r.policy}: {c.length} events  {c.title}", soft_wrap=True)
        if differentials:
            from contract.diffview import print_differential

            for d, _ in differentials.values():
                print_differential(out, d)
    if differentials:
        raise typer.Exit(1 if any(d.new for d, _ in differentials.values()) else 0)
    raise typer.Exit(1 if unexpected else 0)


@app.command()
def report(
    profile: str = typer.Option("ci", help="Hypothesis profile for the sampled verdicts and coverage."),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="Folder the reports go to. Default: reports/ for the "
                                           "built-in policies; a new folder for --policy FILE or --vllm-src."),
    seed: Optional[int] = typer.Option(None, help="Seed for the Hypothesis runs (default: the ci profile's seed 0); the same seed writes the same bytes."),
    as_json: bool = typer.Option(False, "--json", help="Also print the verdicts as JSON (as verify --json does)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print nothing; use the exit code."),
    policy: Optional[list[str]] = typer.Option(None, "--policy", "-p", help="Report on these policies (built-in "
                                               "names or .py files; repeatable) instead of every built-in one."),
    vllm_src: Optional[Path] = typer.Option(None, "--vllm-src", help="Report on a vLLM source tree's load_model "
                                            "wrapping block (compared with --base auto unless --base is given)."),
    base: Optional[str] = _BASE_OPTION,
) -> None:
    """Verify policies (Hypothesis + explorer) and write the reports: the verdict table, one page and
    one JSON trace per counterexample and per violation class, the coverage gaps and, with --base,
    the differential page.

    Example: [bold]cudagraph-contract report --out reports[/] ·
    [bold]cudagraph-contract report --policy my_branch.py --base vllm_0_30[/]
    """
    from contract.explore import explore as run_explore
    from contract.report import PolicyResult, write
    from contract.verify import verify_policy

    settings = _settings(profile)
    policies = _policies(policy) if policy or vllm_src is None else []
    tree = None
    if vllm_src is not None:
        from contract import branch

        try:
            tree = branch.load(vllm_src)
        except PolicyError as exc:
            _fail(str(exc))
        policies.append(tree.policy)
        base = base or "auto"
    committed = Path(__file__).resolve().parents[1] / "reports"
    users = policy is not None or vllm_src is not None
    if out_dir is None:
        out_dir = _new_folder(Path("cudagraph-contract-report")) if users else Path("reports")
    elif users and out_dir.resolve() == committed:
        _fail(f"--out {out_dir} is the project's committed reports/; write a branch's report elsewhere (omit --out)")
    _check_out(out_dir)
    results = []
    with _progress(len(policies), "verifying", quiet) as advance:
        for p in policies:
            cells: set = set()
            verdicts = verify_policy(p, settings, seed, cells=cells)
            results.append(PolicyResult(p, verdicts, run_explore(p, classify=True), cells))
            advance()
    differentials = _differentials(policies, base, {r.policy.name: r.exploration for r in results}, tree,
                                   None if quiet else out)
    by_name = {p.name: p for p in policies}
    with _writing():
        write(out_dir, results, committed if users else None,
              {name: (d, chosen, by_name[name], _base_policy(d, by_name, base, tree))
               for name, (d, chosen) in differentials.items()})
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
        out.print(f"verdicts (profile {profile}; explorer's shortest counterexample, violation classes):")
        for r in results:
            out.print(_verdict_line(r.policy.name, r.verdicts, r.exploration), soft_wrap=True, highlight=False)
        out.print(f"wrote {out_dir}/README.md (verdicts, violation classes and coverage) and a page per "
                  "counterexample and per class", soft_wrap=True, highlight=False)
        if differentials:
            from contract.diffview import print_differential

            for d, _ in differentials.values():
                print_differential(out, d)
                out.print(f"wrote {out_dir}/{d.branch}/differential.md", soft_wrap=True, highlight=False)
        else:
            for name, pid in unexpected:
                out.print(f"[red]{name} {pid}: verdict differs from the expected table or from the explorer[/]")
    if differentials:
        raise typer.Exit(1 if any(d.new for d, _ in differentials.values()) else 0)
    raise typer.Exit(1 if unexpected else 0)


def _base_policy(d, by_name, base, tree):
    from contract import base as base_mod

    return base_mod.resolve(base, by_name[d.branch], tree if tree is not None and tree.policy is by_name[d.branch] else None)[0]


def _new_folder(stem: Path) -> Path:
    """``stem``, or ``stem-2``, ``stem-3``... : a folder that does not exist yet."""
    candidate, n = stem, 1
    while candidate.exists():
        n += 1
        candidate = stem.with_name(f"{stem.name}-{n}")
    return candidate


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
