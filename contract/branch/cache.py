"""The base side of a branch replay, computed once per release, runner, corpus and tool version and
kept in the user's cache folder, so a branch run replays only the branch.

A cache entry is the base release's observations (steps and decision paths) of every trace replayed
on it so far, by what the trace replays (``trace_digest``), keyed by the release version, the runner
family, a digest of this package's own code (a change to the model, the replay or the corpus makes
a new key) and a digest of the release's own record of its files (``provenance.digest``); the
generated corpora are kept beside it. Only the parent writes an entry, from a base run whose files
it checked (``contract/real/provenance.py``); it is written whole (``write_atomic``) with a digest of
its content, and read as data, the digest checked first. A missing entry is recomputed; one that
fails its check is removed and recomputed, with a line saying so (``Notes``). While a tree's code runs
(``guard``), every file of the cache folder is watched: one it changed or added is removed when it
ends, so a tree cannot decide the next review. A cache folder that cannot be written costs time,
never the result.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
from pathlib import Path

from contract.core.output import OutputError, write_atomic
from contract.core.trace import TraceError, loads
from contract.real.installed import cache_root as root  # shared with the environments (envs/)

SCHEMA = "cudagraph-contract.base-observations"
PACKAGE = Path(__file__).resolve().parents[1]
FOLDER = "base-observations"


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


def key(version: str, runner: str, release_digest: str) -> str:
    return f"{version}-{runner}-{tool_digest()}-{release_digest}"


def trace_digest(trace) -> str:
    """What a trace replays (its scenario and events), whatever its name."""
    return hashlib.sha256(json.dumps([trace.scenario.to_json(), [e for e in trace.to_json()["events"]]],
                                     sort_keys=True).encode()).hexdigest()[:24]


class Notes(list):
    """What happened to the cache during a run, one line each, for the person to read."""


def _path(entry: str) -> Path:
    return root() / FOLDER / f"{entry}.json"


def _content_digest(content: object) -> str:
    return hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _read(entry: str, notes: Notes) -> object | None:
    """The content of a verified entry, or None; an entry that fails its check is removed."""
    path = _path(entry)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        data = None
    if (isinstance(data, dict) and data.get("schema") == SCHEMA and data.get("key") == entry
            and "content" in data and data.get("digest") == _content_digest(data["content"])):
        return data["content"]
    notes.append(f"the cache entry {path} failed its check (changed since this tool wrote it): removed and rebuilt")
    with contextlib.suppress(OSError):
        path.unlink()
    return None


def _write(entry: str, content: object) -> None:
    """Best effort: a cache folder that cannot be written costs time, never the result."""
    with contextlib.suppress(OutputError):
        write_atomic(_path(entry), json.dumps({"schema": SCHEMA, "key": entry, "digest": _content_digest(content),
                                               "content": content}) + "\n")


def load(entry: str, notes: Notes) -> dict | None:
    """The cached ``{"vllm", "observations", "where"}`` of ``entry``, or None."""
    content = _read(entry, notes)
    if not (isinstance(content, dict) and isinstance(content.get("observations"), dict)
            and isinstance(content.get("where"), dict)):
        return None
    return content


def store(entry: str, vllm: str, observations: dict, where: dict) -> None:
    _write(entry, {"vllm": vllm, "observations": observations, "where": where})


def load_sizes(entry: str, settings: list[dict], notes: Notes) -> list | None:
    """The release's size records of exactly ``settings`` (``contract/branch/sizes.py``), or None."""
    content = _read(f"{entry}.sizes", notes)
    if not (isinstance(content, dict) and content.get("settings") == settings and isinstance(content.get("records"), list)):
        return None
    return content["records"]


def store_sizes(entry: str, settings: list[dict], records: list) -> None:
    _write(f"{entry}.sizes", {"settings": settings, "records": records})


def load_corpus(entry: str, notes: Notes) -> list | None:
    """The corpus traces kept for ``entry``, or None."""
    content = _read(f"{entry}.corpus", notes)
    try:
        return [loads(json.dumps(t), "cached corpus") for t in content] if isinstance(content, list) else None
    except (ValueError, TypeError, AttributeError, TraceError):
        return None


def store_corpus(entry: str, traces: list) -> None:
    _write(f"{entry}.corpus", [t.to_json() for t in traces])


def _state() -> dict[str, tuple]:
    """Every file of the cache folder by path: what a change to it changes (a write cannot restore
    its ``ctime``)."""
    out = {}
    for folder, _, names in os.walk(root() / FOLDER):
        for name in names:
            path = os.path.join(folder, name)
            with contextlib.suppress(OSError):
                st = os.lstat(path)
                out[path] = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    return out


@contextlib.contextmanager
def guard(notes: Notes):
    """Around code the person named (a tree's modules): a cache file it changes or adds is removed
    when it ends, with a line saying so."""
    before = _state()
    try:
        yield
    finally:
        after = _state()
        for path in sorted(p for p, st in after.items() if before.get(p) != st):
            notes.append(f"the cache entry {path} changed while the tree's code ran: removed (the next run rebuilds it)")
            with contextlib.suppress(OSError):
                os.unlink(path)
