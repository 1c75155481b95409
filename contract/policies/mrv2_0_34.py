"""Model Runner V2 in vLLM 0.34.0 (no MRV1 left): the model is never wrapped; managers own FULL graphs.

``v1/worker/gpu/cudagraph_utils.py``: prefill token sizes and decode request sizes apart, decode
graphs looked up per query length (``_decode_descs``), breakable read from
``compilation_config.use_breakable_cudagraph``, no capture guard, ``BatchDescriptor`` without
``has_lora``. Standalone AR builds prefill and decode managers; draft decodes use the request grid.
"""

from contract.mrv2.policy import Mrv2Policy

POLICY = Mrv2Policy("mrv2_0_34", "0.34", description=__doc__.strip().splitlines()[0])
