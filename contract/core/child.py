"""Code a person names (a policy file, a vLLM tree, a release's environment) runs in a child process
whose only way to report is a result file the parent validates.

The child is started in its own process group with a timeout; its output never reaches the parent's
stdout; it dies with the parent (``PR_SET_PDEATHSIG`` on Linux, and the parent kills the child's group
on SIGINT, SIGTERM and SIGHUP). The result file carries a per-run nonce and is created exclusively,
so a forked copy of the child cannot write a second one. A child that exits without a result
(``os._exit(0)`` included), hangs, is killed by a signal or writes a malformed result is a
``ChildProblem``: one line, never a pass.

``python -m contract.core.child REQUEST RESULT`` is the child's side: it imports the request's
``module:function`` (the project's own code, never a name from data), calls it with the request's
payload, and writes ``{"nonce", "value"}`` or ``{"nonce", "error"}``.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from contract.core.output import one_line

SCHEMA = "cudagraph-contract.child"
DEFAULT_TIMEOUT_S = 300.0
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class ChildProblem(Exception):
    """The child did not report a valid result; the message says what happened, in one line."""

    def __init__(self, message: str):
        super().__init__(one_line(message))


@dataclass(frozen=True)
class Outcome:
    value: object  # what the function returned, as JSON
    stdout: str  # the child's own output, kept apart from the parent's
    stderr: str


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


@contextlib.contextmanager
def _forwarding(proc: subprocess.Popen):
    """While the child runs, an interrupt or termination of the parent kills the child's group first."""
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
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    for sig in _FORWARDED:
        previous[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def run(target: str, payload, *, what: str, timeout: float | None = DEFAULT_TIMEOUT_S,
        python: str | os.PathLike = sys.executable, env: dict | None = None, cwd: str | None = None,
        stream_stderr: bool = False) -> Outcome:
    """Call ``target`` (``"package.module:function"``) with ``payload`` in a child ``python``.

    ``what`` names the code for messages ("policy file my.py"). ``stream_stderr`` lets the child's
    stderr (progress, vLLM's log) through to the parent's instead of capturing it."""
    nonce = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="cudagraph-contract-child-") as tmp:
        request, result = Path(tmp) / "request.json", Path(tmp) / "result.json"
        request.write_text(json.dumps({"schema": SCHEMA, "nonce": nonce, "target": target, "payload": payload}),
                           encoding="utf-8")
        try:
            proc = subprocess.Popen(
                [str(python), "-m", "contract.core.child", str(request), str(result)],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=None if stream_stderr else subprocess.PIPE,
                env=env, cwd=cwd, text=True, start_new_session=True)
        except OSError as exc:
            raise ChildProblem(f"{what}: {python} cannot be run: {exc.strerror or exc}") from None
        try:
            with _forwarding(proc):
                try:
                    out, err = proc.communicate(timeout=timeout)
                except subprocess.TimeoutExpired:
                    _kill_group(proc.pid)
                    proc.communicate()
                    raise ChildProblem(f"{what} did not finish within {timeout:g} s; pass --timeout to allow "
                                       "more") from None
        finally:
            _kill_group(proc.pid)  # whatever it left behind: a fork, a grandchild
        err = err or ""
        if proc.returncode < 0:
            raise ChildProblem(f"{what} was killed by {_signal_name(-proc.returncode)}")
        if not result.is_file():
            last = next((line for line in reversed(err.splitlines()) if line.strip()), "")
            raise ChildProblem(f"{what} exited with status {proc.returncode} before reporting a result"
                               + (f": {last.strip()}" if last else ""))
        try:
            data = json.loads(result.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ChildProblem(f"{what} wrote an unreadable result: {exc}") from None
        if not isinstance(data, dict) or data.get("nonce") != nonce or ("value" not in data and "error" not in data):
            raise ChildProblem(f"{what} wrote a result this run did not ask for")
        if "error" in data:
            raise ChildProblem(f"{what}: {data['error']}")
        return Outcome(data["value"], out or "", err)


def _die_with_parent() -> None:
    """Linux: the kernel sends SIGKILL when the parent exits, whatever killed it."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            PR_SET_PDEATHSIG = 1
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _write(path: str, data: dict) -> None:
    """Created exclusively: the first writer wins, a forked copy's second write fails quietly."""
    try:
        text = json.dumps(data)
    except (TypeError, ValueError) as exc:
        text = json.dumps({"nonce": data["nonce"], "error": f"the result is not JSON: {exc}"})
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)


def main(argv: list[str]) -> int:
    _die_with_parent()
    request_path, result_path = argv
    with open(request_path, encoding="utf-8") as f:
        request = json.load(f)
    nonce = request["nonce"]
    module_name, _, function_name = request["target"].partition(":")
    if not module_name.startswith("contract."):
        _write(result_path, {"nonce": nonce, "error": "the child runs only the project's own functions"})
        return 2
    function = getattr(importlib.import_module(module_name), function_name)
    try:
        value = function(request["payload"])
    except KeyboardInterrupt:
        raise
    except RecursionError:
        _write(result_path, {"nonce": nonce, "error": "RecursionError: maximum recursion depth exceeded"})
        return 1
    except BaseException as exc:  # noqa: BLE001 - named code: any failure is reported, never raised
        text = str(exc).strip().splitlines()
        _write(result_path, {"nonce": nonce,
                             "error": f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__})
        return 1
    _write(result_path, {"nonce": nonce, "value": value})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
