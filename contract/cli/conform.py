"""``cudagraph-contract conform``: replay traces on the installed vLLM and compare with the model.

Exit 0 when every replayed step agrees, 1 on any disagreement, 2 for bad input or environment
(one line naming the problem).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

import typer

from contract.cli.common import fail
from contract.core.child import DEFAULT_TIMEOUT_S
from contract.real.installed import checkout

CHECKOUT = checkout()  # None for an installed wheel: no tests/traces, no committed reports/
ROOT = CHECKOUT or Path(__file__).resolve().parents[2]
DEFAULT_REPORTS = ROOT / "reports" if CHECKOUT else Path("reports")
CORPORA = ("full", "covering", "none")
RUNNERS = ("auto", "mrv1", "mrv2")


def _delegate(vllm: str, argv: list[str]) -> None:
    """Re-run this command under another interpreter: ``.venv-vllm-VERSION`` or a venv/python path."""
    from contract.real.installed import EnvironmentProblem, environment, import_root, missing

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
    try:
        _run_under(python, [str(import_root())], argv)
    except EnvironmentProblem as exc:
        fail(str(exc))


def _run_under(python: Path, path: list[str], argv: list[str]) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [*path, os.environ.get("PYTHONPATH")])))
    args = [str(python), "-m", "contract.cli", "conform", "--vllm", "auto", *argv]
    try:
        code = subprocess.run(args, env=env).returncode
    except OSError as exc:
        fail(f"{python} cannot be run: {exc.strerror or exc}")
    raise typer.Exit(code)


def _forwarded_args(traces, corpus, reports, as_json, device="cpu-sim", runner="auto", policy=None,
                    trust=False, verbose=False) -> list[str]:
    argv = ["--device", device, "--runner", runner] + (["--policy", policy] if policy else [])
    for t in traces or []:
        argv += ["--traces", str(Path(t).resolve())]
    argv += ["--corpus", corpus, "--reports", str(Path(reports).resolve())]
    return (argv + (["--json"] if as_json else []) + (["--trust-policy-files"] if trust else [])
            + (["--verbose"] if verbose else []))


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
            fail(f"trace {t} does not exist")
    return out


def conform(
    vllm: str = typer.Option("auto", "--vllm", help="auto: the vLLM installed with this Python. A version "
                             "(0.30.0) re-runs in its environment (cudagraph-contract env list); a venv folder or python path re-runs there."),
    traces: Optional[list[Path]] = typer.Option(
        None, "--traces",
        help="A trace file or folder; repeatable. Default: tests/traces, the traces under reports/, and the "
             "generated set."),
    corpus: Optional[str] = typer.Option(None, "--corpus", help="Generated traces replayed: full (every scenario of "
                                         "the runner; the default for a release), covering (one trace per new "
                                         "observation cell; the default with --vllm-src) or none."),
    reports: Path = typer.Option(DEFAULT_REPORTS, "--reports", show_default="the checkout's reports/" if CHECKOUT
                                 else "reports/ in the current folder", help="Writes conformance/vllm-<version>.md/.json "
                                 "and findings.md here."),
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
    timeout: Optional[float] = typer.Option(None, "--timeout", min=1, help="Seconds a replay in the release's "
                                            "environment may take (default: 300 with --vllm-src, else none)."),
    policy_name: Optional[str] = typer.Option(None, "--policy", help="Compare with this built-in policy instead "
                                              "of the one modelling the release (a negative control)."),
    allow_lost_graphs: bool = typer.Option(False, "--allow-lost-graphs", help="With --vllm-src: exit 0 even where "
                                           "the tree serves fewer dispatches with a CUDA graph than the release."),
) -> None:
    """Replay traces on a real vLLM (CPU, simulated CUDA graphs) and compare each step with the model.

    Example: [bold]cudagraph-contract conform --vllm 0.30.0[/] ·
    [bold]cudagraph-contract conform --vllm-src ~/src/vllm --base 0.30.0[/]
    """
    if vllm_src is not None:
        from contract.cli.branch import branch_conform_command

        branch_conform_command(vllm_src, base, runner, corpus or "covering",
                               traces, None if reports == DEFAULT_REPORTS else reports, as_json,
                               timeout or DEFAULT_TIMEOUT_S, allow_lost_graphs)
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
    forwarded = _forwarded_args(traces, corpus, reports, as_json, device, runner, policy_name,
                                trust_policy_files, verbose)
    if vllm != "auto":
        _delegate(vllm, forwarded)
    from contract.real import logs

    try:
        logs.configure(verbose)
    except ValueError as exc:
        fail(str(exc))
    if device == "cuda":
        try:
            device_mod.require_cuda()
        except device_mod.DeviceProblem as exc:
            fail(str(exc))
        device_mod.select("cuda")
    from contract.core.policy import PolicyError
    from contract.core.scenario import Runner
    from contract.core.trace import TraceError, load
    from contract.families import check_trusted, for_release, load_policy, policy_for
    from contract.real.installed import EnvironmentProblem, installed_version

    try:
        version = installed_version()
        family = for_release(version, runner)
        policy = load_policy(policy_name or policy_for(version, family.name))
    except (EnvironmentProblem, PolicyError) as exc:
        fail(str(exc))
    if policy.runner is not family.runner:
        fail(f"--policy {policy.name} models {policy.runner.value}, not the {family.runner.value} replay")
    files = []
    for path in _trace_paths(traces):
        try:
            trace = load(path)
            check_trusted(trace.policy, str(path), trust_files=trust_policy_files,
                          hint="pass --trust-policy-files to replay it (conform compares with the "
                               "installed release's policy and never runs the file)")
            files.append((trace, str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)))
        except (TraceError, PolicyError) as exc:
            fail(str(exc))
    from contract.cli.progress import shown
    from contract.real.run import ReplayProblem

    try:
        with shown("conform"):
            run = family.conform(version, policy, files, corpus if not traces else "none")
    except ReplayProblem as exc:
        fail(str(exc))
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
        fail(str(exc))
    summary = {**run.summary(), "device": device}
    if checks is not None:
        summary["device_checks"] = checks
    if as_json:
        sys.stdout.write(json.dumps({**summary, "report": str(md),
                                     "disagreements": [r.to_json() for r in run.disagreeing]}, indent=1) + "\n")
    else:
        block = run.block
        if family.runner is Runner.MRV2:
            typer.echo(f"vLLM {version} (Model Runner V2): compared with policy {policy.name}; blocks run from {block['where']}")
        else:
            typer.echo(f"vLLM {version}: compared with policy {policy.name}; load_model block {block['where']}: "
                       + (f"known revision {block['revision']}" if block["revision"]
                          else f"UNKNOWN revision (sha256 {block['digest'][:16]}), compared by version only"))
        typer.echo(f"traces: {summary['trace_files']} files ({summary['not_replayed_mrv2']} MRV2 and "
                   f"{summary['not_replayed_other']} others not replayed), {summary['generated_traces']} generated")
        pct = f" ({100 * summary['agreement']:.2f}%)" if summary["steps"] else ""
        typer.echo(f"steps: {summary['agreeing_steps']} of {summary['steps']} agree{pct}")
        for r in run.disagreeing:
            typer.echo(f"disagreement: {r.name}: steps {', '.join(str(d.index) for d in r.diffs)}")
        if checks is not None:
            typer.echo(f"cuda: {checks['graphs_captured']} graphs captured, {checks['replays_checked']} replays "
                       f"checked against eager, {len(checks['failures'])} device check failures")
        typer.echo(f"report: {md}")
    raise typer.Exit(1 if run.disagreeing or (checks and checks["failures"]) else 0)
