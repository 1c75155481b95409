"""Model Runner V2 (vLLM 0.33.0): the model is never wrapped; a ``CudaGraphManager`` owns FULL graphs.

``v1/worker/gpu/model_runner.py:385-410`` loads the model unwrapped. After resolve, the manager
captures FULL graphs itself around a NONE-mode forward, and routes PIECEWISE through a match-any
``BreakableCUDAGraphWrapper`` runner when breakable is on and the resolved mode has piecewise
graphs (``use_breakable_cg``, ``v1/worker/gpu/cudagraph_utils.py:194-199``, ``:570-583``), else
through the compiled model's inner PIECEWISE wrappers. Resolve passes
``piecewise_capture_available = breakable or has_compiled_submodule(model)`` (spec §9).
"""

from contract.policy import LoadContext
from contract.scenario import Runner
from contract.stack import Stacks

RUNNER = Runner.MRV2


def load_model(ctx: LoadContext) -> Stacks:
    return Stacks(ctx.model, ctx.drafter_model)
