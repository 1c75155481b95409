"""Hybrid models' Mamba cache: a FULL graph runs the Mamba decode kernel on one cache block per request,
so resolve refuses FULL graphs when ``max_num_seqs`` exceeds the blocks (an accepted rejection), and
P7 holds a FULL graph captured for more requests than the blocks to be a crash at start-up. The check
is read from a tree; an edited 0.34.0 tree without it is a new class on vLLM's own code."""

from __future__ import annotations

from pathlib import Path

import pytest

from contract.core.classes import DECODE_GRAPH_FOR_PREFILL, MAMBA_BLOCKS, Severity, of_trace
from contract.core.events import START_UP, ExecuteModel
from contract.core.halts import HaltKind, kind
from contract.core.modes import CUDAGraphMode
from contract.core.policy import BranchError
from contract.core.scenario import MAX_NUM_SEQS, DrafterKind, Runner, Scenario
from contract.core.trace import record_runnable
from contract.families import BY_NAME, load_policy, mutant_policy
from contract.real.errors import resolve_rejected
from contract.runners.mrv2 import branch

HYBRID = Scenario(runner=Runner.MRV2, mamba_cache_blocks=2)
SERVE = [*START_UP, ExecuteModel(4, True)]
MUTANT = BY_NAME["mrv2_mamba_blocks_unchecked"]
COMPILATION = "config/compilation.py"
CHECK = "            and max_num_reqs > kv_cache_config.num_blocks\n"


def _classes(scenario: Scenario, policy):
    return of_trace(record_runnable(scenario, policy, SERVE, name="hybrid"), policy)


@pytest.mark.parametrize("mode", [CUDAGraphMode.FULL_AND_PIECEWISE, CUDAGraphMode.FULL_DECODE_ONLY])
def test_the_release_refuses_full_graphs_over_the_mamba_blocks_and_the_mutant_captures_them(mode):
    scenario = Scenario(runner=Runner.MRV2, mamba_cache_blocks=2, cudagraph_mode=mode)
    trace = record_runnable(scenario, load_policy("mrv2_0_34"), SERVE, name="hybrid")
    halted = trace.expected_steps[-1]["halted"]
    assert trace.events[-1].kind == "resolve" and kind(halted) is HaltKind.REJECTED
    assert halted == f"resolve rejected: max_num_seqs ({MAX_NUM_SEQS}) exceeds available Mamba cache blocks (2)"
    p7 = [c for c in _classes(scenario, mutant_policy(MUTANT)) if c.signature.property == "P7"]
    assert [c.signature.what for c in p7] == [MAMBA_BLOCKS] and p7[0].severity is Severity.CRASH_START_UP
    assert "(4 requests, 2 blocks) captured" in p7[0].message


def test_enough_blocks_piecewise_graphs_and_graphs_within_the_blocks_are_legal():
    for scenario in (Scenario(runner=Runner.MRV2, mamba_cache_blocks=MAX_NUM_SEQS),
                     Scenario(runner=Runner.MRV2, mamba_cache_blocks=2, cudagraph_mode=CUDAGraphMode.PIECEWISE),
                     # q = 2 over capture sizes (2, 4): FULL decode graphs of at most 2 requests
                     Scenario(runner=Runner.MRV2, mamba_cache_blocks=2, drafter=DrafterKind.WITH_MODEL,
                              uniform_decode_query_len=2)):
        trace = record_runnable(scenario, mutant_policy(MUTANT), SERVE, name="hybrid")
        assert trace.events == SERVE and not trace.expected_violations, scenario


def test_a_prefill_of_a_decodes_shape_on_the_decode_graph_is_a_wrong_result_for_a_hybrid_model_only():
    """Two prompt chunks of one token each taken for a uniform decode of q = 1 replay the FULL decode
    graph: the mutant that decides by the shape (before vLLM #51865) breaks P7 on a hybrid model, the
    release does not, and a dense model's prefill is not judged. (With a drafter, the capture sizes
    (2, 4) leave no graph for a prefill of q = 2 tokens per request over ``max_num_seqs`` requests.)"""
    hybrid = Scenario(runner=Runner.MRV2, mamba_cache_blocks=MAX_NUM_SEQS)
    chunk = [*START_UP, ExecuteModel(2, False)]
    by_shape = mutant_policy(BY_NAME["mrv2_decode_graph_by_shape"])
    p7 = [c for c in of_trace(record_runnable(hybrid, by_shape, chunk, name="prefill"), by_shape)
          if c.signature.property == "P7"]
    assert [c.signature.what for c in p7] == [DECODE_GRAPH_FOR_PREFILL] and p7[0].severity is Severity.WRONG_RESULT
    assert "a batch of 2 tokens whose requests are not all decoding, graph of 1 token per request" in p7[0].message
    assert not record_runnable(hybrid, load_policy("mrv2_0_34"), chunk, name="prefill").expected_violations
    dense = Scenario(runner=Runner.MRV2)
    assert not record_runnable(dense, by_shape, chunk, name="prefill").expected_violations


def test_vllms_refusal_reads_as_the_models():
    text = (f"max_num_seqs ({MAX_NUM_SEQS}) exceeds available Mamba cache blocks (2). Each decode sequence "
            "requires one Mamba cache block, so CUDA graph capture cannot proceed. Please lower max_num_seqs to at "
            "most 2 or increase gpu_memory_utilization.")
    assert resolve_rejected(ValueError(text)) == (
        f"resolve rejected: max_num_seqs ({MAX_NUM_SEQS}) exceeds available Mamba cache blocks (2)")


def test_a_scenario_states_its_blocks_on_one_rank_of_model_runner_v2():
    with pytest.raises(ValueError, match=">= 1"):
        Scenario(runner=Runner.MRV2, mamba_cache_blocks=0)
    with pytest.raises(ValueError, match="outside the modelled MRV1 space"):
        Scenario(runner=Runner.MRV1, mamba_cache_blocks=2)
    with pytest.raises(ValueError, match="one DP rank"):
        Scenario(runner=Runner.MRV2, mamba_cache_blocks=2, data_parallel_size=2)
    assert Scenario.from_json(HYBRID.to_json()) == HYBRID
    assert "mamba_cache_blocks" not in Scenario(runner=Runner.MRV2).to_json()


def test_the_check_is_read_from_the_tree(tmp_path):
    from vllm_envs import edited_tree, installed

    release = branch.load(installed("0.34.0"), Path("0.34.0"))
    assert release.release == "0.34.0" and f"{COMPILATION}:" in release.where
    dropped = edited_tree(tmp_path / "dropped", "0.34.0", COMPILATION, CHECK, "")
    dropped = branch.load(dropped / "vllm", dropped)
    # the test without its last clause refuses a hybrid model's FULL graphs whatever its blocks
    rule = dropped.policy.mamba_blocks_rejected
    assert rule(CUDAGraphMode.FULL, MAX_NUM_SEQS, MAX_NUM_SEQS, False)
    assert not rule(CUDAGraphMode.FULL, MAX_NUM_SEQS, MAX_NUM_SEQS, True)
    assert not rule(CUDAGraphMode.PIECEWISE, 1, MAX_NUM_SEQS, False)
    assert not rule(CUDAGraphMode.FULL, None, MAX_NUM_SEQS, False)
    unknown = edited_tree(tmp_path / "unknown", "0.34.0", COMPILATION, CHECK,
                          "            and max_num_reqs > self.max_cudagraph_capture_size + blocks\n")
    with pytest.raises(BranchError, match="reads blocks"):
        branch.load(unknown / "vllm", unknown)


@pytest.mark.evidence
@pytest.mark.conformance
def test_an_edited_0_34_tree_without_the_mamba_check_is_a_new_p7_crash(tmp_path):
    """``bugs/mamba-full-decode-exceeds-cache-blocks``'s edit: the release stops at resolve, the tree
    captures FULL graphs of 4 requests over 2 blocks on vLLM's own code."""
    from vllm_envs import conform_tree, edited_tree, installed

    patch = Path(__file__).resolve().parents[1] / "bugs" / "mamba-full-decode-exceeds-cache-blocks" / "vllm-0.34.0.patch"
    removed = "".join(line[1:] + "\n" for line in patch.read_text().splitlines() if line.startswith("-") and
                      not line.startswith("---"))
    source = (installed("0.34.0") / COMPILATION).read_text()
    assert source.count(removed) == 1
    tree = edited_tree(tmp_path, "0.34.0", COMPILATION, removed, "")
    assert not branch.load(tree / "vllm", tree).policy.mamba_blocks_rejected(CUDAGraphMode.FULL, 2, MAX_NUM_SEQS, False)
    data = conform_tree(tree, record_runnable(HYBRID, mutant_policy(MUTANT), SERVE, name="hybrid"), tmp_path)
    new = [c for c in data["new"] if c["property"] == "P7"]
    assert new and all(c["what"] == MAMBA_BLOCKS for c in new), data["new"]
