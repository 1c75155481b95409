"""``cudagraph-contract report``: verify and write the reports."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

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
    default_reports,
    err,
    fail,
    out,
    parse_policies,
    profile_settings,
    verdicts_json,
    writing,
)
from contract.cli.progress import progress
from contract.core.properties import PROPERTIES


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


def report(
    profile: str = typer.Option("ci", help="Hypothesis profile for the sampled verdicts and coverage."),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="Folder the reports go to. Default: reports/ for the "
                                           "built-in policies; a new folder for --policy FILE or --vllm-src."),
    seed: Optional[int] = typer.Option(None, help="Seed for the Hypothesis runs (default: the ci profile's seed 0); the same seed writes the same bytes."),
    as_json: bool = typer.Option(False, "--json", help="Also print the verdicts as JSON (as verify --json does)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print nothing; use the exit code."),
    policy: Optional[list[str]] = typer.Option(None, "--policy", "-p", help="Report on these policies (built-in "
                                               "names or .py files; repeatable) instead of every built-in one."),
    vllm_src: Optional[Path] = typer.Option(None, "--vllm-src", help="Report on the rules of a vLLM source tree "
                                            "(compared with --base auto unless --base is given)."),
    base: Optional[str] = BASE_OPTION,
    allow_lost_graphs: bool = ALLOW_LOST_OPTION,
    runner: str = RUNNER_OPTION,
    timeout: float = TIMEOUT_OPTION,
) -> None:
    """Verify policies (Hypothesis + explorer) and write the reports: the verdict table, one page and
    one JSON trace per counterexample and per violation class, the coverage gaps and, with --base,
    the differential page.

    Example: [bold]cudagraph-contract report --out reports[/] ·
    [bold]cudagraph-contract report --policy my_branch.py --base vllm_0_30[/]
    """
    from contract.core.explore import explore as run_explore
    from contract.core.stream import run_seed
    from contract.core.verify import verify_policy, with_explorer
    from contract.reports.report import PolicyResult, write

    set_time_limit(timeout)
    settings = profile_settings(profile)
    seed = run_seed(settings, seed)
    base = checked_base(base or ("auto" if vllm_src is not None else None))
    policies = parse_policies(policy) if policy or vllm_src is None else []
    tree, resolved = None, {}
    if vllm_src is not None:
        tree = load_tree(vllm_src, runner)
        resolved[tree.policy.name] = resolve_base(base, tree.policy, tree)
        if not quiet:
            say_review(err if as_json else out, tree, resolved[tree.policy.name], VERIFY)
        policies.append(tree.policy)
        unique_names(policies)
    committed = Path(__file__).resolve().parents[2] / "reports"
    users = policy is not None or vllm_src is not None
    if out_dir is None:
        out_dir = default_reports("report", quiet or as_json) if users else Path("reports")
    elif users and out_dir.resolve() == committed:
        fail(f"--out {out_dir} is the project's committed reports/; write a branch's report elsewhere (omit --out)")
    check_out(out_dir)
    results = []
    with progress(len(policies), "policies", quiet, "report") as advance:
        for p in policies:
            cells: set = set()
            exploration = run_explore(p, classify=True)
            verdicts = with_explorer(verify_policy(p, settings, seed, cells=cells, shrink=False), exploration)
            results.append(PolicyResult(p, verdicts, exploration, cells))
            advance()
    differentials = base_differentials(policies, base, {r.policy.name: r.exploration for r in results}, tree,
                                       None if quiet else err if as_json else out, resolved)
    by_name = {p.name: p for p in policies}
    with writing(out_dir) as folder:
        write(folder, results, committed if users else None,
              {name: (d, chosen, by_name[name], (resolved.get(name) or resolve_base(base, by_name[name], tree)).policy)
               for name, (d, chosen) in differentials.items()})
    unexpected = [(r.policy.name, pid) for r in results for pid, v in r.verdicts.items()
                  if not v.as_expected or v.holds != r.exploration.holds(pid)]
    if as_json:
        payload = {r.policy.name: verdicts_json(r.verdicts)
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
            from contract.cli.diffview import print_differential

            for d, _ in differentials.values():
                print_differential(out, d)
                out.print(f"wrote {out_dir}/{d.branch}/differential.md", soft_wrap=True, highlight=False)
        else:
            for name, pid in unexpected:
                out.print(f"[red]{name} {pid}: verdict differs from the expected table or from the explorer[/]")
    if differentials:
        raise typer.Exit(differential_exit(differentials, allow_lost_graphs))
    raise typer.Exit(1 if unexpected else 0)
