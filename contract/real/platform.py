"""A CUDA-like platform object, so vLLM's config-time code takes its CUDA branches on a CPU.

``vllm.platforms.cuda`` cannot be imported without a GPU (it loads ``vllm._C_stable_libtorch`` and
``pynvml`` at module level), so this subclasses the generic ``Platform`` and answers the few
questions the cudagraph code asks the way ``CudaPlatformBase`` does. It must be installed before
any vLLM module binds ``current_platform`` at import time; ``activate`` does that, imports the
modules the replay needs, and only then flips the enum to CUDA, because some import-time code on
CUDA calls ``torch.ops._C`` kernels that do not exist without ``vllm._C``
(``quantization/utils/w8a8_utils.py``). Every module holds this one object, so the flip is seen
everywhere.
"""

from __future__ import annotations

import importlib
import os
import sys

from contract.real import device, installed, simcuda


_ACTIVE = None


def _platform_class():
    from vllm.platforms.interface import DeviceCapability, Platform, PlatformEnum

    class SimCudaPlatform(Platform):
        """``platforms/cuda.py`` answers for the questions the cudagraph path asks."""

        _enum = PlatformEnum.UNSPECIFIED  # CUDA after the imports (see module docstring)
        device_name = "cuda"
        device_type = "cuda"
        dispatch_key = "CUDA"
        ray_device_key = "GPU"
        dist_backend = "gloo"
        device_control_env_var = "CUDA_VISIBLE_DEVICES"

        @classmethod
        def support_static_graph_mode(cls) -> bool:
            return True

        @classmethod
        def get_static_graph_wrapper_cls(cls) -> str:
            return "vllm.compilation.cuda_graph.CUDAGraphWrapper"

        @classmethod
        def support_hybrid_kv_cache(cls) -> bool:
            return True

        @classmethod
        def get_device_capability(cls, device_id: int = 0):
            return DeviceCapability(9, 0)

        @classmethod
        def is_pin_memory_available(cls) -> bool:
            return False

        @classmethod
        def num_compute_units(cls, device_id: int = 0) -> int:
            return 132  # UBatchWrapper's SM control reads it in __init__

        def graph_pool_handle(self):
            from contract.real.simcuda import SimPool

            return SimPool()

    return SimCudaPlatform, PlatformEnum


def activate(modules: tuple[str, ...]):
    """Install the platform, import ``modules`` (MRV1's by default), switch to CUDA; idempotent.
    Returns the platform."""
    global _ACTIVE
    if _ACTIVE is not None:
        return _ACTIVE
    os.environ["VLLM_TARGET_DEVICE"] = "cpu"  # no vllm._C: the simulated platform stands for CUDA
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout carries --json
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # vLLM's and torch's caches in this tool's cache folder, never the user's nor the temporary
    # folder; a warm model-info entry saves a subprocess importing the model class (about 8 s on CPU).
    os.environ["VLLM_CACHE_ROOT"] = str(installed.vllm_cache_root())
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(installed.cache_root() / "torchinductor")
    # Set explicitly: when unset, _maybe_enable_breakable_cudagraph turns it on for some
    # architectures (config/vllm.py), and every scenario sets its own value anyway.
    os.environ["VLLM_USE_BREAKABLE_CUDAGRAPH"] = "0"
    # The replay drives Model Runner V1, so the config it builds must select it
    # (VllmConfig.use_v2_model_runner, config/vllm.py); and `import vllm` must resolve vLLM's CPU
    # platform rather than probe NVML, which on a GPU host picks CudaPlatform and imports the
    # compiled vllm._C_stable_libtorch (platforms/cuda.py:23). The platform below replaces it.
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"
    os.environ["VLLM_TARGET_DEVICE"] = "cpu"
    import vllm.platforms as vllm_platforms

    cls, enum = _platform_class()
    platform = cls()
    vllm_platforms.current_platform = platform
    for name in modules:
        importlib.import_module(name)
    cls._enum = enum.CUDA
    stale = [
        name for name, module in list(sys.modules.items())
        if name.startswith("vllm") and isinstance(getattr(module, "__dict__", None), dict)
        and "current_platform" in module.__dict__
        and hasattr(module.__dict__["current_platform"], "is_cuda_alike")
        and module.__dict__["current_platform"] is not platform
    ]
    if stale:
        raise RuntimeError(f"vLLM modules hold another platform object: {', '.join(sorted(stale))}")
    if device.SELECTED == "cuda":
        device.install()
    else:
        simcuda.install()
    _ACTIVE = platform
    return platform
