"""Replay a list of traces on the vLLM of this Python and write what vLLM's code showed.

``python -m contract.branch.observe RUNNER IN OUT``: RUNNER the family (``mrv1``, ``mrv2``); IN a JSON list of traces (the
corpus the parent chose, so base and branch replay the same sequences); OUT gets, per trace, the
observed steps in ``StepRecord.to_json`` form. With ``CONTRACT_VLLM_SRC`` set, the tree named
there runs on top of the installed release (``overlay.py``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    runner, source, dest = argv
    finder = None
    if os.environ.get("CONTRACT_VLLM_SRC"):
        from contract.branch.tree import package_dir
        from contract.real import overlay

        finder = overlay.install(package_dir(Path(os.environ["CONTRACT_VLLM_SRC"])))
    from contract.core.output import write_atomic
    from contract.core.trace import loads
    from contract.families import by_name

    with open(source, encoding="utf-8") as f:
        traces = [loads(json.dumps(t), "corpus") for t in json.load(f)]
    session = by_name(runner).session()
    observations = []
    for trace in traces:
        try:
            observations.append({"name": trace.name, "steps": session.replay(trace.scenario, trace.events)})
        except Exception as exc:  # noqa: BLE001 - the runner's CannotBuild: vLLM refuses the scenario
            if type(exc).__name__ != "CannotBuild":
                raise
            observations.append({"name": trace.name, "cannot_build": str(exc).splitlines()[0]})
    write_atomic(dest, json.dumps({
        "vllm": session.version,
        "tree_modules": sorted(finder.taken) if finder else [],
        "observations": observations}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
