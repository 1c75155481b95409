# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""``speculative_config.enforce_eager`` keeps Model Runner V2's drafter eager, as
Model Runner V1's; the target keeps its graphs. ``initialize_kv_cache`` on CPU."""

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
from vllm.v1.worker.gpu.attn_utils import get_attn_cg_support  # noqa: E402


@pytest.mark.parametrize("enforce_eager", [True, False])
def test_spec_enforce_eager_keeps_the_drafter_eager(monkeypatch, enforce_eager):
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
        enforce_eager=enforce_eager,
        num_speculative_tokens=1,
        enable_adaptive_verification=False,
        uses_dynamic_speculative_decoding=lambda: False,
        num_speculative_tokens_per_batch_size=None,
    )
    # The KV-cache plumbing, which decides nothing about modes.
    monkeypatch.setattr(
        model_runner,
        "init_attn_backend",
        lambda *a, **k: ([], get_attn_cg_support([], vllm_config), []),
    )
    for name in ("BlockTables", "ModelCudaGraphManager", "init_kv_cache"):
        monkeypatch.setattr(model_runner, name, MagicMock())
    # A compiled target (absent from 0.29.0, which keeps every mode).
    monkeypatch.setattr(
        model_runner, "has_compiled_submodule", lambda model: True, raising=False
    )
    drafter_modes = []
    # The runner's own method on a stand-in self: what it does not read about
    # modes is a mock; what it does is the config above.
    runner = MagicMock(
        vllm_config=vllm_config,
        compilation_config=vllm_config.compilation_config,
        cache_config=vllm_config.cache_config,
        speculative_config=vllm_config.speculative_config,
        speculator=SimpleNamespace(init_cudagraph_manager=drafter_modes.append),
        decode_query_len=2,
        vocab_size=256,
        device=torch.device("cpu"),
        is_encoder_decoder=False,
        supports_mm_inputs=False,
        pcp_manager=None,
        batch_sharder=None,
        lora_capture_cases=None,
    )
    runner.model_state.get_additional_cg_support.return_value = (
        AttentionCGSupport.ALWAYS,
        None,
    )
    kv_cache_config = KVCacheConfig(
        num_blocks=4, kv_cache_tensors=[], kv_cache_groups=[]
    )
    with set_current_vllm_config(vllm_config):
        model_runner.GPUModelRunner.initialize_kv_cache(runner, kv_cache_config)

    # The target keeps its graphs: dropping every graph is no fix.
    target = vllm_config.compilation_config.cudagraph_mode
    assert target == CUDAGraphMode.FULL_AND_PIECEWISE, target
    (drafter,) = drafter_modes
    want = CUDAGraphMode.NONE if enforce_eager else target
    assert drafter == want, f"speculative_config.enforce_eager={enforce_eager}"
