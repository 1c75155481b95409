"""An MRV2 policy: one vLLM release's MRV2 rules, each a replaceable pure function so a mutant (or
a ``--vllm-src`` tree) changes exactly one of them.

MRV2 never wraps the model (``v1/worker/gpu/model_runner.py:403,408`` in 0.33.0), so an MRV2 policy
has no ``load_model``; what varies between releases and branches is how the managers are built.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from contract.core import resolve as _resolve
from contract.core import scenario as _scenario
from contract.core.modes import FULL, FULL_AND_PIECEWISE, FULL_DECODE_ONLY, NONE, CUDAGraphMode
from contract.core.engine import Engine
from contract.core.scenario import ConfigRevision, Runner
from contract.runners.mrv2.model import ubatch_utils
from contract.runners.mrv2.model.engine import ENGINE


def use_breakable_cg(breakable: bool, cudagraph_mode: CUDAGraphMode) -> bool:
    """``is_breakable_cudagraph_enabled(...) and cudagraph_mode.has_piecewise_cudagraphs()``
    (``33:v1/worker/gpu/cudagraph_utils.py:195-198``, ``34:…:228-231``)."""
    return breakable and cudagraph_mode.has_piecewise_cudagraphs()


def piecewise_capture_available(breakable: bool, has_compiled_submodule: bool) -> bool:
    """``VLLM_USE_BREAKABLE_CUDAGRAPH or has_compiled_submodule(self.model)``
    (``33:v1/worker/gpu/model_runner.py:748-750``, ``34:…:783-786``)."""
    return breakable or has_compiled_submodule


def resolve_adaptive_cudagraph_mode(mode: CUDAGraphMode, piecewise_capture_available: bool) -> CUDAGraphMode:
    """``33:…/spec_decode/adaptive_verification.py:36-43``, ``34:…:37-44``: FULL_DECODE_ONLY stays, no
    piecewise capture gives FULL_DECODE_ONLY, anything else (FULL included) FULL_AND_PIECEWISE."""
    if not mode.has_full_cudagraphs():  # an assert in vLLM; raised here under python -O too
        raise AssertionError()
    if mode == FULL_DECODE_ONLY or not piecewise_capture_available:
        return FULL_DECODE_ONLY
    return FULL_AND_PIECEWISE


def varlen_cudagraph_unsupported(scenario) -> str | None:
    """``maybe_create_adaptive_verification_manager``'s varlen check (``33:…/spec_decode/adaptive_verification.py:513-545``,
    ``34:…:607-650``): every checked group that is not ALWAYS must declare
    ``get_varlen_cudagraph_max_query_len() >= q`` (``get_varlen_cudagraph_unsupported_backend``,
    ``34:v1/worker/gpu/attn_utils.py:371-402``; NEVER never does). A draft model's own layers are not
    checked (``target_attn_layer_names``, ``34:…/model_runner.py:711-718``). The refusal's text, as
    ``contract/real/errors.py`` writes vLLM's ``ValueError``; None when the check passes."""
    from contract.core.modes import AttentionCGSupport
    from contract.core.properties import layers_support

    support = layers_support(scenario, "target")
    if support is AttentionCGSupport.ALWAYS or (scenario.varlen_decode_bound and support is not AttentionCGSupport.NEVER):
        return None
    return (f"query lengths vary up to {scenario.uniform_decode_query_len}, but a {support.name} backend "
            "allows none")


def draft_decode_mode(target_mode: CUDAGraphMode) -> CUDAGraphMode:
    """Draft decodes: FULL_DECODE_ONLY if the target's decode mode is FULL, else NONE; PIECEWISE
    is never used (``33:…/target_dependent_ar/speculator.py:98-107``, ``34:…/autoregressive/speculator.py:36-52``)."""
    return FULL_DECODE_ONLY if target_mode.decode_mode() == FULL else NONE


@dataclass(frozen=True)
class Mrv2Policy:
    name: str
    release: str  # "0.33" or "0.34"
    description: str = ""
    source: str = "built-in"
    runner: Runner = Runner.MRV2
    config_revision: ConfigRevision = ConfigRevision.V0_30
    # vLLM behaviour, replaced only by mutants and --vllm-src trees.
    post_init: Callable = _scenario.post_init
    resolve: Callable = _resolve.resolve_cudagraph_mode_and_sizes
    use_breakable_cg: Callable[[bool, CUDAGraphMode], bool] = use_breakable_cg
    piecewise_capture_available: Callable[[bool, bool], bool] = piecewise_capture_available
    resolve_adaptive_cudagraph_mode: Callable | None = resolve_adaptive_cudagraph_mode  # None: not applied
    # maybe_create_adaptive_verification_manager's check; None: every backend accepted
    adaptive_verification_check: Callable | None = varlen_cudagraph_unsupported
    # capture_model times adaptive verification's dummy runs over the FULL graphs it captured and
    # stops with RuntimeError when there are none (33:…/model_runner.py:1140-1146, 34:…:1195-1199)
    adaptive_verification_profiles: bool = True
    draft_decode_mode: Callable[[CUDAGraphMode], CUDAGraphMode] = draft_decode_mode
    # the draft prefill manager takes adaptive verification's varlen decode descriptors; None: as the
    # release does (0.34 yes, 34:…/target_dependent_ar/speculator.py:42-53; 0.33 no, 33:…:89-96)
    draft_prefill_varlen: bool | None = None
    breakable_runner_mode: CUDAGraphMode | None = None  # init_breakable_cg_runner passes no runtime_mode
    run_fullgraph_captures: bool = False  # run_fullgraph asserts the graph exists
    multi_module_key_fn: bool = True  # key_fn = spec_step_idx % num_layers
    multi_module_remap: bool = True  # compiled PIECEWISE remapped to FULL_DECODE_ONLY/NONE
    profiling_clears_graphs: bool = True  # clear_all_graphs() on both wrapper classes
    profiling_swaps_wrapper_pools: bool = True  # wrapper.graph_pool = throwaway_pool for every wrapper
    # profile_cudagraph_memory returns 0 before any capture when cache_config.enable_extensible_kv_cache
    # is on (0.34.0 only: 34:v1/worker/gpu/model_runner.py:1123-1125; 0.33.0 has no such setting)
    extensible_kv_cache_skips_profiling: bool = False
    profiling_captures: bool = True  # profile_cudagraph_memory runs capture_model(profile_only=True)
    compile_at_first_forward: bool = True  # inner PIECEWISE wrappers decided under the load-time mode
    # dispatch_cg_and_sync_dp over several DP ranks (contract/runners/mrv2/model/dp_utils.py)
    dp_sync: bool = True  # the ranks agree one descriptor
    dp_sync_takes_min: bool = True  # the weakest rank's mode
    dp_votes_need_eager: bool = True  # a rank that needs eager dispatches NONE before the agreement
    dp_dummy_batch_aligned: bool = True  # an idle rank's dummy batch is one request of q tokens
    pp_need_eager_stage: int | None = None  # a pipeline stage that runs eagerly on its own (mutants only)
    resolve_reads_draft_layers: bool = True  # get_attn_cg_support over the draft model's groups too
    # --enable-lora: the capture's forward context carries the LoRA fields serving's carries
    # (33:…/cudagraph_utils.py:757-761 with capture_model's has_lora, 33:…/model_runner.py:1125;
    # 34:…/cudagraph_utils.py:817-820); False: the capture's leaves out has_lora (0.33, vLLM #43160)
    # or num_active_loras (0.34)
    capture_key_lora: bool = True
    # capture_model's LoRA capture hook selects each LoRA case's dummy adapters before its capture
    # (create_lora_capture_hook, maybe_select_dummy_loras: 34:v1/worker/gpu/lora_utils.py:52-72,
    # 34:…/cudagraph_utils.py:739-741, vLLM #35536); False: no adapters selected (mutants only)
    capture_selects_loras: bool = True
    # gather_batch_req_state takes a batch of prefilling requests for a uniform decode when its shape is
    # one (q tokens per request), the test before vLLM #51865 (34:v1/worker/gpu/model_runner.py:1426-1438
    # reads the requests' phase; mutants only)
    decode_graph_by_shape: bool = False
    # execute_model dispatches with get_num_active_loras_for_dispatch's count (33:…/model_runner.py:1818-1823,
    # 34:…:1880-1885); False: with 0 (mutants only)
    dispatch_reads_loras: bool = True
    # @eager_break_during_capture on unified_attention_with_output (34:model_executor/layers/attention/attention.py:800)
    attention_eager_break: bool = True
    # A breakable runner's PIECEWISE descriptors carry num_reqs as FULL ones do (vLLM #48822; mutants only)
    breakable_pads_requests: bool = False
    # resolve's Mamba check: (resolved mode, mamba_cache_blocks, max_num_reqs, is_profiling) -> refused
    mamba_blocks_rejected: Callable[[CUDAGraphMode, int | None, int, bool], bool] = _resolve.mamba_blocks_rejected
    # _maybe_ubatch_twin (34:v1/worker/gpu/cudagraph_utils.py:262-287): (micro-batching, a FULL
    # descriptor) -> its micro-batch twin or None; a tree's own, read by verify --vllm-src (branch.py)
    ubatch_twin: Callable = ubatch_utils.ubatch_twin

    @property
    def engine(self) -> Engine:
        return ENGINE

    def mutate(self, name: str, description: str, **changes) -> Mrv2Policy:
        return dataclasses.replace(self, name=name, description=description, **changes)
