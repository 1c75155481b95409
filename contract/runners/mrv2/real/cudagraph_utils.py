"""Beside ``v1/worker/gpu/cudagraph_utils.py``: the CUDA names it binds, simulated, and a watch on
``CudaGraphManager.capture`` that turns its capture loop into the model's dispatches.

``graph_capture``, which ``capture()`` enters (``33:…:440``, ``34:…:474``), and ``get_pp_group``,
read in ``CudaGraphManager.__init__`` (``33:…:173-174``, ``34:…:196-197``), are vLLM's own
(``distributed/parallel_state.py``), over the world-size-1 groups of
``parallel_state.install_parallel_state``: on CUDA every warm-up and capture of the loop runs on
the side stream ``graph_capture`` makes current, as in the real runner. Stood in for:

- ``current_stream`` (imported from ``utils/torch_utils.py``), on ``cpu-sim`` only: ``_capture_stream()``
  asks for it on every FULL capture (``34:…/cudagraph_utils.py:448-453``), and the real one sets
  a CUDA stream; on CUDA it is vLLM's, and returns ``graph_capture``'s stream;
- ``torch.accelerator.get_memory_info`` / ``synchronize``, on ``cpu-sim`` only: ``capture_model``
  reads free memory around the capture (``34:v1/worker/gpu/model_runner.py:1160,1206``);
- ``is_global_first_rank``: only chooses the tqdm bar (``33:…:460``, ``34:…:495``); False;
- ``_init_minimal_kv_cache_for_profiling``: builds the smallest real KV-cache config from the
  model's attention layers (``34:…/cudagraph_utils.py:1108-1129``), which the stand-in model has
  none of; it calls the runner's ``initialize_kv_cache(config, is_profiling=True)`` as the real one
  does, with the stand-in config.

The watch calls the original ``capture`` with a ``create_forward_fn`` that calls the original
factory and the forward functions it returns unchanged; it only tells the replay where each
descriptor's warm-up and capture run begin (``34:…:495-548``): the warm-up is the first NONE call of
the ``warmup=True`` function; the capture run starts at the ``warmup=False`` factory call (FULL
and breakable PIECEWISE, whose graph or capture is entered right after) or at the PIECEWISE call
of the reused warm-up function (compiled PIECEWISE).
"""

from __future__ import annotations

import inspect

from contract.real import device
from contract.real.parallel_state import install_parallel_state
from contract.real.simcuda import SimStream


def install(module, listener) -> None:
    """Stand in for ``module``'s names above and watch ``CudaGraphManager.capture``;
    ``listener(kind, manager, desc)`` hears ``warmup``, ``capture`` and ``done``."""
    import torch

    install_parallel_state()
    if device.SELECTED != "cuda":
        module.current_stream = lambda *a, **k: SimStream()
        torch.accelerator.get_memory_info = lambda *a, **k: (0, 0)
        torch.accelerator.synchronize = lambda *a, **k: None
    module.is_global_first_rank = lambda: False
    module._init_minimal_kv_cache_for_profiling = lambda runner: runner.initialize_kv_cache(None, is_profiling=True)
    manager = module.CudaGraphManager
    original = getattr(manager.capture, "__wrapped__", manager.capture)

    def capture(self, create_forward_fn, *args, **kwargs):
        def watched_create(desc, warmup):
            forward_fn = create_forward_fn(desc, warmup)
            if not warmup:
                listener("capture", self, desc)
                return forward_fn
            first = [True]

            def watched_forward(cg_mode):
                from vllm.config import CUDAGraphMode

                if first[0] and cg_mode == CUDAGraphMode.NONE:
                    first[0] = False
                    listener("warmup", self, desc)
                elif cg_mode != CUDAGraphMode.NONE:
                    listener("capture", self, desc)
                return forward_fn(cg_mode)

            return watched_forward

        try:
            return original(self, watched_create, *args, **kwargs)
        finally:
            listener("done", self, None)

    capture.__wrapped__ = original
    manager.capture = capture


def size_check_manager(session, vllm_config, device=None):
    """The manager the size checks dispatch against (``sizes.py``, ``dp_utils.py``), built as
    ``initialize_kv_cache`` builds it on ``device`` (default the session's), with the capture stood
    in for: every candidate is a graph."""
    cc = vllm_config.compilation_config
    q = vllm_config.uniform_decode_query_len
    cls = session.cudagraph_utils.CudaGraphManager
    device = session.torch_device if device is None else device
    if "decode_query_lens" in inspect.signature(cls.__init__).parameters:  # 0.34
        manager = cls(vllm_config, device, cc.cudagraph_mode,
                      decode_query_lens=vllm_config.get_decode_cudagraph_query_lens(q))
    else:  # 0.33
        manager = cls(vllm_config, device, cc.cudagraph_mode, decode_query_len=q)
    manager._graphs_captured = True  # the capture is simulated: every candidate is a graph
    return manager
