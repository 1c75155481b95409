"""Replay traces on the vLLM of this Python and return what vLLM's code showed: the child side of a
branch replay (``contract.core.child``), run in the release's environment.

The payload names the runner family, the traces (the corpus the parent chose, so base and branch
replay the same sequences) and, for the branch side, a vLLM tree whose differing modules run on top
of the installed release (``contract/real/overlay.py``) with the functions it changes watched
(``reached``: those the replay ran). Per trace the result holds the observed
steps in ``StepRecord.to_json`` form and the decision points each step reached (``decisions.Log``),
which the parent's impact selection reads; ``where`` says where each point's code lives.
"""

from __future__ import annotations

import json
from pathlib import Path


def _overlay(payload: dict):
    """The tree's modules on top of the release, its changed functions watched; None for the base."""
    if not payload.get("tree"):
        return None
    from contract.real import overlay

    tree = Path(payload["tree"])
    if not tree.is_absolute() or not tree.is_dir():  # the child runs elsewhere than its parent
        raise ValueError(f"the tree {tree} is not a folder's absolute path")
    return overlay.install(tree, payload.get("watch"))


def _where_from(finder) -> dict:
    return {"tree_modules": sorted(finder.taken) if finder else [], "reached": sorted(finder.reached) if finder else []}


def sizes(payload: dict) -> dict:
    """The capture-size settings of the payload through the family's real side
    (``contract/runners/<runner>/real/sizes.py``): one record per setting, in order."""
    finder = _overlay(payload)
    from contract.core.sizes import SizeSetting
    from contract.families import by_name
    from contract.real.provenance import loaded

    family = by_name(payload["runner"])
    session = family.session()
    records = family.sizes.observe(session, [SizeSetting.from_json(x) for x in payload["settings"]])
    return {"vllm": session.version, **_where_from(finder), "records": records, "modules": loaded()}


def observe(payload: dict) -> dict:
    finder = _overlay(payload)
    from contract.core import progress
    from contract.core.trace import loads
    from contract.families import by_name
    from contract.real.decisions import WHERE
    from contract.real.provenance import loaded

    traces = [loads(json.dumps(t), "corpus") for t in payload["traces"]]
    session = by_name(payload["runner"]).session()
    session.attention_backends = dict(payload.get("backends") or {})
    observations = []
    for trace in traces:
        try:
            steps = session.replay(trace.scenario, trace.events)
        except Exception as exc:  # noqa: BLE001 - the runner's CannotBuild: vLLM refuses the scenario
            if type(exc).__name__ != "CannotBuild":
                raise
            observations.append({"name": trace.name, "cannot_build": str(exc).splitlines()[0]})
            progress.advance()
            continue
        log = getattr(session, "decisions", None)
        observations.append({"name": trace.name, "steps": steps, "path": list(log.path) if log is not None else []})
        progress.advance()
    return {"vllm": session.version, **_where_from(finder), "observations": observations,
            "where": dict(sorted(WHERE.items())), "modules": loaded()}


def backend_levels(payload: dict) -> dict:
    """Registry name -> (level, file), for the attention backends defined in ``payload["paths"]``,
    by the getters of the vLLM of this Python, on the replay's platform and a default scenario's config."""
    from contract.core.scenario import Scenario
    from contract.families import by_name
    from contract.real.attention_backends import levels_in

    family = by_name(payload["runner"])
    session = family.session()
    return {"levels": levels_in(payload["paths"], session.configs.get(Scenario(runner=family.runner)))}
