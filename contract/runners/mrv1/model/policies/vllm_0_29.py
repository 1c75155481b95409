"""vLLM 0.29.0, the last release before #56312: breakable takes over every non-NONE mode.

``GPUModelRunner.load_model`` (``v1/worker/gpu_model_runner.py:5511-5539`` in 0.29.0) is an
``if/elif/elif``: with breakable on, a non-NONE mode and no micro-batching, the model and
``drafter.model`` are wrapped in a match-any ``BreakableCUDAGraphWrapper`` (the class has no
``runtime_mode`` yet) and *no* ``CUDAGraphWrapper(FULL)`` is installed, so FULL dispatches are
captured by the breakable wrapper as one unbroken segment. Both wrappers' ``unwrap()`` return
their runnable without recursing. Config-time normalisation drops piecewise modes to NONE.
"""

from contract.core.modes import FULL, NONE
from contract.runners.mrv1.model.wrappers import LoadContext
from contract.core.scenario import ConfigRevision
from contract.runners.mrv1.model.wrappers import BreakableCUDAGraphWrapper, CUDAGraphWrapper, Stacks, UBatchWrapper

CONFIG_REVISION = ConfigRevision.V0_29


def load_model(ctx: LoadContext) -> Stacks:
    model, drafter = ctx.model, ctx.drafter_model
    cudagraph_mode = ctx.cudagraph_mode
    if ctx.breakable and cudagraph_mode != NONE and not ctx.use_ubatching:
        model = BreakableCUDAGraphWrapper(model, recursive_unwrap=False)
        if drafter is not None:
            drafter = BreakableCUDAGraphWrapper(drafter, recursive_unwrap=False)
    elif cudagraph_mode.has_full_cudagraphs() and not ctx.use_ubatching:
        model = CUDAGraphWrapper(model, runtime_mode=FULL, recursive_unwrap=False)
    elif ctx.use_ubatching:
        model = UBatchWrapper(model, FULL if cudagraph_mode.has_full_cudagraphs() else NONE)
    return Stacks(model, drafter)
