# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Every PIECEWISE dispatch must reach a capturer, even when resolve adds
PIECEWISE after the model's first forward.

``@support_torch_compile`` compiles the model at its first forward, which is the
memory profiling ``profile_run``. ``PiecewiseCompileInterpreter`` then decides
per piece, through ``wrap_with_cudagraph_if_needed``, whether to install a
``CUDAGraphWrapper(PIECEWISE)``. It decides on ``cudagraph_mode`` as it is at
that moment. The attention backends are only known later, when
``initialize_kv_cache`` resolves the mode, and resolve may then add PIECEWISE:

- FULL with attention support below ALWAYS becomes FULL_AND_PIECEWISE;
- FULL_DECODE_ONLY with attention support NEVER becomes PIECEWISE;
- adaptive verification (Model Runner V2) rewrites FULL to FULL_AND_PIECEWISE.

A model compiled under FULL or FULL_DECODE_ONLY has no inner PIECEWISE
wrapper. Its PIECEWISE dispatches then run eagerly, at capture and at run time,
and nothing reports it.

This test runs vLLM's own pieces on CPU, with only CUDA graph capture faked:
Dynamo compiles a tiny model through ``VllmBackend`` (pieces compiled with the
``eager`` backend), the runner resolves the mode (Model Runner V1's
``_check_and_update_cudagraph_mode``, Model Runner V2's ``initialize_kv_cache``),
and the dispatcher or CUDA graph manager captures and dispatches.
"""

import json
from contextlib import contextmanager, nullcontext
from types import SimpleNamespace
from unittest.mock import MagicMock

import pytest
import torch
from torch import nn

from vllm.compilation import cuda_graph
from vllm.compilation.cuda_graph import CUDAGraphWrapper
from vllm.compilation.decorators import support_torch_compile
from vllm.config import (
    CompilationConfig,
    CompilationMode,
    CUDAGraphMode,
    DeviceConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
    set_current_vllm_config,
)
from vllm.forward_context import BatchDescriptor, set_forward_context
from vllm.platforms import current_platform
from vllm.v1.attention.backend import AttentionCGSupport

HIDDEN = 8
MAX_NUM_SEQS = 4
MAX_NUM_TOKENS = 64
MAX_MODEL_LEN = 256
CAPTURE_SIZES = [2, 4]
ATTENTION_OP = "cudagraph_test::attention"


@torch.library.custom_op(ATTENTION_OP, mutates_args=("output",))
def _attention(query: torch.Tensor, output: torch.Tensor) -> None:
    output.copy_(query * 2)


@_attention.register_fake
def _(query, output):
    return None


@support_torch_compile
class TinyModel(nn.Module):
    """Two compiled pieces around an attention op that splits the graph."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.eye(HIDDEN) * 0.5, requires_grad=False)
        self.register_buffer(
            "attn_output", torch.zeros(MAX_NUM_TOKENS, HIDDEN), persistent=False
        )

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden = input_ids @ self.weight + 1
        output = self.attn_output[: hidden.shape[0]]
        torch.ops.cudagraph_test.attention(hidden, output)
        return output @ self.weight


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
    """CUDA graph capture on CPU, and a platform that reports static graphs."""
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
    monkeypatch.setattr(cuda_graph, "current_stream", lambda: None)
    monkeypatch.setattr(cuda_graph, "weak_ref_tensors", lambda tensors: tensors)
    monkeypatch.setenv("VLLM_USE_BREAKABLE_CUDAGRAPH", "0")
    monkeypatch.setenv("VLLM_DISABLE_COMPILE_CACHE", "1")
    monkeypatch.setenv("VLLM_USE_AOT_COMPILE", "0")
    torch.compiler.reset()
    yield graphs
    torch.compiler.reset()


def _vllm_config(tmp_path, cudagraph_mode: CUDAGraphMode) -> VllmConfig:
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
            cudagraph_mode=cudagraph_mode,
            cudagraph_capture_sizes=CAPTURE_SIZES,
            max_cudagraph_capture_size=max(CAPTURE_SIZES),
            # Compile the pieces without Inductor; the graph is split as usual.
            backend="eager",
        ),
        scheduler_config=SchedulerConfig.default_factory(
            max_num_seqs=MAX_NUM_SEQS,
            max_num_batched_tokens=MAX_NUM_TOKENS,
            max_model_len=MAX_MODEL_LEN,
        ),
        device_config=DeviceConfig(device="cpu"),
    )
    cc = vllm_config.compilation_config
    # The fusion passes need CUDA kernels.
    for name, value in vars(cc.pass_config).items():
        if isinstance(value, bool):
            setattr(cc.pass_config, name, False)
    # The default splitting ops (the attention ops) stay, so resolve sees
    # attention split as for a real model; the test's attention op joins them.
    assert cc.splitting_ops_contain_attention()
    cc.splitting_ops = [*cc.splitting_ops, ATTENTION_OP]
    return vllm_config


def _attention_backend(support: AttentionCGSupport):
    class Builder:
        @classmethod
        def get_cudagraph_support(cls, vllm_config, kv_cache_spec):
            return support

        @classmethod
        def get_varlen_cudagraph_max_query_len(cls, vllm_config, kv_cache_spec):
            return None

    class TestAttentionBackend:
        @staticmethod
        def get_builder_cls():
            return Builder

        @staticmethod
        def supports_device_cpu_query_lens_mismatch() -> bool:
            return True

    return TestAttentionBackend, Builder


def _profile_run(model, vllm_config: VllmConfig) -> None:
    """The first forward (``profile_run``, NONE): Dynamo compiles the model."""
    with set_forward_context(
        None,
        vllm_config,
        cudagraph_runtime_mode=CUDAGraphMode.NONE,
        num_tokens=MAX_NUM_TOKENS,
    ):
        model(input_ids=torch.ones(MAX_NUM_TOKENS, HIDDEN))


def _run(model, vllm_config, mode, num_tokens, batch_descriptor=None):
    with set_forward_context(
        None,
        vllm_config,
        cudagraph_runtime_mode=mode,
        num_tokens=num_tokens,
        batch_descriptor=batch_descriptor,
    ):
        return model(input_ids=torch.ones(num_tokens, HIDDEN))


# --- Model Runner V1 --------------------------------------------------------


def _mrv1_resolve_and_dispatch(tmp_path, graphs, cudagraph_mode, attn_cg_support):
    gpu_model_runner = pytest.importorskip(
        "vllm.v1.worker.gpu_model_runner",
        reason="Model Runner V1 is not in this release",
    )
    from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher

    vllm_config = _vllm_config(tmp_path, cudagraph_mode)
    with set_current_vllm_config(vllm_config):
        model = TinyModel(vllm_config=vllm_config)
        # GPUModelRunner.load_model: the FULL wrapper outside the model.
        model = CUDAGraphWrapper(model, vllm_config, runtime_mode=CUDAGraphMode.FULL)
        _profile_run(model, vllm_config)

        runner = gpu_model_runner.GPUModelRunner.__new__(
            gpu_model_runner.GPUModelRunner
        )
        runner.__dict__.update(
            vllm_config=vllm_config,
            compilation_config=vllm_config.compilation_config,
            parallel_config=vllm_config.parallel_config,
            speculative_config=None,
            uniform_decode_query_len=1,
            max_num_reqs=MAX_NUM_SEQS,
            kv_cache_config=SimpleNamespace(
                num_blocks=MAX_NUM_SEQS, has_mamba_layers=False
            ),
            cudagraph_dispatcher=CudagraphDispatcher(vllm_config),
        )
        backend, _ = _attention_backend(attn_cg_support)
        runner._check_and_update_cudagraph_mode(
            [{backend}], [SimpleNamespace(kv_cache_spec=None)]
        )
        resolved = vllm_config.compilation_config.cudagraph_mode
        dispatcher = runner.cudagraph_dispatcher

        # capture_model: every descriptor the dispatcher will hand out.
        piecewise = []
        for mode, descs in dispatcher.get_capture_descs():
            for desc in descs:
                _run(model, vllm_config, CUDAGraphMode.NONE, desc.num_tokens)
                before = graphs.events()
                _run(model, vllm_config, mode, desc.num_tokens, desc)
                if mode == CUDAGraphMode.PIECEWISE:
                    piecewise.append(("capture", desc, graphs.events() - before))

        # execute_model: a mixed batch of 3 tokens.
        mode, desc = dispatcher.dispatch(num_tokens=3, uniform_decode=False)
        if mode == CUDAGraphMode.PIECEWISE:
            before = graphs.events()
            _run(model, vllm_config, mode, desc.num_tokens, desc)
            piecewise.append(("execute_model", desc, graphs.events() - before))
    return resolved, piecewise


# --- Model Runner V2 --------------------------------------------------------


def _mrv2_runner(model_runner, vllm_config, model, speculator, decode_query_len):
    """The ``self`` that ``GPUModelRunner.initialize_kv_cache`` reads."""
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


def _mrv2_resolve_and_dispatch(
    tmp_path, graphs, monkeypatch, cudagraph_mode, attn_cg_support, adaptive
):
    model_runner = pytest.importorskip(
        "vllm.v1.worker.gpu.model_runner",
        reason="Model Runner V2 is not in this release",
    )
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.worker.gpu import cudagraph_utils
    from vllm.v1.worker.gpu.attn_utils import get_attn_cg_support

    vllm_config = _vllm_config(tmp_path, cudagraph_mode)
    speculator, decode_query_len = None, 1
    if adaptive:
        from vllm.v1.worker.gpu.spec_decode import adaptive_verification
        from vllm.v1.worker.gpu.spec_decode.eagle.speculator import EagleSpeculator

        speculator = EagleSpeculator.__new__(EagleSpeculator)
        speculator.enable_adaptive_verification = True
        speculator.num_speculative_steps = 1
        speculator.draft_attn_layer_names = set()
        speculator.set_attn = lambda *args, **kwargs: None
        speculator.init_cudagraph_manager = lambda mode: None
        decode_query_len = 2
        monkeypatch.setattr(
            adaptive_verification, "AdaptiveVerificationManager", MagicMock()
        )

    backend, builder = _attention_backend(attn_cg_support)
    attn_groups = [
        [
            SimpleNamespace(
                backend=backend,
                layer_names=["model.layers.0.self_attn.attn"],
                kv_cache_spec=None,
                get_metadata_builder=lambda ubatch_id=0: builder,
            )
        ]
    ]
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
    # One pipeline rank; capture needs no CUDA stream or rank-0 progress bar.
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

    with set_current_vllm_config(vllm_config):
        model = TinyModel(vllm_config=vllm_config)
        _profile_run(model, vllm_config)
        if adaptive:
            # What the runner reads of the speculative config; attached after
            # the compile, whose cache key would hash a real one.
            vllm_config.speculative_config = SimpleNamespace(
                num_speculative_tokens=1,
                enable_adaptive_verification=True,
                uses_dynamic_speculative_decoding=lambda: False,
            )
            # VllmConfig accepts it: adaptive verification with full graphs.
            vllm_config._validate_adaptive_verification()

        runner = _mrv2_runner(
            model_runner, vllm_config, model, speculator, decode_query_len
        )
        runner.initialize_kv_cache(
            KVCacheConfig(
                num_blocks=MAX_NUM_SEQS, kv_cache_tensors=[], kv_cache_groups=[]
            )
        )
        resolved = vllm_config.compilation_config.cudagraph_mode
        manager = runner.cudagraph_manager

        piecewise = []

        def create_forward_fn(desc, warmup):
            # ModelCudaGraphManager's forward_fn: PIECEWISE runs the model
            # through run_pw_graph under the descriptor's token count.
            def forward_fn(mode):
                n = desc.num_tokens
                if mode != CUDAGraphMode.PIECEWISE:
                    return _run(model, vllm_config, mode, n)
                before = graphs.events()
                with set_forward_context(
                    None,
                    vllm_config,
                    cudagraph_runtime_mode=mode,
                    num_tokens=n,
                    batch_descriptor=BatchDescriptor(num_tokens=n),
                ):
                    manager.run_pw_graph(model, {"input_ids": torch.ones(n, HIDDEN)})
                piecewise.append(("capture", desc, graphs.events() - before))

            return forward_fn

        # The capture loop ModelCudaGraphManager.capture runs with its own
        # forward_fn (inputs and attention metadata are not the point here).
        cudagraph_utils.CudaGraphManager.capture(manager, create_forward_fn)

        # execute_model: a mixed batch of 3 tokens in 3 requests.
        desc = manager.dispatch(
            num_reqs=3, num_tokens=3, uniform_token_count=None, num_active_loras=0
        )
        if desc.cg_mode == CUDAGraphMode.PIECEWISE:
            n = max(3, desc.num_tokens)
            before = graphs.events()
            with set_forward_context(
                None,
                vllm_config,
                cudagraph_runtime_mode=CUDAGraphMode.PIECEWISE,
                num_tokens=n,
                batch_descriptor=BatchDescriptor(num_tokens=n),
            ):
                manager.run_pw_graph(model, {"input_ids": torch.ones(n, HIDDEN)})
            piecewise.append(("execute_model", desc, graphs.events() - before))
    return resolved, piecewise


CASES = [
    # (runner, configured mode, minimum attention support, adaptive verification)
    ("MRV1", CUDAGraphMode.FULL, AttentionCGSupport.UNIFORM_BATCH, False),
    ("MRV1", CUDAGraphMode.FULL_DECODE_ONLY, AttentionCGSupport.NEVER, False),
    ("MRV2", CUDAGraphMode.FULL, AttentionCGSupport.UNIFORM_BATCH, False),
    ("MRV2", CUDAGraphMode.FULL_DECODE_ONLY, AttentionCGSupport.NEVER, False),
    ("MRV2", CUDAGraphMode.FULL, AttentionCGSupport.ALWAYS, True),
]


@pytest.mark.parametrize(
    "runner_name,cudagraph_mode,attn_cg_support,adaptive",
    CASES,
    ids=[
        f"{r}-{m.name}-{s.name}" + ("-adaptive_verification" if a else "")
        for r, m, s, a in CASES
    ],
)
def test_every_piecewise_dispatch_reaches_a_capturer(
    tmp_path,
    graphs,
    monkeypatch,
    runner_name,
    cudagraph_mode,
    attn_cg_support,
    adaptive,
):
    if runner_name == "MRV1":
        resolved, piecewise = _mrv1_resolve_and_dispatch(
            tmp_path, graphs, cudagraph_mode, attn_cg_support
        )
    else:
        resolved, piecewise = _mrv2_resolve_and_dispatch(
            tmp_path, graphs, monkeypatch, cudagraph_mode, attn_cg_support, adaptive
        )

    # The scenario: resolve added PIECEWISE after the first-forward compile.
    assert resolved.has_piecewise_cudagraphs(), resolved
    assert any(phase == "execute_model" for phase, _, _ in piecewise), piecewise

    eager = [(phase, desc) for phase, desc, events in piecewise if events == 0]
    assert not eager, (
        f"{runner_name}: the model was compiled under {cudagraph_mode.name}, "
        f"then resolve set {resolved.name}; these PIECEWISE dispatches reached "
        f"no CUDA graph capturer and ran eagerly: {eager}"
    )
