"""Root causes: the confirmed classes of every release grouped by mechanism, computed from the
deciding statements the tracer found, with the affected matrix and since when.

**Units.** Every confirmed finding of a release's conformance run that the deciding-lines batch
traced (``reports/conformance/deciding/vllm-<release>[-mrv2].json.gz``, ``deciding_batch.py``) is an
*entry*: one witness on one release. A *class* is a class witness (``reports/<policy>/classes/``,
named ``<policy>-<class id>``); the other witnesses (regression traces, a property's witness) are
units of their own and are listed beside the classes, not counted as classes. A unit's *home* is
the release its policy is named after (``vllm_0_30``: 0.30.0) when confirmed there, else the first
release it is confirmed on.

**Grouping.** A root cause is a violation kind (property and what happened; a halt with its
exception) and an *anchor*: a vLLM statement (file under ``vllm/``, enclosing function, statement
text compared after ``ast`` normalisation, so line numbers and line breaks do not matter). The
root causes written by hand under ``fixes/`` name their anchors in ``fix.json``
(``"anchors"``, ``"kind"``, and ``"runners"``: whose code they are about). A unit joins the root cause of its kind whose anchor is among the
deciding statements the tracer found for it on its home release (the best-ranked match wins), or,
where the witness and its neighbour ran the same statements, whose ``"unread"`` settings are the
ones the neighbour flips; a
unit matching none is a root cause of its own, named by its top deciding statement, and units
with the same kind and top statement share it. Nothing is asserted per class: moving a class
means changing an anchor, and the tests check both directions.

**The matrix.** Per root cause, rows (runner, role) and columns 0.28.0-0.34.0. A cell is, in
this order: *not present* when the release has no such runner; *confirmed*, *not affected* or
*refuted* from the conformance replay of the root cause's witnesses on that release (the witness
replayed, vLLM agreed with the model of that release, and the model shows the unit's class there or
not; a disagreement refutes); else from the root cause's vLLM unit test (``fix.json``
``expected``: fail, pass, skip), for the rows the test covers (``fix.json`` ``covers``); else
*not present* when the anchor's function is absent from that release's source (read from the
releases' sources by ``since.py`` when the batch ran); else *not replayed*. Each cell says how it
was obtained: ``replay``, ``unit test`` or ``reading``.

**Since when.** The first release whose cell is confirmed, and the history of the anchor (or the
top statement): the first release with its current form and the statement before it
(``since.py``, stored with the deciding statements).
"""

from __future__ import annotations

import ast
import gzip
import json
import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from contract.core.scenario import Runner
from contract.evidence import severity
from contract.evidence.matrix import RELEASES

ROOT = Path(__file__).resolve().parents[2]
CONFIRMED, NOT_AFFECTED, REFUTED, NOT_REPLAYED, NOT_PRESENT = (
    "confirmed", "not affected", "refuted", "not replayed", "not present")
REPLAY, UNIT_TEST, READING = "replay", "unit test", "reading"
# Which runner each release has (the file that is the runner; a test checks these against the
# installed sources): Model Runner V2 (v1/worker/gpu/) is in every release from 0.28.0, V1 up to 0.33.0.
RUNNER_FILES = {Runner.MRV1: "v1/worker/gpu_model_runner.py", Runner.MRV2: "v1/worker/gpu/model_runner.py"}
RUNNERS_IN: dict[str, frozenset[Runner]] = {
    **{r: frozenset({Runner.MRV1, Runner.MRV2}) for r in RELEASES if r != "0.34.0"},
    "0.34.0": frozenset({Runner.MRV2}),
}
# The release a policy is named after: a unit's home when it is confirmed there.
POLICY_RELEASE = {"vllm_0_29": "0.29.0", "vllm_0_30": "0.30.0", "mrv2_0_33": "0.33.0", "mrv2_0_34": "0.34.0"}


# -- statements ------------------------------------------------------------------------------------

def normalise(text: str, kind: str = "") -> str:
    """A statement's text in one form across releases: an ``if``/``elif``/``while`` header by its
    test, any other statement unparsed by ``ast``; what does not parse, with whitespace collapsed."""
    source = textwrap.dedent(text).strip()
    head = re.match(r"^(if|elif|while)\b", source)
    if head or kind in ("if", "elif", "while"):
        test = re.sub(r"^(el)?if\b|^while\b", "", source).rstrip()
        test = test[:-1] if test.endswith(":") else test
        try:
            return "if " + ast.unparse(ast.parse(f"({test.strip()})", mode="eval").body)
        except SyntaxError:
            return " ".join(source.split())
    try:
        return ast.unparse(ast.parse(source))
    except SyntaxError:
        return " ".join(source.split())


@dataclass(frozen=True)
class Anchor:
    path: str  # under vllm/
    function: str  # the enclosing def's qualname
    statement: str  # as written in the source

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.path, self.function, normalise(self.statement))

    def matches(self, statement: dict) -> bool:
        return (statement["path"], statement["function"], normalise(statement["text"], statement.get("kind", ""))) \
            == self.key

    def to_json(self) -> dict:
        return {"path": self.path, "function": self.function, "statement": self.statement}


def statement_key(statement: dict) -> tuple[str, str, str]:
    return (statement["path"], statement["function"], normalise(statement["text"], statement.get("kind", "")))


# -- kinds -----------------------------------------------------------------------------------------

def kind_of(signature: dict) -> dict:
    """The violation kind of a class signature: its property and what happened, not its role or
    mode; a stop (P0, or ``halt`` in data traced before P0) by its exception's name alone."""
    if signature.get("property") in ("halt", "P0"):
        return {"property": "P0", "detail": str(signature.get("detail", "")).split(":")[0].strip()}
    return {"property": signature["property"], "what": signature["what"]}


def kind_matches(wanted: dict, signature: dict) -> bool:
    return all(kind_of(signature).get(k) == v for k, v in wanted.items())


def kind_text(kind: dict) -> str:
    text = f"{kind['property']}: {kind.get('what', 'vLLM stops')}"
    return text + (f" ({kind['detail']})" if kind.get("detail") else "")


def slug(text: str, width: int = 72) -> str:
    out = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return out[:width].rstrip("-")


# -- inputs ----------------------------------------------------------------------------------------

@dataclass
class Known:
    """A root cause written by hand under ``fixes/<id>/`` (``fix.json``)."""

    id: str
    title: str
    kind: dict
    anchors: list[Anchor]
    mechanism: str  # one line, in vLLM's terms
    test: str
    patches: dict
    expected: dict  # release -> fail / pass / skip, the unit test's observed verdicts
    covers: list[tuple[str, str]]  # (runner, role) rows the unit test exercises
    folder: str  # relative to the project root
    runners: tuple[str, ...] = ("MRV1", "MRV2")  # whose code it is about: only their classes match
    anchor_note: str = ""  # why the anchor is that statement, where it is not the statement a fix changes
    fix_check: dict = field(default_factory=dict)  # patch file -> fix-check's verdict (``make fixes``)
    also_kinds: list = field(default_factory=list)  # the same mechanism seen as another kind (its P0 stop)
    headline: str = ""  # the title in a user's words
    fix: str = ""  # the fix in one sentence
    symptom: str = ""  # what a user sees: the exception, the log line, or that nothing says so
    unread: tuple[str, ...] = ()  # the settings nothing reads, for a cause no branch decides
    fix_edits: dict = field(default_factory=dict)  # release -> the statements its patch edits
    gpu: dict = field(default_factory=dict)  # what shows the bug and its fix on a GPU (gpu.sh)

    @property
    def kinds(self) -> list[dict]:
        return [self.kind, *self.also_kinds]

    @classmethod
    def from_json(cls, data: dict, folder: str) -> "Known":
        return cls(data["root_cause"], data["title"], data["kind"],
                   [Anchor(a["path"], a["function"], a["statement"]) for a in data.get("anchors", [])],
                   data.get("mechanism", data["title"]), data["test"], data.get("patches", {}),
                   data.get("expected", {}), [tuple(c) for c in data.get("covers", [])], folder,
                   tuple(data.get("runners", ("MRV1", "MRV2"))), data.get("anchor_note", ""),
                   data.get("fix_check", {}), data.get("also_kinds", []), data.get("headline", ""),
                   data.get("fix", ""), data.get("symptom", ""), tuple(data.get("unread", ())),
                   data.get("fix_edits", {}), data.get("gpu", {}))


def load_known(root: Path = ROOT) -> list[Known]:
    out = []
    for path in sorted((root / "fixes").glob("*/fix.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        out.append(Known.from_json(data, path.parent.relative_to(root).as_posix()))
    return out


@dataclass
class Entry:
    """One traced confirmed finding on one release."""

    release: str
    runner: Runner
    policy: str
    name: str
    source: str
    signature: dict
    step: int
    deciding: list[dict]
    neighbour: dict
    events: list = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)  # vLLM's side of the violating steps (conform)
    partly: str = ""

    @property
    def class_id(self) -> str | None:
        """The class id when the witness is a class witness (``<policy>-<class id>``)."""
        return self.name.removeprefix(f"{self.policy}-") if self.source.startswith("reports/") and "/classes/" \
            in self.source else None

    @property
    def unit(self) -> tuple[str, str]:
        return (self.policy, self.class_id or self.name)

    @property
    def role(self) -> str:
        return self.signature.get("role", "-")


def pack(data: dict) -> bytes:
    """A deciding file's bytes: gzip of compact JSON, byte-stable (no name, no time), so that the
    committed traces stay small enough to travel with the tree to a GPU machine."""
    return gzip.compress(json.dumps(data, separators=(",", ":")).encode(), mtime=0)


def traced(conformance: Path) -> list[dict]:
    """The files ``deciding_batch.py`` wrote under ``conformance/deciding/``, read."""
    return [json.loads(gzip.decompress(path.read_bytes()))
            for path in sorted((conformance / "deciding").glob("vllm-*.json.gz"))]


def load_entries(conformance: Path) -> list[Entry]:
    """Every traced confirmed finding under ``conformance/deciding/`` that is a finding at all
    (``severity.finding``), with vLLM's evidence from the conformance run beside it."""
    out = []
    for data in traced(conformance):
        runner = Runner(data["runner"])
        evidence: dict[str, tuple[list, str]] = {}
        run_path = conformance / data["conformance"]
        if run_path.is_file():
            run = json.loads(run_path.read_text(encoding="utf-8"))
            evidence = {f["name"]: (f.get("evidence", []), f.get("partly_replayed", "")) for f in run.get("findings", [])}
        for f in data["findings"]:
            if "deciding" not in f or not severity.finding(f["signature"]):
                continue
            ev, partly = evidence.get(f["name"], ([], ""))
            out.append(Entry(data["vllm"], runner, data["policy"], f["name"], f["source"], f["signature"], f["step"],
                             f["deciding"], f["neighbour"], f.get("events", []), ev, partly))
    return out


# -- grouping --------------------------------------------------------------------------------------

@dataclass
class Unit:
    key: tuple[str, str]  # (policy, class id or trace name)
    entries: list[Entry]

    @property
    def is_class(self) -> bool:
        return self.entries[0].class_id is not None

    @property
    def home(self) -> Entry:
        named = POLICY_RELEASE.get(self.key[0])
        return next((e for e in self.entries if e.release == named),
                    min(self.entries, key=lambda e: RELEASES.index(e.release)))


def units(entries: list[Entry]) -> list[Unit]:
    grouped: dict[tuple, list[Entry]] = {}
    for e in entries:
        grouped.setdefault(e.unit, []).append(e)
    return [Unit(k, sorted(v, key=lambda e: (RELEASES.index(e.release), e.runner.name)))
            for k, v in sorted(grouped.items())]


def anchor_rank(known: Known, entry: Entry) -> int | None:
    """The rank of the best-ranked deciding statement of ``entry`` that is one of ``known``'s
    anchors, if its kind and runner match; None otherwise."""
    if not any(kind_matches(k, entry.signature) for k in known.kinds) or entry.runner.name not in known.runners:
        return None
    for i, statement in enumerate(entry.deciding):
        if any(a.matches(statement) for a in known.anchors):
            return i
    return None


def reads_nothing(known: Known, entry: Entry) -> bool:
    """Whether ``entry`` is of ``known``'s kind and runner and ran the same statements as its
    neighbour, which flips exactly the settings ``known`` says nothing reads."""
    return bool(known.unread) and entry.runner.name in known.runners \
        and any(kind_matches(k, entry.signature) for k in known.kinds) \
        and set(unread_settings(entry)) == set(known.unread)


def disjoint(statement: dict) -> bool:
    """The statement went the other way, not merely more ways: no outcome is common to both
    replays (a raise, or ``true`` against ``false``). A statement whose outcomes in one replay are
    a subset of the other's ran in more situations there (a second compiled piece, a capture the
    witness lacks): a consequence more often than a cause."""
    if statement.get("role", "branch") != "branch":
        return True
    mine = {o[0] for o in statement.get("witness", [])}
    theirs = {o[0] for o in statement.get("neighbour", [])}
    return not (mine & theirs)


def unread_settings(entry: Entry) -> tuple[str, ...]:
    """The scenario settings the neighbour flips, where the witness and its neighbour ran the same
    statements of vLLM's code (no deciding statement): settings nothing on that path reads."""
    return tuple(entry.neighbour.get("differing", ())) if not entry.deciding else ()


def top_statement(entry: Entry) -> dict | None:
    """The statement an unmatched unit is named by: the first ranked deciding statement that went
    the other way (``disjoint``; the crash chain's raise for a crash), else the first ranked."""
    return next((s for s in entry.deciding if disjoint(s) and not s.get("explained_by_setting")),
                entry.deciding[0] if entry.deciding else None)


@dataclass
class RootCause:
    id: str
    title: str
    kind: dict
    known: Known | None
    anchor: dict | None  # the statement that identifies it, as the tracer found it on a home release
    units: list[Unit] = field(default_factory=list)
    found_on: dict = field(default_factory=dict)  # (unit key, release, runner) -> rank of the anchor, or None
    # the settings the neighbour flips where no statement of vLLM's code decided differently
    unread: tuple[str, ...] = ()

    @property
    def entries(self) -> list[Entry]:
        return [e for u in self.units for e in u.entries]

    @property
    def severity(self) -> severity.Severity:
        signatures = [e.signature for e in self.entries] or ([self.kind] if self.known else [])
        return severity.worst(severity.of(s) for s in signatures)

    @property
    def classes(self) -> list[Unit]:
        return [u for u in self.units if u.is_class]

    @property
    def witnesses(self) -> list[Unit]:
        return [u for u in self.units if not u.is_class]


def group(entries: list[Entry], known: list[Known]) -> list[RootCause]:
    """The root causes of ``entries`` (module docstring), known ones first in ``fixes/`` order,
    then the unmatched ones by kind and top statement."""
    causes: dict[str, RootCause] = {k.id: RootCause(k.id, k.title, k.kind, k, None, unread=k.unread) for k in known}
    for unit in units(entries):
        home = unit.home
        ranked = [(r, k) for k in known if (r := anchor_rank(k, home)) is not None] \
            or [(None, k) for k in known if reads_nothing(k, home)]
        if ranked:
            rank, chosen = min(ranked, key=lambda x: x[0] or 0)
            cause = causes[chosen.id]
            if cause.anchor is None and rank is not None:
                cause.anchor = home.deciding[rank]
        else:
            top = top_statement(home)
            kind = kind_of(home.signature)
            unread = unread_settings(home)
            if top is not None:
                name = f"{top['function']}: {normalise(top['text'], top.get('kind', ''))}"
                cid, title = f"at-{name}", f"{kind_text(kind)}; first deciding statement: {name}"
            elif unread:  # the witness and its neighbour ran alike: a check is missing, not a branch wrong
                cid, title = f"{'-'.join(unread)}-not-read", f"{kind_text(kind)}; nothing reads {', '.join(unread)}"
            else:
                cid, title = "at-no-deciding-statement-found", f"{kind_text(kind)}; no deciding statement found"
            cid = slug(f"{kind['property']}-{cid}" if unread else
                       f"{kind['property']}-{kind.get('what', 'vllm-stops')}-{kind.get('detail', '')}-{cid}")
            if cid not in causes:
                causes[cid] = RootCause(cid, title, kind, None, top, unread=unread)
            cause = causes[cid]
        cause.units.append(unit)
        for e in unit.entries:
            cause.found_on[(unit.key, e.release, e.runner.name)] = _found(cause, e)
    return [c for c in causes.values() if c.units or c.known is not None]


def _found(cause: RootCause, entry: Entry) -> int | None:
    if cause.known is not None:
        return anchor_rank(cause.known, entry)
    if cause.anchor is None:
        return None
    key = statement_key(cause.anchor)
    return next((i for i, s in enumerate(entry.deciding) if statement_key(s) == key), None)


def ordered(causes: list[RootCause]) -> list[RootCause]:
    """Worst first, then the most releases and runners confirmed, then by id."""
    return sorted(causes, key=lambda c: (c.severity.rank, -len({(e.release, e.runner) for e in c.entries}), c.id))


# -- the matrix ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Cell:
    state: str
    how: str = ""  # replay, unit test, reading; "" for not replayed
    detail: str = ""


def _runs(conformance: dict) -> dict[tuple[str, Runner], dict]:
    return {k: {t["name"]: t for t in v.get("traces", [])} for k, v in conformance.items()}


def _shows(trace, policy_name: str, signature: dict) -> bool | None:
    """Whether the model of ``policy_name`` shows the class signature on the trace's events (None:
    the trace's start-up order cannot happen under it)."""
    from contract.core.classes import signatures
    from contract.core.engine import Run
    from contract.core.properties import check
    from contract.families import load_policy

    policy = load_policy(policy_name)
    run = Run(trace.scenario, policy)
    wanted = (kind_of(signature), signature.get("role"), signature.get("runtime_mode"))
    for event in trace.events:
        if not run.can(event):
            return None if not run.records else False
        record = run.apply(event)
        for sig, _ in signatures(record, check(record, trace.scenario, policy.runner)):
            got = sig.to_json()
            if (kind_of(got), got.get("role"), got.get("runtime_mode")) == wanted:
                return True
    return False


def matrix(cause: RootCause, conformance: dict, root: Path = ROOT) -> dict[tuple[str, str], dict[str, Cell]]:
    """(runner, role) -> release -> Cell (module docstring)."""
    from contract.core.trace import TraceError, load
    from contract.evidence.matrix import release_policy

    runs = _runs(conformance)
    rows = sorted({(e.runner.name, e.role) for e in cause.entries}
                  | set(cause.known.covers if cause.known else []))
    traces = {}
    for unit in cause.units:
        try:
            traces[unit.key] = (load(root / unit.home.source), unit.home.signature)
        except (TraceError, OSError):
            continue
    history = (cause.anchor or {}).get("since") or {}
    out: dict[tuple[str, str], dict[str, Cell]] = {}
    for runner_name, role in rows:
        runner = Runner(runner_name)
        cells: dict[str, Cell] = {}
        for release in RELEASES:
            if runner not in RUNNERS_IN[release]:
                cells[release] = Cell(NOT_PRESENT, READING, f"vLLM {release} has no {RUNNER_FILES[runner]}")
                continue
            cell = _replayed(cause, runner, role, release, runs.get((release, runner)), traces, release_policy)
            if cell is None and cause.known is not None and (runner_name, role) in cause.known.covers:
                verdict = cause.known.expected.get(release)
                test = f"{cause.known.folder}/{cause.known.test}"
                if verdict == "fail":
                    cell = Cell(CONFIRMED, UNIT_TEST, f"{test} fails")
                elif verdict == "pass":
                    cell = Cell(NOT_AFFECTED, UNIT_TEST, f"{test} passes")
                elif verdict == "skip":
                    cell = Cell(NOT_PRESENT, UNIT_TEST, f"{test} skips: the code it tests is absent")
            if cell is None:
                entry = (history.get("history") or {}).get(release)
                if entry is not None and not entry.get("present") and entry.get("note"):
                    # since.py's note: the anchor's file or function is absent from that release
                    cell = Cell(NOT_PRESENT, READING, entry["note"])
            cells[release] = cell or Cell(NOT_REPLAYED, "", "")
        out[(runner_name, role)] = cells
    return out


def _replayed(cause: RootCause, runner: Runner, role: str, release: str, run: dict | None, traces: dict,
              release_policy) -> Cell | None:
    """The replay's verdict for a row on a release, or None when no witness of the row was replayed."""
    mine = [e for e in cause.entries if e.release == release and e.runner is runner and e.role == role]
    if mine:
        return Cell(CONFIRMED, REPLAY, ", ".join(sorted({e.name for e in mine})))
    if run is None:
        return None
    policy = release_policy(release, runner)
    if policy is None:
        return None
    seen: list[tuple[str, str]] = []
    for unit in cause.units:
        if unit.key not in traces or unit.home.runner is not runner or unit.home.role != role:
            continue
        trace, signature = traces[unit.key]
        result = run.get(trace.name)
        if result is None or result.get("status") != "replayed":
            continue
        if result.get("agreeing") != result.get("steps"):
            return Cell(REFUTED, REPLAY, f"{trace.name}: {result.get('agreeing')} of {result.get('steps')} steps agree")
        shown = _shows(trace, policy, signature)
        if shown is None:
            continue
        seen.append((trace.name, CONFIRMED if shown else NOT_AFFECTED))
    if not seen:
        return None
    if any(state == CONFIRMED for _, state in seen):
        return Cell(CONFIRMED, REPLAY, ", ".join(n for n, s in seen if s == CONFIRMED))
    return Cell(NOT_AFFECTED, REPLAY, ", ".join(n for n, _ in seen[:3]) + (" ..." if len(seen) > 3 else ""))


def first_confirmed(cells: dict[tuple[str, str], dict[str, Cell]]) -> str | None:
    for release in RELEASES:
        if any(row[release].state == CONFIRMED for row in cells.values()):
            return release
    return None


def affected(cells: dict[tuple[str, str], dict[str, Cell]]) -> list[tuple[str, str]]:
    """(release, runner) pairs with a confirmed cell, oldest first."""
    out = []
    for release in RELEASES:
        for (runner, _), row in sorted(cells.items()):
            if row[release].state == CONFIRMED and (release, runner) not in out:
                out.append((release, runner))
    return out
