"""The installed real-vLLM environments the evidence tests run in; skipped without them, failed
when ``CONTRACT_REQUIRE_VLLM=1``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from contract.evidence import since

ROOT = Path(__file__).resolve().parents[1]


def unavailable(message: str):
    """A release the test needs is not at hand: skipped, or failed when ``CONTRACT_REQUIRE_VLLM=1``."""
    if os.environ.get("CONTRACT_REQUIRE_VLLM") == "1":
        pytest.fail(message)
    pytest.skip(message)


def require(release: str) -> Path:
    """The release's venv folder."""
    venv = ROOT / f".venv-vllm-{release}"
    if not (venv / "bin" / "python").exists() or not (venv / ".complete").exists():
        unavailable(f".venv-vllm-{release} is missing: make it with make .venv-vllm-{release}/.complete")
    return venv


def installed(release: str) -> Path:
    """The ``vllm`` package of the release's venv, for a test that runs it."""
    return next(require(release).glob("lib/python*/site-packages/vllm"))


def edited_tree(tmp_path: Path, release: str, rel: str, old: str, new: str) -> Path:
    """An unpacked release (links to the installed files) whose file ``rel`` (under ``vllm/``) has its
    one ``old`` replaced by ``new``: a reviewer's edited tree."""
    import subprocess

    tree = tmp_path / "tree"
    tree.mkdir(parents=True)
    subprocess.run(["cp", "-as", str(installed(release).resolve()), str(tree / "vllm")], check=True,
                   capture_output=True)
    target = tree / "vllm" / rel
    text = target.read_text()
    assert text.count(old) == 1, old
    target.unlink()
    target.write_text(text.replace(old, new))
    return tree


def conform_tree(tree: Path, trace, tmp_path: Path, base: str = "0.34.0") -> dict:
    """``conform --vllm-src TREE --base BASE`` on one trace (a ``Trace``), as a reviewer runs it: its
    JSON summary, once it has exited 1 (a new class) within a bounded time."""
    import json
    import subprocess
    import sys
    import time

    path = tmp_path / f"{trace.name}.json"
    path.write_text(trace.dumps())
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "contract.cli", "conform", "--vllm-src", str(tree), "--base", base,
                           "--traces", str(path), "--reports", str(tmp_path / "r"), "--json"],
                          capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env={**os.environ, "CUDAGRAPH_CONTRACT_CACHE": str(tmp_path / "cache")})
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert time.monotonic() - started < 300  # a rank or stage left waiting times out, never hangs the run
    return json.loads(done.stdout[done.stdout.index("{"):])


def release_source(release: str) -> Path:
    """The release's ``vllm`` source, for a test that only reads it: its venv's package, or
    ``$CONTRACT_VLLM_SOURCES/<release>/vllm`` (``make test`` unpacks the releases it reads but does not
    run); skipped without either, failed when ``CONTRACT_REQUIRE_VLLM=1``."""
    found = since.sources(ROOT).get(release)
    if found is None:
        unavailable(f"no source for vLLM {release}: make .venv-vllm-{release}/.complete or set {since.ENV}")
    return found


def run_env(**extra: str) -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_LOGGING_LEVEL": "ERROR", **extra}


def venv_python(release: str) -> Path | None:
    python = ROOT / f".venv-vllm-{release}" / "bin" / "python"
    return python if python.exists() else None


def require_python(release: str) -> Path:
    """The release's Python; the test skips without it, or fails when ``CONTRACT_REQUIRE_VLLM=1``."""
    return require(release) / "bin" / "python"


def shared_jobs(tmp_path_factory, folder: str, versions, commands, timeout: int, env=None):
    """A module's subprocesses, ``commands(version, python, reports) -> {name: argv}``. Run alone,
    pytest starts them all at once (one core each while they last); under pytest-xdist a job runs
    when a test first needs it, once for all workers (a file lock in the workers' shared temporary
    folder). The modules using it are one xdist group each, so a worker never waits for another's
    job. Yields ``result(name, version) -> (rc, stdout, stderr, reports folder)``."""
    import fcntl
    import json
    import subprocess

    worker = os.environ.get("PYTEST_XDIST_WORKER")
    shared = tmp_path_factory.getbasetemp()
    shared = (shared.parent if worker else shared) / folder
    shared.mkdir(parents=True, exist_ok=True)
    started: dict[tuple[str, str], subprocess.Popen] = {}

    def start(name: str, version: str) -> subprocess.Popen:
        argv = commands(version, venv_python(version), shared / f"reports-{version}")[name]
        return subprocess.Popen([str(a) for a in argv], cwd=ROOT, env=env or run_env(), text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    if not worker:
        for version in versions:
            if venv_python(version) is not None:
                for name in commands(version, Path(), Path()):
                    started[(name, version)] = start(name, version)

    def result(name: str, version: str):
        require(version)
        done = shared / f"{name}-{version}.json"
        with open(shared / f"{name}-{version}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not done.exists():
                proc = started.pop((name, version), None) or start(name, version)
                out, err = proc.communicate(timeout=timeout)
                done.write_text(json.dumps([proc.returncode, out, err]))
        rc, out, err = json.loads(done.read_text())
        return rc, out, err, shared / f"reports-{version}"

    yield result
    for proc in started.values():
        if proc.poll() is None:
            proc.kill()


def per_kind(values, kept, ids=None) -> list:
    """Parameters of a check: the ``kept`` values (none, for a check on the older releases only) run in
    ``make test``, the others carry the ``evidence`` mark (``make evidence``, which CI runs after
    ``make test``; docs/measurements.md). A tuple is one parameter set."""
    ids = ids or (lambda v: "-".join(map(str, v)) if isinstance(v, tuple) else str(v))
    return [pytest.param(*(v if isinstance(v, tuple) else (v,)), marks=() if v in kept else pytest.mark.evidence,
                         id=ids(v)) for v in values]


def selected(request, name: str) -> set:
    """The values of parameter ``name`` the session's items of the requesting module use."""
    return {item.callspec.params[name] for item in request.session.items
            if item.module is request.module and hasattr(item, "callspec") and name in item.callspec.params}
