"""The never-released intermediate revision of PR #56312: breakable install gated on "has piecewise".

The review diff of #56312 added ``and cudagraph_mode.has_piecewise_cudagraphs()`` to the breakable
condition (spec §12.4). Under a FULL load-time mode nothing breakable is installed, so a drafter
(mapped to PIECEWISE) and a PIECEWISE dispatch after a late FULL -> FULL_AND_PIECEWISE upgrade
reach no capturer: breakable also turned compilation off, so they run eagerly.
"""

from contract.core.modes import FULL, NONE, PIECEWISE
from contract.runners.mrv1.model.wrappers import LoadContext
from contract.runners.mrv1.model.wrappers import BreakableCUDAGraphWrapper, CUDAGraphWrapper, Stacks, UBatchWrapper


def load_model(ctx: LoadContext) -> Stacks:
    model, drafter = ctx.model, ctx.drafter_model
    cudagraph_mode = ctx.cudagraph_mode
    if (
        ctx.breakable
        and cudagraph_mode != NONE
        and not ctx.use_ubatching
        and cudagraph_mode.has_piecewise_cudagraphs()
    ):
        model = BreakableCUDAGraphWrapper(model, runtime_mode=PIECEWISE)
        if drafter is not None:
            drafter = BreakableCUDAGraphWrapper(drafter, runtime_mode=PIECEWISE)
    if cudagraph_mode.has_full_cudagraphs() and not ctx.use_ubatching:
        model = CUDAGraphWrapper(model, runtime_mode=FULL)
    elif ctx.use_ubatching:
        model = UBatchWrapper(model, FULL if cudagraph_mode.has_full_cudagraphs() else NONE)
    return Stacks(model, drafter)
