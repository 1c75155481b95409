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

ROOT = Path(__file__).resolve().parents[2]
CORPORA = ("full", "covering", "none")
RUNNERS = ("auto", "mrv1", "mrv2")


def _delegate(vllm: str, argv: list[str]) -> None:
    """Re-run this command under another interpreter: ``.venv-vllm-VERSION`` or a venv/python path."""
    from contract.real.installed import environment

    target = Path(vllm)
    if target.is_dir():
        python = target / "bin" / "python"
    elif target.is_file():
        python = target
    else:
        python = environment(ROOT, vllm)
        if not python.exists():
            fail(f"no environment for vLLM {vllm}: {python.parent.parent} does not exist "
                  f"(make it with conformance-env/make-env.sh {vllm} {python.parent.parent})")
    if not python.exists():
        fail(f"--vllm {vllm}: no Python interpreter at {python}")
    _run_under(python, [str(ROOT)], argv)


def _run_under(python: Path, path: list[str], argv: list[str]) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [*path, os.environ.get("PYTHONPATH")])))
    args = [str(python), "-m", "contract.cli", "conform", "--vllm", "auto", *argv]
    try:
        code = subprocess.run(args, env=env).returncode
    except OSError as exc:
        fail(f"{python} cannot be run: {exc.strerror or exc}")
    raise typer.Exit(code)


def _delegate_source(vllm_src: Path, argv: list[str]) -> None:
    """Re-run under ``.venv-vllm`` (torch and the closure, no vLLM) with the tree first on ``sys.path``,
    so every replayed line is the tree's own; refuse, in one line, a tree that is no vLLM or does
    not import with the pinned closure."""
    from contract.real.installed import shared_environment

    package = vllm_src / "vllm" if (vllm_src / "vllm" / "__init__.py").is_file() else vllm_src
    if not (package / "__init__.py").is_file() or package.name != "vllm":
        fail(f"--vllm-src {vllm_src}: no vllm/ package there; pass a vLLM checkout or its vllm/ folder")
    if not any((package / "v1" / "worker" / rel).is_file() for rel in ("gpu_model_runner.py", "gpu/model_runner.py")):
        fail(f"--vllm-src {vllm_src}: neither Model Runner V1 (vllm/v1/worker/gpu_model_runner.py) nor V2 "
              "(vllm/v1/worker/gpu/model_runner.py) is in this tree")
    python = shared_environment(ROOT)
    if not python.exists():
        fail(f"--vllm-src needs the shared environment {python.parent.parent} (make it with "
              f"conformance-env/make-env.sh base {python.parent.parent})")
    tree = str(package.resolve().parent)
    probe = subprocess.run([str(python), "-c", "import vllm.config, vllm.forward_context"], capture_output=True,
                           text=True, env=dict(os.environ, PYTHONPATH=tree, VLLM_LOGGING_LEVEL="ERROR"))
    if probe.returncode != 0:
        lines = [line for line in probe.stderr.strip().splitlines() if line.strip()]
        fail(f"--vllm-src {vllm_src} does not import with the pinned closure: {lines[-1] if lines else 'exit status ' + str(probe.returncode)}")
    _run_under(python, [tree, str(ROOT)], argv)


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
        return file_traces(ROOT)
    out: list[Path] = []
    for t in traces:
        if t.is_dir():
            out += sorted(t.rglob("*.json"))
        elif t.is_file():
            out.append(t)
        else:
            fail(f"trace {t} does not exist")
    return out


def _branch_conform(vllm_src: Path, base: str, traces, as_json: bool, runner: str) -> None:
    """Exit 0 when vLLM's own code shows no new class on the branch, 1 when it does."""
    from contract.branch import base as base_mod
    from contract.branch import conform as branch_conform
    from contract.branch import tree as branch
    from contract.core.policy import PolicyError
    from contract.core.trace import TraceError, load
    from contract.families import for_release, load_policy, policy_for
    from contract.real import corpus
    from contract.real.installed import EnvironmentProblem, environment

    try:
        version = base if base != "auto" else base_mod.tree_version(vllm_src)
        if version is None:
            fail(f"--base auto: {vllm_src} has no vllm/_version.py; name the release with --base VERSION")
        family = for_release(version, runner)
        tree = branch.load(vllm_src, runner=family.name, as_policy=True)
        release_policy = load_policy(policy_for(version, family.name))
    except (PolicyError, EnvironmentProblem) as exc:
        fail(str(exc))
    python = environment(ROOT, version)
    if not python.exists():
        fail(f"no environment for vLLM {version}: {python.parent.parent} does not exist "
              f"(make it with conformance-env/make-env.sh {version} {python.parent.parent})")
    if traces:
        try:
            chosen = [load(p) for p in _trace_paths(traces)]
        except TraceError as exc:
            fail(str(exc))
    else:
        # one trace per observation cell of either side's model, so both sides' behaviours are replayed
        chosen, seen = [], set()
        for policy in (release_policy, tree.policy):
            for t in corpus.select(family.corpus(policy)):
                if t.scenario not in seen:
                    seen.add(t.scenario)
                    chosen.append(t)
    for i, t in enumerate(chosen):
        t.name = t.name or f"trace-{i}"
    try:
        base_obs = branch_conform.observe(python, ROOT, chosen, None, family.name)
        branch_obs = branch_conform.observe(python, ROOT, chosen, vllm_src, family.name)
    except branch_conform.ObserveProblem as exc:
        fail(str(exc))
    label = f"{Path(vllm_src).resolve().name} on vLLM {version}"
    d = branch_conform.compare(chosen, base_obs, branch_obs, label, f"vLLM {version}", family)
    if as_json:
        sys.stdout.write(json.dumps({**d.to_json(), "traces": len(chosen),
                                     "tree_modules": branch_obs["tree_modules"]}, indent=1) + "\n")
    else:
        from rich.console import Console

        from contract.cli.diffview import print_differential

        typer.echo(f"replayed {len(chosen)} traces on vLLM {version} and on {vllm_src} "
                   f"(its modules that differ: {', '.join(branch_obs['tree_modules']) or 'none'})")
        print_differential(Console(highlight=False, soft_wrap=True), d)
    raise typer.Exit(1 if d.new else 0)


def conform(
    vllm: str = typer.Option("auto", "--vllm", help="auto: the vLLM installed with this Python. A version "
                             "(0.30.0) re-runs under .venv-vllm-VERSION; a venv folder or python path re-runs there."),
    traces: Optional[list[Path]] = typer.Option(
        None, "--traces",
        help="A trace file or folder; repeatable. Default: tests/traces, the traces under reports/, and the "
             "generated set."),
    corpus: str = typer.Option("full", "--corpus", help="Generated traces replayed with the default corpus: "
                               "full (every MRV1 scenario), covering (one trace per new observation cell) or none."),
    reports: Path = typer.Option(ROOT / "reports", "--reports", help="Writes conformance/vllm-<version>.md/.json "
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
                                            "replay on the tree's own code over the shared closure (.venv-vllm); "
                                            "with --base, replay on the tree and on the release and report the "
                                            "violation classes vLLM's own code shows new, fixed and inherited."),
    base: Optional[str] = typer.Option(None, "--base", help="With --vllm-src: the release it starts from "
                                       "(0.30.0; .venv-vllm-VERSION must exist), or auto (the tree's version)."),
    policy_name: Optional[str] = typer.Option(None, "--policy", help="Compare with this built-in policy instead "
                                              "of the one modelling the release (a negative control)."),
) -> None:
    """Replay traces on a real vLLM (CPU, simulated CUDA graphs) and compare each step with the model.

    Example: [bold]cudagraph-contract conform --vllm 0.30.0[/] ·
    [bold]cudagraph-contract conform --vllm-src ~/src/vllm --base 0.30.0[/]
    """
    if vllm_src is not None and base is not None:
        _branch_conform(vllm_src, base, traces, as_json, runner)
    if base is not None:
        fail("--base needs --vllm-src (the branch to compare with the release)")
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
    if vllm_src is not None:
        _delegate_source(vllm_src, forwarded)
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
        from contract.real import simcuda

        simcuda.DEVICE = "cuda"
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
    from contract.real.run import ReplayProblem

    try:
        run = family.conform(version, policy, files, corpus if not traces else "none")
    except ReplayProblem as exc:
        fail(str(exc))
    from contract.reports import conformance as report

    checks = None
    if device == "cuda":
        device_mod.reconcile(run)
        checks = device_mod.CHECKS.summary()
    try:  # not one transaction: findings.md is built from the conformance/*.json just written
        md = report.write(run, Path(reports))
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
