"""Pipeline-parallel stages of one MRV2 step (0.33.0, 0.34.0): each stage's own resolve and
dispatch, and the hand-over of the hidden states from one stage to the next.

Every stage's worker builds its attention groups from its own layers (``init_attn_backend``,
``34:v1/worker/gpu/attn_utils.py:200-260``) and resolves its own mode and capture sizes from their
minimum support (``initialize_kv_cache``, ``34:v1/worker/gpu/model_runner.py:783-811``); nothing
agrees a mode across stages. Each stage receives the same ``SchedulerOutput`` and dispatches it
with its own manager (``dispatch_cg_and_sync_dp`` on one DP rank, ``34:…/model_runner.py:1894-1910``).
A non-first stage copies the first ``num_tokens_after_padding`` rows of what the stage before sent
into its persistent buffer (``v[:n].copy_(intermediate_tensors.tensors[k][:n])``,
``34:…/model_runner.py:2094-2104``, ``33:…:2026-2036``), and the stage before sent its own padded
rows (``34:v1/worker/gpu_worker.py:1489-1497``): a stage that pads beyond them raises torch's
size error (unless one row was sent, which ``copy_`` broadcasts), and the stages around it wait on
a send or receive it never makes.

A later stage's graphs are those its manager captures: stage ``k``'s capture is the one-stage
capture of the scenario with ``stage_support(k)``, which P1-P8 judge there; this module decides
what each stage serves.
"""

from __future__ import annotations

from dataclasses import replace

from contract.core.observation import RankServed
from contract.core.resolve import ResolveRejected
from contract.core.scenario import Scenario
from contract.runners.mrv2.model import cudagraph_utils as cgu
from contract.runners.mrv2.model import dp_utils
from contract.runners.mrv2.model.cudagraph_utils import CudaGraphManager
from contract.runners.mrv2.model.dp_utils import RankBatch


class StageRejected(Exception):
    """A later stage's resolve refuses its support: its worker stops at start-up with vLLM's ValueError
    (``args``: the stage, the halt's text)."""


def stage_managers(scenario: Scenario, policy, modes, config, available: bool) -> tuple[CudaGraphManager, ...]:
    """Stages 1.. : each stage's resolve from its own mode (``modes``, stage 1 first) under its own
    support, then its ``ModelCudaGraphManager``."""
    out = []
    for stage, mode in enumerate(modes, start=1):
        try:
            resolved = policy.resolve(mode, config, scenario.stage_support(stage), scenario.uniform_decode_query_len,
                                      True, config.cudagraph_capture_sizes, available)
        except ResolveRejected as exc:
            raise StageRejected(stage, f"resolve rejected: {exc}") from exc
        r = resolved.cudagraph_mode
        out.append(cgu.build(f"stage{stage}:CudaGraphManager", policy.release, r, resolved.cudagraph_capture_sizes,
                             scenario.uniform_decode_query_len, target_q=scenario.uniform_decode_query_len,
                             use_breakable_cg=policy.use_breakable_cg(scenario.breakable, r),
                             breakable_pads_requests=policy.breakable_pads_requests))
    return tuple(out)


def captured(managers: tuple[CudaGraphManager, ...]) -> tuple[CudaGraphManager, ...]:
    """Every later stage's ``capture_model``, as one stage captures: each descriptor of its manager."""
    return tuple(replace(m, graphs=frozenset(d for _, descs in m.capture_descs for d in descs if d.cg_mode.name == "FULL"),
                         graphs_captured=True) for m in managers)


def padded(batch: RankBatch, desc) -> int:
    """``num_tokens_after_padding = max(num_tokens, batch_desc.num_tokens)`` (``34:…/model_runner.py:1466``)."""
    return max(batch.num_tokens, desc.num_tokens)


def serve(policy, first, managers: tuple[CudaGraphManager, ...], batch: RankBatch) -> tuple[tuple[RankServed, ...], str | None]:
    """Every stage's side of one step (stage 0's descriptor is ``first``) and, where a stage raised,
    the engine's stop. ``policy.pp_need_eager_stage`` is a mutant's per-stage reason to run eagerly
    that the other stages are not told of."""
    own = first_stage_batch(policy, batch)
    sides = [RankServed(first.cg_mode, padded(own, first), own.to_json(), own.need_eager)]
    for stage, manager in enumerate(managers, start=1):
        own = replace(batch, need_eager=batch.need_eager or policy.pp_need_eager_stage == stage)
        desc = dp_utils.dispatch_cg_and_sync_dp(manager, (own,))[0]
        n, sent = padded(own, desc), sides[-1].num_tokens
        if n > sent != 1:  # torch broadcasts one row over the padded rows
            error = f"RuntimeError: The size of tensor a ({n}) must match the size of tensor b ({sent}) at " \
                    "non-singleton dimension 0"
            sides.append(RankServed.stopped(error))
            return tuple(sides), f"PP stage {stage}: {error}"
        sides.append(RankServed(desc.cg_mode, n, own.to_json(), own.need_eager))
    return tuple(sides), None


def first_stage_batch(policy, batch: RankBatch) -> RankBatch:
    """Stage 0's inputs under a mutant that forces it eager alone."""
    return replace(batch, need_eager=True) if policy.pp_need_eager_stage == 0 else batch
