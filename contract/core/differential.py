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
"""

from __future__ import annotations

from dataclasses import dataclass, field

from contract.core.classes import Occurrence, Signature, ViolationClass, of_records
from contract.core.explore import DEFAULT_DEPTH, Exploration, explore, witnessed_classes
from contract.core.engine import Run
from contract.core.policy import Policy, PolicyError
from contract.core.properties import check


class BaseMismatch(PolicyError):
    """A base that cannot be compared with the branch (another runner); one line."""


@dataclass
class Differential:
    branch: str
    base: str
    new: list[ViolationClass] = field(default_factory=list)
    fixed: list[ViolationClass] = field(default_factory=list)
    inherited: list[ViolationClass] = field(default_factory=list)
    branch_exploration: Exploration | None = None
    base_exploration: Exploration | None = None

    @property
    def nothing_new(self) -> bool:
        return not self.new

    def to_json(self) -> dict:
        return {"branch": self.branch, "base": self.base,
                **{k: [c.to_json() for c in getattr(self, k)] for k in ("new", "fixed", "inherited")}}


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
    return Differential(branch.name, base.name,
                        new=witnessed_classes(new, branch, depth),
                        fixed=witnessed_classes(fixed, base, depth),
                        inherited=witnessed_classes(inherited, branch, depth),
                        branch_exploration=mine, base_exploration=theirs)
