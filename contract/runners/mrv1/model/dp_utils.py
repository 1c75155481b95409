"""``v1/worker/dp_utils.py``'s ``coordinate_batch_across_dp`` and the re-dispatch
``_determine_batch_execution_and_padding`` makes with it (0.29.0 to 0.33.0), over every
data-parallel rank of one step at once.

Each rank dispatches its batch (NONE where it must run eagerly, ``force_eager``), then an
all-reduce agrees the minimum of the ranks' modes and whether they micro-batch; where the mode is a
graph or they micro-batch every rank is padded to the largest padded token count, else each keeps
its own; each rank re-dispatches at its agreed count with the agreed mode as the only one allowed,
and asserts the descriptor holds exactly that count (``33:v1/worker/dp_utils.py:114-187``,
``33:v1/worker/gpu_model_runner.py:3728-3769``, ``29:…/gpu_model_runner.py:4060-4110``). Under
micro-batching every rank micro-batches when each one allows it and its unpadded batch reaches the
threshold (the decode one for a uniform decode), unless the smallest unpadded batch would leave the
last micro-batch of the largest padded count empty (``_post_process_ubatch``, ``33:…/dp_utils.py:79-97``);
the split is then ``num_ubatches`` micro-batches of the padded count (``maybe_create_ubatch_slices``,
``33:v1/worker/ubatch_utils.py:165-221``). The EAGLE proposer's syncs go through the same agreement
(``llm_base_proposer.py``).
An idle rank runs ``execute_dummy_batch``: ``_dummy_run`` of ``uniform_decode_query_len`` tokens as a
uniform decode (``33:v1/worker/gpu_worker.py:1466-1472``), which allows micro-batching.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from contract.core.forward_context import BatchDescriptor
from contract.core.modes import NONE, CUDAGraphMode
from contract.core.ubatch_utils import UBatching, check_ubatch_thresholds, is_last_ubatch_empty

ASSERTION = "AssertionError"  # the bare ``assert batch_descriptor.num_tokens == num_tokens_padded``


@dataclass(frozen=True)
class RankBatch:
    """One rank's batch as ``_determine_batch_execution_and_padding`` reads it."""

    num_reqs: int
    num_tokens: int
    uniform_decode: bool
    force_eager: bool = False
    allow_microbatching: bool = True


@dataclass(frozen=True)
class RankDispatch:
    """What a rank runs, or ``raised`` where its re-dispatch asserted. The descriptor carries the
    micro-batch split (``BatchDescriptor.num_ubatches``)."""

    mode: CUDAGraphMode
    desc: BatchDescriptor
    raised: str | None = None


def should_ubatch(u: UBatching | None, batches: tuple[RankBatch, ...], padded: list[int]) -> bool:
    """``coordinate_batch_across_dp``'s micro-batching agreement over the ranks' unpadded batches
    and their own padded counts."""
    if u is None:
        return False
    attempt = all(b.allow_microbatching and check_ubatch_thresholds(u, b.num_tokens, b.uniform_decode)
                  for b in batches)
    return attempt and not is_last_ubatch_empty(min(b.num_tokens for b in batches), max(padded), u.num_ubatches)


def determine_batch_execution_and_padding(dispatch: Callable, batches: tuple[RankBatch, ...], *,
                                          ubatching: UBatching | None = None,
                                          syncs_mode: bool = True) -> tuple[RankDispatch, ...]:
    """Each rank's mode and descriptor. ``dispatch(num_tokens, uniform, valid_modes)`` is the rank's
    ``CudagraphDispatcher.dispatch``; ``ubatching`` is the micro-batching setting (None: off);
    ``syncs_mode=False`` is a mutant's: the ranks agree the token count alone and each re-dispatches
    in any mode."""

    def own(b: RankBatch, num_tokens: int, valid=None):
        return dispatch(num_tokens, b.uniform_decode, {NONE} if b.force_eager else valid)

    alone = [own(b, b.num_tokens) for b in batches]
    if len(batches) == 1:  # coordinate_batch_across_dp's early exit: one rank never splits
        return (RankDispatch(*alone[0]),)
    ubatched = should_ubatch(ubatching, batches, [desc.num_tokens for _, desc in alone])
    synced = CUDAGraphMode(min(mode.value for mode, _ in alone))
    graphs = synced != NONE if syncs_mode else any(mode != NONE for mode, _ in alone)
    largest = max(desc.num_tokens for _, desc in alone)
    split = ubatching.num_ubatches if ubatched else 1
    out = []
    for b, (_, desc) in zip(batches, alone):
        padded = largest if graphs or ubatched else desc.num_tokens
        mode, again = own(b, padded, {synced} if syncs_mode else None)
        raised = None if again.num_tokens == padded else ASSERTION
        out.append(RankDispatch(mode, replace(again, num_ubatches=split), raised))
    return tuple(out)
