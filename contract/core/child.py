"""Code a person names (a policy file, a vLLM tree, a release's environment, a root cause's unit test)
runs in a child process whose only way to report is a result the parent validates.

What the child is isolated against, and what it is not, is ``docs/threat-model.md``. In short:

- **Environment.** The child starts from ``environment()``: a few variables of the caller's
  (``KEPT``: locale, user, ``PATH``, the GPU's selection) and the settings the tool means to give it;
  ``PYTHONPATH``, ``PYTHONOPTIMIZE``, ``PYTEST_ADDOPTS``, ``VLLM_*`` and the rest never reach it. A
  function call runs under ``python -I`` (no environment variable, user site or working folder
  reaches its interpreter) with the project put first on ``sys.path`` by the call itself.
- **Processes.** A small launcher in the tool's own interpreter sits between parent and child: it is
  a child subreaper, starts the child in a process group of its own with the parent-death signal
  set, and when the child ends, times out or the parent goes, kills the child's group and every
  descendant left (one that started a new session included), then reports how the child ended.
- **Output.** The child's stdout and stderr are pipes the parent reads (its stderr relayed with
  control characters escaped where the command shows it); its result is one JSON document written
  to a pipe the parent created and passed down, never a path or a nonce the child could learn; a
  forked copy closes it at once. A child that exits without a result (``os._exit(0)`` included),
  hangs, is killed by a signal or writes anything but one valid document is a ``ChildProblem``:
  one line, never a pass.
- **Files.** Each call has a folder of its own (the child's ``TMPDIR``), removed however the call
  ends; one a parent killed outright left behind is removed by the next call (its lock is free).

``python -I -c BOOT ROOT REQUEST FD`` is the child's side: it imports the request's
``module:function`` (the project's own code, never a name from data), calls it with the request's
payload, and writes ``{"value"}`` or ``{"error"}`` to descriptor ``FD``. ``refuse_forks`` is for
child functions that run named code: a fork's copy exits at once and the fork is remembered.
"""

from __future__ import annotations

import codecs
import contextlib
import ctypes
import fcntl
import importlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from contract.core import progress as progress_mod
from contract.core.output import one_line

DEFAULT_TIMEOUT_S = 300.0
# The longest ``--timeout`` a command takes: a week, far past any run, short of what a clock overflows at.
MAX_TIMEOUT_S = 7 * 24 * 3600.0
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# The modules a request may name: the project's own (its tests' helpers included).
_TARGETS = ("contract.", "tests.")
# The child's output kept for messages and ``Outcome``; more is cut from the front.
MAX_OUTPUT = 1 << 20
# What the result may hold: a conformance summary is a few MiB at most.
MAX_RESULT = 256 << 20
# How long the launcher may take to end the child's processes once asked, before the parent kills it.
_STOP_GRACE_S = 10.0
FOLDER_PREFIX = "cudagraph-contract-child-"
_FOLDERS = "cudagraph-contract-"  # what every call folder's name starts with (``call_folder``)
_LOCK = ".lock"
_live: set[str] = set()  # this process's call folders, removed by a signal it dies of

# What a child keeps of the caller's environment: the locale, who the user is and where their home
# is (vLLM and torch read them), where programs are, the GPU's selection and the numeric libraries'
# settings (some machines need OPENBLAS_CORETYPE to compute right). Nothing else: a setting the tool
# means a child to have, it sets (``environment``).
KEPT = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TERM", "NO_COLOR", "LD_LIBRARY_PATH",
        "CUDA_VISIBLE_DEVICES", "CUDA_HOME")
KEPT_PREFIXES = ("LC_", "OPENBLAS_", "OMP_", "MKL_", "NVIDIA_", "CUDAGRAPH_CONTRACT_")
_NOT_KEPT = ("CUDAGRAPH_CONTRACT_PROGRESS_FILE",)  # the relay of one parent, never of another

# Run by the tool's own interpreter (``-I -S``: the standard library alone) between the parent and
# the child. argv: parent pid, status fd, the command as JSON, the fds the command inherits as JSON.
_LAUNCHER = r"""
import ctypes, json, os, signal, sys, time
parent, status_fd = int(sys.argv[1]), int(sys.argv[2])
command, inherited = json.loads(sys.argv[3]), json.loads(sys.argv[4])
try:
    prctl = ctypes.CDLL(None, use_errno=True).prctl
except Exception:
    prctl = None
class Stop(Exception):
    pass
def stop(signum, frame):
    raise Stop
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(s, stop)
if prctl is not None:
    prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: the parent gone, the launcher ends the child's processes
    prctl(36, 1)  # PR_SET_CHILD_SUBREAPER: orphaned descendants come here, whatever session they started
def report(record):
    try:
        os.write(status_fd, json.dumps(record).encode())
    except OSError:
        pass
def children():
    me, found = os.getpid(), []
    try:
        names = os.listdir("/proc")
    except OSError:
        return found
    for name in names:
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    if int(f.read().rsplit(b")", 1)[1].split()[1]) == me:
                        found.append(int(name))
            except (OSError, IndexError, ValueError):
                pass
    return found
def sweep(pid):
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        left = children()
        if not left:
            return
        for p in left:
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        while True:
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
        time.sleep(0.01)
pid = status = None
failed = ""
try:
    if os.getppid() != parent:
        os._exit(1)
    for fd in inherited:
        os.set_inheritable(fd, True)
    read_end, write_end = os.pipe()
    launcher = os.getpid()
    pid = os.fork()
    if pid == 0:
        try:
            os.setpgid(0, 0)
            for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                signal.signal(s, signal.SIG_DFL)
            if prctl is not None:
                prctl(1, signal.SIGKILL)  # the launcher gone (killed outright), the child goes too
            if os.getppid() != launcher:
                os._exit(1)
            os.close(read_end)
            os.execv(command[0], command)
        except OSError as exc:
            os.write(write_end, (exc.strerror or str(exc)).encode())
        except BaseException:
            pass
        os._exit(127)
    os.close(write_end)
    for fd in inherited:
        os.close(fd)
    failed = os.read(read_end, 4096).decode(errors="replace")
    status = os.waitpid(pid, 0)[1]
except Stop:
    pass
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
if pid:
    sweep(pid)
if status is None:
    report({"stopped": True})
elif failed:
    report({"exec": failed})
elif os.WIFSIGNALED(status):
    report({"signal": os.WTERMSIG(status)})
else:
    report({"exit": os.waitstatus_to_exitcode(status)})
os._exit(0)
"""

# The child's first code, under ``python -I``: the project's folder first on ``sys.path``, then the
# request. argv: the project's folder, the request file, the result fd.
_BOOT = "import sys; sys.path.insert(0, sys.argv[1]); from contract.core.child import main; sys.exit(main(sys.argv[2:]))"


class ChildProblem(Exception):
    """The child did not report a valid result; the message says what happened, in one line."""

    def __init__(self, message: str):
        super().__init__(one_line(message))


@dataclass(frozen=True)
class Outcome:
    value: object  # what the function returned, as JSON
    stdout: str  # the child's own output, kept apart from the parent's
    stderr: str


@dataclass(frozen=True)
class Finished:
    """How a command run by ``run_command`` ended."""

    returncode: int
    stdout: str
    stderr: str


# -- the time named code may take, for the commands that run it ------------------------------------

_time_limit: float | None = DEFAULT_TIMEOUT_S
_timeout_hint = "pass --timeout to allow more"


def checked_timeout(seconds: float, option: str = "--timeout") -> float:
    """``seconds`` when it is a time a child may be given (at least 1 s, finite, at most
    ``MAX_TIMEOUT_S``); else ``ValueError`` with one line naming ``option``."""
    if not isinstance(seconds, (int, float)) or math.isnan(seconds) or not 1 <= seconds <= MAX_TIMEOUT_S:
        raise ValueError(f"{option} must be a number of seconds from 1 to {MAX_TIMEOUT_S:g}, got {seconds!r}")
    return float(seconds)


def set_time_limit(seconds: float | None, option: str = "--timeout") -> None:
    """The limit ``time_limit()`` gives: a command's ``option`` (None: no limit), named in the message
    of a child that runs out of it."""
    global _time_limit, _timeout_hint
    _time_limit = None if seconds is None else checked_timeout(seconds, option)
    _timeout_hint = f"pass {option} to allow more"


def time_limit() -> float | None:
    """Seconds a child running named code (a policy file, a tree's rules) may take."""
    return _time_limit


# -- the parent's side ----------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]  # the folder holding ``contract``


def environment(**settings: str) -> dict:
    """The environment a child starts from: ``KEPT`` of the caller's, then ``settings``."""
    kept = {k: v for k, v in os.environ.items()
            if (k in KEPT or k.startswith(KEPT_PREFIXES)) and k not in _NOT_KEPT}
    return kept | settings


_dumpable_lock = threading.Lock()
_dumpable_depth = 0  # children running now
_dumpable_was = 1  # the parent's own setting, restored when the last child ends


def _prctl():
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


@contextlib.contextmanager
def _not_dumpable():
    """While a child runs the parent is not dumpable: the kernel then closes ``/proc/<pid>/fd`` of the
    parent, through which any process of the same user could open its stdout or stderr, to all but
    a privileged process (root keeps access: ``docs/threat-model.md``)."""
    global _dumpable_depth, _dumpable_was
    prctl = _prctl() if sys.platform.startswith("linux") else None
    if prctl is None:
        yield
        return
    PR_GET_DUMPABLE, PR_SET_DUMPABLE = 3, 4
    with _dumpable_lock:
        if _dumpable_depth == 0:
            _dumpable_was = prctl(PR_GET_DUMPABLE, 0, 0, 0, 0)
            prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
        _dumpable_depth += 1
    try:
        yield
    finally:
        with _dumpable_lock:
            _dumpable_depth -= 1
            if _dumpable_depth == 0 and _dumpable_was > 0:
                prctl(PR_SET_DUMPABLE, _dumpable_was, 0, 0, 0)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _exited(pid: int, timeout: float) -> bool:
    """Whether ``pid`` (a child of this process) exits within ``timeout`` seconds, left unreaped:
    safe in a signal handler that interrupted ``Popen.wait``, whose lock it does not take."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
        except ChildProcessError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def _stop(proc: subprocess.Popen) -> None:
    """Ask the launcher to end the child's processes; kill it when it does not in time."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        proc.send_signal(signal.SIGTERM)
    if not _exited(proc.pid, _STOP_GRACE_S):
        _kill_group(proc.pid)


def sweep_stale(where: str | None = None) -> None:
    """Remove the call folders that parents killed outright (SIGKILL) left: a folder whose lock no
    process holds. Folders of other users, and any that cannot be locked, are left."""
    where = where or tempfile.gettempdir()
    try:
        names = [n for n in os.listdir(where) if n.startswith(_FOLDERS)]
    except OSError:
        return
    for name in names:
        folder = os.path.join(where, name)
        try:
            if os.lstat(folder).st_uid != os.getuid() or not os.path.isdir(folder) or os.path.islink(folder):
                continue
            fd = os.open(os.path.join(folder, _LOCK), os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # a run in progress
        else:
            shutil.rmtree(folder, ignore_errors=True)
        finally:
            os.close(fd)


@contextlib.contextmanager
def call_folder(prefix: str = FOLDER_PREFIX):
    """A folder for one call (``prefix`` starts with ``cudagraph-contract-``), locked while it lasts
    and removed when it ends, also when a signal ends the parent while a child runs
    (``_forwarding``); the next call removes one that a parent killed outright left."""
    assert prefix.startswith(_FOLDERS)
    sweep_stale()
    folder = tempfile.mkdtemp(prefix=prefix)
    lock = os.open(os.path.join(folder, _LOCK), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)
    _live.add(folder)
    try:
        yield folder
    finally:
        _live.discard(folder)
        shutil.rmtree(folder, ignore_errors=True)
        os.close(lock)


@contextlib.contextmanager
def _forwarding(started: list[subprocess.Popen]):
    """While the child runs, an interrupt or termination of the parent ends the child's processes
    first. A signal the parent dies of removes its call folders first, as no ``finally`` runs then.
    A signal the parent ignores (``nohup``) stays ignored. Entered before the child starts
    (``started`` holds it once it has), so no signal finds a child running and the folders unguarded."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}

    def handler(signum, frame):
        for proc in started:
            _stop(proc)
        old = previous.get(signum)
        if callable(old):
            old(signum, frame)
        elif signum == signal.SIGINT:
            raise KeyboardInterrupt
        else:
            for folder in list(_live):
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


def printable(text: str) -> str:
    """``text`` with control characters other than line breaks and tabs escaped: what a child writes
    reaches the person's terminal as text, never as terminal commands."""
    return "".join(c if c.isprintable() or c in "\n\t" else repr(c)[1:-1] for c in text)


class _Reader(threading.Thread):
    """Reads one of the child's pipes to its end, keeping at most ``limit`` bytes (the last ones, or
    with ``first`` the first ones; ``size`` counts them all); ``relay`` receives each chunk too."""

    def __init__(self, fd: int, limit: int, relay=None, first: bool = False):
        super().__init__(daemon=True, name="cudagraph-contract-child-reader")
        self.fd, self.limit, self.relay, self.first = fd, limit, relay, first
        self.data, self.size = bytearray(), 0

    def run(self) -> None:
        try:
            while True:
                try:
                    chunk = os.read(self.fd, 1 << 16)
                except InterruptedError:
                    continue
                except OSError:
                    break
                if not chunk:
                    break
                self.size += len(chunk)
                if self.first:
                    if len(self.data) < self.limit:
                        self.data += chunk[: self.limit - len(self.data)]
                else:
                    self.data += chunk
                    if len(self.data) > 2 * self.limit:
                        del self.data[: len(self.data) - self.limit]
                if self.relay is not None:
                    with contextlib.suppress(Exception):
                        self.relay(chunk)
        finally:
            os.close(self.fd)

    @property
    def text(self) -> str:
        data = self.data if self.first else self.data[-self.limit:]
        return bytes(data).decode("utf-8", errors="replace")


def _to_stderr():
    """A relay of the child's stderr to the parent's, decoded as it comes and escaped."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def relay(chunk: bytes) -> None:
        sys.stderr.write(printable(decoder.decode(chunk)))
        sys.stderr.flush()

    return relay


def _launch(command: list[str], **kwargs) -> tuple[dict, str, str]:
    """Run ``command`` under the launcher (``_launched``), the parent not dumpable meanwhile."""
    with _not_dumpable():
        return _launched(command, **kwargs)


def _launched(command: list[str], *, what: str, timeout: float | None, env: dict, cwd: str | None,
              stream_stderr: bool, result_fd: int | None = None) -> tuple[dict, str, str]:
    """Run ``command`` under the launcher: (how it ended, stdout, stderr). ``result_fd``, the write
    end of the result's pipe, is passed to the command and closed here."""
    status_r, status_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    inherited = [result_fd] if result_fd is not None else []
    passed = [status_w, *inherited]
    argv = [sys.executable or command[0], "-I", "-S", "-c", _LAUNCHER, str(os.getpid()), str(status_w),
            json.dumps(command), json.dumps(inherited)]
    started: list[subprocess.Popen] = []
    finished = True
    with _forwarding(started):
        try:
            started.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out_w, stderr=err_w, env=env,
                                            cwd=cwd, start_new_session=True, pass_fds=passed))
        except OSError as exc:
            for fd in (status_r, out_r, err_r):
                os.close(fd)
            raise ChildProblem(f"{what}: {command[0]} cannot be run: {exc.strerror or exc}") from None
        finally:
            for fd in (*passed, out_w, err_w):
                os.close(fd)
        proc = started[0]
        readers = {"status": _Reader(status_r, 1 << 16, first=True), "stdout": _Reader(out_r, MAX_OUTPUT),
                   "stderr": _Reader(err_r, MAX_OUTPUT, _to_stderr() if stream_stderr else None)}
        try:
            for r in readers.values():
                r.start()
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            finished = False
        finally:
            if proc.poll() is None:
                _stop(proc)
            _kill_group(proc.pid)  # the launcher's own group: nothing should be left in it
            proc.wait()
            for r in readers.values():
                if r.ident is not None:  # started: its pipe closes when the last descendant is gone
                    r.join(timeout=_STOP_GRACE_S)
    if not finished:
        raise ChildProblem(f"{what} did not finish within {timeout:g} s; {_timeout_hint}")
    try:
        how = json.loads(readers["status"].text or "null")
    except ValueError:
        how = None
    if not isinstance(how, dict):
        how = {"launcher": proc.returncode}
    return how, readers["stdout"].text, readers["stderr"].text


def _ended(how: dict, what: str, program: str, stderr: str) -> int:
    """The command's exit status, or the ``ChildProblem`` of a command that did not exit."""
    if "exec" in how:
        raise ChildProblem(f"{what}: {program} cannot be run: {how['exec']}")
    if "signal" in how:
        raise ChildProblem(f"{what} was killed by {_signal_name(how['signal'])}")
    if "exit" not in how:
        raise ChildProblem(f"{what} ended without saying how (launcher status {how.get('launcher')})"
                           f"{_last_line(stderr)}")
    return how["exit"]


def _last_line(stderr: str) -> str:
    """``": <the last line the child wrote to stderr>"``, or nothing."""
    last = next((line for line in reversed(stderr.splitlines()) if line.strip()), "")
    return f": {last.strip()}" if last else ""


def _runnable(python: str, what: str) -> None:
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        reason = "No such file or directory" if not os.path.exists(python) else "Permission denied"
        raise ChildProblem(f"{what}: {python} cannot be run: {reason}")


def run_command(command: list[str], *, what: str, timeout: float | None = DEFAULT_TIMEOUT_S,
                env: dict | None = None, cwd: str | None = None) -> Finished:
    """Run a program a person named (a unit test under a release's Python) with the same guarantees
    as a function call: constructed environment (``env``, else ``environment()``), launcher, time
    limit, every descendant ended. Its exit status and output are returned, not judged."""
    _runnable(command[0], what)
    with call_folder() as folder:
        env = dict(env if env is not None else environment(), TMPDIR=folder)
        how, stdout, stderr = _launch([str(c) for c in command], what=what, timeout=timeout, env=env,
                                      cwd=cwd or folder, stream_stderr=False)
        return Finished(_ended(how, what, command[0], stderr), stdout, stderr)


def run(target: str, payload, *, what: str, timeout: float | None = DEFAULT_TIMEOUT_S,
        python: str | os.PathLike = sys.executable, settings: dict | None = None, root: Path = ROOT,
        cwd: str | None = None, stream_stderr: bool = False, progress: bool = False) -> Outcome:
    """Call ``target`` (``"package.module:function"``) with ``payload`` in a child ``python``.

    ``what`` names the code for messages ("policy file my.py"); ``settings`` are the environment
    variables the tool gives the child on top of ``environment()``; ``root`` is the folder the child
    imports the project from. ``stream_stderr`` relays the child's stderr (vLLM's log) to the
    parent's, escaped; ``progress`` relays the stages the child reports (``contract.core.progress``)."""
    python = str(python)
    _runnable(python, what)
    with call_folder() as folder:
        request = Path(folder) / "request.json"
        request.write_text(json.dumps({"target": target, "payload": payload}), encoding="utf-8")
        env = environment(**(settings or {}), TMPDIR=folder)
        result_r, result_w = os.pipe()
        reader = _Reader(result_r, MAX_RESULT + 1, first=True)
        reader.start()
        relay = progress_mod.relayed(folder) if progress else contextlib.nullcontext({})
        try:
            with relay as reporting:
                how, stdout, stderr = _launch([python, "-I", "-c", _BOOT, str(root), str(request), str(result_w)],
                                              what=what, timeout=timeout, env=env | reporting, cwd=cwd or folder,
                                              stream_stderr=stream_stderr, result_fd=result_w)
        finally:
            reader.join(timeout=_STOP_GRACE_S)
        code = _ended(how, what, python, stderr)
        text = reader.data
        if not text:
            raise ChildProblem(f"{what} exited with status {code} before reporting a result{_last_line(stderr)}")
        try:
            if reader.size > MAX_RESULT:
                raise ValueError(f"larger than {MAX_RESULT >> 20} MiB")
            data = json.loads(bytes(text).decode("utf-8"))
        except (ValueError, RecursionError) as exc:
            raise ChildProblem(f"{what} wrote an unreadable result: {exc}") from None
        if not isinstance(data, dict) or set(data) not in ({"value"}, {"error"}):
            raise ChildProblem(f"{what} wrote a result this run did not ask for")
        if "error" in data:
            raise ChildProblem(f"{what}: {data['error']}")
        return Outcome(data["value"], stdout, stderr)


# -- the child's side -----------------------------------------------------------------------------

_result_fd: int | None = None  # the pipe to the parent; closed in every forked copy
_forks: list[int] = []


def _close_result() -> None:
    global _result_fd
    if _result_fd is not None:
        with contextlib.suppress(OSError):
            os.close(_result_fd)
        _result_fd = None


def refuse_forks():
    """For a child function running named code: every ``os.fork`` from now on ends its copy at
    once, and the returned function says whether one happened."""
    os.register_at_fork(after_in_parent=lambda: _forks.append(os.getpid()), after_in_child=lambda: os._exit(70))
    return lambda: bool(_forks)


def _write(data: dict) -> None:
    """The one result, written whole to the parent's pipe, which is then closed."""
    global _result_fd
    if _result_fd is None:
        return
    try:
        text = json.dumps(data, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        text = json.dumps({"error": f"the result is not JSON: {type(exc).__name__}: {str(exc)[:200]}"})
    with os.fdopen(_result_fd, "wb") as f:
        _result_fd = None
        with contextlib.suppress(BrokenPipeError):
            f.write(text.encode("utf-8"))


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
    global _result_fd
    request_path, fd = argv
    # The pipe moves to a descriptor of its own, closed in any copy ``os.fork`` makes and in any
    # program the child executes, so only this process reports.
    _result_fd = os.dup(int(fd))
    os.close(int(fd))
    os.register_at_fork(after_in_child=_close_result)
    with open(request_path, encoding="utf-8") as f:
        request = json.load(f)
    os.unlink(request_path)
    # What the code writes to temporary files (vLLM's model config, say) lies in the call's folder,
    # which the parent removes however the child ends.
    tempfile.tempdir = os.path.dirname(os.path.abspath(request_path))
    module_name, _, function_name = request["target"].partition(":")
    if not module_name.startswith(_TARGETS):
        _write({"error": "the child runs only the project's own functions"})
        return 2
    try:
        function = getattr(importlib.import_module(module_name), function_name)
        value = function(request["payload"])
    except BaseException as exc:  # noqa: BLE001 - named code: any failure is reported, never raised
        _write({"error": error_text(exc)})
        return 1
    _write({"value": value})
    return 0
