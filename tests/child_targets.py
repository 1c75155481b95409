"""Functions ``tests/test_child.py`` runs in a child through ``contract.core.child``: each does one
thing a named piece of code can do to its process."""

from __future__ import annotations

import sys
import os
import signal
import time
from pathlib import Path

from contract.core import child


def echo(payload):
    return payload


def exit_now(payload):
    os._exit(payload["status"])


def write_pid_and_hang(payload):
    Path(payload["pidfile"]).write_text(str(os.getpid()))
    while True:
        time.sleep(0.01)


def kill_self(payload):
    os.kill(os.getpid(), getattr(signal, payload["signal"]))
    time.sleep(5)


def fork(payload):
    """The copy reports its pid, tries to return a value of its own and then lingers; the original
    returns a little later."""
    pid = os.fork()
    if pid == 0:
        Path(payload["pidfile"]).write_text(str(os.getpid()))
        if payload.get("linger"):
            while True:
                time.sleep(0.01)
        return "the fork's copy"
    time.sleep(0.3)
    return "the original"


def refused_fork(payload):
    forked = child.refuse_forks()
    pid = os.fork()
    if pid == 0:  # never reached: the copy exits at once
        Path(payload["marker"]).write_text("the copy ran")
        return "the fork's copy"
    os.waitpid(pid, 0)
    return {"forked": forked()}


def leave_a_temporary_folder(payload):
    """What vLLM's code does with a config folder it never removes."""
    import tempfile

    return tempfile.mkdtemp(prefix="left-behind-")


def not_json(payload):
    return {"nan": float("nan")} if payload == "nan" else {"set": {1, 2}}


def deep(payload):
    value: list = []
    for _ in range(100_000):
        value = [value]
    return value


def raises(payload):
    raise ValueError("line one\nline two")


def prints(payload):
    print("to stdout")
    import sys
    print("to stderr", file=sys.stderr)
    return 1


def import_path(_payload):
    return sys.path


def environment(_payload):
    """What the child's interpreter was given: its environment, its flags and whether asserts run."""
    asserts = False
    try:
        assert False
    except AssertionError:
        asserts = True
    return {"env": dict(os.environ), "optimize": sys.flags.optimize, "isolated": sys.flags.isolated,
            "asserts": asserts, "path": sys.path}


def start_daemons(payload):
    """A process in a session of its own and a double-forked one: each would outlive a process group."""
    import subprocess

    hang = "import time\nwhile True: time.sleep(0.05)"
    first = subprocess.Popen([sys.executable, "-c", hang], start_new_session=True)
    pid = os.fork()
    if pid == 0:
        os.setsid()
        if os.fork() == 0:
            Path(payload["pidfile"]).write_text(f"{first.pid} {os.getpid()}")
            while True:
                time.sleep(0.05)
        os._exit(0)
    os.waitpid(pid, 0)
    while not Path(payload["pidfile"]).exists():
        time.sleep(0.01)
    return "started"


def write_to_parent(payload):
    """Open the tool's own stdout through ``/proc`` (the parent is the launcher's parent) and write."""
    launcher = os.getppid()
    parent = int(Path(f"/proc/{launcher}/stat").read_text().rsplit(")", 1)[1].split()[1])
    try:
        with open(f"/proc/{parent}/fd/1", "w") as f:
            f.write(payload["marker"] + "\n")
    except OSError as exc:
        return f"refused: {exc.strerror}"
    return "written"


def escape_codes(_payload):
    sys.stderr.write("plain \x1b[2J\x1b]0;title\x07 line\n")
    sys.stderr.flush()
    return 1


def progressing(payload):
    from contract.core import progress

    progress.stage("traces", payload["n"], "the probe")
    for _ in range(payload["n"]):
        progress.advance()
        time.sleep(payload["sleep"])
    return os.environ.get(progress.ENV, "")


def writes_a_result_of_its_own(_payload):
    """Named code that writes to the result's descriptor itself, then returns."""
    os.write(child._result_fd, b'{"value": "forged"}')
    return "the true result"
