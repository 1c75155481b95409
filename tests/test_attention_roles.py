"""Attention capability per role: a draft model on a weaker backend than the target's
(``speculative_config.attention_backend``), on both runners and with or without adaptive
verification. Resolve takes the minimum over every group, the draft model's included; P7 judges
each role's FULL graphs by its own layers' backend. The replay runs vLLM's own
``get_attn_cg_support`` (MRV2) and ``_check_and_update_cudagraph_mode``'s minimum (MRV1) over a
target and a draft group, and an edited 0.34.0 tree that leaves the draft groups out is a new P7."""

from __future__ import annotations

import pytest

from contract.core.events import START_UP, Propose
from contract.core.modes import FULL_AND_PIECEWISE, AttentionCGSupport
from contract.core.properties import layers_support, resolved_support
from contract.core.scenario import DrafterKind, Runner, Scenario, SplittingOps, all_scenarios
from contract.core.trace import record_runnable, run_events
from contract.families import BY_NAME, load_policy, mutant_policy

DRAFT_ON_WEAKER = dict(drafter=DrafterKind.WITH_MODEL, uniform_decode_query_len=2,
                       attention_support=AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE,
                       attention_support_draft_only=True)


@pytest.mark.parametrize("runner", list(Runner))
def test_a_weaker_draft_backend_needs_no_adaptive_verification(runner):
    scenario = Scenario(runner=runner, **DRAFT_ON_WEAKER)
    assert layers_support(scenario, "target") is AttentionCGSupport.ALWAYS
    assert layers_support(scenario, "drafter") is resolved_support(scenario) is AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE
    assert Scenario.from_json(scenario.to_json()) == scenario
    assert any(s.attention_support_draft_only for s in all_scenarios(runner))
    for bad in (dict(DRAFT_ON_WEAKER, attention_support=AttentionCGSupport.ALWAYS),
                dict(DRAFT_ON_WEAKER, drafter=DrafterKind.WITHOUT_MODEL)):
        with pytest.raises(ValueError, match="a weaker draft backend"):
            Scenario(runner=runner, **bad)


def test_the_release_resolves_over_the_draft_groups_and_keeps_the_target_whole():
    """vLLM 0.34.0 lowers the whole model to what the draft backend can replay: no P7 on either role."""
    scenario = Scenario(runner=Runner.MRV2, **DRAFT_ON_WEAKER)
    run, violations = run_events(scenario, load_policy("mrv2_0_34"), list(START_UP))
    assert not [v for v in violations if v.property == "P7"]
    resolved = next(r for r in run.records if r.event.kind == "resolve")
    assert resolved.cudagraph_mode is not FULL_AND_PIECEWISE


@pytest.mark.parametrize("name, splitting_ops, kills", [
    ("mrv2_resolve_ignores_draft_layers", SplittingOps.DEFAULT, "P7"),
    # MRV1's drafter holds no FULL graph: the mode it keeps dispatches PIECEWISE graphs nothing captures
    ("resolve_ignores_draft_backend", SplittingOps.EMPTY, "P1")])
def test_resolve_that_ignores_the_draft_backend_is_killed(name, splitting_ops, kills):
    mutant = BY_NAME[name]
    runner = Runner.MRV2 if name.startswith("mrv2") else Runner.MRV1
    scenario = Scenario(runner=runner, splitting_ops=splitting_ops, **DRAFT_ON_WEAKER)
    events = [*START_UP, Propose(2), Propose(3)]
    _, base = run_events(scenario, load_policy(mutant.base), events)
    _, mutated = run_events(scenario, mutant_policy(mutant), events)
    new = {v.property for v in mutated} - {v.property for v in base}
    assert kills in new, (base, mutated)


DRAFT_GROUPS_LEFT_OUT = (
    "    attn_cg_support_info = get_attn_cg_support(attn_groups, vllm_config)\n",
    "    target_layer_names = None\n"
    "    if draft_layer_names:\n"
    "        target_layer_names = {\n"
    "            name for group in kv_cache_config.kv_cache_groups for name in group.layer_names\n"
    "        } - draft_layer_names\n"
    "    attn_cg_support_info = get_attn_cg_support(\n"
    "        attn_groups, vllm_config, checked_layer_names=target_layer_names\n"
    "    )\n",
)


@pytest.mark.evidence
@pytest.mark.conformance
def test_an_edited_0_34_tree_that_leaves_the_draft_groups_out_of_resolve_is_a_new_p7(tmp_path):
    from vllm_envs import conform_tree, edited_tree

    tree = edited_tree(tmp_path, "0.34.0", "v1/worker/gpu/attn_utils.py", *DRAFT_GROUPS_LEFT_OUT)
    scenario = Scenario(runner=Runner.MRV2, **DRAFT_ON_WEAKER)
    data = conform_tree(tree, record_runnable(scenario, load_policy("mrv2_0_34"), list(START_UP),
                                              name="draft-on-weaker"), tmp_path)
    new = [c for c in data["new"] if c["property"] == "P7"]
    assert new and new[0]["role"] == "drafter", data["new"]


def test_the_docs_table_is_the_committed_release_facts_and_drift_fails():
    """``docs/properties.md``'s per-release backend × role table is ``release_facts.json`` rendered
    (``python -m contract.evidence.release_facts docs`` regenerates it)."""
    import dataclasses

    from contract.evidence.release_facts import DOCS, committed, docs_with_table

    facts = committed()
    text = DOCS.read_text()
    assert docs_with_table(text, facts) == text, "regenerate: python -m contract.evidence.release_facts docs"
    flash = facts["0.34.0"].attention_backends[0]
    assert flash.backend == "FLASH_ATTN" and f"`{flash.where}`" in text
    drifted = dataclasses.replace(facts["0.34.0"], attention_backends=(
        dataclasses.replace(flash, support=("NEVER",)), *facts["0.34.0"].attention_backends[1:]))
    assert docs_with_table(text, {**facts, "0.34.0": drifted}) != text


def test_the_replays_backends_give_their_level_in_every_release():
    """Each level the replay runs is a registry backend whose builder gives it fixed in every release
    (no condition on the GPU or config), read from the release's source; NEVER is Llama 4's chunked
    local attention over FlashInfer, whose builder overrides the getter to say NEVER."""
    import os
    from pathlib import Path

    from contract.evidence.release_facts import committed
    from contract.real.attention_backends import BY_LEVEL

    for release, facts in committed().items():
        by_name = {b.backend: b for b in facts.attention_backends}
        for level, name in BY_LEVEL.items():
            if level == "NEVER":
                assert name in by_name, (release, name)
                continue
            assert by_name[name].support == (level,) and not by_name[name].condition, (release, by_name[name])
    sources = Path(os.environ.get("CONTRACT_VLLM_SOURCES", "/nonexistent"))
    if not sources.is_dir():
        pytest.skip("CONTRACT_VLLM_SOURCES names no vLLM sources")
    for root in sorted(sources.iterdir()):
        text = (root / "vllm/model_executor/layers/attention/chunked_local_attention.py").read_text()
        builder = text[text.index("class ChunkedLocalAttentionBuilder"):text.index("def build(")]
        assert "def get_cudagraph_support(" in builder and "return AttentionCGSupport.NEVER" in builder, root


@pytest.mark.evidence
@pytest.mark.conformance
def test_an_edited_0_34_backend_outside_the_defaults_is_run_and_its_raised_level_is_a_new_p7(tmp_path):
    """TRITON_MLA is no default of the replay's; a tree that raises its builder's level to ALWAYS has
    the branch check run it for UNIFORM_BATCH on both sides, and a FULL graph then serves mixed batches
    that the release's level rules out."""
    from contract.core.graphs import script
    from contract.core.modes import CUDAGraphMode
    from vllm_envs import conform_tree, edited_tree

    declared = "_cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport."
    tree = edited_tree(tmp_path, "0.34.0", "v1/attention/backends/mla/triton_mla.py",
                       declared + "UNIFORM_BATCH", declared + "ALWAYS")
    scenario = Scenario(runner=Runner.MRV2, cudagraph_mode=CUDAGraphMode.FULL,
                        attention_support=AttentionCGSupport.UNIFORM_BATCH)
    data = conform_tree(tree, record_runnable(scenario, load_policy("mrv2_0_34"), script(scenario),
                                              name="uniform-batch-full"), tmp_path)
    assert any("TRITON_MLA (UNIFORM_BATCH)" in n for n in data["cache_notes"]), data["cache_notes"]
    assert [c for c in data["new"] if c["property"] == "P7" and c["role"] == "target"], data["new"]


def test_a_changed_backend_file_selects_the_traces_of_its_level():
    """A branch whose only replayed change is a backend's file (here the chunked local attention NEVER
    runs by default) replays the traces that build a group of that level, a draft-only group included,
    plus the fixed sample of the rest, and selects them without the base's decision paths; another
    changed file on no recorded path still replays every trace."""
    from types import SimpleNamespace

    from contract.branch.conform import SAMPLE_EVERY, _levels_decide, select
    from contract.core.trace import Trace
    from contract.real.attention_backends import DEFAULT_FILES

    def trace(name, **settings):
        return Trace(Scenario(runner=Runner.MRV2, **settings), "mrv2_0_34", [], name=name)

    never = AttentionCGSupport.NEVER
    traces = [trace(f"always-{i}") for i in range(2 * SAMPLE_EVERY)] + [
        trace("never", attention_support=never),
        trace("never-draft-only", attention_support=never, drafter=DrafterKind.WITH_MODEL, uniform_decode_query_len=2,
              attention_support_draft_only=True)]

    def review(path):
        changed = SimpleNamespace(path=path, module_level=True, functions=[])
        return SimpleNamespace(diff=SimpleNamespace(python=[changed], functions=lambda: []), replayed=[path])

    chunked = review(DEFAULT_FILES["NEVER"])
    assert _levels_decide(chunked, DEFAULT_FILES)
    picked = select(traces, {}, {}, chunked, None, DEFAULT_FILES)
    assert picked.by_impact == ("never", "never-draft-only") and len(picked.sampled) == 2
    other = review("v1/attention/backends/utils.py")
    assert not _levels_decide(other, DEFAULT_FILES)
    assert select(traces, {}, {}, other, None, DEFAULT_FILES).names == {t.name for t in traces}
