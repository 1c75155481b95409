"""Progress of a long command on stderr, never on stdout: a rich progress bar when stderr is a
terminal, else a line every minute ("verify: 3 of 5 policies, 2 min 0 s"), so that a CI log shows a
run is alive, and, once one was shown, a last line with where the run got to. ``--quiet`` shows nothing. The stages come from ``contract.core.progress``."""

from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import contextmanager

from contract.cli.common import err
from contract.core import progress as core_progress

# Seconds between two lines when stderr is not a terminal; the environment variable is for tests.
HEARTBEAT_S = 60.0


def duration(seconds: float) -> str:
    """``45 s``, ``2 min 0 s``, ``1 h 3 min``."""
    s = int(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


class _State:
    def __init__(self, command: str):
        self.command, self.started = command, time.monotonic()
        self.unit, self.total, self.what, self.done = "", None, "", 0
        self.lock = threading.Lock()

    def line(self) -> str:
        with self.lock:
            parts = [self.command] + ([self.what] if self.what else [])
            if self.unit:
                count = f"{self.done:,} of {self.total:,}" if self.total is not None else f"{self.done:,}"
                parts.append(f"{count} {self.unit}")
        return ": ".join(parts) + f", {duration(time.monotonic() - self.started)}"


class Heartbeat(core_progress.Reporter):
    """A line on stderr every ``every`` seconds while the command runs."""

    def __init__(self, command: str, every: float):
        self.state, self.every, self.said = _State(command), every, False
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._beat, name="cudagraph-contract-heartbeat", daemon=True)
        self.thread.start()

    def _beat(self) -> None:
        while not self.stopped.wait(self.every):
            if not self._say():
                return

    def _say(self) -> bool:
        try:
            sys.stderr.write(self.state.line() + "\n")
            sys.stderr.flush()
        except (OSError, ValueError):  # stderr closed: nobody is reading
            return False
        self.said = True
        return True

    def stage(self, unit, total, what):
        with self.state.lock:
            self.state.unit, self.state.total, self.state.what, self.state.done = unit, total, what, 0

    def advance(self, n):
        with self.state.lock:
            self.state.done += n

    def close(self):
        self.stopped.set()
        self.thread.join()
        if self.said:  # a log that showed the run under way ends with where it got to
            self._say()


class Bar(core_progress.Reporter):
    """A transient rich progress bar on the terminal, one stage at a time."""

    def __init__(self, command: str, console):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.command = command
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), console=console, transient=True)
        self.bar.__enter__()
        self.task = self.bar.add_task(command, total=None)

    def stage(self, unit, total, what):
        label = ": ".join(filter(None, [self.command, what, unit]))
        self.bar.reset(self.task, total=total, description=label)

    def advance(self, n):
        self.bar.advance(self.task, n)

    def close(self):
        self.bar.__exit__(None, None, None)


@contextmanager
def shown(command: str, quiet: bool = False):
    """The stages of the block, shown on stderr as the terminal allows; joins an outer display."""
    if quiet:
        yield None
        return
    if core_progress.active() is not None:  # already shown by the command around: one display
        yield core_progress.active()
        return
    if os.environ.get(core_progress.ENV):  # a child: its parent shows the stages it relays
        yield None
        return
    if err.is_terminal:
        reporter: core_progress.Reporter = Bar(command, err)
    else:
        every = float(os.environ.get("CUDAGRAPH_CONTRACT_HEARTBEAT_S") or HEARTBEAT_S)
        reporter = Heartbeat(command, every)
    with core_progress.reporting(reporter):
        yield reporter


class progress:
    """``total`` items of ``unit`` done by ``command``, shown on stderr (a progress bar on a
    terminal, a line a minute otherwise: ``contract/cli/progress.py``); yields the function that
    counts one done."""

    def __init__(self, total: int, unit: str, quiet: bool, command: str = ""):
        self.total, self.unit, self.quiet, self.command = total, unit, quiet, command or unit

    def __enter__(self):
        self.shown = shown(self.command, self.quiet)
        self.shown.__enter__()
        core_progress.stage(self.unit, self.total)
        return core_progress.advance

    def __exit__(self, *exc):
        return self.shown.__exit__(*exc)
