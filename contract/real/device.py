"""``--device cuda``: the conformance replay on real CUDA graphs instead of ``simcuda``.

What stays the same as ``cpu-sim``: vLLM's config, resolve, dispatcher, ``load_model`` block, the
runner's orchestration, wrappers and capture guard, and the observer (``observe.py``), which here
hears the events of real ``torch.cuda.CUDAGraph`` objects (``ObservedGraph`` calls the real method
after telling it). ``capture_model`` and ``profile_cudagraph_memory`` are vLLM's own, so warm-ups
and captures run inside vLLM's ``graph_capture()``, on the side stream it creates.

What still stands in, and why:

- the platform object (``platform.py``): ``vllm.platforms.cuda`` imports ``vllm._C_stable_libtorch``
  at module level (``platforms/cuda.py:23`` in 0.30.0), a compiled extension built for another torch
  than the device's, so it cannot load; its ``graph_pool_handle`` is made to return a real pool;
- ``weak_ref_tensor(s)`` (``compilation/cuda_graph.py:334``, ``breakable_cudagraph.py``) call
  ``torch.ops._C.weak_ref_tensor`` from the same missing extension; the tensor itself is kept
  instead (a strong reference: more memory held, same addresses, same results).
- the ``flashinfer`` package, where the device's environment lacks it: FlashInfer's backend module
  (NEVER's chunked local attention builds on it, ``attention_backends.py``) imports its names, which
  no support getter calls.

Per dispatch it records what the model's prediction is checked against (``DispatchFacts``): CUDA
graph objects captured, breakable segments, ``compilation_counter.num_cudagraph_captured``
(incremented at ``compilation/cuda_graph.py:341``), and for a replay whether the output equals the
eager output on fresh random inputs copied into the model's static buffers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from contract.real.simcuda import SimCuda

DEVICES = ("cpu-sim", "cuda")
# The process's replay device, chosen once before a session starts (``select``); a replay runs in a
# process of its own, so the choice never leaks into another run.
SELECTED = "cpu-sim"


def select(name: str) -> None:
    global SELECTED
    if name not in DEVICES:
        raise DeviceProblem(f"--device must be one of {', '.join(DEVICES)}, got {name!r}")
    SELECTED = name
RTOL = 1e-6


class DeviceProblem(Exception):
    """The requested device cannot be used here; one line."""


def require_cuda() -> None:
    import torch

    if not torch.cuda.is_available():
        raise DeviceProblem("--device cuda: torch.cuda.is_available() is False on this machine "
                            "(no CUDA device or a CPU-only torch); use --device cpu-sim")


@dataclass
class DispatchFacts:
    graphs_captured: int = 0  # ObservedGraph capture_end calls
    segments: int = 0  # graphs captured inside a BreakableCUDAGraphCapture
    counter_captured: int = 0  # compilation_counter.num_cudagraph_captured delta
    replays: int = 0
    max_rel_error: float | None = None  # replayed output against eager, when replayed


@dataclass
class Checks:
    facts: list[DispatchFacts] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def summary(self) -> dict:
        replayed = [f for f in self.facts if f.max_rel_error is not None]
        return {
            "dispatches": len(self.facts),
            "graphs_captured": sum(f.graphs_captured for f in self.facts),
            "breakable_segments": sum(f.segments for f in self.facts),
            "num_cudagraph_captured": sum(f.counter_captured for f in self.facts),
            "replays_checked": len(replayed),
            "max_rel_error": max((f.max_rel_error for f in replayed), default=None),
            "failures": self.failures,
        }


CHECKS = Checks()
_current: DispatchFacts | None = None


def install() -> None:
    """Real CUDA graphs, observed; installed by ``platform.activate`` when ``SELECTED == "cuda"``."""
    import torch

    import vllm.compilation.breakable_cudagraph as bcg
    import vllm.compilation.cuda_graph as cg
    import vllm.platforms as vllm_platforms

    real = torch.cuda.CUDAGraph

    class ObservedGraph(real):
        """A real graph that reports to the observer like ``SimGraph`` (depth, then the real call,
        so a capture begun inside another raises CUDA's own error)."""

        def capture_begin(self, *args, **kwargs):
            SimCuda.depth += 1
            self.depth, self.tag = SimCuda.depth, None
            self.pool = kwargs.get("pool", args[0] if args else None)
            SimCuda.emit("begin", self)
            try:
                return super().capture_begin(*args, **kwargs)
            except BaseException:
                SimCuda.depth -= 1
                raise

        def capture_end(self):
            try:
                return super().capture_end()
            finally:
                SimCuda.depth -= 1
                if _current is not None:
                    _current.graphs_captured += 1
                    if getattr(bcg.BreakableCUDAGraphCapture._tls, "active", None) is not None:
                        _current.segments += 1

        def replay(self):
            SimCuda.emit("replay", self)
            if _current is not None:
                _current.replays += 1
            return super().replay()

    torch.cuda.CUDAGraph = ObservedGraph
    type(vllm_platforms.current_platform).graph_pool_handle = lambda self: torch.cuda.graph_pool_handle()
    cg.weak_ref_tensors = _identity
    bcg.weak_ref_tensors = _identity
    bcg.weak_ref_tensor = _identity


def _identity(x):
    return x


def before_forward(raw, num_tokens: int) -> None:
    """Fresh random inputs into the static buffer the graphs were captured on (never all zero)."""
    global _current
    import torch
    from vllm.compilation.counter import compilation_counter

    _current = DispatchFacts()
    _current.counter_captured = -compilation_counter.num_cudagraph_captured
    raw.input_ids[:num_tokens].copy_(torch.rand(num_tokens, raw.input_ids.shape[1], device=raw.input_ids.device) + 0.5)


def after_forward(raw, num_tokens: int, output, dispatch: dict) -> None:
    """Close the dispatch's facts; for a replay, compare with the eager forward on the same inputs."""
    global _current
    import torch

    facts, _current = _current, None
    acted, where = _check_graph_counts(facts, dispatch)
    if "replayed" in acted and output is not None and "error" not in dispatch:
        got = output.detach().clone()
        hook, raw.on_compute = raw.on_compute, None
        try:
            want = raw.eager(raw.input_ids[:num_tokens])
        finally:
            raw.on_compute = hook
        torch.cuda.synchronize()
        facts.max_rel_error = float(((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item())
        if facts.max_rel_error > RTOL:
            CHECKS.failures.append(f"{where}: replayed output differs from eager (rel. error {facts.max_rel_error:.2e})")


def _check_graph_counts(facts, dispatch: dict) -> tuple[set, str]:
    """Record the dispatch's facts: a layer the model says captured captured a CUDA graph; a
    predicted eager fallback captured and replayed none. Returns the layers' actions and a label."""
    from vllm.compilation.counter import compilation_counter

    facts.counter_captured += compilation_counter.num_cudagraph_captured
    CHECKS.facts.append(facts)
    where = f"{dispatch['context']} {dispatch['role']} {dispatch['runtime_mode']}"
    acted = {layer["action"] for layer in dispatch["layers"]}
    if "captured" in acted and facts.graphs_captured == 0:
        CHECKS.failures.append(f"{where}: a layer captured but no CUDA graph was captured")
    if dispatch["runtime_mode"] != "NONE" and not acted - {"passed"} and facts.graphs_captured + facts.replays:
        CHECKS.failures.append(f"{where}: eager fallback predicted, but a CUDA graph captured or replayed")
    return acted, where


def open_dispatch() -> None:
    """Model Runner V2: start one dispatch's facts (graphs, replays, the capture counter). Its
    forwards run vLLM's own inputs (``ModelCudaGraphManager`` keeps the static buffers), so no
    output is compared with eager; the graph counts are checked against the model's layers."""
    global _current
    from vllm.compilation.counter import compilation_counter

    _current = DispatchFacts()
    _current.counter_captured = -compilation_counter.num_cudagraph_captured


def close_dispatch(dispatch: dict) -> None:
    """Close the dispatch ``open_dispatch`` started: a layer the model says captured captured a CUDA
    graph; a predicted eager fallback captured and replayed none."""
    global _current
    facts, _current = _current, None
    if facts is not None:
        _check_graph_counts(facts, dispatch)


def double_capture(model_step: dict | None, real_step: dict | None) -> bool:
    """The model predicts a capture inside an open capture (depth >= 1) and real CUDA raised: the
    step agrees on a device, where the nested capture is CUDA's error rather than an observation."""
    if not model_step or not real_step or "halted" not in real_step:
        return False
    nested = any(layer.get("action") == "captured" and layer.get("depth", 0) >= 1
                 for d in model_step.get("dispatches", []) for layer in d["layers"])
    return nested and any("error" in d for d in real_step.get("dispatches", []))


def reconcile(run) -> int:
    """Count a predicted double capture met by CUDA's error as agreeing; the model's later steps
    cannot be compared (the real engine stopped) and leave the count. Returns the steps so counted."""
    counted = 0
    for result in [r for r in run.results if r.diffs] + run.generated_diffs:
        first = result.diffs[0]
        if double_capture(first.model, first.real):
            rest = len(result.diffs) - 1
            result.steps -= rest
            result.agreeing += 1
            if result in run.generated_diffs:
                run.generated["steps"] -= rest
                run.generated["agreeing"] += 1
                run.generated_diffs.remove(result)
            result.note = (result.note + "; " if result.note else "") + "double capture: CUDA's error on device"
            result.diffs = []
            counted += 1
    return counted
