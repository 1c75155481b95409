"""A GPU host as vLLM's import sees it, on a CPU machine: put this folder on ``PYTHONPATH``.

- NVML sees a GPU: after vLLM's own ``vllm/platforms/__init__.py`` has run, its ``cuda`` detector
  answers what ``cuda_platform_plugin()`` answers when NVML counts a device, so platform
  auto-detection picks ``CudaPlatform`` (and imports ``vllm._C_stable_libtorch``) unless the
  platform is chosen explicitly;
- triton's CUDA driver is active (when triton is installed), as ``torch.cuda.is_available()``
  makes it on a GPU host, so ``vllm.triton_utils.HAS_TRITON`` is True and vLLM's import takes its
  triton branches.
"""

import importlib.abc
import importlib.util
import sys


class _NvmlSeesAGpu(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "vllm.platforms":
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_detect_cuda(module):
            exec_module(module)
            module.builtin_platform_plugins["cuda"] = lambda: "vllm.platforms.cuda.CudaPlatform"

        spec.loader.exec_module = exec_then_detect_cuda
        return spec


sys.meta_path.insert(0, _NvmlSeesAGpu())

try:
    from triton.backends import backends as _triton_backends
except Exception:  # noqa: BLE001 - no triton (or no usable one): nothing to emulate
    pass
else:
    if "nvidia" in _triton_backends:
        _triton_backends["nvidia"].driver.is_active = staticmethod(lambda: True)
