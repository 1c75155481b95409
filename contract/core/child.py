"""Code a person names (a policy file, a vLLM tree, a release's environment) runs in a child process
whose only way to report is a result file the parent validates.

The child is started in its own process group with a timeout; its output goes to files, never to
the parent's stdout; it dies with the parent (``PR_SET_PDEATHSIG`` on Linux, set by a small launcher
before the child's interpreter starts, so it holds for any interpreter, and the parent kills the
child's group on SIGINT, SIGTERM and SIGHUP). The result file carries a per-run nonce, is created
exclusively and is written only by the process the parent started, so a forked copy of the child
cannot write one. A child that exits without a result (``os._exit(0)`` included), hangs, is killed
by a signal or writes a malformed result is a ``ChildProblem``: one line, never a pass. Whatever
the child's group still holds when the child exits (a fork, a grandchild) is killed.

``python -m contract.core.child REQUEST RESULT`` is the child's side: it imports the request's
``module:function`` (the project's own code, never a name from data), calls it with the request's
payload, and writes ``{"nonce", "value"}`` or ``{"nonce", "error"}``. ``refuse_forks`` is for child
functions that run named code: a fork's copy exits at once and the fork is remembered.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from contract.core.output import one_line

SCHEMA = "cudagraph-contract.child"
DEFAULT_TIMEOUT_S = 300.0
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# The modules a request may name: the project's own (its tests' helpers included).
_TARGETS = ("contract.", "tests.")
# The child's output kept for messages and ``Outcome``; more is cut from the front.
MAX_OUTPUT = 1 << 20
# What the result file may hold: a conformance summary is a few MiB at most.
MAX_RESULT = 256 << 20

# Run by the tool's own interpreter between fork and the child's interpreter: the parent-death
# signal survives execve, so a child whose interpreter never runs this project's code (a broken or
# foreign --vllm Python) still dies with the parent. A parent already gone is not waited for.
_LAUNCHER = """\
import ctypes, os, signal, sys
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
except Exception:
    pass
if os.getppid() != int(sys.argv[1]):
    os._exit(1)
try:
    os.execv(sys.argv[2], [sys.argv[2], "-m", "contract.core.child", *sys.argv[3:5]])
except OSError as exc:
    with open(sys.argv[5], "w") as f:
        f.write(exc.strerror or str(exc))
    os._exit(127)
"""


class ChildProblem(Exception):
    """The child did not report a valid result; the message says what happened, in one line."""

    def __init__(self, message: str):
        super().__init__(one_line(message))


@dataclass(frozen=True)
class Outcome:
    value: object  # what the function returned, as JSON
    stdout: str  # the child's own output, kept apart from the parent's
    stderr: str


# -- the time named code may take, for the commands that run it ------------------------------------

_time_limit: float | None = DEFAULT_TIMEOUT_S


def set_time_limit(seconds: float | None) -> None:
    """The limit ``time_limit()`` gives: a command's ``--timeout`` (None: no limit)."""
    global _time_limit
    _time_limit = seconds


def time_limit() -> float | None:
    """Seconds a child running named code (a policy file, a tree's rules) may take."""
    return _time_limit


# -- the parent's side ----------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]  # the checkout, when the package runs from one


def project_env(root: Path = ROOT, **extra: str) -> dict:
    """The parent's environment with this project (``root``: the folder holding ``contract``) first on
    ``PYTHONPATH``, so a child finds it whether it is installed or run from the checkout, in any
    interpreter."""
    path = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
    return dict(os.environ, PYTHONPATH=path, **extra)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


@contextlib.contextmanager
def _forwarding(proc: subprocess.Popen, folder: str):
    """While the child runs, an interrupt or termination of the parent kills the child's group first.
    A signal the parent dies of removes the call's ``folder`` first, as no ``finally`` runs then.
    A signal the parent ignores (``nohup``) stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}

    def handler(signum, frame):
        _kill_group(proc.pid)
        old = previous.get(signum)
        if callable(old):
            old(signum, frame)
        elif signum == signal.SIGINT:
            raise KeyboardInterrupt
        else:
            shutil.rmtree(folder, ignore_errors=True)
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    for sig in _FORWARDED:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            previous[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _exited(proc: subprocess.Popen, timeout: float | None) -> bool:
    """Wait until the child exits, leaving it unreaped: its pid, and so its process group's id,
    stays reserved while the parent kills what the group still holds. False on timeout."""
    deadline = None if timeout is None else time.monotonic() + timeout
    fd = None
    if hasattr(os, "pidfd_open"):
        with contextlib.suppress(OSError):
            fd = os.pidfd_open(proc.pid)
    if fd is not None:
        try:
            while True:
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                if select.select([fd], [], [], remaining)[0]:
                    return True
                if deadline is not None and time.monotonic() >= deadline:
                    return False
        finally:
            os.close(fd)
    if not hasattr(os, "waitid"):  # no way to wait without reaping: wait, then kill the group
        try:
            proc.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            return False
    while os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - MAX_OUTPUT))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def run(target: str, payload, *, what: str, timeout: float | None = DEFAULT_TIMEOUT_S,
        python: str | os.PathLike = sys.executable, env: dict | None = None, cwd: str | None = None,
        stream_stderr: bool = False) -> Outcome:
    """Call ``target`` (``"package.module:function"``) with ``payload`` in a child ``python``.

    ``what`` names the code for messages ("policy file my.py"). ``stream_stderr`` lets the child's
    stderr (progress, vLLM's log) through to the parent's instead of capturing it."""
    python = str(python)
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        reason = "No such file or directory" if not os.path.exists(python) else "Permission denied"
        raise ChildProblem(f"{what}: {python} cannot be run: {reason}")
    nonce = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="cudagraph-contract-child-") as tmp:
        request, result = Path(tmp) / "request.json", Path(tmp) / "result.json"
        out_path, err_path, exec_error = Path(tmp) / "stdout", Path(tmp) / "stderr", Path(tmp) / "exec-error"
        request.write_text(json.dumps({"schema": SCHEMA, "nonce": nonce, "target": target, "payload": payload,
                                       "parent": os.getpid()}), encoding="utf-8")
        if sys.executable:
            argv = [sys.executable, "-I", "-S", "-c", _LAUNCHER, str(os.getpid()), python, str(request), str(result),
                    str(exec_error)]
        else:  # an embedded interpreter: the child sets the parent-death signal itself
            argv = [python, "-m", "contract.core.child", str(request), str(result)]
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            try:
                proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                        stderr=None if stream_stderr else err, env=env, cwd=cwd,
                                        start_new_session=True)
            except OSError as exc:
                raise ChildProblem(f"{what}: {python} cannot be run: {exc.strerror or exc}") from None
        try:
            with _forwarding(proc, tmp):
                finished = _exited(proc, timeout)
        finally:
            _kill_group(proc.pid)  # whatever it left behind: a fork, a grandchild; or the child on timeout
            proc.wait()
        stdout, stderr = _tail(out_path), "" if stream_stderr else _tail(err_path)
        if not finished:
            raise ChildProblem(f"{what} did not finish within {timeout:g} s; pass --timeout to allow more")
        if exec_error.exists():
            raise ChildProblem(f"{what}: {python} cannot be run: {_tail(exec_error).strip()}")
        if proc.returncode < 0:
            raise ChildProblem(f"{what} was killed by {_signal_name(-proc.returncode)}")
        if not result.is_file():
            last = next((line for line in reversed(stderr.splitlines()) if line.strip()), "")
            raise ChildProblem(f"{what} exited with status {proc.returncode} before reporting a result"
                               + (f": {last.strip()}" if last else ""))
        try:
            if result.stat().st_size > MAX_RESULT:
                raise ValueError(f"larger than {MAX_RESULT >> 20} MiB")
            data = json.loads(result.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError) as exc:
            raise ChildProblem(f"{what} wrote an unreadable result: {exc}") from None
        if not isinstance(data, dict) or data.get("nonce") != nonce or ("value" not in data and "error" not in data):
            raise ChildProblem(f"{what} wrote a result this run did not ask for")
        if "error" in data:
            raise ChildProblem(f"{what}: {data['error']}")
        return Outcome(data["value"], stdout, stderr)


# -- the child's side -----------------------------------------------------------------------------

_owner: int | None = None  # the process the parent started; only it writes the result
_forks: list[int] = []


def _die_with_parent(parent: object) -> None:
    """Linux: the kernel sends SIGKILL when the parent exits, whatever killed it (the launcher set
    it already; set again for a child started without it). A parent already gone: exit."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            PR_SET_PDEATHSIG = 1
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if isinstance(parent, int) and os.getppid() != parent:
        os._exit(1)


def refuse_forks():
    """For a child function running named code: every ``os.fork`` from now on ends its copy at
    once, and the returned function says whether one happened."""
    os.register_at_fork(after_in_parent=lambda: _forks.append(os.getpid()), after_in_child=lambda: os._exit(70))
    return lambda: bool(_forks)


def _write(path: str, data: dict) -> None:
    """Created exclusively, by the process the parent started alone: a forked copy never writes."""
    if os.getpid() != _owner:
        return
    try:
        text = json.dumps(data, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        text = json.dumps({"nonce": data["nonce"], "error": f"the result is not JSON: {type(exc).__name__}: "
                                                            f"{str(exc)[:200]}"})
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)


def error_text(exc: BaseException) -> str:
    """``Type: first line`` of an exception from named code, whatever its ``__str__`` does."""
    if isinstance(exc, RecursionError):
        return "RecursionError: maximum recursion depth exceeded"
    try:
        text = str(exc).strip().splitlines()
    except BaseException:  # noqa: BLE001 - a __str__ that raises
        text = []
    return f"{type(exc).__name__}: {text[0][:500]}" if text else type(exc).__name__


def main(argv: list[str]) -> int:
    global _owner
    request_path, result_path = argv
    with open(request_path, encoding="utf-8") as f:
        request = json.load(f)
    _die_with_parent(request.get("parent"))
    _owner = os.getpid()
    # What the code writes to temporary files (vLLM's model config, say) lies in the parent's folder
    # for this call, which the parent removes however the child ends.
    tempfile.tempdir = os.path.dirname(os.path.abspath(request_path))
    nonce = request["nonce"]
    module_name, _, function_name = request["target"].partition(":")
    if not module_name.startswith(_TARGETS):
        _write(result_path, {"nonce": nonce, "error": "the child runs only the project's own functions"})
        return 2
    try:
        function = getattr(importlib.import_module(module_name), function_name)
        value = function(request["payload"])
    except BaseException as exc:  # noqa: BLE001 - named code: any failure is reported, never raised
        _write(result_path, {"nonce": nonce, "error": error_text(exc)})
        return 1
    _write(result_path, {"nonce": nonce, "value": value})
    return 0


if __name__ == "__main__":
    # ``python -m`` put the working folder first on sys.path: run from a vLLM checkout's root, its
    # ``vllm`` would shadow the environment's release on every side of a replay. The project itself
    # is already imported (``contract``'s package path), so the folder is not needed to find it.
    if sys.path and sys.path[0] in ("", os.getcwd()):
        sys.path.pop(0)
    sys.exit(main(sys.argv[1:]))
