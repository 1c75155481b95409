"""Beside ``v1/worker/gpu/cudagraph_utils.py``: the CUDA names it binds, simulated, and a watch on
``CudaGraphManager.capture`` that turns its capture loop into the model's dispatches.

Simulated, in addition to ``contract/conformance/simcuda.py`` (why each is needed on CPU torch):

- ``current_stream`` (imported from ``utils/torch_utils.py``): ``_capture_stream()`` asks for it
  on every FULL capture (``34:…/cudagraph_utils.py:448-453``);
- ``graph_capture``: ``capture()`` enters it (``33:…:440``, ``34:…:474``); the real one needs the
  TP/PP groups and CUDA streams, so it yields a context holding a simulated stream;
- ``get_pp_group``: read in ``CudaGraphManager.__init__`` (``33:…:173-174``, ``34:…:196-197``) and
  needs an initialised distributed state; one rank, first and last;
- ``is_global_first_rank``: only chooses the tqdm bar (``33:…:460``, ``34:…:495``); False;
- ``torch.accelerator.get_memory_info`` / ``synchronize``: ``capture_model`` reads free memory
  around the capture (``34:v1/worker/gpu/model_runner.py:1160,1206``);
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

import contextlib
import types

from contract.conformance.simcuda import SimStream


class _PPGroup:
    is_first_rank = True
    is_last_rank = True
    world_size = 1
    rank_in_group = 0


@contextlib.contextmanager
def graph_capture(device=None, stream=None):
    yield types.SimpleNamespace(stream=stream if stream is not None else SimStream())


def install(module, listener) -> None:
    """Simulate ``module``'s CUDA names and watch ``CudaGraphManager.capture``; ``listener(kind,
    manager, desc)`` hears ``warmup``, ``capture`` and ``done``."""
    import torch

    module.current_stream = lambda *a, **k: SimStream()
    module.graph_capture = graph_capture
    module.get_pp_group = lambda: _PPGroup()
    module.is_global_first_rank = lambda: False
    module._init_minimal_kv_cache_for_profiling = lambda runner: runner.initialize_kv_cache(None, is_profiling=True)
    torch.accelerator.get_memory_info = lambda *a, **k: (0, 0)
    torch.accelerator.synchronize = lambda *a, **k: None
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
