"""The base side of a branch replay, computed once per release, runner, corpus and tool version and
kept in the user's cache folder, so a branch run replays only the branch.

A cache entry is the base release's observations (steps and decision paths) of every trace replayed
on it so far, by what the trace replays (``trace_digest``), keyed by the release version, the runner
family and a digest of this package's own code (a change to the model, the replay or the corpus
makes a new key); the generated corpora are kept beside it. An entry is written
whole (``write_atomic``) and read as data; a missing, unreadable or mismatched one is recomputed.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

from contract.core.output import OutputError, write_atomic
from contract.core.trace import TraceError, loads
from contract.real.installed import cache_root as root  # shared with the environments (envs/)

SCHEMA = "cudagraph-contract.base-observations"
PACKAGE = Path(__file__).resolve().parents[1]


# The code that decides the corpus and what a replay observes.
OBSERVING = ("core", "real", "runners", "families.py", "branch/observe.py")


@functools.lru_cache(maxsize=1)
def tool_digest() -> str:
    """A digest of the code that decides the corpus and the observations (``OBSERVING``)."""
    h = hashlib.sha256()
    paths = [p for name in OBSERVING for p in ([PACKAGE / name] if name.endswith(".py") else (PACKAGE / name).rglob("*.py"))]
    for path in sorted(paths):
        h.update(path.relative_to(PACKAGE).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def key(version: str, runner: str) -> str:
    return f"{version}-{runner}-{tool_digest()}"


def trace_digest(trace) -> str:
    """What a trace replays (its scenario and events), whatever its name."""
    return hashlib.sha256(json.dumps([trace.scenario.to_json(), [e for e in trace.to_json()["events"]]],
                                     sort_keys=True).encode()).hexdigest()[:24]


def _path(entry: str) -> Path:
    return root() / "base-observations" / f"{entry}.json"


def load(entry: str) -> dict | None:
    """The cached observations (trace name -> observation) and ``where``, or None."""
    path = _path(entry)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or data.get("key") != entry:
        return None
    return data


def load_corpus(entry: str) -> list | None:
    """The corpus traces kept for ``entry``, or None."""
    try:
        data = json.loads(_path(f"{entry}.corpus").read_text(encoding="utf-8"))
        if data.get("schema") != SCHEMA or data.get("key") != entry:
            return None
        return [loads(json.dumps(t), "cached corpus") for t in data["traces"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError, TraceError):
        return None


def store_corpus(entry: str, traces: list) -> None:
    try:
        write_atomic(_path(f"{entry}.corpus"), json.dumps({"schema": SCHEMA, "key": entry,
                                                            "traces": [t.to_json() for t in traces]}) + "\n")
    except OutputError:
        pass


def store(entry: str, vllm: str, observations: dict, where: dict) -> None:
    """Best effort: a cache folder that cannot be written costs time, never the result."""
    try:
        write_atomic(_path(entry), json.dumps({"schema": SCHEMA, "key": entry, "vllm": vllm,
                                               "observations": observations, "where": where}) + "\n")
    except OutputError:
        pass
