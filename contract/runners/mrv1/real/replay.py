"""A trace's events run on vLLM's real code, observed in the model's format.

Each event runs the installed release's own runner code on a stand-in runner
(``gpu_model_runner.py``): ``load_model``'s wrapping block (``wrapping.py``), ``profile_run`` →
``_dummy_run`` (with the drafter's ``dummy_run``), ``profile_cudagraph_memory``, ``capture_model`` →
``_capture_cudagraphs`` → ``_warmup_and_capture``, and for ``resolve`` the
``_check_and_update_cudagraph_mode`` that ``initialize_attn_backend`` calls. Below them everything
is vLLM's too: ``VllmConfig.__post_init__`` (``vllm_config.py``), the compile decisions at the first
forward (``compiled.py``), the dispatchers, ``set_forward_context``, ``graph_capture`` and the
wrappers' gating, capture, replay and capture guard.

The harness mirrors what cannot run without a scheduler: the part of ``execute_model`` and of the
proposer's ``propose`` that turns a batch into a dispatch and a forward, and the graph split of the
compile backend. ``decisions.py`` logs, per step, which decision points were vLLM's code and which
the harness's, and guards each mirrored point against the releases' source.
"""

from __future__ import annotations

import gc
import os
import types

from contract.runners.mrv1.real import compiled, wrapping
from contract.real.parallel_state import install_parallel_state
from contract.real import attention_backends, decisions, device, errors, lora, observe, platform, ranks
from contract.runners.mrv1.real import dp_utils as dp_phase
from contract.runners.mrv1.real import gpu_model_runner as stand_in
from contract.real.attention_op import DRAFT_LAYER, TARGET_LAYER, AttentionOp
from contract.real.observe import Recorder
from contract.real.simcuda import SimCuda
from contract.real.vllm_config import MAX_NUM_BATCHED_TOKENS, ConfigCache
from contract.core.events import CaptureModel, Event, ExecuteModel, LoadModel, ProfileCudagraphMemory, ProfileRun, Propose, Resolve, event_to_json
from contract.runners.mrv1.model.gpu_model_runner import PROFILE_NUM_TOKENS
from contract.core.modes import CUDAGraphMode
from contract.core.observation import RankServed
from contract.core.properties import attention_roles, layers_support
from contract.core.scenario import DrafterKind, Scenario

# The vLLM modules whose code the replay runs, imported (in this order) before the platform is
# switched to CUDA.
MODULES = (
    "vllm.envs",
    "vllm.config",
    "vllm.forward_context",
    "vllm.compilation.monitor",
    "vllm.compilation.cuda_graph",
    "vllm.compilation.breakable_cudagraph",
    "vllm.compilation.backends",
    "vllm.compilation.decorators",
    "vllm.model_executor.offloader.base",
    "vllm.v1.attention.backend",
    "vllm.v1.cudagraph_dispatcher",
    "vllm.v1.worker.gpu_ubatch_wrapper",
    "vllm.v1.spec_decode.llm_base_proposer",
    "vllm.v1.spec_decode.eagle",
    "vllm.v1.worker.dp_utils",  # coordinate_batch_across_dp, on several DP ranks
    "vllm.v1.worker.gpu_model_runner",
    "vllm.v1.worker.gpu_worker",  # an idle DP rank's execute_dummy_batch
)


class Halt(Exception):
    """vLLM stopped: the text is the model's ``halted`` form."""


class CannotBuild(Exception):
    """vLLM refuses the trace's scenario at start-up (``VllmConfig`` or a ``CudagraphDispatcher``
    raised), where the model starts: the trace cannot be replayed on this release."""


class Session:
    """Once per process: platform, simulated CUDA, spies, config cache, the wrapping block, the
    stand-in runner class and the decision-point log."""

    def __init__(self) -> None:
        # Explicit: where Triton is importable, 0.33 picks Model Runner V2 by default (config/vllm.py:730-767).
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"
        platform.activate(MODULES)
        import vllm
        from vllm.v1.worker import gpu_model_runner

        self.version = vllm.__version__
        self.device = device.SELECTED
        self.block = wrapping.load(gpu_model_runner)
        self.load_model_block = decisions.tracked(
            self.block.function, "GPUModelRunner.load_model (wrapping block)",
            {"function": "GPUModelRunner.load_model", "path": decisions.package_path(self.block.path),
             "lines": [self.block.first_line, self.block.last_line]})
        self.configs = ConfigCache()
        self.recorder = Recorder()
        observe.install(self.recorder)
        install_parallel_state()
        self.runner_class = stand_in.runner_class(gpu_model_runner)
        self.decisions = decisions.Log()
        _track_decision_points(self.runner_class)
        decisions.LOG = self.decisions
        self._backends: dict[str, type] = {}
        self.attention_backends: dict[str, str] = {}  # level -> registry name (attention_backends.builder_class)
        # What freeze_gc_for_cudagraph_capture does around bulk capture (utils/gc_utils.py:97-121),
        # once for the whole process: the imported world is frozen so the collections the wrappers
        # run per capture (breakable_cudagraph.py:381-383) stay cheap.
        gc.collect()
        gc.freeze()

    def mirrored(self) -> list[dict]:
        """Each harness-mirrored point, and whether this release's mirrored statements are the
        recorded ones (``decisions.MIRRORED``)."""
        from pathlib import Path

        import vllm

        package = Path(vllm.__file__).parent
        return [{"point": m.point, "digest": m.digest(package), "known": m.known(self.version, package)}
                for m in decisions.mirrored_for("MRV1")]

    def reset(self) -> None:
        """vLLM's process-global state back to start-up values, so traces replay in any order."""
        import vllm.compilation.monitor as monitor
        import vllm.forward_context as forward_context
        import vllm.platforms as vllm_platforms
        from vllm.compilation.breakable_cudagraph import BreakableCUDAGraphCapture, BreakableCUDAGraphWrapper
        from vllm.compilation.cuda_graph import CUDAGraphWrapper

        forward_context._forward_context = None
        monitor.set_cudagraph_capturing_enabled(True)  # compilation/monitor.py: starts True
        for cls in (CUDAGraphWrapper, BreakableCUDAGraphWrapper):
            cls.clear_all_graphs()
            cls._all_instances.clear()
        BreakableCUDAGraphCapture._tls.active = None
        SimCuda.reset_global_pool(vllm_platforms.current_platform)
        SimCuda.reset()
        self.recorder.labels.clear()
        self.decisions.start_trace()

    def attention_backend(self, support_name: str) -> type:
        """An attention backend whose metadata builder is vLLM's own, of the registry backend that
        gives ``support_name`` (``contract/real/attention_backends.py``); ``get_builder_cls`` is all
        ``_check_and_update_cudagraph_mode`` asks of it."""
        if support_name not in self._backends:
            builder = attention_backends.builder_class(support_name, self.attention_backends)

            class SimAttentionBackend:
                @staticmethod
                def get_builder_cls():
                    return builder

            SimAttentionBackend.__name__ = f"SIM_ATTN_{support_name}"
            self._backends[support_name] = SimAttentionBackend
        return self._backends[support_name]

    def replay(self, scenario: Scenario, events: list[Event], dp_rank: int | None = None) -> list[dict]:
        """One observation per event, in ``StepRecord.to_json`` form; stops where vLLM stops. On
        several DP ranks, one process per rank (``ranks.replay_ranks``), each calling this with its
        ``dp_rank``."""
        if dp_rank is None and scenario.data_parallel_size > 1:
            self.decisions.start_trace()
            return ranks.replay_ranks(self, scenario, events, ranks.DP_TIMEOUT_S)
        self.reset()
        steps: list[dict] = []
        built = len(self.configs._built)
        run = RealRun(self, scenario, dp_rank or 0)
        if len(self.configs._built) != built:
            gc.freeze()  # a new VllmConfig lives as long as the session: out of every later collection
        for event in events:
            step = run.apply(event)
            steps.append(step)
            if "halted" in step:
                break
        return steps


class RealRun:
    """The stand-in runner for one trace and the step functions that drive vLLM's code."""

    def __init__(self, session: Session, scenario: Scenario, dp_rank: int = 0) -> None:
        import torch

        from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher
        from vllm.v1.spec_decode.draft_model import DraftModelProposer
        from vllm.v1.spec_decode.eagle import EagleProposer

        self.session, self.scenario = session, scenario
        self.recorder = session.recorder
        try:
            vllm_config = session.configs.get(scenario)
            # Built by vLLM's __post_init__ once per config key (ConfigCache): the start-up
            # "step" of the trace's path, before its first event.
            decisions.note(decisions.CONFIG_POINT, type(vllm_config).__post_init__)
            session.decisions.close_step(decisions.CONFIG_STEP)
            speculative_config = vllm_config.speculative_config
            device_ = torch.device("cuda" if session.device == "cuda" else "cpu")
            # max_num_tokens is the model's (PROFILE_NUM_TOKENS): profile_run dispatches it with
            # force_eager, so any count gives NONE there, and the observation shows the count.
            runner = stand_in.build(
                session.runner_class, vllm_config, device=device_,
                dispatcher=CudagraphDispatcher(vllm_config), max_num_tokens=PROFILE_NUM_TOKENS,
                attention_backends=[session.attention_backend(layers_support(scenario, role).name)
                                    for role in attention_roles(scenario)],
            )
            if scenario.drafter is DrafterKind.WITH_MODEL:
                # The proposer _init_drafter builds for the method (33:v1/worker/gpu_model_runner.py:618-650),
                # holding what the cudagraph path reads of it (llm_base_proposer.py:185, :381-386,
                # :424-440, :1642-1694, :1797-1845); its __init__ builds a draft model.
                proposer = DraftModelProposer if speculative_config.uses_draft_model() else EagleProposer
                drafter = proposer.__new__(proposer)
                drafter.__dict__.update(
                    vllm_config=vllm_config, speculative_config=speculative_config,
                    cudagraph_dispatcher=CudagraphDispatcher(vllm_config), dp_rank=dp_rank,
                    num_speculative_tokens=speculative_config.num_speculative_tokens,
                    parallel_drafting=False, supports_mm_inputs=False, pass_hidden_states_to_model=False,
                    _draft_attn_layer_names=set(), uses_mrope=False, uses_xdrope_dim=0,
                    draft_uses_xdrope_dim=0, positions=runner.positions,
                )
                drafter.dummy_run = self.observed_drafter_dummy_run(drafter.dummy_run)
                runner.drafter = drafter
            elif scenario.drafter is DrafterKind.WITHOUT_MODEL:
                runner.drafter = types.SimpleNamespace()  # NgramProposer: no .model, no dispatcher
            runner._dummy_run = self.observed_dummy_run(runner._dummy_run)
            if scenario.data_parallel_size > 1:
                # this rank's process alone (forked, ranks.replay_ranks): the config is its copy
                vllm_config.parallel_config.data_parallel_size = scenario.data_parallel_size
                vllm_config.parallel_config.data_parallel_rank = dp_rank
                if scenario.ubatching:
                    # DBO serves MoE models (its all-to-all backends); the forward context keeps
                    # the ranks' token counts only for one (33:forward_context.py:299-328), and
                    # UBatchWrapper asserts them (33:v1/worker/gpu_ubatch_wrapper.py:394-395).
                    vllm_config.parallel_config.is_moe_model = True
                runner._determine_batch_execution_and_padding = self.observed_batch(
                    runner._determine_batch_execution_and_padding)
            runner._warmup_and_capture = self.observed_warmup_and_capture(runner._warmup_and_capture)
            # a drafter makes DP syncs of its own: the ranks are checked to make as many per step
            self.phase = (dp_phase.PhaseCheck() if scenario.data_parallel_size > 1
                          and scenario.drafter is DrafterKind.WITH_MODEL else None)
        except Exception as exc:
            raise CannotBuild(f"vLLM {session.version} cannot build its scenario: {errors.first_line(exc)}") from exc
        self.vllm_config = vllm_config
        self.runner = runner
        self.raw: dict[str, object] = {}
        self.capture_phase = False
        self.warmup = False
        self.context = ""
        self.step: dict = {}

    # -- helpers ------------------------------------------------------------------------------

    @property
    def drafter(self):
        drafter = getattr(self.runner, "drafter", None)
        return drafter if drafter is not None and hasattr(drafter, "cudagraph_dispatcher") else None

    def model_of(self, role: str):
        return self.runner.model if role == "target" else self.runner.drafter.model

    def probe(self, role: str, model) -> "ModelProbe":
        return ModelProbe(self, role, model)

    def observe(self, role: str, model, args, kwargs):
        """One forward called by vLLM's code (``self.model(...)`` in ``_dummy_run``, the
        proposer's ``dummy_run``, ``_model_forward``), recorded as a dispatch under the forward
        context vLLM set."""
        from vllm.forward_context import get_forward_context

        context = get_forward_context()
        runtime_mode = context.cudagraph_runtime_mode
        raw = self.raw[role]
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        num_tokens = input_ids.shape[0]
        self.recorder.start(runtime_mode.name)
        error = output = None
        if self.session.device == "cuda":
            device.before_forward(raw, num_tokens)
        try:
            output = model(*args, **kwargs)
        except Exception as exc:
            error = errors.normalise(exc)
        dispatch = {
            "role": role,
            "context": self.context,
            "runtime_mode": runtime_mode.name,
            "batch_descriptor": _descriptor(context.batch_descriptor, num_tokens, context.ubatch_slices),
            **self.recorder.dispatch_fields(self.capture_phase),
        }
        selected = lora.selected(self.runner)
        if selected and self.capture_phase:
            dispatch["selected_loras"] = selected
        if error:
            dispatch["error"] = error
        if self.session.device == "cuda":
            device.after_forward(raw, num_tokens, output, dispatch)
        dispatches = self.step.setdefault("dispatches", [])
        if not (self.warmup and not error and all(layer["action"] == "passed" for layer in dispatch["layers"])):
            # Warm-up runs (_warmup_and_capture) are NONE dispatches the model does not record;
            # they are kept only when something acted on them.
            dispatches.append(dispatch)
        if error:
            raise Halt(error)
        return output

    def observed_dummy_run(self, dummy_run):
        def _dummy_run(num_tokens, *args, **kwargs):
            warmup, self.warmup = self.warmup, self.capture_phase and not kwargs.get("is_graph_capturing", False)
            try:
                return dummy_run(num_tokens, *args, **kwargs)
            finally:
                self.warmup = warmup

        return _dummy_run

    def observed_warmup_and_capture(self, warmup_and_capture):
        def _warmup_and_capture(*args, **kwargs):
            self.capture_phase = True
            try:
                return warmup_and_capture(*args, **kwargs)
            finally:
                self.capture_phase = False

        return _warmup_and_capture

    def observed_drafter_dummy_run(self, dummy_run):
        """The drafter's ``dummy_run`` forwards ``num_speculative_tokens`` times outside a capture
        (llm_base_proposer.py:1651-1694), all with the mode of its first dispatch; the model records
        them as one dispatch, so a repeat equal to the first is folded into it (a repeat that
        differs stays and shows as a disagreement)."""

        def drafter_dummy_run(*args, **kwargs):
            first = len(self.step.get("dispatches", []))
            try:
                return dummy_run(*args, **kwargs)
            finally:
                dispatches = self.step.get("dispatches", [])
                mine = dispatches[first:]
                if mine:
                    dispatches[first:] = [mine[0]] + [d for d in mine[1:] if d != mine[0]]

        return drafter_dummy_run

    def initialize_attn_backend(self, is_profiling: bool) -> None:
        try:
            self.runner.initialize_attn_backend(is_profiling=is_profiling)
        except ValueError as exc:
            raise Halt(errors.resolve_rejected(exc)) from exc

    # -- events -------------------------------------------------------------------------------

    def apply(self, event: Event) -> dict:
        self.step = {"event": event_to_json(event)}
        self.context = event.kind
        try:
            getattr(self, "on_" + event.kind)(event)
            self.end_step()
        except (Halt, dp_phase.OutOfPhase) as halt:
            self.step["halted"] = str(halt)
        except AssertionError as exc:  # one of vLLM's assertions stops the engine where it fires
            self.step["halted"] = errors.normalise(exc)
        except Exception as exc:  # vLLM's code raised where no step expects it: the engine stops there
            where = errors.raised_at(exc)
            if where is None:  # the replay's own code failed: the tool's error
                raise
            self.step["halted"], self.step["raised_at"] = errors.normalise(exc), where
        finally:
            self.session.decisions.close_step(event.kind)
        return self.step

    def end_step(self) -> None:
        """Where a drafter syncs too, the ranks' count of DP syncs in the step is agreed at its end
        (``dp_phase``). A rank that stopped for a reason of its own makes no such check: the others'
        fails there, and their step keeps what it did (the stopped rank's step ends the trace)."""
        if self.phase is None:
            return
        try:
            self.phase.end_step()
        except RuntimeError:  # gloo's: a peer that stopped left the group (OutOfPhase is no RuntimeError)
            pass

    def _attention(self, role: str):
        """The model's attention op: the release's own, on a layer registered in the configs the
        role's forward contexts are set up with (``contract/real/attention_op.py``)."""
        from models.tiny import attention

        op = AttentionOp(DRAFT_LAYER if role == "drafter" else TARGET_LAYER, attention, self.recorder.attention_ran)
        op.register(self.runner.vllm_config)
        if role == "drafter":
            op.register(getattr(self.drafter, "vllm_config", self.runner.vllm_config))
        return op

    def on_load_model(self, event: LoadModel) -> None:
        """``load_model``: the models are loaded, then the installed release's wrapping block runs.
        The wrapped models are then called through probes that record each forward."""
        from models.tiny import TinyModel

        for role, name in (("target", "model"), ("drafter", "drafter.model")):
            if role == "drafter" and self.drafter is None:
                continue
            raw = TinyModel(name, MAX_NUM_BATCHED_TOKENS, attention_op=self._attention(role),
                            device=self.runner.device)
            raw.on_compute = self.recorder.compute_ran
            self.raw[role] = raw
            if role == "target":
                self.runner.model = raw
                self.runner.input_ids = stand_in.Buffer(raw.input_ids)  # the runner's persistent buffer
            else:
                self.runner.drafter.model = raw
                self.runner.drafter.input_ids = raw.input_ids
        self.session.load_model_block(self.runner)
        self.step["stacks"], self.step["unwrap"] = {}, {}
        for role in self.raw:
            top = self.model_of(role)
            self.step["stacks"][role] = " -> ".join(self.label_stack(role, top))
            got = self.runner.get_model() if role == "target" else self.runner.get_draft_model()
            self.step["unwrap"][role] = _label(got)
        self.runner.model = self.probe("target", self.runner.model)
        if "drafter" in self.raw:
            self.runner.drafter.model = self.probe("drafter", self.runner.drafter.model)

    def label_stack(self, role: str, node) -> list[str]:
        from vllm.v1.worker.gpu_ubatch_wrapper import UBatchWrapper

        labels, index = [], 0
        while node is not self.raw[role]:
            label = _label(node)
            labels.append(label)
            self.recorder.label(node, f"{role}[{index}]:{label}", type(node).__name__)
            if isinstance(node, UBatchWrapper) and node.__dict__.get("cudagraph_wrapper") is not None:
                sibling = node.__dict__["cudagraph_wrapper"]
                self.recorder.label(sibling, f"{role}[{index}]:{label}.cudagraph_wrapper", type(sibling).__name__)
            node = node.__dict__["runnable"]
            index += 1
        labels.append(node.name)
        return labels

    def on_profile_run(self, event: ProfileRun) -> None:
        """``profile_run`` (:6464-6537), vLLM's own: ``_dummy_run(max_num_tokens, is_profile=True)``,
        the first forward of target and drafter, where Dynamo compiles under the mode in force now
        (``compiled.py`` stands for that compile)."""
        for role, raw in self.raw.items():
            for capturer in compiled.compile_model(raw, self.vllm_config):
                self.recorder.label(capturer, f"{role}:{observe.COMPILED}", observe.COMPILED)
        self.runner.profile_run()

    def on_profile_cudagraph_memory(self, event: ProfileCudagraphMemory) -> None:
        """``profile_cudagraph_memory`` (:6661-6828), vLLM's own: the first resolve (its minimal KV
        cache's ``initialize_attn_backend``), then a capture window over at most two descriptors per
        mode, whose ``finally`` clears every graph and the target dispatcher's keys."""
        try:
            self.runner.profile_cudagraph_memory()
        except ValueError as exc:
            raise Halt(errors.resolve_rejected(exc)) from exc
        finally:
            self.step["cudagraph_mode"] = self.vllm_config.compilation_config.cudagraph_mode.name

    def on_resolve(self, event: Resolve) -> None:
        """``initialize_kv_cache`` (:7416) → ``initialize_attn_backend`` → ``_check_and_update_cudagraph_mode``
        (:7131-7135)."""
        try:
            self.initialize_attn_backend(is_profiling=False)
        finally:
            self.step["cudagraph_mode"] = self.vllm_config.compilation_config.cudagraph_mode.name
        if self.drafter is not None:
            self.step["drafter_cudagraph_mode"] = self.drafter.cudagraph_dispatcher.cudagraph_mode.name

    def on_capture_model(self, event: CaptureModel) -> None:
        """``capture_model`` (:6830-6934), vLLM's own: every ``get_capture_descs()`` group through
        ``_capture_cudagraphs`` → ``_warmup_and_capture`` inside ``graph_capture()``."""
        self.runner.capture_model()

    def on_execute_model(self, event: ExecuteModel) -> None:
        """The step's batch; on several DP ranks this rank's, an idle one running the worker's
        ``execute_dummy_batch``, and the side ``_determine_batch_execution_and_padding`` gave it."""
        rank = self.vllm_config.parallel_config.data_parallel_rank if event.peers else 0
        batch = event if rank == 0 else event.peers[rank - 1]
        idle = rank > 0 and batch.idle
        if idle:
            from vllm.v1.worker.gpu_worker import Worker

            Worker.execute_dummy_batch(types.SimpleNamespace(model_runner=self.runner, randomize_dummy_inputs=False))
        else:
            self.runner.input_batch.lora_id_to_lora_request = adapters(event.num_active_loras)
            num_reqs = execute_model_dispatch(self.runner, batch.num_tokens, batch.uniform_decode, batch.force_eager)
            if event.peers and self.drafter is not None:
                # on several ranks every rank drafts in the step (sample_tokens → propose_draft_token_ids)
                self.context = "propose"
                propose_dispatch(self.drafter, batch.num_tokens)
                if self.drafter.num_speculative_tokens > 1:  # propose's remaining passes (:627-669)
                    self.context = "propose_decode"
                    propose_dispatch(self.drafter, num_reqs)
        if event.peers:
            mode, num_tokens, brought = self.batch_side
            self.step["rank"] = RankServed(mode, num_tokens, brought, batch.force_eager, idle).to_json()

    def observed_batch(self, determine):
        """``_determine_batch_execution_and_padding`` keeping what this rank brought and ran."""
        def _determine_batch_execution_and_padding(*args, **kwargs):
            out = determine(*args, **kwargs)
            uniform = self.runner.uniform_decode_query_len if kwargs.get("force_uniform_decode") else None
            self.batch_side = (CUDAGraphMode[out[0].name], out[1].num_tokens,
                               (kwargs["num_reqs"], kwargs["num_tokens"], uniform))
            return out

        return _determine_batch_execution_and_padding

    def on_propose(self, event: Propose) -> None:
        propose_dispatch(self.drafter, event.num_tokens)


class ModelProbe:
    """The wrapped model as vLLM's code calls it: records the forward (``RealRun.observe``)."""

    def __init__(self, run: RealRun, role: str, model) -> None:
        self.run, self.role, self.model = run, role, model

    def __call__(self, *args, **kwargs):
        return self.run.observe(self.role, self.model, args, kwargs)

    def __getattr__(self, name):
        return getattr(self.model, name)


def adapters(num_active_loras: int) -> dict:
    """The ``InputBatch``'s ``lora_id_to_lora_request`` for a batch of ``num_active_loras`` distinct
    adapters (``add_request``, ``33:v1/worker/gpu_input_batch.py:485-489``), whose size
    ``_determine_batch_execution_and_padding`` dispatches with (``33:v1/worker/gpu_model_runner.py:3720-3734``)."""
    from vllm.lora.request import LoRARequest

    return {i: LoRARequest(f"adapter-{i}", i, "/not/a/real/path") for i in range(1, num_active_loras + 1)}


def execute_model_dispatch(runner, num_tokens: int, uniform_decode: bool, force_eager: bool) -> None:
    """``execute_model``'s batch to dispatch and forward (:4323-4381 and :4506-4531 in 0.29.0):
    ``_determine_batch_execution_and_padding`` with the call's arguments, the padded counts,
    ``maybe_create_ubatch_slices``, then ``set_forward_context`` around ``_model_forward``, under
    ``torch.inference_mode()`` as ``execute_model`` is decorated. The batch is shaped as
    ``_dummy_run`` shapes one of ``num_tokens`` (:5968-5990); the event's ``uniform_decode`` and
    ``force_eager`` are passed as ``force_uniform_decode`` and ``force_eager``. Mirrored: guarded
    by ``decisions.MIRRORED``."""
    import numpy as np
    import torch

    from vllm.v1.worker import gpu_model_runner as gmr

    q = runner.uniform_decode_query_len
    max_query_len = q if uniform_decode else num_tokens
    if uniform_decode:
        num_reqs = min(runner.max_num_reqs, -(-num_tokens // q))
        tokens = [q] * num_reqs
        if num_tokens % q:
            tokens[-1] = num_tokens % q
    else:
        num_reqs = min(num_tokens, runner.max_num_reqs)
        tokens = [num_tokens // num_reqs] * num_reqs
        tokens[-1] += num_tokens % num_reqs
    num_scheduled_tokens_np = np.array(tokens, dtype=np.int32)
    with torch.inference_mode():
        cudagraph_mode, batch_desc, should_ubatch, num_tokens_across_dp, _ = (
            runner._determine_batch_execution_and_padding(
                num_tokens=num_tokens, num_reqs=num_reqs, num_scheduled_tokens_np=num_scheduled_tokens_np,
                max_num_scheduled_tokens=max_query_len, use_cascade_attn=False,
                allow_microbatching=runner._allow_microbatching(num_reqs, num_scheduled_tokens_np),
                force_eager=force_eager, force_uniform_decode=uniform_decode,
            )
        )
        num_tokens_padded = batch_desc.num_tokens
        num_reqs_padded = batch_desc.num_reqs if batch_desc.num_reqs is not None else num_reqs
        _, ubatch_slices_padded = gmr.maybe_create_ubatch_slices(
            should_ubatch, num_scheduled_tokens_np, num_tokens_padded, num_reqs_padded,
            runner.parallel_config.num_ubatches,
        )
        with gmr.set_forward_context(
            None, runner.vllm_config, num_tokens=num_tokens_padded, num_tokens_across_dp=num_tokens_across_dp,
            cudagraph_runtime_mode=cudagraph_mode, batch_descriptor=batch_desc, ubatch_slices=ubatch_slices_padded,
        ):
            runner._model_forward(input_ids=runner.input_ids.gpu[:num_tokens_padded],
                                  positions=runner.positions[:num_tokens_padded])
    return num_reqs


def propose_dispatch(drafter, num_tokens: int) -> None:
    """One pass of ``propose`` (33:v1/spec_decode/llm_base_proposer.py:511-720):
    ``_determine_batch_execution_and_padding``, then a forward context with no batch descriptor, so
    the wrappers see ``BatchDescriptor(num_tokens=padded)`` (forward_context.py:324-325); under
    ``torch.inference_mode()``, as ``sample_tokens`` is decorated. The first pass is at the step's
    token count (:570); on several DP ranks, with more than one draft token, the remaining passes
    sync once at the request count (:668) and this one forward stands for their
    ``num_speculative_tokens - 1``, which share its mode and descriptor. Mirrored: guarded by
    ``decisions.MIRRORED``."""
    import torch

    from vllm.v1.spec_decode import llm_base_proposer

    with torch.inference_mode():
        cudagraph_runtime_mode, num_input_tokens, num_tokens_across_dp = (
            drafter._determine_batch_execution_and_padding(num_tokens)
        )
        with llm_base_proposer.set_forward_context(
            None, drafter.vllm_config, num_tokens=num_input_tokens, num_tokens_across_dp=num_tokens_across_dp,
            cudagraph_runtime_mode=cudagraph_runtime_mode,
        ):
            drafter.model(input_ids=drafter.input_ids[:num_input_tokens],
                          positions=drafter.positions[:num_input_tokens])


def _track_decision_points(runner_class) -> None:
    """Pass-through shims noting each decision point a step reaches (``decisions.py``)."""
    import vllm.compilation.backends as backends
    import vllm.v1.spec_decode.llm_base_proposer as proposer
    import vllm.v1.worker.gpu_model_runner as gmr
    from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher

    for name in stand_in.DECISIONS:
        if name in runner_class.__dict__:
            decisions.track_attribute(runner_class, name, f"GPUModelRunner.{name}")
    for name in ("dispatch", "get_capture_descs", "initialize_cudagraph_keys"):
        decisions.track_attribute(CudagraphDispatcher, name, f"CudagraphDispatcher.{name}")
    from vllm.compilation.breakable_cudagraph import BreakableCUDAGraphWrapper
    from vllm.compilation.cuda_graph import CUDAGraphWrapper
    from vllm.v1.spec_decode.draft_model import DraftModelProposer
    from vllm.v1.spec_decode.eagle import EagleProposer
    from vllm.v1.worker.gpu_ubatch_wrapper import UBatchWrapper

    for proposer_class in (EagleProposer, DraftModelProposer):
        for name in ("dummy_run", "_determine_batch_execution_and_padding"):
            decisions.track_attribute(proposer_class, name, f"{proposer_class.__name__}.{name}")
    for cls in (CUDAGraphWrapper, BreakableCUDAGraphWrapper, UBatchWrapper):
        decisions.track_attribute(cls, "__call__", f"{cls.__name__}.__call__")
    for module in (gmr, proposer):
        decisions.track_attribute(module, "set_forward_context")
    for name in ("graph_capture", "maybe_create_ubatch_slices"):
        decisions.track_attribute(gmr, name)
    decisions.track_attribute(backends, "wrap_with_cudagraph_if_needed")
    from vllm.config import CompilationConfig

    if "resolve_cudagraph_mode_and_sizes" in CompilationConfig.__dict__:  # the resolve's branches
        decisions.track_attribute(CompilationConfig, "resolve_cudagraph_mode_and_sizes",
                                  "CompilationConfig.resolve_cudagraph_mode_and_sizes")
    # the harness's mirrored points, located at the statements they mirror
    from pathlib import Path

    import vllm

    package = Path(vllm.__file__).resolve().parent
    m = {point.point: point.location(package) for point in decisions.MIRRORED}
    global execute_model_dispatch, propose_dispatch
    execute_model_dispatch = decisions.tracked(execute_model_dispatch, decisions.MIRRORED[1].point,
                                               m[decisions.MIRRORED[1].point])
    propose_dispatch = decisions.tracked(propose_dispatch, decisions.MIRRORED[2].point, m[decisions.MIRRORED[2].point])
    compiled.split_graph = decisions.tracked(compiled.split_graph, decisions.MIRRORED[0].point,
                                             m[decisions.MIRRORED[0].point])


def _label(node) -> str:
    """The model's layer label for a real wrapper (``contract/runners/mrv1/model/wrappers.py``), or a raw model's name."""
    name = type(node).__name__
    if name == "CUDAGraphWrapper":
        return f"{name}({node.__dict__['runtime_mode'].name})"
    if name == "UBatchWrapper":
        # No runtime_mode attribute: it builds its sibling CUDAGraphWrapper(runtime_mode) iff
        # runtime_mode is not NONE (gpu_ubatch_wrapper.py:84-88).
        sibling = node.__dict__.get("cudagraph_wrapper")
        return f"{name}({'NONE' if sibling is None else sibling.runtime_mode.name})"
    if name == "BreakableCUDAGraphWrapper":
        mode = node.__dict__.get("runtime_mode")  # absent in 0.29.0: match-any
        return f"{name}({'None' if mode is None else mode.name})"
    return getattr(node, "name", name)


def _descriptor(batch_descriptor, num_tokens: int, ubatch_slices=None) -> dict:
    """The forward context's ``BatchDescriptor`` in the model's JSON form; LoRA fields appear only
    when set, and the number of its ``ubatch_slices`` where it is micro-batched. A NONE forward
    context built from ``num_tokens`` alone holds no descriptor (forward_context.py:324-325
    substitutes one only for other modes); no wrapper reads it then, and it is shown as the
    ``BatchDescriptor(num_tokens)`` the model shows."""
    if batch_descriptor is None:
        out = {"num_tokens": num_tokens, "num_reqs": None, "uniform": False}
    else:
        out = {"num_tokens": batch_descriptor.num_tokens, "num_reqs": batch_descriptor.num_reqs,
               "uniform": batch_descriptor.uniform}
    if getattr(batch_descriptor, "has_lora", False) or getattr(batch_descriptor, "num_active_loras", 0):
        out["has_lora"] = batch_descriptor.has_lora
        out["num_active_loras"] = batch_descriptor.num_active_loras
    if ubatch_slices:
        out["num_ubatches"] = len(ubatch_slices)
    return out
