"""``conform --vllm-src TREE``: a branch replayed on vLLM's own code against the release it starts
from (``contract/branch/conform.py``), said in the order a reviewer reads it: what the tree
changes and what the replay exercises, the classes new, fixed and inherited with their witnesses,
at most ``MAX_CHANGES`` lines of what vLLM did differently, and where the report is."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from contract.branch import conform as branch_conform
from contract.branch.review import CONFORM, review
from contract.cli.common import Terminal, checked_base, default_reports, fail, load_tree, resolve_base
from contract.core.output import OutputError, check_folder, publish
from contract.core.policy import PolicyError
from contract.core.sizes import WitnessError, is_witness, witness_setting
from contract.core.trace import TraceError, load
from contract.families import by_runner, load_policy
from contract.real.installed import EnvironmentProblem, environment, missing, release

MAX_CHANGES = 20
COMMITTED_REPORTS = Path(__file__).resolve().parents[2] / "reports"


def _step_line(c: branch_conform.StepChange) -> str:
    def said(step: dict | None, descriptors: bool = False) -> str:
        if step is None:
            return "not reached"
        if "cannot_build" in step:
            return f"refused at start-up ({step['cannot_build']})" if step["cannot_build"] else "built"
        if step.get("halted"):
            return f"stops: {step['halted']}"
        acting = [f"{d['role']} {d['runtime_mode']}{_descriptor(d) if descriptors else ''}: "
                  + (", ".join(f"{a['layer']} {a['action']}" for a in d["layers"] if a["action"] != "passed") or "eager")
                  for d in step.get("dispatches", [])]
        mode = f"mode {step['cudagraph_mode']}; " if step.get("cudagraph_mode") else ""
        return mode + ("; ".join(acting) if acting else "no dispatch")
    # where the same layers act on both sides, the difference is in the batch descriptors: say them
    same = said(c.base) == said(c.branch)
    return f"  {c.trace} step {c.step} ({c.event}): base {said(c.base, same)} | branch {said(c.branch, same)}"


def _descriptor(dispatch: dict) -> str:
    """`` (num_tokens=4, uniform_token_count=1, ...)``: the batch descriptor's set fields, and the dummy
    LoRA adapters a capture ran with where it ran with some."""
    desc = dispatch.get("batch_descriptor") or {}
    fields = [f"{k}={v}" for k, v in desc.items() if v is not None]
    if dispatch.get("selected_loras"):
        fields.append(f"selected_loras={dispatch['selected_loras']}")
    return " (" + ", ".join(fields) + ")" if fields else ""


UNEXERCISED = 3  # no replayed trace ran any change of the tree's: no verdict


def _given(paths: list[Path]) -> tuple[list, list | None]:
    """The traces and the size witnesses (``contract/core/sizes.py``) among the files ``--traces``
    names: witnesses alone check only their settings, traces alone skip the size check."""
    traces, settings = [], []
    for p in paths:
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError):
            data = None  # load() says what is wrong with it
        if is_witness(data):
            settings.append(witness_setting(data, str(p)))
        else:
            traces.append(load(p))
    return traces, (settings or None)


def branch_conform_command(vllm_src: Path, base: str | None, runner: str, corpus: str, traces: list[Path] | None,
                           reports: Path | None, as_json: bool, timeout: float | None,
                           allow_lost_graphs: bool = False, allow_unexercised: bool = False) -> None:
    base = checked_base(base or "auto")
    if corpus not in ("covering", "full"):
        fail(f"--corpus {corpus}: a branch replay takes covering (the default) or full")
    tree = load_tree(vllm_src, runner)
    chosen = resolve_base(base, tree.policy, tree)
    if chosen.release is None:
        fail(f"--base {base}: conform --vllm-src compares the tree's code with a release's; pass --base auto or a "
             "release (0.34.0)")
    family = by_runner(tree.policy.runner)
    python = environment(chosen.release)
    if not python.exists():
        fail(missing(chosen.release))
    if reports is None:
        reports = default_reports("branch", as_json)
    elif reports.resolve() == COMMITTED_REPORTS.resolve():
        fail(f"--reports {reports} is the project's committed reports/; write a branch's report elsewhere "
             "(omit --reports)")
    try:
        check_folder(reports, "--reports")
    except OutputError as exc:
        fail(str(exc))
    given, size_settings = None, None
    if traces:
        try:
            given, size_settings = _given([p for t in traces for p in (sorted(t.rglob("*.json")) if t.is_dir() else [t])])
        except (TraceError, WitnessError) as exc:
            fail(str(exc))
        if size_settings and not (family.sizes and family.sizes.models(chosen.release)):
            fail(f"--traces: a size witness checks a tree's capture sizes, which the {family.title} replay does not "
                 f"model on vLLM {chosen.release}; {vllm_src} is a {family.title} tree (give it traces)")
    try:
        r = review(tree, chosen, family)
    except PolicyError as exc:
        fail(str(exc))
    say = Terminal(stderr=as_json, highlight=False, soft_wrap=True)
    for line in r.lines(CONFORM):
        say.print(line, markup=False)
    from contract.cli.progress import shown

    try:
        release_policy = load_policy(family.release_policy(release(chosen.release)))
        with shown("conform"):
            run = branch_conform.run(r, family, release_policy, python, chosen.release, corpus, timeout, given,
                                     size_settings=size_settings)
    except (branch_conform.ObserveProblem, EnvironmentProblem) as exc:
        fail(str(exc))
    say.print(f"replayed {len(run.traces)} traces on vLLM {run.version} and on {tree.tree} ({run.selection.why}; the "
              f"base side {'from the cache' if not run.base_replayed else f'replayed now for {run.base_replayed}'}); "
              f"modules taken from the tree: {', '.join(run.tree_modules) or 'none'}", markup=False)
    for note in run.notes:
        say.print(f"note: {note}", markup=False)
    from contract.reports import branch as branch_report

    try:
        with publish(reports) as folder:
            index = reports / branch_report.write(folder, run).relative_to(folder)
    except OutputError as exc:
        fail(str(exc))
    if as_json:
        sys.stdout.write(json.dumps({**run.to_json(), "report": str(index)}, indent=1) + "\n")
    else:
        files = branch_report.witness_files(reports, run)
        d = run.differential
        if not run.exercised:
            say.print(f"NOT EXERCISED: no replayed trace ran any of the tree's {len(run.changed)} change(s): "
                      + ", ".join(run.unexercised) + f" (exit {UNEXERCISED}; --allow-unexercised for 0)", markup=False)
        sizes_new = len(run.sizes.new) if run.sizes else 0
        say.print(f"{d.branch} against {d.base}: {d.summary()}"
                  + (f"; {sizes_new} new capture-size class(es)" if sizes_new else "")
                  + ("" if d.new or sizes_new else " — nothing new")
                  + (" — graphs lost" if d.lost else ""), markup=False)
        if run.exercised and run.unexercised:
            say.print(f"the replay ran {branch_report.exercise_line(run)}: " + ", ".join(run.unexercised),
                      markup=False)
        for key in branch_report.SECTIONS:
            for c in getattr(d, key):
                say.print(f"  {branch_report.LABELS[key]}: [{c.severity_text}] {c.title} — witness {files[(key, c.id)]}",
                          markup=False)
        if run.sizes is not None:
            for line in branch_report.sizes_lines(run.sizes, branch_report.size_witness_files(reports, run.sizes)):
                say.print(line, markup=False)
        if run.changes:
            say.print(f"vLLM's observations differ on {len(run.changes)} step(s)"
                      + (f"; the first {MAX_CHANGES}:" if len(run.changes) > MAX_CHANGES else ":"), markup=False)
            for c in run.changes[:MAX_CHANGES]:
                say.print(_step_line(c), markup=False)
        say.print(f"report: {index}", markup=False)
    code = run.exit_code(allow_lost_graphs)
    raise typer.Exit(UNEXERCISED if code == 0 and not run.exercised and not allow_unexercised else code)
