"""Every foreseeable bad input: one line on stderr, exit 2, no traceback, and no file changed.

Each case builds its input in a fresh folder and runs the command through the entry point
(``contract.cli.main``, so usage errors are covered too); the folder is compared byte for byte
before and after. A full disk and a read-only file system are injected (``OSError`` ENOSPC,
EROFS from the file layer); every other input is real. Traces are data: a trace that names a
policy file never runs it unless the person says so, shown with a file that leaves a marker.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from contract.core import output
from contract.cli import main

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "tests" / "traces" / "lead3-drafter-capture-outside-window.json"
NESTED = ROOT / "tests" / "traces" / "v030-nested-full-over-breakable.json"
MARKER = "ran.marker"


@dataclass
class Case:
    argv: list[str]
    needle: str
    fault: str | None = None  # "enospc" on the nth file written, "erofs" on every file
    nth: int = 1
    env: dict = field(default_factory=dict)
    subprocess_site: bool = False  # run as a subprocess with vLLM's metadata (no vLLM code) installed


def trace_file(folder: Path, name: str = "t.json", source: Path = TRACE, **changes) -> Path:
    data = json.loads(source.read_text())
    data.update(changes)
    path = folder / name
    path.write_text(json.dumps(data))
    return path


def evil_policy(folder: Path) -> Path:
    """A policy file whose import leaves a marker: it ran if the marker exists."""
    path = folder / "evil.py"
    path.write_text(f"open({str(folder / MARKER)!r}, 'w').write('ran')\n"
                    "from contract.runners.mrv1.model.policies.vllm_0_30 import load_model\n")
    return path


def old_reports(folder: Path) -> Path:
    """An output folder holding earlier results, which a failed run must leave as they are."""
    out = folder / "out"
    out.mkdir()
    (out / "README.md").write_text("earlier report\n")
    (out / "vllm_0_30-P1.json").write_text(TRACE.read_text())
    return out


def vllm_tree(folder: Path, runner: str | None) -> Path:
    pkg = folder / "tree" / "vllm"
    (pkg / "v1" / "worker").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    if runner is not None:
        (pkg / "v1" / "worker" / "gpu_model_runner.py").write_text(runner)
    return pkg.parent


def fake_vllm(folder: Path, version: str = "0.30.0") -> Path:
    info = folder / "site" / f"vllm-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    return info.parent


def nested(levels: int) -> dict:
    value: dict = {"a": 1}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


def write(path: Path, data: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.write_bytes if isinstance(data, bytes) else path.write_text)(data)
    return path


def executable(path: Path, text: str) -> Path:
    write(path, text).chmod(0o755)
    return path


def folder(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


LONG = "x" * 300
EXPLORE = ["explore", "--policy", "vllm_0_30", "--depth", "6", "--out"]

# name -> a function of the case's folder building the input and returning the Case.
CASES = {
    # traces name code; a person has to name it to run it
    "replay: trace names a policy file": lambda t: Case(
        ["replay", trace_file(t, policy=str(evil_policy(t)))], "names the policy file"),
    "verify: --policy is a trace naming a policy file": lambda t: Case(
        ["verify", "--policy", trace_file(t, policy=str(evil_policy(t)))], f"pass --policy {t / 'evil.py'} to run it"),
    "explore: --policy is a trace naming a policy file": lambda t: Case(
        ["explore", "--policy", trace_file(t, policy=str(evil_policy(t)))], "names the policy file"),
    "conform: trace names a policy file": lambda t: Case(
        ["conform", "--traces", trace_file(t, source=NESTED, policy=str(evil_policy(t))), "--reports", old_reports(t)],
        "pass --trust-policy-files", subprocess_site=True),
    "verify: --policy is a trace of a built-in policy": lambda t: Case(
        ["verify", "--policy", trace_file(t)], "is a trace, not a policy"),
    # trace files
    "JSON nested 100,000 levels": lambda t: Case(
        ["replay", write(t / "deep.json", "[" * 100_000 + "]" * 100_000)], "nested more than 16 levels deep"),
    "JSON nested 20 levels": lambda t: Case(["replay", trace_file(t, origin=nested(20))], "nested more than 16 levels deep"),
    "a 5,000-digit number": lambda t: Case(
        ["replay", write(t / "n.json", TRACE.read_text().rstrip()[:-1] + ', "x": ' + "9" * 5000 + "}")],
        "Exceeds the limit (4300 digits)"),
    "trace is a folder": lambda t: Case(["replay", folder(t / "t.json")], "is a folder"),
    "trace is a device": lambda t: Case(["replay", "/dev/null"], "not a regular file"),
    "trace name too long": lambda t: Case(["replay", t / (LONG + ".json")], "cannot be read"),
    "empty trace": lambda t: Case(["replay", write(t / "t.json", "")], "is not valid JSON"),
    "binary trace": lambda t: Case(["replay", write(t / "t.json", b"\xff\xfe\x00{" * 10)], "not UTF-8"),
    "trace is a JSON list": lambda t: Case(["replay", write(t / "t.json", "[1, 2]")], "a trace is a JSON object"),
    "policy field not a string": lambda t: Case(["replay", trace_file(t, policy=["vllm_0_30"])], "must be a string"),
    "policy field unknown": lambda t: Case(["replay", trace_file(t, policy="vllm_9")], "unknown policy 'vllm_9'"),
    "policy field with a line break": lambda t: Case(["replay", trace_file(t, policy="a\nb.py")], "file a\\nb.py;"),
    "replay --update on a full disk": lambda t: Case(
        ["replay", trace_file(t), "--update"], "No space left on device", fault="enospc"),
    # policy files and vLLM trees
    "policy file is a folder": lambda t: Case(["verify", "--policy", folder(t / "p.py")], "is a folder"),
    "policy file name too long": lambda t: Case(["verify", "--policy", t / (LONG + ".py")], "cannot be opened"),
    "policy file exits 0 at import": lambda t: Case(
        ["verify", "--policy", write(t / "p.py", "import os\nos._exit(0)\n"), "--out", old_reports(t)],
        "exited with status 0 before reporting a result"),
    "policy file whose load_model returns None": lambda t: Case(
        ["explore", "--policy", write(t / "p.py", "def load_model(ctx):\n    return None\n")], "returned None, not Stacks"),
    "policy file named like a built-in policy": lambda t: Case(
        ["explore", "--policy", "vllm_0_30", "--policy", write(t / "vllm_0_30.py", f"open({str(t / MARKER)!r}, 'w')\n")],
        "has the name of the built-in policy vllm_0_30; rename the file or pass only one of them"),
    "--vllm-src is not vLLM": lambda t: Case(["verify", "--vllm-src", "/etc"], "is not a vLLM source tree"),
    "--vllm-src does not exist": lambda t: Case(["verify", "--vllm-src", t / "nowhere"], "does not exist"),
    "--vllm-src is a file": lambda t: Case(["verify", "--vllm-src", write(t / "f", "x")], "is a file"),
    "--vllm-src without Model Runner V1": lambda t: Case(
        ["verify", "--vllm-src", vllm_tree(t, None)], "is neither Model Runner V1 nor V2"),
    "--vllm-src runner is not Python": lambda t: Case(["verify", "--vllm-src", vllm_tree(t, "def (:\n")],
                                                      "cannot be parsed"),
    # output folders: checked before the work, written all together or not at all
    "report --out is a file": lambda t: Case(["report", "--out", write(t / "f", "x")], "is a file, not a folder"),
    "report --out under /proc": lambda t: Case(["report", "--out", "/proc/cudagraph-contract/r"], "cannot be written"),
    "report --out under /sys": lambda t: Case(["report", "--out", "/sys/cudagraph-contract"], "cannot be written"),
    "verify --out is a file": lambda t: Case(["verify", "--policy", "vllm_0_30", "--out", write(t / "f", "x")],
                                             "is a file"),
    "explore --out under a file": lambda t: Case(EXPLORE + [write(t / "f", "x") / "sub"], "is a file"),
    "explore --out on a read-only file system": lambda t: Case(
        EXPLORE + [old_reports(t)], "Read-only file system", fault="erofs"),
    "explore --out, disk full at the second file": lambda t: Case(
        EXPLORE + [old_reports(t)], "No space left on device", fault="enospc", nth=2),
    "explore --out, a folder where a file goes": lambda t: Case(
        EXPLORE + [folder(old_reports(t) / "vllm_0_30-P4.json").parent], "it is a folder"),
    "conform --reports is a file": lambda t: Case(["conform", "--reports", write(t / "f", "x")], "is a file"),
    "conform --reports under /proc": lambda t: Case(["conform", "--reports", "/proc/x/y"], "cannot be written"),
    "conform --vllm is not a Python": lambda t: Case(["conform", "--vllm", write(t / "f", "x")], "cannot be run"),
    "conform --vllm Python that exits 0": lambda t: Case(
        ["conform", "--vllm", executable(t / "python", "#!/bin/sh\nexit 0\n"), "--reports", old_reports(t)],
        "exited with status 0 before reporting a result"),
    "conform --vllm folder without Python": lambda t: Case(["conform", "--vllm", folder(t / "env")],
                                                           "no Python interpreter"),
    "conform --traces folder with a deep file": lambda t: Case(
        ["conform", "--traces", write(t / "traces" / "deep.json", '{"a":' * 5000 + "1" + "}" * 5000),
         "--reports", old_reports(t)], "nested more than 16", subprocess_site=True),
    "conform --verbose with a bad VLLM_LOGGING_LEVEL": lambda t: Case(
        ["conform", "--verbose", "--reports", old_reports(t)], "is not a logging level",
        env={"VLLM_LOGGING_LEVEL": "LOUD"}),
    # usage
    "unknown command": lambda t: Case(["verfy"], "No such command 'verfy'"),
    "option value out of range": lambda t: Case(["explore", "--depth", "0"], "Invalid value for '--depth'"),
    "option value of the wrong type": lambda t: Case(["verify", "--seed", "seven"], "Invalid value for '--seed'"),
    "missing argument": lambda t: Case(["replay"], "Missing argument"),
}


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else "folder"
            for p in sorted(folder.rglob("*"))}


def inject(monkeypatch, fault: str, nth: int) -> None:
    """The file layer fails like a full disk (half the text written, then ENOSPC, on the nth file)
    or a read-only file system (EROFS for every new file)."""
    real_fdopen, real_mkstemp, opened = os.fdopen, output.tempfile.mkstemp, []

    def mkstemp(*args, **kwargs):
        if fault == "erofs":
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        return real_mkstemp(*args, **kwargs)

    class Full:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, text):
            self.f.write(text[: len(text) // 2])
            self.f.flush()
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def fdopen(fd, *args, **kwargs):
        opened.append(fd)
        f = real_fdopen(fd, *args, **kwargs)
        return Full(f) if fault == "enospc" and len(opened) == nth else f

    monkeypatch.setattr(output.tempfile, "mkstemp", mkstemp)
    monkeypatch.setattr(output.os, "fdopen", fdopen)


def run(case: Case, t: Path, capsys, monkeypatch) -> tuple[int, str, str]:
    argv = [str(a) for a in case.argv]
    if case.subprocess_site:
        site = fake_vllm(t.parent / f"{t.name}-site")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]), **case.env}
        proc = subprocess.run([sys.executable, "-m", "contract.cli", *argv], cwd=ROOT, env=env, text=True,
                              capture_output=True, timeout=120)
        return proc.returncode, proc.stdout, proc.stderr
    for key in ("VLLM_LOGGING_LEVEL", "VLLM_LOGGING_STREAM"):  # restored after the test
        monkeypatch.delenv(key, raising=False)
    for key, value in case.env.items():
        monkeypatch.setenv(key, value)
    if case.fault:
        inject(monkeypatch, case.fault, case.nth)
    with pytest.raises(SystemExit) as stop:
        main(argv)
    captured = capsys.readouterr()
    return stop.value.code, captured.out, captured.err


def test_at_least_thirty_bad_inputs():
    assert len(CASES) >= 30


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_is_one_line_and_exit_2(name, tmp_path, capsys, monkeypatch):
    t = tmp_path / "case"
    t.mkdir()
    case = CASES[name](t)
    before = snapshot(t)
    code, out, err = run(case, t, capsys, monkeypatch)
    lines = err.strip().splitlines()
    assert code == 2, (out, err)
    assert "Traceback" not in out + err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert case.needle in lines[0], lines[0]
    assert snapshot(t) == before, "a file changed, appeared or vanished"
    assert not (t / MARKER).exists()


def test_the_marker_shows_a_run_policy_file(tmp_path):
    """The control: the same trace and file, when the person names the file, do run it."""
    evil = evil_policy(tmp_path)
    trace = trace_file(tmp_path, policy=str(evil))
    for argv in (["replay", trace, "--trust-policy-files"], ["replay", trace, "--policy", evil],
                 ["explore", "--policy", evil, "--depth", "2", "--quiet"]):
        (tmp_path / MARKER).unlink(missing_ok=True)
        with pytest.raises(SystemExit):
            main([str(a) for a in argv])
        assert (tmp_path / MARKER).exists(), argv
