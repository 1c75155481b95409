"""Mutants: small, named changes to a policy or to the vLLM behaviour around it. A verifier that
cannot tell a mutant from its base proves nothing, so each is run in lockstep with its base and
counts as killed when, on some sequence, the two differ in which properties a step violates or in
whether vLLM stops there.

``EQUIVALENT`` mutants change code but no behaviour the contract observes; each says why, and the
tests check that they are *not* reported (the verifier does not cry wolf).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from contract import dispatcher, resolve
from contract.modes import FULL, NONE, PIECEWISE, CUDAGraphMode
from contract.policy import LoadContext, Policy, load_policy, wrapper_acts
from contract.stack import BreakableCUDAGraphWrapper, CUDAGraphWrapper, Stacks, UBatchWrapper


@dataclass(frozen=True)
class Mutant:
    name: str
    base: str  # built-in policy the mutant changes
    area: str  # policy, wrapper, dispatcher, resolve, compile, capture-window
    description: str
    kills: frozenset[str] = frozenset()  # what the verifier may report first: properties, or "halt"
    equivalent: str = ""  # why no observable behaviour changes, for equivalent mutants

    def policy(self) -> Policy:
        return _BUILDERS[self.name](load_policy(self.base), self)


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
    def build(base: Policy, m: Mutant) -> Policy:
        return base.mutate(m.name, m.description, load_model=lambda ctx: _wrap_0_30(ctx, **knobs))
    return build


def _replace(**changes):
    def build(base: Policy, m: Mutant) -> Policy:
        return base.mutate(m.name, m.description, **changes)
    return build


def _breakable_acts_on_none(node, mode: CUDAGraphMode) -> bool:
    if isinstance(node, BreakableCUDAGraphWrapper):
        return node.runtime_mode is None or mode in (NONE, node.runtime_mode)
    return wrapper_acts(node, mode)


def _key_by_num_tokens(kind, mode, desc):
    return desc.num_tokens


def _never_stored(kind, mode, desc):
    return None  # no entry is kept: every call captures afresh


def _mislabel_piecewise_as_full(d, num_tokens, uniform_decode=False, valid_modes=None, invalid_modes=None):
    mode, desc = dispatcher.dispatch(d, num_tokens, uniform_decode, valid_modes, invalid_modes)
    return (FULL, desc) if mode == PIECEWISE else (mode, desc)


def _size_limit_inclusive(d, num_tokens, uniform_decode=False, valid_modes=None, invalid_modes=None):
    if d.max_cudagraph_capture_size is not None and num_tokens >= d.max_cudagraph_capture_size:
        return NONE, dispatcher.BatchDescriptor(num_tokens)
    return dispatcher.dispatch(d, num_tokens, uniform_decode, valid_modes, invalid_modes)


def _uniform_never_padded(d, num_tokens, uniform_decode=False, valid_modes=None, invalid_modes=None):
    return dispatcher.dispatch(d, num_tokens, False, valid_modes, invalid_modes)


def _drafter_full_to_none(target_mode, spec_enforce_eager):
    if target_mode == FULL:
        return NONE
    return dispatcher.drafter_cudagraph_mode(target_mode, spec_enforce_eager)


def _drafter_keeps_target_mode(target_mode, spec_enforce_eager):
    return NONE if spec_enforce_eager else target_mode


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


def _available_regardless(breakable, has_compiled_submodule):
    return True


def _breakable_regardless_of_piecewise(breakable, mode):
    return breakable


def _breakable_regardless_of_switch(breakable, mode):
    return mode.has_piecewise_cudagraphs()


def _draft_decode_target_mode(target_mode):
    return target_mode


MUTANTS: tuple[Mutant, ...] = (
    Mutant("breakable_match_any_nested", "vllm_0_30", "policy",
           "BreakableCUDAGraphWrapper installed with runtime_mode=None inside CUDAGraphWrapper(FULL): a FULL "
           "capture begins a second capture inside the first, and PIECEWISE replays the entry captured under FULL",
           kills=frozenset(['P1', 'P5'])),
    Mutant("elif_restored", "vllm_0_30", "policy",
           "the pre-#56312 `elif`: with breakable on, no CUDAGraphWrapper(FULL) is installed, so FULL dispatches "
           "pass the PIECEWISE-scoped breakable wrapper and run eagerly",
           kills=frozenset(['P1', 'P3'])),
    Mutant("drafter_unwrapped", "vllm_0_30", "policy",
           "drafter.model is not wrapped: with breakable on (compilation off) drafter PIECEWISE runs eagerly",
           kills=frozenset(['P1'])),
    Mutant("full_inside_breakable", "vllm_0_30", "policy",
           "the FULL wrapper installed inside the breakable one instead of outside",
           equivalent="with runtime_mode=PIECEWISE the breakable wrapper passes FULL through and the FULL wrapper "
                      "passes PIECEWISE through, so either order gives the same capturer for every dispatch, and "
                      "unwrap() recurses through both"),
    Mutant("breakable_under_ubatching", "vllm_0_30", "policy",
           "breakable wrappers also installed with micro-batching (inside the UBatchWrapper): PIECEWISE under "
           "breakable+micro-batching gains a capturer, so the verdict on that scenario changes",
           kills=frozenset(['P1', 'P6'])),
    Mutant("non_recursive_unwrap", "vllm_0_30", "wrapper",
           "unwrap() returns its runnable without recursing (0.29.0's wrappers) while the wrappers nest",
           kills=frozenset(['P6'])),
    Mutant("breakable_acts_on_none", "vllm_0_30", "wrapper",
           "the breakable wrapper's gate forgets the NONE check and captures NONE dispatches",
           kills=frozenset(['P2'])),
    Mutant("entry_key_num_tokens", "vllm_0_29", "wrapper",
           "entries keyed by num_tokens instead of the batch descriptor: a match-any wrapper replays the FULL "
           "uniform-decode graph for a PIECEWISE batch of the same size",
           kills=frozenset(['P5'])),
    Mutant("entries_never_stored", "vllm_0_30", "wrapper",
           "a capture never stores its entry: every dispatch of a descriptor captures again",
           kills=frozenset(['P4', 'P5'])),
    Mutant("dispatch_mislabels_piecewise", "vllm_0_30", "dispatcher",
           "the dispatcher labels a PIECEWISE key FULL: the run reaches no FULL-capable layer",
           kills=frozenset(['P1', 'halt'])),
    Mutant("dispatch_size_limit_inclusive", "vllm_0_30", "dispatcher",
           "`num_tokens >= max_cudagraph_capture_size` sends the largest capture size to NONE; capture_model's "
           "re-dispatch then disagrees with the descriptor it captures",
           kills=frozenset(['P1', 'halt'])),
    Mutant("dispatch_ignores_uniform_decode", "vllm_0_30", "dispatcher",
           "uniform_decode dropped before padding: FULL uniform-decode keys are never dispatched",
           kills=frozenset(['halt'])),
    Mutant("drafter_full_maps_to_none", "vllm_0_30", "dispatcher",
           "the drafter maps a FULL target to NONE instead of PIECEWISE: the drafter never dispatches PIECEWISE "
           "under FULL (this removes the capture-outside-window hazard, so verdicts change)",
           kills=frozenset(['P1', 'P4'])),
    Mutant("drafter_keeps_target_mode", "vllm_0_30", "dispatcher",
           "the drafter dispatcher takes the target mode as is: a FULL target makes the drafter dispatch FULL, "
           "which its PIECEWISE-scoped wrapper passes through",
           kills=frozenset(['P1', 'P4'])),
    Mutant("resolve_no_upgrade", "vllm_0_30", "resolve",
           "FULL with less than ALWAYS support always falls to FULL_DECODE_ONLY (no FULL_AND_PIECEWISE upgrade)",
           kills=frozenset(['P1'])),
    Mutant("resolve_upgrade_without_splitting", "vllm_0_30", "resolve",
           "FULL is upgraded to FULL_AND_PIECEWISE even when attention is not in splitting_ops",
           kills=frozenset(['P1'])),
    Mutant("resolve_ignores_spec_decode", "vllm_0_30", "resolve",
           "step 4 (spec-decode with q > 1 needs UNIFORM_BATCH support) skipped",
           kills=frozenset(['P1'])),
    Mutant("compile_at_resolve", "vllm_0_30", "compile",
           "inner PIECEWISE wrappers decided at resolve time from the resolved mode instead of at the first "
           "forward from the load-time mode",
           kills=frozenset(['P1'])),
    Mutant("capture_window_never_closed", "vllm_0_30", "capture-window",
           "capture_model leaves set_cudagraph_capturing_enabled(True): a runtime capture succeeds silently "
           "instead of raising",
           kills=frozenset(['P4', 'halt'])),
    # Model Runner V2
    Mutant("mrv2_breakable_runner_full", "mrv2_0_34", "manager",
           "init_breakable_cg_runner builds the runner with runtime_mode=FULL: PIECEWISE dispatches pass it and "
           "run the uncompiled (breakable) model eagerly",
           kills=frozenset(['P1'])),
    Mutant("mrv2_run_fullgraph_captures", "mrv2_0_33", "manager",
           "run_fullgraph captures a missing FULL graph lazily instead of asserting",
           equivalent="every descriptor dispatch can return is captured before _graphs_captured is set, and "
                      "specialize_spec_tokens maps an uncaptured draft decode descriptor to NONE, so run_fullgraph "
                      "never misses in the modelled space"),
    Mutant("mrv2_pw_available_ignores_compiled", "mrv2_0_33", "resolve",
           "piecewise_capture_available ignores has_compiled_submodule: an undecorated model keeps PIECEWISE "
           "through resolve and ModelCudaGraphManager.capture's backstop stops the engine",
           kills=frozenset(['P1', 'halt'])),
    Mutant("mrv2_use_breakable_cg_ignores_has_piecewise", "mrv2_0_34", "manager",
           "use_breakable_cg = is_breakable_cudagraph_enabled(cc), without has_piecewise_cudagraphs()",
           equivalent="a manager whose mode has no piecewise graphs has no PIECEWISE descriptor, so run_pw_graph is "
                      "never reached; the extra breakable runner is built and never called"),
    Mutant("mrv2_use_breakable_cg_ignores_switch", "mrv2_0_34", "manager",
           "use_breakable_cg = has_piecewise_cudagraphs() alone: with breakable off the match-any runner wraps the "
           "compiled model, so a PIECEWISE capture nests the compiled pieces' capture inside the runner's",
           kills=frozenset(['P1', 'P3'])),
    Mutant("mrv2_draft_decode_takes_target_mode", "mrv2_0_34", "speculator",
           "the draft decode manager takes the target's mode instead of FULL_DECODE_ONLY/NONE: draft decodes "
           "dispatch PIECEWISE, which the decode manager has no breakable runner for",
           kills=frozenset(['P1', 'halt'])),
    Mutant("mrv2_multi_module_key_fn_dropped", "mrv2_0_33", "speculator",
           "multi-module MTP's breakable runner built without key_fn: module step 1 replays the graph captured "
           "for step 0",
           kills=frozenset(['P5'])),
    Mutant("mrv2_multi_module_remap_skipped", "mrv2_0_34", "speculator",
           "multi-module MTP keeps compiled PIECEWISE: the compiled pieces do not specialise the module index, "
           "so step 1 replays step 0's graph",
           kills=frozenset(['P1', 'P5'])),
    Mutant("mrv2_profiling_graphs_not_cleared", "mrv2_0_34", "profiling",
           "profile_cudagraph_memory skips clear_all_graphs(): capture_model replays the compiled pieces' "
           "graphs captured into the discarded profiling pool",
           kills=frozenset(['P5'])),
    Mutant("mrv2_adaptive_verification_skipped", "mrv2_0_34", "resolve",
           "resolve_adaptive_cudagraph_mode not applied: FULL is not rewritten to FULL_AND_PIECEWISE, which hides "
           "lead L1 under adaptive verification, and a mode resolve lowered to PIECEWISE no longer trips its "
           "full-graphs assertion at the second initialize_kv_cache",
           kills=frozenset(['P1', 'halt'])),
    Mutant("mrv2_compile_at_resolve", "mrv2_0_33", "compile",
           "inner PIECEWISE wrappers decided from the resolved mode instead of the load-time mode at the first "
           "forward: hides lead L1",
           kills=frozenset(['P1'])),
)

_BUILDERS = {
    "breakable_match_any_nested": _load(breakable_mode=None),
    "elif_restored": _load(elif_=True),
    "drafter_unwrapped": _load(wrap_drafter=False),
    "full_inside_breakable": _load(full_outside=False),
    "breakable_under_ubatching": _load(breakable_under_ubatching=True),
    "non_recursive_unwrap": _load(recursive_unwrap=False),
    "breakable_acts_on_none": _replace(wrapper_acts=_breakable_acts_on_none),
    "entry_key_num_tokens": _replace(entry_key=_key_by_num_tokens),
    "entries_never_stored": _replace(entry_key=_never_stored),
    "dispatch_mislabels_piecewise": _replace(dispatch=_mislabel_piecewise_as_full),
    "dispatch_size_limit_inclusive": _replace(dispatch=_size_limit_inclusive),
    "dispatch_ignores_uniform_decode": _replace(dispatch=_uniform_never_padded),
    "drafter_full_maps_to_none": _replace(drafter_cudagraph_mode=_drafter_full_to_none),
    "drafter_keeps_target_mode": _replace(drafter_cudagraph_mode=_drafter_keeps_target_mode),
    "resolve_no_upgrade": _replace(resolve=_no_upgrade),
    "resolve_upgrade_without_splitting": _replace(resolve=_upgrade_without_splitting),
    "resolve_ignores_spec_decode": _replace(resolve=_spec_decode_check_skipped),
    "compile_at_resolve": _replace(compile_at_first_forward=False),
    "capture_window_never_closed": _replace(capture_model_closes_window=False),
    "mrv2_breakable_runner_full": _replace(breakable_runner_mode=FULL),
    "mrv2_run_fullgraph_captures": _replace(run_fullgraph_captures=True),
    "mrv2_pw_available_ignores_compiled": _replace(piecewise_capture_available=_available_regardless),
    "mrv2_use_breakable_cg_ignores_has_piecewise": _replace(use_breakable_cg=_breakable_regardless_of_piecewise),
    "mrv2_use_breakable_cg_ignores_switch": _replace(use_breakable_cg=_breakable_regardless_of_switch),
    "mrv2_draft_decode_takes_target_mode": _replace(draft_decode_mode=_draft_decode_target_mode),
    "mrv2_multi_module_key_fn_dropped": _replace(multi_module_key_fn=False),
    "mrv2_multi_module_remap_skipped": _replace(multi_module_remap=False),
    "mrv2_profiling_graphs_not_cleared": _replace(profiling_clears_graphs=False),
    "mrv2_adaptive_verification_skipped": _replace(resolve_adaptive_cudagraph_mode=None),
    "mrv2_compile_at_resolve": _replace(compile_at_first_forward=False),
}

BY_NAME = {m.name: m for m in MUTANTS}
assert set(BY_NAME) == set(_BUILDERS)
