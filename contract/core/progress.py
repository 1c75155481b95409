"""What a long run is doing, for the person waiting on it.

Code deep in a run says ``stage("traces", total)`` and ``advance()``, and never knows how, or
whether, that is shown: the command installs a reporter (``reporting``; ``contract/cli/progress.py``
has a progress bar for a terminal and a line a minute otherwise), and a child process in a release's
environment, which cannot print to the person, appends its stages to the file its parent names in
``ENV`` (``relayed`` reads it back into the parent's reporter). Without a reporter nothing happens,
so a library caller and the tests see no output.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
from contextlib import contextmanager

ENV = "CUDAGRAPH_CONTRACT_PROGRESS_FILE"


class Reporter:
    """Receives a run's stages and counts; the default shows nothing."""

    def stage(self, unit: str, total: int | None, what: str) -> None:
        pass

    def advance(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


_stack: list[Reporter] = []


def _current() -> Reporter | None:
    if not _stack and os.environ.get(ENV):
        _stack.append(_FileReporter(os.environ[ENV]))  # a child whose parent relays its progress
    return _stack[-1] if _stack else None


def active() -> Reporter | None:
    """The reporter the command installed, if any."""
    return _stack[-1] if _stack else None


def stage(unit: str, total: int | None = None, what: str = "") -> None:
    """A new stage: ``total`` items of ``unit`` (``"traces"``) to do, ``what`` names the stage
    where a command has several ("vLLM 0.34.0")."""
    r = _current()
    if r is not None:
        r.stage(unit, total, what)


def advance(n: int = 1) -> None:
    r = _current()
    if r is not None:
        r.advance(n)


@contextmanager
def reporting(reporter: Reporter):
    """``reporter`` receives the stages of the code run inside."""
    _stack.append(reporter)
    try:
        yield reporter
    finally:
        _stack.remove(reporter)
        reporter.close()


class _FileReporter(Reporter):
    """A child's side: one JSON line per stage and, at most every ``EVERY`` seconds, the count."""

    EVERY = 0.5

    def __init__(self, path: str):
        self.path, self.done, self.written, self.last = path, 0, 0, 0.0
        atexit.register(self.close)  # the last count reaches the parent

    def _write(self, record: dict) -> None:
        try:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
        except OSError:
            pass  # progress is never worth failing a run for

    def stage(self, unit, total, what):
        self.done = self.written = 0
        self._write({"unit": unit, "total": total, "what": what})

    def advance(self, n):
        self.done += n
        now = time.monotonic()
        if now - self.last >= self.EVERY:
            self.last = now
            self._write({"done": self.done})
            self.written = self.done

    def close(self):
        if self.done != self.written:
            self._write({"done": self.done})


class _Relay:
    def __init__(self, path: str, reporter: Reporter):
        self.path, self.reporter, self.offset, self.done = path, reporter, 0, 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="cudagraph-contract-progress-relay", daemon=True)

    def read(self) -> None:
        try:
            with open(self.path, encoding="utf-8") as f:
                f.seek(self.offset)
                chunk = f.read()
        except OSError:
            return
        complete = chunk[: chunk.rfind("\n") + 1]
        self.offset += len(complete.encode("utf-8"))
        for line in complete.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if not isinstance(record, dict):
                continue
            if "unit" in record:
                self.done = 0
                total = record.get("total")
                self.reporter.stage(str(record["unit"]), total if isinstance(total, int) else None,
                                    str(record.get("what") or ""))
            elif isinstance(record.get("done"), int) and record["done"] > self.done:
                self.reporter.advance(record["done"] - self.done)
                self.done = record["done"]

    def _run(self) -> None:
        while not self.stop.wait(0.5):
            self.read()


@contextmanager
def relayed(folder: str):
    """Yield the environment a child needs to report its stages here, through a file in ``folder``
    (the call's own, removed with it); while the block runs they reach this process's reporter.
    Without a reporter, an empty environment."""
    reporter = _current()
    if reporter is None:
        yield {}
        return
    path = os.path.join(folder, "progress")
    open(path, "w").close()
    relay = _Relay(path, reporter)
    relay.thread.start()
    try:
        yield {ENV: path}
    finally:
        relay.stop.set()
        relay.thread.join()
        relay.read()
