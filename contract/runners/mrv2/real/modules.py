"""The vLLM modules whose code the MRV2 replay runs: imported (in this order) before the platform is
switched to CUDA, and the speculator package it builds speculators from (``spec_decode.py``)."""

MODULES = (
    "vllm.envs",
    "vllm.config",
    "vllm.forward_context",
    "vllm.compilation.monitor",
    "vllm.compilation.cuda_graph",
    "vllm.compilation.breakable_cudagraph",
    "vllm.compilation.backends",
    "vllm.compilation.decorators",
    "vllm.model_executor.offloader.base",
    "vllm.v1.attention.backend",
    "vllm.v1.worker.gpu.cudagraph_utils",
    "vllm.v1.worker.gpu.dp_utils",
    "vllm.v1.worker.gpu.model_runner",
)
SPECULATORS = "vllm.v1.worker.gpu.spec_decode"
