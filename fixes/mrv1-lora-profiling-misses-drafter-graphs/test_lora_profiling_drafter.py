# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""With --enable-lora --specialize-active-lora and an EAGLE drafter, Model Runner V1's
memory profiling captures the drafter's graphs, none with dummy adapters (#28334)."""

from contextlib import contextmanager
from unittest.mock import MagicMock

import pytest
import torch

from vllm.config import CompilationConfig, DeviceConfig, LoRAConfig, VllmConfig
from vllm.config.compilation import CUDAGraphMode
from vllm.forward_context import get_forward_context
from vllm.platforms import current_platform
from vllm.v1.attention.backend import AttentionCGSupport

gmr = pytest.importorskip("vllm.v1.worker.gpu_model_runner", reason="no MRV1")

from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher  # noqa: E402
from vllm.v1.spec_decode.eagle import EagleProposer  # noqa: E402

Runner = gmr.GPUModelRunner
OFF = ("parallel_drafting", "supports_mm_inputs", "pass_hidden_states_to_model")
selected = [0]  # how many dummy adapters the current capture run selected


class StandIn(MagicMock):  # the runner's own profiling code, mocks for the rest
    profile_cudagraph_memory = Runner.profile_cudagraph_memory
    _dummy_run = Runner._dummy_run
    _warmup_and_capture = Runner._warmup_and_capture
    _determine_batch_execution_and_padding = (
        Runner._determine_batch_execution_and_padding
    )
    _is_uniform_decode = staticmethod(Runner._is_uniform_decode)
    kv_cache_config = supports_mm_inputs = use_aux_hidden_state_outputs = None
    dcp_world_size, uses_xdrope_dim, device = 1, 0, torch.device("cpu")
    uniform_decode_query_len, max_num_tokens, max_model_len = 2, 8, 64
    _create_encoder_cudagraph_manager = staticmethod(lambda: None)
    _pad_for_sequence_parallelism = staticmethod(lambda n: n)
    _get_slot_mappings = _build_attention_metadata = MagicMock(return_value=[None] * 2)

    @staticmethod
    @contextmanager
    def maybe_dummy_run_with_lora(lora_config, *args):
        selected[0] = args[-1]  # num_active_loras
        yield
        selected[0] = 0


def test_memory_profiling_captures_the_drafter_under_specialized_lora(monkeypatch):
    class Backend:  # an attention backend with FULL graphs for every batch
        get_builder_cls = classmethod(lambda cls: cls)
        get_cudagraph_support = classmethod(lambda cls, *a: AttentionCGSupport.ALWAYS)

    # A platform with CUDA graphs (the CPU one turns them off in VllmConfig).
    monkeypatch.setattr(current_platform, "support_static_graph_mode", lambda: True)
    monkeypatch.setattr(current_platform, "graph_pool_handle", MagicMock(), False)
    monkeypatch.setattr(torch, "accelerator", MagicMock(get_memory_info=lambda: (0, 0)))
    for name in ("get_pp_group", "async_tensor_h2d", "graph_capture"):
        monkeypatch.setattr(gmr, name, MagicMock())
    monkeypatch.setattr(gmr, "set_cudagraph_capturing_enabled", MagicMock())  # global
    cc = CompilationConfig(cudagraph_mode="FULL_AND_PIECEWISE")
    vllm_config = VllmConfig(compilation_config=cc, device_config=DeviceConfig("cpu"))
    vllm_config.lora_config = LoRAConfig(max_loras=3, specialize_active_lora=True)
    cc.cudagraph_capture_sizes, cc.max_cudagraph_capture_size = [2, 4], 4  # a model's
    vllm_config.model_config = MagicMock(multimodal_config=None)
    spec = MagicMock(enforce_eager=False)  # an EAGLE speculative config
    drafted = []  # (runtime mode, tokens, adapters selected) of each drafter forward
    drafter = EagleProposer.__new__(EagleProposer)
    drafter.__dict__.update(
        dict.fromkeys(OFF, False),
        vllm_config=vllm_config,
        speculative_config=spec,
        cudagraph_dispatcher=CudagraphDispatcher(vllm_config),
        num_speculative_tokens=1,
        _draft_attn_layer_names=set(),
        input_ids=torch.zeros(8),
        _get_positions=lambda n: None,
        model=lambda input_ids, **kw: drafted.append(
            (get_forward_context().cudagraph_runtime_mode, len(input_ids), selected[0])
        ),
    )
    runner = StandIn(
        vllm_config=vllm_config,
        compilation_config=cc,
        parallel_config=vllm_config.parallel_config,
        scheduler_config=vllm_config.scheduler_config,
        lora_config=vllm_config.lora_config,
        speculative_config=spec,
        drafter=drafter,
        cudagraph_dispatcher=CudagraphDispatcher(vllm_config),
    )
    Runner._check_and_update_cudagraph_mode(runner, [{Backend}], [MagicMock()])
    assert cc.cudagraph_mode.mixed_mode() == CUDAGraphMode.PIECEWISE
    runner.profile_cudagraph_memory()
    profiled = {n for mode, n, _ in drafted if mode == CUDAGraphMode.PIECEWISE}
    assert profiled, "memory profiling never captured the drafter's graphs"
    assert not [f for f in drafted if f[0] != CUDAGraphMode.NONE and f[2]], drafted
