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

from contract.core.scenario import DrafterKind


@dataclass(frozen=True)
class Mutant:
    name: str
    base: str  # built-in policy the mutant changes
    # policy, wrapper, dispatcher, resolve, compile, capture-window, manager, speculator, profiling, ranks, stages,
    # lora, attention
    area: str
    description: str
    kills: frozenset[str] = frozenset()  # what the verifier may report first: properties, or "halt"
    equivalent: str = ""  # why no observable behaviour changes, for equivalent mutants
    build: Callable = field(default=None, compare=False, repr=False)  # (base policy, mutant) -> policy
    # The scenarios the changed rule acts in (None: any): outside them the mutant runs its base's steps,
    # so an exhaustive check of the mutant need explore no other (make evidence explores the others in
    # lockstep with the base: tests/test_explore.py).
    reaches: Callable | None = field(default=None, compare=False, repr=False)

    def policy_of(self, base):
        """The mutant of ``base`` (the built-in policy named ``self.base``)."""
        return self.build(base, self)


def on_ranks(scenario) -> bool:
    return scenario.data_parallel_size > 1


def on_stages(scenario) -> bool:
    return scenario.pipeline_parallel_size > 1


def breakable(scenario) -> bool:
    return scenario.breakable


def speculative(scenario) -> bool:
    """q > 1: a drafter proposes tokens (resolve's spec-decode step reads q)."""
    return scenario.uniform_decode_query_len > 1


def draft_model(scenario) -> bool:
    """A drafter with a model: the only one with managers, dispatchers and attention layers of its own."""
    return scenario.drafter is DrafterKind.WITH_MODEL


def draft_only_backend(scenario) -> bool:
    return scenario.attention_support_draft_only


def adaptive_draft(scenario) -> bool:
    return scenario.adaptive_verification and draft_model(scenario)


def lora(scenario) -> bool:
    return scenario.max_loras > 0


def hybrid(scenario) -> bool:
    """A model with Mamba layers: resolve's Mamba check reads its cache blocks."""
    return scenario.mamba_cache_blocks is not None


def micro_batched(scenario) -> bool:
    """Micro-batching on several DP ranks: the ranks' agreement is what splits a step."""
    return scenario.ubatching and scenario.data_parallel_size > 1


def lora_beside_drafter(scenario) -> bool:
    """LoRA beside a drafter with a model: the drafter's capture runs inside the target's LoRA cases."""
    return lora(scenario) and draft_model(scenario)


def drafting_on_ranks(scenario) -> bool:
    """A drafter with a model on several DP ranks: each rank's drafting makes DP syncs of its own."""
    return draft_model(scenario) and scenario.data_parallel_size > 1


def full_graphs(scenario) -> bool:
    """A FULL dispatch needs a configured mode with full graphs: resolve never turns PIECEWISE or
    NONE into one, and the draft managers' modes follow the target's."""
    return scenario.cudagraph_mode.has_full_cudagraphs()


def replacing(**changes) -> Callable:
    """A builder that replaces some of the base policy's fields."""
    def build(base, m: Mutant):
        return base.mutate(m.name, m.description, **changes)
    return build
