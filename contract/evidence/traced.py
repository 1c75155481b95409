"""One trace, or many witness/neighbour pairs, replayed on the release's code with line tracing:
the child side of the deciding-lines search (``contract.core.child``), run in the release's
environment.

The runner family's replay session runs the trace (its tree's modules on top of the installed
release when the payload names a tree, ``contract/real/overlay.py``); the tracer
(``contract/real/lines.py``) follows the frames of vLLM's code under every decision point the
session tracks, and numbers the steps as the session's decision log closes them.

``traced_batch`` replays many pairs in one process (one vLLM import per release, not one per
replay): before each replay the session's config and model caches are emptied, so every replay
builds its ``VllmConfig`` and compiles its models itself, as a fresh process does; each pair's
differing statements are computed here and only they travel back.
"""

from __future__ import annotations

import json
import time
from pathlib import Path


def _replay(session, trace, packages: list[Path], root_codes: set) -> dict:
    """One traced replay on an open session: the ``traced`` result without the session's start."""
    from contract.real import decisions, lines

    tracer = lines.Tracer(packages, set(), root_codes)
    log = session.decisions
    close_step = log.close_step

    def closing(kind):  # the decision log closes every step: the next one starts
        close_step(kind)
        tracer.step += 1

    log.close_step = closing
    started = time.perf_counter()
    result: dict = {"vllm": session.version, "runner": trace.scenario.runner.name}
    tracer.install()
    try:
        steps = session.replay(trace.scenario, trace.events)
        result["steps"] = steps
    except Exception as exc:  # noqa: BLE001 - the runner's CannotBuild: vLLM refuses the scenario
        if type(exc).__name__ != "CannotBuild":
            raise
        steps = []
        result["cannot_build"] = str(exc).splitlines()[0]
    finally:
        tracer.uninstall()
        log.close_step = close_step
    result.update({
        "seconds": {"replay": round(time.perf_counter() - started, 2)},
        "agrees": steps == trace.expected_steps if trace.expected_steps else None,
        "decision_path": log.path,
        "where": dict(decisions.WHERE),
        "statements": tracer.executions.to_json(),
        "crash": tracer.crash(steps),
        "reached": {str(s): sorted([list(x) for x in v]) for s, v in sorted(tracer.reached.items())},
        "path_functions": {str(s): sorted([list(x) for x in v]) for s, v in sorted(tracer.path_functions.items())},
        "frames": tracer.frames, "instructions": tracer.instructions,
    })
    return result


def _session(runner):
    from contract.families import by_runner

    return by_runner(runner).session()


def traced(payload: dict) -> dict:
    started = time.perf_counter()
    finder = None
    if payload.get("tree"):
        from contract.real import overlay

        finder = overlay.install(Path(payload["tree"]))
    from contract.core.trace import loads
    from contract.real import decisions, lines

    trace = loads(json.dumps(payload["trace"]), "request")
    root_codes = lines.recording_roots(decisions)  # filled while the session tracks its points
    # The session before vLLM's first import: it installs the platform that import reads
    # (``utils/torch_utils.py``'s ``PIN_MEMORY``).
    session = _session(trace.scenario.runner)
    import vllm

    packages = [Path(vllm.__file__).parent] + ([finder.tree] if finder is not None else [])
    ready = time.perf_counter()
    result = _replay(session, trace, packages, root_codes | lines.config_root())
    result["tree_modules"] = sorted(finder.taken) if finder else []
    result["seconds"] = {"session": round(ready - started, 2), **result["seconds"]}
    return result


def _fresh(session) -> None:
    """Empty the session's per-config caches: the next replay builds its ``VllmConfig`` (traced
    ``__post_init__``) and its models (a traced first-forward compile) as a new process would."""
    configs = getattr(session, "configs", None)
    if configs is not None:
        session.configs = type(configs)()
    models = getattr(session, "_models", None)
    if isinstance(models, dict):
        models.clear()


def traced_batch(payload: dict) -> dict:
    """``payload["pairs"]``: ``{"key", "witness", "neighbour"}`` traces (JSON), ``"step"`` (the
    witness's violating step) and ``"fields"`` (the settings that differ). Returns, per pair, the
    ranked deciding statements without a limit, the setting reads, the functions one side alone
    entered, both replays' agreement and their seconds."""
    started = time.perf_counter()
    from contract.core.trace import loads
    from contract.evidence import deciding
    from contract.real import decisions, lines

    pairs = payload["pairs"]
    traces = [(p, loads(json.dumps(p["witness"]), "request"), loads(json.dumps(p["neighbour"]), "request"))
              for p in pairs]
    runners = {w.scenario.runner for _, w, _ in traces}
    if len(runners) > 1:
        raise ValueError("one batch replays one runner's traces")
    root_codes = lines.recording_roots(decisions)  # filled while the session tracks its points
    session = _session(runners.pop()) if runners else None  # before vLLM's first import (``traced``)
    import vllm

    root_codes |= lines.config_root()
    packages = [Path(vllm.__file__).parent]
    out = []
    ready = time.perf_counter()
    for pair, witness, neighbour in traces:
        replays = []
        for trace in (witness, neighbour):
            _fresh(session)
            replays.append(_replay(session, trace, packages, root_codes))
        mine, theirs = replays
        step, fields = pair["step"], tuple(pair["fields"])
        entry = {"key": pair["key"], "vllm": mine["vllm"],
                 "witness": {"agrees": mine["agrees"], "seconds": mine["seconds"]["replay"],
                             "frames": mine["frames"], "instructions": mine["instructions"]},
                 "neighbour": {"agrees": theirs["agrees"], "seconds": theirs["seconds"]["replay"],
                               "frames": theirs["frames"], "instructions": theirs["instructions"]}}
        for side, got in (("witness", mine), ("neighbour", theirs)):
            if "cannot_build" in got:
                entry[side]["cannot_build"] = got["cannot_build"]
        if "cannot_build" not in mine and "cannot_build" not in theirs:
            entry["deciding"] = [d.to_json() for d in deciding.deciding(mine, theirs, step, fields, limit=None)]
            entry["setting_reads"] = [d.to_json() for d in deciding.setting_reads(mine, theirs, step, fields)]
            entry["reached_only"] = deciding.reached_only(mine, theirs, step)
        out.append(entry)
    return {"vllm": vllm.__version__, "pairs": out,
            "seconds": {"start": round(ready - started, 2), "all": round(time.perf_counter() - started, 2)}}
