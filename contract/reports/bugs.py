"""``reports/bugs.md``: the corpus of real vLLM CUDA-graph bugs and what the branch check found of
each (``contract/branch/bugs.py``), and each bug's ``README.md``.

The page opens with the recall (found of those re-injected), then what to model next (the missed
bugs grouped by what the tool lacks), the totals per category and per symptom, and a row per bug.
"""

from __future__ import annotations

import json
from collections import Counter

from contract.branch.bugs import (
    CATEGORIES,
    FOUND,
    IN_RELEASE,
    MISSED,
    NOT_REINJECTABLE,
    SYMPTOMS,
    UNEXERCISED,
    Bug,
    Outcome,
)

MEASURED = (FOUND, MISSED, UNEXERCISED, "error")  # the outcomes of a bug that was re-injected and replayed


def _pct(n: int, d: int) -> str:
    return f"{n} of {d} ({100 * n / d:.0f}%)" if d else "none"


def _status(o: Outcome, bug: Bug) -> str:
    if o.status == FOUND:
        return f"**found** ({len(o.classes)} class{'es' if len(o.classes) != 1 else ''}; the mechanism's: " \
               f"{bug.match.split(': ', 1)[0] if bug.match else 'not judged'})"
    if o.status == UNEXERCISED:
        return (f"missed, not exercised: no replayed trace called "
                f"{', '.join(f'`{c}`' for c in o.unexercised[:3])}")
    if o.status == MISSED:
        differed = [f"{o.differing_steps} step(s)"] * bool(o.differing_steps) + \
            [f"the capture sizes of {o.differing_settings} setting(s)"] * bool(o.differing_settings)
        return ("missed: an edited function was called, " + (
            f"vLLM's observations differed on {' and '.join(differed)}, none of them a class the contract flags"
            if differed else "vLLM's observations were the release's on every replayed step"))
    if o.status == IN_RELEASE:
        return (f"in vLLM {bug.release} as released: nothing to re-inject; its confirmed findings show "
                + (f"it ({len(o.classes)} class(es) a person judged to be its mechanism)" if o.classes
                   else "no class of it"))
    return o.status + (f": {o.detail}" if o.detail and o.status == "error" else "")


def markdown(bugs: list[Bug], outcomes: dict[str, Outcome]) -> str:
    by_id = {b.id: b for b in bugs}
    replayed = [o for o in outcomes.values() if o.status in MEASURED]
    found = [o for o in replayed if o.status == FOUND]
    unchanged = sum(o.status == MISSED and not o.differing_steps and not o.differing_settings for o in replayed)
    in_release = [o for o in outcomes.values() if o.status == IN_RELEASE]
    lines = ["# Real vLLM CUDA-graph bugs, re-injected, and what the tool finds", "",
             f"{len(bugs)} bugs from vLLM's tracker (issues and pull requests of 2025 and 2026 found by searching it for "
             "CUDA-graph modes, capture sizes, capture, dispatch, replay, drafters, micro-batching, LoRA, data "
             "parallelism, encoder graphs and graph memory; a sample, not every such bug) whose root cause is in "
             "resolving a mode, sizing, capturing, dispatching or replaying CUDA graphs (`bugs/<id>/`: the issues "
             "and pull requests, the releases, the triggering configuration, the symptom and the mechanism). Each "
             "bug whose mechanism has a small edit in a release the tool replays is put back into a copy of that "
             "release (`bugs/<id>/vllm-<release>.patch`) and checked as a reviewer checks a branch: `conform "
             "--vllm-src <copy> --base <release>`, vLLM's own code on CPU with CUDA graphs simulated, on the "
             "release's covering corpus (one generated trace per distinct observation of the model, not every "
             "scenario), no rule written for any bug (`cudagraph-contract bugs`, `make bugs`; `make evidence` checks "
             "that every outcome below is this commit's).", "",
             f"**Recall: {_pct(len(found), len(replayed))} of the re-injected bugs found.** Of the "
             f"{len(replayed) - len(found)} missed, {sum(o.status == UNEXERCISED for o in replayed)} were not exercised "
             "(no replayed trace called an edited function: `conform --vllm-src` exits 3 and names them), "
             f"{unchanged} called an edited function with no difference in what vLLM did, and "
             f"{sum(o.status == MISSED for o in replayed) - unchanged} made vLLM behave differently without a class the "
             "contract flags (both exit 0: nothing new). A bug is found when the check reports a class the release "
             "does not show, new or lost graphs; a person then judged which class is the bug's mechanism. "
             f"{len(in_release)} more bugs are in a release as shipped (nothing to re-inject; the tool's confirmed "
             f"findings on that release show {sum(bool(o.classes) for o in in_release)} of them), "
             f"{sum(o.status == NOT_REINJECTABLE for o in outcomes.values())} have no small edit in the releases "
             "replayed (out of scope, each with the reason).", ""]
    misses = [o for o in outcomes.values() if o.status in (MISSED, UNEXERCISED, "error")
              or o.status == IN_RELEASE and not o.classes]
    lines += ["## What to model next", "",
              "The missed bugs and those in the release as shipped, grouped by what the tool lacks to find them "
              "(a person's reading of each bug against the model), most bugs first:", ""]
    groups = Counter(by_id[o.bug].missing or "not analysed yet" for o in misses)
    for missing, n in groups.most_common():
        ids = [o.bug for o in misses if (by_id[o.bug].missing or "not analysed yet") == missing]
        lines.append(f"- **{missing}** ({n}): {', '.join(f'[{i}](#{i})' for i in ids)}")
    lines += ["", "## Per category and symptom", "", "| category | bugs | re-injected | found |", "|---|---|---|---|"]
    for cat in CATEGORIES:
        ids = [b.id for b in bugs if b.category == cat]
        if ids:
            rep = [i for i in ids if outcomes[i].status in MEASURED]
            lines.append(f"| {cat} | {len(ids)} | {len(rep)} | {sum(outcomes[i].status == FOUND for i in rep)} |")
    lines += ["", "| symptom | bugs | re-injected | found |", "|---|---|---|---|"]
    for sym in SYMPTOMS:
        ids = [b.id for b in bugs if b.symptom == sym]
        if ids:
            rep = [i for i in ids if outcomes[i].status in MEASURED]
            lines.append(f"| {sym} | {len(ids)} | {len(rep)} | {sum(outcomes[i].status == FOUND for i in rep)} |")
    lines += ["", "## Every bug", "", "| bug | category | symptom | upstream | re-injected into | outcome |",
              "|---|---|---|---|---|---|"]
    for b in bugs:
        o = outcomes[b.id]
        into = f"{b.release} ({b.runner.upper()})" if b.patch else (f"— (in {b.release})" if b.release else "—")
        lines.append(f"| <a id=\"{b.id}\"></a>[{b.id}](../bugs/{b.id}/README.md) | {b.category} | {b.symptom} | "
                     f"{' '.join(b.links)} | {into} | {_status(o, b)} |")
    return "\n".join(lines) + "\n"


def readme(bug: Bug, outcome: Outcome | None) -> str:
    """``bugs/<id>/README.md``: the bug, its upstream links, the edit and why it is faithful, and
    what the tool found."""
    lines = [f"# {bug.title}", "", f"- Upstream: {' '.join(bug.links)}", f"- Releases: {bug.releases}",
             f"- Category: {bug.category}; symptom: {bug.symptom}", f"- Configuration: {bug.configuration}",
             f"- Mechanism: {bug.mechanism}",
             f"- Fix: #{bug.fix.get('pr')} in {bug.fix.get('where')}: {bug.fix.get('change')}", "",
             "What the issue or pull request says:", ""]
    lines += [f"> {line}" for line in bug.evidence] + [""]
    if bug.patch is not None:
        lines += [f"## The edit: `{bug.patch.name}` ({bug.release}, {bug.runner.upper()})", "", bug.edit, "",
                  f"Why it is faithful: {bug.faithful}", ""]
    else:
        lines += ["## Not re-injected", "", bug.faithful, ""]
    if outcome is not None:
        lines += ["## What the tool finds", "", _status(outcome, bug) + ".", ""]
        if outcome.status == FOUND:
            lines += [f"Found by the general check (`conform --vllm-src` on the release's covering corpus and, "
                      f"where the tree's rules differ from the release's, the tree's, {outcome.traces} traces): "
                      "the contract's own properties on vLLM's code, no rule for this bug. "
                      "The classes it reports that the release does not show (new classes, and lost graphs: fewer "
                      "dispatches served by a graph than on the release):", ""]
            lines += [f"- {c}" for c in outcome.classes]
            if bug.match:
                lines += ["", f"Judged by a person to be the bug's mechanism: {bug.match}."]
        elif outcome.status == IN_RELEASE and outcome.classes:
            lines += ["The release's own conformance run (`conform --vllm "
                      f"{bug.release}`, vLLM's code on CPU with CUDA graphs simulated) confirms these classes:", ""]
            lines += [f"- {c}" for c in outcome.classes]
            if bug.match:
                lines += ["", f"Judged by a person to be the bug's mechanism: {bug.match}."]
        elif bug.missing:
            lines += [f"What the tool lacks to find it: {bug.missing}."]
    return "\n".join(lines).rstrip() + "\n"


def results_json(outcomes: dict[str, Outcome]) -> str:
    return json.dumps({"schema": "cudagraph-contract.bugs", "outcomes": [o.to_json() for o in outcomes.values()]},
                      indent=1, sort_keys=True) + "\n"
