# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The model is compiled at its first forward, before resolve may add PIECEWISE
(FULL -> FULL_AND_PIECEWISE, FULL_DECODE_ONLY -> PIECEWISE): still capture it."""

from contextlib import nullcontext
from unittest.mock import MagicMock

import pytest
import torch
from torch import nn

from vllm.compilation import cuda_graph
from vllm.compilation.counter import compilation_counter
from vllm.compilation.decorators import support_torch_compile
from vllm.config import (
    CompilationConfig,
    CompilationMode,
    CUDAGraphMode,
    DeviceConfig,
    SchedulerConfig,
    VllmConfig,
    set_current_vllm_config,
)
from vllm.forward_context import BatchDescriptor, set_forward_context
from vllm.platforms import current_platform
from vllm.v1.attention.backend import AttentionCGSupport


@torch.library.custom_op("cudagraph_test::attention", mutates_args=())
def attention(query: torch.Tensor) -> torch.Tensor:
    return query * 2


attention.register_fake(torch.empty_like)


@support_torch_compile
class TinyModel(nn.Module):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.cudagraph_test.attention(x + 1) * 3


@pytest.mark.parametrize(
    "mode,support",
    [
        (CUDAGraphMode.FULL, AttentionCGSupport.UNIFORM_BATCH),
        (CUDAGraphMode.FULL_DECODE_ONLY, AttentionCGSupport.NEVER),
    ],
)
def test_piecewise_upgrade_after_first_compile(monkeypatch, mode, support):
    # CUDA graph capture on CPU: a platform with static graphs, fake graphs.
    monkeypatch.setattr(current_platform, "support_static_graph_mode", lambda: True)
    monkeypatch.setattr(
        current_platform,
        "get_static_graph_wrapper_cls",
        lambda: "vllm.compilation.cuda_graph.CUDAGraphWrapper",
    )
    monkeypatch.setattr(current_platform, "get_global_graph_pool", lambda: (0, 0))
    monkeypatch.setattr(torch.cuda, "CUDAGraph", MagicMock)
    monkeypatch.setattr(torch.cuda, "graph", lambda *a, **k: nullcontext())
    monkeypatch.setattr(cuda_graph, "current_stream", lambda: None)
    monkeypatch.setattr(cuda_graph, "weak_ref_tensors", lambda t: t)
    monkeypatch.setenv("VLLM_DISABLE_COMPILE_CACHE", "1")
    torch.compiler.reset()
    vllm_config = VllmConfig(
        compilation_config=CompilationConfig(
            mode=CompilationMode.VLLM_COMPILE,
            cudagraph_mode=mode,
            backend="eager",  # no Inductor; the graph is still split
            pass_config={"fuse_norm_quant": False, "fuse_act_quant": False},
        ),
        scheduler_config=SchedulerConfig.default_factory(max_model_len=256),
        device_config=DeviceConfig(device="cpu"),
    )
    cc = vllm_config.compilation_config
    cc.splitting_ops = [*cc.splitting_ops, "cudagraph_test::attention"]
    with set_current_vllm_config(vllm_config):
        model = TinyModel(vllm_config=vllm_config)
        model(torch.ones(16, 4))  # profile_run: the first forward compiles it.
        # The runner resolves the mode once the attention backends are known.
        resolved = cc.resolve_cudagraph_mode_and_sizes(support, "TestBackend")
        assert resolved.has_piecewise_cudagraphs(), resolved
        # A mixed batch dispatched to PIECEWISE must be captured, not run eagerly.
        captured = compilation_counter.num_cudagraph_captured
        with set_forward_context(
            None,
            vllm_config,
            cudagraph_runtime_mode=CUDAGraphMode.PIECEWISE,
            batch_descriptor=BatchDescriptor(num_tokens=4),
        ):
            model(torch.ones(4, 4))
        msg = f"{mode.name} -> {resolved.name}: the PIECEWISE batch ran eagerly"
        assert compilation_counter.num_cudagraph_captured > captured, msg
