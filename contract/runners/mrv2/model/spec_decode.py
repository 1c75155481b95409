"""MRV2 speculators (``v1/worker/gpu/spec_decode/``): which managers each one builds from the
target's resolved mode, how it captures them, and how a proposal dispatches.

0.33 picks the speculator with an ``if/elif`` on the method (``33:…/spec_decode/__init__.py:14-94``),
0.34 through ``SpeculatorConfig.speculator_class`` (``34:…/__init__.py:18-49``). n-gram, suffix and
extract_hidden_states build no manager and capture nothing (``33:…/ngram/speculator.py:209-213``,
``34:…/suffix/speculator.py:620-624``); they are ``DrafterKind.WITHOUT_MODEL`` and never propose here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from contract.core.modes import FULL, FULL_DECODE_ONLY, NONE, AttentionCGSupport, CUDAGraphMode
from contract.runners.mrv2.model import cudagraph_utils as cgu
from contract.runners.mrv2.model.cudagraph_utils import BED, CudaGraphManager
from contract.core.capture_sizes import decode_cudagraph_capture_grid
from contract.core.scenario import MAX_NUM_SEQS, Scenario, Speculator

PREFILL = "drafter:CudaGraphManager(prefill)"
DECODE = "drafter:CudaGraphManager(decode)"


@dataclass(frozen=True)
class SpeculatorManagers:
    prefill: CudaGraphManager | None = None  # draft prefill (position 0), or the single manager
    decode: CudaGraphManager | None = None  # one-token draft decodes (positions > 0)


def num_speculative_steps(scenario: Scenario) -> int:
    return scenario.uniform_decode_query_len - 1


def prefill_query_len(scenario: Scenario, release: str) -> int:
    """The prefill manager's decode query length: ``num_speculative_steps + 1``; 0.34's standalone
    AR adds a correction token per request (``34:…/standalone_ar/speculator.py:62-73``)."""
    q = scenario.uniform_decode_query_len
    return q + 1 if scenario.speculator is Speculator.STANDALONE_AR and release == "0.34" else q


def draft_decode_request_sizes(scenario: Scenario, release: str) -> list[int] | None:
    """0.34 ``get_draft_decode_cudagraph_request_sizes`` (``34:config/vllm.py:708-730``): the request
    grid up to ``max_num_seqs`` with two or more draft steps; 0.33 uses the shared capture sizes."""
    if release == "0.33":
        return None
    if num_speculative_steps(scenario) < 2 or scenario.speculator not in (Speculator.EAGLE, Speculator.STANDALONE_AR):
        return []
    return decode_cudagraph_capture_grid(MAX_NUM_SEQS)


def init_cudagraph_manager(scenario: Scenario, policy, target_mode: CUDAGraphMode,
                           capture_sizes: tuple[int, ...]) -> SpeculatorManagers:
    """``speculator.init_cudagraph_manager(cudagraph_mode)`` with the target's resolved mode
    (``33:v1/worker/gpu/model_runner.py:789-792``, ``34:…:826-829``)."""
    release, q = policy.release, scenario.uniform_decode_query_len

    def manager(layer, mode, query_len, *, decode_request_sizes=None, varlen_decode=False):
        return cgu.build(layer, release, mode, capture_sizes, query_len, target_q=q,
                         use_breakable_cg=policy.use_breakable_cg(scenario.breakable, mode),
                         decode_request_sizes=decode_request_sizes, varlen_decode=varlen_decode,
                         breakable_pads_requests=policy.breakable_pads_requests)

    spec = scenario.speculator
    if spec is Speculator.STANDALONE_AR and release == "0.33":
        return SpeculatorManagers()  # 33:…/standalone_ar/speculator.py:67-71: no CUDA graphs
    if spec in (Speculator.EAGLE, Speculator.STANDALONE_AR):
        # 33:…/target_dependent_ar/speculator.py:89-107; 34:…/target_dependent_ar/speculator.py:42-53,
        # 34:…/standalone_ar/speculator.py:62-73 and 34:…/autoregressive/speculator.py:36-52.
        # 0.34's draft prefill shares the target's padded attention metadata, so it takes the
        # target's varlen decode descriptors under adaptive verification
        # (34:…/target_dependent_ar/speculator.py:42-52, 34:…/standalone_ar/speculator.py:62-72);
        # 0.33's has none (33:…/target_dependent_ar/speculator.py:89-96).
        varlen = scenario.adaptive_verification and (release == "0.34" if policy.draft_prefill_varlen is None
                                                     else policy.draft_prefill_varlen)
        prefill = manager(PREFILL, target_mode, prefill_query_len(scenario, release), varlen_decode=varlen)
        decode = manager(DECODE, policy.draft_decode_mode(target_mode), 1,
                         decode_request_sizes=draft_decode_request_sizes(scenario, release))
        return SpeculatorManagers(prefill, decode)
    if spec is Speculator.MULTI_MODULE_MTP:
        # "Compiled piecewise graphs do not specialize the Python module index"
        # (33:…/multi_module_mtp/speculator.py:99-115, 34:…:99-117).
        mode = target_mode
        if mode.has_piecewise_cudagraphs() and not scenario.breakable and policy.multi_module_remap:
            mode = FULL_DECODE_ONLY if mode.has_full_cudagraphs() else NONE
        m = manager(PREFILL, mode, q)
        key_fn = m.use_breakable_cg and policy.multi_module_key_fn
        return SpeculatorManagers(replace(m, key_fn=key_fn))
    # DFlash family: "PIECEWISE cudagraphs are not supported for dflash" (33:…/dflash/speculator.py:143-167,
    # 34:…:140-164); the draft attention is the target's backends here.
    wants_full = target_mode.decode_mode() == FULL
    supports_full = scenario.attention_support.value >= AttentionCGSupport.UNIFORM_BATCH.value
    return SpeculatorManagers(manager(PREFILL, FULL_DECODE_ONLY if wants_full and supports_full else NONE, q))


def capture(run, scenario: Scenario, managers: SpeculatorManagers) -> None:
    """``speculator.capture()`` after the target's graphs (``33:…/model_runner.py:1137-1139``,
    ``34:…:1192-1194``). ``run`` is the runner step that owns the walks."""
    spec = scenario.speculator
    if managers.prefill is not None:
        steps = range(num_speculative_steps(scenario)) if spec is Speculator.MULTI_MODULE_MTP else (None,)
        run.capture_manager("prefill", steps)
    if managers.decode is not None and num_speculative_steps(scenario) > 1:
        # The decode routine is captured only with several speculative steps
        # (33:…/target_dependent_ar/speculator.py:140-162).
        run.capture_manager("decode", (None,))


def profile(run, scenario: Scenario, release: str, num_tokens: int) -> None:
    """``_dummy_run(is_profile=True)``'s ``speculator.propose`` (``33:…/model_runner.py:947-986``,
    ``34:…:993-1027``): ``need_eager`` makes every dispatch NONE; the draft prefill over the dummy
    batch, then, for the autoregressive speculators, one one-token decode step per further draft
    token over its requests (``33:…/target_dependent_ar/speculator.py:306-366``,
    ``34:…/autoregressive/speculator.py:167-274``)."""
    if scenario.speculator is Speculator.MULTI_MODULE_MTP:
        # _generate_drafts runs every module on the batch (33:…/multi_module_mtp/speculator.py:398-480)
        for step_idx in range(num_speculative_steps(scenario)):
            run.eager("drafter", BED(NONE, num_tokens, MAX_NUM_SEQS), step_idx)
        return
    run.eager("drafter", BED(NONE, num_tokens, MAX_NUM_SEQS))
    if scenario.speculator in (Speculator.EAGLE, Speculator.STANDALONE_AR):
        for _ in range(num_speculative_steps(scenario) - 1):
            run.eager("drafter", BED(NONE, MAX_NUM_SEQS, MAX_NUM_SEQS))


def propose(run, scenario: Scenario, release: str, num_tokens: int, uniform: bool) -> None:
    """``speculator.propose`` after a target batch of ``num_tokens`` (``uniform``: every request has
    ``uniform_decode_query_len`` tokens): the prefill dispatch with the target's padded token count
    (``33:…/target_dependent_ar/speculator.py:250-280``), then one one-token decode dispatch per
    further draft step, ``specialize_spec_tokens`` applied (``:334-347``)."""
    spec, q = scenario.speculator, scenario.uniform_decode_query_len
    num_reqs, utc, max_query_len = run.batch(num_tokens, uniform)
    if spec is Speculator.DFLASH:
        # every request drafts with q query tokens (34:…/dflash/speculator.py:589-593)
        run.draft_forward("prefill", num_reqs, num_reqs * q, q, q, (None,))
        return
    steps = (None,)
    tokens = run.target_num_tokens_after_padding(num_tokens, uniform)
    if spec is Speculator.STANDALONE_AR:
        # the expanded prefill adds a correction token to each request of the target's batch
        # before padding: prepare_prefill_inputs returns src_tokens + num_reqs
        # (33:…/standalone_ar/speculator.py:500-543, 34:…:541-583), run as is (0.33, no manager)
        # or dispatched as is (34:…:389-398)
        tokens = num_tokens + num_reqs
        utc, max_query_len = (q + 1, q + 1) if uniform else (None, q + 2)
    elif spec is Speculator.MULTI_MODULE_MTP:
        steps = tuple(range(num_speculative_steps(scenario)))  # one module per step, one manager
    run.draft_forward("prefill", num_reqs, tokens, utc, max_query_len, steps)
    if spec is Speculator.MULTI_MODULE_MTP:
        return
    for _ in range(num_speculative_steps(scenario) - 1):
        run.draft_forward("decode", num_reqs, num_reqs, 1, 1, (None,), specialize=True)
