"""``reports/findings.md`` (the triage table: one row per root cause) and one page per root cause,
``reports/root-causes/<id>.md``, from the committed conformance runs, the deciding statements the
batch traced (``reports/conformance/deciding/``) and ``fixes/*/fix.json``; no vLLM environment is
needed. The grouping, the matrix and since when are computed by ``contract/evidence/root_causes.py``.

``python -m contract.reports.root_causes [--reports DIR]`` rewrites them.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from contract.core.output import write_atomic
from contract.evidence import deciding, decision_lines, root_causes as rc
from contract.evidence.matrix import RELEASES, load_conformance
from contract.evidence import reproduction
from contract.reports import first_screen, gpu_scripts

ROOT = Path(__file__).resolve().parents[2]
LINES_PER_RELEASE = 15  # the quoted source of one release's deciding lines, at most
FOLDER = "root-causes"
SYMBOL = {rc.CONFIRMED: "**confirmed**", rc.NOT_AFFECTED: "not affected", rc.REFUTED: "**refuted**",
          rc.NOT_REPLAYED: "not replayed", rc.NOT_PRESENT: "not present"}
HOW = {rc.REPLAY: "R", rc.UNIT_TEST: "T", rc.READING: "S", "": ""}
STATUS_CHANGES = {("0.29.0", "0.30.0"): "vLLM PR #56312, first released in 0.30.0"}


@dataclass
class View:
    """A root cause with what its pages show."""

    cause: rc.RootCause
    cells: dict

    @property
    def id(self) -> str:
        return self.cause.id

    @property
    def first(self) -> str | None:
        return rc.first_confirmed(self.cells)

    def status(self) -> str:
        """confirmed (how), known and fixed upstream, refuted, or reading."""
        states = [(r, c) for row in self.cells.values() for r, c in row.items()]
        if any(c.state == rc.REFUTED for _, c in states):
            return "refuted on " + ", ".join(sorted({r for r, c in states if c.state == rc.REFUTED}))
        confirmed = sorted({r for r, c in states if c.state == rc.CONFIRMED}, key=RELEASES.index)
        if not confirmed:
            return "reading"
        hows = sorted({c.how for _, c in states if c.state == rc.CONFIRMED})
        last = confirmed[-1]
        later = [r for r in RELEASES[RELEASES.index(last) + 1:]
                 if any(row[r].state == rc.NOT_AFFECTED for row in self.cells.values())]
        if later and not any(row[r].state == rc.CONFIRMED for row in self.cells.values() for r in later):
            fix = STATUS_CHANGES.get((last, later[0]), f"a change between {last} and {later[0]}")
            return f"fixed upstream by {fix}"
        return "confirmed (" + " + ".join(hows) + ")"


def build(folder: Path, root: Path = ROOT) -> list[View]:
    """The root causes of the conformance folder ``folder`` (``reports/conformance``)."""
    conformance = load_conformance(folder)
    entries = rc.load_entries(folder)
    causes = rc.ordered(rc.group(entries, rc.load_known(root)))
    return [View(c, rc.matrix(c, conformance, root)) for c in causes]


# -- pieces ----------------------------------------------------------------------------------------

NO_STATEMENT = "No statement of vLLM's code went another way"


def mechanism(view: View) -> str:
    known = view.cause.known
    if known is not None:
        return known.mechanism
    a = view.cause.anchor
    if a is None and view.cause.unread:
        return (f"the witness and its nearest non-violating neighbour ({', '.join(view.cause.unread)} flipped) run the "
                "same statements of vLLM's code: nothing reads the setting on this path, so no branch decides it; "
                "the fix is a check that is missing")
    if a is None:
        return "no deciding statement was found"
    return f"`{a['function']}`: `{_one_line(a['text'])}` decides ({rc.kind_text(view.cause.kind)})"


def _one_line(text: str, width: int = 90) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def _role(role: str) -> str:
    return "—" if role == "-" else role


def matrix_table(view: View) -> list[str]:
    head = "| runner | role | " + " | ".join(RELEASES) + " |"
    lines = [head, "|---|---|" + "---|" * len(RELEASES)]
    for (runner, role), row in sorted(view.cells.items()):
        cells = []
        for release in RELEASES:
            c = row[release]
            cells.append(SYMBOL[c.state] + (f" ({HOW[c.how]})" if c.how else ""))
        lines.append(f"| {runner} | {_role(role)} | " + " | ".join(cells) + " |")
    return lines


def cell_notes(view: View) -> list[str]:
    """What each non-trivial cell rests on, one line per distinct detail."""
    seen: dict[str, list[str]] = {}
    for (runner, role), row in sorted(view.cells.items()):
        for release, c in row.items():
            if c.detail:
                key = f"{SYMBOL[c.state].strip('*')} ({c.how}): {c.detail}"
                seen.setdefault(key, []).append(f"{release} {runner}" + ("" if role == "-" else f" {role}"))
    return [f"- {', '.join(where)}: {key}" for key, where in seen.items()]


def _statement_lines(statement: dict) -> int:
    return len(statement["text"].splitlines()) or 1


def chosen_statements(entry: rc.Entry, anchor_rank: int | None) -> list[dict]:
    """The statements a page quotes for one release: the anchor first, then the crash chain, then
    the ranked rest that does not read the differing setting itself, those that went the other
    way (``root_causes.disjoint``) before those that ran more ways, within ``LINES_PER_RELEASE``."""
    rest = [i for i, s in enumerate(entry.deciding) if i != anchor_rank and not s.get("explained_by_setting")]
    order = ([anchor_rank] if anchor_rank is not None else []) + \
        [i for i in rest if entry.deciding[i].get("role", "branch") != "branch"] + \
        [i for i in rest if entry.deciding[i].get("role", "branch") == "branch" and rc.disjoint(entry.deciding[i])] + \
        [i for i in rest if entry.deciding[i].get("role", "branch") == "branch" and not rc.disjoint(entry.deciding[i])]
    out, used = [], 0
    for i in order:
        s = entry.deciding[i]
        n = _statement_lines(s)
        if used + n > LINES_PER_RELEASE:
            if not out:  # one statement longer than the budget is cut to it
                out.append({**s, "text": "\n".join(s["text"].splitlines()[:LINES_PER_RELEASE]), "cut": True})
            continue
        out.append(s)
        used += n
        if used >= LINES_PER_RELEASE:
            break
    return out


def _where(step: int, events: list) -> str:
    if step == deciding.CONFIG_STEP:
        return "start-up (`VllmConfig`)"
    if 0 <= step < len(events):
        e = events[step]
        name = (e.get("event") or e.get("kind") or "") if isinstance(e, dict) else str(e)
        return f"step {step} `{name}`" if name else f"step {step}"
    return f"step {step}"


def outcomes(entry: list) -> str:
    """A replay's outcomes of one statement, by branch or value, with how many executions had each."""
    if not entry:
        return "not reached"
    counts: dict[str, int] = {}
    for primary, _, n in entry:
        counts[primary] = counts.get(primary, 0) + n
    return "; ".join(f"`{p}`" + (f" ×{n}" if n > 1 else "") for p, n in counts.items())


def quoted(release: str, statement: dict, events: list, anchor: bool) -> list[str]:
    short = statement["function"].rsplit(".", 1)[-1]
    first, last = statement["lines"]
    label = f"`{short}`, lines {first}-{last} ({deciding.describe(statement['kind'], statement['text'])})"
    head = (f"- [`{statement['function']}`]({deciding.permalink(release, statement['path'], statement['def_lines'])})"
            f" ([{label}]({deciding.permalink(release, statement['path'], statement['lines'])}), "
            f"`{statement['path']}`), {_where(statement['step'], events)}")
    if anchor:
        head += " — **the anchor**"
    elif statement.get("role", "branch") != "branch":
        head += f" — {statement['role']}"
    out = [head, "", "  ```python", *[f"  {x}" for x in statement["text"].splitlines()], "  ```", ""]
    if statement.get("cut"):
        out.append(f"  (cut to {LINES_PER_RELEASE} lines)")
    if statement.get("role", "branch") == "branch":
        out.append(f"  witness: {outcomes(statement['witness'])}; neighbour: {outcomes(statement['neighbour'])}")
    else:
        out.append(f"  {statement['witness'][0][1]}")
    return out + [""]


def deciding_section(view: View) -> list[str]:
    cause = view.cause
    lines = ["## Deciding lines per release", "",
             "The statements of vLLM's own code whose outcome differed between the witness and its nearest "
             "non-violating neighbour, each replayed with line tracing on that release "
             "(`contract/evidence/deciding.py`), at most "
             f"{LINES_PER_RELEASE} quoted lines per release. Functions are linked at their `def`; statement "
             "ranges are labelled as such.", ""]
    if not cause.units:
        return lines + ["No confirmed class of this kind holds the anchor: nothing was traced for it.", ""]
    per: dict[tuple[str, str], list[tuple[rc.Unit, rc.Entry]]] = {}
    for unit in cause.units:
        for e in unit.entries:
            per.setdefault((e.release, e.runner.name), []).append((unit, e))
    for (release, runner), pairs in sorted(per.items(), key=lambda kv: (RELEASES.index(kv[0][0]), kv[0][1])):
        home = next(((u, e) for u, e in pairs if u.home is e), pairs[0])
        unit, entry = home
        rank = cause.found_on.get((unit.key, release, runner))
        found = sum(cause.found_on.get((u.key, release, runner)) is not None for u, _ in pairs)
        lines += [f"### vLLM {release} ({runner})", "",
                  f"Witness `{entry.name}`; neighbour: {entry.neighbour.get('describe', '')}. "
                  + (f"The anchor is among the deciding statements of {found} of the {len(pairs)} witnesses "
                     "confirmed on this release." if cause.anchor is not None else ""), ""]
        if not entry.deciding:
            lines += [f"{NO_STATEMENT}: the witness and its neighbour ran the same statements "
                      f"({', '.join(entry.neighbour.get('differing', ())) or 'the flipped setting'} is read nowhere on "
                      "this path).", ""]
        for s in chosen_statements(entry, rank):
            lines += quoted(release, s, entry.events, anchor=rank is not None and s is entry.deciding[rank])
    return lines


def since_section(view: View) -> list[str]:
    first = view.first
    lines = ["## Since when", ""]
    lines.append(f"- First confirmed: vLLM {first}" + (" (the oldest release checked)" if first == RELEASES[0] else "")
                 if first else "- Confirmed on no release")
    a = view.cause.anchor
    if a is not None and a.get("since"):
        lines.append(f"- The anchor (`{a['function']}`, `{a['path']}`): {deciding.since_text(a['since'])}")
    lines.append("")
    return lines


def classes_section(view: View) -> list[str]:
    cause = view.cause
    lines = ["## Classes", "",
             f"{len(cause.classes)} violation classes and {len(cause.witnesses)} other witnesses; per unit, the "
             "releases it is confirmed on (anchor found by the tracer there: ✓).", ""]
    for unit in cause.units:
        e = unit.home
        where = ", ".join(f"{x.release}{'' if x.runner.name == 'MRV1' else ' MRV2'}"
                          + (" ✓" if cause.found_on.get((unit.key, x.release, x.runner.name)) is not None else "")
                          for x in unit.entries)
        if unit.is_class:
            link = f"[`{unit.key[0]}` {e.class_id}](../{unit.key[0]}/classes/{e.class_id}.md)"
        else:
            link = f"`{e.name}` ([trace](../../{e.source}))"
        lines.append(f"- {link}: {where}")
    return lines + [""]


def evidence_section(view: View) -> list[str]:
    if not view.cause.units:
        return []
    home = view.cause.units[0].home
    lines = ["## The real replay's evidence", "",
             f"`{home.name}` on vLLM {home.release} ({home.runner.name}), replayed on vLLM's own code on CPU with "
             "CUDA graphs simulated (`cudagraph-contract conform`); vLLM's side of the violating steps:", ""]
    lines += [f"- {x}" for x in home.evidence[:4]] or ["- (a halt: vLLM stopped at the step the model stops)"]
    if home.partly:
        lines += ["", f"Replay: {home.partly}."]
    return lines + [""]


def reproduction_section(view: View) -> list[str]:
    lines = ["## Reproduction", ""]
    if view.cause.units:
        home = view.cause.units[0].home
        runner = " --runner mrv2" if home.runner.name == "MRV2" and home.release == "0.33.0" else ""
        lines += ["On vLLM's own code (CPU, CUDA graphs simulated), the witness replayed step for step:", "", "```",
                  f"cudagraph-contract conform --vllm {home.release}{runner} --traces {home.source}", "```", ""]
    known = view.cause.known
    if known is not None:
        lines += [f"vLLM's own unit test, run with the release's environment (`{known.folder}/{known.test}`):",
                  "", "```", f"cd /tmp && VLLM_LOGGING_LEVEL=ERROR .venv-vllm-<release>/bin/python -m pytest -q "
                  f"{known.folder}/{known.test}", "```", ""]
    return lines


def fix_section(view: View) -> list[str]:
    known = view.cause.known
    if known is None:
        return ["## Fix", "", "No fix or unit test yet: this root cause was found by the grouping, not written by "
                "hand under `fixes/`.", ""]
    verdicts = " · ".join(f"{r}: {v}" for r, v in sorted(known.expected.items(), key=lambda kv: RELEASES.index(kv[0])))
    patches = ", ".join(f"[{r}](../../{known.folder}/{p})" for r, p in sorted(known.patches.items()))
    return ["## Fix and unit test", "",
            f"[`{known.folder}/README.md`](../../{known.folder}/README.md) has the mechanism, the fix and the "
            f"alternatives rejected. Unit test [`{known.test}`](../../{known.folder}/{known.test}), unpatched: "
            f"{verdicts}. Patches: {patches or 'none'}.", "",
            *(["`cudagraph-contract fix-check` (`make fixes`: the witnesses replayed on vLLM's code, the model on the "
               "patched rules, the unit test before and after):", "",
               *[f"- `{p}`: {v}" for p, v in sorted(known.fix_check.items())], ""] if known.fix_check else [])]


def identified_by(cause: rc.RootCause) -> str:
    """The anchor as the tracer found it (or as ``fix.json`` names it), and why it is that statement."""
    if cause.anchor is not None:
        text = f"`{cause.anchor['function']}` (`{cause.anchor['path']}`): `{_one_line(cause.anchor['text'])}`"
    elif cause.known is not None and cause.known.anchors:
        a = cause.known.anchors[0]
        text = (f"`{a.function}` (`{a.path}`): `{_one_line(a.statement)}`, named in `fix.json`; the tracer found it "
                "for no confirmed class")
    else:
        text = "no statement"
    if cause.known is not None and cause.known.anchor_note:
        text += f". {cause.known.anchor_note}"
    return text


def page(view: View, root: Path = ROOT) -> str:
    cause = view.cause
    lines = [*first_screen.lines(cause, view.cells, view.status(), root), "",
             "## Details", "",
             f"- violation kind: {rc.kind_text(cause.kind)}",
             f"- mechanism: {mechanism(view)}",
             f"- classes matched by: {identified_by(cause)}",
             "", "## Affected matrix", "",
             f"Cells: {', '.join(SYMBOL.values())}; how: R the conformance replay, T the root cause's unit test "
             "under `fixes/`, S reading the release's source.", "", *matrix_table(view), "", *cell_notes(view), ""]
    lines += since_section(view) + reproduction_section(view) + deciding_section(view) + classes_section(view)
    lines += evidence_section(view) + fix_section(view)
    return "\n".join(lines).rstrip() + "\n"


# -- findings.md -----------------------------------------------------------------------------------

def triage(views: list[View]) -> list[str]:
    classes = sum(len(v.cause.classes) for v in views)
    witnesses = sum(len(v.cause.witnesses) for v in views)
    entries = sum(len(v.cause.entries) for v in views)
    lines = [
        f"**{len(views)} root causes** group **{classes} violation classes** and {witnesses} other witnesses "
        f"({entries} confirmations: one per witness and release it was traced on). Crashes and wrong results "
        "first.", "",
        "| # | root cause | severity | affected (confirmed) | status | mechanism |", "|---|---|---|---|---|---|",
    ]
    for i, v in enumerate(views, 1):
        known = v.cause.known
        name = f"[{known.headline}]({FOLDER}/{v.id}.md) (`{v.id}`)" if known is not None and known.headline \
            else f"[{v.id}]({FOLDER}/{v.id}.md)"
        lines.append(f"| {i} | {name} | {v.cause.severity.label} | {first_screen.affected_line(v.cells)} "
                     f"| {v.status()} | {mechanism(v)} |")
    return lines + [
        "", "A root cause is a violation kind and an *anchor*: a statement of vLLM's code that the line tracer "
        "finds among the deciding statements (those whose outcome differs between the witness and its nearest "
        "non-violating neighbour) of every class grouped under it, on the release the class is from. The root "
        "causes under `fixes/` name their anchors in `fix.json`; a class that matches none is a root cause of its "
        "own, named by its first deciding statement, or, where the witness and its neighbour ran the same "
        "statements, by the setting nothing on that path reads (`contract/evidence/root_causes.py`). The "
        "*deciding line* each page leads with is the statement its fix edits (`fixes/<id>/fix.json` "
        "`fix_edits`, read from the patch and the release's source). Severity follows the "
        "violation kind (`contract/core/classes.py`, `contract/evidence/severity.py`). Each page has the affected matrix (0.28.0–0.34.0 × "
        "runner × role, each cell with how it was obtained), since when, the reproduction, the deciding lines "
        "per release, the classes, the replay's evidence and the fix.", ""]


def runs(folder: Path) -> list[dict]:
    """The conformance runs (``vllm-*.json``) of ``folder``, unreadable ones left out."""
    found = []
    for path in sorted(folder.glob("vllm-*.json")):
        try:
            found.append(json.loads(path.read_text(encoding="utf-8")))
        except ValueError:
            continue
    return found


def code_at_violation(data: dict, finding: dict) -> list[str]:
    """The vLLM functions the replay ran at the finding's first violating step, linked at the release."""
    entry = next((t for t in data.get("traces", []) if t.get("name") == finding["name"]), None)
    path = (entry or {}).get("decision_path") or []
    step = finding["violations"][0]["step"]
    where = (data.get("decision_points") or {}).get("where") or {}
    ran = decision_lines.at_step(data["vllm"], path, where, step) if path else []
    return [f"vLLM's code at step {step}:", "", *[f"- {r}" for r in ran], ""] if ran else []


def ungrouped(folder: Path, views: list[View]) -> list[str]:
    """The findings of each conformance run that no root cause holds (not traced by ``make findings``
    yet, or refuted), in full: the violations, vLLM's side and the code that ran at the step. A
    finding several releases show alike (its trace named but for its policy, the same properties and
    outcome) is one entry, listed at the newest of them."""
    grouped = {(e.release, e.runner.name, e.name) for v in views for e in v.cause.entries}
    traced = set()
    for data in rc.traced(folder):
        traced |= {(data["vllm"], data["runner"], f["name"]) for f in data["findings"]}
    alike: dict[tuple, list[tuple[dict, dict]]] = {}
    for data in runs(folder):
        runner = (data.get("load_model_block") or {}).get("runner") or "MRV1"
        for f in data.get("findings", []):
            key = (data["vllm"], runner, f["name"])
            if key in grouped or (key in traced and f.get("outcome") == "confirmed"):
                continue
            policy = f.get("policy") or data.get("policy") or ""
            name = f["name"][len(policy) + 1:] if policy and f["name"].startswith(policy + "-") else f["name"]
            props = ", ".join(sorted({v["property"] for v in f["violations"]}))
            alike.setdefault((name, runner, props, f["outcome"]), []).append((data, f))
    lines = []
    for (name, runner, props, outcome), seen in alike.items():
        data, f = seen[-1]
        releases = ", ".join(d["vllm"] for d, _ in seen)
        sources = ", ".join(dict.fromkeys(f"`{g['source']}`" for _, g in seen))
        lines += [f"### {name} on vLLM {releases} ({runner}) — {props} — **{outcome}**", "", f"Traces: {sources}", ""]
        if f.get("partly_replayed"):
            lines += [f"Replay: {f['partly_replayed']}.", ""]
        for v, e in zip(f["violations"], f["evidence"]):
            lines += [f"- model: step {v['step']}: {v['message']}", f"  - vLLM {data['vllm']}: {e}"]
        lines.append("")
        lines += code_at_violation(data, f)
    if not lines:
        return []
    return ["## Findings not grouped into a root cause", "",
            "Confirmed findings whose deciding lines were not traced yet (`make findings` traces them; each root "
            "cause it finds then needs its fix and unit test under `fixes/`), and refuted ones.", "",
            *lines]


def findings(folder: Path, root: Path = ROOT, views: list[View] | None = None) -> str:
    """``findings.md`` from the conformance folder ``folder``."""
    views = build(folder, root) if views is None else views
    lines = ["# Findings: root causes confirmed on vLLM's own code", "", '<a id="triage"></a>', ""]
    lines += triage(views) if views else ["No root cause yet: no finding has been traced (`make findings`).", ""]
    lines += ["## Conformance runs", "",
              "| release | runner | policy | steps agreeing | confirmed findings |", "|---|---|---|---|---|"]
    for (release, runner), data in sorted(load_conformance(folder).items(),
                                          key=lambda kv: (RELEASES.index(kv[0][0]), kv[0][1].name)):
        confirmed = sum(f.get("outcome") == "confirmed" for f in data.get("findings", []))
        refuted = sum(f.get("outcome") != "confirmed" for f in data.get("findings", []))
        lines.append(f"| {release} | {runner.name} | `{data['policy']}` | {data['agreeing_steps']} of {data['steps']} "
                     f"| {confirmed}" + (f" ({refuted} refuted)" if refuted else "") + " |")
    lines += ["", "Every replayed step of every run is compared with the model of its release "
              "([`conformance/`](conformance/README.md)); a finding is confirmed when vLLM's observation of the "
              "violating step equals the model's. The replay runs on CPU with CUDA graphs simulated; see the "
              "[glossary](../docs/glossary.md) for what ran.", ""]
    lines += ungrouped(folder, views)
    return "\n".join(lines).rstrip() + "\n"


def write(reports: Path, root: Path = ROOT) -> list[Path]:
    """findings.md and every root cause's page; pages of root causes no longer found are removed."""
    views = build(reports / "conformance", root)
    folder = reports / FOLDER
    written = [reports / "findings.md"]
    write_atomic(written[0], findings(reports / "conformance", root, views))
    for v in views:
        path = folder / f"{v.id}.md"
        write_atomic(path, page(v, root))
        written.append(path)
        text = gpu_scripts.script(v.cause, reproduction.choose(v.cause, v.cells, root), root)
        if text is not None:
            write_atomic(root / v.cause.known.folder / "gpu.sh", text)
    for stale in sorted(folder.glob("*.md")) if folder.is_dir() else []:
        if stale not in written:
            stale.unlink()
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m contract.reports.root_causes", description=__doc__.split("\n\n")[0])
    parser.add_argument("--reports", type=Path, default=ROOT / "reports")
    args = parser.parse_args(argv)
    written = write(args.reports)
    print(f"{len(written) - 1} root-cause pages and {written[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
