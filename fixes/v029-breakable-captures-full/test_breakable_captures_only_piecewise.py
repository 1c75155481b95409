# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Model Runner V1 with breakable CUDA graphs: ``CUDAGraphWrapper(FULL)`` captures
the FULL dispatches and ``BreakableCUDAGraphWrapper`` the PIECEWISE ones (PR
#56312); vLLM 0.29.0's match-any breakable wrapper captured FULL ones too."""

import contextlib
from unittest.mock import MagicMock

import pytest
import torch

from vllm.config import CompilationConfig, CUDAGraphMode, DeviceConfig, VllmConfig
from vllm.forward_context import get_forward_context, set_forward_context
from vllm.platforms import current_platform

gmr = pytest.importorskip(
    "vllm.v1.worker.gpu_model_runner",
    reason="Model Runner V1 (v1/worker/gpu_model_runner.py) is not in this release",
)
OPEN: list[str] = []  # the graph captures open now, named by their capturer


class FakeCUDAGraph:
    """torch.cuda.CUDAGraph, which the breakable wrapper drives directly."""

    capture_begin = lambda self, **kwargs: OPEN.append("breakable")
    capture_end = lambda self: OPEN.pop()
    replay = lambda self: None


@contextlib.contextmanager
def fake_graph(cudagraph, **kwargs):
    """torch.cuda.graph, which CUDAGraphWrapper captures with."""
    OPEN.append("CUDAGraphWrapper")
    yield
    OPEN.pop()


def test_full_graphs_captured_by_cudagraph_wrapper(monkeypatch):
    monkeypatch.setenv("VLLM_USE_BREAKABLE_CUDAGRAPH", "1")
    monkeypatch.setattr(current_platform, "support_static_graph_mode", lambda: True)
    monkeypatch.setattr(type(current_platform), "_global_graph_pool", object())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeCUDAGraph)
    monkeypatch.setattr(torch.cuda, "graph", fake_graph)
    monkeypatch.setattr(torch.accelerator, "empty_cache", lambda: None)
    monkeypatch.setattr("vllm.compilation.cuda_graph.current_stream", lambda: None)
    for module in ("cuda_graph", "breakable_cudagraph"):  # vLLM's CUDA ops
        monkeypatch.setattr(f"vllm.compilation.{module}.weak_ref_tensors", lambda x: x)
    # Breakable graphs force compilation mode NONE: no compiled pieces.
    vllm_config = VllmConfig(
        compilation_config=CompilationConfig(cudagraph_mode="FULL_AND_PIECEWISE"),
        device_config=DeviceConfig(device="cpu"),
    )
    # Without a model config VllmConfig sizes no graphs.
    config = vllm_config.compilation_config
    config.cudagraph_capture_sizes, config.max_cudagraph_capture_size = [2, 4], 4
    # The model records its mode and the captures open while it runs.
    runs = set()
    model = lambda x: runs.add((get_forward_context().cudagraph_runtime_mode, *OPEN))
    for name in ("DeviceMemoryProfiler", "get_model_loader"):
        monkeypatch.setattr(gmr, name, MagicMock())
    gmr.get_model_loader().load_model.return_value = model
    runner = MagicMock(
        vllm_config=vllm_config,
        compilation_config=config,
        parallel_config=vllm_config.parallel_config,
        cudagraph_dispatcher=gmr.CudagraphDispatcher(vllm_config),
        speculative_config=None,
        lora_config=None,
        kv_cache_config=None,
        uniform_decode_query_len=1,
    )
    gmr.GPUModelRunner.load_model(runner)
    gmr.GPUModelRunner._check_and_update_cudagraph_mode(runner, [], [])
    assert gmr.GPUModelRunner.get_model(runner) is model

    # Every dispatch of the runner's dispatcher, as capture_model makes them.
    for mode, descriptors in runner.cudagraph_dispatcher.cudagraph_keys.items():
        for desc in descriptors:
            with set_forward_context(
                None, vllm_config, cudagraph_runtime_mode=mode, batch_descriptor=desc
            ):
                runner.model(torch.zeros(desc.num_tokens))
    # One capturer per mode; FULL must not be a breakable capture.
    assert runs == {
        (CUDAGraphMode.FULL, "CUDAGraphWrapper"),
        (CUDAGraphMode.PIECEWISE, "breakable"),
    }
