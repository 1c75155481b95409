"""vLLM 0.30.0 to 0.33.0 (#56312 merged): breakable scoped to PIECEWISE, nested in the FULL wrapper.

``GPUModelRunner.load_model`` (``v1/worker/gpu_model_runner.py:5128-5165`` in 0.33.0,
``:5456-5495`` in 0.30.0): with breakable on, a non-NONE mode and no micro-batching, the model and
``drafter.model`` get ``BreakableCUDAGraphWrapper(runtime_mode=PIECEWISE)``; then, independently,
``CUDAGraphWrapper(FULL)`` goes outside when the load-time mode has full graphs; micro-batching
gets a ``UBatchWrapper`` instead. ``unwrap()`` recurses in both wrappers.
"""

from contract.core.modes import FULL, NONE, PIECEWISE
from contract.runners.mrv1.model.wrappers import LoadContext
from contract.runners.mrv1.model.wrappers import BreakableCUDAGraphWrapper, CUDAGraphWrapper, Stacks, UBatchWrapper


def load_model(ctx: LoadContext) -> Stacks:
    model, drafter = ctx.model, ctx.drafter_model
    cudagraph_mode = ctx.cudagraph_mode
    if ctx.breakable and cudagraph_mode != NONE and not ctx.use_ubatching:
        # Installed on "!= NONE", not "has piecewise": drafters under a FULL target and a later
        # FULL -> FULL_AND_PIECEWISE upgrade both dispatch PIECEWISE after this point.
        model = BreakableCUDAGraphWrapper(model, runtime_mode=PIECEWISE)
        if drafter is not None:
            drafter = BreakableCUDAGraphWrapper(drafter, runtime_mode=PIECEWISE)
    if cudagraph_mode.has_full_cudagraphs() and not ctx.use_ubatching:
        model = CUDAGraphWrapper(model, runtime_mode=FULL)
    elif ctx.use_ubatching:
        model = UBatchWrapper(model, FULL if cudagraph_mode.has_full_cudagraphs() else NONE)
    return Stacks(model, drafter)
