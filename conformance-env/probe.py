#!/usr/bin/env python3
"""Run vLLM's real CUDA-graph dispatch code on a CPU-only machine.

Usage:  DEST/bin/python conformance-env/probe.py [--only a,b,...]

DEST is a venv made by `cudagraph-contract env make VERSION --dir DEST` (vLLM 0.29.0 or 0.30.0,
installed --no-deps on CPU torch).  Sections a..i print what vLLM's own code
does; nothing here re-implements vLLM logic.  The only things replaced are the
CUDA device layer (see `SimCuda`) and the platform object (`SimCudaPlatform`).
Exit status 0 when every section ran, 1 otherwise.
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import gc
import importlib
import os
import sys
import textwrap
import time
import traceback
import types

T_START = time.time()
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "1")
os.environ["VLLM_USE_BREAKABLE_CUDAGRAPH"] = "0"  # explicit: never auto-enabled

# ---------------------------------------------------------------------------
# 0. Platform: must be installed before any vllm module that does
#    `from vllm.platforms import current_platform` is imported (they bind the
#    object at import time).  vllm.platforms.cuda itself is not importable on
#    CPU (it imports vllm._C_stable_libtorch and pynvml at module level), so we
#    subclass the generic Platform and give it the CUDA enum + the two CUDA
#    facts the config code consults (static graph support, wrapper class).
# ---------------------------------------------------------------------------
import torch  # noqa: E402
import vllm  # noqa: E402
import vllm.platforms as vllm_platforms  # noqa: E402
from vllm.platforms.interface import DeviceCapability, Platform, PlatformEnum  # noqa: E402

VERSION = vllm.__version__
_PLATFORM_WAS_RESOLVED = vllm_platforms._current_platform is not None


class SimPool:
    """Stand-in for a CUDA graph memory-pool handle."""

    _n = 0

    def __init__(self):
        SimPool._n += 1
        self.id = SimPool._n

    def __repr__(self):
        return f"SimPool#{self.id}"


class SimCudaPlatform(Platform):
    # UNSPECIFIED while vLLM modules are imported (with CUDA, import-time code
    # such as quantization/utils/w8a8_utils.py calls torch.ops._C kernels that
    # do not exist without vllm._C); flipped to CUDA by activate_cuda() after
    # the imports.  Every module holds this same object, so the flip is seen
    # everywhere.
    _enum = PlatformEnum.UNSPECIFIED
    device_name = "cuda"
    device_type = "cuda"
    dispatch_key = "CUDA"
    ray_device_key = "GPU"
    dist_backend = "gloo"
    device_control_env_var = "CUDA_VISIBLE_DEVICES"

    @classmethod
    def support_static_graph_mode(cls) -> bool:  # CudaPlatformBase: True
        return True

    @classmethod
    def get_static_graph_wrapper_cls(cls) -> str:  # CudaPlatformBase value
        return "vllm.compilation.cuda_graph.CUDAGraphWrapper"

    @classmethod
    def support_hybrid_kv_cache(cls) -> bool:  # CudaPlatformBase: True
        return True

    @classmethod
    def get_device_capability(cls, device_id: int = 0):
        return DeviceCapability(9, 0)

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        return False

    @classmethod
    def num_compute_units(cls, device_id: int = 0) -> int:  # UBatchWrapper SM control
        return 132

    def graph_pool_handle(self):  # real: torch.cuda.graph_pool_handle()
        return SimPool()


vllm_platforms.current_platform = SimCudaPlatform()

PREIMPORT = [
    "vllm.envs", "vllm.config", "vllm.forward_context", "vllm.compilation.monitor",
    "vllm.compilation.cuda_graph", "vllm.compilation.breakable_cudagraph",
    "vllm.compilation.backends", "vllm.compilation.decorators",
    "vllm.model_executor.offloader.base", "vllm.v1.attention.backend",
    "vllm.v1.cudagraph_dispatcher", "vllm.v1.worker.gpu_ubatch_wrapper",
    "vllm.v1.spec_decode.llm_base_proposer", "vllm.v1.spec_decode.eagle",
]


def activate_cuda():
    for m in PREIMPORT:
        importlib.import_module(m)
    SimCudaPlatform._enum = PlatformEnum.CUDA
    stale = sorted(n for n, m in list(sys.modules.items())
                   if n.startswith("vllm") and isinstance(getattr(m, "__dict__", None), dict)
                   and isinstance(m.__dict__.get("current_platform"), Platform)
                   and m.__dict__["current_platform"] is not vllm_platforms.current_platform)
    return stale

# ---------------------------------------------------------------------------
# Simulated CUDA graph layer (records events; depth = open captures).
# ---------------------------------------------------------------------------


class SimCuda:
    events: list = []
    depth = 0
    _gid = 0

    @classmethod
    def reset(cls):
        cls.events = []
        cls.depth = 0


class SimGraph:
    def __init__(self, *a, **k):
        SimCuda._gid += 1
        self.gid = SimCuda._gid
        self.captured = False

    def capture_begin(self, pool=None, *a, **k):
        SimCuda.depth += 1
        SimCuda.events.append(("begin", self.gid, SimCuda.depth))

    def capture_end(self):
        SimCuda.events.append(("end", self.gid, SimCuda.depth))
        SimCuda.depth -= 1
        self.captured = True

    def replay(self):
        SimCuda.events.append(("replay", self.gid, SimCuda.depth))

    def reset(self):
        pass


class sim_graph_ctx:  # replaces torch.cuda.graph(cuda_graph, pool=, stream=, ...)
    def __init__(self, cuda_graph, pool=None, stream=None, capture_error_mode="global"):
        self.g = cuda_graph

    def __enter__(self):
        self.g.capture_begin()
        return self.g

    def __exit__(self, *exc):
        self.g.capture_end()
        return False


class SimStream:
    def __init__(self, *a, **k):
        pass


_SIM_INSTALLED: list[str] = []


def install_sim_cuda():
    """The smallest patch set found for capture/replay of the real wrappers."""
    import vllm.compilation.breakable_cudagraph as bcg
    import vllm.compilation.cuda_graph as cg

    ident = lambda x: x  # noqa: E731
    torch.cuda.CUDAGraph = SimGraph
    torch.cuda.graph = sim_graph_ctx
    torch.cuda.Stream = SimStream  # only UBatchWrapper.__init__ needs this
    torch.accelerator.empty_cache = lambda: None
    torch.accelerator.current_device_index = lambda: 0  # UBatchWrapper SM control
    cg.current_stream = lambda: None
    cg.weak_ref_tensors = ident
    bcg.weak_ref_tensor = ident
    bcg.weak_ref_tensors = ident
    _SIM_INSTALLED[:] = [
        "torch.cuda.CUDAGraph", "torch.cuda.graph", "torch.cuda.Stream (UBatchWrapper ctor)",
        "torch.accelerator.empty_cache",
        "torch.accelerator.current_device_index (UBatchWrapper ctor)", "vllm.compilation.cuda_graph.current_stream",
        "vllm.compilation.cuda_graph.weak_ref_tensors",
        "vllm.compilation.breakable_cudagraph.weak_ref_tensor(s)",
        "platform.graph_pool_handle + num_compute_units (SimCudaPlatform)",
    ]


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------


def hdr(s):
    print("\n" + "=" * 78 + f"\n[{s}]  (vLLM {VERSION}, t={time.time() - T_START:.1f}s)\n" + "=" * 78)


RESULTS: dict[str, str] = {}


def section(key):
    def deco(fn):
        def run():
            hdr(f"{key}. {fn.__doc__.strip().splitlines()[0]}")
            try:
                fn()
                RESULTS[key] = "ok"
            except Exception:
                traceback.print_exc()
                RESULTS[key] = "FAILED"
            finally:
                reset_global_state()

        run.key = key
        return run

    return deco


def set_breakable(on: bool):
    """VLLM_USE_BREAKABLE_CUDAGRAPH is read through vllm.envs.__getattr__, which is
    functools.cache-wrapped only after envs.enable_envs_cache() (engine start-up).
    disable_envs_cache() unwraps it, so os.environ is re-read on every access."""
    import vllm.envs as envs

    os.environ["VLLM_USE_BREAKABLE_CUDAGRAPH"] = "1" if on else "0"
    envs.disable_envs_cache()


def reset_global_state():
    """Everything process-global the wrappers/config touch."""
    import vllm.compilation.breakable_cudagraph as bcg
    import vllm.compilation.cuda_graph as cg
    import vllm.compilation.monitor as mon
    import vllm.envs as envs
    import vllm.forward_context as fc

    fc._forward_context = None  # set_forward_context restores it, but be safe
    mon.set_cudagraph_capturing_enabled(True)  # module default
    cg.CUDAGraphWrapper.clear_all_graphs()
    bcg.BreakableCUDAGraphWrapper.clear_all_graphs()
    cg.CUDAGraphWrapper._all_instances.clear()
    bcg.BreakableCUDAGraphWrapper._all_instances.clear()
    type(vllm_platforms.current_platform)._global_graph_pool = None
    set_breakable(False)
    envs.disable_envs_cache()
    SimCuda.reset()
    gc.collect()


MODES = None  # filled after import


TINY_MODEL_CONFIG_JSON = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
    "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 4,
    "num_hidden_layers": 2, "vocab_size": 256, "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6, "torch_dtype": "float32", "tie_word_embeddings": False,
}
_MODEL_CONFIG = None


def model_config():
    """A real ModelConfig from a local config.json only (no weights, no tokenizer,
    no network).  VllmConfig needs a model_config for _set_cudagraph_sizes (else
    capture sizes are forced to []) and for its ubatching branch."""
    global _MODEL_CONFIG
    if _MODEL_CONFIG is None:
        import json
        import tempfile

        from vllm.config import ModelConfig

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        d = tempfile.mkdtemp(prefix="tiny-llama-config-")
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(TINY_MODEL_CONFIG_JSON, f)
        t = time.time()
        _MODEL_CONFIG = ModelConfig(model=d, skip_tokenizer_init=True, dtype="float32", max_model_len=256)
        print(f"(ModelConfig for {_MODEL_CONFIG.architecture} from {d}/config.json built in {time.time() - t:.1f}s)")
    return _MODEL_CONFIG


def build_config(mode, comp_mode="VLLM_COMPILE", splitting_ops="default", breakable=False,
                 ubatch=False, sizes=(2, 4), max_size=4, max_num_seqs=4, with_model=True):
    """A real VllmConfig built under the CUDA-like platform."""
    import copy

    from vllm.config import (CompilationConfig, CompilationMode, DeviceConfig, ParallelConfig,
                             SchedulerConfig, VllmConfig)

    set_breakable(breakable)
    kw = dict(mode=getattr(CompilationMode, comp_mode), cudagraph_mode=mode,
              cudagraph_capture_sizes=list(sizes), max_cudagraph_capture_size=max_size)
    if splitting_ops != "default":
        kw["splitting_ops"] = splitting_ops
    cc = CompilationConfig(**kw)
    pkw = dict(enable_dbo=True, all2all_backend="deepep_low_latency") if ubatch else {}
    pc = ParallelConfig(**pkw)
    sc = SchedulerConfig.default_factory(max_num_seqs=max_num_seqs, max_num_batched_tokens=64,
                                         max_model_len=256)
    mc = copy.deepcopy(model_config()) if with_model else None
    return VllmConfig(model_config=mc, compilation_config=cc, parallel_config=pc,
                      scheduler_config=sc, device_config=DeviceConfig(device="cuda"))


def attention_ops():
    from vllm.config.compilation import CompilationConfig

    return list(CompilationConfig._attention_ops)


class Model(torch.nn.Module):
    """Raw model stand-in: counts eager calls."""

    def __init__(self, name="model"):
        super().__init__()
        self.name = name
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        SimCuda.events.append(("call", self.name, SimCuda.depth))
        return x + 1


def stack_of(obj):
    from vllm.compilation.breakable_cudagraph import BreakableCUDAGraphWrapper
    from vllm.compilation.cuda_graph import CUDAGraphWrapper
    from vllm.v1.worker.gpu_ubatch_wrapper import UBatchWrapper

    out = []
    while True:
        if isinstance(obj, CUDAGraphWrapper):
            out.append(f"CUDAGraphWrapper({obj.runtime_mode.name})")
        elif isinstance(obj, BreakableCUDAGraphWrapper):
            if "runtime_mode" not in obj.__dict__:  # 0.29.0: no such parameter
                out.append("Breakable(match-any; no runtime_mode param)")
            else:
                rm = obj.__dict__["runtime_mode"]
                out.append(f"Breakable({'match-any' if rm is None else rm.name})")
        elif isinstance(obj, UBatchWrapper):
            sib = obj.cudagraph_wrapper
            out.append("UBatchWrapper(sibling=" + (f"CUDAGraphWrapper({sib.runtime_mode.name})" if sib else "None") + ")")
        else:
            out.append(getattr(obj, "name", type(obj).__name__))
            return " -> ".join(out)
        obj = obj.__dict__["runnable"]


def dispatch_run(vc, model, steps, num_tokens=4):
    """Run `model` under set_forward_context for each runtime mode in `steps`."""
    from vllm.forward_context import BatchDescriptor, set_forward_context

    x = torch.zeros(num_tokens)
    for m in steps:
        SimCuda.events.append(("dispatch", m.name, 0))
        with set_forward_context(None, vc, cudagraph_runtime_mode=m,
                                 batch_descriptor=BatchDescriptor(num_tokens=num_tokens)):
            model(x)
    return list(SimCuda.events)


def bd(b):
    """Short BatchDescriptor text: BD(num_tokens,num_reqs[,U][,lora=n])."""
    t = f"BD({b.num_tokens},{b.num_reqs}" + (",U" if b.uniform else "")
    return t + (f",lora={b.num_active_loras}" if getattr(b, "has_lora", False) else "") + ")"


def show_events(ev):
    for e in ev:
        if e[0] == "dispatch":
            print(f"    -- dispatch {e[1]}")
        else:
            print(f"       {e[0]:<7} {e[1]!s:<10} depth={e[2]}")


# ---------------------------------------------------------------------------
# Sections
# ---------------------------------------------------------------------------


@section("a")
def sec_a():
    """Real VllmConfig post-init normalisation under a CUDA-like platform."""
    from vllm.config import CUDAGraphMode

    print(f"platform: {type(vllm_platforms.current_platform).__name__} "
          f"(resolved before install: {_PLATFORM_WAS_RESOLVED}); "
          f"is_cuda_alike={vllm_platforms.current_platform.is_cuda_alike()} "
          f"support_static_graph_mode={vllm_platforms.current_platform.support_static_graph_mode()}")
    att = attention_ops()
    print(f"CompilationConfig._attention_ops: {len(att)} ops")
    sops = {"None": "default", "att": att, "[]": []}
    fmt = "{:<19} {:<12} {:<5} {:<3} {:<3} -> {:<19} {:<12} {:<10} {}"
    print(fmt.format("cudagraph_mode", "comp", "split", "B", "U", "post cudagraph_mode",
                     "post comp", "splitting", "capture_sizes / max"))
    for mode in ["NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"]:
        for comp in ["NONE", "VLLM_COMPILE"]:
            for sname, sval in sops.items():
                for B in (False, True):
                    for U in (False, True):
                        if U and (sname != "None"):
                            continue
                        try:
                            vc = build_config(mode, comp, sval, B, U)
                            c = vc.compilation_config
                            so = c.splitting_ops
                            so_s = ("all-att" if so and set(att) <= set(so) else str(so)) + (
                                f"+{len(so) - len(att)}" if so and len(so) > len(att) else "")
                            res = (c.cudagraph_mode.name, c.mode.name, so_s,
                                   f"{c.cudagraph_capture_sizes}/{c.max_cudagraph_capture_size}")
                        except Exception as e:  # report the real error
                            res = ("!" + type(e).__name__, str(e).splitlines()[0][:60], "", "")
                        print(fmt.format(mode, comp, sname, int(B), int(U), *res))
    # which code paths ran: confirm without_piecewise() usage by the normaliser
    import inspect

    from vllm.config.vllm import VllmConfig

    norm = getattr(VllmConfig, "_normalize_piecewise_cudagraph_mode", None)
    print("VllmConfig._normalize_piecewise_cudagraph_mode exists:", norm is not None,
          "| uses without_piecewise():",
          "without_piecewise" in inspect.getsource(VllmConfig.__post_init__ if norm is None else norm))
    print("CUDAGraphMode.without_piecewise exists:", hasattr(CUDAGraphMode, "without_piecewise"))


@section("b")
def sec_b():
    """CompilationConfig.resolve_cudagraph_mode_and_sizes (real)."""
    import inspect

    from vllm.config import CompilationConfig
    from vllm.v1.attention.backend import AttentionCGSupport

    print("signature:", inspect.signature(CompilationConfig.resolve_cudagraph_mode_and_sizes))
    att = attention_ops()
    fmt = "{:<19} {:<12} {:<5} {:<1} {:<27} q={} -> {:<19} sizes"
    for comp, sops, B in [("VLLM_COMPILE", "default", False), ("NONE", "default", True),
                          ("VLLM_COMPILE", [], False), ("NONE", att, True)]:
        sname = "att" if sops == att else str(sops) if sops != "default" else "None"
        for mode in ["NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"]:
            for sup in AttentionCGSupport:
                for q in (1, 2):
                    try:
                        vc = build_config(mode, comp, sops, B)
                        l_mode = vc.compilation_config.cudagraph_mode
                        r = vc.compilation_config.resolve_cudagraph_mode_and_sizes(
                            sup, "SIM_ATTN", uniform_decode_query_len=q,
                            use_v2_model_runner=False, kv_cache_config=None,
                            max_num_reqs=4, is_profiling=False)
                        out = f"{l_mode.name}->{r.name}"
                        sz = vc.compilation_config.cudagraph_capture_sizes
                    except Exception as e:
                        out, sz = f"!{type(e).__name__}: {str(e).splitlines()[0][:50]}", ""
                    print(fmt.format(mode, comp, sname, int(B), sup.name, q, out) + f" {sz}")


@section("c")
def sec_c():
    """Real CudagraphDispatcher: initialize_cudagraph_keys + dispatch."""
    import inspect

    from vllm.config import CUDAGraphMode as M
    from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher

    print("__init__", inspect.signature(CudagraphDispatcher.__init__))
    print("initialize_cudagraph_keys", inspect.signature(CudagraphDispatcher.initialize_cudagraph_keys))
    print("dispatch", inspect.signature(CudagraphDispatcher.dispatch))
    for mode, comp, B in [("NONE", "NONE", False), ("PIECEWISE", "VLLM_COMPILE", False),
                          ("FULL", "NONE", False), ("FULL_DECODE_ONLY", "NONE", False),
                          ("FULL_AND_PIECEWISE", "VLLM_COMPILE", False),
                          ("FULL_AND_PIECEWISE", "NONE", True), ("PIECEWISE", "NONE", True)]:
        for q in (1, 2):
            vc = build_config(mode, comp, "default", B)
            r = vc.compilation_config.cudagraph_mode
            print(f"\n  L/R-mode {r.name} comp={comp} B={int(B)} q={q}")
            try:
                d = CudagraphDispatcher(vc)
            except AssertionError as e:
                print("   __init__ AssertionError:", str(e).splitlines()[0][:100])
                continue
            d.initialize_cudagraph_keys(r, q)
            print("   keys:", {k.name: sorted(map(bd, v)) for k, v in d.cudagraph_keys.items()})
            for n, uni in [(1, False), (2, True), (3, False), (4, True), (5, False)]:
                out = [d.dispatch(n, uniform_decode=uni)]
                out.append(d.dispatch(n, uniform_decode=uni, invalid_modes={M.FULL}))
                out.append(d.dispatch(n, uniform_decode=uni, valid_modes={M.NONE}))
                print(f"   n={n} uniform={int(uni)}: all->" + " | invalid{FULL}->".join(
                    f"{m.name} {bd(b)}" for m, b in out[:2]) + f" | valid{{NONE}}->{out[2][0].name} {bd(out[2][1])}")
            print("   get_capture_descs:", [(m.name, [bd(b) for b in ds]) for m, ds in d.get_capture_descs()])
    print("\n  __init__ assert: config built with B=1 (F&P kept, compile NONE), then B switched off:")
    vc = build_config("FULL_AND_PIECEWISE", "NONE", "default", True)
    set_breakable(False)
    try:
        CudagraphDispatcher(vc)
        print("   no assertion")
    except AssertionError as e:
        print("   AssertionError:", str(e).splitlines()[0][:120])


@section("d")
def sec_d():
    """Drafter mode mapping: SpecDecodeBaseProposer.initialize_cudagraph_keys unbound."""
    import inspect

    from vllm.config import CUDAGraphMode as M
    from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    fn = SpecDecodeBaseProposer.initialize_cudagraph_keys
    print("defined in:", fn.__qualname__, inspect.getsourcefile(fn).split("site-packages/")[-1])
    from vllm.v1.spec_decode.eagle import EagleProposer

    print("EagleProposer.initialize_cudagraph_keys is base:", EagleProposer.initialize_cudagraph_keys is fn)
    B = True  # breakable so that PIECEWISE is accepted by the drafter dispatcher without compilation
    for enforce_eager in (False, True):
        for r in ["NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"]:
            vc = build_config("FULL_AND_PIECEWISE", "NONE", "default", B)
            disp = CudagraphDispatcher(vc)
            stand_in = types.SimpleNamespace(
                speculative_config=types.SimpleNamespace(enforce_eager=enforce_eager),
                cudagraph_dispatcher=disp)
            fn(stand_in, M[r])
            print(f"  enforce_eager={int(enforce_eager)} target R-mode {r:<19} -> drafter dispatcher mode "
                  f"{disp.cudagraph_mode.name:<9} keys={ {k.name: len(v) for k, v in disp.cudagraph_keys.items()} } "
                  f"dispatch(4)={disp.dispatch(4)[0].name} dispatch(4,valid={{NONE}})={disp.dispatch(4, valid_modes={M.NONE})[0].name}")


@section("e")
def sec_e():
    """Simulated CUDA layer: real CUDAGraphWrapper / BreakableCUDAGraphWrapper / UBatchWrapper."""
    import inspect

    from vllm.compilation.breakable_cudagraph import BreakableCUDAGraphWrapper
    from vllm.compilation.cuda_graph import CUDAGraphWrapper
    from vllm.config import CUDAGraphMode as M
    from vllm.v1.worker.gpu_ubatch_wrapper import UBatchWrapper

    install_sim_cuda()
    print("patched:", ", ".join(_SIM_INSTALLED))
    print("Breakable __init__", inspect.signature(BreakableCUDAGraphWrapper.__init__))
    has_rm = "runtime_mode" in inspect.signature(BreakableCUDAGraphWrapper.__init__).parameters
    vc = build_config("FULL_AND_PIECEWISE", "NONE", "default", breakable=True)
    seq = [M.FULL, M.FULL, M.PIECEWISE, M.PIECEWISE, M.NONE]

    print("\n  1) CUDAGraphWrapper(FULL) -> model   dispatches", [m.name for m in seq])
    m = Model()
    w = CUDAGraphWrapper(m, vc, runtime_mode=M.FULL)
    show_events(dispatch_run(vc, w, seq))
    print("     unwrap() is model:", w.unwrap() is m)
    reset_global_state()

    if has_rm:
        set_breakable(True)
        print("\n  2) CUDAGraphWrapper(FULL) -> Breakable(PIECEWISE) -> model")
        m = Model()
        w = CUDAGraphWrapper(BreakableCUDAGraphWrapper(m, vc, runtime_mode=M.PIECEWISE), vc, runtime_mode=M.FULL)
        print("     stack:", stack_of(w))
        show_events(dispatch_run(vc, w, seq))
        print("     unwrap() is model:", w.unwrap() is m, "| model calls:", m.calls)
        reset_global_state()

    set_breakable(True)
    print("\n  3) CUDAGraphWrapper(FULL) -> Breakable(match-any) -> model  (double capture)")
    m = Model()
    inner = BreakableCUDAGraphWrapper(m, vc)
    w = CUDAGraphWrapper(inner, vc, runtime_mode=M.FULL)
    print("     stack:", stack_of(w))
    ev = dispatch_run(vc, w, seq)
    show_events(ev)
    print("     max depth:", max(e[2] for e in ev if e[0] == "begin"),
          "| inner entries:", list(inner.entries), "| unwrap() is model:", w.unwrap() is m)
    reset_global_state()

    set_breakable(True)
    print("\n  4) Breakable(match-any) -> model alone (0.29 load_model target stack)")
    m = Model()
    w = BreakableCUDAGraphWrapper(m, vc)
    show_events(dispatch_run(vc, w, seq))
    reset_global_state()

    print("\n  5) UBatchWrapper(FULL) -> model (no ubatch_slices: non-ubatched path)")
    vcu = build_config("FULL_AND_PIECEWISE", "VLLM_COMPILE", "default", ubatch=True)
    m = Model()
    w = UBatchWrapper(m, vcu, M.FULL, torch.device("cpu"))
    print("     stack:", stack_of(w))
    show_events(dispatch_run(vcu, w, seq))
    print("     unwrap() is model:", w.unwrap() is m, "| sibling entries:",
          list(w.cudagraph_wrapper.concrete_cudagraph_entries))
    reset_global_state()

    print("\n  6) capture refused when monitor flag is False")
    from vllm.compilation.monitor import set_cudagraph_capturing_enabled

    m = Model()
    w = CUDAGraphWrapper(m, vc, runtime_mode=M.FULL)
    set_cudagraph_capturing_enabled(False)
    try:
        dispatch_run(vc, w, [M.FULL])
        print("     no error?!")
    except RuntimeError as e:
        print("     RuntimeError:", e, "| entry left with cudagraph None:",
              [(bd.num_tokens, en.cudagraph) for bd, en in w.concrete_cudagraph_entries.items()])


def load_model_block(runner_path=None):
    """The statements of GPUModelRunner.load_model from
    `cudagraph_mode = self.compilation_config.cudagraph_mode` to the end, as a function."""
    import importlib.util

    spec = importlib.util.find_spec("vllm.v1.worker.gpu_model_runner")
    path = runner_path or spec.origin
    tree = ast.parse(open(path).read(), path)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "GPUModelRunner")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "load_model")
    start = next(i for i, s in enumerate(fn.body)
                 if isinstance(s, ast.Assign) and ast.unparse(s) == "cudagraph_mode = self.compilation_config.cudagraph_mode")
    body = fn.body[start:]
    f = ast.FunctionDef(name="_load_model_wrapping", args=ast.arguments(
        posonlyargs=[], args=[ast.arg(arg="self")], vararg=None, kwonlyargs=[], kw_defaults=[],
        kwarg=None, defaults=[]), body=body, decorator_list=[], returns=None, type_params=[])
    mod = ast.Module(body=[f], type_ignores=[])
    ast.fix_missing_locations(mod)
    names = [n for n in ast.walk(mod) if isinstance(n, ast.Name)]
    stored = {n.id for n in names if isinstance(n.ctx, ast.Store)}
    free = sorted({n.id for n in names if isinstance(n.ctx, ast.Load)} - stored - {"self"}
                  - set(dir(__import__("builtins"))))
    return mod, free, path, fn.body[start].lineno, body[-1].end_lineno


@section("f")
def sec_f():
    """vLLM's own load_model wrapping block, exec'd on a stand-in runner."""
    from vllm.compilation.breakable_cudagraph import BreakableCUDAGraphWrapper, is_breakable_cudagraph_enabled
    from vllm.compilation.cuda_graph import CUDAGraphWrapper
    from vllm.config import CUDAGraphMode
    from vllm.model_executor.offloader.base import get_offloader
    from vllm.v1.worker.gpu_ubatch_wrapper import UBatchWrapper

    install_sim_cuda()
    mod, free, path, l0, l1 = load_model_block()
    print(f"block: {path.split('site-packages/')[-1]}:{l0}-{l1}; free names: {free}")
    print(textwrap.indent(ast.unparse(mod), "    | "))
    ns = dict(CUDAGraphMode=CUDAGraphMode, CUDAGraphWrapper=CUDAGraphWrapper,
              BreakableCUDAGraphWrapper=BreakableCUDAGraphWrapper, UBatchWrapper=UBatchWrapper,
              is_breakable_cudagraph_enabled=is_breakable_cudagraph_enabled, get_offloader=get_offloader)
    missing = [n for n in free if n not in ns]
    assert not missing, f"free names not provided: {missing}"
    exec(compile(mod, path, "exec"), ns)
    wrap = ns["_load_model_wrapping"]
    fmt = "  {:<19} {:<12} B={} U={} -> L-mode {:<19} target: {:<62} drafter: {}"
    for mode in ["NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"]:
        for comp, B, U in [("VLLM_COMPILE", False, False), ("NONE", True, False), ("NONE", False, False),
                           ("VLLM_COMPILE", False, True), ("NONE", True, True)]:
            vc = build_config(mode, comp, "default", B, U)
            runner = types.SimpleNamespace(
                model=Model("target"), drafter=types.SimpleNamespace(model=Model("draft")),
                compilation_config=vc.compilation_config, parallel_config=vc.parallel_config,
                vllm_config=vc, device=torch.device("cpu"))
            wrap(runner)
            print(fmt.format(mode, comp, int(B), int(U), vc.compilation_config.cudagraph_mode.name,
                             stack_of(runner.model), stack_of(runner.drafter.model)))
            reset_global_state()
    # and run the resulting B-on F&P stack through the real dispatcher's modes
    vc = build_config("FULL_AND_PIECEWISE", "NONE", "default", True)
    runner = types.SimpleNamespace(model=Model("target"), drafter=types.SimpleNamespace(model=Model("draft")),
                                   compilation_config=vc.compilation_config, parallel_config=vc.parallel_config,
                                   vllm_config=vc, device=torch.device("cpu"))
    wrap(runner)
    print("\n  run of", stack_of(runner.model), "with FULL, PIECEWISE, FULL, PIECEWISE:")
    M = CUDAGraphMode
    show_events(dispatch_run(vc, runner.model, [M.FULL, M.PIECEWISE, M.FULL, M.PIECEWISE]))


@section("g")
def sec_g():
    """Inner PIECEWISE capturer decision + do_not_compile."""
    import inspect

    from vllm.compilation import backends
    from vllm.compilation.decorators import support_torch_compile
    from vllm.config import set_current_vllm_config

    install_sim_cuda()
    fn = backends.wrap_with_cudagraph_if_needed
    print("wrap_with_cudagraph_if_needed", inspect.signature(fn))

    class DummyPiecewiseBackend:
        name = "piecewise-backend"

        def __call__(self, *a, **k):
            return a[0]

    for mode in ["NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"]:
        for comp, B in [("VLLM_COMPILE", False), ("NONE", True)]:
            vc = build_config(mode, comp, "default", B)
            out = fn(DummyPiecewiseBackend(), vc, vc.compilation_config, is_first_graph=True, is_last_graph=False)
            desc = stack_of(out)
            if hasattr(out, "cudagraph_options"):
                desc += f" opts={out.cudagraph_options}"
            print(f"  {mode:<19} comp={comp:<12} B={int(B)} L={vc.compilation_config.cudagraph_mode.name:<19} "
                  f"inductor_partition={vc.compilation_config.use_inductor_graph_partition} -> {desc}")
            reset_global_state()

    @support_torch_compile(dynamic_arg_dims={"x": 0})
    class TinyModel(torch.nn.Module):
        def __init__(self, *, vllm_config, prefix: str = ""):
            super().__init__()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2

    for comp in ["NONE", "STOCK_TORCH_COMPILE", "DYNAMO_TRACE_ONCE", "VLLM_COMPILE"]:
        try:
            vc = build_config("PIECEWISE" if comp == "VLLM_COMPILE" else "NONE", comp)
            with set_current_vllm_config(vc):
                tm = TinyModel(vllm_config=vc)
            print(f"  @support_torch_compile, compilation mode {comp:<20}: do_not_compile={tm.do_not_compile}")
        except Exception as e:
            print(f"  compilation mode {comp}: {type(e).__name__}: {str(e).splitlines()[0][:100]}")
        reset_global_state()


@section("h")
def sec_h():
    """Capture-legality flag and process-global state reset."""
    import vllm.compilation.monitor as mon
    import vllm.envs as envs
    import vllm.forward_context as fc

    print("initial cudagraph_capturing_enabled:", mon.cudagraph_capturing_enabled)
    mon.validate_cudagraph_capturing_enabled()
    print("validate with True: no error")
    mon.set_cudagraph_capturing_enabled(False)
    try:
        mon.validate_cudagraph_capturing_enabled()
    except RuntimeError as e:
        print("validate with False: RuntimeError:", e)
    mon.set_cudagraph_capturing_enabled(True)
    print("forward context available outside set_forward_context:", fc.is_forward_context_available())
    envs.enable_envs_cache()
    os.environ["VLLM_USE_BREAKABLE_CUDAGRAPH"] = "1"
    from vllm.compilation.breakable_cudagraph import is_breakable_cudagraph_enabled

    print("after enable_envs_cache(), env=1 -> is_breakable_cudagraph_enabled():", is_breakable_cudagraph_enabled(),
          "(cached)")
    envs.disable_envs_cache()
    print("after disable_envs_cache() -> ", is_breakable_cudagraph_enabled())
    print("reset_global_state() in this file: forward_context._forward_context=None, "
          "set_cudagraph_capturing_enabled(True), {CUDAGraphWrapper,BreakableCUDAGraphWrapper}"
          ".clear_all_graphs() + _all_instances.clear(), platform _global_graph_pool=None, "
          "envs.disable_envs_cache()")


@section("i")
def sec_i():
    """CUDAGraphMode members/methods vs spec section 1 truth table."""
    from vllm.config import CUDAGraphMode as M

    print("members:", [(m.name, m.value) for m in M])
    expect = {  # spec section 1 (0.33.0)
        "NONE": "F NONE NONE NONE T F F F F NONE T F",
        "PIECEWISE": "F PIECEWISE PIECEWISE PIECEWISE F T F T F NONE T T",
        "FULL": "F FULL FULL FULL F F T F T FULL T T",
        "FULL_DECODE_ONLY": "T FULL NONE FULL T F T F T FULL_DECODE_ONLY F T",
        "FULL_AND_PIECEWISE": "T FULL PIECEWISE FULL F T T T T FULL_DECODE_ONLY F T",
    }
    b = lambda v: "T" if v else "F"  # noqa: E731

    def call(m, meth, *a):
        f = getattr(m, meth, None)
        if f is None:
            return "<absent>"
        try:
            r = f(*a)
        except AssertionError:
            return "AssertErr"
        return r.name if isinstance(r, M) else b(r)

    mismatches = 0
    for m in M:
        row = [call(m, "separate_routine"), call(m, "decode_mode"), call(m, "mixed_mode"),
               call(m, "max_cudagraph_mode"), call(m, "has_mode", M.NONE), call(m, "has_mode", M.PIECEWISE),
               call(m, "has_mode", M.FULL), call(m, "requires_piecewise_compilation"),
               call(m, "has_full_cudagraphs"), call(m, "without_piecewise"),
               call(m, "is_valid_runtime_mode"), b(bool(m))]
        pw = call(m, "has_piecewise_cudagraphs")
        got = " ".join(row)
        ok = got == expect[m.name] and pw == row[7]
        exp = expect[m.name].split()
        only_absent = not ok and all(g == e or g == "<absent>" for g, e in zip(row, exp))
        mismatches += not ok and not only_absent
        extra = [call(m, "has_mode", x) for x in (M.FULL_DECODE_ONLY, M.FULL_AND_PIECEWISE)]
        print(f"  {m.name:<19} {got}  has_piecewise_cudagraphs={pw} has_mode(FDO|F&P)={extra} str={str(m)} "
              + ("== spec" if ok else "== spec except absent methods" if only_absent else "!= spec: " + expect[m.name]))
    print("valid_runtime_modes:", sorted(x.name for x in M.valid_runtime_modes()))
    print("methods:", sorted(n for n, v in vars(M).items() if callable(v) and not n.startswith("_"))
          )
    print("rows differing from spec section 1 (beyond absent methods):", mismatches)


SECTIONS = [sec_a, sec_b, sec_c, sec_d, sec_e, sec_f, sec_g, sec_h, sec_i]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="", help="comma-separated section letters")
    args = ap.parse_args()
    t0 = time.time()
    stale = activate_cuda()
    print(f"modules holding a platform object other than SimCudaPlatform: {stale or 'none'}")
    print(f"vLLM {VERSION} ({vllm.__file__}), torch {torch.__version__}, python {sys.version.split()[0]}; "
          f"vllm import {t0 - T_START:.1f}s, wrapper/dispatcher modules {time.time() - t0:.1f}s")
    only = set(filter(None, args.only.split(",")))
    for s in SECTIONS:
        if not only or s.key in only:
            s()
    print("\nSUMMARY", VERSION, RESULTS, f"total {time.time() - T_START:.1f}s")
    sys.exit(0 if all(v == "ok" for v in RESULTS.values()) else 1)


if __name__ == "__main__":
    main()
