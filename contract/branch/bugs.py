"""The corpus of real vLLM CUDA-graph bugs (``bugs/<id>/``), each put back into a release the tool
replays, and what the branch check finds of it.

A bug's folder holds ``bug.json`` (the upstream issues and pull requests, the releases it affected,
the configuration that triggers it, its symptom, mechanism and category, the fix, and how it is
re-injected) and, where its mechanism can be put back into vLLM 0.34.0 (Model Runner V2) or 0.33.0
(Model Runner V1, or Model Runner V2 code 0.34.0 removed), ``vllm-<release>.patch``: the smallest
edit that restores it. ``check`` applies the patch to a copy of the installed release
(``contract/branch/fixcheck.py``'s ``patched_copy``) and runs the same branch replay as ``conform
--vllm-src --base <release>`` on the release's covering corpus: nothing is written for a bug, so
a bug counts as found only through the general model, corpus and properties.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from contract.branch import base as base_mod
from contract.branch import conform as branch_conform
from contract.branch import tree as tree_mod
from contract.branch.fixcheck import FixCheckError, patched_copy
from contract.branch.review import review
from contract.core import child
from contract.core.policy import PolicyError
from contract.families import by_runner, load_policy
from contract.real.installed import EnvironmentProblem, environment, missing, package_of, release

SCHEMA = "cudagraph-contract.bug"
CATEGORIES = ("resolution", "sizes", "attention capability", "breakable", "drafter", "micro-batching", "LoRA",
              "ranks", "encoder", "profiling/memory")
SYMPTOMS = ("crash at start-up", "crash when serving", "hang", "wrong result", "silent eager", "memory")
RUNNERS = ("mrv1", "mrv2")
# A bug's outcome: found (a new class or lost graphs on vLLM's own code, which a person then judged
# against the bug's mechanism: ``match``), missed (some replayed trace called an edited function;
# ``differing_steps`` says whether vLLM's observations then differed from the release's at all),
# not exercised (no replayed trace called an edited function), in the release (nothing to
# re-inject: the release has the bug), not re-injectable (its mechanism has no small edit in the
# releases replayed), no environment (the release is not here).
FOUND, MISSED, UNEXERCISED, IN_RELEASE, NOT_REINJECTABLE, NO_ENVIRONMENT = (
    "found", "missed", "not exercised", "in the release", "not re-injectable", "no environment")


class BugError(PolicyError):
    """A bug folder the corpus cannot use; one line naming it."""


@dataclass(frozen=True)
class Bug:
    id: str
    folder: Path
    title: str
    issues: tuple[int, ...]
    prs: tuple[int, ...]
    releases: str  # the releases it affected, in words
    configuration: str
    symptom: str
    mechanism: str
    category: str
    fix: dict  # pr, where, change
    evidence: tuple[str, ...]  # the sentences of the issue or pull request that state the root cause
    release: str | None  # the release the edit goes into (or that has the bug as released)
    runner: str | None
    patch: Path | None
    edit: str  # what the edit does
    faithful: str  # why it puts the bug's mechanism back, or why it cannot
    missing: str  # for a bug the tool misses: what it would need (a setting, a property, a component)
    match: str  # for a found bug: the class a person judged to be the bug's mechanism, and why
    # for a bug in the release as shipped: the prefix of the class ids (reports/<policy>/classes/) or
    # capture-size class titles a person judged to be its mechanism; the release's confirmed findings
    # are searched for them
    shown_by: str

    @classmethod
    def read(cls, folder: Path) -> Bug:
        where = folder / "bug.json"
        try:
            data = json.loads(where.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise BugError(f"{where} cannot be read: {getattr(exc, 'strerror', None) or exc}") from None
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise BugError(f"{where}: not a {SCHEMA} file")
        if data.get("id") != folder.name:
            raise BugError(f"{where}: its id {data.get('id')!r} is not its folder's name")
        try:
            r = data["reinjection"]
            bug = cls(
                id=folder.name, folder=folder, title=data["title"],
                issues=tuple(int(n) for n in data["issues"]), prs=tuple(int(n) for n in data["prs"]),
                releases=data["releases"], configuration=data["configuration"], symptom=data["symptom"],
                mechanism=data["mechanism"], category=data["category"], fix=dict(data["fix"]),
                evidence=tuple(data["evidence"]), release=r.get("release"), runner=r.get("runner"),
                patch=folder / r["patch"] if r.get("patch") else None, edit=data.get("edit", ""),
                faithful=data["faithful"], missing=data.get("missing", ""), match=data.get("match", ""),
                shown_by=data.get("shown_by", ""))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise BugError(f"{where}: {type(exc).__name__}: {exc}") from None
        problem = bug._problem()
        if problem:
            raise BugError(f"{where}: {problem}")
        return bug

    def _problem(self) -> str | None:
        if self.category not in CATEGORIES:
            return f"category {self.category!r} is not one of {', '.join(CATEGORIES)}"
        if self.symptom not in SYMPTOMS:
            return f"symptom {self.symptom!r} is not one of {', '.join(SYMPTOMS)}"
        if not (self.issues or self.prs):
            return "names no issue and no pull request"
        if self.patch is not None:
            if not self.patch.is_file():
                return f"names the patch {self.patch.name}, which is not there"
            if self.release is None or self.runner not in RUNNERS or not self.edit:
                return "a patch needs its release, its runner (mrv1 or mrv2) and what the edit does"
        return None

    @property
    def links(self) -> list[str]:
        return ([f"[#{n}](https://github.com/vllm-project/vllm/issues/{n})" for n in self.issues]
                + [f"[#{n}](https://github.com/vllm-project/vllm/pull/{n})" for n in self.prs])


def corpus(root: Path) -> list[Bug]:
    """Every ``<root>/<id>/bug.json``, by id."""
    if not root.is_dir():
        raise BugError(f"{root} is not a folder of bugs (bugs/<id>/bug.json)")
    return [Bug.read(folder) for folder in sorted(p for p in root.iterdir() if (p / "bug.json").is_file())]


@dataclass
class Outcome:
    bug: str
    status: str
    classes: list[str] = field(default_factory=list)  # "new: <title>", "lost graphs: <title>"
    changed: list[str] = field(default_factory=list)
    unexercised: list[str] = field(default_factory=list)
    traces: int = 0
    differing_steps: int = 0  # steps where vLLM's observation on the tree differs from the release's
    seconds: float = 0.0
    differing_settings: int = 0  # capture-size settings whose derived lists differ from the release's
    detail: str = ""  # why it is not re-injected, or the error that stopped its run
    witness: str | None = None  # a found bug: the first class's witness trace (JSON), its regression test

    def to_json(self) -> dict:
        """The outcome, without its time: the file changes when an outcome does."""
        return {"bug": self.bug, "status": self.status, "classes": self.classes, "changed": self.changed,
                "unexercised": self.unexercised, "traces": self.traces, "differing_steps": self.differing_steps,
                "differing_settings": self.differing_settings, "detail": self.detail}

    @classmethod
    def from_json(cls, data: dict) -> Outcome:
        return cls(str(data["bug"]), str(data["status"]), list(data["classes"]), list(data["changed"]),
                   list(data["unexercised"]), int(data["traces"]), int(data["differing_steps"]),
                   detail=str(data["detail"]), differing_settings=int(data.get("differing_settings", 0)))


def shown_in_release(bug: Bug, conformance: Path) -> list[str]:
    """What the release's committed conformance report shows of the bug on vLLM's own code: the
    confirmed trace classes whose ids (their witness files) start with the bug's ``shown_by``, and
    the capture-size classes whose titles do, each with its first setting."""
    if not (bug.shown_by and bug.release):
        return []
    name = f"vllm-{bug.release}" + ("-mrv2" if bug.runner == "mrv2" else "") + ".json"
    try:
        data = json.loads((conformance / name).read_text(encoding="utf-8"))
        findings = [(str(f["source"]), str(f["outcome"])) for f in data["findings"]]
        sized = [(str(c["title"]), str(c["first"])) for c in (data.get("capture_sizes") or {}).get("classes", [])]
    except FileNotFoundError:
        return []
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise BugError(f"{conformance / name} cannot be read as a conformance report ({type(exc).__name__}: {exc}); "
                       f"regenerate it with cudagraph-contract conform --vllm {bug.release}") from None
    return sorted(Path(source).stem for source, outcome in findings
                  if outcome == "confirmed" and Path(source).parent.name == "classes"
                  and Path(source).stem.startswith(bug.shown_by)) + \
        [f"{title} (first: {first})" for title, first in sized if title.startswith(bug.shown_by)]


def check(bug: Bug, work: Path, timeout: float | None, conformance: Path, kind: str = "covering") -> Outcome:
    """The bug re-injected into a copy of its release under ``work``, replayed as a branch; a bug in
    the release as shipped is looked up in the release's conformance report under ``conformance``."""
    if bug.patch is None:
        if not bug.release:
            return Outcome(bug.id, NOT_REINJECTABLE, detail=bug.faithful)
        shown = shown_in_release(bug, conformance)
        return Outcome(bug.id, IN_RELEASE, [f"confirmed on {bug.release}: {c}" for c in shown], detail=bug.faithful)
    pkg, python = package_of(bug.release), environment(bug.release)
    if pkg is None or not python.exists():
        return Outcome(bug.id, NO_ENVIRONMENT, detail=missing(bug.release))
    started = time.perf_counter()
    try:
        tree_root = patched_copy(pkg, bug.patch, work / bug.id)
        tree = tree_mod.load(tree_root, runner=bug.runner)
        family = by_runner(tree.policy.runner)
        chosen = base_mod.release_base(bug.release, family)
        r = review(tree, chosen, family)
        release_policy = load_policy(family.release_policy(release(bug.release)))
        run = branch_conform.run(r, family, release_policy, python, bug.release, kind, timeout)
    except (FixCheckError, PolicyError, EnvironmentProblem) as exc:
        raise BugError(f"bug {bug.id}: {exc}") from None
    except (branch_conform.ObserveProblem, child.ChildProblem) as exc:
        return Outcome(bug.id, "error", detail=str(exc), seconds=time.perf_counter() - started)
    d = run.differential
    shown = [*d.new, *d.lost]
    classes = [f"new: {c.title}" for c in d.new] + [c.title for c in d.lost]  # a lost one's title says so
    classes += [f"new: {c.gap.title}" for c in (run.sizes.new if run.sizes else [])]
    status = FOUND if classes else MISSED if run.exercised else UNEXERCISED
    return Outcome(bug.id, status, classes, list(run.changed), list(run.unexercised), len(run.traces),
                   len(run.changes), time.perf_counter() - started,
                   differing_settings=len(run.sizes.changed) if run.sizes else 0,
                   witness=shown[0].witness.dumps() if shown else
                   run.sizes.new[0].witness_json(run.version) if run.sizes and run.sizes.new else None)
