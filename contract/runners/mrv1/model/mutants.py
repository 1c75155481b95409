"""Model Runner V1's mutants: its policies' wrapping rules, the wrappers, the dispatcher, resolve,
compile timing and the capture window, each changed in one place (``contract/core/mutant.py``)."""

from __future__ import annotations

from dataclasses import replace

from contract.core import resolve
from contract.core.forward_context import BatchDescriptor
from contract.core.modes import FULL, NONE, PIECEWISE, CUDAGraphMode
from contract.core.mutant import (
    Mutant,
    breakable,
    draft_model,
    draft_only_backend,
    drafting_on_ranks,
    lora_beside_drafter,
    micro_batched,
    on_ranks,
    replacing,
    speculative,
)
from contract.runners.mrv1.model import cudagraph_dispatcher as dispatcher
from contract.runners.mrv1.model import llm_base_proposer as proposer
from contract.runners.mrv1.model.wrappers import (
    BreakableCUDAGraphWrapper,
    CUDAGraphWrapper,
    LoadContext,
    Stacks,
    UBatchWrapper,
    wrapper_acts,
)


def _wrap_0_30(ctx: LoadContext, *, breakable_mode=PIECEWISE, wrap_drafter=True, full_outside=True,
               elif_=False, recursive_unwrap=True, breakable_under_ubatching=False) -> Stacks:
    """vllm_0_30's load_model with one knob turned."""
    model, drafter = ctx.model, ctx.drafter_model
    mode = ctx.cudagraph_mode
    installed = False
    if ctx.breakable and mode != NONE and (breakable_under_ubatching or not ctx.use_ubatching):
        installed = True
        if full_outside:
            model = BreakableCUDAGraphWrapper(model, runtime_mode=breakable_mode, recursive_unwrap=recursive_unwrap)
        if wrap_drafter and drafter is not None:
            drafter = BreakableCUDAGraphWrapper(drafter, runtime_mode=breakable_mode, recursive_unwrap=recursive_unwrap)
    if mode.has_full_cudagraphs() and not ctx.use_ubatching and not (elif_ and installed):
        model = CUDAGraphWrapper(model, runtime_mode=FULL, recursive_unwrap=recursive_unwrap)
    elif ctx.use_ubatching:
        model = UBatchWrapper(model, FULL if mode.has_full_cudagraphs() else NONE)
    if installed and not full_outside:
        model = BreakableCUDAGraphWrapper(model, runtime_mode=breakable_mode, recursive_unwrap=recursive_unwrap)
    return Stacks(model, drafter)


def _load(**knobs):
    def build(base, m: Mutant):
        return base.mutate(m.name, m.description, load_model=lambda ctx: _wrap_0_30(ctx, **knobs))
    return build


def _breakable_acts_on_none(node, mode: CUDAGraphMode) -> bool:
    if isinstance(node, BreakableCUDAGraphWrapper):
        return node.runtime_mode is None or mode in (NONE, node.runtime_mode)
    return wrapper_acts(node, mode)


def _key_by_num_tokens(kind, mode, desc):
    return desc.num_tokens


def _never_stored(kind, mode, desc):
    return None  # no entry is kept: every call captures afresh


def _ubatch_key_first_two(num_tokens: int, num_ubatches: int) -> int:
    """The pre-#43161 key: the first two micro-batches' tokens (``maybe_create_ubatch_slices`` splits
    the padded count at multiples of ``num_tokens // num_ubatches``)."""
    return num_tokens if num_ubatches == 2 else 2 * (num_tokens // num_ubatches)


def _dummy_run_one_forward(num_speculative_tokens: int, is_graph_capturing: bool) -> int:
    """The pre-#26086 dummy run: one draft forward, so one DP sync, whatever it serves."""
    return 1


def _drafter_graphs_in_lora_runs(is_graph_capturing, cudagraph_runtime_mode, spec_enforce_eager,
                                 num_active_loras=0):
    """The dummy run before vLLM #28334's mitigation: the drafter takes its graph in every LoRA case."""
    return proposer.dummy_run_use_cudagraphs(is_graph_capturing, cudagraph_runtime_mode, spec_enforce_eager)


def _mislabel_piecewise_as_full(d, num_tokens, uniform_decode=False, valid_modes=None, invalid_modes=None,
                                num_active_loras=0):
    mode, desc = dispatcher.dispatch(d, num_tokens, uniform_decode, valid_modes, invalid_modes, num_active_loras)
    return (FULL, desc) if mode == PIECEWISE else (mode, desc)


def _size_limit_inclusive(d, num_tokens, uniform_decode=False, valid_modes=None, invalid_modes=None,
                          num_active_loras=0):
    if d.max_cudagraph_capture_size is not None and num_tokens >= d.max_cudagraph_capture_size:
        return NONE, BatchDescriptor(num_tokens)
    return dispatcher.dispatch(d, num_tokens, uniform_decode, valid_modes, invalid_modes, num_active_loras)


def _uniform_never_padded(d, num_tokens, uniform_decode=False, valid_modes=None, invalid_modes=None,
                          num_active_loras=0):
    return dispatcher.dispatch(d, num_tokens, False, valid_modes, invalid_modes, num_active_loras)


def _drafter_full_to_none(target_mode, spec_enforce_eager):
    if target_mode == FULL:
        return NONE
    return dispatcher.drafter_cudagraph_mode(target_mode, spec_enforce_eager)


def _drafter_keeps_target_mode(target_mode, spec_enforce_eager):
    return NONE if spec_enforce_eager else target_mode


def _drafter_ignores_enforce_eager(target_mode, spec_enforce_eager):
    return dispatcher.drafter_cudagraph_mode(target_mode, False)


def _no_upgrade(mode, config, support, q, v2, sizes, available=True):
    return resolve.resolve_cudagraph_mode_and_sizes(
        mode, replace(config, splitting_ops_contain_attention=False) if mode == FULL else config,
        support, q, v2, sizes, available)


def _upgrade_without_splitting(mode, config, support, q, v2, sizes, available=True):
    return resolve.resolve_cudagraph_mode_and_sizes(
        mode, replace(config, splitting_ops_contain_attention=True) if mode == FULL else config,
        support, q, v2, sizes, available)


def _spec_decode_check_skipped(mode, config, support, q, v2, sizes, available=True):
    resolved = resolve.resolve_cudagraph_mode_and_sizes(mode, config, support, 1, v2, sizes, available)
    if not v2 and resolved.cudagraph_mode.decode_mode() == FULL and q > 1:
        sizes = resolve.adjust_cudagraph_sizes_for_spec_decode(sizes, q)
    return replace(resolved, cudagraph_capture_sizes=sizes)


def _decode_keys_not_uniform(d, cudagraph_mode, capture_sizes, uniform_decode_query_len=1):
    """FULL decode keys registered without ``uniform=True``: each serves any batch of its size."""
    d = dispatcher.initialize_cudagraph_keys(d, cudagraph_mode, capture_sizes, uniform_decode_query_len)
    keys = frozenset((m, replace(k, uniform=False)) if m == FULL and k.uniform else (m, k) for m, k in d.keys)
    return replace(d, keys=keys)


MUTANTS: tuple[Mutant, ...] = (
    Mutant("breakable_match_any_nested", "vllm_0_30", "policy",
           "BreakableCUDAGraphWrapper installed with runtime_mode=None inside CUDAGraphWrapper(FULL): a FULL "
           "capture begins a second capture inside the first, and PIECEWISE replays the entry captured under FULL",
           kills=frozenset(['P1', 'P5']),
           build=_load(breakable_mode=None),
           reaches=breakable),
    Mutant("elif_restored", "vllm_0_30", "policy",
           "the pre-#56312 `elif`: with breakable on, no CUDAGraphWrapper(FULL) is installed, so FULL dispatches "
           "pass the PIECEWISE-scoped breakable wrapper and run eagerly",
           kills=frozenset(['P1', 'P3']),
           build=_load(elif_=True),
           reaches=breakable),
    Mutant("drafter_unwrapped", "vllm_0_30", "policy",
           "drafter.model is not wrapped: with breakable on (compilation off) drafter PIECEWISE runs eagerly",
           kills=frozenset(['P1']),
           build=_load(wrap_drafter=False),
           reaches=breakable),
    Mutant("full_inside_breakable", "vllm_0_30", "policy",
           "the FULL wrapper installed inside the breakable one instead of outside",
           equivalent="with runtime_mode=PIECEWISE the breakable wrapper passes FULL through and the FULL wrapper "
                      "passes PIECEWISE through, so either order gives the same capturer for every dispatch, and "
                      "unwrap() recurses through both",
           build=_load(full_outside=False),
           reaches=breakable),
    Mutant("breakable_under_ubatching", "vllm_0_30", "policy",
           "breakable wrappers also installed with micro-batching (inside the UBatchWrapper): PIECEWISE under "
           "breakable+micro-batching gains a capturer, so the verdict on that scenario changes",
           kills=frozenset(['P1', 'P6']),
           build=_load(breakable_under_ubatching=True),
           reaches=breakable),
    Mutant("non_recursive_unwrap", "vllm_0_30", "wrapper",
           "unwrap() returns its runnable without recursing (0.29.0's wrappers) while the wrappers nest",
           kills=frozenset(['P6']),
           build=_load(recursive_unwrap=False)),
    Mutant("breakable_acts_on_none", "vllm_0_30", "wrapper",
           "the breakable wrapper's gate forgets the NONE check and captures NONE dispatches",
           kills=frozenset(['P0', 'P2']),
           build=replacing(wrapper_acts=_breakable_acts_on_none),
           reaches=breakable),
    Mutant("entry_key_num_tokens", "vllm_0_29", "wrapper",
           "entries keyed by num_tokens instead of the batch descriptor: a match-any wrapper replays the FULL "
           "uniform-decode graph for a PIECEWISE batch of the same size",
           kills=frozenset(['P5']),
           build=replacing(entry_key=_key_by_num_tokens)),
    Mutant("entries_never_stored", "vllm_0_30", "wrapper",
           "a capture never stores its entry: every dispatch of a descriptor captures again",
           kills=frozenset(['P0', 'P4', 'P5']),
           build=replacing(entry_key=_never_stored)),
    Mutant("dispatch_mislabels_piecewise", "vllm_0_30", "dispatcher",
           "the dispatcher labels a PIECEWISE key FULL: the run reaches no FULL-capable layer",
           kills=frozenset(['P0', 'P1', 'halt']),
           build=replacing(dispatch=_mislabel_piecewise_as_full)),
    Mutant("dispatch_size_limit_inclusive", "vllm_0_30", "dispatcher",
           "`num_tokens >= max_cudagraph_capture_size` sends the largest capture size to NONE; capture_model's "
           "re-dispatch then disagrees with the descriptor it captures",
           kills=frozenset(['P0', 'P1', 'halt']),
           build=replacing(dispatch=_size_limit_inclusive)),
    Mutant("dispatch_ignores_uniform_decode", "vllm_0_30", "dispatcher",
           "uniform_decode dropped before padding: FULL uniform-decode keys are never dispatched",
           kills=frozenset(['P0', 'halt']),
           build=replacing(dispatch=_uniform_never_padded)),
    Mutant("decode_keys_not_uniform", "vllm_0_30", "dispatcher",
           "initialize_cudagraph_keys registers the FULL uniform-decode keys with uniform=False: under "
           "FULL_DECODE_ONLY or FULL_AND_PIECEWISE a mixed batch of a key's size replays the FULL graph, which an "
           "attention backend below ALWAYS cannot serve; a capture's uniform-decode dummy run then finds no FULL key "
           "and stops vLLM on _dummy_run's runtime-mode assertion",
           kills=frozenset(['P7', 'P0', 'halt']),
           build=replacing(initialize_cudagraph_keys=_decode_keys_not_uniform)),
    Mutant("drafter_full_maps_to_none", "vllm_0_30", "dispatcher",
           "the drafter maps a FULL target to NONE instead of PIECEWISE: the drafter never dispatches PIECEWISE "
           "under FULL (this removes the capture-outside-window hazard, so verdicts change)",
           kills=frozenset(['P1', 'P4']),
           build=replacing(drafter_cudagraph_mode=_drafter_full_to_none)),
    Mutant("drafter_keeps_target_mode", "vllm_0_30", "dispatcher",
           "the drafter dispatcher takes the target mode as is: a FULL target makes the drafter dispatch FULL, "
           "which its PIECEWISE-scoped wrapper passes through",
           kills=frozenset(['P1', 'P4', 'halt']),
           build=replacing(drafter_cudagraph_mode=_drafter_keeps_target_mode),
           reaches=draft_model),
    Mutant("drafter_ignores_enforce_eager", "vllm_0_30", "dispatcher",
           "the drafter's keys ignore speculative_config.enforce_eager while capture_model's dummy run honours it "
           "(the half of vLLM #26821 left out): a drafter the user asked to run eagerly dispatches PIECEWISE, "
           "captured when serving, where the capture guard stops vLLM",
           kills=frozenset(['P0', 'P4', 'P8']),
           build=replacing(drafter_cudagraph_mode=_drafter_ignores_enforce_eager)),
    Mutant("resolve_no_upgrade", "vllm_0_30", "resolve",
           "FULL with less than ALWAYS support always falls to FULL_DECODE_ONLY (no FULL_AND_PIECEWISE upgrade)",
           kills=frozenset(['P1']),
           build=replacing(resolve=_no_upgrade)),
    Mutant("resolve_upgrade_without_splitting", "vllm_0_30", "resolve",
           "FULL is upgraded to FULL_AND_PIECEWISE even when attention is not in splitting_ops",
           kills=frozenset(['P1']),
           build=replacing(resolve=_upgrade_without_splitting)),
    Mutant("resolve_ignores_spec_decode", "vllm_0_30", "resolve",
           "step 4 (spec-decode with q > 1 needs UNIFORM_BATCH support) skipped: FULL uniform-decode graphs of q "
           "tokens per request under UNIFORM_SINGLE_TOKEN_DECODE (P7)",
           kills=frozenset(['P1', 'P7']),
           build=replacing(resolve=_spec_decode_check_skipped),
           reaches=speculative),
    Mutant("resolve_ignores_draft_backend", "vllm_0_30", "resolve",
           "_check_and_update_cudagraph_mode takes the minimum support over the target's backends alone: a "
           "weaker speculative_config.attention_backend no longer lowers the mode, and the drafter dispatches "
           "PIECEWISE graphs nothing captures, or captures them when serving",
           kills=frozenset(['P1', 'P0', 'P4']),
           build=replacing(resolve_reads_draft_layers=False),
           reaches=draft_only_backend),
    Mutant("attention_without_eager_break", "vllm_0_30", "attention",
           "unified_attention_with_output loses @eager_break_during_capture: a breakable PIECEWISE capture "
           "records the attention op, with the capture's metadata, into its graph segment",
           kills=frozenset(['P7']),
           build=replacing(attention_eager_break=False),
           reaches=breakable),
    Mutant("compile_at_resolve", "vllm_0_30", "compile",
           "inner PIECEWISE wrappers decided at resolve time from the resolved mode instead of at the first "
           "forward from the load-time mode",
           kills=frozenset(['P1']),
           build=replacing(compile_at_first_forward=False)),
    Mutant("capture_window_never_closed", "vllm_0_30", "capture-window",
           "capture_model leaves set_cudagraph_capturing_enabled(True): a runtime capture succeeds silently "
           "instead of raising (the release's P0 at serving goes away)",
           kills=frozenset(['P0', 'P4', 'halt']),
           build=replacing(capture_model_closes_window=False)),
    Mutant("ubatch_replays_any_mode", "vllm_0_30", "ranks",
           "UBatchWrapper replays a micro-batched graph of the batch's token count whatever the runtime mode "
           "(vLLM #25625): a PIECEWISE mixed step of a captured count replays the FULL uniform-decode graph",
           kills=frozenset(['P2', 'P3', 'P5']),
           build=replacing(ubatch_replays_full_only=False),
           reaches=micro_batched),
    Mutant("ubatch_key_first_two", "vllm_0_30", "ranks",
           "UBatchWrapper stores a micro-batched graph under its first two micro-batches' token count (vLLM "
           "#43161): with three micro-batches the lookup by all of them misses, so each FULL micro-batched "
           "step captures again when serving, and the misplaced key sends capture_model's FULL graph of that "
           "count to eager",
           kills=frozenset(['P1', 'P4', 'P5']),
           build=replacing(ubatch_key=_ubatch_key_first_two),
           reaches=micro_batched),
    Mutant("drafter_dummy_run_one_forward", "vllm_0_30", "ranks",
           "the drafter's dummy run makes one forward, so one DP sync, outside capture too (vLLM #26086): "
           "beside a rank proposing more than one draft token, whose propose syncs twice, the ranks' "
           "all-reduces fall out of phase and hang",
           kills=frozenset(['P0', 'P9']),
           build=replacing(drafter_dummy_syncs=_dummy_run_one_forward),
           reaches=drafting_on_ranks),
    Mutant("drafter_graphs_in_lora_runs", "vllm_0_30", "lora",
           "the drafter's dummy run takes its graph in capture_model's runs with dummy LoRA adapters too "
           "(vLLM #28334, before its mitigation): the drafter's key names no adapter, so its PIECEWISE graph "
           "of a size is captured in the largest LoRA case's run and replayed in the others' and for every "
           "batch once the adapters are gone (an illegal memory access in vLLM's report)",
           kills=frozenset(['P5']),
           build=replacing(drafter_dummy_use_cudagraphs=_drafter_graphs_in_lora_runs),
           reaches=lora_beside_drafter),
    Mutant("dp_mode_not_synced", "vllm_0_30", "ranks",
           "coordinate_batch_across_dp agrees the padded token count alone (before vLLM's cudagraph_mode "
           "sync): each rank re-dispatches in its own mode, so a rank that runs eagerly beside one that "
           "replays a graph runs without it, and the graph's padding reaches the eager rank; micro-batching, "
           "a rank's FULL step of a count the UBatchWrapper holds a micro-batched graph of runs eagerly",
           kills=frozenset(['P0', 'P1', 'P9']),
           build=replacing(dp_syncs_mode=False),
           reaches=on_ranks),
)
