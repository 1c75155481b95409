"""Which decision points of each Model Runner V2 step were made by vLLM's code and which by the harness.

The mechanism is MRV1's (``contract/real/decisions.py``): a pass-through shim per point notes
it in the current step, and who made it is read from where the point's code lives. Tracked here,
as vLLM's:

- ``VllmConfig.__post_init__``: the trace's config (``vllm_config.ConfigCache`` builds one per
  config-time class through it and hands out its post-init state; noted by ``RealRun`` as the
  trace's start-up step);
- the ``v1/worker/gpu/model_runner.py`` blocks the replay cuts with ``ast`` and runs unchanged
  (``initialize_kv_cache``'s mode block, the speculator's manager, ``execute_model``'s batch
  statements, active LoRA count, dispatch statement and "Run model" branch, ``prepare_inputs``' padded count), and the
  runner methods run unbound (``get_model``, ``gather_batch_req_state``, ``profile_cudagraph_memory``,
  ``capture_model``, ``needs_cudagraph_capture``);
- what those call: ``has_compiled_submodule``, ``resolve_adaptive_cudagraph_mode``,
  ``CompilationConfig.resolve_cudagraph_mode_and_sizes``, ``get_uniform_decode_token_count``,
  ``dispatch_cg_and_sync_dp``, ``set_forward_context``, ``profile_cudagraph_memory`` of
  ``cudagraph_utils.py``, every ``CudaGraphManager`` / ``ModelCudaGraphManager`` method that decides
  candidates, captures, dispatches or replays, ``graph_capture``, the wrappers' ``__call__`` (the
  breakable runner, the compiled pieces), the attention op's body ``unified_attention_with_output``
  (``contract/real/attention_op.py``) and, at the first forward, ``VllmBackend.__call__`` and
  ``wrap_with_cudagraph_if_needed``.

The harness's one point is the scheduler's side of a step (``decisions.MRV2_BATCH``): the
``SchedulerOutput``, request states and adapters ``model_runner.scheduled_batch`` writes for an
``execute_model`` event, and the dummy batch's counts ``RealRun.on_profile_run`` passes for
``profile_run``; the vLLM statements that read them are guarded by ``tests/test_decisions.py``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from contract.real import decisions

RUNNER = "MRV2"
_RUNNER_METHODS = ("get_model", "profile_cudagraph_memory", "capture_model", "needs_cudagraph_capture",
                   "gather_batch_req_state")
_MANAGER_METHODS = ("__init__", "_init_candidates", "capture", "dispatch", "run_fullgraph", "run_pw_graph",
                    "init_breakable_cg_runner", "release_graphs", "needs_capture", "_maybe_ubatch_twin")
_MODEL_RUNNER_GLOBALS = ("has_compiled_submodule", "maybe_create_adaptive_verification_manager",
                         "resolve_adaptive_cudagraph_mode", "dispatch_cg_and_sync_dp",
                         "set_forward_context", "_profile_cudagraph_memory", "get_uniform_decode_token_count")
_CUDAGRAPH_UTILS_GLOBALS = ("set_forward_context", "graph_capture")
# model_runner.Blocks field -> its decision point
BLOCKS = {
    "attn_cg_support": "init_attn_backend (metadata builders and support)",
    "narrow": "GPUModelRunner.initialize_kv_cache (support narrowing)",
    "adaptive_verification": "GPUModelRunner.initialize_kv_cache (adaptive verification block)",
    "ubatch_runner": "GPUModelRunner.initialize_kv_cache (micro-batch runner)",
    "initialize_kv_cache": "GPUModelRunner.initialize_kv_cache (mode block)",
    "init_speculator_cudagraph_manager": "GPUModelRunner.initialize_kv_cache (speculator block)",
    "batch": "GPUModelRunner.execute_model (batch statements)",
    "loras": "GPUModelRunner.execute_model (active LoRA count)",
    "dispatch": "GPUModelRunner.execute_model (dispatch statement)",
    "prepare_inputs": "GPUModelRunner.prepare_inputs (padded count)",
    "pp_inputs": "GPUModelRunner.execute_model (a PP stage's received rows)",
    "run_model": "GPUModelRunner.execute_model (run-model branch)",
}


def install(session, run_class) -> decisions.Log:
    """Shims on the session's vLLM code and blocks; ``run_class.execute`` is the harness's point.
    Returns the session's log (also ``decisions.LOG``)."""
    import vllm
    import vllm.compilation.backends as backends
    from vllm.compilation.breakable_cudagraph import BreakableCUDAGraphWrapper
    from vllm.compilation.cuda_graph import CUDAGraphWrapper
    from vllm.config import CompilationConfig

    module, cg_utils = session.gpu_model_runner, session.cudagraph_utils
    for name in _RUNNER_METHODS:
        decisions.track_attribute(module.GPUModelRunner, name, f"GPUModelRunner.{name}")
    for cls in (cg_utils.CudaGraphManager, cg_utils.ModelCudaGraphManager):
        for name in _MANAGER_METHODS:
            if name in cls.__dict__:
                decisions.track_attribute(cls, name, f"{cls.__name__}.{name}")
    for holder, names in ((module, _MODEL_RUNNER_GLOBALS), (cg_utils, _CUDAGRAPH_UTILS_GLOBALS)):
        for name in names:
            if hasattr(holder, name):
                point = "profile_cudagraph_memory" if name == "_profile_cudagraph_memory" else name
                decisions.track_attribute(holder, name, point)
    decisions.track_attribute(CompilationConfig, "resolve_cudagraph_mode_and_sizes",
                              "CompilationConfig.resolve_cudagraph_mode_and_sizes")
    for cls in (CUDAGraphWrapper, BreakableCUDAGraphWrapper, backends.VllmBackend):
        decisions.track_attribute(cls, "__call__", f"{cls.__name__}.__call__")
    decisions.track_attribute(backends, "wrap_with_cudagraph_if_needed")
    session.blocks = type(session.blocks)(**{
        name: dataclasses.replace(block, function=decisions.tracked(block.function, BLOCKS[name], _location(block)))
        for name, block in ((n, getattr(session.blocks, n)) for n in session.blocks.__dataclass_fields__)
    })
    from contract.runners.mrv2.real import model_runner, ubatch_utils

    # each harness point is cited at the first vLLM statements it mirrors
    package = Path(vllm.__file__).resolve().parent
    mirrored: dict[str, dict | None] = {}
    for m in decisions.mirrored_for(RUNNER):
        mirrored.setdefault(m.point, m.location(package))
    decisions.track_attribute(model_runner, "scheduled_batch", decisions.MRV2_BATCH, mirrored[decisions.MRV2_BATCH])
    decisions.track_attribute(ubatch_utils, "prepare", decisions.MRV2_UBATCH_STATE,
                              mirrored[decisions.MRV2_UBATCH_STATE])
    decisions.track_attribute(run_class, "on_profile_run", decisions.MRV2_BATCH, mirrored[decisions.MRV2_BATCH])
    log = decisions.Log()
    decisions.LOG = log
    return log


def _location(block) -> dict:
    """``decisions.where``'s form for a block: its statements' lines in the file it was cut from."""
    return {"function": block.method, "path": decisions.package_path(block.path),
            "lines": [block.first_line, block.last_line]}


def mirrored(version: str) -> list[dict]:
    """Each harness-mirrored MRV2 statement group, and whether this release's is the recorded one."""
    import vllm

    package = Path(vllm.__file__).parent
    return [{"point": m.point, "where": f"{m.path}:{m.class_name + '.' if m.class_name else ''}{m.method}",
             "digest": m.digest(package), "known": m.known(version, package)}
            for m in decisions.mirrored_for(RUNNER)]
