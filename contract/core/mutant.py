"""Mutants: small, named changes to a policy or to the vLLM behaviour around it. A verifier that
cannot tell a mutant from its base proves nothing, so each is run in lockstep with its base and
counts as killed when, on some sequence, the two differ in which properties a step violates or in
whether vLLM stops there.

``EQUIVALENT`` mutants change code but no behaviour the contract observes; each says why, and the
tests check that they are *not* reported (the verifier does not cry wolf). Each runner family lists
its own (``contract/runners/*/model/mutants.py``); ``contract.families.MUTANTS`` has them all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Mutant:
    name: str
    base: str  # built-in policy the mutant changes
    # policy, wrapper, dispatcher, resolve, compile, capture-window, manager, speculator, profiling, ranks, stages
    area: str
    description: str
    kills: frozenset[str] = frozenset()  # what the verifier may report first: properties, or "halt"
    equivalent: str = ""  # why no observable behaviour changes, for equivalent mutants
    build: Callable = field(default=None, compare=False, repr=False)  # (base policy, mutant) -> policy

    def policy_of(self, base):
        """The mutant of ``base`` (the built-in policy named ``self.base``)."""
        return self.build(base, self)


def replacing(**changes) -> Callable:
    """A builder that replaces some of the base policy's fields."""
    def build(base, m: Mutant):
        return base.mutate(m.name, m.description, **changes)
    return build
