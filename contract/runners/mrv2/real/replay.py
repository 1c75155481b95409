"""A Model Runner V2 trace on vLLM's real code (0.33 / 0.34), observed in the model's format.

The worker's order (``v1/worker/gpu_worker.py``): ``load_model``, ``profile_run`` (the model's
first forward: real Dynamo compiles through ``VllmBackend`` under the mode as post-init left it),
``initialize_kv_cache`` (resolve and a new ``ModelCudaGraphManager``), ``capture_model``, then
``execute_model`` steps. What is vLLM's own: ``VllmConfig.__post_init__``, the ``@support_torch_compile``
decision and Dynamo compile, ``has_compiled_submodule``, adaptive verification's rewrite, resolve,
``ModelCudaGraphManager`` (candidates, capture loop, ``dispatch``, ``run_fullgraph``,
``run_pw_graph``, the breakable runner), ``dispatch_cg_and_sync_dp`` (its all-reduce over one process per rank
for a trace on several DP ranks, ``contract/real/ranks.py``), on several PP stages each stage's own
resolve, capture and dispatch and the copy of the rows the stage before sent (``pp_utils.py``), the
``execute_model`` dispatch statement and "Run model" branch, ``capture_model`` entire, and the
wrappers' gating, capture and replay. The harness writes the scheduler's side of a step (request
and token counts) and the stand-ins listed in ``model_runner.py``.

A step's event maps to the real inputs as the model reads it (``contract/runners/mrv2/model/model_runner.py``,
``_batch``): ``execute_model(n, uniform_decode)`` is ``n/q`` requests of ``q`` tokens each
(``uniform_tok_count = max_query_len = q``), or else ``min(n, max_num_seqs)`` requests, one longer
than ``q`` (``uniform_tok_count = None``, ``max_query_len = q + 1``); ``force_eager`` is
``need_eager`` (``is_profile``). ``profile_run`` dispatches the model's ``PROFILE_NUM_TOKENS`` over
``max_num_seqs`` requests: any count is NONE there.

The decision points each step reaches, and whose code made them, are logged as for MRV1
(``decisions.py``); ``decision_points.py`` lists them. The first-forward compile is noted only in
the trace that runs it: its model is compiled once per config class and shared by the traces of
that class (``Session.model``).
"""

from __future__ import annotations

import gc
import inspect
import os
import sys
import types
from dataclasses import dataclass, field

from contract.real import decisions, device, errors, lora, observe, platform, ranks
from contract.runners.mrv2.real.modules import MODULES, NOT_REPLAYED_WITHOUT_MODEL
from contract.runners.mrv2.real import (
    attention,
    backends,
    cudagraph_utils,
    decision_points,
    dp_utils,
    model_runner,
    pp_utils,
    spec_decode,
    ubatch_utils,
)
from contract.real.observe import Call, Recorder
from contract.real.simcuda import SimCuda
from contract.real.vllm_config import ConfigCache, config_key
from contract.core.events import Event, event_to_json
from contract.core.modes import CUDAGraphMode
from contract.core.observation import RankServed
from contract.runners.mrv2.model.model_runner import PROFILE_NUM_TOKENS
from contract.core.scenario import DrafterKind, Scenario

MANAGER = "CudaGraphManager"
DRAFT_LABEL = "drafter.model"  # the raw draft model, as the model names it
BREAKABLE_RUNNER = "breakable_cg_runner"


class Halt(Exception):
    """vLLM stopped: the text is the model's ``halted`` form."""


class CannotBuild(Exception):
    """vLLM refuses the trace's scenario at start-up; the message is one line."""


@dataclass
class ManagerRecorder(Recorder):
    """``observe.Recorder`` plus the manager's own graphs: a graph event outside any wrapper call
    is charged to the object whose method holds it on the Python stack (``CudaGraphManager.capture``
    or ``run_fullgraph``), when that object is a labelled manager."""

    managers: dict[int, object] = field(default_factory=dict)  # id -> a labelled CudaGraphManager
    models: dict[int, str] = field(default_factory=dict)  # id(raw model) -> role

    def manager(self, manager: object, role: str, label: str | None = None) -> None:
        self.managers[id(manager)] = manager
        self.label(manager, label or f"{role}:{MANAGER}", MANAGER)

    def role_of(self, manager: object) -> str:
        return self.labels[id(manager)][0].split(":")[0]

    def enter(self, wrapper: object) -> Call:
        """Capturers built while a step runs (the compiled pieces' wrappers at the first forward,
        the breakable runner inside ``capture``) are labelled when first called."""
        if id(wrapper) not in self.labels:
            found = self._capturer_label(wrapper)
            if found is not None:
                self.labels[id(wrapper)] = found
        return super().enter(wrapper)

    def _capturer_label(self, wrapper: object) -> tuple[str, str] | None:
        """A manager's breakable runner (``init_breakable_cg_runner``), or a ``CUDAGraphWrapper(PIECEWISE)``:
        MRV2 builds those only in ``wrap_with_cudagraph_if_needed``, for a compiled model's pieces."""
        from vllm.compilation.breakable_cudagraph import BreakableCUDAGraphWrapper
        from vllm.compilation.cuda_graph import CUDAGraphWrapper

        if isinstance(wrapper, BreakableCUDAGraphWrapper):
            for manager in self.managers.values():
                if getattr(manager, BREAKABLE_RUNNER, None) is wrapper:
                    role = self.labels[id(manager)][0].split(":")[0]
                    return f"{role}:{BREAKABLE_RUNNER}", "BreakableCUDAGraphWrapper"
        if isinstance(wrapper, CUDAGraphWrapper) and wrapper.runtime_mode.name == "PIECEWISE":
            return f"{_stack_model_role(self.models)}:{observe.COMPILED}", observe.COMPILED
        return None

    def graph_event(self, kind, graph) -> None:
        if kind != "end" and not self.active:
            owner = _stack_owner(self.labels)
            if owner is not None:
                label, kind_name = self.labels[id(owner)]
                call = Call(label, kind_name)
                self.calls.append(call)
                self.active.append(call)
                try:
                    return super().graph_event(kind, graph)
                finally:
                    self.active.pop()
        return super().graph_event(kind, graph)


def _stack_model_role(models: dict[int, str]) -> str:
    """Whose compiled pieces a wrapper belongs to: the raw model whose forward is on the stack."""
    frame = inspect.currentframe()
    while frame is not None:
        owner = frame.f_locals.get("self")
        if owner is not None and id(owner) in models:
            return models[id(owner)]
        frame = frame.f_back
    return "target"


def _stack_owner(labels: dict) -> object | None:
    frame = inspect.currentframe()
    while frame is not None:
        owner = frame.f_locals.get("self")
        if owner is not None and id(owner) in labels and labels[id(owner)][1] == MANAGER:
            return owner
        frame = frame.f_back
    return None


class Session:
    """Once per process: platform, simulated CUDA, spies, config cache, the runner's blocks."""

    def __init__(self) -> None:
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1"
        os.environ.setdefault("VLLM_DISABLE_COMPILE_CACHE", "1")
        os.environ.setdefault("VLLM_USE_AOT_COMPILE", "0")
        # vLLM's opt-out of freezing gc around capture (utils/gc_utils.py): its exit unfreezes and
        # collects the whole heap, which the session keeps frozen so that the collections vLLM runs
        # per capture stay cheap. No graph decision reads it.
        os.environ["VLLM_ENABLE_CUDAGRAPH_GC"] = "1"
        platform.activate(MODULES)
        import vllm
        import vllm.v1.worker.gpu.cudagraph_utils as cg_utils
        import vllm.v1.worker.gpu.model_runner as gpu_model_runner

        import torch

        self.version = vllm.__version__
        self.device = device.SELECTED
        self.torch_device = torch.device("cuda" if self.device == "cuda" else "cpu")
        self.gpu_model_runner = gpu_model_runner
        self.cudagraph_utils = cg_utils
        self.blocks = model_runner.load(gpu_model_runner)
        self.configs = ConfigCache()
        self.attention_backends: dict[str, str] = {}  # level -> registry name (attention_backends.builder_class)
        self.recorder = ManagerRecorder()
        self._gc_checked: set[str] = set()
        self._install_observers()
        self.decisions = decision_points.install(self, RealRun)
        self._models: dict[tuple, object] = {}
        self.run: RealRun | None = None
        gc.collect()
        gc.freeze()

    def _install_observers(self) -> None:
        from vllm.compilation.breakable_cudagraph import BreakableCUDAGraphWrapper
        from vllm.compilation.cuda_graph import CUDAGraphWrapper

        for cls in (CUDAGraphWrapper, BreakableCUDAGraphWrapper):
            if not hasattr(cls.__call__, "__wrapped__"):
                cls.__call__ = observe._spy(cls.__call__)
        observe.RECORDER = self.recorder
        SimCuda.listener = self.recorder.graph_event
        backends.install(self.recorder.compute_ran, self.recorder.attention_ran)
        cudagraph_utils.install(self.cudagraph_utils, self._capture_listener)
        self.gpu_model_runner.lock_workspace = lambda: None  # locks a GPU workspace buffer after capture

    def _skip_collections(self) -> None:
        """On simulated graphs, vLLM's modules see ``gc`` with ``collect`` a no-op (``_NoCollect``);
        modules a speculator imports late are reached at the next trace."""
        if self.device == "cuda":
            return
        # only the modules imported since the last trace: sys.modules holds thousands
        fresh = sys.modules.keys() - self._gc_checked
        self._gc_checked |= fresh
        for name in fresh:
            module = sys.modules.get(name)
            if name.startswith("vllm") and getattr(module, "gc", None) is gc:
                module.gc = _NO_COLLECT

    def _capture_listener(self, kind, manager, desc) -> None:
        if self.run is not None:
            self.run.capture_event(kind, manager, desc)

    def reset(self) -> None:
        self._skip_collections()
        import vllm.forward_context as forward_context
        import vllm.platforms as vllm_platforms
        from vllm.compilation.breakable_cudagraph import BreakableCUDAGraphCapture, BreakableCUDAGraphWrapper
        from vllm.compilation.cuda_graph import CUDAGraphWrapper

        forward_context._forward_context = None
        CUDAGraphWrapper.clear_all_graphs()
        BreakableCUDAGraphWrapper.clear_all_graphs()
        BreakableCUDAGraphCapture._tls.active = None
        SimCuda.reset_global_pool(vllm_platforms.current_platform)
        SimCuda.reset()
        self.recorder.labels.clear()
        self.recorder.managers.clear()
        self.recorder.models.clear()
        self.decisions.start_trace()

    def model(self, scenario: Scenario, vllm_config):
        """One model per config-time class, compiled once by its first forward: a compile is
        decided by the config as post-init leaves it, equal within the class. Its graphs are
        cleared between traces by ``clear_all_graphs`` on both wrapper classes."""
        from vllm.distributed.parallel_state import get_pp_group

        # a pipeline stage's model embeds (first) or hands its hidden states on (all but the last)
        stage = (get_pp_group().is_first_rank, get_pp_group().is_last_rank)
        key = (*config_key(scenario), scenario.model_compiled, stage)
        if key not in self._models:
            self._models[key] = backends.build(vllm_config, decorated=scenario.model_compiled).to(self.torch_device)
        backends.register_attention(self._models[key], vllm_config)
        return self._models[key]

    def draft_model(self, scenario: Scenario, vllm_config, hidden_size: int):
        """The draft model, one per config-time class as the target's; first called by
        ``profile_run``'s proposal, where Dynamo compiles it under the mode then in force."""
        # Per speculator: each calls its draft model with its own inputs (target hidden states,
        # module index or none), and a compiled model keeps the graph of its first call.
        key = (*config_key(scenario), scenario.draft_compiled, "draft", scenario.speculator, hidden_size)
        if key not in self._models:
            self._models[key] = spec_decode.draft_model(vllm_config, scenario, hidden_size).to(self.torch_device)
        backends.register_attention(self._models[key], vllm_config)
        return self._models[key]

    def replay(self, scenario: Scenario, events: list[Event], dp_rank: int | None = None,
               pp_stage: int | None = None) -> list[dict]:
        """The trace's steps; on several DP ranks (PP stages), one process per rank (stage),
        ``ranks.replay_ranks`` (``ranks.replay_stages``), each calling this with its ``dp_rank``
        (``pp_stage``)."""
        if dp_rank is None and scenario.data_parallel_size > 1:
            self.decisions.start_trace()
            return ranks.replay_ranks(self, scenario, events, dp_utils.TIMEOUT_S)
        if pp_stage is None and scenario.pipeline_parallel_size > 1:
            self.decisions.start_trace()
            return ranks.replay_stages(self, scenario, events, dp_utils.TIMEOUT_S)
        self.reset()
        steps: list[dict] = []
        self.run = RealRun(self, scenario, dp_rank or 0, pp_stage or 0)
        try:
            for event in events:
                step = self.run.apply(event)
                steps.append(step)
                if "halted" in step:
                    break
        finally:
            self.run = None
        return steps


class _NoCollect:
    """``gc`` whose ``collect()`` does nothing. vLLM collects before and after every capture
    (``utils/gc_utils.py``'s ``freeze_gc_for_cudagraph_capture``, ``compilation/breakable_cudagraph.py``,
    ``v1/worker/gpu/cudagraph_utils.py``) to free device memory and keep a collection out of a
    stream capture; its ``unfreeze()`` also hands the session's frozen objects back, so every later
    collection walks them all (about half of a replay's time). On simulated graphs a collection
    decides nothing; freezing and disabling still run as vLLM's. Real CUDA graphs keep ``gc``."""

    def __getattr__(self, name):
        return getattr(gc, name)

    @staticmethod
    def collect(generation: int = 2) -> int:
        return 0


_NO_COLLECT = _NoCollect()


class RealRun:
    """The stand-in runner for one trace and the step functions that drive vLLM's code."""

    def __init__(self, session: Session, scenario: Scenario, dp_rank: int = 0, pp_stage: int = 0) -> None:
        self.session, self.scenario, self.stage = session, scenario, pp_stage
        self.recorder = session.recorder
        if scenario.drafter is DrafterKind.WITHOUT_MODEL:
            raise CannotBuild(NOT_REPLAYED_WITHOUT_MODEL)
        try:
            vllm_config = session.configs.get(scenario)
            # Built by vLLM's __post_init__ once per config key: the path's start-up entry.
            decisions.note(decisions.CONFIG_POINT, type(vllm_config).__post_init__)
            session.decisions.close_step(decisions.CONFIG_STEP)
            backends.configure(vllm_config)
            self.model = session.model(scenario, vllm_config)
            speculator = spec_decode.build(vllm_config, scenario, session.torch_device)
        except Exception as exc:  # noqa: BLE001 - vLLM's refusal, one line
            raise CannotBuild(f"vLLM {session.version} cannot build its scenario: {errors.first_line(exc)}") from exc
        if scenario.ubatching:
            # each rank's worker config holds the DP size maybe_build_ubatch_runner reads; the replay's
            # config is built once for every rank
            vllm_config.parallel_config.data_parallel_size = scenario.data_parallel_size
        self.vllm_config = vllm_config
        self.runner = model_runner.stand_in_runner(
            session.gpu_model_runner, vllm_config, self.model, session.torch_device
        )
        self.runner.initialize_kv_cache = self.initialize_kv_cache
        self.runner.dp_size, self.runner.dp_rank = scenario.data_parallel_size, dp_rank
        if scenario.pipeline_parallel_size > 1:
            pp_utils.place(self.runner, self.model)
        self.recorder.models[id(self.model)] = "target"
        self.speculator: spec_decode.Observed | None = None
        if speculator is not None:
            draft = session.draft_model(scenario, vllm_config, speculator.hidden_size)
            self.recorder.models[id(draft)] = "drafter"
            self.speculator = spec_decode.Observed(speculator, self.runner, draft, self.draft_forward,
                                                   self.capture_step)
            self.runner.speculator = speculator
        if scenario.adaptive_verification:
            # maybe_create_adaptive_verification_manager runs in initialize_kv_cache (vLLM's own, on
            # attention.py's stand-in groups); capture_model's cost profiling runs vLLM's
            # batches_to_profile and set_cost_curves over stand-in timed dummy runs
            # (33:…/model_runner.py:1140-1146, 34:…:1195-1199, 1224-1234).
            attention.install_profiling(self.runner, session.gpu_model_runner.GPUModelRunner)
        self.draft_context: str | None = None
        self.step: dict = {}
        self.capture_phase = False
        self.context = "capture_model"
        self._capture: dict | None = None
        self._open: dict | None = None

    # -- observation --------------------------------------------------------------------------

    def start(self, context: str, mode_name: str, descriptor: dict, role: str = "target") -> None:
        self.finish()
        self.recorder.start(mode_name)
        if self.session.device == "cuda":
            device.open_dispatch()
        self._open = {"role": role, "context": context, "runtime_mode": mode_name,
                      "batch_descriptor": descriptor}
        # the adapters vLLM's LoRA capture hook left selected for a target capture (the model's
        # _selected_loras: the drafter's captures are not observed)
        selected = lora.selected(self.runner)
        if selected and self.capture_phase and role == "target":
            self._open["selected_loras"] = selected

    def draft_forward(self, which: str, mode_name: str, desc, step_idx: int | None) -> None:
        """A draft prefill or decode step about to run under its manager's descriptor."""
        context = self.draft_context or (spec_decode.PREFILL_CONTEXT if which == "prefill"
                                         else spec_decode.DECODE_CONTEXT)
        self.start(context, mode_name, _descriptor(desc), role="drafter")
        if step_idx is not None:
            self._open["spec_step_idx"] = step_idx

    def capture_step(self, step_idx: int) -> None:
        """A multi-module MTP PIECEWISE capture run forwards once per module: one dispatch each,
        as the model steps it."""
        open_ = self._open
        if open_ is None:
            return
        if ("spec_step_idx" not in open_ and not self.recorder.calls and not self.recorder.ran_eager
                and not self.recorder.attention_captured):
            open_["spec_step_idx"] = step_idx
            return
        self.start(open_["context"], open_["runtime_mode"], open_["batch_descriptor"], open_["role"])
        self._open["spec_step_idx"] = step_idx

    def finish(self, error: str | None = None, keep: bool = True) -> None:
        open_ = self._open
        if open_ is None:
            return
        self._open = None
        dispatch = {**open_, **self.recorder.dispatch_fields(self.capture_phase)}
        if error:
            dispatch["error"] = error
        if self.session.device == "cuda":
            device.close_dispatch(dispatch)
        acted = error or any(layer["action"] != "passed" for layer in dispatch["layers"])
        if keep or acted:
            self.step.setdefault("dispatches", []).append(dispatch)

    def capture_event(self, kind: str, manager, desc) -> None:
        """The capture loop's progress (``cudagraph_utils.install``): each descriptor's warm-up
        (kept only if a layer acted on it, as the model does not record warm-ups) and capture run."""
        if kind == "done":
            self._finish_capture()
            return
        role = self.recorder.role_of(manager) if id(manager) in self.recorder.labels else "target"
        if kind == "warmup":
            self._finish_capture()
            self.start(self.context, "NONE", _descriptor(desc, warmup=True), role)
            self._capture = {"desc": desc, "warmup": True}
        elif self._capture is None or self._capture["desc"] is not desc or self._capture["warmup"]:
            self._finish_capture()
            self.start(self.context, desc.cg_mode.name, _descriptor(desc), role)
            self._capture = {"desc": desc, "warmup": False}

    def _finish_capture(self) -> None:
        if self._capture is not None:
            self.finish(keep=not self._capture["warmup"])
            self._capture = None

    # -- events -------------------------------------------------------------------------------

    def apply(self, event: Event) -> dict:
        self.step = {"event": event_to_json(event)}
        self._open = None
        try:
            getattr(self, "on_" + event.kind)(event)
        except Halt as halt:
            self.finish(str(halt))
            self.step["halted"] = str(halt)
        except AssertionError as exc:  # vLLM's assertion stops the engine where it fires
            text = errors.normalise(exc)
            self.finish(text)
            self.step["halted"] = text
        except Exception as exc:  # vLLM's code raised where no step expects it: the engine stops there
            where = errors.raised_at(exc)
            if where is None:  # the replay's own code failed: the tool's error
                raise
            text = errors.normalise(exc)
            self.finish(text)
            self.step["halted"], self.step["raised_at"] = text, where
        else:
            self.finish()
        finally:
            self.session.decisions.close_step(event.kind)
        return self.step

    def on_load_model(self, event) -> None:
        """``load_model`` assigns the loaded model and never wraps it (``33:…:403,408``, ``34:…:416,421``)."""
        model = self.model
        label = backends.MODEL_LABEL
        got = self.session.gpu_model_runner.GPUModelRunner.get_model(self.runner)
        self.step["stacks"] = {"target": label if self.runner.model is model else type(self.runner.model).__name__}
        self.step["unwrap"] = {"target": label if got is model else type(got).__name__}
        if self.speculator is not None:
            # DraftModelSpeculator.load_model assigns the draft model unwrapped; get_draft_model
            # returns it (34:…/model_runner.py:592-596).
            draft = self.speculator.speculator.model
            got = self.session.gpu_model_runner.GPUModelRunner.get_draft_model(self.runner)
            self.step["stacks"]["drafter"] = DRAFT_LABEL
            self.step["unwrap"]["drafter"] = DRAFT_LABEL if got is draft else type(got).__name__

    def on_profile_run(self, event) -> None:
        """``profile_run`` → ``_dummy_run(is_profile=True)`` → ``execute_model``: dispatch with
        ``need_eager``, then the model's first forward, where Dynamo compiles."""
        self.execute(PROFILE_NUM_TOKENS, self.runner.max_num_reqs, None, None, is_profile=True, context="profile_run")
        if self.speculator is not None:
            # _dummy_run then proposes on the dummy batch with is_profile (34:…/model_runner.py:993-1027):
            # the draft model's first forward, where Dynamo compiles it.
            self.draft_context = "profile_run"
            try:
                reqs = self.runner.max_num_reqs
                self.propose(PROFILE_NUM_TOKENS, reqs, PROFILE_NUM_TOKENS, [PROFILE_NUM_TOKENS // reqs] * reqs,
                             False, is_profile=True)
            finally:
                self.draft_context = None

    def initialize_kv_cache(self, kv_cache_config=None, is_profiling: bool = False) -> None:
        """``initialize_kv_cache``'s block: adaptive verification, resolve, ``ModelCudaGraphManager``,
        then the speculator's managers. The KV-cache config stands in for the one vLLM builds."""
        self.runner.kv_cache_config = model_runner.kv_cache_config(self.scenario.mamba_cache_blocks)
        attn_cg_support = self.attn_cg_support()
        try:
            self.adaptive_verification_check()
            with ubatch_utils.runner_class():
                self.session.blocks.ubatch_runner(self.runner)
            out = self.session.blocks.initialize_kv_cache(self.runner, attn_cg_support=attn_cg_support,
                                                          is_profiling=is_profiling)
            self.session.blocks.init_speculator_cudagraph_manager(self.runner, cudagraph_mode=out["cudagraph_mode"])
        except ValueError as exc:
            raise Halt(errors.resolve_rejected(exc)) from exc
        self.recorder.manager(self.runner.cudagraph_manager, "target")
        if self.speculator is not None:
            for which, manager in self.speculator.managers_built():
                self.recorder.manager(manager, "drafter", f"drafter:{MANAGER}({which})")

    def attn_cg_support(self):
        """``init_attn_backend``'s support over ``attention.py``'s groups (the draft model's
        included), then ``initialize_kv_cache``'s narrowing by the model state's own groups."""
        with_draft = self.speculator is not None
        blocks = self.session.blocks
        found = blocks.attn_cg_support(
            None, attn_groups=attention.groups(self.scenario, self.vllm_config, with_draft,
                                         self.session.attention_backends, self.stage),
            kernel_block_sizes=[], kv_cache_config=attention.kv_cache_config(with_draft), vllm_config=self.vllm_config,
            device=self.runner.device, active_layer_names=None,
            draft_layer_names={attention.DRAFT_LAYER} if with_draft else None)
        return blocks.narrow(self.runner, attn_cg_support=found["attn_cg_support_info"])["attn_cg_support"]

    def adaptive_verification_check(self) -> None:
        """``initialize_kv_cache``'s adaptive verification block, vLLM's own: the target's layer names
        (every layer but the draft model's), then ``maybe_create_adaptive_verification_manager``
        over the groups of ``attention.py``, which raises ValueError for a checked backend that
        cannot replay varlen decode batches. The groups, KV-cache groups and request states are
        the block's alone: the rest of the replay keeps the runner's own."""
        runner, spec = self.runner, self.speculator.speculator if self.speculator is not None else None
        with_draft = spec is not None
        # memory profiling's teardown deletes some of them (34:…/cudagraph_utils.py's _teardown_profiling_state)
        saved = (getattr(runner, "attn_groups", []), runner.kv_cache_config, getattr(runner, "req_states", None),
                 getattr(spec, "draft_attn_layer_names", None))
        runner.attn_groups = attention.groups(self.scenario, self.vllm_config, with_draft, self.session.attention_backends)
        runner.kv_cache_config = attention.kv_cache_config(with_draft)
        runner.req_states = attention.req_states(runner, self.scenario.uniform_decode_query_len - 1)
        if with_draft:
            spec.draft_attn_layer_names = {attention.DRAFT_LAYER}
        try:
            with attention.manager_class():
                self.session.blocks.adaptive_verification(runner)
        finally:
            runner.attn_groups, runner.kv_cache_config, runner.req_states = saved[:3]
            if with_draft:
                spec.draft_attn_layer_names = saved[3]

    def on_profile_cudagraph_memory(self, event) -> None:
        """``profile_cudagraph_memory`` (``34:…/cudagraph_utils.py:988-1095``), vLLM's own, on the
        stand-in runner: it initialises the KV cache for profiling (the first resolve and managers),
        captures every PIECEWISE and the two widest FULL descriptors through ``capture_model``,
        clears every graph of both wrapper classes and drops the managers."""
        self.capture_phase, self.context = True, "profile_cudagraph_memory"
        try:
            self.session.gpu_model_runner.GPUModelRunner.profile_cudagraph_memory(self.runner)
        except (Halt, AssertionError):
            raise
        except Exception as exc:
            raise Halt(errors.normalise(exc)) from exc
        finally:
            self._finish_capture()
            self.capture_phase, self.context = False, "capture_model"
            self.step["cudagraph_mode"] = self.vllm_config.compilation_config.cudagraph_mode.name

    def on_resolve(self, event) -> None:
        """An assertion stops the engine inside the step (adaptive verification's
        ``assert cudagraph_mode.has_full_cudagraphs()``, ``33:…/spec_decode/adaptive_verification.py:36-43``):
        the step then reports no resolved mode, as the model's does."""
        try:
            self.initialize_kv_cache()
        except AssertionError:
            raise
        except BaseException:
            self.step["cudagraph_mode"] = self.vllm_config.compilation_config.cudagraph_mode.name
            raise
        self.step["cudagraph_mode"] = self.vllm_config.compilation_config.cudagraph_mode.name
        if self.speculator is not None:
            manager = self.speculator.prefill_manager()
            if manager is not None:
                self.step["drafter_cudagraph_mode"] = manager.cudagraph_mode.name

    def on_propose(self, event) -> None:
        """``speculator.propose`` after a target batch of the event's tokens: the draft prefill on
        the target's padded token count (``max(num_tokens, batch_desc.num_tokens)``, the target's
        real dispatch), then the draft decode steps."""
        q = self.runner.decode_query_len
        n = event.num_tokens
        if event.uniform_decode:
            num_reqs, utc, mql, scheduled = n // q, q, q, [q] * (n // q)
        else:
            num_reqs = min(n, self.runner.max_num_reqs)
            utc, mql, scheduled = None, q + 1, [q + 1] + [1] * (num_reqs - 1)
        out = self.session.blocks.dispatch(
            self.runner, num_reqs=num_reqs, num_toks=n, uniform_tok_count=utc, max_query_len=mql,
            is_profile=False, skip_compiled=False, num_active_loras=0, skip_attn_for_dummy_run=False,
            scheduler_output=types.SimpleNamespace(skip_drafts=False),
        )
        padded = max(n, out["batch_desc"].num_tokens)
        self.propose(n, num_reqs, padded, scheduled, event.uniform_decode, is_profile=False)

    def propose(self, num_tokens: int, num_reqs: int, padded: int, scheduled: list[int], eligible: bool, *,
                is_profile: bool) -> None:
        try:
            self.speculator.propose(num_reqs, num_tokens, padded, scheduled, eligible, is_profile)
        except AssertionError:
            raise
        except Exception as exc:
            raise Halt(errors.normalise(exc)) from exc

    def on_capture_model(self, event) -> None:
        """``capture_model``, vLLM's whole method on the stand-in runner."""
        self.capture_phase = True
        try:
            self.session.gpu_model_runner.GPUModelRunner.capture_model(self.runner)
        except AssertionError:
            raise
        except Exception as exc:
            raise Halt(errors.normalise(exc)) from exc
        finally:
            self._finish_capture()
            self.capture_phase = False

    def on_execute_model(self, event) -> None:
        """The scheduler's batch (``model_runner.scheduled_batch``), then ``execute_model``'s own
        statements from the batch to the dispatch. On several DP ranks each rank takes its own
        batch of the step; an idle rank's is vLLM's dummy batch (``execute_dummy_batch``), read by
        the same statements as a dummy run."""
        rank = self.runner.dp_rank
        batch = event if rank == 0 else event.peers[rank - 1]
        idle = rank > 0 and batch.idle
        if idle:
            scheduler_output = dp_utils.dummy_scheduler_output(self.vllm_config)
        else:
            scheduler_output = model_runner.scheduled_batch(self.runner, batch.num_tokens, batch.uniform_decode,
                                                            getattr(batch, "num_active_loras", 0))
        got = self.session.blocks.batch(self.runner, scheduler_output=scheduler_output, dummy_run=idle)
        loras = self.session.blocks.loras(self.runner, scheduler_output=scheduler_output, dummy_run=idle)
        self.execute(got["num_toks"], got["num_reqs"], got["uniform_tok_count"], got["max_query_len"],
                     is_profile=batch.force_eager, scheduler_output=scheduler_output, idle=idle,
                     num_active_loras=loras["num_active_loras"])

    # -- helpers ------------------------------------------------------------------------------

    def execute(self, num_toks: int, num_reqs: int, uniform_tok_count, max_query_len, *, is_profile: bool,
                context: str = "execute_model", scheduler_output=None, idle: bool = False,
                num_active_loras: int = 0) -> None:
        """``execute_model``'s dispatch statement and "Run model" branch, vLLM's own; on several DP
        ranks a serving step also records this rank's side (``RankServed``'s form)."""
        import torch

        if scheduler_output is None:
            scheduler_output = types.SimpleNamespace(skip_drafts=False)
        out = self.session.blocks.dispatch(
            self.runner, num_reqs=num_reqs, num_toks=num_toks, uniform_tok_count=uniform_tok_count,
            max_query_len=max_query_len, is_profile=is_profile, skip_compiled=False, num_active_loras=num_active_loras,
            skip_attn_for_dummy_run=False, scheduler_output=scheduler_output,
        )
        batch_desc = out["batch_desc"]
        if self.runner.dp_size > 1 and context == "execute_model":
            self.step["rank"] = RankServed(CUDAGraphMode[batch_desc.cg_mode.name], batch_desc.num_tokens,
                                           (num_reqs, num_toks, uniform_tok_count), is_profile, idle).to_json()
        prepared = self.session.blocks.prepare_inputs(
            self.runner, batch_req_state=types.SimpleNamespace(num_tokens=num_toks), batch_desc=batch_desc)
        padded = prepared["num_tokens_after_padding"]
        buffers = self.runner.input_buffers
        input_batch = types.SimpleNamespace(num_tokens_after_padding=padded, num_tokens=num_toks,
                                            is_padding=prepared["is_padding"])
        model_inputs = {"input_ids": buffers.input_ids[:padded], "positions": buffers.positions[:padded],
                        "inputs_embeds": None, "intermediate_tensors": None}
        serving = context == "execute_model"
        if self.scenario.pipeline_parallel_size > 1:
            if serving:
                self.step["stage"] = RankServed(CUDAGraphMode[batch_desc.cg_mode.name], padded,
                                                (num_reqs, num_toks, uniform_tok_count), is_profile).to_json()
            self.stage_inputs(model_inputs, input_batch, serving)
        self.start(context, batch_desc.cg_mode.name, _descriptor(batch_desc))
        try:
            with torch.inference_mode():
                ran = self.session.blocks.run_model(
                    self.runner, batch_desc=batch_desc, dp_sync_state=out["dp_sync_state"],
                    scheduler_output=scheduler_output, input_batch=input_batch, attn_metadata=None,
                    model_inputs=model_inputs,
                    ubatch_state=ubatch_utils.prepare(self.runner, input_batch, batch_desc, out["dp_sync_state"])
                    if batch_desc.num_ubatches > 1 else None,
                    ubatch_slices=None,
                    slot_mappings_by_layer=None, skip_compiled=False,
                )
        except AssertionError:
            raise
        except Exception as exc:
            raise Halt(errors.normalise(exc)) from exc
        if self.scenario.pipeline_parallel_size > 1 and serving and not self.runner.is_last_pp_rank:
            try:
                pp_utils.send(ran["model_output"])
            except Exception as exc:  # the next stage stopped: gloo's error, said by the merge
                raise Halt(errors.normalise(exc)) from exc

    def stage_inputs(self, model_inputs: dict, input_batch, serving: bool) -> None:
        """A non-first PP stage's hidden states: on a serving step what the stage before sent
        (``pp_utils.receive``), else vLLM's dummy-run slice of the runner's buffer
        (``34:…/model_runner.py:951-955``); then ``execute_model``'s own statement that copies them
        into that buffer, which raises where this stage pads beyond the rows received."""
        import torch

        if self.runner.is_first_pp_rank:
            return
        n = input_batch.num_tokens_after_padding
        received = pp_utils.receive() if serving else self.runner.intermediate_tensors[:n]
        try:
            with torch.inference_mode():
                self.session.blocks.pp_inputs(self.runner, model_inputs=model_inputs, intermediate_tensors=received,
                                              input_batch=input_batch, dummy_run=not serving)
        except Exception as exc:
            self.step.pop("stage", None)
            raise Halt(errors.normalise(exc)) from exc


def _descriptor(desc, warmup: bool = False) -> dict:
    """A ``BatchExecutionDescriptor`` in the model's JSON (``num_active_loras`` when not 0,
    ``num_ubatches`` when above 1); a warm-up run is the NONE run of the descriptor's shape."""
    out = {"num_tokens": desc.num_tokens, "num_reqs": desc.num_reqs,
           "uniform_token_count": None if warmup else desc.uniform_token_count,
           "max_query_len": None if warmup else desc.max_query_len}
    if desc.num_active_loras and not warmup:
        out["num_active_loras"] = desc.num_active_loras
    if getattr(desc, "num_ubatches", 1) > 1 and not warmup:
        out["num_ubatches"] = desc.num_ubatches
    return out
