# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Without compilation (mode NONE, no breakable graphs) nothing captures PIECEWISE:
Model Runner V1's resolve must not fall back to a piecewise mode because
``splitting_ops`` lists the attention ops, and must keep the FULL decode graphs."""

from unittest.mock import MagicMock

import pytest

gpu_model_runner = pytest.importorskip(
    "vllm.v1.worker.gpu_model_runner",
    reason="Model Runner V1 (v1/worker/gpu_model_runner.py) is not in this release",
)

from vllm.config import (  # noqa: E402
    CompilationConfig,
    CompilationMode,
    CUDAGraphMode,
    DeviceConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.platforms import current_platform  # noqa: E402
from vllm.v1.attention.backend import AttentionCGSupport  # noqa: E402
from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher  # noqa: E402


@pytest.mark.parametrize(
    "configured,support,uniform_decode_query_len,expected",
    [
        # Spec decode (q = 2) with single-token decode graphs: no FULL graph
        # fits, and PIECEWISE has no capturer.
        (
            CUDAGraphMode.FULL_DECODE_ONLY,
            AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE,
            2,
            CUDAGraphMode.NONE,
        ),
        # Uniform-batch support keeps FULL decode graphs; mixed batches eager.
        (
            CUDAGraphMode.FULL,
            AttentionCGSupport.UNIFORM_BATCH,
            1,
            CUDAGraphMode.FULL_DECODE_ONLY,
        ),
    ],
)
def test_resolve_without_compilation_needs_no_piecewise_capture(
    monkeypatch, configured, support, uniform_decode_query_len, expected
):
    monkeypatch.setenv("VLLM_USE_BREAKABLE_CUDAGRAPH", "0")
    # A platform with CUDA graphs (the CPU one turns them off in VllmConfig).
    monkeypatch.setattr(current_platform, "support_static_graph_mode", lambda: True)
    vllm_config = VllmConfig(
        compilation_config=CompilationConfig(
            mode=CompilationMode.NONE,
            cudagraph_mode=configured,
            splitting_ops=list(CompilationConfig._attention_ops),
        ),
        scheduler_config=SchedulerConfig.default_factory(max_model_len=256),
        device_config=DeviceConfig(device="cpu"),
    )
    compilation_config = vllm_config.compilation_config
    assert compilation_config.cudagraph_mode == configured
    # VllmConfig picks capture sizes only with a model config.
    compilation_config.cudagraph_capture_sizes = [2, 4]
    compilation_config.max_cudagraph_capture_size = 4
    dispatcher = CudagraphDispatcher(vllm_config)
    runner = MagicMock(
        vllm_config=vllm_config,
        compilation_config=compilation_config,
        parallel_config=vllm_config.parallel_config,
        speculative_config=None,
        cudagraph_dispatcher=dispatcher,
        uniform_decode_query_len=uniform_decode_query_len,
        max_num_reqs=4,
        kv_cache_config=None,
    )
    # One attention backend whose metadata builder reports ``support``.
    backend = MagicMock(__name__="Backend")
    builder = backend.get_builder_cls.return_value
    builder.get_cudagraph_support.return_value = support
    gpu_model_runner.GPUModelRunner._check_and_update_cudagraph_mode(
        runner, [{backend}], [MagicMock()]
    )

    resolved = compilation_config.cudagraph_mode
    # No PIECEWISE graph without a compiled model or breakable graphs...
    assert not dispatcher.cudagraph_keys[CUDAGraphMode.PIECEWISE], resolved
    # ...and the FULL decode graphs the backend supports are kept.
    assert resolved == expected, resolved
    assert bool(dispatcher.cudagraph_keys[CUDAGraphMode.FULL]) == (
        expected.has_full_cudagraphs()
    )
