"""Micro-batching (dual batch overlap) as MRV2 reads it: ``v1/worker/ubatch_utils.py``'s thresholds,
``maybe_build_ubatch_runner`` (``v1/worker/gpu/ubatch_utils.py``) and the manager's
``_maybe_ubatch_twin`` (``v1/worker/gpu/cudagraph_utils.py``), 0.33.0 and 0.34.0.

``--enable-dbo`` splits a step into two micro-batches, ``--ubatch-size N`` into N (``num_ubatches``,
``34:config/parallel.py:719-725``; the thresholds: ``contract/core/ubatch_utils.py``).
The micro-batch runner exists only with more than one DP rank, whose agreement decides the split
(``34:v1/worker/gpu/ubatch_utils.py:583-603``). Each FULL descriptor whose requests split evenly
gets a twin captured for ``num_ubatches`` micro-batches, keyed by the query length of its requests
(``34:v1/worker/gpu/cudagraph_utils.py:262-287``, ``33:…:229-254``); the twin never serves a batch of
another query length or a mixed batch (``_is_compatible``'s ``uniform_token_count``).
"""

from __future__ import annotations

from dataclasses import replace

from contract.core.modes import FULL
from contract.core.scenario import Scenario
from contract.core.ubatch_utils import UBatching, check_ubatch_thresholds


def ubatching(scenario: Scenario, release: str) -> UBatching | None:
    """``maybe_build_ubatch_runner``: a runner only with ``use_ubatching`` and more than one DP rank.
    0.34.0's post-init raises both thresholds to ``num_ubatches * q`` under speculative decoding
    (``_raise_dbo_thresholds_for_spec_decode``, ``34:config/vllm.py:3358-3376``); 0.33.0 refuses DBO
    with a drafter (``33:config/vllm.py:3241-3242``), which the modelled space leaves out."""
    if not scenario.ubatching or scenario.data_parallel_size <= 1:
        return None
    n = scenario.num_ubatches
    low = n * scenario.uniform_decode_query_len if release != "0.33" else 0
    decode, prefill = scenario.dbo_thresholds
    return UBatching(n, max(decode, low), max(prefill, low))


def ubatch_twin(u: UBatching | None, desc, keeps_query_len: bool = True):
    """``_maybe_ubatch_twin``: a FULL descriptor whose requests hold ``num_tokens / num_reqs`` tokens
    each, at least ``num_ubatches`` tokens and the decode threshold, gets a twin for ``num_ubatches``
    micro-batches keyed by that query length. ``keeps_query_len=False`` leaves the query length out
    (mutants only): the twin then serves mixed batches."""
    if u is None or desc.cg_mode != FULL or desc.num_reqs is None:
        return None
    utc, remainder = divmod(desc.num_tokens, desc.num_reqs)
    if remainder or desc.uniform_token_count not in (None, utc):
        return None
    if desc.num_tokens < u.num_ubatches or not check_ubatch_thresholds(u, desc.num_tokens, uniform_decode=True):
        return None
    return replace(desc, num_ubatches=u.num_ubatches,
                   uniform_token_count=utc if keeps_query_len else desc.uniform_token_count)
