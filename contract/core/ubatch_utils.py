"""``v1/worker/ubatch_utils.py``, which both runners read: the micro-batching settings after
post-init, the thresholds a batch must reach to split, and the empty-last-micro-batch test.

``--enable-dbo`` splits a step into two micro-batches, ``--ubatch-size N`` into N (``num_ubatches``,
``34:config/parallel.py:719-725``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class UBatching:
    """The ``ParallelConfig`` fields micro-batching reads, after post-init."""

    num_ubatches: int
    dbo_decode_token_threshold: int
    dbo_prefill_token_threshold: int


def check_ubatch_thresholds(u: UBatching, num_tokens: int, uniform_decode: bool) -> bool:
    """``check_ubatch_thresholds`` (``34:v1/worker/ubatch_utils.py:139-148``, ``33:…:140-149``)."""
    return num_tokens >= (u.dbo_decode_token_threshold if uniform_decode else u.dbo_prefill_token_threshold)


def is_last_ubatch_empty(orig_num_tokens: int, padded_num_tokens: int, num_ubatches: int) -> bool:
    """``is_last_ubatch_empty`` (``33:v1/worker/ubatch_utils.py:129-132``): the split points of the
    padded count leave the last micro-batch none of the unpadded tokens."""
    return (padded_num_tokens // num_ubatches) * (num_ubatches - 1) >= orig_num_tokens
