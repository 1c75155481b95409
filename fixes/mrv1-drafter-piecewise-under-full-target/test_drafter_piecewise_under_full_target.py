# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Model Runner V1: under a FULL target, the drafter may dispatch PIECEWISE only
when something captures it. A draft model compiled under FULL gets no piecewise
wrapper; only breakable CUDA graphs (wrapped in ``load_model``) capture it."""

from types import SimpleNamespace
from unittest.mock import MagicMock

import pytest

from vllm.compilation.backends import wrap_with_cudagraph_if_needed
from vllm.config import (
    CompilationConfig,
    CompilationMode,
    CUDAGraphMode,
    DeviceConfig,
    VllmConfig,
)
from vllm.platforms import current_platform
from vllm.v1.attention.backend import AttentionCGSupport

gmr = pytest.importorskip(
    "vllm.v1.worker.gpu_model_runner", reason="Model Runner V1 is not in this release"
)

from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher  # noqa: E402
from vllm.v1.spec_decode.eagle import EagleProposer  # noqa: E402


class Backend:  # an attention backend with FULL graphs for every batch
    get_builder_cls = classmethod(lambda cls: cls)
    get_cudagraph_support = classmethod(lambda cls, *a: AttentionCGSupport.ALWAYS)


@pytest.mark.parametrize(
    "cudagraph_mode,splitting_ops,breakable",
    [("FULL", None, False), ("FULL_AND_PIECEWISE", [], False), ("FULL", None, True)],
)
def test_drafter_piecewise_keys_have_a_capturer(
    monkeypatch, cudagraph_mode, splitting_ops, breakable
):
    monkeypatch.setenv("VLLM_USE_BREAKABLE_CUDAGRAPH", str(int(breakable)))
    # A platform with CUDA graphs (the CPU one turns them off in VllmConfig).
    monkeypatch.setattr(current_platform, "support_static_graph_mode", lambda: True)
    vllm_config = VllmConfig(
        compilation_config=CompilationConfig(
            mode=CompilationMode.VLLM_COMPILE,
            cudagraph_mode=cudagraph_mode,
            splitting_ops=splitting_ops,  # [] leaves FULL_AND_PIECEWISE FULL
        ),
        device_config=DeviceConfig(device="cpu"),
    )
    # Capture sizes (VllmConfig keeps the configured ones only with a model).
    vllm_config.compilation_config.cudagraph_capture_sizes = [2, 4]
    vllm_config.compilation_config.max_cudagraph_capture_size = 4
    spec = SimpleNamespace(enforce_eager=False, use_eagle=lambda: True)
    drafter = EagleProposer.__new__(EagleProposer)
    drafter.speculative_config = spec
    drafter.cudagraph_dispatcher = CudagraphDispatcher(vllm_config)
    runner = MagicMock(
        vllm_config=vllm_config,
        compilation_config=vllm_config.compilation_config,
        parallel_config=vllm_config.parallel_config,
        speculative_config=spec,
        drafter=drafter,
        cudagraph_dispatcher=CudagraphDispatcher(vllm_config),
        uniform_decode_query_len=2,
        max_num_reqs=4,
        kv_cache_config=None,
    )
    gmr.GPUModelRunner._check_and_update_cudagraph_mode(
        runner, [{Backend}], [MagicMock()]
    )

    # The target keeps its FULL graphs: dropping every graph is no fix.
    assert vllm_config.compilation_config.cudagraph_mode == CUDAGraphMode.FULL
    # The draft model is compiled with the target's config (VllmBackend wraps
    # each piece with wrap_with_cudagraph_if_needed): no piecewise wrapper.
    piece = object()
    compiled = wrap_with_cudagraph_if_needed(
        piece, vllm_config, vllm_config.compilation_config, True, True
    )
    has_capturer = breakable or compiled is not piece
    keys = drafter.cudagraph_dispatcher.cudagraph_keys
    drafter_modes = {mode for mode, descs in keys.items() if descs}
    want = {CUDAGraphMode.PIECEWISE} if has_capturer else set()
    assert drafter_modes == want, f"drafter dispatches {drafter_modes}"
