"""``conform --vllm-src TREE --base RELEASE``: the classes vLLM's own code shows on a branch and on
the release it starts from.

Both sides are vLLM's code in the release's environment, CUDA graphs simulated on CPU: the release as
installed, and the release with the tree's differing modules on top (``contract/real/overlay.py``),
so an edit anywhere in the replayed code runs as vLLM's own. The base side is replayed once per
release, runner, corpus and tool version and cached (``cache.py``); a branch run replays the
branch side of the traces the change can reach: those whose decision path on the base (the vLLM
functions that decided each step) reaches a changed function or a changed module, plus a fixed
sample of the rest (every ``SAMPLE_EVERY``-th trace); ``--corpus full`` replays every trace. The
P0–P7 checks and class signatures run on each side's observations (``contract/real/judge.py``); an
occurrence is a signature in a trace, and new, fixed and inherited are decided per trace as the
model's differential decides them per scenario. Each trace is the fixed serving script, so graph
coverage (``contract/core/graphs.py``) is counted on both sides' observations: a trace where the
branch serves fewer dispatches of a kind with a graph has lost graphs, and a class the branch no
longer shows there is traded, not fixed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from contract.branch import cache
from contract.branch import sizes as branch_sizes
from contract.branch.review import Review
from contract.core import child, progress
from contract.core.classes import Occurrence, Signature, classes_from, signatures
from contract.core.differential import Differential, lost_occurrence, split_refused
from contract.core.graphs import affected_share
from contract.core.family import Family
from contract.core.modes import AttentionCGSupport
from contract.core.properties import attention_levels, check
from contract.core.trace import Trace
from contract.real import corpus as corpus_mod
from contract.real import judge
from contract.real.attention_backends import DEFAULT_FILES, choose
from contract.real import provenance
from contract.real.installed import EnvironmentProblem, import_root, package_of, replay_settings

SAMPLE_EVERY = 10
LEVELS = {level.name for level in AttentionCGSupport}


class ObserveProblem(Exception):
    """The replay in the release's environment failed; one line."""


def observe(python: Path, family: Family, traces: list[Trace], tree: Path | None, timeout: float | None,
            what: str, version: str, release_pkg: Path, watch: dict | None = None,
            backends: dict[str, str] | None = None) -> dict:
    """The traces replayed in ``python``'s vLLM (with ``tree``'s modules on top), by a child process
    whose only way to report is its validated result: observations of exactly the traces asked
    for, on the release asked for, by vLLM code from the release's files (and the tree's where the
    tree's differ: ``contract/real/provenance.py``); ``backends``: the attention backend run per
    level where it is not the default (:func:`attention_backends`)."""
    try:
        root = import_root()
    except EnvironmentProblem as exc:
        raise ObserveProblem(str(exc)) from None
    payload = {"runner": family.name, "traces": [t.to_json() for t in traces],
               "tree": str(Path(tree).resolve()) if tree is not None else None, "watch": watch or {},
               "backends": backends or {}}
    progress.stage("traces", len(traces), what)
    try:  # the child counts the traces it replayed
        outcome = child.run("contract.branch.observe:observe", payload, what=what, timeout=timeout,
                            python=python, settings=replay_settings(), root=root, progress=True)
    except child.ChildProblem as exc:
        raise ObserveProblem(str(exc)) from None
    data = outcome.value
    if not isinstance(data, dict) or not isinstance(data.get("observations"), list):
        raise ObserveProblem(f"{what} returned no observations")
    names = [o.get("name") if isinstance(o, dict) else None for o in data["observations"]]
    if names != [t.name for t in traces]:
        raise ObserveProblem(f"{what} returned observations of other traces than the {len(traces)} it was given")
    if not isinstance(data.get("where"), dict):
        raise ObserveProblem(f"{what} returned observations without where its decisions were made")
    try:
        provenance.check_child(data, release_pkg, version, tree)
    except provenance.ProvenanceProblem as exc:
        raise ObserveProblem(f"{what}: {exc}") from None
    return data


def _release(python: Path, version: str) -> tuple[Path, str]:
    """The release's installed ``vllm/`` (checked against its RECORD) and the digest of that RECORD."""
    pkg = package_of(version, python.parent.parent.parent)
    if pkg is None:
        raise ObserveProblem(f"no vllm package in the environment of {python}")
    try:
        provenance.check_installed(pkg, version)
    except provenance.ProvenanceProblem as exc:
        raise ObserveProblem(str(exc)) from None
    return pkg, provenance.digest(pkg)


def corpus(family: Family, release_policy, tree, kind: str, entry: str, version: str,
           notes: cache.Notes) -> list[Trace]:
    """The release policy's corpus (``covering``: one trace per observation cell; ``full``: every
    trace; kept in the cache with the base's observations), then, when the tree's rules are not the
    release's, the tree policy's covering traces the first does not have: of another scenario, or of
    the same one with other events (the release stopped where the tree goes on)."""
    chosen = cache.load_corpus(f"{entry}-{kind}", notes)
    if chosen is None:
        progress.stage("", None, f"choosing the {kind} traces of vLLM {version}")
        traces = family.corpus(release_policy)
        chosen = corpus_mod.select(traces) if kind == "covering" else list(traces)
        cache.store_corpus(f"{entry}-{kind}", chosen)
    seen = {(t.scenario, tuple(t.events)) for t in chosen}
    if tree.release is None:
        for t in corpus_mod.select(family.corpus(tree.policy)):
            if (t.scenario, tuple(t.events)) not in seen:
                seen.add((t.scenario, tuple(t.events)))
                t.name = f"branch-{t.name}"
                chosen.append(t)
    return chosen


def attention_backends(python: Path, family: Family, review: Review,
                       timeout: float | None) -> tuple[dict[str, str], dict[str, str]]:
    """(level -> the registry backend both sides run for it, level -> the changed file defining
    it), where the tree changes a file that defines a registered attention backend: its level is the
    release's own getter's, asked of the release in ``python``'s environment on the replay's platform
    (``contract/real/attention_backends.py``). Both empty when the change touches no backend's file."""
    paths = sorted(f.path for f in (review.diff.python if review.diff else []) if f.kind != "removed"
                   and f.path.startswith("v1/attention/backends/"))
    if not paths:
        return {}, {}
    try:
        outcome = child.run("contract.branch.observe:backend_levels", {"runner": family.name, "paths": paths},
                            what="the attention backends' levels", timeout=timeout, python=python,
                            settings=replay_settings(), root=import_root())
    except (child.ChildProblem, EnvironmentProblem) as exc:
        raise ObserveProblem(str(exc)) from None
    found = outcome.value.get("levels") if isinstance(outcome.value, dict) else None
    if not isinstance(found, dict) or not all(
            isinstance(k, str) and isinstance(v, list) and len(v) == 2 and v[0] in LEVELS and v[1] in paths
            for k, v in found.items()):
        raise ObserveProblem("the attention backends' levels came back malformed")
    return choose({name: (level, file) for name, (level, file) in found.items()})


def base_observations(python: Path, family: Family, version: str, traces: list[Trace], timeout: float | None,
                      entry: str, release_pkg: Path, notes: cache.Notes,
                      backends: dict[str, str] | None = None) -> tuple[dict, dict, int]:
    """(trace name -> base observation, where, traces replayed now): from the release's cache (by
    what each trace replays, whatever its name), completed by a replay of the traces it lacks."""
    cached = cache.load(entry, notes) or {"observations": {}, "where": {}}
    known = cached["observations"]
    digests = {t.name: cache.trace_digest(t) for t in traces}
    missing = [t for t in traces if digests[t.name] not in known]
    if missing:
        data = observe(python, family, missing, None, timeout, f"the replay of vLLM {version}", version, release_pkg,
                       backends=backends)
        known.update({digests[o["name"]]: o for o in data["observations"]})
        cached["where"] = data["where"] | cached["where"]
        cache.store(entry, data["vllm"], known, cached["where"])
    return {t.name: known[digests[t.name]] for t in traces}, cached["where"], len(missing)


@dataclass(frozen=True)
class Selection:
    by_impact: tuple[str, ...]  # traces whose base decision path reaches the change
    sampled: tuple[str, ...]  # a fixed sample of the rest
    total: int
    why: str  # one line

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self.by_impact) | frozenset(self.sampled)


def _reached(observation: dict, where: dict) -> tuple[set[tuple[str, str]], set[str]]:
    """The (file, function) pairs and files a base trace's decision path reached."""
    functions, files = set(), set()
    for step in observation.get("path", []):
        for point in step.get("points", []):
            w = where.get(point)
            if w and w.get("owner") != "harness" and w.get("path"):
                functions.add((w["path"], w["function"].split(" (")[0]))
                files.add(w["path"])
    return functions, files


def select(traces: list[Trace], base: dict, where: dict, review: Review | None, full: str | None,
           backend_files: dict[str, str] | None = None) -> Selection:
    """The traces a branch run replays: every one when ``full`` says why (``--corpus full``, traces a
    person gave) or the change is unknown; else those whose base decision path reaches a changed
    function, or a changed file where no decision point names the function, plus every
    ``SAMPLE_EVERY``-th of the rest. A changed backend's file (``backend_files``, level -> file) is
    reached by every trace that builds an attention group of its level."""
    names = [t.name for t in traces]
    if full:
        return Selection(tuple(names), (), len(names), f"{full}: all {len(names)}")
    if review is None or review.diff is None:
        return Selection(tuple(names), (), len(names), f"no base source to compare the tree with: all {len(names)} traces")
    changed_functions = {(path, fn.qualname) for path, fn in review.diff.functions()}
    changed_files = {f.path for f in review.diff.python}
    reach = {t.name: _reached(base.get(t.name, {}), where) for t in traces}
    for t in traces:
        reach[t.name][1].update(file for level, file in (backend_files or {}).items()
                                if level in {s.name for s in attention_levels(t.scenario)})
    point_functions = {fn for functions, _ in reach.values() for fn in functions}
    # A changed function that is a decision point selects the traces reaching it; any other change
    # in a file selects the traces reaching that file.
    by_function = changed_functions & point_functions
    by_file = {f.path for f in review.diff.python
               if f.module_level or any((f.path, fn.qualname) not in point_functions for fn in f.functions)}
    impact = [n for n in names if reach[n][0] & by_function or reach[n][1] & by_file]
    unreached = {p for p in changed_files & set(review.replayed) if not any(p in files for _, files in reach.values())}
    if unreached:
        return Selection(tuple(names), (), len(names),
                         f"{len(unreached)} changed replayed file(s) on no recorded decision path "
                         f"({', '.join(sorted(unreached)[:3])}): all {len(names)} traces")
    rest = [n for n in names if n not in set(impact)]
    sampled = rest[::SAMPLE_EVERY]
    return Selection(tuple(impact), tuple(sampled), len(names),
                     f"{len(impact)} of {len(names)} traces reach the change on the base; "
                     f"{len(sampled)} more sampled (every {SAMPLE_EVERY}th of the rest); --corpus full replays all")


def _levels_decide(review: Review, backend_files: dict[str, str]) -> bool:
    """Whether every replayed file the tree changes defines a backend it runs, so that the levels
    alone select the traces (``select``) and the base replays only those."""
    changed = {f.path for f in review.diff.python} & set(review.replayed) if review.diff else set()
    return bool(changed) and changed <= set(backend_files.values())


def occurrences(traces: list[Trace], observed: dict, label: str, family: Family, vllm: str) -> tuple[dict, dict]:
    """Per signature, the traces that show it on vLLM's code (witness cut at the step), and the
    witness traces by (signature, trace index)."""
    found: dict[Signature, list[Occurrence]] = {}
    witnesses: dict[tuple, Trace] = {}
    for index, trace in enumerate(traces):
        steps = observed.get(trace.name, {}).get("steps")
        if not steps:
            continue
        events = trace.events[: len(steps)]
        records = judge.records(steps, events, family.descriptor_from_json,
                                profiling_skipped=family.profiling_skipped(trace.scenario, vllm))
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
                    origin={"engine": "conformance", "vllm": vllm, "corpus_trace": trace.name})
    return found, witnesses


def _subset(occs: dict, other: dict, keep_shared: bool) -> dict:
    theirs = {(sig, o.scenario_index) for sig, os_ in other.items() for o in os_}
    out: dict = {}
    for sig, os_ in occs.items():
        for o in os_:
            if ((sig, o.scenario_index) in theirs) == keep_shared:
                out.setdefault(sig, []).append(o)
    return out


def _records(trace: Trace, observed: dict, family: Family, vllm: str) -> list:
    steps = observed.get(trace.name, {}).get("steps") or []
    return judge.records(steps, trace.events[: len(steps)], family.descriptor_from_json,
                         profiling_skipped=family.profiling_skipped(trace.scenario, vllm))


def lost(traces: list[Trace], base_obs: dict, branch_obs: dict, label: str, family: Family,
         vllm: str) -> tuple[dict, dict]:
    """Per lost dispatch kind, the traces where vLLM's code on the branch serves fewer dispatches of
    it with a graph than on the base (``contract/core/graphs.py``), each witnessed by the branch's
    observation of the whole trace."""
    found: dict[Signature, list[Occurrence]] = {}
    witnesses: dict[tuple, Trace] = {}
    for index, trace in enumerate(traces):
        if not base_obs.get(trace.name, {}).get("steps"):
            continue
        mine = _records(trace, branch_obs, family, vllm)
        for sig, o in lost_occurrence(index, trace.scenario, _records(trace, base_obs, family, vllm), mine,
                                      family.runner).items():
            found.setdefault(sig, []).append(o)
            steps = branch_obs.get(trace.name, {}).get("steps") or []
            witnesses[(sig, index)] = Trace(
                trace.scenario, label, list(o.events), name=f"{label}-{trace.name}",
                expected_steps=steps[: len(o.events)],
                origin={"engine": "conformance", "vllm": vllm, "corpus_trace": trace.name})
    return found, witnesses


def compare(traces: list[Trace], base_obs: dict, branch_obs: dict, branch_label: str, base_label: str,
            family: Family, vllm: str) -> Differential:
    """New, fixed, inherited and traded classes of vLLM's own observations, and lost graphs, base
    against branch, per trace."""
    mine, my_witnesses = occurrences(traces, branch_obs, branch_label, family, vllm)
    theirs, their_witnesses = occurrences(traces, base_obs, base_label, family, vllm)
    lost_occs, lost_witnesses = lost(traces, base_obs, branch_obs, branch_label, family, vllm)

    def classes(subset, witnesses):
        return classes_from(subset, lambda o, sig: witnesses[(sig, o.scenario_index)],
                            affected=lambda o, sig: _affected(traces[o.scenario_index], witnesses, sig, o))

    def _affected(trace, witnesses, sig, o):
        observed = base_obs if witnesses is their_witnesses else branch_obs
        return affected_share(_records(trace, observed, family, vllm), trace.scenario, family.runner, sig)

    lost_indices = {o.scenario_index for occs in lost_occs.values() for o in occs}
    fixed = _subset(theirs, mine, False)
    traded = {sig: [o for o in occs if o.scenario_index in lost_indices] for sig, occs in fixed.items()}
    fixed = {sig: [o for o in occs if o.scenario_index not in lost_indices] for sig, occs in fixed.items()}
    refused, lost_occs = split_refused(lost_occs)
    return Differential(branch_label, base_label,
                        new=classes({**_subset(mine, theirs, False), **refused}, {**my_witnesses, **lost_witnesses}),
                        fixed=classes({k: v for k, v in fixed.items() if v}, their_witnesses),
                        inherited=classes(_subset(mine, theirs, True), my_witnesses),
                        traded=classes({k: v for k, v in traded.items() if v}, their_witnesses),
                        lost=classes_from(lost_occs, lambda o, sig: lost_witnesses[(sig, o.scenario_index)]))


@dataclass(frozen=True)
class StepChange:
    trace: str
    step: int
    event: str
    base: dict | None
    branch: dict | None


def changes(traces: list[Trace], base_obs: dict, branch_obs: dict) -> list[StepChange]:
    """Every step where vLLM's observation on the branch differs from the base's."""
    out = []
    for t in traces:
        a, b = base_obs.get(t.name, {}), branch_obs.get(t.name, {})
        if "cannot_build" in a or "cannot_build" in b:
            if a.get("cannot_build") != b.get("cannot_build"):
                out.append(StepChange(t.name, 0, "start-up", {"cannot_build": a.get("cannot_build")},
                                      {"cannot_build": b.get("cannot_build")}))
            continue
        sa, sb = a.get("steps", []), b.get("steps", [])
        for i in range(max(len(sa), len(sb))):
            x, y = (sa[i] if i < len(sa) else None), (sb[i] if i < len(sb) else None)
            if x != y:
                event = t.events[i].kind if i < len(t.events) else "?"
                out.append(StepChange(t.name, i, event, x, y))
    return out


@dataclass
class BranchRun:
    family: Family
    version: str
    review: Review
    traces: list[Trace]
    selection: Selection
    differential: Differential
    changes: list[StepChange]
    tree_modules: list[str]
    base_replayed: int  # base traces replayed now (the rest came from the cache)
    base_observations: dict  # trace name -> vLLM's observation on the release
    branch_observations: dict  # trace name -> on the tree
    seconds: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # what happened to the cache, one line each
    changed: tuple[str, ...] = ()  # the changed functions ("path:qualname") and changed module levels ("path")
    unexercised: tuple[str, ...] = ()  # those no replayed trace ran (a module level: its module never imported)
    sizes: branch_sizes.SizesRun | None = None  # the capture-size check, where the family models sizes

    def exit_code(self, allow_lost_graphs: bool = False) -> int:
        """1 when the branch adds a class (traces or sizes), or loses graphs (unless allowed); else 0."""
        return max(self.differential.exit_code(allow_lost_graphs), int(bool(self.sizes and self.sizes.new)))

    @property
    def exercised(self) -> bool:
        """Some replayed trace ran a change of the tree's (where it changes anything the replay could run)."""
        return not self.changed or len(self.unexercised) < len(self.changed)

    def to_json(self) -> dict:
        return {"vllm": self.version, "runner": self.family.name, "tree": str(self.review.tree.tree),
                "base": self.review.base.said, "traces": self.selection.total,
                "replayed": sorted(self.selection.names), "selection": self.selection.why,
                "tree_modules": self.tree_modules, "base_from_cache": self.selection.total - self.base_replayed,
                "cache_notes": list(self.notes), "changed": list(self.changed),
                "unexercised": list(self.unexercised), **self.differential.to_json(),
                "sizes": self.sizes.to_json() if self.sizes else None,
                "changes": [{"trace": c.trace, "step": c.step, "event": c.event, "base": c.base, "branch": c.branch}
                            for c in self.changes]}


def run(review: Review, family: Family, release_policy, python: Path, version: str, kind: str,
        timeout: float | None, given: list[Trace] | None = None, always: list[Trace] = (),
        size_settings: list | None = None) -> BranchRun:
    """The branch replay: corpus (``given`` replaces it), cached base, impact selection, branch side,
    classes; ``always`` are replayed whatever the selection (a root cause's witnesses). The capture-size
    check (``sizes.py``) runs its grid, or only ``size_settings`` (a size witness's); traces given
    without size settings skip it."""
    started = time.perf_counter()
    release_pkg, release_digest = _release(python, version)
    entry, notes = cache.key(version, family.name, release_digest), cache.Notes()
    traces = given if given is not None else corpus(family, release_policy, review.tree, kind, entry, version, notes)
    traces = [*always, *traces]
    for i, t in enumerate(traces):
        t.name = t.name or f"trace-{i}"
    backends, changed_backends = attention_backends(python, family, review, timeout)
    backend_files = {**DEFAULT_FILES, **changed_backends}
    if backends:  # the base side runs them too, in a cache entry of its own
        entry += "-" + "-".join(f"{level}={name}" for level, name in sorted(backends.items()))
        notes.append("attention backends run for the change: "
                     + ", ".join(f"{name} ({level})" for level, name in sorted(backends.items())))
    full = "the traces given" if given is not None else "--corpus full" if kind == "full" else None
    always_names = {t.name for t in always}
    by_levels = not full and _levels_decide(review, backend_files)  # then the base's paths are not needed
    selection = select(traces, {}, {}, review, None, backend_files) if by_levels else None
    base_all, where, base_replayed = base_observations(
        python, family, version, [t for t in traces if t.name in selection.names | always_names] if by_levels else traces,
        timeout, entry, release_pkg, notes, backends)
    selection = selection or select(traces, base_all, where, review, full, backend_files)
    kept = selection.names | always_names
    chosen = [t for t in traces if t.name in kept]
    sized = family.sizes is not None and family.sizes.models(version) and (given is None or bool(size_settings))
    try:
        if sized:
            progress.stage("", None, f"capture sizes of vLLM {version}")
            size_grid, base_sizes = branch_sizes.base(python, family, version, release_pkg, timeout, size_settings,
                                                      entry, notes)
        base_done = time.perf_counter()
        watch, changed = _changes(review)
        with cache.guard(notes):
            data = observe(python, family, chosen, review.tree.package, timeout, f"the replay of {review.tree.tree}",
                           version, release_pkg, watch, backends)
            sizes_run = None
            if sized:
                progress.stage("", None, f"capture sizes of {review.tree.tree}")
                sizes_run, side = branch_sizes.run(python, family, version, release_pkg, review.tree.package,
                                                   timeout, watch, size_grid, base_sizes)
                data["reached"] = sorted(set(data["reached"]) | side.reached)
                data["tree_modules"] = sorted(set(data["tree_modules"]) | set(side.tree_modules))
    except branch_sizes.SizesProblem as exc:
        raise ObserveProblem(str(exc)) from None
    unexercised = _unexercised(changed, data)
    branch_obs = {o["name"]: o for o in data["observations"]}
    base_obs = {t.name: base_all[t.name] for t in chosen}
    label = f"{Path(review.tree.tree).resolve().name} on vLLM {version}"
    d = compare(chosen, base_obs, branch_obs, label, f"vLLM {version}", family, data["vllm"])
    return BranchRun(family, version, review, chosen, selection, d, changes(chosen, base_obs, branch_obs),
                     data["tree_modules"], base_replayed, base_obs, branch_obs,
                     {"base": round(base_done - started, 1), "branch": round(time.perf_counter() - base_done, 1)},
                     list(notes), tuple(changed), unexercised, sizes_run)


def _changes(review: Review) -> tuple[dict[str, list[str]], list[str]]:
    """(path -> qualified names to watch, every change a replay could run): the changed and added
    functions of the tree's Python files, and the module level of a file whose statements outside
    functions changed (or that is new)."""
    if review.diff is None:
        return {}, []
    watch: dict[str, list[str]] = {}
    changed: list[str] = []
    for f in review.diff.python:
        if f.kind == "removed":
            continue
        names = [fn.qualname for fn in f.functions if fn.kind != "removed"]
        if names:
            watch[f.path] = names
            changed += [f"{f.path}:{n}" for n in names]
        if f.module_level or f.kind == "added" or f.unparsed:
            changed.append(f.path)
    return watch, changed


def _unexercised(changed: list[str], data: dict) -> tuple[str, ...]:
    """The changes of ``changed`` the branch side did not run: a function not recorded as reached, a
    module level whose module the replay never imported from the tree."""
    reached = set(data["reached"])
    imported = {m.removeprefix("vllm.").replace(".", "/") for m in data["tree_modules"]}
    out = []
    for change in changed:
        path, _, qualname = change.partition(":")
        module = path.removesuffix(".py").removesuffix("/__init__")
        if (change not in reached) if qualname else (module not in imported):
            out.append(change)
    return tuple(out)

