# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Model Runner V2 resolves the CUDA graph mode once per ``initialize_kv_cache``,
and memory profiling calls it first.

``profile_cudagraph_memory`` bootstraps a minimal KV cache with
``initialize_kv_cache(is_profiling=True)`` (``_init_minimal_kv_cache_for_profiling``).
That call runs ``resolve_cudagraph_mode_and_sizes``, which writes the resolved mode
back into ``compilation_config.cudagraph_mode``. The real ``initialize_kv_cache``
then starts from that written mode. With adaptive verification, it first calls
``resolve_adaptive_cudagraph_mode``, which asserts ``has_full_cudagraphs()``.

VllmConfig accepts adaptive verification with FULL_AND_PIECEWISE. When the draft
attention supports only uniform single-token decode (or no full graphs at all),
resolve legitimately picks PIECEWISE. So the first call succeeds and the second
asserts. vLLM then stops at start-up on a configuration it accepted.

In 0.34 the profiling call is skipped while the extensible KV cache is on (the
default on CUDA). The configuration below turns it off, as
``--no-enable-extensible-kv-cache`` does, so the test runs the two-call sequence
that then happens.

Runs on CPU: the platform reports CUDA-graph support, and the attention
backends, KV cache tensors and block tables are stand-ins. The mode logic
(``initialize_kv_cache``, the adaptive verification checks, resolve) is vLLM's.
"""

import json
from contextlib import nullcontext
from types import SimpleNamespace
from unittest.mock import MagicMock

import pytest
import torch
from torch import nn

mrv2 = pytest.importorskip(
    "vllm.v1.worker.gpu.model_runner", reason="Model Runner V2 is not in this release"
)
adaptive_verification = pytest.importorskip(
    "vllm.v1.worker.gpu.spec_decode.adaptive_verification",
    reason="adaptive verification is not in this release",
)

from vllm.compilation.decorators import support_torch_compile  # noqa: E402
from vllm.config import (  # noqa: E402
    CacheConfig,
    CompilationConfig,
    CompilationMode,
    CUDAGraphMode,
    DeviceConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
    set_current_vllm_config,
)
from vllm.platforms import current_platform  # noqa: E402
from vllm.v1.attention.backend import AttentionCGSupport  # noqa: E402
from vllm.v1.kv_cache_interface import KVCacheConfig  # noqa: E402
from vllm.v1.worker.gpu import cudagraph_utils  # noqa: E402
from vllm.v1.worker.gpu.attn_utils import get_attn_cg_support  # noqa: E402
from vllm.v1.worker.gpu.spec_decode.eagle.speculator import (  # noqa: E402
    EagleSpeculator,
)

TARGET_LAYER = "model.layers.0.self_attn.attn"
DRAFT_LAYER = "draft_model.layers.0.self_attn.attn"
MAX_NUM_SEQS = 4
MAX_NUM_TOKENS = 64
MAX_MODEL_LEN = 256


@support_torch_compile
class _CompiledTarget(nn.Module):
    """A target model class with a torch.compile boundary; never called here."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.proj(input_ids)


def _attention_group(name: str, support: AttentionCGSupport, layer: str):
    """An attention group whose builder reports ``support`` and no varlen bound."""

    class Builder:
        @classmethod
        def get_cudagraph_support(cls, vllm_config, kv_cache_spec):
            return support

        @classmethod
        def get_varlen_cudagraph_max_query_len(cls, vllm_config, kv_cache_spec):
            return None

    class Backend:
        @staticmethod
        def supports_device_cpu_query_lens_mismatch() -> bool:
            return True

    Backend.__name__ = name
    return SimpleNamespace(
        backend=Backend,
        layer_names=[layer],
        kv_cache_spec=None,
        get_metadata_builder=lambda ubatch_id=0: Builder,
    )


@pytest.fixture
def cuda_graph_platform(monkeypatch):
    """The platform answers as CUDA does for static graphs; nothing is captured here."""
    monkeypatch.setattr(current_platform, "support_static_graph_mode", lambda: True)
    monkeypatch.setattr(
        current_platform,
        "get_static_graph_wrapper_cls",
        lambda: "vllm.compilation.cuda_graph.CUDAGraphWrapper",
    )
    monkeypatch.setattr(current_platform, "get_global_graph_pool", lambda: None)
    monkeypatch.setenv("VLLM_USE_BREAKABLE_CUDAGRAPH", "0")


def _vllm_config(tmp_path) -> VllmConfig:
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_attention_heads": 4,
                "num_key_value_heads": 4,
                "num_hidden_layers": 1,
                "vocab_size": 256,
                "max_position_embeddings": MAX_MODEL_LEN,
                "rms_norm_eps": 1e-6,
                "torch_dtype": "float32",
            }
        )
    )
    extra = {}
    if "enable_extensible_kv_cache" in CacheConfig.__dataclass_fields__:
        # --no-enable-extensible-kv-cache: profile_cudagraph_memory runs.
        extra["cache_config"] = CacheConfig(enable_extensible_kv_cache=False)
    return VllmConfig(
        model_config=ModelConfig(
            model=str(tmp_path),
            skip_tokenizer_init=True,
            dtype="float32",
            max_model_len=MAX_MODEL_LEN,
        ),
        compilation_config=CompilationConfig(
            mode=CompilationMode.VLLM_COMPILE,
            cudagraph_mode=CUDAGraphMode.FULL_AND_PIECEWISE,
            cudagraph_capture_sizes=[2, 4],
            max_cudagraph_capture_size=4,
        ),
        scheduler_config=SchedulerConfig.default_factory(
            max_num_seqs=MAX_NUM_SEQS,
            max_num_batched_tokens=MAX_NUM_TOKENS,
            max_model_len=MAX_MODEL_LEN,
        ),
        device_config=DeviceConfig(device="cpu"),
        **extra,
    )


def _runner(vllm_config: VllmConfig, speculator, decode_query_len: int):
    """The ``self`` that ``GPUModelRunner.initialize_kv_cache`` reads."""
    runner = mrv2.GPUModelRunner.__new__(mrv2.GPUModelRunner)
    with set_current_vllm_config(vllm_config):
        model = _CompiledTarget(vllm_config=vllm_config)
    model_state = MagicMock()
    model_state.get_additional_cg_support.return_value = (
        AttentionCGSupport.ALWAYS,
        None,
    )
    model_state.num_new_sampled_tokens_per_step = 1
    runner.__dict__.update(
        vllm_config=vllm_config,
        compilation_config=vllm_config.compilation_config,
        parallel_config=vllm_config.parallel_config,
        cache_config=vllm_config.cache_config,
        scheduler_config=vllm_config.scheduler_config,
        model_config=vllm_config.model_config,
        device=torch.device("cpu"),
        model=model,
        speculator=speculator,
        decode_query_len=decode_query_len,
        max_model_len=MAX_MODEL_LEN,
        max_num_reqs=MAX_NUM_SEQS,
        max_num_tokens=MAX_NUM_TOKENS,
        is_encoder_decoder=False,
        supports_mm_inputs=False,
        vocab_size=256,
        lora_capture_cases=None,
        pcp_manager=None,
        pcp_manager_cls=None,
        batch_sharder=None,
        aux_output_connector=None,
        dcp_size=1,
        dcp_rank=0,
        model_state=model_state,
        req_states=SimpleNamespace(num_speculative_steps=decode_query_len - 1),
        input_buffers=SimpleNamespace(query_start_loc=None),
        jit_warmup_registry=SimpleNamespace(activate=nullcontext),
    )
    return runner


def _eagle_speculator(num_speculative_tokens: int):
    """An EAGLE speculator whose draft layer is excluded from the target checks;
    its own CUDA graph managers are not what this test is about."""
    speculator = EagleSpeculator.__new__(EagleSpeculator)
    speculator.enable_adaptive_verification = True
    speculator.num_speculative_steps = num_speculative_tokens
    speculator.draft_attn_layer_names = {DRAFT_LAYER}
    speculator.set_attn = lambda *args, **kwargs: None
    speculator.init_cudagraph_manager = lambda cudagraph_mode: None
    return speculator


@pytest.mark.parametrize(
    "draft_cg_support",
    [AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE, AttentionCGSupport.NEVER],
)
def test_real_initialize_kv_cache_after_profiling_does_not_stop(
    tmp_path, monkeypatch, cuda_graph_platform, draft_cg_support
):
    num_speculative_tokens = 1
    vllm_config = _vllm_config(tmp_path)
    vllm_config.speculative_config = SimpleNamespace(
        num_speculative_tokens=num_speculative_tokens,
        enable_adaptive_verification=True,
        uses_dynamic_speculative_decoding=lambda: False,
    )
    # VllmConfig accepts this configuration.
    vllm_config._validate_adaptive_verification()

    # The target layer replays variable-length decode batches (as adaptive
    # verification requires of target layers); the draft layer, which the
    # adaptive verification checks skip, sets the minimum support.
    attn_groups = [
        [
            _attention_group("TargetBackend", AttentionCGSupport.ALWAYS, TARGET_LAYER),
            _attention_group("DraftBackend", draft_cg_support, DRAFT_LAYER),
        ]
    ]
    monkeypatch.setattr(
        mrv2,
        "init_attn_backend",
        lambda kv_cache_config, vllm_config, device, **kwargs: (
            attn_groups,
            get_attn_cg_support(attn_groups, vllm_config),
            [],
        ),
    )
    # KV cache plumbing, and the adaptive verification state (device buffers).
    monkeypatch.setattr(mrv2, "BlockTables", MagicMock())
    monkeypatch.setattr(mrv2, "init_kv_cache", lambda *args, **kwargs: {})
    monkeypatch.setattr(
        adaptive_verification, "AdaptiveVerificationManager", MagicMock()
    )
    monkeypatch.setattr(
        cudagraph_utils,
        "get_pp_group",
        lambda: SimpleNamespace(is_first_rank=True, is_last_rank=True),
    )

    runner = _runner(
        vllm_config,
        _eagle_speculator(num_speculative_tokens),
        decode_query_len=1 + num_speculative_tokens,
    )
    kv_cache_config = KVCacheConfig(
        num_blocks=MAX_NUM_SEQS, kv_cache_tensors=[], kv_cache_groups=[]
    )

    # Memory profiling: profile_cudagraph_memory ->
    # _init_minimal_kv_cache_for_profiling.
    runner.initialize_kv_cache(kv_cache_config, is_profiling=True)
    assert runner.adaptive_verification is not None
    profiled_mode = vllm_config.compilation_config.cudagraph_mode

    # The real KV cache: vLLM must not stop on the mode profiling wrote back.
    try:
        runner.initialize_kv_cache(kv_cache_config)
    except AssertionError as e:
        pytest.fail(
            "initialize_kv_cache stopped after memory profiling resolved the "
            f"accepted FULL_AND_PIECEWISE to {profiled_mode.name} "
            f"(draft attention support {draft_cg_support.name}): AssertionError {e}"
        )
    assert runner.cudagraph_manager is not None
    # capture_model times adaptive verification's steps on FULL graphs (set_cost_curves raises
    # "could not profile step costs" without them): it may stay on only where full graphs remain.
    final_mode = vllm_config.compilation_config.cudagraph_mode
    assert runner.adaptive_verification is None or final_mode.has_full_cudagraphs(), (
        f"adaptive verification left on under {final_mode.name}, which has no full CUDA graphs: "
        "capture_model will stop vLLM when it profiles step costs"
    )
