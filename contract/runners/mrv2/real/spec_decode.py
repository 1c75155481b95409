"""Beside ``v1/worker/gpu/spec_decode/``: the installed release's own speculator, built, captured
and proposing on the stand-in runner.

vLLM's own: the speculator class, chosen by ``init_speculator`` (``33:…/spec_decode/__init__.py:14-94``,
an ``if/elif`` on the method; ``34:…/__init__.py:18-49``, ``speculator_config.speculator_class``) and
built by its own ``__init__``; ``init_cudagraph_manager`` (run by the runner's block), ``capture``
(``SpeculatorCudaGraphManager.capture`` over the base capture loop, the breakable runner on the
draft model), and ``propose`` entire: ``get_uniform_decode_token_count``, ``dispatch_cg_and_sync_dp``
on the prefill and decode managers, ``specialize_spec_tokens``, ``run_fullgraph``, ``_prefill`` /
``_run_model`` with ``run_pw_graph`` or the draft model, and the multi-step decode loop.

Stand-ins, each because the real one needs what a CPU without attention layers does not have:

- ``load_model``: the draft model is ``backends.TinyDraftModel``, under ``@support_torch_compile``
  when the scenario's draft class is compiled (``draft_compiled``), assigned without weights; it
  has no attention layers (``draft_attn_layer_names`` empty);
- ``set_attn`` (``34:…/spec_decode/speculator.py:390-413``): the model state, KV-cache config,
  block tables, input buffers and attention groups are the stand-in runner's, the draft's own
  attention groups empty; ``supports_decode_metadata_update`` stays False, as for a draft
  attention backend that rebuilds decode metadata eagerly, so each draft decode step is its own
  dispatch (``_multi_step_decode``) as the model steps it;
- the Triton kernels around the forwards, which move tokens and positions between buffers and
  decide nothing about graphs (``KERNELS``): EAGLE's ``prepare_prefill_inputs``,
  ``prepare_decode_inputs`` (0.33) / ``_prepare_decode_inputs`` (0.34), ``update_draft_inputs``;
  multi-module MTP's input, hidden-state, slot-padding and cache kernels; standalone AR's
  ``prepare_prefill_inputs`` keeps its Python wrapper, whose returned token count the proposal
  dispatches, and only its launch is a stand-in; ``sample_draft`` returns draft token 0;
- ``_build_attn_metadata``, ``_build_uniform_attn_metadata``, ``block_tables.compute_slot_mappings``
  and standalone AR's ``expanded_slot_mappings``: the stand-in attention kernel reads none of them
  (``get_attention_context`` finds the draft layer's entry, ``None``);
- the proposal's inputs (``input_batch``, the target's hidden states, sampled and rejected
  counts): the scheduler's side, written from the step's event as the target's are.

A draft forward that no ``dispatch_cg_and_sync_dp`` precedes (0.33's standalone AR never
dispatches; 0.34's does not on a profile pass) is reported with the NONE descriptor of its batch,
the one ``dispatch_cg_and_sync_dp`` returns under ``need_eager``.
"""

from __future__ import annotations

import importlib
import types

import numpy as np
import torch

from contract.runners.mrv2.real import backends
from contract.real.attention_op import DRAFT_LAYER
from contract.runners.mrv2.real.modules import SPECULATORS
from contract.core.scenario import DrafterKind, Scenario, Speculator

PACKAGE = SPECULATORS
# 0.34 names the class through the method's SpeculatorConfig (34:…/spec_decode/*/config.py).
CONFIG_MODULES = {Speculator.EAGLE: "eagle", Speculator.MULTI_MODULE_MTP: "multi_module_mtp",
                  Speculator.DFLASH: "dflash", Speculator.STANDALONE_AR: "standalone_ar"}
KERNELS = ("prepare_prefill_inputs", "prepare_decode_inputs", "update_draft_inputs",  # EAGLE
           "prepare_input_buffers", "prepare_input_hidden_states_and_embeddings",  # multi-module MTP
           "pad_trailing_draft_slots", "cache_inputs")
MANAGERS = (("prefill_cudagraph_manager", "prefill"), ("decode_cudagraph_manager", "decode"),
            ("cudagraph_manager", "prefill"))
PREFILL_CONTEXT, DECODE_CONTEXT = "propose", "propose_decode"


def _no_op(*args, **kwargs) -> None:
    return None


class _Launch:
    """A Triton kernel launch ``kernel[grid](...)`` that does nothing."""

    def __getitem__(self, grid):
        return _no_op


# Wrappers whose return value the proposal reads: only their kernel launch is a stand-in
# (standalone AR's expanded token count, 34:…/standalone_ar/speculator.py:541-583).
KEEP_WRAPPER = {"standalone_ar": ("prepare_prefill_inputs",)}


def _speculator_config(scenario: Scenario):
    """0.34's ``SpeculatorConfig`` of the method: the class attribute ``speculator_class``."""
    module = importlib.import_module(f"{PACKAGE}.{CONFIG_MODULES[scenario.speculator]}.config")
    for value in vars(module).values():
        if isinstance(value, type) and value.__module__ == module.__name__ and "speculator_class" in vars(value):
            if scenario.speculator is not Speculator.DFLASH or "DFlash" in value.__name__:
                return value
    raise LookupError(f"{module.__name__} names no speculator_class")


def build(vllm_config, scenario: Scenario, device) -> object | None:
    """``init_speculator(vllm_config, device, req_states)`` (``GPUModelRunner.__init__``)."""
    if scenario.drafter is DrafterKind.NONE:
        return None
    init = importlib.import_module(PACKAGE)
    spec_config = vllm_config.speculative_config
    if "speculator_class" in init.init_speculator.__code__.co_names or "speculator_config" in \
            init.init_speculator.__code__.co_names:
        object.__setattr__(spec_config, "speculator_config", _speculator_config(scenario))
    return init.init_speculator(vllm_config, device, None)


class Observed:
    """The speculator's stand-ins installed and its forwards told to the replay.

    ``on_forward(which, mode_name, desc, step_idx)`` hears each draft forward as the model steps it: a
    draft prefill or decode step about to run under the descriptor its manager dispatched
    (``which`` is ``prefill`` or ``decode``; ``step_idx`` the module of a multi-module MTP step).
    ``on_capture_step(step_idx)`` hears each module step of a PIECEWISE capture run."""

    def __init__(self, speculator, runner, model, on_forward, on_capture_step) -> None:
        self.speculator, self.on_forward, self.on_capture_step = speculator, on_forward, on_capture_step
        self.capturing = False
        self.current: tuple[str, object] | None = None
        self.forwards, self.num_reqs = 0, 0
        self.managers: dict[int, str] = {}
        spec = speculator
        # load_model
        spec.model = model
        spec.draft_attn_layer_names = set()
        spec.supports_mm_inputs = False
        # set_attn
        spec.model_state = runner.model_state
        spec.kv_cache_config = runner.kv_cache_config
        spec.block_tables = runner.block_tables
        spec.attn_groups = []
        spec.target_input_buffers = runner.input_buffers
        spec.target_attn_groups = runner.attn_groups
        spec.supports_decode_metadata_update = False
        # kernels and sampling
        spec.sample_draft = lambda hidden_states, *a, **k: torch.zeros(hidden_states.shape[0], dtype=torch.int64)
        spec._prepare_decode_inputs = _no_op
        spec._build_uniform_attn_metadata = _no_op
        spec._build_attn_metadata = lambda *a, **k: {DRAFT_LAYER: None}
        spec._update_draft_decode_metadata = _no_op
        spec.expanded_slot_mappings = torch.empty(0, spec.max_num_tokens + spec.max_num_reqs, dtype=torch.int64)
        for cls in type(spec).__mro__:
            module = importlib.import_module(cls.__module__)
            if module.__name__.startswith(PACKAGE):
                for name in KERNELS:
                    launch = getattr(module, f"_{name}_kernel", None)
                    if name in KEEP_WRAPPER.get(module.__name__.rsplit(".", 2)[-2], ()) and launch is not None:
                        setattr(module, f"_{name}_kernel", _Launch())
                    elif callable(getattr(module, name, None)):
                        setattr(module, name, _no_op)
                self._watch_dispatch(module)
        original_run_model = spec._run_model

        def _run_model(num_tokens, *args, **kwargs):
            from vllm.config.compilation import CUDAGraphMode

            mode = kwargs.get("cudagraph_runtime_mode") or next(
                (a for a in args if isinstance(a, CUDAGraphMode)), CUDAGraphMode.NONE)
            step_idx = kwargs.get("spec_module_idx")  # multi-module MTP: one module per step
            if not self.capturing and self.current is None:
                # A draft forward with no dispatch before it (standalone AR: 0.33 always,
                # 34:…/standalone_ar/speculator.py:339-352 on a profile pass): the NONE descriptor
                # of its batch, as dispatch_cg_and_sync_dp returns for need_eager.
                n = num_tokens if isinstance(num_tokens, int) else num_tokens.shape[0]
                which = "prefill" if not self.forwards else "decode"
                self.on_forward(which, "NONE", _none_descriptor(n, self.num_reqs if which == "prefill" else n),
                                step_idx)
                self.forwards += 1
            elif not self.capturing:
                which, desc = self.current
                self.on_forward(which, mode.name, desc, step_idx)
                self.forwards += 1
            elif self.capturing and step_idx is not None and mode.name == "PIECEWISE":
                self.on_capture_step(step_idx)
            return original_run_model(num_tokens, *args, **kwargs)

        spec._run_model = _run_model
        original_capture = spec.capture

        def capture() -> None:  # called by capture_model, vLLM's own
            self.capturing = True
            _OBSERVED[0] = self
            try:
                original_capture()
            finally:
                self.capturing = False
                _OBSERVED[0] = None

        spec.capture = capture

    def _watch_dispatch(self, module) -> None:
        """``dispatch_cg_and_sync_dp`` as the speculator's module binds it: remember which
        manager dispatched which descriptor."""
        original = getattr(module, "dispatch_cg_and_sync_dp", None)
        if original is None or getattr(original, "_observed", False):
            return
        original = getattr(original, "__wrapped__", original)

        def dispatch_cg_and_sync_dp(manager, *args, **kwargs):
            desc, sync = original(manager, *args, **kwargs)
            owner = _OBSERVED[0]
            if owner is not None:
                owner.current = (owner.managers.get(id(manager), "prefill"), desc)
            return desc, sync

        dispatch_cg_and_sync_dp.__wrapped__ = original
        dispatch_cg_and_sync_dp._observed = True
        module.dispatch_cg_and_sync_dp = dispatch_cg_and_sync_dp

    def managers_built(self) -> list[tuple[str, object]]:
        """The managers ``init_cudagraph_manager`` built: (``prefill`` or ``decode``, manager),
        each watched for its specialised decode descriptor and its FULL replays."""
        out = []
        for attr, which in MANAGERS:
            manager = getattr(self.speculator, attr, None)
            if manager is None or id(manager) in self.managers:
                continue
            self.managers[id(manager)] = which
            out.append((which, manager))
            self._watch_manager(which, manager)
        return out

    def _watch_manager(self, which: str, manager) -> None:
        run_fullgraph = manager.run_fullgraph

        def watched_run_fullgraph(desc, *args, **kwargs):
            if not self.capturing:
                self.on_forward(which, desc.cg_mode.name, desc, None)
            return run_fullgraph(desc, *args, **kwargs)

        manager.run_fullgraph = watched_run_fullgraph
        specialize = getattr(manager, "specialize_spec_tokens", None)
        if specialize is not None:
            def watched_specialize(desc, *args, **kwargs):
                out = specialize(desc, *args, **kwargs)
                self.current = (which, out)
                return out

            manager.specialize_spec_tokens = watched_specialize

    def propose(self, num_reqs: int, num_tokens: int, num_tokens_padded: int, scheduled: list[int],
                decode_graph_eligible: bool, is_profile: bool) -> None:
        """``speculator.propose`` after a target forward of ``num_tokens`` (padded
        ``num_tokens_padded``) over requests of ``scheduled`` tokens each."""
        spec = self.speculator
        device = torch.device("cpu")
        max_reqs = spec.max_num_reqs
        input_batch = types.SimpleNamespace(
            num_reqs=num_reqs, num_tokens=num_tokens, num_tokens_after_padding=num_tokens_padded,
            num_reqs_after_padding=num_reqs,
            num_scheduled_tokens=np.array(scheduled, dtype=np.int32),
            seq_lens_cpu_upper_bound=torch.full((max_reqs,), 16, dtype=torch.int32),
            seq_lens=torch.full((max_reqs,), 16, dtype=torch.int32, device=device),
            idx_mapping=torch.arange(num_reqs, dtype=torch.int32, device=device),
            decode_graph_eligible=decode_graph_eligible,
            input_ids=torch.zeros(num_tokens_padded, dtype=torch.int32),
            positions=torch.zeros(num_tokens_padded, dtype=torch.int64),
            query_start_loc=torch.tensor(np.concatenate([[0], np.cumsum(scheduled)]), dtype=torch.int32),
            query_start_loc_np=np.concatenate([[0], np.cumsum(scheduled)]).astype(np.int32),
        )
        kwargs = dict(
            input_batch=input_batch, attn_metadata=None, slot_mappings=None,
            last_hidden_states=torch.zeros(num_tokens_padded, spec.hidden_size),
            aux_hidden_states=None,
            num_sampled=torch.ones(num_reqs, dtype=torch.int32),
            num_rejected=torch.zeros(num_reqs, dtype=torch.int32),
            last_sampled=torch.zeros(max_reqs, dtype=torch.int64),
            next_prefill_tokens=torch.zeros(max_reqs, dtype=torch.int64),
            temperature=torch.zeros(max_reqs, dtype=torch.float32),
            seeds=torch.zeros(max_reqs, dtype=torch.int64),
            dp_sync_state=None, dummy_run=is_profile, is_profile=is_profile,
            # profile_run's _dummy_run(skip_attn=True) (33:…/model_runner.py:1034-1036, 34:…:1086-1088)
            skip_attn_for_dummy_run=is_profile,
        )
        _OBSERVED[0] = self
        self.current, self.forwards, self.num_reqs = None, 0, num_reqs
        try:
            spec.propose(**kwargs)
        finally:
            _OBSERVED[0] = None

    def prefill_manager(self):
        for attr, which in MANAGERS:
            manager = getattr(self.speculator, attr, None)
            if manager is not None and which == "prefill":
                return manager
        return None


_OBSERVED: list[Observed | None] = [None]


def _none_descriptor(num_tokens: int, num_reqs: int):
    from vllm.config.compilation import CUDAGraphMode
    from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor

    return BatchExecutionDescriptor(cg_mode=CUDAGraphMode.NONE, num_tokens=num_tokens, num_reqs=num_reqs)


def draft_model(vllm_config, scenario: Scenario, hidden_size: int):
    return backends.build_draft(vllm_config, hidden_size, decorated=scenario.draft_compiled)
