"""The EAGLE proposer's drafting on several data-parallel ranks (``v1/spec_decode/llm_base_proposer.py``,
the same from 0.28.0 to 0.33.0), as the batches each of its ``_determine_batch_execution_and_padding``
calls brings to the ranks' DP sync.

Every such call is one ``coordinate_batch_across_dp`` all-reduce (``allow_microbatching=False``,
``33:v1/spec_decode/llm_base_proposer.py:1773-1815``), so the ranks agree the drafter's mode and padded
count exactly as they do the target's, and every rank must make the same number of them in a step:

- a busy rank's ``propose`` syncs its first pass at the step's ``num_tokens`` and, when it drafts more
  than one token, its remaining passes at the batch's request count (``:570``, ``:668``);
- an idle rank's ``_dummy_run`` (``execute_dummy_batch``) calls the drafter's ``dummy_run`` with its
  ``uniform_decode_query_len`` tokens (``33:v1/worker/gpu_model_runner.py:5808-5836``), which forwards
  once while capturing and otherwise once per speculative token, syncing at its first two forwards
  (``:1620-1637``, vLLM #26086).
"""

from __future__ import annotations

from contract.core.modes import NONE, PIECEWISE, CUDAGraphMode


def propose_batches(num_reqs: int, num_tokens: int, num_speculative_tokens: int) -> tuple[int, ...]:
    """The token counts a busy rank's ``propose`` syncs: its first pass, then (more than one draft
    token, no parallel drafting) its remaining passes at one token per request."""
    return (num_tokens, num_reqs) if num_speculative_tokens > 1 else (num_tokens,)


def dummy_run_syncs(num_speculative_tokens: int, is_graph_capturing: bool) -> int:
    """How many DP syncs the drafter's ``dummy_run`` makes: one forward while capturing, else one per
    speculative token (parallel drafting, which forwards once, is not modelled), syncing at
    ``fwd_idx <= 1``."""
    forwards = 1 if is_graph_capturing else num_speculative_tokens
    return min(forwards, 2)


def dummy_run_use_cudagraphs(is_graph_capturing: bool, cudagraph_runtime_mode: CUDAGraphMode,
                             spec_enforce_eager: bool, num_active_loras: int = 0) -> bool:
    """``_dummy_run``'s ``use_cudagraphs`` for the drafter (``33:v1/worker/gpu_model_runner.py:5808-5831``):
    while capturing, only beside the target's PIECEWISE graphs; otherwise beside any graph the step
    runs, so an idle rank's dummy drafter agrees a graph with a busy rank's propose (vLLM #30119);
    never under ``speculative_config.enforce_eager``, nor in a run with dummy LoRA adapters under
    ``cudagraph_specialize_lora`` (vLLM's default): the drafter's key names no adapter, so a graph
    captured there would be replayed without them (vLLM #28334)."""
    if is_graph_capturing:
        use = cudagraph_runtime_mode == PIECEWISE
    else:
        use = cudagraph_runtime_mode != NONE
    return use and not spec_enforce_eager and not num_active_loras


def out_of_phase(counts: list[int]) -> str:
    """What the ranks meet when their DP syncs in a step differ in number: a rank with more enters a
    collective the others never join in that step (they go on to the next step's, or wait), a hang.
    The replay stops the step there with this text on every rank (``contract/runners/mrv1/real/dp_utils.py``)."""
    fewest = min(counts)
    ahead = ", ".join(str(r) for r, n in enumerate(counts) if n > fewest)
    behind = ", ".join(str(r) for r, n in enumerate(counts) if n == fewest)
    return (f"DP ranks out of phase (a hang): rank {ahead} enters DP sync {fewest + 1} of the step, "
            f"rank {behind} ends the step after {fewest}")
