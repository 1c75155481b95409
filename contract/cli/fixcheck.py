"""``cudagraph-contract fix-check PATCH --vllm RELEASE``: one verdict on a candidate fix.

Exit 0 when the fix is accepted, 1 when it is rejected (the reasons are printed), 2 on bad input or
environment (one line)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from contract.branch import base as base_mod
from contract.branch import conform as branch_conform
from contract.branch.fixcheck import (
    FixCheckError,
    RootCause,
    Verdict,
    graphs_served,
    serving_trace,
    ungraphed,
    patched_copy,
    run_test,
)
from contract.branch.review import review
from contract.cli.common import (
    RUNNER_OPTION,
    Terminal,
    checked_base,
    default_reports,
    fail,
    load_tree,
    timeout_seconds,
)
from contract.core import child
from contract.core.child import DEFAULT_TIMEOUT_S
from contract.core.classes import signatures
from contract.core.differential import compare
from contract.core.output import OutputError, check_folder, transaction
from contract.core.policy import PolicyError
from contract.core.properties import check
from contract.core.trace import TraceError, load
from contract.evidence.root_causes import kind_matches
from contract.families import by_runner, load_policy
from contract.real import judge
from contract.real.installed import (
    EnvironmentProblem,
    environment,
    missing,
    package_of,
    release,
    shared_environment,
)
from contract.reports import branch as branch_report

CORPORA = ("witnesses", "covering", "full")


def _records(trace, observation: dict, family, version: str) -> list:
    steps = observation.get("steps") or []
    return judge.records(steps, trace.events[: len(steps)], family.descriptor_from_json,
                         profiling_skipped=family.profiling_skipped(trace.scenario, version))


def _violations(trace, records, family, kind: dict) -> list:
    """(signature, record, violation) of the root cause's kind (every kind without one)."""
    return [(sig, r, v) for r in records for sig, v in signatures(r, check(r, trace.scenario, family.runner))
            if not kind or kind_matches(kind, sig.to_json())]


def fix_check(
    patch: Path = typer.Argument(..., help="A unified diff of vLLM's package (paths a/vllm/... b/vllm/...)."),
    vllm: str = typer.Option(..., "--vllm", help="The release the patch is for (0.30.0); its environment must exist."),
    root_cause: Optional[Path] = typer.Option(None, "--root-cause", help="The fixes/<id>/ folder whose unit test "
                                              "and witnesses the fix answers (default: the patch's own folder)."),
    runner: str = RUNNER_OPTION,
    corpus: str = typer.Option("covering", "--corpus", help="What is replayed besides the witnesses: covering "
                               "(one trace per observation cell, the traces the change reaches), full, or "
                               "witnesses (the witnesses alone)."),
    timeout: float = typer.Option(DEFAULT_TIMEOUT_S, "--timeout", callback=timeout_seconds,
                                  help="Seconds each replay, and the root cause's unit test, may take; 1 to 604800."),
    reports: Optional[Path] = typer.Option(None, "--reports", help="Report folder (default: a new folder under "
                                           "reports/fix-check in the cache folder)."),
    as_json: bool = typer.Option(False, "--json", help="Print the verdict as JSON."),
) -> None:
    """Apply a candidate fix to a copy of the release and check it: the root cause's witnesses fixed
    on vLLM's own code, no new class on the corpus or in the model, the root cause's unit test passing.

    Example: [bold]cudagraph-contract fix-check fixes/mrv1-breakable-ubatching/vllm-0.30.0.patch --vllm 0.30.0[/]
    """
    version = checked_base(vllm)
    if corpus not in CORPORA:
        fail(f"--corpus {corpus}: use one of {', '.join(CORPORA)}")
    if not patch.is_file():
        fail(f"{patch}: no such patch file")
    folder = root_cause or (patch.parent if (patch.parent / "fix.json").is_file() else None)
    try:
        cause = RootCause.read(folder) if folder is not None else None
        witnesses = [load(w) for w in cause.witnesses] if cause else []
    except (FixCheckError, TraceError) as exc:
        fail(str(exc))
    python, shared, pkg = environment(version), shared_environment(), package_of(version)
    if pkg is None or not python.exists() or not shared.exists():
        fail(missing(version))
    reports = reports or default_reports("fix-check", as_json)
    try:
        check_folder(reports, "--reports")
    except OutputError as exc:
        fail(str(exc))
    say = Terminal(stderr=as_json, highlight=False, soft_wrap=True)
    with child.call_folder("cudagraph-contract-fix-") as tmp:
        try:
            tree_root = patched_copy(pkg, patch, Path(tmp))
        except FixCheckError as exc:
            fail(str(exc))
        runners = {w.scenario.runner.value.lower() for w in witnesses}
        if runner == "auto" and len(runners) == 1:  # the root cause's runner: 0.33.0 holds both
            runner = runners.pop()
        tree = load_tree(tree_root, runner)
        family = by_runner(tree.policy.runner)
        try:
            chosen = base_mod.release_base(version, family)
        except PolicyError as exc:
            fail(str(exc))
        try:
            r = review(tree, chosen, family)
        except PolicyError as exc:
            fail(str(exc))
        for line in r.lines("conform"):
            say.print(line, markup=False)
        mine = [w for w in witnesses if w.scenario.runner is family.runner]
        for i, w in enumerate(mine):
            w.name = f"witness-{i}-{w.name}"
        try:
            release_policy = load_policy(family.release_policy(release(version)))
            run = branch_conform.run(r, family, release_policy, python, version, corpus, timeout,
                                     given=mine if corpus == "witnesses" else None,
                                     always=[] if corpus == "witnesses" else mine)
        except (branch_conform.ObserveProblem, EnvironmentProblem) as exc:
            fail(str(exc))
        for note in run.notes:
            say.print(f"note: {note}", markup=False)
        verdict = Verdict(True)
        base_obs, branch_obs = run.base_observations, run.branch_observations
        if not mine:
            verdict.said.append("no witness of this runner to check the fix against (fix.json names none)")
        stopped = []  # witnesses whose root-cause violation is vLLM stopping (P0), not a dispatch
        for w in mine:
            base_records, branch_records = (_records(w, base_obs[w.name], family, version),
                                              _records(w, branch_obs[w.name], family, version))
            # the root cause's own classes: a witness may show another root cause's too (0.29.0's P3)
            shown = _violations(w, base_records, family, cause.kind)
            before = {sig for sig, _, _ in shown}
            after = {sig for sig, _, _ in _violations(w, branch_records, family, cause.kind)}
            if not before:
                verdict.said.append(f"witness {w.name}: vLLM {version} shows no violation of this root cause on it; "
                                    "it says nothing here")
                continue
            left = sorted({f"{s.property} {s.role} {s.runtime_mode}: {s.what}" for s in before & after})
            if left:
                verdict.accepted = False
                verdict.reasons.append(f"witness {w.name} still shows {'; '.join(left)}")
                continue
            graphless = sorted(ungraphed(shown, branch_records))
            if graphless:
                verdict.accepted = False
                verdict.reasons.append(f"witness {w.name}: its violation went with the graphs (traded): "
                                       + "; ".join(graphless))
            else:
                verdict.said.append(f"witness {w.name}: its {len(before)} violation(s) on vLLM {version} are gone, "
                                    "and a graph serves each dispatch they were on")
            if any(v.dispatch is None and sig.property == "P0" for sig, _, v in shown):
                stopped.append(w)
        if stopped:  # vLLM stopped there: with the patch, does the scenario serve with graphs at all?
            serving = [serving_trace(w) for w in stopped]
            try:
                served = branch_conform.observe(python, family, serving, tree_root / "vllm", timeout,
                                                f"the serving script on {tree_root}", version, pkg)
            except branch_conform.ObserveProblem as exc:
                fail(str(exc))
            by_name = {o["name"]: o for o in served["observations"]}
            for w, s in zip(stopped, serving):
                records = _records(s, by_name.get(s.name, {}), family, version)
                count = graphs_served(records)
                halt = next((r for r in records if r.halted), None)
                if halt is not None:
                    verdict.accepted = False
                    verdict.reasons.append(f"witness {w.name}: with the patch vLLM still stops on its scenario's serving "
                                           f"script, at step {halt.index} ({halt.event.kind}): {halt.halted}")
                elif count == 0:
                    verdict.accepted = False
                    verdict.reasons.append(f"witness {w.name}: vLLM no longer stops, but no serving dispatch of its "
                                           "scenario is served by a graph with the patch (the stop went with the graphs)")
                else:
                    verdict.said.append(f"witness {w.name}: with the patch the scenario serves {count} dispatch(es) "
                                        "of the serving script with a graph")
        d = run.differential
        if d.new:
            verdict.accepted = False
            verdict.reasons.append(f"{len(d.new)} new class(es) on vLLM's code: " + "; ".join(c.title for c in d.new[:3]))
        if d.lost:
            verdict.accepted = False
            verdict.reasons.append("lost graphs on vLLM's code: " + "; ".join(c.title for c in d.lost[:3]))
        verdict.said.append(f"vLLM's code on {len(run.traces)} traces ({run.selection.why}): {d.summary()}")
        if run.sizes is not None:
            if run.sizes.new:
                verdict.accepted = False
                verdict.reasons.append(f"{len(run.sizes.new)} new capture-size class(es) on vLLM's code: "
                                       + "; ".join(c.gap.title for c in run.sizes.new[:3]))
            verdict.said.append(f"vLLM's code on {run.sizes.settings} capture-size settings: {len(run.sizes.new)} new, "
                                f"{len(run.sizes.fixed)} fixed, {len(run.sizes.inherited)} inherited")
        if tree.release is None:  # the rules the family reads are not the release's: the model differs too
            model = compare(tree.policy, chosen.policy)
            if model.new:
                verdict.accepted = False
                verdict.reasons.append(f"{len(model.new)} new class(es) in the model of the rules the patch changes: "
                                       + "; ".join(c.title for c in model.new[:3]))
            if model.lost:
                verdict.accepted = False
                verdict.reasons.append("lost graphs in the model of the rules the patch changes: "
                                       + "; ".join(c.title for c in model.lost[:3]))
            verdict.said.append(f"the model on the patched rules: {model.summary()}")
        if cause is not None and cause.test is not None:
            try:
                after = run_test(cause.test, tree_root, shared, python, version, timeout)
                before = run_test(cause.test, None, shared, python, version, timeout)
            except child.ChildProblem as exc:
                fail(str(exc))
            verdict.said.append(f"{cause.test.name}: {before.outcome} on vLLM {version}, {after.outcome} with the patch")
            if after.outcome != "pass":
                verdict.accepted = False
                verdict.reasons.append(f"its unit test does not pass with the patch ({after.outcome}): "
                                       + after.summary)
        try:
            with transaction():
                index = branch_report.write(reports, run)
        except OutputError as exc:
            fail(str(exc))
    if as_json:
        sys.stdout.write(json.dumps({"patch": str(patch), "vllm": version, "accepted": verdict.accepted,
                                     "reasons": verdict.reasons, "checked": verdict.said, "report": str(index)},
                                    indent=1) + "\n")
    else:
        for line in verdict.said:
            say.print(f"  {line}", markup=False)
        say.print(verdict.line(patch, version), markup=False)
        say.print(f"report: {index}", markup=False)
    raise typer.Exit(0 if verdict.accepted else 1)
