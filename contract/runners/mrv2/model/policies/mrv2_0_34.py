"""The built-in policy ``mrv2_0_34``: ``DESCRIPTION``, and the rules it models.

``v1/worker/gpu/cudagraph_utils.py``: prefill token sizes and decode request sizes apart, decode
graphs looked up per query length (``_decode_descs``), breakable read from
``compilation_config.use_breakable_cudagraph``, no capture guard, ``BatchDescriptor`` without
``has_lora``. Standalone AR builds prefill and decode managers; draft decodes use the request grid.
``profile_cudagraph_memory`` captures nothing under the extensible KV cache, on by default on CUDA
(``v1/worker/gpu/model_runner.py:1123-1125``, ``config/vllm.py:3252-3254``).
"""

from contract.runners.mrv2.model.policy import Mrv2Policy

# Data rather than the docstring, which ``python -OO`` drops.
DESCRIPTION = "Model Runner V2 in vLLM 0.34.0 (no MRV1 left): the model is never wrapped; managers own FULL graphs."

POLICY = Mrv2Policy("mrv2_0_34", "0.34", description=DESCRIPTION,
                    extensible_kv_cache_skips_profiling=True)
