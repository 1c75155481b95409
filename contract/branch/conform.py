"""``conform --vllm-src PATH --base VERSION``: the classes vLLM's own code shows on a branch and on
the release it starts from.

The same traces (the covering corpus of both the release's policy and the branch's block, or the
``--traces`` given) are replayed twice in the release's environment: once as installed, once with
the branch's differing modules on top (``overlay.py``). The P1–P6 checks and class signatures then
run on each side's observations (``judge.py``); an occurrence is a signature in a trace, and new,
fixed and inherited are decided per trace as the model's differential decides them per scenario.
Nothing here is the model's prediction: both sides are vLLM's code, with CUDA graphs simulated
on CPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

from contract.core.classes import Occurrence, Signature, classes_from, signatures
from contract.real import judge
from contract.core.differential import Differential
from contract.core.properties import check
from contract.core.trace import Trace


class ObserveProblem(Exception):
    """The replay in the release's environment failed; one line."""


def observe(python: Path, root: Path, traces: list[Trace], tree: Path | None, runner: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="cudagraph-contract-") as tmp:
        source, dest = Path(tmp) / "corpus.json", Path(tmp) / "observed.json"
        source.write_text(json.dumps([t.to_json() for t in traces]), encoding="utf-8")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
        env.pop("CONTRACT_VLLM_SRC", None)
        if tree is not None:
            env["CONTRACT_VLLM_SRC"] = str(Path(tree).resolve())
        done = subprocess.run([str(python), "-m", "contract.branch.observe", runner, str(source), str(dest)],
                              env=env, capture_output=True, text=True)
        if done.returncode != 0 or not dest.is_file():
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise ObserveProblem(f"the replay{' of ' + str(tree) if tree else ''} failed in {python}: {last}")
        return json.loads(dest.read_text(encoding="utf-8"))


def occurrences(traces: list[Trace], observed: dict, label: str, family) -> tuple[dict, dict]:
    """Per signature, the traces that show it on vLLM's code (witness cut at the step), and the
    witness traces by (signature, trace name)."""
    by_name = {o["name"]: o for o in observed["observations"]}
    found: dict[Signature, list[Occurrence]] = {}
    witnesses: dict[tuple, Trace] = {}
    for index, trace in enumerate(traces):
        steps = by_name.get(trace.name, {}).get("steps")
        if not steps:
            continue
        events = trace.events[: len(steps)]
        records = judge.records(steps, events, family.descriptor_from_json)
        seen: set[Signature] = set()
        for r in records:
            for sig, v in signatures(r, check(r, trace.scenario, family.runner)):
                if sig in seen:
                    continue
                seen.add(sig)
                cut = tuple(events[: r.index + 1])
                found.setdefault(sig, []).append(Occurrence(index, trace.scenario, cut, r.index,
                                                            v.message if v else r.halted))
                judged = [x.to_json() for rec in records[: r.index + 1] for x in check(rec, trace.scenario, family.runner)]
                witnesses[(sig, index)] = Trace(
                    trace.scenario, label, list(cut), name=f"{label}-{trace.name}",
                    property=sig.property if sig.property.startswith("P") else None,
                    expected_violations=judged, expected_steps=steps[: r.index + 1],
                    origin={"engine": "conformance", "vllm": observed["vllm"], "corpus_trace": trace.name})
    return found, witnesses


def _subset(occs: dict, other: dict, keep_shared: bool) -> dict:
    theirs = {(sig, o.scenario_index) for sig, os_ in other.items() for o in os_}
    out: dict = {}
    for sig, os_ in occs.items():
        for o in os_:
            if ((sig, o.scenario_index) in theirs) == keep_shared:
                out.setdefault(sig, []).append(o)
    return out


def compare(traces: list[Trace], base_obs: dict, branch_obs: dict, branch_label: str, base_label: str,
            family) -> Differential:
    mine, my_witnesses = occurrences(traces, branch_obs, branch_label, family)
    theirs, their_witnesses = occurrences(traces, base_obs, base_label, family)

    def classes(subset, witnesses):
        return classes_from(subset, lambda o, sig: witnesses[(sig, o.scenario_index)])

    return Differential(branch_label, base_label,
                        new=classes(_subset(mine, theirs, False), my_witnesses),
                        fixed=classes(_subset(theirs, mine, False), their_witnesses),
                        inherited=classes(_subset(mine, theirs, True), my_witnesses))
