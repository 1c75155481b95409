"""Beside ``v1/worker/gpu/model_runner.py``: its mode- and capturer-deciding code, run unchanged.

- ``initialize_kv_cache``: the statements from ``piecewise_capture_available = …`` to the
  ``ModelCudaGraphManager(...)`` construction (adaptive verification's rewrite, resolve, the new
  manager; ``33:…:748-774``, ``34:…:783-811``), and ``speculator.init_cudagraph_manager`` (``33:…:789-792``,
  ``34:…:826-829``);
- ``execute_model``: the ``dispatch_cg_and_sync_dp`` statement (``33:…:1832-1848``, ``34:…:1884-1900``)
  and the "Run model" branch (``33:…:2051-2097``, ``34:…:2119-2164``);
- ``capture_model``: the whole method, called unbound on the stand-in runner, and so is
  ``profile_cudagraph_memory`` (``v1/worker/gpu/cudagraph_utils.py``), whose KV-cache bootstrap
  (``_init_minimal_kv_cache_for_profiling``) calls the runner's ``initialize_kv_cache`` with a
  stand-in config.

The stand-in runner holds what those read (``GPUModelRunner.__init__``/``load_model``), with
stand-ins for the KV-cache plumbing that decides nothing about graphs: a model state whose dummy
and attention inputs are empty, dummy block tables, a KV-cache config without groups, a no-op KV
connector, no expert load balancer.
"""

from __future__ import annotations

import contextlib
import types
from dataclasses import dataclass

import torch

from contract.conformance.mrv2.blocks import Block, cut

RUNNER = "GPUModelRunner"


@dataclass(frozen=True)
class Blocks:
    initialize_kv_cache: Block
    init_speculator_cudagraph_manager: Block
    dispatch: Block
    run_model: Block

    def where(self) -> dict[str, str]:
        return {name: getattr(self, name).where for name in self.__dataclass_fields__}

    def digests(self) -> dict[str, str]:
        return {name: getattr(self, name).digest for name in self.__dataclass_fields__}


def load(module) -> Blocks:
    return Blocks(
        initialize_kv_cache=cut(
            module, RUNNER, "initialize_kv_cache",
            [("piecewise_capture_available = ", "self.cudagraph_manager = ModelCudaGraphManager(")],
            ("attn_cg_support", "is_profiling"),
        ),
        init_speculator_cudagraph_manager=cut(
            module, RUNNER, "initialize_kv_cache", [("if self.speculator is not None:", None)],
            ("cudagraph_mode",), contains="init_cudagraph_manager(cudagraph_mode)",
        ),
        dispatch=cut(
            module, RUNNER, "execute_model", [("batch_desc, dp_sync_state = dispatch_cg_and_sync_dp(", None)],
            ("num_reqs", "num_toks", "uniform_tok_count", "max_query_len", "is_profile", "skip_compiled",
             "num_active_loras", "skip_attn_for_dummy_run", "scheduler_output"),
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
        return {}

    def capture_inner_cudagraphs(self, *args, **kwargs):
        return None  # only DeepSeek-V4.1's decoder replay has inner graphs


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


def kv_cache_config() -> types.SimpleNamespace:
    """A ``KVCacheConfig`` without groups: no attention layer exists to hold a KV cache."""
    return types.SimpleNamespace(kv_cache_groups=[], num_blocks=0, has_mamba_layers=False)


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
        lora_config=None,
        lora_capture_cases=None,
        adaptive_verification=None,
        ubatch_runner=None,
        pcp_manager=None,
        speculator=None,
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
    )
    for name in ("maybe_setup_dummy_loras", "maybe_remove_all_loras", "needs_cudagraph_capture", "capture_model"):
        setattr(runner, name, types.MethodType(getattr(gmr, name), runner))
    return runner
