"""The built-in policy ``mrv2_0_33``: ``DESCRIPTION``, and the rules it models.

``v1/worker/gpu/cudagraph_utils.py``: one list of capture sizes for token-keyed and decode graphs
(decode sizes ``round_up(n, q)``), candidates grouped by the smallest covering FULL and PIECEWISE
sizes, breakable read from the environment. Standalone AR draft models have no CUDA graphs.
"""

from contract.runners.mrv2.model.policy import Mrv2Policy

# Data rather than the docstring, which ``python -OO`` drops.
DESCRIPTION = "Model Runner V2 in vLLM 0.33.0 (the default runner there): the model is never wrapped; managers own FULL graphs."

POLICY = Mrv2Policy("mrv2_0_33", "0.33", description=DESCRIPTION)
