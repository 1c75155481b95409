"""``v1/worker/gpu/dp_utils.py`` (0.33.0, 0.34.0) over every data-parallel rank of one step at once.

DP ranks run each forward together (their MoE all-to-alls and the padded token count must match),
so before every forward each rank dispatches its own batch and ``sync_cudagraph_and_dp_padding``
agrees one descriptor: an all-reduce of each rank's token count, mode, uniform token count and
query-length bound; NONE on every rank when any rank's mode is NONE (each then runs its own token
count); else a re-dispatch on every rank at the largest token count, with the uniform token count
only where all ranks share it and the largest query-length bound only where every rank has one
(``34:…/dp_utils.py:49-229``, ``33:…:45-209``). Under micro-batching (the manager's ``ubatching``: a
micro-batch runner exists on every rank) the agreement first asks whether the smallest rank's batch
reaches the threshold (the decode one when every rank runs a uniform decode of the decode query
length); if so every rank takes the micro-batched graph of the largest token count, whatever its own
mode, or an eager micro-batched run when none matches or a rank's second micro-batch would be empty
(``34:…:127-180``, ``33:…:103-154``). The ranks' managers are alike: every rank runs the same
start-up, so one manager value serves all.

An idle rank runs the worker's dummy batch: ``execute_dummy_batch`` asks ``_dummy_run`` for
``decode_query_len`` tokens as a uniform decode, one request of ``q`` tokens
(``34:v1/worker/gpu_worker.py:1577-1582``, ``34:…/model_runner.py:911-914``; 0.33.0's worker asks
for ``uniform_decode_query_len``, which the MRV2 runner lacks, and ``_dummy_run`` raises the 1 to
``q``: ``33:v1/worker/gpu_worker.py:1466-1472``, ``33:…/model_runner.py:863-870``).
"""

from __future__ import annotations

from dataclasses import dataclass

from contract.core.modes import NONE, CUDAGraphMode
from contract.runners.mrv2.model import cudagraph_utils as cgu
from contract.runners.mrv2.model.cudagraph_utils import BED, CudaGraphManager
from contract.core.ubatch_utils import check_ubatch_thresholds


@dataclass(frozen=True)
class RankBatch:
    """One rank's inputs to ``dispatch_cg_and_sync_dp``."""

    num_reqs: int
    num_tokens: int
    uniform_token_count: int | None
    max_query_len: int | None
    need_eager: bool = False
    num_active_loras: int = 0  # per rank, never agreed (34:…/dp_utils.py:210)

    def to_json(self) -> list:
        return [self.num_reqs, self.num_tokens, self.uniform_token_count]


def dummy_batch(q: int, aligned: bool = True) -> RankBatch:
    """An idle rank's forward; ``aligned=False`` is the one-token dummy batch vLLM #35376 replaced."""
    n = q if aligned else 1
    return RankBatch(1, n, n, n)


def _alone(manager: CudaGraphManager | None, b: RankBatch, need_eager: bool) -> BED:
    """``dispatch_cg_and_sync_dp``'s own dispatch of a rank's batch, before any agreement."""
    if need_eager:  # the raw count, where dispatch's NONE carries the effective one (34:…:295-314)
        return BED(NONE, b.num_tokens, b.num_reqs, num_active_loras=b.num_active_loras)
    return cgu.dispatch(manager, b.num_reqs, b.num_tokens, b.uniform_token_count, b.max_query_len,
                        b.num_active_loras)


def dispatch_cg_and_sync_dp(manager: CudaGraphManager | None, batches: tuple[RankBatch, ...], *, sync: bool = True,
                            take_min: bool = True, votes_need_eager: bool = True) -> tuple[BED, ...]:
    """Each rank's descriptor for the step. The keywords are mutants' changes: ``sync=False`` skips
    the agreement, ``take_min=False`` agrees the strongest mode instead of the weakest, and
    ``votes_need_eager=False`` is a rank that dispatches a graph and then runs eagerly on its own."""
    alone = [_alone(manager, b, b.need_eager and votes_need_eager) for b in batches]
    if len(batches) > 1 and sync:
        alone = list(_agree(manager, batches, alone, take_min))
    return tuple(BED(NONE, b.num_tokens, b.num_reqs) if b.need_eager and not votes_need_eager else d
                 for b, d in zip(batches, alone))


def _agree(manager, batches: tuple[RankBatch, ...], alone: list[BED], take_min: bool) -> tuple[BED, ...]:
    """``sync_cudagraph_and_dp_padding``."""
    counts = {b.uniform_token_count or 0 for b in batches}
    uniform = next(iter(counts)) if len(counts) == 1 and 0 not in counts else None
    u = manager.ubatching if manager is not None else None
    if u is not None:
        q = manager.built_from[2]  # decode_query_len; a rank's uniform_decode is uniform_tok_count == q
        fewest, most = min(b.num_tokens for b in batches), max(b.num_tokens for b in batches)
        if check_ubatch_thresholds(u, fewest, uniform_decode=counts == {q}):
            out = []
            for b in batches:
                d = cgu.dispatch(manager, b.num_reqs, most, uniform, num_active_loras=b.num_active_loras,
                                 num_ubatches=u.num_ubatches)
                if 2 * fewest < d.num_tokens:  # an empty second micro-batch on some rank
                    d = BED(NONE, most, b.num_reqs, num_ubatches=u.num_ubatches)
                out.append(d)
            return tuple(out)
    bounds = [b.max_query_len for b in batches]
    max_query_len = None if None in bounds else max(bounds)
    pick = min if take_min else max
    mode = CUDAGraphMode(pick(d.cg_mode.value for d in alone))
    if mode == NONE:  # every rank runs eager at its own token count
        return tuple(BED(NONE, b.num_tokens, b.num_reqs) for b in batches)
    num_tokens = max(b.num_tokens for b in batches)
    return tuple(cgu.dispatch(manager, b.num_reqs, num_tokens, uniform, max_query_len) for b in batches)
