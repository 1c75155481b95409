"""A policy: one vLLM revision's ``load_model`` wrapping rule, plus the revision-dependent facts
around it. Everything else the runner does is vLLM behaviour shared by the modelled revisions;
it is carried here as replaceable pure functions so a mutant can change exactly one of them.

Writing your own policy (a branch under review) takes one function::

    # my_branch.py
    from contract.api import *

    def load_model(ctx: LoadContext) -> Stacks:
        model, drafter = ctx.model, ctx.drafter_model
        if ctx.breakable and ctx.cudagraph_mode != NONE and not ctx.use_ubatching:
            model = BreakableCUDAGraphWrapper(model, runtime_mode=PIECEWISE)
            if drafter is not None:
                drafter = BreakableCUDAGraphWrapper(drafter, runtime_mode=PIECEWISE)
        if ctx.cudagraph_mode.has_full_cudagraphs() and not ctx.use_ubatching:
            model = CUDAGraphWrapper(model, runtime_mode=FULL)
        elif ctx.use_ubatching:
            model = UBatchWrapper(model, FULL if ctx.cudagraph_mode.has_full_cudagraphs() else NONE)
        return Stacks(model, drafter)

and ``cudagraph-contract verify --policy my_branch.py``. Optional module attributes:
``CONFIG_REVISION`` (``ConfigRevision.V0_30``), ``DESCRIPTION``. Model Runner V2 never wraps the
model; its releases are ``contract.runners.mrv2.model.policy.Mrv2Policy`` values, and an MRV2
branch is verified with ``--vllm-src``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from contract.core import resolve as _resolve
from contract.core.engine import Engine
from contract.core.scenario import ConfigRevision, Runner
from contract.runners.mrv1.model import cudagraph_dispatcher as _dispatcher
from contract.runners.mrv1.model import llm_base_proposer as _proposer
from contract.runners.mrv1.model.engine import ENGINE
from contract.runners.mrv1.model.wrappers import LoadContext, Stacks, entry_key, ubatch_key, wrapper_acts


@dataclass(frozen=True)
class Policy:
    name: str
    load_model: Callable[[LoadContext], Stacks]
    runner: Runner = Runner.MRV1
    config_revision: ConfigRevision = ConfigRevision.V0_30
    description: str = ""
    source: str = "built-in"
    # Shared vLLM behaviour (replaced only by mutants).
    normalise: Callable = _dispatcher.normalise
    resolve: Callable = _resolve.resolve_cudagraph_mode_and_sizes
    initialize_cudagraph_keys: Callable = _dispatcher.initialize_cudagraph_keys
    dispatch: Callable = _dispatcher.dispatch
    drafter_cudagraph_mode: Callable = _dispatcher.drafter_cudagraph_mode
    wrapper_acts: Callable = wrapper_acts
    entry_key: Callable = entry_key
    ubatch_key: Callable = ubatch_key
    # UBatchWrapper replays a micro-batched graph only under FULL (vLLM #25625)
    ubatch_replays_full_only: bool = True
    compile_at_first_forward: bool = True  # spec §5.1: Dynamo compiles at the first forward
    capture_model_closes_window: bool = True  # set_cudagraph_capturing_enabled(False), :6916
    dp_syncs_mode: bool = True  # coordinate_batch_across_dp agrees the minimum mode (dp_utils.py)
    # the drafter's dummy run: its DP syncs (vLLM #26086) and whether it may take a graph (#30119)
    drafter_dummy_syncs: Callable = _proposer.dummy_run_syncs
    drafter_dummy_use_cudagraphs: Callable = _proposer.dummy_run_use_cudagraphs
    resolve_reads_draft_layers: bool = True  # the minimum support over the drafter's backends too
    # ``@eager_break_during_capture`` on ``unified_attention_with_output``
    # (``33:model_executor/layers/attention/attention.py:770``)
    attention_eager_break: bool = True

    @property
    def engine(self) -> Engine:
        return ENGINE

    def mutate(self, name: str, description: str, **changes) -> Policy:
        return dataclasses.replace(self, name=name, description=description, **changes)
