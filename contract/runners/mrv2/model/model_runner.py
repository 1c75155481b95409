"""MRV2's ``GPUModelRunner`` (``v1/worker/gpu/model_runner.py``) and the worker's start-up order, as
an immutable state and a pure step function per event.

- ``load_model``: the model is never wrapped (``33:…/model_runner.py:403,408``, ``34:…:416,421``).
- ``profile_run``: the first forward, where Dynamo compiles; inner ``CUDAGraphWrapper(PIECEWISE)``s
  exist iff the class is compiled and the mode *then* has piecewise graphs
  (``33:compilation/backends.py:678-682``, ``34:…:682-686``).
- ``profile_cudagraph_memory``: first resolve and managers, a throwaway capture (every PIECEWISE
  descriptor, the two widest FULL ones, the speculator), ``clear_all_graphs()`` on both wrapper
  classes, managers dropped (``33:…/cudagraph_utils.py:921-1028,1065-1101``, ``34:…:988-1095,1132-1168``).
  0.34.0 does all that only with the extensible KV cache off: ``if self.cache_config.enable_extensible_kv_cache:
  return 0`` comes first (``34:v1/worker/gpu/model_runner.py:1121-1128``), and ``VllmConfig.__post_init__``
  turns it on by default on CUDA (``34:config/vllm.py:3252-3254``).
- ``resolve``: ``initialize_kv_cache``'s adaptive-verification rewrite, resolve, a new
  ``ModelCudaGraphManager`` and the speculator managers (``33:…/model_runner.py:748-792``, ``34:…:783-829``).
- ``capture_model``: the target manager, then the speculator (``33:…:1086-1139``, ``34:…:1141-1194``).
- ``execute_model``: dispatch, then ``run_fullgraph`` (FULL), ``run_pw_graph`` (PIECEWISE) or the model
  (NONE) (``33:…:2051-2097``, ``34:…:2119-2164``); ``propose``: the speculator after a target batch.

No vLLM guard restricts when a wrapper captures under MRV2 (0.33 never clears the flag, 0.34 has
none), so dispatches carry ``capturing_enabled=None``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from contract.core.forward_context import BatchDescriptor
from contract.core.halts import ADAPTIVE_PROFILE_ERROR, ADAPTIVE_REJECTED
from contract.core.events import (
    CaptureModel,
    Event,
    ExecuteModel,
    LoadModel,
    ProfileCudagraphMemory,
    ProfileRun,
    Propose,
    Resolve,
    lora_problem,
    ranks_problem,
)
from contract.core.lora import lora_capture_cases
from contract.core.modes import FULL, NONE, PIECEWISE, CompilationMode, CUDAGraphMode
from contract.runners.mrv2.model import cudagraph_utils as cgu
from contract.runners.mrv2.model import dp_utils, pp_utils, spec_decode, ubatch_utils
from contract.runners.mrv2.model.dp_utils import RankBatch
from contract.runners.mrv2.model.cudagraph_utils import BED, CudaGraphManager
from contract.core.observation import (
    GLOBAL_POOL,
    PROFILING_CONTEXT,
    THROWAWAY_POOL,
    Action,
    Dispatch,
    LayerAction,
    LayerKind,
    RankServed,
    StepRecord,
)
from contract.core.properties import profiled_pairs, resolved_support
from contract.core.resolve import ResolveRejected, mamba_blocks_rejection
from contract.core.scenario import MAX_NUM_SEQS, Config, ConfigRejected, DrafterKind, Scenario

PROFILE_NUM_TOKENS = 8  # profile_run's _dummy_run(max_num_tokens, is_profile=True): need_eager, NONE
PROFILE_MAX_FULL_DESCS = 2  # profile_cudagraph_memory captures the two widest FULL descriptors


@dataclass(frozen=True)
class Entry:
    """A graph held by a lazy capturer (a breakable runner or the compiled pieces)."""

    layer: str
    key: object
    captured_for: object  # Dispatch.key of the capturing dispatch
    context: str


@dataclass(frozen=True)
class RunnerState:
    config: Config | None
    cudagraph_mode: CUDAGraphMode  # compilation_config.cudagraph_mode (resolve writes it)
    loaded: bool = False
    compiled_target: bool | None = None  # inner PIECEWISE wrappers, decided at the first forward
    compiled_drafter: bool = False
    target: CudaGraphManager | None = None  # self.cudagraph_manager
    prefill: CudaGraphManager | None = None  # the speculator's prefill (or only) manager
    decode: CudaGraphManager | None = None  # the speculator's one-token decode manager
    stages: tuple[CudaGraphManager, ...] = ()  # pipeline stages 1.. : each stage's own manager
    stage_modes: tuple[CUDAGraphMode, ...] = ()  # and its compilation_config.cudagraph_mode, once resolved
    entries: frozenset[Entry] = frozenset()
    completed: frozenset[tuple] = frozenset()  # (layer, Dispatch.key) whose capture completed
    memory_profiled: bool = False
    profiled: frozenset[tuple[str, str]] | None = None  # what profiling captured graphs of (StepRecord.profiled)
    resolved: bool = False
    captured: bool = False
    halted: str | None = None
    config_error: str | None = None  # an assertion at config time: load_model reports the stop (P0)
    adaptive_verification: bool = False  # maybe_create_adaptive_verification_manager built a manager


def has_compiled_submodule(scenario: Scenario, config: Config, draft: bool = False) -> bool:
    """``has_compiled_submodule`` (``33:…/cudagraph_utils.py:141-147``): an active
    ``@support_torch_compile`` submodule, i.e. a decorated class and ``do_not_compile`` False
    (``34:compilation/decorators.py:408-416``: compilation mode NONE disables it)."""
    decorated = scenario.draft_compiled if draft else scenario.model_compiled
    return decorated and config.compilation_mode == CompilationMode.VLLM_COMPILE


def skips_profiling(scenario: Scenario, policy) -> bool:
    """``profile_cudagraph_memory`` returns 0 before its throwaway capture: ``if
    self.cache_config.enable_extensible_kv_cache: return 0`` (``34:v1/worker/gpu/model_runner.py:1123-1125``),
    the extensible KV cache being on by default on CUDA (``34:config/vllm.py:3252-3254``). 0.33.0
    always profiles (``33:…/model_runner.py:1069-1073``)."""
    return policy.extensible_kv_cache_skips_profiling and scenario.extensible_kv_cache


def initial_state(scenario: Scenario, policy) -> RunnerState:
    """``VllmConfig.__post_init__`` (shared with MRV1, without MRV1's ``CudagraphDispatcher`` assert)."""
    try:
        config = policy.post_init(scenario, policy.config_revision)
    except ConfigRejected as exc:
        if exc.assertion:
            return RunnerState(None, NONE, config_error=exc.halted)
        return RunnerState(None, NONE, halted=exc.halted)
    return RunnerState(config, config.cudagraph_mode)


def enabled(scenario: Scenario, policy, state: RunnerState, event: Event) -> bool:
    if state.halted:
        return False
    if isinstance(event, LoadModel):
        return not state.loaded
    if isinstance(event, ProfileRun):
        return state.loaded and state.compiled_target is None
    if state.compiled_target is None:
        return False
    if isinstance(event, ProfileCudagraphMemory):
        # 33:v1/worker/gpu_worker.py:709-717 runs it when mode != NONE; 34:…:742-747 always (the env
        # flag defaults on), and then 34:…/cudagraph_utils.py:1005-1009 returns at once on NONE.
        return (state.cudagraph_mode != NONE and not state.memory_profiled and not state.resolved
                and not state.captured)
    if isinstance(event, Resolve):
        # The worker calls initialize_kv_cache once (33:v1/worker/gpu_worker.py:907-910, 34:…:936-958); only
        # memory profiling runs it before, and drops what it built.
        return not state.resolved and not state.captured
    if isinstance(event, CaptureModel):
        return state.resolved and not state.captured
    if isinstance(event, ExecuteModel):
        q = scenario.uniform_decode_query_len
        if not state.captured or len(event.peers) != scenario.data_parallel_size - 1 or any(
                p.uniform_decode and p.num_tokens % q for p in (event, *event.peers)):
            return False
        if ranks_problem([event], scenario.data_parallel_size, scenario.micro_batched):
            return False
        return not (event.num_active_loras and lora_problem([event], scenario.max_loras, q, MAX_NUM_SEQS))
    if isinstance(event, Propose):
        if not state.captured or event.uniform_decode and event.num_tokens % scenario.uniform_decode_query_len:
            return False
        return scenario.drafter is DrafterKind.WITH_MODEL and scenario.data_parallel_size == 1
    return False


class _Step:
    """One event's dispatches and state changes."""

    def __init__(self, scenario: Scenario, policy, state: RunnerState):
        self.scenario, self.policy, self.state = scenario, policy, state
        self.dispatches: list[Dispatch] = []
        self.changes: list[str] = []
        self.context = ""
        self.capture_phase = False
        self.ranks: tuple[RankServed, ...] = ()
        self.stages: tuple[RankServed, ...] = ()
        self.stage_rejected: str | None = None

    def set(self, note: str | None = None, **changes) -> None:
        self.state = replace(self.state, **changes)
        if note:
            self.changes.append(note)

    def halt(self, error: str) -> None:
        self.set(halted=error)

    # -- one forward -------------------------------------------------------------------------

    def _record(self, role: str, desc: BED, actions: list[LayerAction], ran_eager: bool, error: str | None,
                step_idx: int | None, manager: CudaGraphManager | None, attention_captured: bool = False) -> Dispatch:
        key = desc if step_idx is None else (desc, step_idx)
        layer = manager.layer if manager is not None else role
        d = Dispatch(role=role, context=self.context, runtime_mode=desc.cg_mode, batch_descriptor=desc,
                     layers=tuple(actions), capture_phase=self.capture_phase, capturing_enabled=None,
                     ran_eager=ran_eager, error=error, previously_captured=(layer, key) in self.state.completed,
                     spec_step_idx=step_idx, attention_captured=attention_captured,
                     selected_loras=self._selected_loras(role, desc))
        self.dispatches.append(d)
        if error:
            self.halt(error)
        return d

    def _selected_loras(self, role: str, desc: BED) -> int:
        """The dummy adapters a target capture runs with: the LoRA capture hook selects
        ``min(num_active_loras, max_loras)`` of them for the descriptor's case (``maybe_select_dummy_loras``
        caps the ``max_loras + 1`` case at ``max_loras`` adapters beside requests without one,
        ``34:v1/worker/lora_model_runner_mixin.py:161-173``). The drafter's captures are not observed: whether
        its graphs read the adapters the target's last case left selected is not modelled."""
        if role != "target" or not self.capture_phase or not self.policy.capture_selects_loras:
            return 0
        return min(desc.num_active_loras, self.scenario.max_loras)

    def _complete(self, manager: CudaGraphManager | None, role: str, key: object) -> None:
        layer = manager.layer if manager is not None else role
        self.set(completed=self.state.completed | {(layer, key)})

    def _entry(self, layer: str, key: object) -> Entry | None:
        return next((e for e in self.state.entries if e.layer == layer and e.key == key), None)

    def _pool(self, kind: LayerKind) -> str:
        """The pool a capture goes into. Memory profiling points the global pool at a throwaway one,
        which the managers and breakable runners it builds bind, and swaps the pool of every wrapper
        bound before, the compiled pieces' (``33:…/cudagraph_utils.py:947-988``,
        ``34:…:1014-1055``); capture_model's captures go into the global pool."""
        if self.context != PROFILING_CONTEXT:
            return GLOBAL_POOL
        if kind is LayerKind.compiled and not self.policy.profiling_swaps_wrapper_pools:
            return GLOBAL_POOL
        return THROWAWAY_POOL

    def _lazy(self, actions: list, layer: str, kind: LayerKind, layer_mode, key, for_key, depth: int) -> bool:
        """A lazy capturer acting on a PIECEWISE call: replay its entry or capture one. True when
        it captured (its runnable then runs inside the capture)."""
        entry = self._entry(layer, key)
        if entry is not None:
            actions.append(LayerAction(layer, kind, layer_mode, Action.REPLAYED, entry_mode=PIECEWISE,
                                       entry_key=entry.captured_for, entry_context=entry.context))
            return False
        actions.append(LayerAction(layer, kind, layer_mode, Action.CAPTURED, depth=depth, pool=self._pool(kind)))
        self.set(entries=self.state.entries | {Entry(layer, key, for_key, self.context)})
        return True

    def _model(self, role: str, mode: CUDAGraphMode, bd: BatchDescriptor, actions: list, for_key, depth: int) -> bool:
        """``model(**inputs)`` under a forward context: the compiled pieces act on PIECEWISE
        (``compilation/cuda_graph.py:245-264``); True when the raw model ran eagerly."""
        compiled = self.state.compiled_drafter if role == "drafter" else self.state.compiled_target
        if compiled and mode == PIECEWISE:
            # Per-piece CUDAGraphWrapper(PIECEWISE)s act together: one layer.
            self._lazy(actions, f"{role}:compiled", LayerKind.compiled, PIECEWISE, bd, for_key, depth)
            return False
        return depth == 0

    def run_pw_graph(self, role: str, manager: CudaGraphManager, desc: BED, bd: BatchDescriptor,
                     step_idx: int | None) -> None:
        """``run_pw_graph`` (``33:…/cudagraph_utils.py:578-583``, ``34:…:627-632``)."""
        actions: list[LayerAction] = []
        for_key = desc if step_idx is None else (desc, step_idx)
        ran_eager, error, attention_captured = False, None, False
        if manager.use_breakable_cg:
            if not manager.breakable_runner:
                error = "AssertionError: assert self.breakable_cg_runner is not None"
            elif self.policy.breakable_runner_mode in (None, PIECEWISE):
                # BreakableCUDAGraphWrapper acts on any non-NONE mode matching its runtime_mode
                # (34:compilation/breakable_cudagraph.py:337-347); key_fn adds the module index.
                key = (bd, step_idx) if manager.key_fn else bd
                if self._lazy(actions, manager.runner_layer, LayerKind.BreakableCUDAGraphWrapper,
                              self.policy.breakable_runner_mode, key, for_key, 0):
                    self._model(role, PIECEWISE, bd, actions, for_key, 1)
                    # The attention op breaks the capture only when the release marks it
                    # (``eager_break_during_capture``, ``34:compilation/breakable_cudagraph.py:107-124``).
                    attention_captured = not self.policy.attention_eager_break
            else:
                actions.append(LayerAction(manager.runner_layer, LayerKind.BreakableCUDAGraphWrapper,
                                           self.policy.breakable_runner_mode, Action.PASSED))
                ran_eager = self._model(role, PIECEWISE, bd, actions, for_key, 0)
        else:
            ran_eager = self._model(role, PIECEWISE, bd, actions, for_key, 0)
        self._record(role, desc, actions, ran_eager, error, step_idx, manager, attention_captured)
        if not error and any(a.action is Action.CAPTURED for a in actions):
            self._complete(manager, role, for_key)

    def run_fullgraph(self, role: str, manager: CudaGraphManager, desc: BED, attr: str) -> None:
        """``run_fullgraph`` (``33:…:555-568``, ``34:…:604-617``): a replay; a descriptor with no
        graph is vLLM's AssertionError, which stops the engine."""
        if desc in manager.graphs:
            action = LayerAction(manager.layer, LayerKind.CudaGraphManager, FULL, Action.REPLAYED,
                                 entry_mode=FULL, entry_key=desc)
            self._record(role, desc, [action], False, None, None, manager)
        elif self.policy.run_fullgraph_captures:
            self.capture_full(role, manager, desc, attr)
        else:
            error = f"AssertionError: No cudagraph for {desc}"
            action = LayerAction(manager.layer, LayerKind.CudaGraphManager, FULL, Action.RAISED, error=error)
            self._record(role, desc, [action], False, error, None, manager)

    def capture_full(self, role: str, manager: CudaGraphManager, desc: BED, attr: str) -> None:
        """``torch.cuda.graph`` around ``forward_fn(NONE)``: no wrapper acts inside
        (``33:…:486-513``, ``34:…:521-548``)."""
        if desc in manager.graphs:
            self.halt(f"AssertionError: Graph already captured for {desc}")
            return
        action = LayerAction(manager.layer, LayerKind.CudaGraphManager, FULL, Action.CAPTURED,
                             pool=self._pool(LayerKind.CudaGraphManager))
        self._record(role, desc, [action], False, None, None, manager)
        manager = replace(manager, graphs=manager.graphs | {desc})
        self.set(**{attr: manager})
        self._complete(manager, role, desc)

    def eager(self, role: str, desc: BED, step_idx: int | None = None) -> None:
        self._record(role, desc, [], True, None, step_idx, None)

    def forward(self, role: str, attr: str, desc: BED, step_idxs=(None,)) -> None:
        """The runner's branch on the descriptor's mode (``execute_model``'s "Run model" block,
        ``_run_model`` of the speculators)."""
        manager = getattr(self.state, attr)
        if desc.cg_mode == FULL:
            self.run_fullgraph(role, manager, desc, attr)
            return
        for step_idx in step_idxs:
            if self.state.halted:
                return
            if desc.cg_mode == PIECEWISE:
                self.run_pw_graph(role, getattr(self.state, attr), desc, self.forward_context_bd(role, desc), step_idx)
            else:
                self.eager(role, desc, step_idx)

    def forward_context_bd(self, role: str, desc: BED) -> BatchDescriptor:
        """The forward context's ``BatchDescriptor``, the compiled pieces' key: the target's carries
        the LoRA fields with ``--enable-lora`` (``has_lora`` on 0.33.0 only; the capture's
        ``33:…/cudagraph_utils.py:757-761``, ``34:…:817-820``; serving's ``33:…/model_runner.py:2062-2066``,
        ``34:…:2130-2133``); the speculators' is ``BatchDescriptor(num_tokens)``
        (``34:…/target_dependent_ar/speculator.py:389``)."""
        if role != "target" or not self.scenario.max_loras:
            return BatchDescriptor(desc.num_tokens)
        # a capture without the key field serving looks up: has_lora on 0.33.0 (vLLM #43160), the count on 0.34.0
        keyed = not self.capture_phase or self.policy.capture_key_lora
        v033 = self.policy.release == "0.33"
        return BatchDescriptor(desc.num_tokens, has_lora=v033 and keyed,
                               num_active_loras=desc.num_active_loras if keyed or v033 else 0)

    # -- start-up ----------------------------------------------------------------------------

    def initialize_kv_cache(self, is_profiling: bool = False) -> None:
        s, p, st = self.scenario, self.policy, self.state
        available = p.piecewise_capture_available(s.breakable, has_compiled_submodule(s, st.config))
        mode = st.cudagraph_mode
        manager = s.adaptive_verification
        if manager and p.adaptive_verification_check is not None:
            # maybe_create_adaptive_verification_manager runs before the rewrite and resolve, in
            # every initialize_kv_cache (33:…/model_runner.py:703 vs :752, 34:…:738 vs :788).
            rejected = p.adaptive_verification_check(s)
            if rejected:
                self.set(f"{ADAPTIVE_REJECTED}{rejected}", halted=f"{ADAPTIVE_REJECTED}{rejected}")
                return
        self.set(adaptive_verification=manager)
        if manager and p.resolve_adaptive_cudagraph_mode is not None:
            mode = p.resolve_adaptive_cudagraph_mode(mode, available)
            if mode != st.cudagraph_mode:
                self.changes.append(f"adaptive verification: cudagraph_mode {st.cudagraph_mode.name} -> {mode.name}")
        try:
            resolved = p.resolve(mode, st.config, resolved_support(s, p.resolve_reads_draft_layers),
                                 s.uniform_decode_query_len, True,
                                 st.config.cudagraph_capture_sizes, available)
            if p.mamba_blocks_rejected(resolved.cudagraph_mode, s.mamba_cache_blocks, MAX_NUM_SEQS, is_profiling):
                raise ResolveRejected(mamba_blocks_rejection(MAX_NUM_SEQS, s.mamba_cache_blocks))
        except ResolveRejected as exc:
            self.set(f"resolve rejected: {exc}", halted=f"resolve rejected: {exc}")
            return
        r = resolved.cudagraph_mode
        if r != mode:
            self.changes.append(f"cudagraph_mode {mode.name} -> {r.name}")
        sizes = resolved.cudagraph_capture_sizes
        q = s.uniform_decode_query_len
        lora_cases = lora_capture_cases(s.max_loras, s.specialize_active_lora)  # 33:…:771, 34:…:808
        target = cgu.build("target:CudaGraphManager", p.release, r, sizes, q, target_q=q,
                           use_breakable_cg=p.use_breakable_cg(s.breakable, r),
                           varlen_decode=s.adaptive_verification, lora_cases=lora_cases,
                           breakable_pads_requests=p.breakable_pads_requests,
                           ubatching=ubatch_utils.ubatching(s, p.release),  # maybe_build_ubatch_runner, 34:…:768-775
                           twin=p.ubatch_twin)
        managers = spec_decode.SpeculatorManagers()
        if s.drafter is DrafterKind.WITH_MODEL:
            managers = spec_decode.init_cudagraph_manager(s, p, r, sizes)
        self.set(cudagraph_mode=r, target=target, prefill=managers.prefill, decode=managers.decode, resolved=True)
        self.resolve_stages(available)
        if not p.compile_at_first_forward:
            self.compile(r)

    def resolve_stages(self, available: bool) -> None:
        """Stages 1.. run ``initialize_kv_cache`` in workers of their own: each resolves from its own
        ``compilation_config.cudagraph_mode`` (which memory profiling's resolve wrote back) under its
        own support. A stage's refusal stops vLLM once stage 0's step is done (``stage_rejected``)."""
        s, st = self.scenario, self.state
        if s.pipeline_parallel_size == 1:
            return
        modes = st.stage_modes or (st.config.cudagraph_mode,) * (s.pipeline_parallel_size - 1)
        try:
            stages = pp_utils.stage_managers(s, self.policy, modes, st.config, available)
        except pp_utils.StageRejected as exc:
            stage, halted = exc.args
            self.stage_rejected = f"PP stage {stage}: {halted}"
            return
        for stage, (before, manager) in enumerate(zip(modes, stages), start=1):
            if manager.cudagraph_mode != before:
                self.changes.append(f"PP stage {stage}: cudagraph_mode {before.name} -> {manager.cudagraph_mode.name}")
        self.set(stages=stages, stage_modes=tuple(m.cudagraph_mode for m in stages))

    def compile(self, mode: CUDAGraphMode) -> None:
        """Dynamo compile: inner PIECEWISE wrappers iff the class is compiled, attention is in the
        splitting ops and ``has_piecewise_cudagraphs()`` of the mode at that moment
        (``33:compilation/backends.py:678-682``, ``34:…:682-686``)."""
        s, cfg = self.scenario, self.state.config
        inner = cfg.splitting_ops_contain_attention and mode.has_piecewise_cudagraphs()
        compiled = has_compiled_submodule(s, cfg) and inner
        has_drafter = s.drafter is DrafterKind.WITH_MODEL
        compiled_drafter = has_drafter and has_compiled_submodule(s, cfg, draft=True) and inner
        self.set(f"compiled under {mode.name}: inner PIECEWISE wrappers {'yes' if compiled else 'no'}"
                 + (f" (drafter {'yes' if compiled_drafter else 'no'})" if has_drafter else ""),
                 compiled_target=compiled, compiled_drafter=compiled_drafter)

    def capture_manager(self, which: str, step_idxs=(None,), max_full: int | None = None) -> None:
        """``CudaGraphManager.capture`` (``33:…:423-515``, ``34:…:455-550``): PIECEWISE descriptors,
        then FULL, widest first; ``_graphs_captured`` set at the end."""
        role = "target" if which == "target" else "drafter"
        manager: CudaGraphManager = getattr(self.state, which)
        # ModelCudaGraphManager.capture and the speculators' capture() create the runner for the
        # target and draft-prefill managers only (33:…/cudagraph_utils.py:630-631,
        # 33:…/target_dependent_ar/speculator.py:124-125); draft decodes never run PIECEWISE.
        if manager.use_breakable_cg and not manager.breakable_runner and which != "decode":
            self.set(**{which: replace(manager, breakable_runner=True)})
        for mode, descs in getattr(self.state, which).capture_descs:
            for desc in descs[:max_full] if mode == FULL else descs:
                if self.state.halted:
                    return
                if mode == FULL:
                    self.capture_full(role, getattr(self.state, which), desc, which)
                else:
                    self.forward(role, which, desc, step_idxs)
        if not self.state.halted:
            self.set(**{which: replace(getattr(self.state, which), graphs_captured=True)})

    def capture_model(self, max_full: int | None = None) -> None:
        st, s = self.state, self.scenario
        if st.target is not None:
            mode = st.target.cudagraph_mode
            if mode.has_piecewise_cudagraphs() and not (
                    st.target.use_breakable_cg or has_compiled_submodule(s, st.config)):
                # ModelCudaGraphManager.capture's backstop (33:…/cudagraph_utils.py:633-641, 34:…:681-689)
                self.halt(f"RuntimeError: piecewise CUDA graphs (cudagraph_mode={mode.name}) unavailable")
                return
            self.capture_manager("target", max_full=max_full)
        if not self.state.halted and st.stages and max_full is None:
            self.set(stages=pp_utils.captured(st.stages))
        if not self.state.halted and s.drafter is DrafterKind.WITH_MODEL:
            spec_decode.capture(self, s, spec_decode.SpeculatorManagers(self.state.prefill, self.state.decode))
        if (not self.state.halted and max_full is None and self.state.adaptive_verification
                and self.policy.adaptive_verification_profiles and st.target is not None
                and st.target.capture_descs and not self.state.target.graphs):
            # Adaptive verification's cost profiling (not under memory profiling's profile_only):
            # batches_to_profile(captured_token_counts()) of the FULL graphs alone, then
            # set_cost_curves raises on empty curves (33:…/model_runner.py:1140-1146,
            # 34:…:1195-1199, 1224-1234; 34:…/adaptive_verification.py:305-363).
            self.halt(ADAPTIVE_PROFILE_ERROR)

    # -- serving -----------------------------------------------------------------------------

    def batch(self, num_tokens: int, uniform: bool) -> tuple[int, int | None, int]:
        """(num_reqs, uniform_token_count, max_query_len) of an abstract batch: a uniform decode
        batch has ``q`` tokens per request; a mixed one is taken at its most requests, with one
        request longer than ``q`` (a prefill). Under ``decode_graph_by_shape`` a mixed batch of
        prefilling requests sharing its tokens evenly, ``q`` each, is taken for a uniform decode."""
        q = self.scenario.uniform_decode_query_len
        if uniform:
            return num_tokens // q, q, q
        num_reqs = min(num_tokens, MAX_NUM_SEQS)
        if self.policy.decode_graph_by_shape and num_tokens == num_reqs * q:
            return num_reqs, q, q
        return num_reqs, None, q + 1

    def target_num_tokens_after_padding(self, num_tokens: int, uniform: bool) -> int:
        """``max(num_tokens, batch_desc.num_tokens)`` (``33:…/model_runner.py:1396``, ``34:…:1466``)."""
        num_reqs, utc, mql = self.batch(num_tokens, uniform)
        return max(num_tokens, cgu.dispatch(self.state.target, num_reqs, num_tokens, utc, mql).num_tokens)

    def rank_batch(self, num_tokens: int, uniform: bool, need_eager: bool, num_active_loras: int = 0) -> RankBatch:
        num_reqs, utc, mql = self.batch(num_tokens, uniform)
        return RankBatch(num_reqs, num_tokens, utc, mql, need_eager, num_active_loras)

    def execute_model(self, event: ExecuteModel) -> None:
        own = self.rank_batch(event.num_tokens, event.uniform_decode, event.force_eager,
                              event.num_active_loras if self.policy.dispatch_reads_loras else 0)
        if self.state.stages:
            first = pp_utils.first_stage_batch(self.policy, own)
            desc = dp_utils.dispatch_cg_and_sync_dp(self.state.target, (first,))[0]
            self.forward("target", "target", desc)
            if not self.state.halted:
                self.stages, error = pp_utils.serve(self.policy, desc, self.state.stages, own)
                if error:
                    self.halt(error)
            return
        if not event.peers:  # need_eager: dispatch_cg_and_sync_dp returns NONE
            desc = dp_utils.dispatch_cg_and_sync_dp(self.state.target, (own,))[0]
            self.forward("target", "target", desc)
            return
        q, policy = self.scenario.uniform_decode_query_len, self.policy
        batches = (own, *(dp_utils.dummy_batch(q, policy.dp_dummy_batch_aligned) if p.idle
                          else self.rank_batch(p.num_tokens, p.uniform_decode, p.force_eager) for p in event.peers))
        descs = dp_utils.dispatch_cg_and_sync_dp(self.state.target, batches, sync=policy.dp_sync,
                                                 take_min=policy.dp_sync_takes_min,
                                                 votes_need_eager=policy.dp_votes_need_eager)
        idle = (False, *(p.idle for p in event.peers))
        self.ranks = tuple(RankServed(d.cg_mode, d.num_tokens, b.to_json(), b.need_eager, i)
                           for b, d, i in zip(batches, descs, idle))
        self.forward("target", "target", descs[0])

    def draft_forward(self, which: str, num_reqs: int, num_tokens: int, utc: int | None, mql: int | None,
                      step_idxs, specialize: bool = False) -> None:
        """``dispatch_cg_and_sync_dp`` on a speculator manager (one DP rank), then its run branch."""
        if self.state.halted:
            return
        manager = getattr(self.state, which)
        desc = cgu.dispatch(manager, num_reqs, num_tokens, utc, mql)
        if specialize and manager is not None:
            desc = cgu.specialize_spec_tokens(manager, desc)
        self.context = "propose" if which == "prefill" else "propose_decode"
        self.forward("drafter", which, desc, step_idxs)


def step(scenario: Scenario, policy, state: RunnerState, event: Event, index: int = 0) -> tuple[RunnerState, StepRecord]:
    st = _Step(scenario, policy, state)
    st.context = event.kind
    try:
        extra = _apply(st, scenario, policy, state, event)
    except AssertionError as exc:
        st.set(halted=f"AssertionError: {exc}" if str(exc) else "AssertionError")
        extra = {}
    if st.stage_rejected and not st.state.halted:
        st.set(st.stage_rejected, halted=st.stage_rejected)
    record = StepRecord(index=index, event=event, dispatches=tuple(st.dispatches), ranks=st.ranks, stages=st.stages,
                        halted=st.state.halted if st.state.halted != state.halted else None,
                        changes=tuple(st.changes), **extra)
    return st.state, record


def _apply(st: _Step, scenario: Scenario, policy, state: RunnerState, event: Event) -> dict:
    extra: dict = {}
    has_drafter = scenario.drafter is DrafterKind.WITH_MODEL
    if isinstance(event, LoadModel) and state.config_error:
        st.set(halted=state.config_error)
    elif isinstance(event, LoadModel):
        st.set("model loaded unwrapped", loaded=True)
        extra["stacks"] = {"target": "model"} | ({"drafter": "drafter.model"} if has_drafter else {})
        extra["unwrap"] = dict(extra["stacks"])
    elif isinstance(event, ProfileRun):
        if policy.compile_at_first_forward:
            st.compile(state.cudagraph_mode)
        else:
            st.set(compiled_target=False, compiled_drafter=False)
        st.eager("target", BED(NONE, PROFILE_NUM_TOKENS, MAX_NUM_SEQS))
        if has_drafter:
            spec_decode.profile(st, scenario, policy.release, PROFILE_NUM_TOKENS)
    elif isinstance(event, ProfileCudagraphMemory) and skips_profiling(scenario, policy):
        st.set("extensible KV cache: profiling returns 0, nothing captured or resolved", memory_profiled=True)
        extra["cudagraph_mode"] = st.state.cudagraph_mode
    elif isinstance(event, ProfileCudagraphMemory) and not policy.profiling_captures:
        st.set("profile_cudagraph_memory returns 0: nothing captured or resolved", memory_profiled=True,
               profiled=frozenset())
        extra["cudagraph_mode"] = st.state.cudagraph_mode
    elif isinstance(event, ProfileCudagraphMemory):
        st.set(memory_profiled=True)
        st.initialize_kv_cache(is_profiling=True)
        if not st.state.halted:
            st.capture_phase = True
            st.capture_model(max_full=PROFILE_MAX_FULL_DESCS)
            st.capture_phase = False
        if not st.state.halted:
            st.set(profiled=profiled_pairs(StepRecord(0, event, tuple(st.dispatches))))
            # finally: CUDAGraphWrapper.clear_all_graphs() and BreakableCUDAGraphWrapper.clear_all_graphs(),
            # then _teardown_profiling_state drops every manager and its breakable runner.
            kept = frozenset() if policy.profiling_clears_graphs else frozenset(
                e for e in st.state.entries if e.layer.endswith(":compiled"))
            st.set("profiling graphs cleared; managers dropped" if policy.profiling_clears_graphs
                   else "managers dropped; compiled graphs kept", entries=kept, completed=frozenset(),
                   target=None, prefill=None, decode=None, stages=(), resolved=False)
        extra["cudagraph_mode"] = st.state.cudagraph_mode
    elif isinstance(event, Resolve):
        st.initialize_kv_cache()
        extra["cudagraph_mode"] = st.state.cudagraph_mode
        if st.state.prefill is not None:
            extra["drafter_cudagraph_mode"] = st.state.prefill.cudagraph_mode
    elif isinstance(event, CaptureModel):
        st.set(captured=True)
        st.capture_phase = True
        st.capture_model()
        st.capture_phase = False
        extra["profiled"] = state.profiled
    elif isinstance(event, ExecuteModel):
        st.execute_model(event)
    elif isinstance(event, Propose):
        spec_decode.propose(st, scenario, policy.release, event.num_tokens, event.uniform_decode)
    else:  # pragma: no cover - Event is a closed union
        raise TypeError(f"unknown event {event!r}")
    return extra
