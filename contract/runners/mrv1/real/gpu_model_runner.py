"""The stand-in ``GPUModelRunner`` whose orchestration is the installed release's own code.

``v1/worker/gpu_model_runner.py`` cannot be instantiated without a GPU, a loaded model and a KV
cache, so the runner object is a stand-in class whose orchestration methods are the installed
``GPUModelRunner``'s own functions, taken from the class unchanged (``ORCHESTRATION``): ``profile_run``,
``_dummy_run``, ``profile_cudagraph_memory``, ``capture_model``, ``_capture_cudagraphs``,
``_warmup_and_capture``, ``_determine_batch_execution_and_padding``, ``_check_and_update_cudagraph_mode``
and the helpers they call that decide something. They run against gpu_model_runner's own module
globals (``set_forward_context``, ``graph_capture``, ``maybe_create_ubatch_slices``, ...).

What the stand-in supplies itself is infrastructure that decides nothing about CUDA graphs
(``INFRASTRUCTURE``): the KV-cache allocation for profiling, attention-metadata buffers, slot
mappings, the sampler's dummy run, device synchronisation. Each returns what the real one does
when there is no KV cache, no multimodal input and one rank: nothing to do. With ``--enable-lora``
the dummy adapters are vLLM's ``LoRAModelRunnerMixin``'s, over a stand-in adapter manager
(``contract/real/lora.py``).

vLLM's parallel state is given world-size-1 groups (``contract/real/parallel_state.py``) built from vLLM's
own ``GroupCoordinator`` class without ``torch.distributed``, so ``graph_capture()`` and
``get_pp_group()`` run their real code: on CUDA the capture runs on ``graph_capture``'s side stream,
warm-ups included, as in the real runner.
"""

from __future__ import annotations

import contextlib
import types

from contract.real.lora import LoRAManager

# The installed GPUModelRunner's functions the stand-in runs unchanged: those that decide
# something about CUDA graphs (each a decision point, ``decisions.py``), then the helpers they call.
DECISIONS = (
    "profile_run",
    "_dummy_run",
    "profile_cudagraph_memory",
    "capture_model",
    "_capture_cudagraphs",
    "_warmup_and_capture",
    "_determine_batch_execution_and_padding",
    "_check_and_update_cudagraph_mode",
    "_is_uniform_decode",
    "_allow_microbatching",
    "_pad_for_sequence_parallelism",
    "get_model",
    "get_draft_model",
)
ORCHESTRATION = DECISIONS + (
    "_model_forward",
    "_get_cumsum_and_arange",
    "_prepare_padding_mask",  # 0.33: the forward context's padding mask
    "maybe_randomize_inputs",
    "eplb_step",
)

# Stand-in infrastructure: name -> why it decides nothing here.
INFRASTRUCTURE = {
    "initialize_attn_backend": "builds the attention groups; passes the backends to the resolve",
    "_init_minimal_kv_cache_for_profiling": "allocates a minimal KV cache, then initialize_kv_cache "
                                            "resolves (the resolve is vLLM's, called here)",
    "_cleanup_profiling_kv_cache": "frees that KV cache",
    "_get_slot_mappings": "slot mappings: (None, None) without a KV cache",
    "synchronize_input_prep": "pinned-buffer event protocol",
    "_build_attention_metadata": "attention metadata: none without a KV cache",
    "_init_model_kwargs": "no extra model kwargs for a decoder-only text model",
    "_dummy_sampler_run": "the sampler after profiling's forward",
    "_sync_device": "a device synchronisation",
    "_register_layerwise_nvtx_hooks": "NVTX profiling hooks",
    "_create_encoder_cudagraph_manager": "no encoder CUDA graphs for a text model",
    "_maybe_init_encoder_cudagraph_manager": "no encoder CUDA graphs for a text model",
    "_freeze_gc": "collects and freezes the heap around bulk capture; the session freezes it once",
}


class Buffer:
    """``CpuGpuBuffer``: ``.gpu``, ``.np`` and ``copy_to_gpu``."""

    def __init__(self, gpu, np_array=None) -> None:
        self.gpu, self.np = gpu, np_array

    def copy_to_gpu(self, *args) -> None:
        pass


def runner_class(gpu_model_runner_module) -> type:
    """The stand-in class: the installed ``GPUModelRunner``'s orchestration plus the stand-in
    infrastructure. Resolved by attribute (``getattr``) so mixin methods (``LoRAModelRunnerMixin``)
    come along, and by ``__dict__`` where a staticmethod must stay one."""
    gmr = gpu_model_runner_module.GPUModelRunner
    namespace: dict = {}
    for name in ORCHESTRATION:
        for klass in gmr.__mro__:
            if name in klass.__dict__:
                namespace[name] = klass.__dict__[name]
                break
    namespace.update(STAND_INS)
    # GPUModelRunner's mixins (LoRAModelRunnerMixin, ...) are vLLM's code and need no GPU.
    mixins = tuple(klass for klass in gmr.__mro__[1:] if klass is not object and "Mixin" in klass.__name__)
    return type("GPUModelRunnerStandIn", mixins, namespace)


def _nothing(self, *args, **kwargs) -> None:
    return None


def _init_minimal_kv_cache_for_profiling(self) -> None:
    """``initialize_kv_cache(minimal, is_profiling=True)`` → ``initialize_attn_backend`` →
    ``_check_and_update_cudagraph_mode(..., is_profiling=True)``: the resolve is vLLM's."""
    self.initialize_attn_backend(is_profiling=True)


def initialize_attn_backend(self, is_profiling: bool = False) -> None:
    """What ``initialize_attn_backend`` passes to ``_check_and_update_cudagraph_mode``
    (``:7131-7135`` in 0.30.0): the backends per KV-cache group, here one group holding the
    target's backend and the draft model's (the proposer's layers join the target's KV-cache
    groups); ``kv_cache_spec`` is read only for Mamba layers."""
    self._check_and_update_cudagraph_mode(
        [set(self.attention_backends)], [types.SimpleNamespace(kv_cache_spec=None)], is_profiling=is_profiling
    )


# The stand-in infrastructure itself, one entry per INFRASTRUCTURE name.
STAND_INS = {
    "initialize_attn_backend": initialize_attn_backend,
    "_init_minimal_kv_cache_for_profiling": _init_minimal_kv_cache_for_profiling,
    "_cleanup_profiling_kv_cache": _nothing,
    "_get_slot_mappings": lambda self, **kwargs: (None, None),
    "synchronize_input_prep": lambda self: contextlib.nullcontext(),
    "_build_attention_metadata": lambda self, **kwargs: (None, None),
    "_init_model_kwargs": lambda self, *args, **kwargs: {},
    "_dummy_sampler_run": lambda self, hidden_states: None,
    "_sync_device": _nothing,
    "_register_layerwise_nvtx_hooks": _nothing,
    "_create_encoder_cudagraph_manager": lambda self: None,
    "_maybe_init_encoder_cudagraph_manager": _nothing,
    "_freeze_gc": staticmethod(contextlib.nullcontext),
}


def build(cls, vllm_config, *, device, dispatcher, attention_backends, max_num_tokens: int):
    """A stand-in runner with what ``GPUModelRunner.__init__`` sets that the orchestration reads
    (``gpu_model_runner.py:551-910`` in 0.30.0)."""
    import numpy as np
    import torch

    from vllm.v1.worker import workspace

    workspace._manager = None  # one runner per trace, as one per engine process
    workspace.init_workspace_manager(device)  # GPUModelRunner.__init__; capture_model locks it
    runner = cls()
    max_num_reqs = vllm_config.scheduler_config.max_num_seqs
    runner.__dict__.update(
        vllm_config=vllm_config,
        model_config=vllm_config.model_config,
        cache_config=vllm_config.cache_config,
        compilation_config=vllm_config.compilation_config,
        parallel_config=vllm_config.parallel_config,
        scheduler_config=vllm_config.scheduler_config,
        speculative_config=vllm_config.speculative_config,
        lora_config=vllm_config.lora_config,
        # Only what tqdm reads: no progress bar per captured size.
        load_config=types.SimpleNamespace(use_tqdm_on_load=False),
        device=device,
        max_num_reqs=max_num_reqs,
        max_num_tokens=max_num_tokens,
        max_model_len=vllm_config.model_config.max_model_len,
        uniform_decode_query_len=1 + vllm_config.num_speculative_tokens,
        cudagraph_dispatcher=dispatcher,
        dcp_world_size=1,
        supports_mm_inputs=False,
        enable_prompt_embeds=False,
        uses_mrope=False,
        uses_xdrope_dim=0,
        use_aux_hidden_state_outputs=False,
        is_pooling_model=False,
        intermediate_tensors=None,
        encoder_cudagraph_manager=None,
        encoder_cache={},
        eplb_state=None,
        eep_eplb_suppressed=False,
        reorder_batch_threshold=None,
        kv_cache_config=None,  # read by resolve only for Mamba layers
        arange_np=np.arange(max(max_num_reqs + 1, vllm_config.model_config.max_model_len, max_num_tokens)),
        positions=torch.zeros(max_num_tokens, dtype=torch.int64, device=device),
        is_padding=torch.zeros(max_num_tokens, dtype=torch.bool, device=device),  # 0.33
        query_pos=Buffer(None, np.zeros(max_num_tokens, dtype=np.int64)),
        # Read when a FULL dummy run builds attention metadata (_dummy_run, :6059-6093).
        optimistic_seq_lens_cpu=torch.zeros(max_num_reqs, dtype=torch.int32),
        seq_lens=torch.zeros(max_num_reqs, dtype=torch.int32, device=device),
        query_start_loc=Buffer(None, np.zeros(max_num_reqs + 1, dtype=np.int32)),
        input_batch=types.SimpleNamespace(
            num_computed_tokens_cpu=np.zeros(max_num_reqs, dtype=np.int32), lora_id_to_lora_request={},
            block_table=types.SimpleNamespace(commit_block_table=lambda num_reqs: None, block_tables=[]),
        ),
        attention_backends=attention_backends,
    )
    if vllm_config.lora_config is not None:  # load_lora_model's manager (lora_model_runner_mixin.py:43-66)
        runner.lora_manager = LoRAManager()
    return runner
