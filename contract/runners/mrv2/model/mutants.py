"""Model Runner V2's mutants: the managers, the speculators, resolve, memory profiling and compile
timing, each changed in one place (``contract/core/mutant.py``)."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

from contract.core import resolve
from contract.runners.mrv2.model.ubatch_utils import ubatch_twin
from contract.core.modes import FULL, FULL_DECODE_ONLY
from contract.core.scenario import Speculator
from contract.core.mutant import (
    Mutant,
    adaptive_draft,
    breakable,
    draft_model,
    draft_only_backend,
    full_graphs,
    hybrid,
    lora,
    micro_batched,
    on_ranks,
    on_stages,
    replacing,
    speculative,
)


def _available_regardless(breakable, has_compiled_submodule):
    return True


def _multi_module_breakable(scenario) -> bool:
    """Where multi-module MTP's breakable runner exists: ``key_fn`` is passed only with
    ``use_breakable_cg`` (``33:v1/worker/gpu/spec_decode/multi_module_mtp/speculator.py:99-115``),
    which needs the breakable switch (``policy.use_breakable_cg``)."""
    return breakable(scenario) and draft_model(scenario) and scenario.speculator is Speculator.MULTI_MODULE_MTP


def _breakable_regardless_of_piecewise(breakable, mode):
    return breakable


def _breakable_regardless_of_switch(breakable, mode):
    return mode.has_piecewise_cudagraphs()


def _draft_decode_target_mode(target_mode):
    return target_mode


def _draft_decode_always_full(target_mode):
    return FULL_DECODE_ONLY


def _spec_decode_downgrade_skipped(mode, config, support, q, v2, sizes, available=True):
    """Resolve without step 4 (decode FULL with q > 1 needs UNIFORM_BATCH): resolved as for q = 1."""
    resolved = resolve.resolve_cudagraph_mode_and_sizes(mode, config, support, 1, v2, sizes, available)
    return replace(resolved, cudagraph_capture_sizes=sizes)


def _mamba_blocks_unchecked(mode, mamba_cache_blocks, max_num_reqs, is_profiling):
    return False


MUTANTS: tuple[Mutant, ...] = (
    Mutant("mrv2_breakable_runner_full", "mrv2_0_34", "manager",
           "init_breakable_cg_runner builds the runner with runtime_mode=FULL: PIECEWISE dispatches pass it and "
           "run the uncompiled (breakable) model eagerly",
           kills=frozenset(['P1']),
           build=replacing(breakable_runner_mode=FULL),
           reaches=breakable),
    Mutant("mrv2_attention_without_eager_break", "mrv2_0_34", "attention",
           "unified_attention_with_output loses @eager_break_during_capture: the breakable runner's PIECEWISE "
           "capture records the attention op, with the capture's metadata, into its graph segment",
           kills=frozenset(['P7']),
           build=replacing(attention_eager_break=False),
           reaches=breakable),
    Mutant("mrv2_breakable_pads_requests", "mrv2_0_34", "manager",
           "_init_candidates pads the request count of a breakable runner's PIECEWISE descriptors as it pads "
           "FULL ones (vLLM #48822): eager break-point ops read a batch with zero-length trailing requests",
           kills=frozenset(['P7']),
           build=replacing(breakable_pads_requests=True),
           reaches=breakable),
    Mutant("mrv2_run_fullgraph_captures", "mrv2_0_33", "manager",
           "run_fullgraph captures a missing FULL graph lazily instead of asserting",
           equivalent="every descriptor dispatch can return is captured before _graphs_captured is set, and "
                      "specialize_spec_tokens maps an uncaptured draft decode descriptor to NONE, so run_fullgraph "
                      "never misses in the modelled space",
           build=replacing(run_fullgraph_captures=True),
           reaches=full_graphs),
    Mutant("mrv2_pw_available_ignores_compiled", "mrv2_0_33", "resolve",
           "piecewise_capture_available ignores has_compiled_submodule: an undecorated model keeps PIECEWISE "
           "through resolve and ModelCudaGraphManager.capture's backstop stops the engine",
           kills=frozenset(['P0', 'P1', 'halt']),
           build=replacing(piecewise_capture_available=_available_regardless)),
    Mutant("mrv2_use_breakable_cg_ignores_has_piecewise", "mrv2_0_34", "manager",
           "use_breakable_cg = is_breakable_cudagraph_enabled(cc), without has_piecewise_cudagraphs()",
           equivalent="a manager whose mode has no piecewise graphs has no PIECEWISE descriptor, so run_pw_graph is "
                      "never reached; the extra breakable runner is built and never called",
           build=replacing(use_breakable_cg=_breakable_regardless_of_piecewise),
           reaches=breakable),
    Mutant("mrv2_use_breakable_cg_ignores_switch", "mrv2_0_34", "manager",
           "use_breakable_cg = has_piecewise_cudagraphs() alone: with breakable off the match-any runner wraps the "
           "compiled model, so a PIECEWISE capture nests the compiled pieces' capture inside the runner's",
           kills=frozenset(['P1', 'P3']),
           build=replacing(use_breakable_cg=_breakable_regardless_of_switch)),
    Mutant("mrv2_draft_decode_takes_target_mode", "mrv2_0_34", "speculator",
           "the draft decode manager takes the target's mode instead of FULL_DECODE_ONLY/NONE: draft decodes "
           "dispatch PIECEWISE, which the decode manager has no breakable runner for",
           kills=frozenset(['P0', 'P1', 'halt']),
           build=replacing(draft_decode_mode=_draft_decode_target_mode),
           reaches=draft_model),
    Mutant("mrv2_draft_decode_always_full", "mrv2_0_34", "speculator",
           "the draft decode manager is FULL_DECODE_ONLY whatever the target's decode mode: a PIECEWISE or NONE "
           "configuration gets FULL draft graphs it does not name, of shapes a weaker backend cannot replay",
           kills=frozenset(['P7', 'P8']),
           build=replacing(draft_decode_mode=_draft_decode_always_full),
           reaches=draft_model),
    Mutant("mrv2_multi_module_key_fn_dropped", "mrv2_0_33", "speculator",
           "multi-module MTP's breakable runner built without key_fn: module step 1 replays the graph captured "
           "for step 0",
           kills=frozenset(['P5']),
           build=replacing(multi_module_key_fn=False),
           reaches=_multi_module_breakable),
    Mutant("mrv2_multi_module_remap_skipped", "mrv2_0_34", "speculator",
           "multi-module MTP keeps compiled PIECEWISE: the compiled pieces do not specialise the module index, "
           "so step 1 replays step 0's graph",
           kills=frozenset(['P1', 'P5']),
           build=replacing(multi_module_remap=False)),
    Mutant("mrv2_profiling_graphs_not_cleared", "mrv2_0_34", "profiling",
           "profile_cudagraph_memory skips clear_all_graphs(): capture_model replays the compiled pieces' "
           "graphs captured into the discarded profiling pool",
           kills=frozenset(['P5']),
           build=replacing(profiling_clears_graphs=False)),
    Mutant("mrv2_profiling_wrapper_pools_not_swapped", "mrv2_0_34", "profiling",
           "profile_cudagraph_memory leaves the wrappers' pools alone: the compiled pieces, bound to the global "
           "pool when compiled, capture their profiling graphs into it, and discarding them drops its use count "
           "to 0 (c10's create_or_incref_pool assert when capture_model reuses it)",
           kills=frozenset(['P10']),
           build=replacing(profiling_swaps_wrapper_pools=False)),
    Mutant("mrv2_profiling_returns_zero", "mrv2_0_34", "profiling",
           "profile_cudagraph_memory returns 0 without capturing (vLLM #49224, before #53306): the KV cache is "
           "sized with no memory for the graphs capture_model then captures; nothing captured at profiling "
           "also masks the base's silent eager fallback there (P1)",
           kills=frozenset(['P10', 'P1']),
           build=replacing(profiling_captures=False)),
    Mutant("mrv2_adaptive_verification_skipped", "mrv2_0_34", "resolve",
           "resolve_adaptive_cudagraph_mode not applied: FULL is not rewritten to FULL_AND_PIECEWISE, which hides "
           "lead L1 under adaptive verification, and a mode resolve lowered to PIECEWISE no longer trips its "
           "full-graphs assertion at the second initialize_kv_cache (the release's P0 at start-up)",
           kills=frozenset(['P0', 'P1', 'halt']),
           build=replacing(resolve_adaptive_cudagraph_mode=None)),
    Mutant("mrv2_resolve_skips_spec_decode_downgrade", "mrv2_0_34", "resolve",
           "resolve keeps decode FULL with q > 1 under UNIFORM_SINGLE_TOKEN_DECODE (step 4 skipped): the managers "
           "capture FULL uniform graphs of q tokens per request the backend cannot replay",
           kills=frozenset(['P7', 'P1']),
           build=replacing(resolve=_spec_decode_downgrade_skipped),
           reaches=speculative),
    Mutant("mrv2_mamba_blocks_unchecked", "mrv2_0_34", "resolve",
           "resolve no longer checks a hybrid model's Mamba cache blocks against max_num_seqs (before vLLM "
           "#34571): where the base refuses at resolve (the difference reported first), the mutant captures FULL "
           "graphs of more requests than the cache has blocks, whose Mamba decode kernel asserts (P7, crash at "
           "start-up, on the mutant's own verdict)",
           kills=frozenset(['halt']),
           build=replacing(mamba_blocks_rejected=_mamba_blocks_unchecked),
           reaches=hybrid),
    Mutant("mrv2_0_33_draft_prefill_varlen", "mrv2_0_33", "speculator",
           "0.33's draft prefill manager takes adaptive verification's varlen decode descriptors (as 0.34's does): "
           "the draft layers' UNIFORM_BATCH backend, which declares no varlen bound and which vLLM's check never "
           "reads, gets FULL graphs of decode batches of 1..q tokens per request",
           kills=frozenset(['P7']),
           build=replacing(draft_prefill_varlen=True),
           reaches=adaptive_draft),
    Mutant("mrv2_compile_at_resolve", "mrv2_0_33", "compile",
           "inner PIECEWISE wrappers decided from the resolved mode instead of the load-time mode at the first "
           "forward: hides lead L1",
           kills=frozenset(['P1']),
           build=replacing(compile_at_first_forward=False)),
    Mutant("mrv2_dp_sync_skipped", "mrv2_0_34", "ranks",
           "dispatch_cg_and_sync_dp returns each rank's own descriptor without the all-reduce: a decode rank "
           "replays its FULL graph while a rank with a mixed batch runs PIECEWISE or pads to another size",
           kills=frozenset(['P9']),
           build=replacing(dp_sync=False),
           reaches=on_ranks),
    Mutant("mrv2_dp_sync_max_mode", "mrv2_0_34", "ranks",
           "the agreement takes the strongest rank's mode instead of the weakest (max for min): a rank that "
           "needs eager (need_eager) re-dispatches at the agreed size and runs a graph, or no layer's graph where "
           "the agreed mode has none (P1)",
           kills=frozenset(['P9', 'P1']),
           build=replacing(dp_sync_takes_min=False),
           reaches=on_ranks),
    Mutant("mrv2_dp_need_eager_after_sync", "mrv2_0_33", "ranks",
           "a rank that needs eager votes its graph's mode and runs eagerly after the agreement, telling no "
           "other rank: the others replay a graph the eager rank does not run with them",
           kills=frozenset(['P9']),
           build=replacing(dp_votes_need_eager=False),
           reaches=on_ranks),
    Mutant("mrv2_dp_dummy_batch_one_token", "mrv2_0_34", "ranks",
           "an idle rank's dummy batch is one token (execute_dummy_batch's _dummy_run(1), before vLLM #35376): "
           "under speculative decoding the agreement finds no common uniform token count and every rank's "
           "decode batch loses its FULL decode graph",
           kills=frozenset(['P9']),
           build=replacing(dp_dummy_batch_aligned=False),
           reaches=on_ranks),
    Mutant("mrv2_ubatch_twin_any_batch", "mrv2_0_34", "ranks",
           "_maybe_ubatch_twin keeps the descriptor's own uniform_token_count (None for a mixed batch's graph) "
           "instead of its requests' query length: a micro-batched FULL graph then serves mixed batches "
           "(MRV1's vLLM #25625 hang)",
           kills=frozenset(['P7']),
           build=replacing(ubatch_twin=partial(ubatch_twin, keeps_query_len=False)),
           reaches=micro_batched),
    Mutant("mrv2_resolve_ignores_draft_layers", "mrv2_0_34", "attention",
           "init_attn_backend's get_attn_cg_support checks the target's layers alone: a weaker "
           "speculative_config.attention_backend no longer lowers the mode, and the draft model captures FULL "
           "graphs its backend cannot replay",
           kills=frozenset(['P7']),
           build=replacing(resolve_reads_draft_layers=False),
           reaches=draft_only_backend),
    Mutant("mrv2_lora_capture_key_without_has_lora", "mrv2_0_33", "lora",
           "capture_model captures without has_lora (vLLM #43160's bug): the compiled pieces' graphs are keyed "
           "BatchDescriptor(has_lora=False) while serving looks them up with has_lora=True, so every PIECEWISE "
           "LoRA batch captures anew while serving",
           kills=frozenset(['P4', 'P5']),
           build=replacing(capture_key_lora=False),
           reaches=lora),
    Mutant("mrv2_lora_dispatch_ignores_active", "mrv2_0_34", "lora",
           "execute_model dispatches with num_active_loras=0 whatever its requests ask for: a LoRA batch "
           "replays the graph captured without adapters",
           kills=frozenset(['P7']),
           build=replacing(dispatch_reads_loras=False),
           reaches=lora),
    Mutant("mrv2_lora_capture_selects_no_adapters", "mrv2_0_34", "lora",
           "capture_model captures each LoRA case without its LoRA capture hook (vLLM #35536's bug): no dummy "
           "adapter is selected, so the graph keyed for k adapters records no LoRA kernel and a LoRA batch "
           "replays it without its adapters",
           kills=frozenset(['P7']),
           build=replacing(capture_selects_loras=False),
           reaches=lora),
    Mutant("mrv2_decode_graph_by_shape", "mrv2_0_34", "dispatcher",
           "execute_model takes a batch for a uniform decode from its shape alone (q tokens per request), "
           "whatever its requests' phase (the test before vLLM #51865): a prefill chunk of q tokens per request "
           "replays the FULL decode graph, which a hybrid model's recurrent state is not written by",
           kills=frozenset(['P7']),
           build=replacing(decode_graph_by_shape=True),
           reaches=full_graphs),
    Mutant("mrv2_pp_first_stage_eager", "mrv2_0_34", "stages",
           "the first pipeline stage runs every step eagerly for a reason of its own (as if its multimodal "
           "inputs fed need_eager) without telling the later stages: they pad to a graph's size beyond the rows "
           "it sent, and their copy of its hidden states raises",
           kills=frozenset(['P9', 'P0']),
           build=replacing(pp_need_eager_stage=0),
           reaches=on_stages),
)
