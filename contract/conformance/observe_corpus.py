"""Replay a list of traces on the vLLM of this Python and write what vLLM's code showed.

``python -m contract.conformance.observe_corpus IN OUT``: IN is a JSON list of traces (the
corpus the parent chose, so base and branch replay the same sequences); OUT gets, per trace, the
observed steps in ``StepRecord.to_json`` form. With ``CONTRACT_VLLM_SRC`` set, the tree named
there runs on top of the installed release (``overlay.py``).
"""

from __future__ import annotations

import json
import os
import sys


def main(argv: list[str]) -> int:
    source, dest = argv
    finder = None
    if os.environ.get("CONTRACT_VLLM_SRC"):
        from contract.conformance import overlay

        finder = overlay.install(os.environ["CONTRACT_VLLM_SRC"])
    from contract.conformance.replay import CannotBuild, Session
    from contract.output import write_atomic
    from contract.trace import loads

    with open(source, encoding="utf-8") as f:
        traces = [loads(json.dumps(t), "corpus") for t in json.load(f)]
    session = Session()
    observations = []
    for trace in traces:
        try:
            observations.append({"name": trace.name, "steps": session.replay(trace.scenario, trace.events)})
        except CannotBuild as exc:
            observations.append({"name": trace.name, "cannot_build": str(exc).splitlines()[0]})
    write_atomic(dest, json.dumps({
        "vllm": session.version, "block": session.block.where,
        "tree_modules": sorted(finder.taken) if finder else [],
        "observations": observations}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
