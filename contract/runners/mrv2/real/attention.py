"""Beside ``v1/worker/gpu/attn_utils.py`` and ``spec_decode/adaptive_verification.py``: the attention
groups ``get_attn_cg_support`` takes the minimum over and adaptive verification's start-up check
reads, and the manager's stand-in state.

vLLM's own: ``maybe_create_adaptive_verification_manager`` and the checks it calls
(``get_query_lens_mismatch_unsupported_backend``, ``get_varlen_cudagraph_unsupported_backend``,
``34:v1/worker/gpu/attn_utils.py:350-402``), the runner's statements that name the target's
layers (``target_attn_layer_names``, ``34:…/model_runner.py:711-718``), and, after capture, the
manager's ``batches_to_profile``, ``set_initial_cost_curves`` and ``set_cost_curves``
(``34:…/adaptive_verification.py:305-371``), whose empty curves stop vLLM.

Stand-ins:

- the groups: one per model, each with one layer (``TARGET_LAYER``, ``DRAFT_LAYER``) and a metadata
  builder whose ``get_cudagraph_support`` is vLLM's own, of the registry backend that gives the
  scenario's level for its layers (``contract/real/attention_backends.py``; ``layers_support``: the
  target's layers ALWAYS when the weaker backend serves the draft only) and, with ``varlen_decode_bound``,
  vLLM's own ``max_decode_query_len(vllm_config)`` as its varlen bound (what FlashInfer and Mamba2
  declare, ``34:v1/attention/backends/flashinfer.py:1257-1279``); their backend trims requests on
  device (``supports_device_cpu_query_lens_mismatch``) as every backend the selector admits does;
- the manager's device state (``AdaptiveVerificationManager.__init__`` allocates streams and
  pinned buffers): ``StandInManager`` holds what the three methods read;
- the timed dummy runs of the cost profiling: one sample per run, 1 ms, marked as a FULL graph
  replay when a FULL graph of its token count was captured (the decision that matters, whether
  any sample exists, is vLLM's ``batches_to_profile`` over ``captured_token_counts()``).
"""

from __future__ import annotations

import contextlib
import types

from contract.core.modes import AttentionCGSupport as ModelSupport
from contract.core.properties import layers_support
from contract.core.scenario import Scenario
from contract.real import attention_backends
from contract.real.attention_op import DRAFT_LAYER, TARGET_LAYER



def _group(scenario: Scenario, role: str, layer: str, vllm_config, chosen: dict, stage: int = 0):
    from vllm.v1.attention.backend import max_decode_query_len

    support: ModelSupport = scenario.stage_support(stage) if stage else layers_support(scenario, role)
    real = attention_backends.builder_class(support.name, chosen)
    bound = max_decode_query_len(vllm_config) if scenario.varlen_decode_bound else None

    class Builder:
        get_cudagraph_support = staticmethod(real.get_cudagraph_support)

        @staticmethod
        def get_varlen_cudagraph_max_query_len(cfg, spec):
            return bound

    # named by the level vLLM's builder gives: adaptive verification's refusal names the backend
    level = real.get_cudagraph_support(vllm_config, None).name
    backend = type(f"SIM_ATTN_{level}", (), {
        "supports_device_cpu_query_lens_mismatch": staticmethod(lambda: True)})
    # create_metadata_builders builds no builder here: get_metadata_builder hands out the class
    return types.SimpleNamespace(backend=backend, layer_names=[layer], kv_cache_spec=None, metadata_builders=[],
                                 create_metadata_builders=lambda **kwargs: None,
                                 get_metadata_builder=lambda ubatch_id=0: Builder())


def groups(scenario: Scenario, vllm_config, with_draft: bool, chosen: dict, stage: int = 0) -> list[list]:
    """``attn_groups``: the target's group (a pipeline stage's, whose layers hold
    ``stage_support(stage)``), and the draft model's when there is one; ``chosen``: the session's
    backends by level (``attention_backends.builder_class``)."""
    out = [[_group(scenario, "target", TARGET_LAYER, vllm_config, chosen, stage)]]
    if with_draft:
        out.append([_group(scenario, "drafter", DRAFT_LAYER, vllm_config, chosen)])
    return out


def kv_cache_config(with_draft: bool) -> types.SimpleNamespace:
    """The KV-cache groups' layer names, all ``target_attn_layer_names`` reads."""
    names = [TARGET_LAYER] + ([DRAFT_LAYER] if with_draft else [])
    return types.SimpleNamespace(kv_cache_groups=[types.SimpleNamespace(layer_names=[n]) for n in names])


class StandInManager:
    """``AdaptiveVerificationManager`` with vLLM's own profiling methods and no device state."""

    real: type | None = None  # vLLM's class, set while ``manager_class`` stands this one in

    def __init__(self, req_states, query_start_loc, num_bonus_tokens, max_total_logits,
                 copy_admitted_drafts_to_host=False):
        real = type(self).real
        self.req_states = req_states
        self.num_speculative_steps = req_states.num_speculative_steps
        self.num_bonus_tokens = num_bonus_tokens
        self.cost_tables = None
        self._cudagraph_limit = 0
        for name in ("batches_to_profile", "set_initial_cost_curves", "set_cost_curves"):
            setattr(self, name, types.MethodType(getattr(real, name), self))


@contextlib.contextmanager
def manager_class():
    """``maybe_create_adaptive_verification_manager`` builds ``StandInManager`` while it runs."""
    import vllm.v1.worker.gpu.spec_decode.adaptive_verification as av

    real = av.AdaptiveVerificationManager
    StandInManager.real = real
    av.AdaptiveVerificationManager = StandInManager
    try:
        yield
    finally:
        av.AdaptiveVerificationManager = real


def req_states(runner, num_speculative_steps: int) -> types.SimpleNamespace:
    """The request states the check and the profiling read (``RequestState`` fields)."""
    return types.SimpleNamespace(num_speculative_steps=num_speculative_steps, device=runner.device,
                                 max_num_reqs=runner.max_num_reqs, max_num_batched_tokens=runner.max_num_tokens)


def install_profiling(runner, gmr_class) -> None:
    """The cost profiling's dummy runs and timing (``step_timing``, ``_dummy_run``) as stand-ins, and
    0.34's ``profile_adaptive_verification`` as vLLM's own method."""
    from vllm.v1.worker.gpu.async_utils import StepTimingSample

    samples: list = []

    @contextlib.contextmanager
    def collect():
        samples.clear()
        yield samples

    def dummy_run(num_tokens, *args, **kwargs):
        captured = runner.cudagraph_manager.captured_token_counts() if runner.cudagraph_manager else []
        samples.append(StepTimingSample(forward_ms=1.0, drafter_ms=1.0, num_target_tokens=num_tokens,
                                        num_reqs=min(num_tokens, runner.max_num_reqs),
                                        full_cudagraph=num_tokens in captured))

    runner.step_timing = types.SimpleNamespace(collect=collect)
    runner._dummy_run = dummy_run
    if hasattr(gmr_class, "profile_adaptive_verification"):
        runner.profile_adaptive_verification = types.MethodType(gmr_class.profile_adaptive_verification, runner)
