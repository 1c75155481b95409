# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Model Runner V1: a breakable drafter under a FULL target is never captured.

With ``VLLM_USE_BREAKABLE_CUDAGRAPH=1`` and ``cudagraph_mode=FULL``,
``GPUModelRunner.load_model`` wraps the drafter model in
``BreakableCUDAGraphWrapper`` and the drafter's dispatcher maps the FULL
target mode to PIECEWISE (``SpecDecodeBaseProposer.initialize_cudagraph_keys``),
but ``_dummy_run`` runs the drafter with CUDA graphs during capture only when
the target captures PIECEWISE. Under FULL no drafter graph is captured in
``capture_model``; the first drafter forward while serving tries to capture
with capturing disabled and vLLM stops with "CUDA graph capturing detected at
an inappropriate time".

The release's own ``load_model``, ``_dummy_run``, ``capture_model``,
``_check_and_update_cudagraph_mode``, resolve, dispatchers, proposer and
wrappers run on CPU; only the CUDA graph layer (``torch.cuda.CUDAGraph``,
``torch.cuda.graph``, streams, weak refs) and what ``GPUModelRunner.__init__``
sets up on a GPU (weights, KV cache, attention metadata, parallel groups) are
stand-ins.
"""

from __future__ import annotations

import contextlib
import types
from collections import Counter
from unittest.mock import patch

import numpy as np
import pytest
import torch

# Model Runner V1 is gone from vLLM 0.34 on: nothing to test there.
gmr = pytest.importorskip(
    "vllm.v1.worker.gpu_model_runner",
    reason="Model Runner V1 (v1/worker/gpu_model_runner.py) is not in this vLLM",
)

import vllm.compilation.breakable_cudagraph as breakable_cudagraph  # noqa: E402
import vllm.compilation.cuda_graph as cuda_graph  # noqa: E402
import vllm.envs as envs  # noqa: E402
from vllm.compilation.breakable_cudagraph import BreakableCUDAGraphWrapper  # noqa: E402
from vllm.compilation.cuda_graph import CUDAGraphWrapper  # noqa: E402
from vllm.compilation.monitor import set_cudagraph_capturing_enabled  # noqa: E402
from vllm.config import (  # noqa: E402
    CompilationConfig,
    CompilationMode,
    CUDAGraphMode,
    ParallelConfig,
    SchedulerConfig,
)
from vllm.forward_context import get_forward_context  # noqa: E402
from vllm.platforms import current_platform  # noqa: E402
from vllm.v1.attention.backend import AttentionCGSupport  # noqa: E402
from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher  # noqa: E402
from vllm.v1.spec_decode.eagle import EagleProposer  # noqa: E402

CAPTURE_SIZES = [2, 4]
MAX_NUM_SEQS = 4
MAX_NUM_TOKENS = 16
HIDDEN = 8

# ---------------------------------------------------------------------------
# Simulated CUDA graphs: captures and replays are counted, nothing is
# recorded. Everything above torch.cuda is vLLM's own code.
# ---------------------------------------------------------------------------


# (phase, role, runtime mode, whether a graph capture was open) per forward.
FORWARDS: list[tuple[str, str, CUDAGraphMode, bool]] = []
# Phases in which a capture began while another was open.
NESTED: list[str] = []
PHASE = ["load_model"]


class FakeCUDAGraph:
    """torch.cuda.CUDAGraph (used directly by BreakableCUDAGraphCapture)."""

    open_captures = 0
    replays = 0

    def __init__(self, *args, **kwargs):
        self.captured = False

    def capture_begin(self, *args, **kwargs):
        if FakeCUDAGraph.open_captures:
            NESTED.append(PHASE[0])  # CUDA refuses a capture inside a capture
        FakeCUDAGraph.open_captures += 1

    def capture_end(self):
        FakeCUDAGraph.open_captures -= 1
        self.captured = True

    def replay(self):
        assert self.captured, "replay of a graph that was never captured"
        FakeCUDAGraph.replays += 1


class fake_graph:  # noqa: N801 - stands for the torch.cuda.graph class
    """torch.cuda.graph (used by CUDAGraphWrapper and UBatchWrapper)."""

    def __init__(self, cuda_graph, pool=None, stream=None, **kwargs):
        self.cuda_graph = cuda_graph

    def __enter__(self):
        self.cuda_graph.capture_begin()
        return self.cuda_graph

    def __exit__(self, *exc):
        self.cuda_graph.capture_end()
        return False


class FakeStream:
    def __init__(self, *args, **kwargs):
        pass

    def wait_stream(self, other):
        pass


@pytest.fixture(autouse=True)
def simulated_cuda_graphs(monkeypatch):
    FakeCUDAGraph.open_captures = 0
    FakeCUDAGraph.replays = 0
    FORWARDS.clear()
    NESTED.clear()
    PHASE[0] = "load_model"
    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeCUDAGraph)
    monkeypatch.setattr(torch.cuda, "graph", fake_graph)
    monkeypatch.setattr(torch.cuda, "Stream", FakeStream)
    monkeypatch.setattr(cuda_graph, "current_stream", lambda: None)
    monkeypatch.setattr(cuda_graph, "weak_ref_tensors", lambda x: x)
    monkeypatch.setattr(breakable_cudagraph, "weak_ref_tensors", lambda x: x)
    monkeypatch.setattr(torch.accelerator, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.accelerator, "empty_cache", lambda *a: None)
    monkeypatch.setattr(torch.accelerator, "get_memory_info", lambda *a: (0, 0))
    monkeypatch.setattr(type(current_platform), "_global_graph_pool", object())
    monkeypatch.setattr(
        type(current_platform),
        "get_static_graph_wrapper_cls",
        classmethod(lambda cls: "vllm.compilation.cuda_graph.CUDAGraphWrapper"),
    )
    monkeypatch.setattr("vllm.utils.torch_utils.PIN_MEMORY", False)
    # UBatchWrapper reserves SMs for micro-batched runs from the device.
    import vllm.v1.worker.gpu_ubatch_wrapper as ubatch_wrapper
    import vllm.v1.worker.ubatch_utils as ubatch_utils

    sm_control = (
        getattr(ubatch_wrapper, "SMControlContextManager", None)
        or ubatch_utils.SMControlContextManager
    )
    monkeypatch.setattr(sm_control, "__init__", lambda self, *a, **kw: None)
    # The single-rank parallel state and workspace a GPU worker sets up.
    monkeypatch.setattr(gmr, "graph_capture", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(gmr, "is_global_first_rank", lambda: False)
    monkeypatch.setattr(gmr, "lock_workspace", lambda: None)
    monkeypatch.setattr(
        gmr, "get_pp_group", lambda: types.SimpleNamespace(is_first_rank=True)
    )
    monkeypatch.setattr(
        "vllm.distributed.parallel_state.get_world_group",
        lambda: types.SimpleNamespace(local_rank=0),
    )
    yield
    set_cudagraph_capturing_enabled(True)
    CUDAGraphWrapper.clear_all_graphs()
    BreakableCUDAGraphWrapper.clear_all_graphs()


def set_breakable(monkeypatch, enabled: bool):
    monkeypatch.setenv("VLLM_USE_BREAKABLE_CUDAGRAPH", "1" if enabled else "0")
    envs.disable_envs_cache()


# ---------------------------------------------------------------------------
# Stand-ins for what GPUModelRunner.__init__ and load_model build on a GPU.
# ---------------------------------------------------------------------------


class TinyModel(torch.nn.Module):
    """The raw model: records the runtime mode of each forward it computes
    and whether a capture was open. A replayed graph does not call it."""

    def __init__(self, role: str, vllm_config=None):
        super().__init__()
        self.role = role
        self.input_ids = torch.zeros(MAX_NUM_TOKENS, HIDDEN)

    def forward(self, input_ids=None, positions=None, **kwargs):
        return self.compute(input_ids)

    def compute(self, x):
        mode = get_forward_context().cudagraph_runtime_mode
        capturing = FakeCUDAGraph.open_captures > 0
        FORWARDS.append((PHASE[0], self.role, mode, capturing))
        return x * 2


def violations() -> list[str]:
    """Every non-NONE dispatch is captured or replayed by exactly one
    capturing layer: a model forward under PIECEWISE or FULL with no capture
    open ran eagerly; a capture begun inside another means two capturers."""
    found = Counter(
        f"{role} {mode.name} forward in {phase} reached no capturer (ran eagerly)"
        for phase, role, mode, capturing in FORWARDS
        if mode != CUDAGraphMode.NONE and not capturing
    )
    found.update(f"nested capture in {phase} (two capturers)" for phase in NESTED)
    return [f"{text} x{count}" for text, count in found.items()]


def make_vllm_config(
    cudagraph_mode: str,
    *,
    compilation_mode: CompilationMode = CompilationMode.NONE,
    splitting_ops: list[str] | None = None,
    num_speculative_tokens: int = 0,
    ubatching: bool = False,
):
    """The parts of a post-init VllmConfig the runner reads, built from
    vLLM's own sub-configs as test_cudagraph_dispatch.py's
    _create_vllm_config does (VllmConfig.__post_init__ needs a model)."""
    compilation_config = CompilationConfig(
        mode=compilation_mode,
        cudagraph_mode=cudagraph_mode,
        splitting_ops=splitting_ops,
        cudagraph_capture_sizes=CAPTURE_SIZES,
        max_cudagraph_capture_size=max(CAPTURE_SIZES),
    )
    speculative_config = None
    if num_speculative_tokens:
        speculative_config = types.SimpleNamespace(
            method="eagle",
            num_speculative_tokens=num_speculative_tokens,
            enforce_eager=False,
            use_eagle=lambda: True,
            uses_draft_model=lambda: False,
            uses_extract_hidden_states=lambda: False,
            uses_dynamic_speculative_decoding=lambda: False,
        )
    # use_ubatching = enable_dbo or ubatch_size > 1 (config/parallel.py).
    parallel_config = (
        ParallelConfig(enable_dbo=True, all2all_backend="deepep_low_latency")
        if ubatching
        else ParallelConfig()
    )
    # As VllmConfig.__post_init__ does: default splitting ops (all attention
    # ops under VLLM_COMPILE, [] otherwise), and an explicit [] drops
    # piecewise graphs from VLLM_COMPILE modes.
    compilation_config.set_splitting_ops_for_v1(
        all2all_backend=parallel_config.all2all_backend,
        data_parallel_size=parallel_config.data_parallel_size,
    )
    return types.SimpleNamespace(
        compilation_config=compilation_config,
        scheduler_config=SchedulerConfig(
            max_num_seqs=MAX_NUM_SEQS,
            max_num_batched_tokens=64,
            max_model_len=256,
            is_encoder_decoder=False,
        ),
        parallel_config=parallel_config,
        model_config=types.SimpleNamespace(
            model="tiny", multimodal_config=None, is_encoder_decoder=False
        ),
        speculative_config=speculative_config,
        lora_config=None,
        profiler_config=types.SimpleNamespace(capture_torch_profiler=False),
        observability_config=types.SimpleNamespace(cudagraph_metrics=False),
        use_cumem_cudagraph_pool=False,
        num_speculative_tokens=num_speculative_tokens,
    )


def make_drafter(vllm_config, runner, model):
    """An EagleProposer holding what its cudagraph path reads; its
    load_model (called by GPUModelRunner.load_model) sets the draft model."""
    drafter = EagleProposer.__new__(EagleProposer)
    spec = vllm_config.speculative_config
    drafter.__dict__.update(
        vllm_config=vllm_config,
        speculative_config=spec,
        cudagraph_dispatcher=CudagraphDispatcher(vllm_config),
        dp_rank=0,
        num_speculative_tokens=spec.num_speculative_tokens,
        parallel_drafting=False,
        supports_mm_inputs=False,
        pass_hidden_states_to_model=False,
        _draft_attn_layer_names=set(),
        uses_mrope=False,
        uses_xdrope_dim=0,
        draft_uses_xdrope_dim=0,
        positions=runner.positions,
        input_ids=model.input_ids,
        load_model=lambda target_model: setattr(drafter, "model", model),
    )
    return drafter


class _NoMemoryProfiler:
    consumed_memory = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def make_runner(vllm_config, model_cls=TinyModel):
    """A GPUModelRunner whose methods are the release's own, with the state
    __init__ sets that they read, after its load_model ran."""
    runner = gmr.GPUModelRunner.__new__(gmr.GPUModelRunner)
    runner.__dict__.update(
        vllm_config=vllm_config,
        model_config=vllm_config.model_config,
        compilation_config=vllm_config.compilation_config,
        parallel_config=vllm_config.parallel_config,
        scheduler_config=vllm_config.scheduler_config,
        speculative_config=vllm_config.speculative_config,
        lora_config=None,
        load_config=types.SimpleNamespace(use_tqdm_on_load=False),
        jit_warmup_registry=types.SimpleNamespace(activate=contextlib.nullcontext),
        device=torch.device("cpu"),
        max_num_reqs=MAX_NUM_SEQS,
        max_num_tokens=MAX_NUM_TOKENS,
        max_model_len=256,
        uniform_decode_query_len=1 + vllm_config.num_speculative_tokens,
        cudagraph_dispatcher=CudagraphDispatcher(vllm_config),
        dcp_world_size=1,
        supports_mm_inputs=False,
        enable_prompt_embeds=False,
        uses_mrope=False,
        uses_xdrope_dim=0,
        use_aux_hidden_state_outputs=False,
        is_pooling_model=False,
        intermediate_tensors=None,
        encoder_cudagraph_manager=None,
        eplb_state=None,
        eep_eplb_suppressed=False,
        kv_cache_config=None,
        arange_np=np.arange(256),
        positions=torch.zeros(MAX_NUM_TOKENS, dtype=torch.int64),
        is_padding=torch.zeros(MAX_NUM_TOKENS, dtype=torch.bool),
        optimistic_seq_lens_cpu=torch.zeros(MAX_NUM_SEQS, dtype=torch.int32),
        seq_lens=torch.zeros(MAX_NUM_SEQS, dtype=torch.int32),
        query_pos=types.SimpleNamespace(np=np.zeros(MAX_NUM_TOKENS, dtype=np.int64)),
        query_start_loc=types.SimpleNamespace(
            np=np.zeros(MAX_NUM_SEQS + 1, dtype=np.int32), copy_to_gpu=lambda *a: None
        ),
        input_batch=types.SimpleNamespace(
            block_table=types.SimpleNamespace(commit_block_table=lambda n: None)
        ),
        # No KV cache and no attention layers: no per-batch metadata to build.
        _get_slot_mappings=lambda **kwargs: (None, None),
        synchronize_input_prep=contextlib.nullcontext,
        _build_attention_metadata=lambda **kwargs: (None, None),
        _init_model_kwargs=lambda *args, **kwargs: {},
        _register_layerwise_nvtx_hooks=lambda: None,
        _maybe_init_encoder_cudagraph_manager=lambda: None,
    )
    model = model_cls("target", vllm_config)
    runner.input_ids = types.SimpleNamespace(gpu=model.input_ids)
    if vllm_config.speculative_config is not None:
        runner.drafter = make_drafter(
            vllm_config, runner, model_cls("drafter", vllm_config)
        )
    loader = types.SimpleNamespace(load_model=lambda **kwargs: model)
    with (
        patch.object(gmr, "DeviceMemoryProfiler", _NoMemoryProfiler),
        patch.object(gmr, "get_model_loader", lambda load_config: loader),
    ):
        runner.load_model()
    return runner


def profile_run(runner):
    """The first forward of target and drafter (GPUModelRunner.profile_run)."""
    PHASE[0] = "profile_run"
    runner._dummy_run(runner.max_num_tokens, is_profile=True)


def capture_model(runner):
    PHASE[0] = "capture_model"
    runner.capture_model()


def resolve(runner, support=AttentionCGSupport.ALWAYS):
    """initialize_kv_cache -> initialize_attn_backend ->
    _check_and_update_cudagraph_mode, with one attention backend whose
    metadata builder reports ``support``."""

    class Builder:
        @classmethod
        def get_cudagraph_support(cls, vllm_config, kv_cache_spec):
            return support

    backend = type(f"Backend_{support.name}", (), {"get_builder_cls": lambda: Builder})
    runner._check_and_update_cudagraph_mode(
        [{backend}], [types.SimpleNamespace(kv_cache_spec=None)]
    )


def serve(runner, sizes=(1, 3)):
    """Serving steps after capture_model, dispatched by the runner's and the
    drafter's own code (_dummy_run outside a capture dispatches as
    execute_model does, then runs the drafter as propose does)."""
    PHASE[0] = "serving"
    for num_tokens in sizes:
        runner._dummy_run(num_tokens)


def test_no_drafter_capture_after_capture_model(monkeypatch):
    set_breakable(monkeypatch, True)
    # Breakable CUDA graphs force compilation mode NONE
    # (VllmConfig._maybe_enable_breakable_cudagraph).
    vllm_config = make_vllm_config("FULL", num_speculative_tokens=1)
    runner = make_runner(vllm_config)
    assert isinstance(runner.drafter.model, BreakableCUDAGraphWrapper)
    profile_run(runner)
    resolve(runner)
    assert vllm_config.compilation_config.cudagraph_mode == CUDAGraphMode.FULL
    capture_model(runner)

    # vLLM does not stop on a configuration VllmConfig accepted: no capture
    # after capture_model, and every PIECEWISE or FULL dispatch is captured
    # or replayed by a capturing layer.
    try:
        serve(runner)
    except RuntimeError as e:
        pytest.fail(f"a forward after capture_model tried to capture: {e}")
    assert not violations(), violations()
    assert FakeCUDAGraph.replays > 0, "serving replayed no graph"
