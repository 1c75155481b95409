"""One trace replayed on the release's code with line tracing: the child side of the deciding-lines
search (``contract.core.child``), run in the release's environment.

The runner family's replay session runs the trace (its tree's modules on top of the installed
release when the payload names a tree, ``contract/real/overlay.py``); the tracer
(``contract/real/lines.py``) follows the frames of vLLM's code under every decision point the
session tracks, and numbers the steps as the session's decision log closes them.
"""

from __future__ import annotations

import json
import time
from pathlib import Path


def traced(payload: dict) -> dict:
    started = time.perf_counter()
    finder = None
    if payload.get("tree"):
        from contract.real import overlay

        finder = overlay.install(Path(payload["tree"]))
    import vllm

    from contract.core.trace import loads
    from contract.families import by_runner
    from contract.real import decisions, lines

    trace = loads(json.dumps(payload["trace"]), "request")
    root_codes = lines.recording_roots(decisions)
    session = by_runner(trace.scenario.runner).session()
    packages = [Path(vllm.__file__).parent] + ([finder.tree] if finder is not None else [])
    tracer = lines.Tracer(packages, set(), root_codes | lines.config_root())
    log = session.decisions
    close_step = log.close_step

    def closing(kind):  # the decision log closes every step: the next one starts
        close_step(kind)
        tracer.step += 1

    log.close_step = closing
    ready = time.perf_counter()
    result: dict = {"vllm": session.version, "runner": trace.scenario.runner.name,
                    "tree_modules": sorted(finder.taken) if finder else []}
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
    done = time.perf_counter()
    result.update({
        "seconds": {"session": round(ready - started, 2), "replay": round(done - ready, 2)},
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
