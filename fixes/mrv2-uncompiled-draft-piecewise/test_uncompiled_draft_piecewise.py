# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Every PIECEWISE draft prefill must reach a capturer in Model Runner V2.

``initialize_kv_cache`` keeps PIECEWISE in the resolved mode only when the
*target* can capture it: ``piecewise_capture_available`` is breakable CUDA
graphs or ``has_compiled_submodule(self.model)``. The resolved mode is then
handed unchanged to ``speculator.init_cudagraph_manager``, whose draft prefill
manager uses it. The prefill manager has no ``use_breakable_cg``, so
``run_pw_graph`` calls the raw draft model. If the draft model has no active
``@support_torch_compile`` submodule, nothing captures: every PIECEWISE draft
prefill runs eagerly, at capture and at run time, and nothing reports it.

This test runs vLLM's own ``initialize_kv_cache``, the EAGLE speculator's
``init_cudagraph_manager`` and ``_run_model``, and the CUDA graph manager's
capture loop and dispatch, on CPU with only CUDA graph capture faked.
"""

import json
from contextlib import contextmanager, nullcontext
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

HIDDEN = 8
MAX_NUM_SEQS = 4
MAX_NUM_TOKENS = 64
MAX_MODEL_LEN = 256
NUM_SPECULATIVE_TOKENS = 1
TARGET_LAYER = "model.layers.0.self_attn.attn"
DRAFT_LAYER = "draft_model.layers.0.self_attn.attn"


@support_torch_compile
class CompiledTarget(nn.Module):
    """The target model: a class with a torch.compile boundary (never called)."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        self.proj = nn.Linear(HIDDEN, HIDDEN)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.proj(input_ids)


class UncompiledDraftModel(nn.Module):
    """A draft model class without ``@support_torch_compile``, called as
    ``_run_model`` calls the draft model."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.eye(HIDDEN) * 0.5, requires_grad=False)

    def forward(self, input_ids, positions, hidden_states, inputs_embeds=None):
        return (hidden_states @ self.weight + 1) @ self.weight


class _Graphs:
    """Fake ``torch.cuda.CUDAGraph`` / ``torch.cuda.graph``: counts captures and
    replays."""

    def __init__(self) -> None:
        self.captures = 0
        self.replays = 0
        graphs = self

        class CUDAGraph:
            def replay(self) -> None:
                graphs.replays += 1

        self.CUDAGraph = CUDAGraph

    @contextmanager
    def graph(self, cuda_graph, pool=None, stream=None, **kwargs):
        self.captures += 1
        yield

    def events(self) -> int:
        return self.captures + self.replays


@pytest.fixture
def graphs(monkeypatch):
    """CUDA graph capture on CPU, a platform that reports static graphs, one
    pipeline rank."""
    graphs = _Graphs()
    pool = object()
    monkeypatch.setattr(current_platform, "support_static_graph_mode", lambda: True)
    monkeypatch.setattr(
        current_platform,
        "get_static_graph_wrapper_cls",
        lambda: "vllm.compilation.cuda_graph.CUDAGraphWrapper",
    )
    monkeypatch.setattr(current_platform, "get_global_graph_pool", lambda: pool)
    monkeypatch.setattr(current_platform, "graph_pool_handle", lambda: pool)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", graphs.CUDAGraph)
    monkeypatch.setattr(torch.cuda, "graph", graphs.graph)
    monkeypatch.setattr(
        cudagraph_utils,
        "get_pp_group",
        lambda: SimpleNamespace(is_first_rank=True, is_last_rank=True),
    )
    monkeypatch.setattr(
        cudagraph_utils,
        "graph_capture",
        lambda *args, **kwargs: nullcontext(SimpleNamespace(stream=None)),
    )
    monkeypatch.setattr(cudagraph_utils, "is_global_first_rank", lambda: False)
    if hasattr(cudagraph_utils, "current_stream"):
        monkeypatch.setattr(cudagraph_utils, "current_stream", lambda: None)
    monkeypatch.setenv("VLLM_USE_BREAKABLE_CUDAGRAPH", "0")
    return graphs


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
    vllm_config = VllmConfig(
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
    )
    # What the runner and the speculator read of an EAGLE speculative config.
    vllm_config.speculative_config = SimpleNamespace(
        num_speculative_tokens=NUM_SPECULATIVE_TOKENS,
        enable_adaptive_verification=False,
        uses_dynamic_speculative_decoding=lambda: False,
        num_speculative_tokens_per_batch_size=None,
    )
    return vllm_config


def _attention_group(layer: str):
    class Builder:
        @classmethod
        def get_cudagraph_support(cls, vllm_config, kv_cache_spec):
            return AttentionCGSupport.ALWAYS

    class Backend:
        pass

    return SimpleNamespace(
        backend=Backend,
        layer_names=[layer],
        kv_cache_spec=None,
        get_metadata_builder=lambda ubatch_id=0: Builder,
    )


def _eagle_speculator(vllm_config: VllmConfig) -> EagleSpeculator:
    """The EAGLE speculator as ``initialize_kv_cache`` and ``_run_model`` read
    it, holding an uncompiled draft model; its attention metadata is not built."""
    speculator = EagleSpeculator.__new__(EagleSpeculator)
    speculator.__dict__.update(
        vllm_config=vllm_config,
        speculative_config=vllm_config.speculative_config,
        device=torch.device("cpu"),
        model=UncompiledDraftModel(),
        num_speculative_steps=NUM_SPECULATIVE_TOKENS,
        enable_adaptive_verification=False,
        max_num_reqs=MAX_NUM_SEQS,
        max_num_tokens=MAX_NUM_TOKENS,
        draft_attn_layer_names={DRAFT_LAYER},
        supports_mm_inputs=False,
        pcp_manager=None,
        input_buffers=SimpleNamespace(
            input_ids=torch.zeros(MAX_NUM_TOKENS, dtype=torch.int32),
            positions=torch.zeros(MAX_NUM_TOKENS, dtype=torch.int64),
        ),
        hidden_states=torch.ones(MAX_NUM_TOKENS, HIDDEN),
        set_attn=lambda *args, **kwargs: None,
    )
    return speculator


def _runner(vllm_config: VllmConfig, speculator):
    """The ``self`` that ``GPUModelRunner.initialize_kv_cache`` reads."""
    with set_current_vllm_config(vllm_config):
        target = CompiledTarget(vllm_config=vllm_config)
    model_state = MagicMock()
    model_state.get_additional_cg_support.return_value = (
        AttentionCGSupport.ALWAYS,
        None,
    )
    model_state.num_new_sampled_tokens_per_step = 1
    runner = model_runner.GPUModelRunner.__new__(model_runner.GPUModelRunner)
    runner.__dict__.update(
        vllm_config=vllm_config,
        compilation_config=vllm_config.compilation_config,
        parallel_config=vllm_config.parallel_config,
        cache_config=vllm_config.cache_config,
        scheduler_config=vllm_config.scheduler_config,
        model_config=vllm_config.model_config,
        device=torch.device("cpu"),
        model=target,
        speculator=speculator,
        decode_query_len=1 + NUM_SPECULATIVE_TOKENS,
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
        req_states=SimpleNamespace(num_speculative_steps=NUM_SPECULATIVE_TOKENS),
        input_buffers=SimpleNamespace(query_start_loc=None),
        jit_warmup_registry=SimpleNamespace(activate=nullcontext),
    )
    return runner


def test_every_piecewise_draft_prefill_reaches_a_capturer(
    tmp_path, graphs, monkeypatch
):
    vllm_config = _vllm_config(tmp_path)
    attn_groups = [[_attention_group(TARGET_LAYER), _attention_group(DRAFT_LAYER)]]
    # KV cache plumbing: attention groups, block tables, KV tensors.
    monkeypatch.setattr(
        model_runner,
        "init_attn_backend",
        lambda kv_cache_config, vllm_config, device, **kwargs: (
            attn_groups,
            get_attn_cg_support(attn_groups, vllm_config),
            [],
        ),
    )
    monkeypatch.setattr(model_runner, "BlockTables", MagicMock())
    monkeypatch.setattr(model_runner, "init_kv_cache", lambda *args, **kwargs: {})

    speculator = _eagle_speculator(vllm_config)
    runner = _runner(vllm_config, speculator)
    with set_current_vllm_config(vllm_config):
        runner.initialize_kv_cache(
            KVCacheConfig(
                num_blocks=MAX_NUM_SEQS, kv_cache_tensors=[], kv_cache_groups=[]
            )
        )
        # The scenario: the compiled target keeps PIECEWISE.
        target_mode = vllm_config.compilation_config.cudagraph_mode
        assert target_mode == CUDAGraphMode.FULL_AND_PIECEWISE, target_mode
        manager = speculator.prefill_cudagraph_manager
        assert manager is not None and not manager.use_breakable_cg

        piecewise = []

        def run_draft(num_tokens, mode, phase, desc):
            # The draft prefill's model call (_prefill -> _run_model).
            before = graphs.events()
            speculator._run_model(num_tokens, None, None, None, mode)
            if mode == CUDAGraphMode.PIECEWISE:
                piecewise.append((phase, desc, graphs.events() - before))

        def create_forward_fn(desc, warmup):
            return lambda mode: run_draft(desc.num_tokens, mode, "capture", desc)

        # The draft prefill capture loop (SpeculatorCudaGraphManager.capture,
        # with the model call of its forward_fn).
        cudagraph_utils.CudaGraphManager.capture(manager, create_forward_fn)

        # propose: the draft prefill of a mixed batch of 3 tokens in 3 requests.
        mixed = manager.dispatch(
            num_reqs=3, num_tokens=3, uniform_token_count=None, num_active_loras=0
        )
        run_draft(max(3, mixed.num_tokens), mixed.cg_mode, "propose", mixed)

        # The draft's FULL graphs for uniform batches must stay.
        q = 1 + NUM_SPECULATIVE_TOKENS
        uniform = manager.dispatch(
            num_reqs=2, num_tokens=2 * q, uniform_token_count=q, num_active_loras=0
        )

    eager = [(phase, desc) for phase, desc, events in piecewise if events == 0]
    assert not eager, (
        "the target is compiled, so the resolved mode keeps PIECEWISE; the draft "
        "model has no compiled submodule and breakable CUDA graphs are off, so "
        f"these PIECEWISE draft prefills reached no capturer and ran eagerly: {eager}"
    )
    assert uniform.cg_mode == CUDAGraphMode.FULL, uniform
