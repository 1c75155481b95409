"""``v1/worker/dp_utils.py``'s ``coordinate_batch_across_dp`` and the re-dispatch
``_determine_batch_execution_and_padding`` makes with it (0.29.0 to 0.33.0), over every
data-parallel rank of one step at once.

Each rank dispatches its batch (NONE where it must run eagerly, ``force_eager``), then an
all-reduce agrees the minimum of the ranks' modes; where that is a graph every rank is padded to
the largest padded token count, else each keeps its own; each rank re-dispatches at its agreed
count with the agreed mode as the only one allowed, and asserts the descriptor holds exactly that
count (``33:v1/worker/dp_utils.py:114-187``, ``33:v1/worker/gpu_model_runner.py:3728-3769``,
``29:…/gpu_model_runner.py:4060-4110``). Micro-batching and drafters on several ranks are outside
the modelled space. An idle rank runs ``execute_dummy_batch``: ``_dummy_run`` of
``uniform_decode_query_len`` tokens as a uniform decode (``33:v1/worker/gpu_worker.py:1466-1472``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from contract.core.forward_context import BatchDescriptor
from contract.core.modes import NONE, CUDAGraphMode

ASSERTION = "AssertionError"  # the bare ``assert batch_descriptor.num_tokens == num_tokens_padded``


@dataclass(frozen=True)
class RankBatch:
    """One rank's batch as ``_determine_batch_execution_and_padding`` reads it."""

    num_reqs: int
    num_tokens: int
    uniform_decode: bool
    force_eager: bool = False


@dataclass(frozen=True)
class RankDispatch:
    """What a rank runs, or ``raised`` where its re-dispatch asserted."""

    mode: CUDAGraphMode
    desc: BatchDescriptor
    raised: str | None = None


def determine_batch_execution_and_padding(dispatch: Callable, batches: tuple[RankBatch, ...], *,
                                          syncs_mode: bool = True) -> tuple[RankDispatch, ...]:
    """Each rank's mode and descriptor. ``dispatch(num_tokens, uniform, valid_modes)`` is the rank's
    ``CudagraphDispatcher.dispatch``; ``syncs_mode=False`` is a mutant's: the ranks agree the token
    count alone and each re-dispatches in any mode."""

    def own(b: RankBatch, num_tokens: int, valid=None):
        return dispatch(num_tokens, b.uniform_decode, {NONE} if b.force_eager else valid)

    alone = [own(b, b.num_tokens) for b in batches]
    if len(batches) == 1:
        return (RankDispatch(*alone[0]),)
    synced = CUDAGraphMode(min(mode.value for mode, _ in alone))
    graphs = synced != NONE if syncs_mode else any(mode != NONE for mode, _ in alone)
    largest = max(desc.num_tokens for _, desc in alone)
    out = []
    for b, (_, desc) in zip(batches, alone):
        padded = largest if graphs else desc.num_tokens
        mode, again = own(b, padded, {synced} if syncs_mode else None)
        out.append(RankDispatch(mode, again, None if again.num_tokens == padded else ASSERTION))
    return tuple(out)
