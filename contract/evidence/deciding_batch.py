"""The deciding lines of every confirmed finding of one release's conformance run, in one child.

``python -m contract.evidence.deciding_batch --vllm 0.30.0 [--runner mrv1|mrv2] [--reports DIR]
[--only NAME ...]``

``--only`` traces the named findings and keeps every other finding the file already holds, in the
run's order: a new root cause's findings are traced without re-tracing, or first tracing, the rest.

Reads ``DIR/conformance/vllm-<release>[-mrv2].json`` (``cudagraph-contract conform``) and takes its
*confirmed findings*: each counterexample the run confirmed (``findings``), and each halt witness of
the release's policy whose replay agreed step for step with the model's stop (a halt is no
property's violation, so ``conform`` lists it among the traces only). Per finding, the model
gives the violating step and class signature (``deciding.violation``) and the nearest
non-violating neighbour (``deciding.nearest_neighbour``, one exploration per policy); then one
child process in the release's environment replays every witness and neighbour with line tracing
(``contract/evidence/traced.py``: ``traced_batch``), and each statement kept gets its history
across the releases at hand (``since.py``).

Writes ``DIR/conformance/deciding/vllm-<release>[-mrv2].json.gz`` (gzipped JSON): what the root-cause pages read
(``contract/evidence/root_causes.py``), so they render without a vLLM environment. Exit 0 with
the file written; 2 on bad input or a missing environment.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from pathlib import Path

from contract.core import child
from contract.core.output import write_atomic
from contract.evidence import root_causes
from contract.core.scenario import Runner
from contract.core.trace import Trace, TraceError, load, record
from contract.evidence import deciding, since
from contract.real.installed import environment, replay_settings

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = "cudagraph-contract.deciding"
# Statements kept per finding with their history: the ranked head (the pages quote from it) and
# every one an anchor could name is inside it; the rest of the ranked list is kept without history.
WITH_HISTORY = 40


class Problem(Exception):
    """One line for stderr, exit 2."""


def conformance_file(reports: Path, release: str, runner: Runner) -> Path:
    return reports / "conformance" / (f"vllm-{release}" + ("-mrv2" if runner is Runner.MRV2 else "") + ".json")


def output_file(reports: Path, release: str, runner: Runner) -> Path:
    return reports / "conformance" / "deciding" / (f"vllm-{release}" + ("-mrv2" if runner is Runner.MRV2 else "")
                                                   + ".json.gz")


def confirmed(data: dict) -> list[dict]:
    """The run's confirmed findings: ``{"name", "source", "halt"}``, in the run's order."""
    out = [{"name": f["name"], "source": f["source"], "halt": False}
           for f in data.get("findings", []) if f.get("outcome") == "confirmed"]
    named = {f["name"] for f in out}
    for t in data.get("traces", []):
        if t["name"] in named or t.get("status") != "replayed" or t.get("steps") != t.get("agreeing"):
            continue
        try:
            trace = load(ROOT / t["source"])
        except (TraceError, OSError):
            continue
        if trace.property is None and trace.policy == data["policy"] and trace.expected_steps \
                and "halted" in trace.expected_steps[-1]:
            out.append({"name": t["name"], "source": t["source"], "halt": True})
    return out


def _slug(signature) -> str:
    """The head of a class id (``ViolationClass.id``) for a signature."""
    import re

    parts = [signature.property] + [x for x in (signature.role, signature.runtime_mode) if x != "-"] + [signature.what]
    if signature.detail:
        parts.append(signature.detail)
    return re.sub(r"[^A-Za-z0-9_=|+-]+", "-", "-".join(parts)).replace("|", ",").strip("-")


def shown_class(trace: Trace, policy):
    """(signature, first step) of the class the trace witnesses: a class witness's own (its name
    is ``<policy>-<class id>``), else the first showing the trace's property, else the first shown
    (a halt); None when the model shows nothing on its events."""
    from contract.core.classes import signatures
    from contract.core.engine import Run
    from contract.core.properties import check

    shown = []
    run = Run(trace.scenario, policy)
    for event in trace.events:
        if not run.can(event):
            break
        record_ = run.apply(event)
        shown += [(sig, record_.index) for sig, _ in signatures(record_, check(record_, trace.scenario, policy.runner))]
    own = trace.name.removeprefix(f"{trace.policy}-")
    for sig, step in shown:
        if own != trace.name and own.startswith(_slug(sig) + "--"):
            return sig, step
    for sig, step in shown:
        if trace.property is not None and sig.property == trace.property:
            return sig, step
    return shown[0] if shown else None


def prepare(findings: list[dict], policy) -> tuple[list[dict], list[dict]]:
    """(pairs for the child, the findings' model side). A finding whose violation the model does
    not show, or which has no neighbour, is kept with the reason and not replayed."""
    from contract.core.explore import explore

    exploration = None
    pairs, entries = [], []
    for f in findings:
        trace = load(ROOT / f["source"])
        entry = {"name": f["name"], "source": f["source"], "halt": f["halt"],
                 "scenario": trace.scenario.to_json()}
        found = shown_class(trace, policy)
        if found is None:
            entries.append({**entry, "problem": f"{policy.name} shows no violation on these events"})
            continue
        signature, step = found
        entry.update({"signature": signature.to_json(), "step": step,
                      "events": [e for e in (trace.to_json().get("events") or [])]})
        if exploration is None:
            exploration = explore(policy, classify=True)
        neighbour = deciding.nearest_neighbour(trace.scenario, trace.events, signature, step,
                                               exploration.occurrences, exploration.scenario_list, policy)
        if neighbour is None:
            entries.append({**entry, "problem": f"no scenario of {policy.name} avoids the class and takes "
                                                f"the events to step {step}"})
            continue
        shown = deciding.violation(neighbour.scenario, list(neighbour.events), policy)
        entry["neighbour"] = {"scenario": neighbour.scenario.to_json(), "differing": list(neighbour.differing),
                              "describe": neighbour.describe(trace.scenario), "events": len(neighbour.events),
                              "model_shows": shown[0].to_json() if shown else None}
        neighbour_trace = record(neighbour.scenario, policy, list(neighbour.events), name=f"{trace.name}-neighbour",
                                 origin={"engine": "deciding", "witness": trace.name})
        pairs.append({"key": f["name"], "witness": trace.to_json(), "neighbour": neighbour_trace.to_json(),
                      "step": step, "fields": list(neighbour.differing)})
        entries.append(entry)
    return pairs, entries


def with_history(items: list[dict], release: str, releases: dict) -> list[dict]:
    for i, item in enumerate(items):
        if i < WITH_HISTORY and item.get("since") is None:
            item["since"] = since.since(release, item["path"], item["function"], list(item["lines"]), releases)
    return items


def run(release: str, runner: Runner, reports: Path, only: list[str] | None = None) -> dict:
    from contract.families import load_policy

    path = conformance_file(reports, release, runner)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise Problem(f"{path} cannot be read ({exc}); run `cudagraph-contract conform --vllm {release}` first") \
            from None
    python = environment(release)
    if not python.exists():
        raise Problem(f"no environment for vLLM {release}: {python} is missing")
    policy = load_policy(data["policy"])
    if policy.runner is not runner:
        raise Problem(f"{path} was replayed with {policy.runner.value}, not {runner.value}")
    findings = [f for f in confirmed(data) if not only or f["name"] in only]
    timings: dict[str, float] = {}
    started = time.perf_counter()
    pairs, entries = prepare(findings, policy)
    timings["model"] = round(time.perf_counter() - started, 2)
    started = time.perf_counter()
    # A compile reads no cache another replay wrote: the two replays of a pair differ in what vLLM
    # decided, not in what an earlier compile left on disk.
    settings = replay_settings() | {"VLLM_DISABLE_COMPILE_CACHE": "1"}
    result = {"pairs": [], "seconds": {}}
    if pairs:
        try:
            result = child.run("contract.evidence.traced:traced_batch", {"pairs": pairs},
                               what=f"the traced replays on vLLM {release}", timeout=None, python=python,
                               settings=settings, root=ROOT).value
        except child.ChildProblem as exc:
            raise Problem(str(exc)) from None
    timings["child"] = round(time.perf_counter() - started, 2)
    timings["child_start"] = result["seconds"].get("start", 0.0)
    started = time.perf_counter()
    releases = since.sources(ROOT)
    by_key = {p["key"]: p for p in result["pairs"]}
    for entry in entries:
        got = by_key.get(entry["name"])
        if got is None:
            continue
        entry["replays"] = {"witness": got["witness"], "neighbour": got["neighbour"]}
        if "deciding" in got:
            entry["deciding"] = with_history(got["deciding"], release, releases)
            entry["setting_reads"] = got["setting_reads"]
            entry["reached_only"] = got["reached_only"]
        else:
            entry["problem"] = "; ".join(f"vLLM {release} cannot build the {side}: {got[side]['cannot_build']}"
                                         for side in ("witness", "neighbour") if "cannot_build" in got[side])
    timings["since"] = round(time.perf_counter() - started, 2)
    return {"schema": SCHEMA, "version": 1, "vllm": release, "runner": runner.name, "policy": policy.name,
            "conformance": path.name, "releases_checked": sorted(releases), "findings": entries,
            "seconds": timings}


def merged(before: dict, traced: dict, order: list[dict]) -> dict:
    """``traced``'s findings in place of ``before``'s of the same name, the others kept, in the
    conformance run's order (``order``: ``confirmed``)."""
    by_name = {f["name"]: f for f in before.get("findings", [])} | {f["name"]: f for f in traced["findings"]}
    return traced | {"findings": [by_name[f["name"]] for f in order if f["name"] in by_name]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m contract.evidence.deciding_batch",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--vllm", required=True, help="the release, e.g. 0.30.0")
    parser.add_argument("--runner", choices=("auto", "mrv1", "mrv2"), default="auto",
                        help="auto: MRV2 from 0.34, MRV1 before (0.33.0 replays either: name it)")
    parser.add_argument("--reports", type=Path, default=ROOT / "reports")
    parser.add_argument("--only", action="append", help="a finding's name; repeatable")
    args = parser.parse_args(argv)
    if args.runner == "auto":
        runner = Runner.MRV2 if int(args.vllm.split(".")[1]) >= 34 else Runner.MRV1
    else:
        runner = Runner[args.runner.upper()]
    try:
        out = run(args.vllm, runner, args.reports, args.only)
    except Problem as exc:
        print(exc, file=sys.stderr)
        return 2
    target = output_file(args.reports, args.vllm, runner)
    if args.only and target.exists():
        out = merged(json.loads(gzip.decompress(target.read_bytes())), out, confirmed(
            json.loads(conformance_file(args.reports, args.vllm, runner).read_text(encoding="utf-8"))))
    target.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(target, root_causes.pack(out))
    done = sum("deciding" in f for f in out["findings"])
    print(f"vLLM {args.vllm} {runner.value}: {done} of {len(out['findings'])} findings traced "
          f"({out['seconds']}); {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
