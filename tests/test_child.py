"""``contract.core.child``: named code runs in a child whose only way to report is a validated result.

Every way a child can end without reporting (an exit, ``os._exit(0)``, a hang, a signal, a fork that
tries to report or lingers, a value that is not JSON) is a ``ChildProblem`` with one line; a parent
killed by SIGTERM or SIGKILL takes its child with it, and one ended by SIGTERM, SIGINT or SIGHUP
removes the call's folder. The targets are in ``tests/child_targets.py``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from contract.core import child
from users import unprivileged

ROOT = Path(__file__).resolve().parents[1]
T = "tests.child_targets:"


def run(name: str, payload=None, **kwargs) -> child.Outcome:
    return child.run(T + name, payload, what="the probe", cwd=str(ROOT), **kwargs)


def problem(name: str, payload=None, **kwargs) -> str:
    with pytest.raises(child.ChildProblem) as caught:
        run(name, payload, **kwargs)
    message = str(caught.value)
    assert "\n" not in message and message.startswith("the probe"), message
    return message


def gone(pid: int) -> bool:
    """No such process, or a zombie no one has reaped yet (it runs nothing)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def wait_for(path: Path, seconds: float = 30) -> int:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return int(path.read_text())
        time.sleep(0.02)
    raise AssertionError(f"{path} was never written")


def wait_gone(pid: int, seconds: float = 15) -> bool:  # a loaded 2-core machine takes seconds
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if gone(pid):
            return True
        time.sleep(0.05)
    return gone(pid)


def test_a_value_comes_back_and_the_output_stays_apart():
    outcome = run("prints")
    assert outcome.value == 1
    assert outcome.stdout == "to stdout\n" and outcome.stderr == "to stderr\n"
    assert run("echo", {"a": [1, "b", None]}).value == {"a": [1, "b", None]}


def test_what_the_child_leaves_in_the_temporary_folder_goes_with_the_run(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    left = Path(run("leave_a_temporary_folder").value)
    assert not left.exists() and not list(tmp_path.glob("left-behind-*"))


@pytest.mark.parametrize("status", [0, 3])
def test_an_exit_without_a_result(status):
    assert f"exited with status {status} before reporting a result" in problem("exit_now", {"status": status})


def test_a_hang_is_stopped_at_the_timeout(tmp_path):
    pidfile = tmp_path / "pid"
    started = time.monotonic()
    message = problem("write_pid_and_hang", {"pidfile": str(pidfile)}, timeout=1)
    assert "did not finish within 1 s; pass --timeout to allow more" in message
    assert time.monotonic() - started < 10
    assert wait_gone(wait_for(pidfile))


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGSEGV", "SIGTERM"])
def test_killed_by_a_signal(sig):
    assert problem("kill_self", {"signal": sig}).endswith(f"was killed by {sig}")


def test_a_forked_copy_cannot_report_and_does_not_outlive_the_run(tmp_path):
    pidfile = tmp_path / "pid"
    started = time.monotonic()
    assert run("fork", {"pidfile": str(pidfile), "linger": True}).value == "the original"
    # The run ends when the child does, not when the lingering copy would.
    assert time.monotonic() - started < 10
    assert wait_gone(wait_for(pidfile))


def test_a_forked_copy_that_returns_first_is_not_the_result(tmp_path):
    for _ in range(3):
        assert run("fork", {"pidfile": str(tmp_path / "pid")}).value == "the original"


def test_refuse_forks_ends_the_copy_and_says_so(tmp_path):
    assert run("refused_fork", {"marker": str(tmp_path / "marker")}).value == {"forked": True}
    assert not (tmp_path / "marker").exists()


@pytest.mark.parametrize("kind", ["set", "nan"])
def test_a_value_that_is_not_json(kind):
    assert "the result is not JSON" in problem("not_json", kind)


def test_a_value_nested_too_deep_for_json():
    assert "the result is not JSON: RecursionError" in problem("deep")


def test_an_exception_is_its_first_line():
    assert problem("raises").endswith("the probe: ValueError: line one")


def test_only_the_projects_functions_run():
    with pytest.raises(child.ChildProblem, match="only the project's own functions"):
        child.run("os:getcwd", None, what="x")


def test_an_interpreter_that_cannot_run(tmp_path):
    script = tmp_path / "python"
    script.write_text("not a program\n")
    with pytest.raises(child.ChildProblem, match="cannot be run: Permission denied"):
        child.run(T + "echo", 1, what="x", python=script)
    script.chmod(0o755)
    with pytest.raises(child.ChildProblem, match="cannot be run: Exec format error"):
        child.run(T + "echo", 1, what="x", python=script)


def test_a_foreign_interpreter_that_exits_0_is_no_pass(tmp_path):
    script = tmp_path / "python"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o755)
    with pytest.raises(child.ChildProblem, match="exited with status 0 before reporting a result"):
        child.run(T + "echo", 1, what="x", python=script)


PARENT = """
import sys
from contract.core import child
child.run("tests.child_targets:write_pid_and_hang", {"pidfile": sys.argv[1]}, what="the probe", timeout=120)
"""


def _signals_by_default():
    """A parent started from a non-interactive shell's background job inherits SIGINT ignored, and
    ignored it stays (as under ``nohup``): the probe's parent gets the default dispositions."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL, signal.SIGINT, signal.SIGHUP])
def test_the_child_dies_with_its_parent(tmp_path, sig):
    pidfile, temporary = tmp_path / "pid", tmp_path / "tmp"
    temporary.mkdir()
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(pidfile)], cwd=ROOT,
                              env=dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=str(temporary)), preexec_fn=_signals_by_default,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        pid = wait_for(pidfile)
        assert not gone(pid)
        parent.send_signal(sig)
        parent.wait(timeout=30)
        assert wait_gone(pid), f"the child {pid} outlived its parent killed by {sig.name}"
        if sig != signal.SIGKILL:  # a parent killed outright removes nothing
            assert not list(temporary.iterdir()), f"a parent ended by {sig.name} left its call's folder"
        else:  # ... and the next call removes what it left
            assert list(temporary.iterdir())
            previous = tempfile.tempdir
            tempfile.tempdir = str(temporary)
            try:
                run("echo", 1)
            finally:
                tempfile.tempdir = previous
            assert not list(temporary.iterdir()), "the folder a killed parent left outlived the next call"
    finally:
        parent.kill()
        parent.wait()


def test_a_foreign_interpreter_dies_with_its_parent(tmp_path):
    """The parent-death signal is set before the child's interpreter starts: an interpreter that
    never runs this project's code still dies with the parent."""
    pidfile = tmp_path / "pid"
    script = tmp_path / "python"
    script.write_text(f"#!/bin/sh\necho $$ > {pidfile}\nexec sleep 600\n")
    script.chmod(0o755)
    code = ("import sys\nfrom contract.core import child\n"
            f"child.run('tests.child_targets:echo', 1, what='x', python={str(script)!r}, timeout=120)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=dict(os.environ, TMPDIR=str(tmp_path)),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        pid = wait_for(pidfile)
        parent.kill()
        parent.wait(timeout=30)
        assert wait_gone(pid)
    finally:
        parent.kill()
        parent.wait()


def test_the_time_limit_is_a_setting():
    try:
        child.set_time_limit(7)
        assert child.time_limit() == 7
    finally:
        child.set_time_limit(child.DEFAULT_TIMEOUT_S)


def test_the_working_folder_is_not_on_the_childs_import_path(tmp_path):
    """Run from a vLLM checkout's root, the checkout's ``vllm`` must not shadow the environment's."""
    path = child.run(T + "import_path", None, what="the probe", cwd=str(tmp_path)).value
    assert str(tmp_path) not in path and "" not in path, path


def test_the_callers_environment_does_not_reach_the_child(monkeypatch, tmp_path):
    """A vLLM developer's usual set-up (``PYTHONPATH`` at their tree) and settings that change what
    runs (optimised bytecode drops asserts, pytest options, vLLM's switches) stay with the caller."""
    for name, value in {"PYTHONPATH": str(tmp_path), "PYTHONOPTIMIZE": "2", "PYTHONSTARTUP": str(tmp_path),
                        "PYTHONWARNINGS": "error", "PYTEST_ADDOPTS": "-n 2", "PYTEST_PLUGINS": "xdist",
                        "VLLM_USE_V2_MODEL_RUNNER": "0", "LD_PRELOAD": "libnothing.so", "LANG": "C.UTF-8"}.items():
        monkeypatch.setenv(name, value)
    seen = run("environment").value
    leaked = {k for k in seen["env"] if k.startswith(("PYTHON", "PYTEST", "VLLM_")) or k == "LD_PRELOAD"}
    assert not leaked, leaked
    assert seen["optimize"] == 0 and seen["asserts"] and seen["isolated"]
    assert str(tmp_path) not in seen["path"]
    assert seen["env"]["LANG"] == "C.UTF-8" and seen["env"]["TMPDIR"] != os.environ.get("TMPDIR")
    assert child.run(T + "environment", None, what="x", settings={"VLLM_LOGGING_LEVEL": "ERROR"}).value[
        "env"]["VLLM_LOGGING_LEVEL"] == "ERROR"


def test_a_process_that_left_the_group_does_not_outlive_the_run(tmp_path):
    pidfile = tmp_path / "pids"
    assert run("start_daemons", {"pidfile": str(pidfile)}).value == "started"
    for pid in map(int, pidfile.read_text().split()):
        assert wait_gone(pid), f"{pid} outlived the run"


def test_a_command_runs_with_the_same_guarantees(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTEST_ADDOPTS", "-x")
    done = child.run_command([sys.executable, "-c", "import os, sys; print(sorted(os.environ)); sys.exit(3)"],
                             what="the command")
    assert done.returncode == 3 and "PYTEST_ADDOPTS" not in done.stdout
    pidfile = tmp_path / "pid"
    with pytest.raises(child.ChildProblem, match="the command did not finish within 1 s"):
        child.run_command([sys.executable, "-c", f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid()))"
                                                 "\nwhile True: time.sleep(0.05)"], what="the command", timeout=1)
    assert wait_gone(wait_for(pidfile))


def test_the_childs_stderr_reaches_the_terminal_escaped(capfd):
    child.run(T + "escape_codes", None, what="x", stream_stderr=True)
    err = capfd.readouterr().err
    assert "\x1b" not in err and "\x07" not in err and "plain \\x1b[2J" in err


def test_a_folder_a_killed_parent_left_is_removed_by_the_next_call(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)
    left = tmp_path / f"{child.FOLDER_PREFIX}left"
    left.mkdir()
    (left / ".lock").touch()
    (left / "request.json").write_text("{}")
    with child.call_folder() as busy:  # a run in progress keeps its folder
        assert not left.exists()
        child.sweep_stale()
        assert Path(busy).is_dir()
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("value", [0, 0.5, -1, float("nan"), float("inf"), 1e10])
def test_a_time_limit_out_of_range_is_refused(value):
    with pytest.raises(ValueError, match="--timeout must be a number of seconds from 1 to"):
        child.checked_timeout(value)


PARENT_WRITTEN_TO = """
import sys
sys.path.insert(0, sys.argv[1])
from contract.core import child
print(child.run("tests.child_targets:write_to_parent", {"marker": "FORGED"}, what="x").value, flush=True)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and prctl are Linux's")
def test_a_child_cannot_write_to_the_parents_stdout(tmp_path):
    """Through ``/proc/<parent>/fd/1``, as any process of the same user could. Root passes every such
    check (``docs/threat-model.md``), so as root the parent runs as an unprivileged user, set before
    its interpreter starts (a change of user at run time would make it undumpable already)."""
    as_user = unprivileged()
    os.chmod(tmp_path, 0o777)
    out = tmp_path / "stdout"
    out.touch()
    out.chmod(0o666)  # the parent's own file: only /proc stands between the child and it
    with open(out, "w") as f:
        subprocess.run([sys.executable, "-I", "-c", PARENT_WRITTEN_TO, str(ROOT)], stdout=f, stderr=subprocess.PIPE,
                       cwd=tmp_path, env={"TMPDIR": str(tmp_path), "PATH": os.environ["PATH"]}, timeout=120,
                       check=True, **as_user)
    text = out.read_text()
    assert "FORGED" not in text and text.startswith("refused"), text


def test_a_result_written_beside_the_childs_own_is_no_result():
    """The parent reads one JSON document from the pipe it made; two are an unreadable result, never
    the first one's value."""
    assert "wrote an unreadable result" in problem("writes_a_result_of_its_own")
