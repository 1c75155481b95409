# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Memory profiling's ``initialize_kv_cache(is_profiling=True)`` writes the
resolved mode back; with adaptive verification and attention without full
graphs for q = 2, the real ``initialize_kv_cache`` must not stop on it."""

from types import SimpleNamespace
from unittest.mock import MagicMock

import pytest
import torch

model_runner = pytest.importorskip(
    "vllm.v1.worker.gpu.model_runner", reason="Model Runner V2 is not in this release"
)

from vllm.config import (  # noqa: E402
    CompilationConfig,
    CompilationMode,
    CUDAGraphMode,
    DeviceConfig,
    SchedulerConfig,
    VllmConfig,
    set_current_vllm_config,
)
from vllm.platforms import current_platform  # noqa: E402
from vllm.v1.attention.backend import AttentionCGSupport  # noqa: E402
from vllm.v1.kv_cache_interface import KVCacheConfig  # noqa: E402
from vllm.v1.worker.gpu.attn_utils import AttentionCGSupportInfo  # noqa: E402
from vllm.v1.worker.gpu.spec_decode import adaptive_verification  # noqa: E402


@pytest.mark.parametrize("draft_support", ["UNIFORM_SINGLE_TOKEN_DECODE", "NEVER"])
def test_initialize_kv_cache_after_profiling(monkeypatch, draft_support):
    # A platform with CUDA graphs (the CPU one turns them off in VllmConfig).
    monkeypatch.setattr(current_platform, "support_static_graph_mode", lambda: True)
    vllm_config = VllmConfig(
        compilation_config=CompilationConfig(
            mode=CompilationMode.VLLM_COMPILE,
            cudagraph_mode=CUDAGraphMode.FULL_AND_PIECEWISE,
            cudagraph_capture_sizes=[2, 4],
        ),
        scheduler_config=SchedulerConfig.default_factory(max_model_len=256),
        device_config=DeviceConfig(device="cpu"),
    )
    vllm_config.speculative_config = SimpleNamespace(
        num_speculative_tokens=1,
        enable_adaptive_verification=True,
        uses_dynamic_speculative_decoding=lambda: False,
    )
    vllm_config._validate_adaptive_verification()  # VllmConfig accepts it.
    # The weakest attention layer is the draft's (adaptive verification checks only
    # the target's); the KV-cache plumbing and device state decide no mode.
    support = AttentionCGSupportInfo(AttentionCGSupport[draft_support], "Draft")
    monkeypatch.setattr(
        model_runner, "init_attn_backend", lambda *a, **k: ([], support, [])
    )
    for name in ("BlockTables", "ModelCudaGraphManager", "init_kv_cache"):
        monkeypatch.setattr(model_runner, name, MagicMock())
    monkeypatch.setattr(
        adaptive_verification, "AdaptiveVerificationManager", MagicMock()
    )
    # A compiled target (absent from 0.29.0, which keeps every mode).
    monkeypatch.setattr(
        model_runner, "has_compiled_submodule", lambda model: True, raising=False
    )
    # The runner's own method on a stand-in self; the mode inputs are real.
    runner = MagicMock(
        vllm_config=vllm_config,
        compilation_config=vllm_config.compilation_config,
        cache_config=vllm_config.cache_config,
        # A drafter: adaptive verification checks the other (target) layers.
        speculator=MagicMock(
            spec=model_runner.DraftModelSpeculator,
            draft_attn_layer_names=set(),
            enable_adaptive_verification=True,
        ),
        decode_query_len=2,
        vocab_size=256,
        device=torch.device("cpu"),
        is_encoder_decoder=False,
    )
    runner.model_state.get_additional_cg_support.return_value = (
        AttentionCGSupport.ALWAYS,
        None,
    )
    kv_cache_config = KVCacheConfig(4, kv_cache_tensors=[], kv_cache_groups=[])
    initialize_kv_cache = model_runner.GPUModelRunner.initialize_kv_cache
    with set_current_vllm_config(vllm_config):
        initialize_kv_cache(runner, kv_cache_config, is_profiling=True)
        assert runner.adaptive_verification is not None
        # The real KV cache, from the mode that profiling wrote back.
        initialize_kv_cache(runner, kv_cache_config)

    # The target keeps PIECEWISE; adaptive verification times its steps on FULL.
    mode = vllm_config.compilation_config.cudagraph_mode
    assert mode == CUDAGraphMode.PIECEWISE, mode
    assert runner.adaptive_verification is None, "it needs FULL graphs"
