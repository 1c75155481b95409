"""The weight check behind every reproduction: parameter counts estimated from the stored
``config.json`` files against the totals their model cards state, and the one-GPU verdicts."""

from __future__ import annotations

import pytest

from contract.evidence import reach, weights

# Totals stated by each model card (the name's size where the card gives no other figure).
CARDS = {
    "Qwen/Qwen3-0.6B": 0.6e9, "Qwen/Qwen3-8B": 8.2e9, "Qwen/Qwen3-30B-A3B": 30.5e9,
    "zai-org/GLM-4.5-Air": 106e9, "meta-llama/Llama-4-Scout-17B-16E-Instruct": 109e9,
}


@pytest.mark.parametrize("repo", sorted(CARDS))
def test_the_estimate_is_within_three_percent_of_the_model_card(repo):
    assert abs(weights.parameters(repo).total / CARDS[repo] - 1) <= 0.03


def test_every_stored_checkpoint_is_estimated():
    assert set(CARDS) | {reach.EAGLE_HEAD} == set(reach.checkpoints())
    assert 0.2e9 < weights.parameters(reach.EAGLE_HEAD).total < 1e9


def test_a_106b_model_does_not_fit_one_gpu_in_bf16_and_fits_with_layerwise_fp8_from_0_34():
    before = weights.fit([(reach.MOE_MTP, True)], "0.33.0")
    assert not before.fits and not before.fp8 and "does not fit" in before.text
    after = weights.fit([(reach.MOE_MTP, True)], "0.34.0")
    assert after.fits and after.fp8 and 100 < after.gigabytes < weights.BUDGET_BYTES / 1e9


def test_expert_parallelism_splits_only_the_routed_experts():
    one, two = (weights.fit([(reach.MOE, False)], "0.30.0", n).gigabytes for n in (1, 2))
    p = weights.parameters(reach.MOE)
    assert one - two == pytest.approx(p.experts * 2 / 2 / 1e9, abs=0.1)


def test_the_models_commands_name_fit_and_quantize_only_where_needed():
    fit = weights.fit([(reach.EAGLE_TARGET, False), (reach.EAGLE_HEAD, False)], "0.34.0")
    assert fit.fits and not fit.fp8
