"""Beside ``v1/worker/gpu/model_runner.py``: its mode- and capturer-deciding code, run unchanged.

- ``init_attn_backend`` (``v1/worker/gpu/attn_utils.py``): from its metadata-builder phase to
  ``get_attn_cg_support`` over the groups (``33:…/attn_utils.py:286-310``, ``34:…:294-318``), the
  minimum support over every group, the draft model's included; the groups are ``attention.py``'s;
- ``initialize_kv_cache``: the narrowing by the model state's own groups (``33:…:699-700``,
  ``34:…:734-735``); the statements that name the target's attention layers and create the
  adaptive verification manager, whose check refuses backends that cannot replay varlen decode
  batches (``33:…:676-717``, ``34:…:711-752``; the groups are ``attention.py``'s stand-ins); the
  statement that builds the micro-batch runner (``33:…:733-740``, ``34:…:768-775``; ``ubatch_utils.py``); the
  statements from ``piecewise_capture_available = …`` to the
  ``ModelCudaGraphManager(...)`` construction (adaptive verification's rewrite, resolve, the new
  manager; ``33:…:748-774``, ``34:…:783-811``), and ``speculator.init_cudagraph_manager`` (``33:…:789-792``,
  ``34:…:826-829``);
- ``execute_model``: the statements that read the scheduled batch (request and token counts,
  ``gather_batch_req_state``, the prefill rule for ``max_query_len``; ``33:…:1800-1816``,
  ``34:…:1863-1878``), those that count its active LoRA adapters (``get_num_active_loras_for_dispatch``
  over the runner's ``LoraState``, ``33:…:1818-1823``, ``34:…:1880-1885``), the ``dispatch_cg_and_sync_dp`` statement (``33:…:1832-1848``, ``34:…:1894-1910``)
  and the "Run model" branch (``33:…:2051-2097``, ``34:…:2119-2164``); between them, the padded
  token count and padding mask of ``prepare_inputs`` (``33:…:1395-1401``, ``34:…:1465-1471``) and,
  on a non-first PP stage, the copy of the stage before's rows (``33:…:2020-2037``, ``34:…:2088-2105``);
- ``capture_model``: the whole method, called unbound on the stand-in runner, and so is
  ``profile_cudagraph_memory`` (``v1/worker/gpu/cudagraph_utils.py``), whose KV-cache bootstrap
  (``_init_minimal_kv_cache_for_profiling``) calls the runner's ``initialize_kv_cache`` with a
  stand-in config.

The scheduler's side of a step is the harness's (``scheduled_batch``): the trace event as a
``SchedulerOutput`` and the request states ``gather_batch_req_state`` reads (a uniform decode is
``n/q`` running requests of ``q`` tokens, any other batch ``min(n, max_num_seqs)`` prefilling
requests sharing ``n`` tokens); what the runner makes of it is vLLM's.

The stand-in runner holds what those read (``GPUModelRunner.__init__``/``load_model``), with
stand-ins for the KV-cache plumbing that decides nothing about graphs: a model state whose dummy
and attention inputs are empty, dummy block tables, a KV-cache config without groups, a no-op KV
connector, no expert load balancer. With ``--enable-lora`` its LoRA capture cases are vLLM's
``get_lora_capture_cases`` (``GPUModelRunner.__init__``, ``33:…:350-355``, ``34:…:361-366``), its
``LoraState`` vLLM's, and the dummy adapters of ``capture_model`` are set up and selected by vLLM's
``LoRAModelRunnerMixin`` (``maybe_setup_dummy_loras``, ``maybe_select_dummy_loras``, through
``create_lora_capture_hook``) on a stand-in adapter manager: the stand-in model has no LoRA layer
whose weights an adapter would load into.
"""

from __future__ import annotations

import contextlib
import importlib
import types
from dataclasses import dataclass

import torch

from contract.real.attention_op import DRAFT_LAYER, TARGET_LAYER
from contract.real.lora import LoRAManager
from contract.runners.mrv2.real.blocks import Block, cut

RUNNER = "GPUModelRunner"


@dataclass(frozen=True)
class Blocks:
    attn_cg_support: Block
    narrow: Block
    adaptive_verification: Block
    ubatch_runner: Block
    initialize_kv_cache: Block
    init_speculator_cudagraph_manager: Block
    batch: Block
    loras: Block
    dispatch: Block
    prepare_inputs: Block
    pp_inputs: Block
    run_model: Block

    def where(self) -> dict[str, str]:
        return {name: getattr(self, name).where for name in self.__dataclass_fields__}

    def digests(self) -> dict[str, str]:
        return {name: getattr(self, name).digest for name in self.__dataclass_fields__}


def load(module) -> Blocks:
    attn_utils = importlib.import_module(module.init_attn_backend.__module__)
    return Blocks(
        attn_cg_support=cut(
            attn_utils, None, "init_attn_backend",
            [("attn_backend_workspace", "attn_cg_support_info = get_attn_cg_support(")],
            ("attn_groups", "kernel_block_sizes", "kv_cache_config", "vllm_config", "device", "active_layer_names",
             "draft_layer_names"),
        ),
        narrow=cut(
            module, RUNNER, "initialize_kv_cache",
            [("additional_attn_cg_support = self.model_state.get_additional_cg_support()",
              "attn_cg_support = attn_cg_support.narrow(")],
            ("attn_cg_support",),
        ),
        adaptive_verification=cut(
            module, RUNNER, "initialize_kv_cache",
            [("target_attn_layer_names = None", "if isinstance(self.speculator, DraftModelSpeculator):"),
             ("additional_attn_cg_support = self.model_state.get_additional_cg_support()", None),
             ("self.adaptive_verification = maybe_create_adaptive_verification_manager(", None)],
            (),
        ),
        ubatch_runner=cut(
            module, RUNNER, "initialize_kv_cache", [("self.ubatch_runner = maybe_build_ubatch_runner(", None)], (),
        ),
        initialize_kv_cache=cut(
            module, RUNNER, "initialize_kv_cache",
            [("piecewise_capture_available = ", "self.cudagraph_manager = ModelCudaGraphManager(")],
            ("attn_cg_support", "is_profiling"),
        ),
        init_speculator_cudagraph_manager=cut(
            module, RUNNER, "initialize_kv_cache", [("if self.speculator is not None:", None)],
            ("cudagraph_mode",), contains="init_cudagraph_manager(",
        ),
        batch=cut(
            module, RUNNER, "execute_model",
            [("num_reqs = len(scheduler_output.num_scheduled_tokens)", "if batch_req_state is not None")],
            ("scheduler_output", "dummy_run"),
        ),
        loras=cut(
            module, RUNNER, "execute_model", [("num_active_loras = 0", "if self.lora_config:")],
            ("scheduler_output", "dummy_run"),
        ),
        dispatch=cut(
            module, RUNNER, "execute_model", [("batch_desc, dp_sync_state = dispatch_cg_and_sync_dp(", None)],
            ("num_reqs", "num_toks", "uniform_tok_count", "max_query_len", "is_profile", "skip_compiled",
             "num_active_loras", "skip_attn_for_dummy_run", "scheduler_output"),
        ),
        prepare_inputs=cut(
            module, RUNNER, "prepare_inputs",
            [("num_tokens = batch_req_state.num_tokens", "if envs.VLLM_MOE_SKIP_PADDING")],
            ("batch_req_state", "batch_desc"),
        ),
        pp_inputs=cut(
            module, RUNNER, "execute_model", [("if not self.is_first_pp_rank:", None)],
            ("model_inputs", "intermediate_tensors", "input_batch", "dummy_run"), contains="intermediate_tensors",
        ),
        run_model=cut(
            module, RUNNER, "execute_model", [("if batch_desc.cg_mode == CUDAGraphMode.FULL:", None)],
            ("batch_desc", "dp_sync_state", "scheduler_output", "input_batch", "attn_metadata", "model_inputs",
             "ubatch_state", "ubatch_slices", "slot_mappings_by_layer", "skip_compiled"),
            contains="run_fullgraph",
        ),
    )


class _ModelState:
    """``ModelState`` as the capture and run paths read it, for a decoder-only text model."""

    supports_mm_inputs = False

    def prepare_dummy_inputs(self, num_reqs, num_tokens):
        return {}

    def prepare_attn(self, *args, **kwargs):
        """Per attention layer, its metadata: ``get_attention_context`` looks the layer up; the
        stand-in kernel reads no metadata."""
        return {TARGET_LAYER: None, DRAFT_LAYER: None}

    def capture_inner_cudagraphs(self, *args, **kwargs):
        return None  # only DeepSeek-V4.1's decoder replay has inner graphs

    num_new_sampled_tokens_per_step = 1  # ModelState's default (34:…/model_states/interface.py:267)

    def get_additional_cg_support(self):
        """``ModelState``'s default: no attention groups outside ``init_attn_backend``
        (``34:…/model_states/interface.py:148-155``)."""
        from vllm.v1.attention.backend import AttentionCGSupport

        return AttentionCGSupport.ALWAYS, None


class _BlockTables:
    cp_size = 1

    def get_dummy_block_tables(self, num_reqs):
        return ()

    def get_dummy_slot_mappings(self, num_tokens):
        return torch.zeros((0, num_tokens), dtype=torch.int64)

    num_kv_cache_groups = 0

    def compute_slot_mappings(self, idx_mapping, query_start_loc, positions, num_tokens, out=None):
        return torch.zeros((0, num_tokens), dtype=torch.int64)  # the draft decode steps' (no KV groups)


class _KVConnector:
    def pre_forward(self, *args, **kwargs):
        return None

    def finish_forward(self):
        return None

    def reset_capture_state(self):
        return None


def kv_cache_config(mamba_cache_blocks: int | None = None) -> types.SimpleNamespace:
    """A ``KVCacheConfig`` without groups: no attention layer exists to hold a KV cache. A hybrid
    model's holds Mamba layers and its blocks (``has_mamba_layers``, ``num_blocks``), all resolve's
    Mamba check reads (``34:config/compilation.py:1659-1681``)."""
    return types.SimpleNamespace(kv_cache_groups=[], num_blocks=mamba_cache_blocks or 0,
                                 has_mamba_layers=mamba_cache_blocks is not None)


def scheduled_batch(runner, num_tokens: int, uniform_decode: bool, num_active_loras: int = 0) -> types.SimpleNamespace:
    """The ``SchedulerOutput`` of a trace's ``execute_model(num_tokens, uniform_decode, num_active_loras)``;
    sets ``runner.req_states`` to the request states it schedules. A decode request has its whole
    prompt computed, a prefilling one none of it (``gather_batch_req_state``: ``is_prefilling``).
    With ``--enable-lora`` the first ``num_active_loras`` requests each ask for an adapter of their
    own, the others for none, as ``add_requests`` records them in the runner's ``LoraState``
    (``33:…/model_runner.py:1254``, ``34:…:1324``)."""
    import numpy as np

    q = runner.decode_query_len
    if uniform_decode:
        tokens = [q] * (num_tokens // q)
        prefill_len, computed = [1] * len(tokens), [1] * len(tokens)
    else:
        num_reqs = min(num_tokens, runner.max_num_reqs)
        tokens = [num_tokens // num_reqs] * num_reqs
        tokens[-1] += num_tokens % num_reqs
        prefill_len, computed = list(tokens), [0] * num_reqs
    req_ids = [f"req-{i}" for i in range(len(tokens))]
    if runner.lora_config is not None:
        from vllm.lora.request import LoRARequest
        from vllm.v1.worker.gpu.lora_utils import LoraState

        # sized for the batch: a uniform decode of one token per request can hold one request more than
        # max_num_seqs (5 at q = 1), a batch the model reads as it is
        runner.lora_state = LoraState(max_num_reqs=max(runner.max_num_reqs, len(req_ids)))
        for i, req_id in enumerate(req_ids):
            adapter = LoRARequest(f"adapter-{i + 1}", i + 1, "/not/a/real/path") if i < num_active_loras else None
            runner.lora_state.add_request(req_id, i, adapter)
    runner.req_states = types.SimpleNamespace(
        req_id_to_index={r: i for i, r in enumerate(req_ids)},
        prefill_len=types.SimpleNamespace(np=np.array(prefill_len, dtype=np.int32)),
        num_computed_prefill_tokens=np.array(computed, dtype=np.int32),
        # each request's length cap, read under PP only (34:…/model_runner.py:1411-1413): far off
        max_seq_len=np.full(len(tokens), 1 << 20, dtype=np.int64),
    )
    return types.SimpleNamespace(num_scheduled_tokens=dict(zip(req_ids, tokens)), total_num_scheduled_tokens=num_tokens,
                                 scheduled_spec_decode_tokens={}, skip_drafts=False)


def stand_in_runner(module, vllm_config, model, device) -> types.SimpleNamespace:
    """The ``self`` of the blocks and of ``capture_model``."""
    from vllm.v1.worker.gpu.input_batch import InputBuffers

    scheduler = vllm_config.scheduler_config
    gmr = getattr(module, RUNNER)
    runner = types.SimpleNamespace(
        vllm_config=vllm_config,
        compilation_config=vllm_config.compilation_config,
        parallel_config=vllm_config.parallel_config,
        model=model,
        device=device,
        max_num_reqs=scheduler.max_num_seqs,
        max_num_tokens=scheduler.max_num_batched_tokens,
        decode_query_len=1 + vllm_config.num_speculative_tokens,
        kv_cache_config=kv_cache_config(),
        cache_config=vllm_config.cache_config,
        lora_config=vllm_config.lora_config,
        lora_manager=LoRAManager(),
        adaptive_verification=None,
        ubatch_runner=None,
        pcp_manager=None,
        speculator=None,
        speculative_config=vllm_config.speculative_config,  # GPUModelRunner.__init__ (33:…:209, 34:…:216)
        dp_size=1,
        dp_rank=0,
        cudagraph_manager=None,
        model_state=_ModelState(),
        input_buffers=InputBuffers(scheduler.max_num_seqs, scheduler.max_num_batched_tokens, device),
        intermediate_tensors=None,
        block_tables=_BlockTables(),
        attn_groups=[],
        use_aux_hidden_state_outputs=False,
        kv_connector=_KVConnector(),
        eplb=types.SimpleNamespace(suppress=contextlib.nullcontext),  # expert load balancing: no MoE
        _draft_workspace_lane=0,  # int(uses a separate lane): DSpark only (33:…:210-212, 34:…:217-220)
        use_pp=False,
        req_states=None,  # scheduled_batch's
        vocab_size=vllm_config.model_config.get_vocab_size(),
        batch_sharder=None,
    )
    for name in ("maybe_setup_dummy_loras", "maybe_select_dummy_loras", "_set_active_loras", "_ensure_lora_enabled",
                 "maybe_remove_all_loras", "needs_cudagraph_capture", "capture_model", "gather_batch_req_state"):
        setattr(runner, name, types.MethodType(getattr(gmr, name), runner))
    from vllm.v1.worker.gpu.lora_utils import get_lora_capture_cases

    runner.lora_capture_cases = get_lora_capture_cases(runner.lora_config, runner.compilation_config)
    return runner
