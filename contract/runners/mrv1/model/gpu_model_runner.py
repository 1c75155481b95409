"""The modelled Model Runner V1: an immutable state and a pure step function per event.

It follows ``GPUModelRunner`` (``v1/worker/gpu_model_runner.py``) and the worker's call order
(spec §8.3); MRV2 has its own modules (``contract.runners.mrv2``). Who captures is decided by walking the
wrapper stack with the forward-context mode and batch descriptor, layer by layer, the way each wrapper's ``__call__`` does.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from contract.core.forward_context import BatchDescriptor
from contract.core.halts import CAPTURE_GUARD_ERROR, NESTED_BREAKABLE_ERROR
from contract.core.lora import lora_capture_cases
from contract.runners.mrv1.model.cudagraph_dispatcher import DispatcherState, clear_keys, get_capture_descs
from contract.core.events import CaptureModel, Event, ExecuteModel, LoadModel, ProfileCudagraphMemory, ProfileRun, Propose, Resolve
from contract.core.modes import FULL, NONE, PIECEWISE, CompilationMode, CUDAGraphMode
from contract.core.observation import (
    GLOBAL_POOL,
    PRIVATE_POOL,
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
from contract.core.policy import Policy
from contract.core.resolve import ResolveRejected
from contract.core.scenario import MAX_NUM_SEQS, Config, ConfigRejected, DrafterKind, Scenario
from contract.core.ubatch_utils import UBatching
from contract.runners.mrv1.model import dp_utils, llm_base_proposer
from contract.runners.mrv1.model.wrappers import (
    BreakableCUDAGraphWrapper,
    CUDAGraphWrapper,
    LoadContext,
    RawModel,
    Runnable,
    Stacks,
    UBatchWrapper,
    describe,
    unwrap,
)

PROFILE_NUM_TOKENS = 8  # profile_run dispatches max_num_tokens with force_eager


@dataclass(frozen=True)
class Entry:
    """A captured graph held by one layer, keyed as that layer keys it."""

    layer: str
    key: object
    runtime_mode: CUDAGraphMode
    captured_for: BatchDescriptor | None = None  # where the key is not the descriptor (UBatchWrapper's)


@dataclass(frozen=True)
class RunnerState:
    config: Config | None
    cudagraph_mode: CUDAGraphMode  # compilation_config.cudagraph_mode (resolve writes it)
    capture_sizes: tuple[int, ...]
    target_dispatcher: DispatcherState
    drafter_dispatcher: DispatcherState | None
    load_mode: CUDAGraphMode | None = None
    stacks: Stacks | None = None
    compiled_target: bool | None = None  # inner PIECEWISE wrappers, decided at first forward
    compiled_drafter: bool | None = None
    capturing_enabled: bool = True  # compilation/monitor.py:98, starts True
    entries: frozenset[Entry] = frozenset()
    # (role, mode, descriptor) dispatches whose capture completed and was not cleared since
    graphs: frozenset[tuple[str, CUDAGraphMode, BatchDescriptor]] = frozenset()
    memory_profiled: bool = False
    profiled: frozenset[tuple[str, str]] | None = None  # what profiling captured graphs of (StepRecord.profiled)
    resolved: bool = False
    captured: bool = False
    halted: str | None = None
    # An assertion while the config and the runner are built (``ConfigRejected.assertion``): vLLM
    # stops at its first start-up step, which the trace's load_model step reports (P0 start-up).
    config_error: str | None = None


def initial_state(scenario: Scenario, policy: Policy) -> RunnerState:
    """``VllmConfig.__post_init__`` and the runner's constructor: dispatchers built, keys empty."""
    q = scenario.uniform_decode_query_len
    target = DispatcherState(q, lora_cases=lora_capture_cases(scenario.max_loras, scenario.specialize_active_lora))
    drafter = target if scenario.drafter is DrafterKind.WITH_MODEL else None  # the same lora_config
    try:
        config = policy.normalise(scenario, policy.config_revision)
    except ConfigRejected as exc:
        if exc.assertion:
            return RunnerState(None, NONE, (), target, drafter, config_error=exc.halted)
        return RunnerState(None, NONE, (), target, drafter, halted=exc.halted)
    return RunnerState(config, config.cudagraph_mode, config.cudagraph_capture_sizes, target, drafter)


def enabled(scenario: Scenario, policy: Policy, state: RunnerState, event: Event) -> bool:
    """Which events the runner can take next: start-up in the worker's order, then serving."""
    if state.halted:
        return False
    if isinstance(event, LoadModel):
        return state.stacks is None
    if isinstance(event, ProfileRun):
        return state.stacks is not None and state.compiled_target is None
    if state.compiled_target is None:
        return False
    if isinstance(event, ProfileCudagraphMemory):
        # gpu_worker.py:709-717: CUDA, mode != NONE; before the real resolve
        return (
            state.cudagraph_mode != NONE
            and not state.memory_profiled
            and not state.resolved
        )
    if isinstance(event, Resolve):
        return not state.captured
    if isinstance(event, CaptureModel):
        return state.resolved and not state.captured
    if isinstance(event, ExecuteModel):
        q = scenario.uniform_decode_query_len
        return state.captured and len(event.peers) == scenario.data_parallel_size - 1 and not any(
            p.uniform_decode and p.num_tokens % q for p in (event, *event.peers))  # _is_uniform_decode
    if isinstance(event, Propose):
        # on several ranks the draft step is part of ExecuteModel: every rank drafts in it
        return state.captured and scenario.drafter is DrafterKind.WITH_MODEL and scenario.data_parallel_size == 1
    return False


class _Walk:
    """One forward call through a stack under a forward context (mode, batch descriptor)."""

    def __init__(self, state: RunnerState, policy: Policy, role: str, mode: CUDAGraphMode, desc: BatchDescriptor,
                 pool: str):
        self.state, self.policy, self.role, self.mode, self.desc = state, policy, role, mode, desc
        self.pool = pool  # where its captures go
        self.actions: list[LayerAction] = []
        self.new_entries: list[Entry] = []
        self.error: str | None = None
        self.depth = 0
        self.breakable_active = False
        self.ran_eager = False
        self.attention_captured = False
        self.completed = False  # a capture finished on this call

    def _entry(self, layer: str, key: object) -> Entry | None:
        for entry in (*self.state.entries, *self.new_entries):
            if entry.layer == layer and entry.key == key:
                return entry
        return None

    def call(self, node: Runnable, index: int = 0) -> None:
        if self.error:
            return
        if isinstance(node, RawModel):
            self._raw(node)
            return
        layer = f"{self.role}[{index}]:{node.label}"
        if isinstance(node, UBatchWrapper) and self.desc.num_ubatches > 1:
            self._ubatches(node, layer, index)
            return
        if isinstance(node, UBatchWrapper):
            self.actions.append(LayerAction(layer, LayerKind.UBatchWrapper, node.runtime_mode, Action.PASSED))
            if self.mode == FULL and self._entry(layer, self.desc.num_tokens) is not None:
                # A micro-batched graph holds this token count, so FULL runs the runnable eagerly
                # rather than capture a second graph of it (gpu_ubatch_wrapper.py:366-375).
                self.call(node.runnable, index + 1)
            elif self.mode == FULL:  # gpu_ubatch_wrapper.py:378-380
                if node.runtime_mode == NONE:
                    self.error = "AssertionError: UBatchWrapper has no cudagraph_wrapper for a FULL dispatch"
                    return
                sibling = f"{self.role}[{index}]:{node.cudagraph_wrapper_label}"
                self._act(sibling, LayerKind.CUDAGraphWrapper, node.runtime_mode, node.runnable, index + 1, False)
            else:
                self.call(node.runnable, index + 1)
            return
        kind = LayerKind.CUDAGraphWrapper if isinstance(node, CUDAGraphWrapper) else LayerKind.BreakableCUDAGraphWrapper
        if not self.policy.wrapper_acts(node, self.mode):
            self.actions.append(LayerAction(layer, kind, node.runtime_mode, Action.PASSED))
            self.call(node.runnable, index + 1)
            return
        self._act(layer, kind, node.runtime_mode, node.runnable, index + 1, isinstance(node, BreakableCUDAGraphWrapper))

    def _ubatches(self, node: UBatchWrapper, layer: str, index: int) -> None:
        """``UBatchWrapper.__call__`` on a micro-batched forward (``33:v1/worker/gpu_ubatch_wrapper.py:382-456``):
        each micro-batch runs the runnable in a thread of its own under a NONE forward context, so
        no inner wrapper acts. Under FULL the first forward of a token count captures them all into
        one graph (``_capture_ubatches``, which reads no capture flag) in the sibling's pool, or torch's
        own where there is no sibling; later ones replay it."""
        entry = self._entry(layer, self.desc.num_tokens)
        kind, full = LayerKind.UBatchWrapper, self.mode == FULL
        if entry is not None and (full or not self.policy.ubatch_replays_full_only):
            self.actions.append(LayerAction(layer, kind, node.runtime_mode, Action.REPLAYED,
                                            entry_mode=entry.runtime_mode, entry_key=entry.captured_for))
            return
        mode, self.mode = self.mode, NONE
        if full:
            pool = self.pool if node.runtime_mode != NONE else PRIVATE_POOL
            self.actions.append(LayerAction(layer, kind, node.runtime_mode, Action.CAPTURED, depth=self.depth, pool=pool))
            self.depth += 1
            self.call(node.runnable, index + 1)
            self.depth -= 1
        else:  # _run_ubatches
            self.actions.append(LayerAction(layer, kind, node.runtime_mode, Action.PASSED))
            self.call(node.runnable, index + 1)
        self.mode = mode
        if full and not self.error:
            self.completed = True
            self.new_entries.append(Entry(layer, self.policy.ubatch_key(self.desc.num_tokens, self.desc.num_ubatches),
                                          mode, captured_for=self.desc))

    def _raw(self, node: RawModel) -> None:
        # The model's attention op breaks an open breakable capture only when the release marks it;
        # under FULL it runs inside the graph either way (``eager_break_during_capture``,
        # ``33:compilation/breakable_cudagraph.py:99-125``).
        if self.breakable_active and self.mode != FULL and not self.policy.attention_eager_break:
            self.attention_captured = True
        compiled = self.state.compiled_drafter if self.role == "drafter" else self.state.compiled_target
        if compiled and self.mode == PIECEWISE:
            # Per-piece CUDAGraphWrapper(PIECEWISE)s built by wrap_with_cudagraph_if_needed
            # (compilation/backends.py:678-707); they act together, so they count as one layer.
            self._act(f"{self.role}:compiled", LayerKind.compiled, PIECEWISE, None, 0, False)
        elif self.depth == 0:
            self.ran_eager = True

    def _act(self, layer, kind, layer_mode, inner, index, breakable) -> None:
        key = self.policy.entry_key(kind.value, self.mode, self.desc)
        entry = None if key is None else self._entry(layer, key)
        if entry is not None:
            self.actions.append(
                LayerAction(layer, kind, layer_mode, Action.REPLAYED, entry_mode=entry.runtime_mode, entry_key=entry.key)
            )
            return
        # validate_cudagraph_capturing_enabled (compilation/monitor.py:101-110), then, for the
        # breakable wrapper, BreakableCUDAGraphCapture.__enter__ (breakable_cudagraph.py:161-166).
        if not self.state.capturing_enabled:
            self.actions.append(LayerAction(layer, kind, layer_mode, Action.RAISED, error=CAPTURE_GUARD_ERROR))
            self.error = CAPTURE_GUARD_ERROR
            return
        if breakable and self.breakable_active:
            self.actions.append(LayerAction(layer, kind, layer_mode, Action.RAISED, error=NESTED_BREAKABLE_ERROR))
            self.error = NESTED_BREAKABLE_ERROR
            return
        self.actions.append(LayerAction(layer, kind, layer_mode, Action.CAPTURED, depth=self.depth, pool=self.pool))
        outer_breakable = self.breakable_active
        self.depth += 1
        self.breakable_active = self.breakable_active or breakable
        if inner is not None:
            self.call(inner, index)
        self.depth -= 1
        self.breakable_active = outer_breakable
        if not self.error:
            self.completed = True
            if key is not None:
                self.new_entries.append(Entry(layer, key, self.mode))


class _Step:
    """Accumulates one event's dispatches and state changes."""

    def __init__(self, scenario: Scenario, policy: Policy, state: RunnerState):
        self.scenario, self.policy, self.state = scenario, policy, state
        self.dispatches: list[Dispatch] = []
        self.capture_phase = False
        self.selected_loras = 0  # the dummy adapters a capture-phase _dummy_run selected
        self.changes: list[str] = []

    def set(self, note: str | None = None, **changes) -> None:
        self.state = replace(self.state, **changes)
        if note:
            self.changes.append(note)

    def forward(self, role: str, context: str, mode: CUDAGraphMode, desc: BatchDescriptor) -> None:
        state = self.state
        stack = state.stacks.drafter if role == "drafter" else state.stacks.target
        # Memory profiling swaps every wrapper's pool for a throwaway one, the UBatchWrapper's
        # through its cudagraph_wrapper (33:v1/worker/gpu_model_runner.py:6306-6315,
        # 33:v1/worker/gpu_ubatch_wrapper.py:96-98).
        walk = _Walk(state, self.policy, role, mode, desc,
                     THROWAWAY_POOL if context == PROFILING_CONTEXT else GLOBAL_POOL)
        walk.call(stack)
        self.dispatches.append(
            Dispatch(
                role=role,
                context=context,
                runtime_mode=mode,
                batch_descriptor=desc,
                layers=tuple(walk.actions),
                capture_phase=self.capture_phase,
                capturing_enabled=state.capturing_enabled,
                ran_eager=walk.ran_eager,
                error=walk.error,
                previously_captured=(role, mode, desc) in state.graphs,
                attention_captured=walk.attention_captured,
                selected_loras=self.selected_loras if self.capture_phase else 0,
            )
        )
        if walk.completed:
            self.set(entries=state.entries | frozenset(walk.new_entries), graphs=state.graphs | {(role, mode, desc)})
            self.changes.extend(f"entry {e.layer} {e.key} ({e.runtime_mode.name})" for e in walk.new_entries)
        if walk.error:
            self.set(halted=walk.error)

    def execute_model(self, event: ExecuteModel) -> tuple[RankServed, ...]:
        """``execute_model``'s ``_determine_batch_execution_and_padding`` on every DP rank (an idle
        one's batch is the worker's dummy batch), then rank 0's forward; each rank's side where
        there are several, a rank whose re-dispatch asserted stopping the step."""
        q = self.scenario.uniform_decode_query_len
        own = rank_batch(event.num_tokens, event.uniform_decode, event.force_eager, q)
        batches = (own, *(rank_batch(q, True, False, q) if p.idle else
                          rank_batch(p.num_tokens, p.uniform_decode, p.force_eager, q) for p in event.peers))
        runs = dp_utils.determine_batch_execution_and_padding(
            lambda n, uniform, valid: self.dispatch("target", n, uniform, valid_modes=valid,
                                                    num_active_loras=event.num_active_loras), batches,
            ubatching=self.ubatching(), syncs_mode=self.policy.dp_syncs_mode)
        if runs[0].raised is None:
            self.forward("target", "execute_model", runs[0].mode, runs[0].desc)
        stopped = next((i for i, r in enumerate(runs) if r.raised), None)
        if stopped is not None:
            self.set(halted=runs[0].raised if stopped == 0 else f"DP rank {stopped}: {runs[stopped].raised}")
        if not event.peers:
            return ()
        idle = (False, *(p.idle for p in event.peers))
        served = tuple(RankServed.stopped(r.raised) if r.raised else
                       RankServed(r.mode, r.desc.num_tokens, (b.num_reqs, b.num_tokens, q if b.uniform_decode else None),
                                  b.force_eager, i) for b, r, i in zip(batches, runs, idle))
        if stopped is None and not self.state.halted and self.scenario.drafter is DrafterKind.WITH_MODEL:
            return self.draft_across_dp(batches, runs, idle, served)
        return served

    def draft_across_dp(self, batches, runs, idle, served: tuple[RankServed, ...]) -> tuple[RankServed, ...]:
        """Every rank's drafting after its target forward (``llm_base_proposer.py``): a busy rank
        proposes, an idle one runs the drafter's ``dummy_run`` inside its ``_dummy_run``; each of
        their DP syncs agrees the drafter's mode and padded count as the target's does, and rank 0's
        draft forwards are recorded: its first pass (``propose``) and its remaining passes
        (``propose_decode``), whose forwards share one mode and descriptor, so one stands for them.
        Where the ranks' syncs differ in number the step stops on every rank there (a hang); where a
        rank's re-dispatch asserts, that rank stops."""
        s, q = self.scenario, self.scenario.uniform_decode_query_len
        k = q - 1
        syncs = []
        for b, r, i in zip(batches, runs, idle):
            if i:
                eager = not self.policy.drafter_dummy_use_cudagraphs(False, r.mode, s.spec_enforce_eager)
                syncs.append([dp_utils.RankBatch(1, q, False, eager)] * self.policy.drafter_dummy_syncs(k, False))
            else:
                syncs.append([dp_utils.RankBatch(b.num_reqs, n, False)
                              for n in llm_base_proposer.propose_batches(b.num_reqs, b.num_tokens, k)])
        for j in range(max(map(len, syncs))):
            if any(len(rank) <= j for rank in syncs):
                error = llm_base_proposer.out_of_phase([1 + len(rank) for rank in syncs])
                self.set(halted=error)
                return tuple(RankServed.stopped(error) for _ in syncs)
            drafts = dp_utils.determine_batch_execution_and_padding(
                lambda n, uniform, valid: self.dispatch("drafter", n, valid_modes=valid),
                tuple(rank[j] for rank in syncs), syncs_mode=self.policy.dp_syncs_mode)
            if drafts[0].raised is None:
                self.forward("drafter", "propose" if j == 0 else "propose_decode", drafts[0].mode,
                             BatchDescriptor(drafts[0].desc.num_tokens))
            stopped = next((i for i, r in enumerate(drafts) if r.raised), None)
            if stopped is not None:
                self.set(halted=drafts[0].raised if stopped == 0 else f"DP rank {stopped}: {drafts[stopped].raised}")
                return tuple(RankServed.stopped(r.raised) if r.raised else side for r, side in zip(drafts, served))
            if self.state.halted:
                break
        return served

    def ubatching(self) -> UBatching | None:
        """``parallel_config``'s micro-batching (``use_ubatching``), None where off."""
        s = self.scenario
        return UBatching(s.num_ubatches, *s.dbo_thresholds) if s.ubatching else None

    def num_ubatches(self, num_tokens: int, uniform: bool, allow_microbatching: bool = True) -> int:
        """The split of a ``_dummy_run`` every rank makes alike (profiling, capture): the ranks
        agree micro-batches where the batch reaches the threshold (``coordinate_batch_across_dp``,
        which one rank skips)."""
        u, size = self.ubatching(), self.scenario.data_parallel_size
        batches = (dp_utils.RankBatch(0, num_tokens, uniform, allow_microbatching=allow_microbatching),) * size
        return u.num_ubatches if size > 1 and dp_utils.should_ubatch(u, batches, [num_tokens]) else 1

    def dispatch(self, role: str, num_tokens: int, uniform: bool = False, valid_modes=None, num_active_loras: int = 0):
        """The role's dispatcher; the target's with the batch's active adapters
        (``len(input_batch.lora_id_to_lora_request)``, ``33:v1/worker/gpu_model_runner.py:3720-3734``),
        the drafter's with none (``llm_base_proposer.py:1778-1781``)."""
        d = self.state.drafter_dispatcher if role == "drafter" else self.state.target_dispatcher
        return self.policy.dispatch(d, num_tokens, uniform, valid_modes=valid_modes, num_active_loras=num_active_loras)

    def resolve(self) -> None:
        """``_check_and_update_cudagraph_mode`` (``gpu_model_runner.py:6760-6815``)."""
        s, p, st = self.scenario, self.policy, self.state
        try:
            resolved = p.resolve(
                st.cudagraph_mode,
                st.config,
                resolved_support(s, p.resolve_reads_draft_layers),
                s.uniform_decode_query_len,
                False,
                st.capture_sizes,
            )
        except ResolveRejected as exc:
            self.set(f"resolve rejected: {exc}", halted=f"resolve rejected: {exc}")
            return
        mode = resolved.cudagraph_mode
        if mode != st.cudagraph_mode:
            self.changes.append(f"cudagraph_mode {st.cudagraph_mode.name} -> {mode.name}")
        target = p.initialize_cudagraph_keys(st.target_dispatcher, mode, resolved.cudagraph_capture_sizes,
                                             s.uniform_decode_query_len)
        drafter = st.drafter_dispatcher
        if drafter is not None:
            dmode = p.drafter_cudagraph_mode(mode, s.spec_enforce_eager)
            drafter = p.initialize_cudagraph_keys(drafter, dmode, resolved.cudagraph_capture_sizes)
        self.set(
            cudagraph_mode=mode,
            capture_sizes=resolved.cudagraph_capture_sizes,
            target_dispatcher=target,
            drafter_dispatcher=drafter,
            resolved=True,
        )
        if not p.compile_at_first_forward:
            self.compile()

    def compile(self) -> None:
        """Dynamo compile: inner PIECEWISE wrappers iff VLLM_COMPILE, attention in the splitting
        ops and ``has_piecewise_cudagraphs()`` of the mode *now* (``compilation/backends.py:678-682``,
        ``compilation/decorators.py:408-417``)."""
        cfg = self.state.config
        compiled = (
            cfg.compilation_mode == CompilationMode.VLLM_COMPILE
            and cfg.splitting_ops_contain_attention
            and self.state.cudagraph_mode.has_piecewise_cudagraphs()
        )
        has_drafter = self.state.stacks.drafter is not None
        self.set(
            f"compiled under {self.state.cudagraph_mode.name}: inner PIECEWISE wrappers {'yes' if compiled else 'no'}",
            compiled_target=compiled,
            compiled_drafter=compiled if has_drafter else False,
        )

    def capture_descs(self, limit: int | None, context: str) -> None:
        """``_capture_cudagraphs`` → ``_warmup_and_capture`` per descriptor: the capture run
        ``_dummy_run(is_graph_capturing=True, num_active_loras=desc.num_active_loras)`` selects the
        descriptor's dummy LoRA adapters around both forwards (``maybe_dummy_run_with_lora``, at most
        ``max_loras`` of them, ``33:v1/worker/gpu_model_runner.py:5707-5713``), re-dispatches and
        asserts the mode (``:5993-5998``), then runs the drafter's ``dummy_run`` with the policy's
        ``use_cudagraphs`` (``:5808-5838``). Warm-up runs are NONE dispatches and are not recorded."""
        s = self.scenario
        for mode, descs in get_capture_descs(self.state.target_dispatcher):
            for desc in descs[:limit]:
                if self.state.halted:
                    return
                self.selected_loras = min(desc.num_active_loras, s.max_loras)
                got_mode, got_desc = self.dispatch("target", desc.num_tokens, desc.uniform,
                                                   num_active_loras=desc.num_active_loras)
                if got_mode != mode:
                    self.set(halted=f"AssertionError: Cudagraph runtime mode mismatch in dummy_run: {got_mode.name}")
                    return
                # capture_model lets FULL uniform decodes over the threshold micro-batch
                # (33:v1/worker/gpu_model_runner.py:6600-6613); memory profiling none (:6335)
                allow = context == "capture_model" and mode == FULL and desc.uniform
                ubatches = self.num_ubatches(desc.num_tokens, desc.uniform, allow)
                self.forward("target", context, got_mode, replace(got_desc, num_ubatches=ubatches))
                if self.state.halted or s.drafter is not DrafterKind.WITH_MODEL:
                    continue
                use_cudagraphs = self.policy.drafter_dummy_use_cudagraphs(True, mode, s.spec_enforce_eager,
                                                                          desc.num_active_loras)
                dmode, ddesc = self.dispatch("drafter", desc.num_tokens, valid_modes=None if use_cudagraphs else {NONE})
                self.forward("drafter", context, dmode, BatchDescriptor(ddesc.num_tokens))


def rank_batch(num_tokens: int, uniform: bool, force_eager: bool, q: int) -> dp_utils.RankBatch:
    """A batch of ``num_tokens`` as the replay schedules it, and as ``_dummy_run`` shapes one
    (``33:v1/worker/gpu_model_runner.py:5537-5546``): ``q`` tokens per request where uniform, else
    spread over at most ``max_num_seqs`` requests."""
    num_reqs = min(MAX_NUM_SEQS, -(-num_tokens // q)) if uniform else min(num_tokens, MAX_NUM_SEQS)
    return dp_utils.RankBatch(num_reqs, num_tokens, uniform, force_eager)


def step(scenario: Scenario, policy: Policy, state: RunnerState, event: Event, index: int = 0) -> tuple[RunnerState, StepRecord]:
    """Apply one event; return the new state and what it showed."""
    st = _Step(scenario, policy, state)
    try:
        record_extra = _apply(st, scenario, policy, state, event)
    except AssertionError as exc:
        # vLLM's own assertions (mirrored in the model) stop the engine where they fire.
        st.set(halted=f"AssertionError: {exc}" if str(exc) else "AssertionError")
        record_extra = {}
    record = StepRecord(
        index=index,
        event=event,
        dispatches=tuple(st.dispatches),
        halted=st.state.halted if st.state.halted != state.halted else None,
        changes=tuple(st.changes),
        **record_extra,
    )
    return st.state, record


def _apply(st: _Step, scenario: Scenario, policy: Policy, state: RunnerState, event: Event) -> dict:
    record_extra: dict = {}
    if isinstance(event, LoadModel) and state.config_error:
        st.set(halted=state.config_error)
    elif isinstance(event, LoadModel):
        ctx = LoadContext(
            cudagraph_mode=state.cudagraph_mode,
            breakable=scenario.breakable,
            use_ubatching=scenario.ubatching,
            model=RawModel("model"),
            drafter_model=RawModel("drafter.model") if scenario.drafter is DrafterKind.WITH_MODEL else None,
        )
        stacks = policy.load_model(ctx)
        st.set(f"wrapped under {state.cudagraph_mode.name}", stacks=stacks, load_mode=state.cudagraph_mode)
        record_extra["stacks"] = {"target": describe(stacks.target)}
        record_extra["unwrap"] = {"target": unwrap(stacks.target).label}
        if stacks.drafter is not None:
            record_extra["stacks"]["drafter"] = describe(stacks.drafter)
            record_extra["unwrap"]["drafter"] = unwrap(stacks.drafter).label
    elif isinstance(event, ProfileRun):
        if policy.compile_at_first_forward:
            st.compile()
        else:
            st.set(compiled_target=False, compiled_drafter=False)
        st.forward("target", "profile_run", NONE,
                   BatchDescriptor(PROFILE_NUM_TOKENS, num_ubatches=st.num_ubatches(PROFILE_NUM_TOKENS, False)))
        if state.stacks.drafter is not None:
            st.forward("drafter", "profile_run", NONE, BatchDescriptor(PROFILE_NUM_TOKENS))
    elif isinstance(event, ProfileCudagraphMemory):
        st.set(memory_profiled=True)
        st.resolve()
        if not st.state.halted and get_capture_descs(st.state.target_dispatcher):
            st.capture_phase = True
            st.set("capture window opened", capturing_enabled=True)
            st.capture_descs(2, PROFILING_CONTEXT)
            st.capture_phase = False
            # the finally block (gpu_model_runner.py:6382-6397): window closed, CUDAGraphWrapper.clear_all_graphs() and
            # BreakableCUDAGraphWrapper.clear_all_graphs() (every MRV1 capturer, the compiled pieces
            # and the UBatchWrapper's sibling included), target dispatcher keys cleared
            st.set(
                "capture window closed; all graphs and target keys cleared",
                capturing_enabled=False,
                entries=frozenset(),
                graphs=frozenset(),
                target_dispatcher=clear_keys(st.state.target_dispatcher),
            )
        if not st.state.halted:
            st.set(profiled=profiled_pairs(StepRecord(0, event, tuple(st.dispatches))))
        record_extra["cudagraph_mode"] = st.state.cudagraph_mode
        # initialize_from_config resolves again before capture_model (gpu_worker.py:866-907)
        st.set(resolved=False)
    elif isinstance(event, Resolve):
        st.resolve()
        record_extra["cudagraph_mode"] = st.state.cudagraph_mode
        if st.state.drafter_dispatcher is not None and st.state.resolved:
            record_extra["drafter_cudagraph_mode"] = st.state.drafter_dispatcher.cudagraph_mode
    elif isinstance(event, CaptureModel):
        st.set(captured=True)
        if state.cudagraph_mode != NONE:  # capture_model returns early on NONE (:6831-6836)
            st.capture_phase = True
            st.set("capture window opened", capturing_enabled=True)
            st.capture_descs(None, "capture_model")
            if policy.capture_model_closes_window and not st.state.halted:
                st.set("capture window closed", capturing_enabled=False)
            st.capture_phase = False
        record_extra["profiled"] = state.profiled
    elif isinstance(event, ExecuteModel):
        record_extra["ranks"] = st.execute_model(event)
    elif isinstance(event, Propose):
        mode, desc = st.dispatch("drafter", event.num_tokens)
        # The proposer's forward context passes no batch_descriptor (llm_base_proposer.py:588-599),
        # so wrappers see BatchDescriptor(num_tokens=padded) (forward_context.py:331-332).
        st.forward("drafter", "propose", mode, BatchDescriptor(desc.num_tokens))
    else:  # pragma: no cover - Event is a closed union
        raise TypeError(f"unknown event {event!r}")
    return record_extra
