# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Model Runner V2 gives PIECEWISE to the draft only if the draft model can
capture it: without breakable CUDA graphs that takes a compiled submodule of its
own, as for the target. ``initialize_kv_cache`` on CPU."""

from types import SimpleNamespace
from unittest.mock import MagicMock

import pytest
import torch
from torch import nn

model_runner = pytest.importorskip(
    "vllm.v1.worker.gpu.model_runner", reason="Model Runner V2 is not in this release"
)

from vllm.compilation.decorators import support_torch_compile  # noqa: E402
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


@support_torch_compile
class CompiledLinear(nn.Linear):
    """A module with a ``@support_torch_compile`` boundary (never called)."""


@pytest.mark.parametrize("draft_compiled", [True, False])
def test_uncompiled_draft_gets_no_piecewise(monkeypatch, draft_compiled):
    # A platform with CUDA graphs (the CPU one turns them off in VllmConfig).
    monkeypatch.setattr(current_platform, "support_static_graph_mode", lambda: True)
    monkeypatch.setenv("VLLM_USE_BREAKABLE_CUDAGRAPH", "0")
    vllm_config = VllmConfig(
        compilation_config=CompilationConfig(
            mode=CompilationMode.VLLM_COMPILE,
            cudagraph_mode=CUDAGraphMode.FULL_AND_PIECEWISE,
            cudagraph_capture_sizes=[2, 4],
        ),
        scheduler_config=SchedulerConfig.default_factory(max_model_len=256),
        device_config=DeviceConfig(device="cpu"),
    )
    # The KV-cache plumbing, which decides nothing about modes.
    monkeypatch.setattr(
        model_runner,
        "init_attn_backend",
        lambda *a, **k: ([], get_attn_cg_support([], vllm_config), []),
    )
    for name in ("BlockTables", "ModelCudaGraphManager", "init_kv_cache"):
        monkeypatch.setattr(model_runner, name, MagicMock())
    drafter_modes = []
    with set_current_vllm_config(vllm_config):
        # The runner's own method on a stand-in self: what it does not read
        # about modes is a mock; what it does is the config and the models.
        runner = MagicMock(
            vllm_config=vllm_config,
            compilation_config=vllm_config.compilation_config,
            cache_config=vllm_config.cache_config,
            model=CompiledLinear(4, 4),
            # An uncompiled draft: e.g. an MTP module without a compile boundary.
            speculator=SimpleNamespace(
                model=CompiledLinear(4, 4) if draft_compiled else nn.Linear(4, 4),
                init_cudagraph_manager=drafter_modes.append,
            ),
            decode_query_len=2,
            is_encoder_decoder=False,
            vocab_size=256,
            device=torch.device("cpu"),
        )
        runner.model_state.get_additional_cg_support.return_value = (
            AttentionCGSupport.ALWAYS,
            None,
        )
        kv_cache_config = KVCacheConfig(4, kv_cache_tensors=[], kv_cache_groups=[])
        model_runner.GPUModelRunner.initialize_kv_cache(runner, kv_cache_config)

    # The compiled target keeps its graphs: dropping every graph is no fix.
    target_mode = vllm_config.compilation_config.cudagraph_mode
    assert target_mode == CUDAGraphMode.FULL_AND_PIECEWISE, target_mode
    (drafter,) = drafter_modes
    if draft_compiled:
        assert drafter == target_mode
    else:
        # PIECEWISE would call the uncompiled draft eagerly; FULL graphs stay.
        assert not drafter.has_piecewise_cudagraphs(), drafter
        assert drafter.has_full_cudagraphs(), drafter
