"""Model Runner V1's draft-model proposer (``--speculative-config '{"method": "draft_model", ...}'``).

The runner's checks name ``uses_draft_model()`` beside ``use_eagle()`` wherever they set up the
drafter's graphs (``33:v1/worker/gpu_model_runner.py:5796-5798,6803-6813``), so the model runs both
proposers alike; the replay builds ``DraftModelProposer`` for it, so an edit to the draft model's case
reaches the corpus (``bugs/draft-model-drafter-keys-uninitialized``, vLLM #47460, is found on
0.33.0: ``tests/test_bugs.py``).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from contract.core.scenario import DrafterKind, Runner, Scenario, Speculator
from contract.core.trace import record
from contract.families import load_policy
from contract.core.graphs import script
from contract.real import corpus as corpus_mod
from contract.runners.mrv1.real import conform

EAGLE = Scenario(runner=Runner.MRV1, drafter=DrafterKind.WITH_MODEL, uniform_decode_query_len=2)


def test_model_runner_v1_takes_the_eagle_and_draft_model_proposers_only():
    assert replace(EAGLE, speculator=Speculator.STANDALONE_AR).problem() is None
    for other in (Speculator.MULTI_MODULE_MTP, Speculator.DFLASH):
        with pytest.raises(ValueError, match="speculator eagle or standalone_ar"):
            replace(EAGLE, speculator=other)


def test_the_model_runs_both_proposers_alike():
    policy = load_policy("vllm_0_30")
    events = script(EAGLE)
    eagle = record(EAGLE, policy, events)
    draft_model = record(replace(EAGLE, speculator=Speculator.STANDALONE_AR), policy, events)
    assert [s for s in draft_model.expected_steps] == [s for s in eagle.expected_steps]
    assert any(d["role"] == "drafter" for s in eagle.expected_steps for d in s.get("dispatches", []))


def test_the_covering_corpus_keeps_the_draft_model_apart():
    """Its observations equal EAGLE's in the model, yet the replay runs another proposer class: the
    covering corpus keeps a trace per cell of each."""
    chosen = corpus_mod.select(conform.generated(load_policy("vllm_0_30")))
    speculators = {t.scenario.speculator for t in chosen if t.scenario.drafter is DrafterKind.WITH_MODEL}
    assert speculators == {Speculator.EAGLE, Speculator.STANDALONE_AR}
