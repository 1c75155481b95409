"""Beside ``v1/worker/gpu/cudagraph_utils.py``'s ``CudaGraphManager``: each ``SizeSetting`` of
``contract/core/sizes.py`` through vLLM's own config (``contract/real/size_observer.py``) and
manager.

vLLM's own: the manager's candidates (``_init_candidates``) and every batch's descriptor through
``dispatch_cg_and_sync_dp`` with one DP rank (``34:v1/worker/gpu/dp_utils.py:232-314``; two ranks
in ``dp_utils.py``), called as
``execute_model`` calls it (``34:v1/worker/gpu/model_runner.py:1862-1912``: a batch whose requests
have as many tokens each, ``q`` or ``q - 1``, with ``uniform_token_count = max_query_len`` that
count, a mixed batch with neither). Stood in for: the
capture itself: the manager is marked captured, so ``dispatch`` serves from the descriptors it
would capture.
"""

from __future__ import annotations

from contract.core.capture_sizes import derive
from contract.core.family import SizeModel
from contract.core.sizes import Batch, SizeSetting
from contract.real import ranks, size_observer
from contract.runners.mrv2.real import dp_utils
from contract.runners.mrv2.real.cudagraph_utils import size_check_manager
from contract.runners.mrv2.model.sizes import reference


def _served(manager, s: SizeSetting, b: Batch) -> list:
    from vllm.v1.worker.gpu.dp_utils import dispatch_cg_and_sync_dp

    uniform = b.uniform_token_count
    desc, _ = dispatch_cg_and_sync_dp(manager, b.num_reqs, b.num_tokens, uniform, 1, 0, max_query_len=uniform)
    return [desc.cg_mode.name, desc.num_tokens, desc.num_reqs]


def observe(session, settings: list[SizeSetting]) -> list[dict]:
    """``size_observer.observe`` with MRV2's manager, and each setting on two DP ranks
    (``dp_utils.py``): a record's ``ranks`` holds each rank's record, or ``ranks.HUNG``."""
    records = size_observer.observe(session, settings, size_check_manager, _served)
    per_rank = dp_utils.observe(session, settings)
    for i, record in enumerate(records):
        record["ranks"] = [r[i] if isinstance(r, list) and i < len(r) else
                           {"served": []} if isinstance(r, list) else ranks.HUNG for r in per_rank]
    return records


SIZES = SizeModel(releases=("0.33", "0.34"), lists=derive, best_graph=reference, observe=observe,
                  dispatch="CudaGraphManager.dispatch")
