"""Beside ``v1/cudagraph_dispatcher.py``'s ``CudagraphDispatcher``: each ``SizeSetting`` of
``contract/core/sizes.py`` through vLLM's own config (``contract/real/size_observer.py``), the
runner's resolution and the dispatcher.

vLLM's own: ``resolve_cudagraph_mode_and_sizes`` as ``_check_and_update_cudagraph_mode`` calls it
(``33:v1/worker/gpu_model_runner.py:6760-6797``: Model Runner V1, the runner's query length and
``max_num_reqs``), which rounds the sizes for speculative decoding; ``initialize_cudagraph_keys``;
and every batch's descriptor through ``dispatch`` with the ``uniform_decode`` that
``_is_uniform_decode`` gives it (``:3620-3637``, ``:3707-3730``: true for a batch of ``q`` tokens
per request only). Stood in for: the attention backends' support, the minimum taken as ALWAYS (the
level of FlashAttention 3 on Hopper; support per backend is not this check's subject), and the
capture, which keys alone stand for: ``dispatch`` serves from the keys it would capture.
"""

from __future__ import annotations

from contract.core.family import SizeModel
from contract.core.sizes import Batch, SizeSetting
from contract.real import size_observer
from contract.runners.mrv1.model import sizes as model_sizes


def _dispatcher(session, vllm_config):
    from vllm.v1.attention.backend import AttentionCGSupport
    from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher

    q = 1 + vllm_config.num_speculative_tokens
    mode = vllm_config.compilation_config.resolve_cudagraph_mode_and_sizes(
        AttentionCGSupport.ALWAYS, "the replay's attention", q, use_v2_model_runner=False,
        max_num_reqs=vllm_config.scheduler_config.max_num_seqs)
    dispatcher = CudagraphDispatcher(vllm_config)
    dispatcher.initialize_cudagraph_keys(mode, q)
    return dispatcher


def _served(dispatcher, s: SizeSetting, b: Batch) -> list:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    longest = b.uniform_token_count or s.q + 1  # a mixed batch's prefill is longer than a decode
    uniform = GPUModelRunner._is_uniform_decode(longest, s.q, b.num_tokens, b.num_reqs)
    mode, desc = dispatcher.dispatch(b.num_tokens, uniform_decode=uniform)
    return [mode.name, desc.num_tokens, desc.num_reqs]


def observe(session, settings: list[SizeSetting]) -> list[dict]:
    """``size_observer.observe`` with MRV1's resolution and dispatcher."""
    return size_observer.observe(session, settings, _dispatcher, _served)


# The size derivation is modelled for the last release that ships this runner only.
SIZES = SizeModel(releases=("0.33",), lists=model_sizes.sizes, best_graph=model_sizes.reference, observe=observe,
                  dispatch="CudagraphDispatcher.dispatch")
