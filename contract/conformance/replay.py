"""A trace's events run on vLLM's real code, observed in the model's format.

The harness plays the MRV1 runner's start-up sequence and serving steps in the order
``contract/runner.py`` models them (spec §8.3), on a stand-in runner object. Every decision is
vLLM's: ``VllmConfig.__post_init__`` (``vllm_config.py``), ``load_model``'s wrapping block
(``wrapping.py``), the compile decisions at the first forward (``compiled.py``),
``GPUModelRunner._check_and_update_cudagraph_mode`` (called unbound on the stand-in: resolve, the
target keys and the drafter's ``initialize_cudagraph_keys``), ``CudagraphDispatcher.dispatch`` and
``get_capture_descs``, the proposer's ``_determine_batch_execution_and_padding``,
``set_forward_context`` and the wrappers' gating, capture, replay and capture guard. What the
harness writes itself is the orchestration between those calls, each step citing the vLLM 0.30.0
lines it mirrors.
"""

from __future__ import annotations

import contextlib
import gc
import os
import types

from contract.conformance import compiled, device, errors, observe, platform, wrapping
from contract.conformance.observe import Recorder
from contract.conformance.simcuda import SimCuda
from contract.conformance.vllm_config import MAX_NUM_BATCHED_TOKENS, ConfigCache
from contract.events import (
    CaptureModel,
    Event,
    ExecuteModel,
    LoadModel,
    ProfileCudagraphMemory,
    ProfileRun,
    Propose,
    Resolve,
    event_to_json,
)
from contract.runner import PROFILE_NUM_TOKENS
from contract.scenario import DrafterKind, Scenario


class Halt(Exception):
    """vLLM stopped: the text is the model's ``halted`` form."""


class CannotBuild(Exception):
    """vLLM refuses the trace's scenario at start-up (``VllmConfig`` or a ``CudagraphDispatcher``
    raised), where the model starts: the trace cannot be replayed on this release."""


class Session:
    """Once per process: platform, simulated CUDA, spies, config cache, the wrapping block."""

    def __init__(self) -> None:
        # Explicit: where Triton is importable, 0.33 picks Model Runner V2 by default (config/vllm.py:730-767).
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"
        platform.activate()
        import vllm
        from vllm.v1.worker import gpu_model_runner

        self.version = vllm.__version__
        from contract.conformance import simcuda

        self.device = simcuda.DEVICE
        self.gpu_model_runner = gpu_model_runner
        self.block = wrapping.load(gpu_model_runner)
        self.configs = ConfigCache()
        self.recorder = Recorder()
        observe.install(self.recorder)
        self._backends: dict[str, type] = {}
        # What freeze_gc_for_cudagraph_capture does around bulk capture (utils/gc_utils.py:97-121),
        # once for the whole process: the imported world is frozen so the collections the wrappers
        # run per capture (breakable_cudagraph.py:381-383) stay cheap.
        gc.collect()
        gc.freeze()

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
        type(vllm_platforms.current_platform)._global_graph_pool = None
        SimCuda.reset()
        self.recorder.labels.clear()

    def attention_backend(self, support_name: str) -> type:
        """An attention backend whose metadata builder reports ``support_name``
        (``AttentionMetadataBuilder.get_cudagraph_support``, ``v1/attention/backend.py``)."""
        if support_name not in self._backends:
            from vllm.v1.attention.backend import AttentionCGSupport

            support = AttentionCGSupport[support_name]

            class SimAttentionMetadataBuilder:
                @classmethod
                def get_cudagraph_support(cls, vllm_config, kv_cache_spec):
                    return support

            class SimAttentionBackend:
                @staticmethod
                def get_builder_cls():
                    return SimAttentionMetadataBuilder

            SimAttentionBackend.__name__ = f"SIM_ATTN_{support_name}"
            self._backends[support_name] = SimAttentionBackend
        return self._backends[support_name]

    def replay(self, scenario: Scenario, events: list[Event]) -> list[dict]:
        """One observation per event, in ``StepRecord.to_json`` form; stops where vLLM stops."""
        self.reset()
        steps: list[dict] = []
        run = RealRun(self, scenario)
        for event in events:
            step = run.apply(event)
            steps.append(step)
            if "halted" in step:
                break
        return steps


class RealRun:
    """The stand-in runner for one trace and the step functions that drive vLLM's code."""

    def __init__(self, session: Session, scenario: Scenario) -> None:
        import torch

        from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher
        from vllm.v1.spec_decode.eagle import EagleProposer

        self.session, self.scenario = session, scenario
        self.recorder = session.recorder
        try:
            vllm_config = session.configs.get(scenario)
            speculative_config = vllm_config.speculative_config
            # GPUModelRunner.__init__ (gpu_model_runner.py:551, :705-710, :904-907)
            runner = types.SimpleNamespace(
                vllm_config=vllm_config,
                compilation_config=vllm_config.compilation_config,
                parallel_config=vllm_config.parallel_config,
                speculative_config=speculative_config,
                device=torch.device("cuda" if session.device == "cuda" else "cpu"),
                max_num_reqs=vllm_config.scheduler_config.max_num_seqs,
                kv_cache_config=None,  # read by resolve only for Mamba layers
                uniform_decode_query_len=1 + vllm_config.num_speculative_tokens,
                cudagraph_dispatcher=CudagraphDispatcher(vllm_config),
            )
            if scenario.drafter is DrafterKind.WITH_MODEL:
                # An EagleProposer holding what the cudagraph path reads of it
                # (llm_base_proposer.py:185, :424-440, :1797-1845); its __init__ builds a draft model.
                drafter = EagleProposer.__new__(EagleProposer)
                drafter.vllm_config = vllm_config
                drafter.speculative_config = speculative_config
                drafter.cudagraph_dispatcher = CudagraphDispatcher(vllm_config)
                drafter.dp_rank = 0
                runner.drafter = drafter
            elif scenario.drafter is DrafterKind.WITHOUT_MODEL:
                runner.drafter = types.SimpleNamespace()  # NgramProposer: no .model, no dispatcher
        except Exception as exc:
            raise CannotBuild(f"vLLM {session.version} cannot build its scenario: {errors.first_line(exc)}") from exc
        self.vllm_config = vllm_config
        self.runner = runner
        self.raw: dict[str, object] = {}
        self.capture_phase = False
        self.step: dict = {}

    # -- helpers ------------------------------------------------------------------------------

    @property
    def drafter(self):
        drafter = getattr(self.runner, "drafter", None)
        return drafter if drafter is not None and hasattr(drafter, "cudagraph_dispatcher") else None

    def model_of(self, role: str):
        return self.runner.model if role == "target" else self.runner.drafter.model

    def forward(self, role: str, context: str, runtime_mode, *, batch_descriptor=None, num_tokens=None) -> None:
        """``with set_forward_context(...): model(...)`` as ``_dummy_run`` (:6159-6182), execute_model
        and the proposer (llm_base_proposer.py:593-601, :1658-1680) do it."""
        from vllm.forward_context import get_forward_context, set_forward_context

        raw = self.raw[role]
        if num_tokens is None:
            num_tokens = batch_descriptor.num_tokens
        self.recorder.start(runtime_mode.name)
        error = None
        with set_forward_context(None, self.vllm_config, num_tokens=num_tokens,
                                 cudagraph_runtime_mode=runtime_mode, batch_descriptor=batch_descriptor):
            seen = get_forward_context().batch_descriptor
            output = None
            if self.session.device == "cuda":
                device.before_forward(raw, num_tokens)
            try:
                output = self.model_of(role)(input_ids=raw.input_ids[:num_tokens])
            except Exception as exc:
                error = errors.normalise(exc)
        dispatch = {
            "role": role,
            "context": context,
            "runtime_mode": runtime_mode.name,
            "batch_descriptor": _descriptor(seen, num_tokens),
            "layers": self.recorder.layers(),
            "capture_phase": self.capture_phase,
            "ran_eager": self.recorder.ran_eager,
        }
        if error:
            dispatch["error"] = error
        if self.session.device == "cuda":
            device.after_forward(raw, num_tokens, output, dispatch)
        self.step.setdefault("dispatches", []).append(dispatch)
        if error:
            raise Halt(error)

    def dummy_run(self, context: str, num_tokens: int, cudagraph_runtime_mode=None, *, uniform_decode=False,
                  is_profile=False, is_graph_capturing=False, warmup=False) -> None:
        """``_dummy_run`` (:5850-6255): dispatch through ``_determine_batch_execution_and_padding``
        with ``force_eager = is_profile or mode == NONE`` and ``force_uniform_decode``
        (:5955-5977, dispatch at :3998-4008), the capture-run assertion (:5980-5986), the target
        forward (:6159-6182), then the drafter's ``dummy_run`` with ``use_cudagraphs`` (:6204-6230)."""
        from vllm.config import CUDAGraphMode

        force_eager = is_profile or cudagraph_runtime_mode == CUDAGraphMode.NONE
        mode, batch_descriptor = self.runner.cudagraph_dispatcher.dispatch(
            num_tokens=num_tokens, has_lora=False, uniform_decode=uniform_decode, num_active_loras=0,
            valid_modes={CUDAGraphMode.NONE} if force_eager else None, invalid_modes=None,
        )
        if cudagraph_runtime_mode is not None and cudagraph_runtime_mode != mode:
            raise Halt(errors.normalise(AssertionError(
                f"Cudagraph runtime mode mismatch in dummy_run. Expected {mode}, but got {cudagraph_runtime_mode}."
            )))
        with self.unrecorded(warmup):
            self.forward("target", context, mode, batch_descriptor=batch_descriptor)
            drafter = self.drafter
            if drafter is None:
                return
            use_cudagraphs = (
                (is_graph_capturing and mode == CUDAGraphMode.PIECEWISE)
                or (not is_graph_capturing and mode != CUDAGraphMode.NONE)
            ) and not self.runner.speculative_config.enforce_eager
            # EagleProposer.dummy_run (llm_base_proposer.py:1628-1680): one forward per capture run;
            # the model records the drafter's forwards of a dummy run as one dispatch.
            draft_mode, draft_tokens, _ = type(drafter)._determine_batch_execution_and_padding(
                drafter, num_tokens, use_cudagraphs=use_cudagraphs
            )
            self.forward("drafter", context, draft_mode, num_tokens=draft_tokens)

    @contextlib.contextmanager
    def unrecorded(self, warmup: bool):
        """Warm-up runs (``_warmup_and_capture``, :6950-6962) are NONE dispatches the model does not
        record; they are kept out of the observation unless something acted on them."""
        if not warmup:
            yield
            return
        before = self.step.get("dispatches", [])
        self.step["dispatches"] = []
        try:
            yield
        finally:
            warm = self.step["dispatches"]
            acted = [d for d in warm if d.get("error") or any(layer["action"] != "passed" for layer in d["layers"])]
            self.step["dispatches"] = before + acted

    def check_and_update_cudagraph_mode(self, is_profiling: bool) -> None:
        """``_check_and_update_cudagraph_mode`` (:7177-7234), vLLM's own, on the stand-in: the
        minimum attention support, resolve, target keys, then the drafter's keys."""
        gmr = self.session.gpu_model_runner
        backend = self.session.attention_backend(self.scenario.attention_support.name)
        try:
            gmr.GPUModelRunner._check_and_update_cudagraph_mode(
                self.runner, [{backend}], [types.SimpleNamespace(kv_cache_spec=None)], is_profiling=is_profiling
            )
        except ValueError as exc:
            raise Halt(errors.resolve_rejected(exc)) from exc

    def capture_descs(self, context: str, limit: int | None) -> None:
        """``_capture_cudagraphs`` → ``_warmup_and_capture`` per descriptor (:6936-7034): warm-up
        NONE runs, then the capture run ``_dummy_run(is_graph_capturing=True)``. Micro-batched
        capture needs ``should_ubatch``, which only DP coordination sets (:4022-4033)."""
        cc = self.vllm_config.compilation_config
        for mode, descs in self.runner.cudagraph_dispatcher.get_capture_descs():
            for desc in descs[:limit]:
                for _ in range(cc.cudagraph_num_of_warmups):
                    self.dummy_run(context, desc.num_tokens, type(mode).NONE, uniform_decode=desc.uniform,
                                   warmup=True)
                self.dummy_run(context, desc.num_tokens, mode, uniform_decode=desc.uniform, is_graph_capturing=True)

    # -- events -------------------------------------------------------------------------------

    def apply(self, event: Event) -> dict:
        self.step = {"event": event_to_json(event)}
        try:
            getattr(self, "on_" + event.kind)(event)
        except Halt as halt:
            self.step["halted"] = str(halt)
        except AssertionError as exc:  # one of vLLM's assertions stops the engine where it fires
            self.step["halted"] = errors.normalise(exc)
        return self.step

    def on_load_model(self, event: LoadModel) -> None:
        """``load_model``: the models are loaded, then the installed release's wrapping block runs."""
        from models.tiny import TinyModel, breakable_attention

        for role, name in (("target", "model"), ("drafter", "drafter.model")):
            if role == "drafter" and self.drafter is None:
                continue
            raw = TinyModel(name, MAX_NUM_BATCHED_TOKENS, attention_op=breakable_attention(),
                            device=self.runner.device)
            raw.on_compute = self.recorder.compute_ran
            self.raw[role] = raw
            if role == "target":
                self.runner.model = raw
            else:
                self.runner.drafter.model = raw
        self.session.block.function(self.runner)
        gmr = self.session.gpu_model_runner.GPUModelRunner
        self.step["stacks"], self.step["unwrap"] = {}, {}
        for role in self.raw:
            top = self.model_of(role)
            self.step["stacks"][role] = " -> ".join(self.label_stack(role, top))
            got = gmr.get_model(self.runner) if role == "target" else gmr.get_draft_model(self.runner)
            self.step["unwrap"][role] = _label(got)

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
        """``profile_run`` → ``_dummy_run(max_num_tokens, is_profile=True)`` (:6464-6537, call at
        :6524-6526): the first forward of target and drafter, where Dynamo compiles under the mode
        in force now. It dispatches the model's ``PROFILE_NUM_TOKENS``, not ``max_num_tokens``: any
        count gives NONE here (``force_eager``), and the observation shows the count."""
        for role, raw in self.raw.items():
            for capturer in compiled.compile_model(raw, self.vllm_config):
                self.recorder.label(capturer, f"{role}:{observe.COMPILED}", observe.COMPILED)
        self.dummy_run("profile_run", PROFILE_NUM_TOKENS, is_profile=True)

    def on_profile_cudagraph_memory(self, event: ProfileCudagraphMemory) -> None:
        """``profile_cudagraph_memory`` (:6661-6828): the first resolve (``initialize_kv_cache``
        with ``is_profiling=True``), then a capture window over at most two descriptors per mode,
        whose ``finally`` closes the window, clears every graph of both wrapper classes and the
        target dispatcher's keys (:6794-6808)."""
        from vllm.compilation.breakable_cudagraph import BreakableCUDAGraphWrapper
        from vllm.compilation.cuda_graph import CUDAGraphWrapper
        from vllm.compilation.monitor import set_cudagraph_capturing_enabled

        try:
            self.check_and_update_cudagraph_mode(is_profiling=True)
            dispatcher = self.runner.cudagraph_dispatcher
            if sum(len(descs) for _, descs in dispatcher.get_capture_descs()) == 0:
                return  # :6679-6682
            try:
                set_cudagraph_capturing_enabled(True)
                self.capture_phase = True
                self.capture_descs("profile_cudagraph_memory", 2)
            finally:
                self.capture_phase = False
                set_cudagraph_capturing_enabled(False)
                CUDAGraphWrapper.clear_all_graphs()
                BreakableCUDAGraphWrapper.clear_all_graphs()
                for key_set in dispatcher.cudagraph_keys.values():
                    key_set.clear()
                dispatcher.keys_initialized = False
        finally:
            self.step["cudagraph_mode"] = self.vllm_config.compilation_config.cudagraph_mode.name

    def on_resolve(self, event: Resolve) -> None:
        """``initialize_kv_cache`` (:7416) → ``initialize_attn_backend`` → ``_check_and_update_cudagraph_mode``
        (:7131-7135)."""
        try:
            self.check_and_update_cudagraph_mode(is_profiling=False)
        finally:
            self.step["cudagraph_mode"] = self.vllm_config.compilation_config.cudagraph_mode.name
        if self.drafter is not None:
            self.step["drafter_cudagraph_mode"] = self.drafter.cudagraph_dispatcher.cudagraph_mode.name

    def on_capture_model(self, event: CaptureModel) -> None:
        """``capture_model`` (:6830-6934): return early on NONE, open the window, capture every
        ``get_capture_descs()`` group, close the window."""
        from vllm.config import CUDAGraphMode
        from vllm.compilation.monitor import set_cudagraph_capturing_enabled

        if self.vllm_config.compilation_config.cudagraph_mode == CUDAGraphMode.NONE:
            return
        set_cudagraph_capturing_enabled(True)
        self.capture_phase = True
        try:
            self.capture_descs("capture_model", None)
        finally:
            self.capture_phase = False
        set_cudagraph_capturing_enabled(False)

    def on_execute_model(self, event: ExecuteModel) -> None:
        """``execute_model`` → ``_determine_batch_execution_and_padding`` (:3953-4060) → forward."""
        from vllm.config import CUDAGraphMode

        mode, batch_descriptor = self.runner.cudagraph_dispatcher.dispatch(
            num_tokens=event.num_tokens, has_lora=False, uniform_decode=event.uniform_decode,
            num_active_loras=0, valid_modes={CUDAGraphMode.NONE} if event.force_eager else None,
            invalid_modes=None,
        )
        self.forward("target", "execute_model", mode, batch_descriptor=batch_descriptor)

    def on_propose(self, event: Propose) -> None:
        """``propose`` (llm_base_proposer.py:515-601): dispatch, then a forward context with no
        batch descriptor, so the wrappers see ``BatchDescriptor(num_tokens=padded)``
        (forward_context.py:324-325)."""
        drafter = self.drafter
        mode, num_tokens, _ = type(drafter)._determine_batch_execution_and_padding(drafter, event.num_tokens)
        self.forward("drafter", "propose", mode, num_tokens=num_tokens)


def _label(node) -> str:
    """The model's layer label for a real wrapper (``contract/stack.py``), or a raw model's name."""
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


def _descriptor(batch_descriptor, num_tokens: int) -> dict:
    """The forward context's ``BatchDescriptor`` in the model's JSON form; LoRA fields appear only
    when set. A NONE forward context built from ``num_tokens`` alone holds no descriptor
    (forward_context.py:324-325 substitutes one only for other modes); no wrapper reads it then,
    and it is shown as the ``BatchDescriptor(num_tokens)`` the model shows."""
    if batch_descriptor is None:
        return {"num_tokens": num_tokens, "num_reqs": None, "uniform": False}
    out = {"num_tokens": batch_descriptor.num_tokens, "num_reqs": batch_descriptor.num_reqs,
           "uniform": batch_descriptor.uniform}
    if getattr(batch_descriptor, "has_lora", False) or getattr(batch_descriptor, "num_active_loras", 0):
        out["has_lora"] = batch_descriptor.has_lora
        out["num_active_loras"] = batch_descriptor.num_active_loras
    return out
