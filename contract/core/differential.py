"""What a branch breaks, fixes and inherits, compared with a base revision.

Both sides are enumerated by the explorer (``explore(..., classify=True)``), which records every
signature's shortest witness in every scenario class that shows it. An occurrence of the branch
is *inherited* when the base shows the same signature in the same scenario, *new* otherwise; a
base occurrence the branch no longer shows is *fixed*. Each of the three sets is then reduced to
classes (minimal settings, shortest witness) as ``contract/core/classes.py`` does for one policy. Working
per scenario rather than per class keeps a cause the branch adds under wider settings visible:
``pr56312_draft`` and ``vllm_0_30`` both leave a PIECEWISE drafter under a FULL target without a
capturer, but only the draft does so with breakable on.

A scenario the base did not explore (another config revision draws other canonical scenarios)
is judged by replaying the branch's witness on the base.

Fewer violations can also mean fewer graphs. Every scenario of either side is run on the fixed
serving script (``contract/core/graphs.py``) under both policies: where the branch serves fewer
dispatches of a kind with a graph than the base, it has **lost graphs** (a section of its own,
reduced to classes as the others are; ``exit_code`` fails on it unless lost graphs are allowed),
and a base class the branch no longer shows in such a scenario is **traded**, not fixed: the
violation went away because the graphs did. Where the branch refuses at start-up, with vLLM's
advice, a configuration the base starts, the refusal is a new class of its own (``REFUSED``, a crash
at start-up to the user whose command stops working) rather than lost graphs, though a single
release's refusal is none (``classes.rejection``); where the base runs that configuration broken (a
crash, a hang, a wrong result or a shape its backend does not support), the refusal is the fix.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from contract.core.classes import (NEWLY_REFUSED, REFUSED, Occurrence, Severity, Signature, ViolationClass, of_records,
                                   rejection, severity)
from contract.core.explore import DEFAULT_DEPTH, Exploration, explore, witnessed_classes
from contract.core.engine import Run
from contract.core.policy import Policy, PolicyError
from contract.core.properties import check


class BaseMismatch(PolicyError):
    """A base that cannot be compared with the branch (another runner); one line."""


LOST = "lost graphs"
SECTIONS = ("new", "lost", "traded", "fixed", "inherited")


@dataclass
class Differential:
    branch: str
    base: str
    new: list[ViolationClass] = field(default_factory=list)
    fixed: list[ViolationClass] = field(default_factory=list)
    inherited: list[ViolationClass] = field(default_factory=list)
    branch_exploration: Exploration | None = None
    base_exploration: Exploration | None = None
    traded: list[ViolationClass] = field(default_factory=list)  # gone where the branch lost graphs
    lost: list[ViolationClass] = field(default_factory=list)  # signature LOST: kinds served by fewer graphs

    @property
    def nothing_new(self) -> bool:
        return not self.new

    def exit_code(self, allow_lost_graphs: bool = False) -> int:
        """1 when the branch adds a class, or loses graphs (unless allowed); else 0."""
        return 1 if self.new or (self.lost and not allow_lost_graphs) else 0

    def summary(self) -> str:
        """``2 new, 1 lost graphs, 0 traded, 3 fixed, 5 inherited``, the order a reviewer reads."""
        return (f"{len(self.new)} new, {len(self.lost)} lost graphs, {len(self.traded)} traded, "
                f"{len(self.fixed)} fixed, {len(self.inherited)} inherited")

    def to_json(self) -> dict:
        out = {"branch": self.branch, "base": self.base,
               **{k: [c.to_json() for c in getattr(self, k)] for k in ("new", "fixed", "inherited", "traded")}}
        out["lost_graphs"] = [c.to_json() for c in self.lost]
        return out


def lost_signature(kind: str) -> Signature:
    from contract.core.graphs import ROLE

    return Signature(LOST, ROLE[kind], "-", f"fewer {kind} dispatches served by a graph")


def lost_occurrence(index: int, scenario, base_records, branch_records, runner) -> dict[Signature, Occurrence]:
    """The kinds the branch serves with fewer graphs than the base on the serving script, among those
    the configuration wants graphed (``graphs.wanted``), each at the first step where a dispatch of
    that kind loses its graph. Where the branch's run ends in an accepted rejection at a step the
    base goes on from, that refusal instead: a new class (``REFUSED``: ``split_refused``), every
    graph lost there lost to it, unless the base runs the configuration broken (``runs_broken``):
    refusing that with vLLM's advice is how a fix closes a configuration, and the base's classes
    there are then fixed."""
    from contract.core.graphs import coverage, dispatch_kind, lost_kinds, served, wanted

    last = branch_records[-1] if branch_records else None
    refused = rejection(last) if last is not None else None
    if refused is not None and any(r.index == last.index and not r.halted for r in base_records):
        if runs_broken(base_records, scenario, runner):
            return {}
        return {Signature(REFUSED, "-", "-", NEWLY_REFUSED, refused.detail):
                Occurrence(index, scenario, tuple(r.event for r in branch_records), last.index, last.halted)}

    base_cov, branch_cov = coverage(base_records), coverage(branch_records)
    out = {}
    for kind in [k for k in lost_kinds(base_cov, branch_cov) if wanted(k, scenario)]:
        step = len(branch_records) - 1
        for a, b in zip(base_records, branch_records):
            mine = [served(d) for d in b.dispatches if dispatch_kind(b.event, d) == kind]
            theirs = [served(d) for d in a.dispatches if dispatch_kind(a.event, d) == kind]
            if sum(mine) < sum(theirs) or len(mine) < len(theirs):
                step = b.index
                break
        a_s, a_t = base_cov.kinds().get(kind, (0, 0))
        b_s, b_t = branch_cov.kinds().get(kind, (0, 0))
        message = (f"{kind}: {b_s} of {b_t} dispatches served by a graph on the branch, {a_s} of {a_t} on the "
                   f"base (serving script: {branch_cov.text()}; base: {base_cov.text()})")
        out[lost_signature(kind)] = Occurrence(index, scenario, tuple(r.event for r in branch_records), step, message)
    return out


def runs_broken(records, scenario, runner) -> bool:
    """Whether a run shows a class at least as bad as a FULL graph of a shape the backend does not
    support: a user is better off with a refusal at start-up. A silent eager fallback, a graph
    captured when serving or memory the estimate missed still serve, so refusing them is a
    regression."""
    kinds = {r.index: r.event.kind for r in records}
    return any(severity(sig, kinds[i]).rank <= Severity.UNSUPPORTED_SHAPE.rank
               for sig, i in of_records(records, scenario, runner, check))


def lost_graphs(branch: Policy, base: Policy, scenarios) -> dict[Signature, list[Occurrence]]:
    """Per lost kind, every scenario where the branch serves fewer dispatches with a graph."""
    from contract.core.graphs import run_script

    if branch is base:  # a tree recognised as its base release: the same serving script everywhere
        return {}
    found: dict[Signature, list[Occurrence]] = {}
    for index, scenario in enumerate(scenarios):
        for sig, o in lost_occurrence(index, scenario, run_script(scenario, base), run_script(scenario, branch),
                                      base.runner).items():
            found.setdefault(sig, []).append(o)
    return found


def split_refused(lost: dict[Signature, list[Occurrence]]) -> tuple[dict, dict]:
    """(refusals, lost graphs) of ``lost_occurrence``'s occurrences."""
    refused = {sig: occs for sig, occs in lost.items() if sig.property == REFUSED}
    return refused, {sig: occs for sig, occs in lost.items() if sig.property != REFUSED}


def split_traded(fixed: dict[Signature, list[Occurrence]], lost_scenarios) -> tuple[dict, dict]:
    """Fixed occurrences where the branch loses no graph, and those where it does (traded)."""
    kept: dict = {}
    traded: dict = {}
    for sig, occs in fixed.items():
        for o in occs:
            (traded if o.scenario in lost_scenarios else kept).setdefault(sig, []).append(o)
    return kept, traded


def shows(policy: Policy, scenario, events, sig) -> bool:
    """Whether ``policy`` shows ``sig`` on a witness (the prefix of it ``policy`` can take)."""
    run = Run(scenario, policy)
    for event in events:
        if not run.can(event):
            break
        run.apply(event)
    return any(s == sig for s, _ in of_records(run.records, scenario, policy.runner, check))


def _split(mine: Exploration, theirs: Exploration, other: Policy) -> tuple[dict, dict]:
    """``mine``'s occurrences that ``theirs`` shares, and those it does not."""
    explored = set(theirs.scenario_list)
    shown = {(sig, o.scenario) for sig, occs in theirs.occurrences.items() for o in occs}
    shared: dict[Signature, list[Occurrence]] = {}
    only: dict[Signature, list[Occurrence]] = {}
    for sig, occs in mine.occurrences.items():
        for o in occs:
            if o.scenario in explored:
                both = (sig, o.scenario) in shown
            else:
                both = shows(other, o.scenario, o.events, sig)
            (shared if both else only).setdefault(sig, []).append(o)
    return shared, only


def compare(branch: Policy, base: Policy, depth: int = DEFAULT_DEPTH,
            branch_exploration: Exploration | None = None,
            base_exploration: Exploration | None = None) -> Differential:
    if branch.runner is not base.runner:
        raise BaseMismatch(f"base {base.name} models {base.runner.value} and {branch.name} models "
                           f"{branch.runner.value}: compare a branch with a base of the same model runner")
    mine = branch_exploration or explore(branch, depth, classify=True)
    theirs = base_exploration or explore(base, depth, classify=True)
    inherited, new = _split(mine, theirs, base)
    _, fixed = _split(theirs, mine, branch)
    scenarios = list(dict.fromkeys([*mine.scenario_list, *theirs.scenario_list]))
    lost = lost_graphs(branch, base, scenarios)
    fixed, traded = split_traded(fixed, {o.scenario for occs in lost.values() for o in occs})
    refused, lost = split_refused(lost)
    return Differential(branch.name, base.name,
                        new=witnessed_classes({**new, **refused}, branch, depth),
                        fixed=witnessed_classes(fixed, base, depth),
                        inherited=witnessed_classes(inherited, branch, depth),
                        branch_exploration=mine, base_exploration=theirs,
                        traded=witnessed_classes(traded, base, depth),
                        lost=witnessed_classes(lost, branch, depth))
