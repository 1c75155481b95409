"""``cudagraph-contract conform``: replay traces on the installed vLLM and compare with the model.

Exit 0 when every replayed step agrees, 1 on any disagreement, 2 for bad input or environment
(one line naming the problem).
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Optional

import typer

from contract.cli.common import fail, say, timeout_seconds
from contract.core import child
from contract.core.child import DEFAULT_TIMEOUT_S, set_time_limit
from contract.real.installed import EnvironmentProblem, checkout, import_root, replay_settings

CHECKOUT = checkout()  # None for an installed wheel: no tests/traces, no committed reports/
ROOT = CHECKOUT or Path(__file__).resolve().parents[2]
DEFAULT_REPORTS = ROOT / "reports" if CHECKOUT else Path("reports")
CORPORA = ("full", "covering", "none")
RUNNERS = ("auto", "mrv1", "mrv2")


class ConformProblem(Exception):
    """Bad input or environment found where the replay runs (here or in the release's child); one line."""


def _on_ranks(sizes: dict) -> str:
    steps = sizes.get("rank_steps", 0)
    return f" and {steps:,} steps on two DP ranks" if steps else ""


def _class_counts(sizes: dict) -> str:
    by = Counter(c["property"] for c in sizes["classes"])
    return ", ".join(f"{by[p]} {p} class(es)" for p in sorted(by)) or "no class"


def _python_of(vllm: str) -> Path:
    """The interpreter ``--vllm`` names: ``.venv-vllm-VERSION``, a venv folder or a python path."""
    from contract.real.installed import environment, missing

    target = Path(vllm)
    if target.is_dir():
        python = target / "bin" / "python"
    elif target.is_file():
        python = target
    else:
        python = environment(vllm)
        if not python.exists():
            fail(missing(vllm))
    if not python.exists():
        fail(f"--vllm {vllm}: no Python interpreter at {python}")
    return python


def _delegate(vllm: str, options: dict, timeout: float | None) -> dict:
    """The replay run by a child in another interpreter (``contract.core.child``): it returns the
    run's summary, which the parent checks; the child's exit status decides nothing."""
    from contract.cli.progress import shown

    python = _python_of(vllm)
    what = f"the replay under {python}"
    try:
        with shown("conform"):
            value = child.run("contract.cli.conform:replay_in_child", options, what=what, timeout=timeout,
                              python=python, settings=replay_settings(), root=import_root(), stream_stderr=True,
                              progress=True).value
    except (child.ChildProblem, EnvironmentProblem) as exc:
        fail(str(exc))
    if isinstance(value, dict) and isinstance(value.get("problem"), str):
        fail(value["problem"])
    try:
        return _checked(value, Path(options["reports"]), options, vllm if not Path(vllm).exists() else None)
    except ConformProblem as exc:
        fail(f"{what} returned {exc}")


def _checked(value: object, reports: Path, asked: dict, version: str | None) -> dict:
    """A result the child wrote, checked before anything is decided from it: a summary of the run it
    was asked for (``asked``: runner and policy; ``version``: the release, where a version named the
    environment), whose counts agree with its disagreements, and a report that exists in
    ``reports``."""
    if not isinstance(value, dict) or not isinstance(value.get("summary"), dict) or value.get("runner") not in RUNNERS:
        raise ConformProblem("no summary")
    summary = value["summary"]
    counts = ("trace_files", "not_replayed_mrv2", "not_replayed_other", "generated_traces", "steps",
              "agreeing_steps", "disagreeing_traces")
    if not all(type(summary.get(k)) is int and summary[k] >= 0 for k in counts):
        raise ConformProblem("a summary without its counts")
    disagreements = summary.get("disagreements")
    if (not isinstance(disagreements, list) or len(disagreements) != summary["disagreeing_traces"]
            or not all(isinstance(d, dict) and isinstance(d.get("name"), str)
                       and isinstance(d.get("disagreements"), list) and d["disagreements"] for d in disagreements)):
        raise ConformProblem("a summary whose disagreements do not match its counts")
    if summary["agreeing_steps"] > summary["steps"] or (not disagreements and summary["agreeing_steps"] != summary["steps"]):
        raise ConformProblem(f"a summary of {summary['agreeing_steps']} agreeing steps of {summary['steps']} "
                             "with no disagreement")
    for key in ("vllm", "policy", "report"):
        if not isinstance(summary.get(key), str):
            raise ConformProblem(f"a summary without {key}")
    if version is not None and summary["vllm"] != version:
        raise ConformProblem(f"a summary of vLLM {summary['vllm']}, not of vLLM {version} it was asked for")
    if asked.get("runner") not in (None, "auto") and value["runner"] != asked["runner"]:
        raise ConformProblem(f"a summary of {value['runner']}, not of --runner {asked['runner']}")
    if asked.get("policy") and summary["policy"] != asked["policy"]:
        raise ConformProblem(f"a summary compared with policy {summary['policy']}, not --policy {asked['policy']}")
    if not isinstance(summary.get("load_model_block"), dict):
        raise ConformProblem("a summary without load_model_block")
    checks = summary.get("device_checks")
    if checks is not None and not (isinstance(checks, dict) and isinstance(checks.get("failures"), list)):
        raise ConformProblem("device checks without failures")
    sizes = summary.get("capture_sizes")
    if sizes is not None and not (isinstance(sizes, dict) and all(type(sizes.get(k)) is int and sizes[k] >= 0
                                                                 for k in ("settings", "derived", "batches"))
                                  and sizes["derived"] <= sizes["settings"]
                                  and all(isinstance(sizes.get(k), list) for k in ("disagreements", "classes"))):
        raise ConformProblem("a capture-size check without its counts")
    report = Path(summary["report"])
    if not report.is_file() or not report.resolve().is_relative_to(reports.resolve()):
        raise ConformProblem(f"a report {report} that is not a file in {reports}")
    return value


def replay_in_child(options: dict) -> dict:
    """The child's side of ``_delegate``, in the release's interpreter: ``{"problem": one line}`` or
    the result ``_say`` prints."""
    try:
        return _replay(options)
    except ConformProblem as exc:
        return {"problem": str(exc)}


def _trace_paths(traces: list[Path] | None) -> list[Path]:
    from contract.real.corpus import file_traces

    if not traces:
        return file_traces(ROOT) if CHECKOUT else []
    out: list[Path] = []
    for t in traces:
        if t.is_dir():
            out += sorted(t.rglob("*.json"))
        elif t.is_file():
            out.append(t)
        else:
            raise ConformProblem(f"trace {t} does not exist")
    return out


def conform(
    vllm: str = typer.Option("auto", "--vllm", help="auto: the vLLM installed with this Python. A version "
                             "(0.30.0) re-runs in its environment (cudagraph-contract env list); a venv folder or python path re-runs there."),
    traces: Optional[list[Path]] = typer.Option(
        None, "--traces",
        help="A trace file or folder; repeatable. Default: tests/traces, the traces under reports/, and the "
             "generated set. With --vllm-src, a size witness (a branch report's sizes/) checks its setting alone."),
    corpus: Optional[str] = typer.Option(None, "--corpus", help="Generated traces replayed: full (every scenario of "
                                         "the runner; the default for a release), covering (one trace per new "
                                         "observation cell; the default with --vllm-src) or none."),
    reports: Path = typer.Option(DEFAULT_REPORTS, "--reports", show_default="the checkout's reports/" if CHECKOUT
                                 else "reports/ in the current folder", help="Writes conformance/vllm-<version>.md/.json "
                                 "and findings.md here; with --vllm-src, the branch's report (default: a new folder "
                                 "under reports/branch in the cache folder)."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    device: str = typer.Option("cpu-sim", "--device", help="cpu-sim: simulated CUDA graphs on CPU. cuda: real "
                               "CUDA graphs, each replay's output checked against eager (contract/real/device.py)."),
    trust_policy_files: bool = typer.Option(False, "--trust-policy-files", help="Take traces that name a policy "
                                            "file (the comparison runs the installed release's policy, never the file)."),
    verbose: bool = typer.Option(False, "--verbose", help="Show vLLM's own log lines (default: errors only)."),
    runner: str = typer.Option("auto", "--runner", help="mrv1 or mrv2: which model runner to replay. auto: "
                               "vLLM's own default for the release (Model Runner V2 from 0.33, V1 before)."),
    vllm_src: Optional[Path] = typer.Option(None, "--vllm-src", help="A vLLM checkout (or its vllm/ folder): "
                                            "replay its code and the release's it starts from, and report the "
                                            "violation classes vLLM's own code shows new, fixed and inherited."),
    base: Optional[str] = typer.Option(None, "--base", help="With --vllm-src: auto (default: the installed "
                                       "release whose files differ least from the tree's) or a release (0.34.0)."),
    timeout: Optional[float] = typer.Option(None, "--timeout", callback=timeout_seconds, help="Seconds a replay in "
                                            "the release's environment, or a tree's rules, may take (default: 300 "
                                            "with --vllm-src, else none for the replay); 1 to 604800."),
    policy_name: Optional[str] = typer.Option(None, "--policy", help="Compare with this built-in policy instead "
                                              "of the one modelling the release (a negative control)."),
    allow_lost_graphs: bool = typer.Option(False, "--allow-lost-graphs", help="With --vllm-src: exit 0 even where "
                                           "the tree serves fewer dispatches with a CUDA graph than the release."),
    allow_unexercised: bool = typer.Option(False, "--allow-unexercised", help="With --vllm-src: exit 0 rather than 3 "
                                           "when no replayed trace runs any of the tree's changes (they are listed)."),
) -> None:
    """Replay traces on a real vLLM (CPU, simulated CUDA graphs) and compare each step with the model.

    Example: [bold]cudagraph-contract conform --vllm 0.30.0[/] ·
    [bold]cudagraph-contract conform --vllm-src ~/src/vllm --base 0.30.0[/]
    """
    set_time_limit(timeout or DEFAULT_TIMEOUT_S)  # a tree's rules or a policy file, in their child
    if vllm_src is not None:
        from contract.cli.branch import branch_conform_command

        branch_conform_command(vllm_src, base, runner, corpus or "covering",
                               traces, None if reports == DEFAULT_REPORTS else reports, as_json,
                               timeout or DEFAULT_TIMEOUT_S, allow_lost_graphs, allow_unexercised)
    if base is not None:
        fail("--base needs --vllm-src (the branch to compare with the release)")
    corpus = corpus or "full"
    if corpus not in CORPORA:
        fail(f"--corpus must be one of {', '.join(CORPORA)}, got {corpus!r}")
    from contract.real import device as device_mod

    if device not in device_mod.DEVICES:
        fail(f"--device must be one of {', '.join(device_mod.DEVICES)}, got {device!r}")
    if runner not in RUNNERS:
        fail(f"--runner must be one of {', '.join(RUNNERS)}, got {runner!r}")
    from contract.core.output import OutputError, check_folder

    try:
        check_folder(Path(reports), "--reports")
    except OutputError as exc:
        fail(str(exc))
    options = {"traces": [str(Path(t).resolve()) for t in traces or []], "corpus": corpus,
               "reports": str(Path(reports).resolve()), "device": device, "runner": runner, "policy": policy_name,
               "trust_policy_files": trust_policy_files, "verbose": verbose}
    if vllm != "auto":
        result = _delegate(vllm, options, timeout)
    else:
        try:
            result = _replay(options)
        except ConformProblem as exc:
            fail(str(exc))
    _say(result, as_json)


def _replay(options: dict) -> dict:
    """The replay in this interpreter's vLLM: reports written, and the run's summary and runner
    returned; ``ConformProblem`` for bad input or environment."""
    from contract.real import device as device_mod
    from contract.real import logs

    traces = [Path(t) for t in options["traces"]] or None
    reports, device, verbose = Path(options["reports"]), options["device"], options["verbose"]
    try:
        logs.configure(verbose)
    except ValueError as exc:
        raise ConformProblem(str(exc)) from None
    if device == "cuda":
        try:
            device_mod.require_cuda()
        except device_mod.DeviceProblem as exc:
            raise ConformProblem(str(exc)) from None
        device_mod.select("cuda")
    from contract.core.output import OutputError
    from contract.core.policy import PolicyError
    from contract.core.trace import TraceError, load
    from contract.families import check_trusted, for_release, load_policy, policy_for
    from contract.real.installed import EnvironmentProblem, installed_version

    try:
        version = installed_version()
        family = for_release(version, options["runner"])
        policy = load_policy(options["policy"] or policy_for(version, family.name))
    except (EnvironmentProblem, PolicyError) as exc:
        raise ConformProblem(str(exc)) from None
    if policy.runner is not family.runner:
        raise ConformProblem(f"--policy {policy.name} models {policy.runner.value}, not the {family.runner.value} replay")
    files = []
    for path in _trace_paths(traces):
        try:
            trace = load(path)
            check_trusted(trace.policy, str(path), trust_files=options["trust_policy_files"],
                          hint="pass --trust-policy-files to replay it (conform compares with the "
                               "installed release's policy and never runs the file)")
            files.append((trace, str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)))
        except (TraceError, PolicyError) as exc:
            raise ConformProblem(str(exc)) from None
    from contract.cli.progress import shown
    from contract.real.run import ReplayProblem

    try:
        with shown("conform"):
            run = family.conform(version, policy, files, options["corpus"] if not traces else "none")
    except ReplayProblem as exc:
        raise ConformProblem(str(exc)) from None
    from contract.reports import conformance as report

    checks = None
    if device == "cuda":
        device_mod.reconcile(run)
        checks = device_mod.CHECKS.summary()
    from contract.core.output import publish

    try:  # findings.md is built from the conformance/*.json just written into the stage
        with publish(reports) as folder:
            md = Path(reports) / report.write(run, folder).relative_to(folder)
    except OutputError as exc:
        raise ConformProblem(str(exc)) from None
    summary = {**run.summary(), "device": device}
    if checks is not None:
        summary["device_checks"] = checks
    return {"runner": family.name,
            "summary": {**summary, "report": str(md), "disagreements": [r.to_json() for r in run.disagreeing]}}


def _say(result: dict, as_json: bool) -> None:
    """The summary, as JSON or in words, and the exit code it decides: 0 when every step agrees,
    1 on a disagreement (a step, or a setting's capture sizes) or a failed device check."""
    summary = result["summary"]
    checks = summary.get("device_checks")
    if as_json:
        sys.stdout.write(json.dumps(summary, indent=1) + "\n")
    else:
        block, version, policy = summary["load_model_block"], summary["vllm"], summary["policy"]
        if result["runner"] == "mrv2":
            say(f"vLLM {version} (Model Runner V2): compared with policy {policy}; blocks run from {block.get('where')}")
        else:
            say(f"vLLM {version}: compared with policy {policy}; load_model block {block.get('where')}: "
                       + (f"known revision {block['revision']}" if block.get("revision")
                          else f"UNKNOWN revision (sha256 {str(block.get('digest'))[:16]}), compared by version only"))
        say(f"traces: {summary['trace_files']} files ({summary['not_replayed_mrv2']} MRV2 and "
                   f"{summary['not_replayed_other']} others not replayed), {summary['generated_traces']} generated")
        pct = f" ({100 * summary['agreeing_steps'] / summary['steps']:.2f}%)" if summary["steps"] else ""
        say(f"steps: {summary['agreeing_steps']} of {summary['steps']} agree{pct}")
        dp = summary.get("data_parallel")
        if dp:
            say(f"several DP ranks: {dp['traces']} traces, one process per rank joined by gloo; "
                f"{dp['agreeing_rank_steps']} of {dp['rank_steps']} rank-steps agree")
        pp = summary.get("pipeline_parallel")
        if pp:
            say(f"several PP stages: {pp['traces']} traces, one process per stage joined by gloo; "
                f"{pp['agreeing_stage_steps']} of {pp['stage_steps']} stage-steps agree")
        for d in summary["disagreements"]:
            say(f"disagreement: {d['name']}: steps {', '.join(str(x.get('step')) for x in d['disagreements'])}")
        sizes = summary.get("capture_sizes")
        if sizes is not None:
            say(f"capture sizes: {sizes['derived'] - len(sizes['disagreements'])} of {sizes['settings']} settings "
                f"derive the model's lists ({sizes['rejected']} rejected by vLLM and the model alike), "
                f"{sizes['batches']:,} batches dispatched" + _on_ranks(sizes) + f", {_class_counts(sizes)}")
            for d in sizes["disagreements"]:
                say(f"disagreement: capture sizes of {d}")
        if checks is not None:
            say(f"cuda: {checks.get('graphs_captured')} graphs captured, {checks.get('replays_checked')} replays "
                       f"checked against eager, {len(checks['failures'])} device check failures")
        say(f"report: {summary['report']}")
    sized = summary.get("capture_sizes") or {}
    raise typer.Exit(1 if summary["disagreements"] or sized.get("disagreements") or (checks and checks["failures"]) else 0)
