"""The runner families, and the one way in to a runner for every command: built-in policies by
name, policy files, the policy modelling a release, and which family a release or trace is.

A trace is data that people share, so it never decides by itself that code runs: ``for_trace``
loads the trace's own policy only when it is a built-in name, a policy file only when the person
running the command named it or passed ``--trust-policy-files``.
"""

from __future__ import annotations

from pathlib import Path

from contract.core.family import Family
from contract.core.mutant import Mutant
from contract.core.policy import PolicyError, UntrustedPolicyFile
from contract.core.scenario import Runner
from contract.real.installed import EnvironmentProblem, release
from contract.runners.mrv1.family import FAMILY as MRV1
from contract.runners.mrv1.model import policy_file
from contract.runners.mrv1.model.mutants import MUTANTS as MRV1_MUTANTS
from contract.runners.mrv2.family import FAMILY as MRV2
from contract.runners.mrv2.model.mutants import MUTANTS as MRV2_MUTANTS

FAMILIES: tuple[Family, ...] = (MRV1, MRV2)
BUILT_IN: tuple[str, ...] = tuple(name for f in FAMILIES for name in f.policies)
# The releases the policies model and the affected-release matrix replays.
KNOWN_RELEASES = ("0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0")
MUTANTS: tuple[Mutant, ...] = MRV1_MUTANTS + MRV2_MUTANTS
BY_NAME = {m.name: m for m in MUTANTS}


def by_runner(runner: Runner) -> Family:
    return next(f for f in FAMILIES if f.runner is runner)


def by_name(name: str) -> Family:
    for f in FAMILIES:
        if f.name == name:
            return f
    raise PolicyError(f"unknown runner {name!r}; expected one of: {', '.join(f.name for f in FAMILIES)}")


def of_policy(name: str) -> Family:
    return next(f for f in FAMILIES if name in f.policies)


def for_release(version: str, runner: str = "auto") -> Family:
    """The family a conformance run or a release comparison uses. ``auto``: vLLM's own default for the
    release, Model Runner V2 from 0.33 (``VLLM_USE_V2_MODEL_RUNNER`` defaults on there), Model
    Runner V1 before; ``mrv1``/``mrv2``: that runner, when the release ships it."""
    found = release(version)
    if runner == "auto":
        return MRV2 if MRV2.ships(found) else MRV1
    try:
        family = by_name(runner)
    except PolicyError as exc:
        raise EnvironmentProblem(str(exc)) from None
    if not family.ships(found):
        others = [f for f in FAMILIES if f.ships(found)]
        raise EnvironmentProblem(
            (f"vLLM {version} has no {family.title} ({family.title} was removed in "
             f"{family.last_release[0]}.{family.last_release[1] + 1})"
             if family.last_release is not None and found > family.last_release else
             f"this project models and replays {family.title} from vLLM "
             f"{family.first_release[0]}.{family.first_release[1]}, not {version}")
            + (f"; replay it with --runner {others[0].name}" if others else ""))
    return family


def policy_for(version: str, runner: str = "auto") -> str:
    """The built-in policy that models ``version``'s runner (``for_release``)."""
    return for_release(version, runner).release_policy(release(version))


def names_file(spec: str) -> bool:
    """Whether ``load_policy(spec)`` would import a file: every spec but a built-in name ending in ``.py``."""
    return spec not in BUILT_IN and Path(spec).suffix == ".py"


def load_policy(spec: str):
    """A built-in name, or a path to a ``.py`` file defining ``load_model`` (Model Runner V1)."""
    if spec in BUILT_IN:
        return of_policy(spec).built_in(spec)
    if not names_file(spec):
        raise PolicyError(f"unknown policy {spec!r}: use one of {', '.join(BUILT_IN)} or a path to a .py file")
    return policy_file.load_file(spec)


def check_unique(named: list[tuple[str, str]]) -> None:
    """Results, traces and report pages are keyed by policy name, so one run takes one policy per
    name: ``named`` is (name, what it is) per policy, in the order given."""
    seen: dict[str, str] = {}
    for name, what in named:
        other = seen.setdefault(name, what)
        if other is what or other == what:
            continue
        if what.startswith("the built-in"):
            other, what = what, other
        raise PolicyError(f"{what} has the name of {other}; rename the file or pass only one of them"
                          if other.startswith("the built-in") else
                          f"{other} and {what} have the same name {name}; rename one or pass only one of them")


def named(spec: str) -> tuple[str, str]:
    """(the name ``load_policy(spec)`` gives, what it is), known before anything is loaded."""
    if spec in BUILT_IN:
        return spec, f"the built-in policy {spec}"
    return Path(spec).stem, f"policy file {spec}"


def described(policy) -> tuple[str, str]:
    """(name, what it is) of a loaded policy, for ``check_unique``."""
    if policy.source == "built-in":
        return policy.name, f"the built-in policy {policy.name}"
    if policy.name.startswith("branch@"):
        return policy.name, f"the rules of the tree {policy.source}"
    return policy.name, f"policy file {policy.source}"


def for_trace(trace_policy: str, source: str, *, named: str | None = None, trust_files: bool = False):
    """The policy a trace runs under; every command that reads traces asks here. ``named`` (the
    person's ``--policy``) always loads; the trace's own ``policy`` loads when it is a built-in
    name, and a policy file only with ``trust_files`` (``--trust-policy-files``)."""
    if named is not None:
        return load_policy(named)
    check_trusted(trace_policy, source, trust_files=trust_files)
    try:
        return load_policy(trace_policy)
    except PolicyError as exc:
        raise PolicyError(f"{source}: {exc}") from None


def check_trusted(trace_policy: str, source: str, *, trust_files: bool = False, hint: str = "") -> None:
    """Raise ``UntrustedPolicyFile`` for a trace naming a policy file, unless ``trust_files``; the
    check alone, for readers that never run the trace's policy but take the same traces."""
    if names_file(trace_policy) and not trust_files:
        raise UntrustedPolicyFile(f"{source} names the policy file {trace_policy}; "
                                  + (hint or f"pass --policy {trace_policy} to run it"))


def mutant_policy(m: Mutant):
    """The policy a mutant makes of its base."""
    return m.policy_of(load_policy(m.base))
