"""The vLLM functions and lines that ran on a witness's path, per release it was replayed on.

Read as data from the conformance JSON ``cudagraph-contract conform`` writes
(``reports/conformance/vllm-<release>.json``): each replayed trace's ``decision_path`` (the
decision points each step reached, in the order first reached, ``contract/real/decisions.py``)
and the run's ``decision_points.where`` (each point's function, file under the ``vllm`` package and
line range, taken from the installed release's code objects and ``ast``). Lines are linked at the
release's tag on GitHub. A release the witness was not replayed on cites nothing: only what ran is
cited, and a point the harness mirrors is marked as such (its statements did not run).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from contract.real.decisions import CONFIG_STEP, HARNESS
from contract.core.events import describe_event
from contract.evidence import matrix
from contract.core.scenario import Runner
from contract.core.trace import Trace

PERMALINK = "https://github.com/vllm-project/vllm/blob/v{release}/vllm/{path}#L{first}-L{last}"
RELEASE = re.compile(r"\d+\.\d+\.\d+")


def permalink(release: str, path: str, lines: list[int]) -> str | None:
    """The GitHub permalink at ``v<release>``; None for a version that is no release tag."""
    if not RELEASE.fullmatch(release):
        return None
    return PERMALINK.format(release=release, path=path, first=lines[0], last=lines[1])


@dataclass(frozen=True)
class Ran:
    """One decision point on the path: where its code is and the steps that reached it."""

    point: str
    where: dict | None  # {"owner", "function", "path", "lines"}, None when not located
    steps: tuple[str, ...]  # "start-up" or the step index

    def markdown(self, release: str) -> str:
        w = self.where
        if w is None:
            return f"`{self.point}` (its source line was not located)"
        label = f"{w['path']}:{w['lines'][0]}-{w['lines'][1]}"
        link = permalink(release, w["path"], w["lines"])
        cited = f"[`{label}`]({link})" if link else f"`{label}`"
        block = re.search(r" \(([^()]+)\)$", self.point)  # statements cut from the method and run
        # A range that is not the whole def is labelled as what it is (a block, mirrored
        # statements), never by the function's name alone (tests/test_permalinks.py).
        part = block.group(1) if block else ("mirrored statements" if w.get("owner") == HARNESS else None)
        text = f"`{w['function']}`" + (f" ({part})" if part else "") + f" {cited}"
        if w.get("owner") == HARNESS:
            text += " — mirrored by the harness: these statements did not run (`tests/test_decisions.py` guards them)"
        return text


@dataclass(frozen=True)
class ReplayedPath:
    release: str
    cell: matrix.Cell | None  # None where only the path is read (findings.md)
    path: list[dict]  # the trace's decision_path
    where: dict  # the run's decision_points.where

    def reached(self) -> list[Ran]:
        steps: dict[str, list[str]] = {}
        index = 0
        for entry in self.path:
            if entry.get("event") == CONFIG_STEP:
                label = "start-up"
            else:
                label, index = str(index), index + 1
            for point in entry.get("points", []):
                steps.setdefault(point, []).append(label)
        return [Ran(point, self.where.get(point), tuple(labels)) for point, labels in steps.items()]

    def at_step(self, step: int) -> list[str]:
        """The points reached at event ``step``, in order."""
        events = [e for e in self.path if e.get("event") != CONFIG_STEP]
        return list(events[step].get("points", [])) if step < len(events) else []


def replayed(trace: Trace, conformance: dict[tuple[str, Runner], dict]) -> list[ReplayedPath]:
    """Every release whose replay ran ``trace``, oldest first; ``path`` is empty where that run
    recorded none."""
    out = []
    for release in matrix.RELEASES:
        data = conformance.get((release, trace.scenario.runner))
        if data is None:
            continue
        entry = next((t for t in data.get("traces", []) if t.get("name") == trace.name), None)
        if entry is None or entry.get("status") != "replayed":
            continue
        where = (data.get("decision_points") or {}).get("where") or {}
        out.append(ReplayedPath(release, matrix.cell(trace, release, conformance),
                                entry.get("decision_path") or [], where))
    return out


def at_step(release: str, path: list[dict], where: dict, step: int) -> list[str]:
    """The functions a recorded ``decision_path`` reached at event ``step``, as linked markdown."""
    replayed_path = ReplayedPath(release, None, path, where)
    reached = {r.point: r for r in replayed_path.reached()}
    return [reached[point].markdown(release) for point in replayed_path.at_step(step)]


def _steps(labels: tuple[str, ...]) -> str:
    numbers = [x for x in labels if x.isdigit()]
    words = [x for x in labels if not x.isdigit()]
    if numbers:
        words.append(("step " if len(numbers) == 1 else "steps ") + ", ".join(numbers))
    return "; ".join(words)


def _step_role(state: str) -> str:
    return {matrix.AFFECTED: "the violation", matrix.FIXED: "the same step, which holds on this release",
            matrix.REFUTED: "where vLLM's observation differs from the model's"}.get(state, "the step")


def markdown(trace: Trace, conformance: dict[tuple[str, Runner], dict], step: int, trace_path: str) -> list[str]:
    """The page section: per replayed release, the functions at ``step`` and the rest of the path."""
    lines = ["## vLLM code on this path", ""]
    paths = replayed(trace, conformance)
    if not paths:
        return lines + [
            "This witness has not been replayed on vLLM's code, so no vLLM lines are cited as having run "
            f"(`cudagraph-contract conform --vllm {matrix.replay_release(trace)} --traces {trace_path}` records "
            "them where the replay can run it).", ""]
    lines += ["The functions vLLM ran on this witness's path, per release it was replayed on (CPU, CUDA graphs "
              "simulated), in the order first reached and linked at the release's tag; the line ranges are "
              "read from that release's source by the replay.", ""]
    label = describe_event(trace.events[step]) if step < len(trace.events) else "the last step"
    for p in paths:
        lines += [f"### vLLM {p.release}: {p.cell.state}" + (f" ({p.cell.detail})" if p.cell.detail else ""), ""]
        if not p.path:
            lines += ["This replay recorded no decision path (`cudagraph-contract conform` records one), so no "
                      "lines are cited for it.", ""]
            continue
        reached = {r.point: r for r in p.reached()}
        here = p.at_step(step)
        if here:
            lines += [f"At step {step} `{label}` ({_step_role(p.cell.state)}):", ""]
            lines += [f"- {reached[point].markdown(p.release)}" for point in here]
            lines.append("")
        rest = [r for r in reached.values() if r.point not in here]
        if rest:
            lines += [("The rest of the path" if here else "The path") + " (the steps that reached each):", ""]
            lines += [f"- {r.markdown(p.release)} ({_steps(r.steps)})" for r in rest]
            lines.append("")
    return lines
