"""The vLLM modules whose code the MRV2 replay runs: imported (in this order) before the platform is
switched to CUDA, and the speculator package it builds speculators from (``spec_decode.py``)."""

from contract.core.scenario import Speculator

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
    "vllm.v1.worker.gpu.attn_utils",
    "vllm.v1.worker.gpu.cudagraph_utils",
    "vllm.v1.worker.gpu.dp_utils",
    "vllm.v1.worker.gpu.lora_utils",
    "vllm.v1.worker.ubatch_utils",
    "vllm.v1.worker.gpu.ubatch_utils",
    "vllm.v1.worker.gpu.model_runner",
)
SPECULATORS = "vllm.v1.worker.gpu.spec_decode"


# The DFlash family's capture and propose store the target's hidden states as the draft model's
# context K/V through its attention layers and build DFlash-specific attention metadata
# (34:v1/worker/gpu/spec_decode/dflash/speculator.py:166-186,266-334,399-445), which a draft
# model without attention layers cannot stand in for.
NOT_REPLAYED_SPECULATOR = ("not replayed (MRV2 speculator {}: its capture and propose write the draft "
                           "model's context K/V through attention layers the stand-in model does not have)")
NOT_REPLAYED_WITHOUT_MODEL = "not replayed (MRV2 speculator without a draft model: needs the runner's request states)"


# Speculators the replay builds from the installed release (contract/runners/mrv2/real/spec_decode.py).
REPLAYED_SPECULATORS = frozenset({Speculator.EAGLE, Speculator.MULTI_MODULE_MTP, Speculator.STANDALONE_AR})
