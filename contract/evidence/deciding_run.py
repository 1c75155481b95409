"""The deciding lines of one witness on one release: its nearest non-violating neighbour from the
model, both replayed on the release's code with line tracing, the differences ranked, and the
history of each statement across the releases at hand.

``python -m contract.evidence.deciding_run TRACE --vllm 0.30.0 [--neighbour FILE] [--vllm-src PATH]
[--json OUT.json] [--markdown OUT.md]``

``--neighbour`` takes a trace file or a JSON scenario (``Scenario.to_json``) and replaces the
model's choice. The two replays run one after the other, each in a fresh process of the release's
environment (``contract/evidence/traced.py``), so each builds its ``VllmConfig`` and compiles
its models itself. Exit 0 with the result written; 2 on bad input or a missing environment.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from contract.core import child
from contract.real.installed import environment, import_root, missing, replay_settings
from contract.families import policy_for
from contract.evidence import deciding, since
from contract.core.events import describe_event
from contract.core.scenario import Runner, Scenario
from contract.core.trace import Trace, TraceError, load, record

ROOT = Path(__file__).resolve().parents[2]


class Problem(Exception):
    """One line for stderr, exit 2."""


def replay(python: Path, trace: Trace, tree: Path | None) -> dict:
    """The trace replayed with line tracing in ``python``'s vLLM (``contract/evidence/traced.py``)."""
    started = time.perf_counter()
    try:
        result = child.run("contract.evidence.traced:traced",
                           {"trace": trace.to_json(), "tree": str(tree.resolve()) if tree is not None else None},
                           what=f"the traced replay of {trace.name}", timeout=None, python=python,
                           settings=replay_settings(), root=import_root()).value
    except child.ChildProblem as exc:
        raise Problem(str(exc)) from None
    result["seconds"]["process"] = round(time.perf_counter() - started, 2)
    return result


def _neighbour_scenario(path: Path, runner: Runner) -> Scenario:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise Problem(f"--neighbour {path} cannot be read: {exc}") from None
    if isinstance(data, dict) and data.get("schema"):
        try:
            return load(path).scenario
        except TraceError as exc:
            raise Problem(str(exc)) from None
    try:
        return Scenario.from_json({"runner": runner.name, **data})
    except ValueError as exc:
        raise Problem(f"--neighbour {path}: {exc}") from None


def run(trace_path: Path, version: str, neighbour_path: Path | None = None, tree: Path | None = None) -> dict:
    from contract.core.explore import explore
    from contract.families import load_policy

    try:
        witness = load(trace_path)
    except TraceError as exc:
        raise Problem(str(exc)) from None
    runner = witness.scenario.runner.name.lower()
    python = environment(version)
    if not python.exists():
        raise Problem(missing(version))
    policy = load_policy(policy_for(version, runner))
    timings: dict[str, float] = {}
    found = deciding.violation(witness.scenario, witness.events, policy)
    if found is None:
        raise Problem(f"{trace_path}: {policy.name} shows no violation on these events")
    signature, step = found
    started = time.perf_counter()
    if neighbour_path is not None:
        neighbour = deciding.given_neighbour(witness.scenario, _neighbour_scenario(neighbour_path, witness.scenario.runner),
                                             witness.events, policy)
    else:
        exploration = explore(policy, classify=True)
        neighbour = deciding.nearest_neighbour(witness.scenario, witness.events, signature, step,
                                               exploration.occurrences, exploration.scenario_list, policy)
        if neighbour is None:
            raise Problem(f"no scenario of {policy.name} avoids {signature} and takes the events to step {step}")
    timings["neighbour"] = round(time.perf_counter() - started, 2)
    shown = deciding.violation(neighbour.scenario, list(neighbour.events), policy)
    neighbour_trace = record(neighbour.scenario, policy, list(neighbour.events), name=f"{witness.name}-neighbour",
                             origin={"engine": "deciding", "witness": witness.name})
    mine = replay(python, witness, tree)
    theirs = replay(python, neighbour_trace, tree)
    timings["witness_replay"] = mine["seconds"]["process"]
    timings["neighbour_replay"] = theirs["seconds"]["process"]
    if "cannot_build" in mine:
        raise Problem(f"vLLM {version} cannot build the witness: {mine['cannot_build']}")
    if "cannot_build" in theirs:
        raise Problem(f"vLLM {version} cannot build the neighbour: {theirs['cannot_build']}; pass another with --neighbour")
    started = time.perf_counter()
    items = deciding.deciding(mine, theirs, step, neighbour.differing)
    releases = since.sources(ROOT)
    release = mine["vllm"].split("+")[0]
    for item in items:
        item.since = since.since(release, item.path, item.function, list(item.lines), releases) \
            if tree is None else None
    timings["diff_and_since"] = round(time.perf_counter() - started, 2)
    return {
        "witness": {"trace": str(trace_path), "name": witness.name, "scenario": witness.scenario.to_json(),
                    "signature": signature.to_json(), "step": step,
                    "events": [describe_event(e) for e in witness.events], "agrees": mine["agrees"]},
        "neighbour": {"scenario": neighbour.scenario.to_json(), "chosen": neighbour.chosen,
                      "differing": list(neighbour.differing), "describe": neighbour.describe(witness.scenario),
                      "events": len(neighbour.events), "model_shows": shown[0].to_json() if shown else None,
                      "agrees": theirs["agrees"]},
        "vllm": mine["vllm"], "release": release, "policy": policy.name,
        "tree_modules": mine.get("tree_modules", []),
        "deciding": [d.to_json() for d in items],
        "reached_only": deciding.reached_only(mine, theirs, step),
        "setting_reads": [d.to_json() for d in deciding.setting_reads(mine, theirs, step, neighbour.differing)],
        "seconds": timings,
        "replay_seconds": {"witness": mine["seconds"], "neighbour": theirs["seconds"]},
        "traced": {"witness": {"frames": mine["frames"], "instructions": mine["instructions"]},
                   "neighbour": {"frames": theirs["frames"], "instructions": theirs["instructions"]}},
        "releases_checked": sorted(releases),
    }


def markdown(result: dict) -> list[str]:
    w, n = result["witness"], result["neighbour"]
    items = [deciding.Deciding(**{k: (tuple(v) if k in ("def_lines", "lines") else v)
                                  for k, v in d.items() if k != "label"}) for d in result["deciding"]]
    lines = [f"### Deciding lines on vLLM {result['release']}", "",
             f"Witness `{w['name']}` ({w['signature']['property']} at step {w['step']}); neighbour "
             f"({n['chosen']}): {n['describe']}, replayed with {n['events']} of the witness's events. "
             "Each statement ran in both replays at the same step and went another way in each; "
             "functions are linked at their `def`, statements at their lines.", ""]
    for at, only in sorted(result.get("reached_only", {}).items(), key=lambda kv: -int(kv[0])):
        where = "At start-up" if at == str(deciding.CONFIG_STEP) else f"At step {at}"
        for side in ("witness", "neighbour"):
            if only[side]:
                names = only[side][:6] + ([f"{len(only[side]) - 6} more"] if len(only[side]) > 6 else [])
                lines.append(f"{where} only the {side} entered: " + ", ".join(f"`{x}`" for x in names) + ".")
    tree = frozenset(m.split(".", 1)[1].replace(".", "/") + ".py" for m in result.get("tree_modules", []))
    reads = result.get("setting_reads") or []
    if reads:
        cited = [(f"`{r['function']}`, lines {r['lines'][0]}-{r['lines'][1]} ({r['label']})" if r["path"] in tree else
                  f"[`{r['function']}`, lines {r['lines'][0]}-{r['lines'][1]} ({r['label']})]"
                  f"({deciding.permalink(result['release'], r['path'], r['lines'])})")
                 + (" (start-up)" if r["step"] == deciding.CONFIG_STEP else f" (step {r['step']})")
                 for r in reads[:6]]
        lines += ["", "Differing too, but reading the differing setting itself (not ranked): " + "; ".join(cited)
                  + (f"; and {len(reads) - 6} more" if len(reads) > 6 else "") + "."]
    lines.append("")
    return lines + deciding.markdown(result["release"], items, w["events"], tree)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m contract.evidence.deciding_run", description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--vllm", required=True, help="the release to replay on, e.g. 0.30.0")
    parser.add_argument("--neighbour", type=Path, help="a trace file or a JSON scenario to compare with")
    parser.add_argument("--vllm-src", type=Path, help="a vLLM tree run on top of the release")
    parser.add_argument("--json", type=Path, dest="json_out")
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args(argv)
    try:
        result = run(args.trace, args.vllm, args.neighbour, args.vllm_src)
    except Problem as exc:
        print(exc, file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - an environment problem from installed.py
        if type(exc).__name__ == "EnvironmentProblem":
            print(exc, file=sys.stderr)
            return 2
        raise
    text = json.dumps(result, indent=1)
    if args.json_out:
        args.json_out.write_text(text + "\n", encoding="utf-8")
    md = "\n".join(markdown(result)) + "\n"
    if args.markdown:
        args.markdown.write_text(md, encoding="utf-8")
    if not args.json_out and not args.markdown:
        print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
