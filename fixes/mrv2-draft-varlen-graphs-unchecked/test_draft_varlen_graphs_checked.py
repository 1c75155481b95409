# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Adaptive verification must check every attention backend whose FULL graphs
replay varlen decode batches: the draft model's too, once Model Runner V2's
draft prefill takes varlen graphs."""

from types import SimpleNamespace
from unittest.mock import MagicMock

import pytest
import torch

speculator = pytest.importorskip(
    "vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator",
    reason="no target-dependent speculator in this release",
)

from vllm.config import CUDAGraphMode  # noqa: E402
from vllm.v1.attention.backend import AttentionCGSupport  # noqa: E402
from vllm.v1.worker.gpu.spec_decode import adaptive_verification  # noqa: E402
from vllm.v1.worker.gpu.spec_decode.eagle.speculator import (  # noqa: E402
    EagleSpeculator,
)


def draft_prefill_takes_varlen_graphs(monkeypatch) -> bool:
    """What ``init_cudagraph_manager`` gives the draft prefill's manager."""
    made = {}
    monkeypatch.setattr(
        speculator, "SpeculatorCudaGraphManager", lambda *a, **kw: made.update(kw)
    )
    parent = speculator.TargetDependentARSpeculator.__mro__[1]  # its base's manager
    monkeypatch.setattr(parent, "init_cudagraph_manager", lambda self, mode: None)
    spec = EagleSpeculator.__new__(EagleSpeculator)
    spec.__dict__.update(
        vllm_config=MagicMock(),
        device=torch.device("cpu"),
        num_speculative_steps=1,
        enable_adaptive_verification=True,
    )
    speculator.TargetDependentARSpeculator.init_cudagraph_manager(
        spec, CUDAGraphMode.FULL_AND_PIECEWISE
    )
    return bool(made.get("varlen_decode"))


def attention_group(layer: str, support: AttentionCGSupport):
    class Builder:
        @classmethod
        def get_cudagraph_support(cls, vllm_config, kv_cache_spec):
            return support

        @classmethod
        def get_varlen_cudagraph_max_query_len(cls, vllm_config, kv_cache_spec):
            return None  # no varlen bound declared

    backend = type(f"{support.name}Backend", (), {})
    backend.supports_device_cpu_query_lens_mismatch = staticmethod(lambda: True)
    return SimpleNamespace(
        backend=backend,
        layer_names=[layer],
        kv_cache_spec=None,
        get_metadata_builder=lambda ubatch_id=0: Builder,
    )


def test_a_draft_backend_without_varlen_graphs_is_refused(monkeypatch):
    if not draft_prefill_takes_varlen_graphs(monkeypatch):
        pytest.skip("the draft prefill takes no varlen graphs in this release")
    groups = [
        [
            attention_group("model.layers.0.attn", AttentionCGSupport.ALWAYS),
            attention_group("draft.layers.0.attn", AttentionCGSupport.UNIFORM_BATCH),
        ]
    ]
    # UNIFORM_BATCH: graphs for batches whose query lengths are all the same
    # (AttentionCGSupport); the draft prefill would replay varlen ones.
    monkeypatch.setattr(
        adaptive_verification, "AdaptiveVerificationManager", MagicMock()
    )
    with pytest.raises(ValueError, match="UNIFORM_BATCHBackend"):
        adaptive_verification.maybe_create_adaptive_verification_manager(
            enable_adaptive_verification=True,
            attn_groups=groups,
            req_states=SimpleNamespace(num_speculative_steps=1),
            query_start_loc=torch.zeros(5, dtype=torch.int32),
            num_bonus_tokens=1,
            max_total_logits=8,
            vllm_config=MagicMock(),
            target_layer_names={"model.layers.0.attn"},
        )
