# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Model Runner V1 captures the breakable drafter under a FULL target, where it
dispatches PIECEWISE: a graph first captured while serving raises."""

from unittest.mock import MagicMock

import pytest
import torch

from vllm.config import CompilationConfig, CUDAGraphMode, DeviceConfig, VllmConfig
from vllm.forward_context import get_forward_context
from vllm.platforms import current_platform
from vllm.v1.attention.backend import AttentionCGSupport

gmr = pytest.importorskip(
    "vllm.v1.worker.gpu_model_runner", reason="Model Runner V1 is not in this release"
)

from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher  # noqa: E402
from vllm.v1.spec_decode.eagle import EagleProposer  # noqa: E402

Runner = gmr.GPUModelRunner


class StandIn(MagicMock):  # the runner's own capture code, mocks for the rest
    _dummy_run = Runner._dummy_run
    _warmup_and_capture = Runner._warmup_and_capture
    _determine_batch_execution_and_padding = (
        Runner._determine_batch_execution_and_padding
    )
    _is_uniform_decode = staticmethod(Runner._is_uniform_decode)
    kv_cache_config = supports_mm_inputs = use_aux_hidden_state_outputs = None
    dcp_world_size, uses_xdrope_dim, device = 1, 0, torch.device("cpu")


class Backend:  # an attention backend with FULL graphs for every batch
    get_builder_cls = classmethod(lambda cls: cls)
    get_cudagraph_support = classmethod(lambda cls, *a: AttentionCGSupport.ALWAYS)


def test_capture_model_captures_the_drafter_under_full(monkeypatch):
    monkeypatch.setenv("VLLM_USE_BREAKABLE_CUDAGRAPH", "1")
    # A platform with CUDA graphs (the CPU one turns them off in VllmConfig).
    monkeypatch.setattr(current_platform, "support_static_graph_mode", lambda: True)
    monkeypatch.setattr(torch.accelerator, "synchronize", lambda: None)
    for name in ("get_pp_group", "async_tensor_h2d"):
        monkeypatch.setattr(gmr, name, MagicMock())
    vllm_config = VllmConfig(
        compilation_config=CompilationConfig(cudagraph_mode="FULL"),
        device_config=DeviceConfig(device="cpu"),
    )
    # As a model config would: capture sizes, no multimodal encoder.
    vllm_config.compilation_config.cudagraph_capture_sizes = [2, 4]
    vllm_config.compilation_config.max_cudagraph_capture_size = 4
    vllm_config.model_config = MagicMock(multimodal_config=None)
    spec = MagicMock(enforce_eager=False)  # an EAGLE speculative config
    drafted = []  # (runtime mode, tokens) of each drafter forward
    drafter = EagleProposer.__new__(EagleProposer)
    drafter.__dict__.update(
        vllm_config=vllm_config,
        speculative_config=spec,
        cudagraph_dispatcher=CudagraphDispatcher(vllm_config),
        num_speculative_tokens=1,
        parallel_drafting=False,
        supports_mm_inputs=False,
        pass_hidden_states_to_model=False,
        _draft_attn_layer_names=set(),
        input_ids=torch.zeros(8),
        _get_positions=lambda n: None,
        model=lambda input_ids, **kw: drafted.append(
            (get_forward_context().cudagraph_runtime_mode, len(input_ids))
        ),
    )
    runner = StandIn(
        vllm_config=vllm_config,
        compilation_config=vllm_config.compilation_config,
        parallel_config=vllm_config.parallel_config,
        scheduler_config=vllm_config.scheduler_config,
        speculative_config=spec,
        drafter=drafter,
        cudagraph_dispatcher=CudagraphDispatcher(vllm_config),
        uniform_decode_query_len=2,
        max_num_tokens=8,
        _pad_for_sequence_parallelism=lambda n: n,
        _get_slot_mappings=lambda **kw: (None, None),
        _build_attention_metadata=lambda **kw: (None, None),
    )
    Runner._check_and_update_cudagraph_mode(runner, [{Backend}], [MagicMock()])
    for mode, descs in runner.cudagraph_dispatcher.get_capture_descs():
        Runner._capture_cudagraphs(runner, descs, mode)  # capture_model's loop

    # The target keeps FULL graphs, the drafter PIECEWISE ones, all captured.
    assert vllm_config.compilation_config.cudagraph_mode == CUDAGraphMode.FULL
    keys = drafter.cudagraph_dispatcher.cudagraph_keys[CUDAGraphMode.PIECEWISE]
    assert keys, "the breakable drafter lost its graphs"
    captured = {n for mode, n in drafted if mode == CUDAGraphMode.PIECEWISE}
    assert captured == {d.num_tokens for d in keys}, "left to capture while serving"
