"""The simulated CUDA layer: the smallest set of patches under which vLLM's real wrapper code
captures and replays on a CPU-only torch.

Everything above this layer is vLLM's code. A simulated graph records nothing of the work; it
reports each ``capture_begin``/``capture_end`` with the nesting depth of open captures and each
``replay`` to ``listener``, so a capture begun inside another capture (which real CUDA refuses)
is visible rather than silently absorbed. Why each patch is needed on CPU torch:

- ``torch.cuda.CUDAGraph`` is a dummy base class without CUDA; ``torch.cuda.graph`` enters it;
- ``torch.cuda.Stream`` raises "requires CUDA" (``UBatchWrapper.__init__`` creates one), and so do
  ``torch.cuda.current_stream`` and ``torch.cuda.stream``, which vLLM's ``graph_capture()`` calls
  around ``capture_model`` and ``profile_cudagraph_memory``;
- ``torch.accelerator.synchronize`` and ``get_memory_info`` (the capture loops' memory readings)
  raise without an accelerator; the readings are logged, never decided on;
- ``torch.accelerator.empty_cache`` raises "Cannot access accelerator"; ``current_device_index``
  likewise (``UBatchWrapper.__init__``);
- ``current_stream`` (as imported into ``compilation/cuda_graph.py``) raises without a device;
- a micro-batch thread (``UBatchWrapper._capture_ubatches``/``_run_ubatches``) sets its device
  (``torch.accelerator.set_device_index``), touches the BLAS handle and, entering its
  ``UBatchContext``, sets its stream through vLLM's ``set_stream`` patch, whose underlying
  ``torch.cuda.set_stream`` (``utils/torch_utils.py``'s ``prev_set_stream``) raises; vLLM's own
  tracking of the current stream stays;
- ``weak_ref_tensor(s)`` call ``torch.ops._C.weak_ref_tensor``, absent without ``vllm._C``
  (imported into ``compilation/cuda_graph.py`` and ``compilation/breakable_cudagraph.py``);
  a CPU tensor is its own weak reference here;
- the platform's ``graph_pool_handle`` returns a ``SimPool`` (``platform.py``);
- while an attention backend's module is imported (``attention_backends.py``), a tensor it allocates
  on ``cuda`` at module level (``CUTLASS_MLA``'s workspace) goes to ``meta``: CPU torch has no
  ``cuda`` device (:func:`device_allocations`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from contract.core.observation import GLOBAL_POOL, PRIVATE_POOL, THROWAWAY_POOL


class SimPool:
    """Stands for a CUDA graph memory-pool handle."""

    def __repr__(self) -> str:
        return f"SimPool#{id(self):x}"


class SimCuda:
    """Process-global state of the simulated device: open captures and who is told of events."""

    depth = 0  # captures begun and not yet ended
    listener: Callable[[str, SimGraph], None] | None = None
    global_pool: object = None  # the platform's persistent global pool, one per process

    @classmethod
    def reset(cls) -> None:
        cls.depth = 0

    @classmethod
    def reset_global_pool(cls, platform) -> None:
        """Point vLLM's global-pool singleton (``platforms/interface.py:1324-1329``) at the process's
        one persistent pool, so that a capture's pool is known to be it or another (profiling's
        throwaway pool): wrappers of a model reused across traces keep the pool they bound."""
        if cls.global_pool is None:
            cls.global_pool = platform.graph_pool_handle()
        type(platform)._global_graph_pool = cls.global_pool

    @classmethod
    def pool_kind(cls, pool: object) -> str:
        if pool is None:
            return PRIVATE_POOL
        return GLOBAL_POOL if pool is cls.global_pool or pool == cls.global_pool else THROWAWAY_POOL

    @classmethod
    def emit(cls, kind: str, graph: SimGraph) -> None:
        if cls.listener is not None:
            cls.listener(kind, graph)


class SimGraph:
    """``torch.cuda.CUDAGraph``: ``capture_begin(pool=...)``, ``capture_end()``, ``replay()``."""

    def __init__(self, *args, **kwargs) -> None:
        self.depth: int | None = None  # nesting depth at capture_begin, 1 = outermost
        self.captured = False
        self.tag: object = None  # what the observer attached at capture_begin
        self.pool: object = None  # the pool capture_begin was given

    def capture_begin(self, pool=None, *args, **kwargs) -> None:
        self.pool = pool
        SimCuda.depth += 1
        self.depth = SimCuda.depth
        SimCuda.emit("begin", self)

    def capture_end(self) -> None:
        SimCuda.emit("end", self)
        SimCuda.depth -= 1
        self.captured = True

    def replay(self) -> None:
        assert self.captured, "replay of a graph whose capture never ended"
        SimCuda.emit("replay", self)

    def reset(self) -> None:
        self.captured = False


class sim_graph:  # noqa: N801 - replaces torch.cuda.graph, a class in torch too
    """``torch.cuda.graph(cuda_graph, pool=None, stream=None, capture_error_mode="global")``."""

    def __init__(self, cuda_graph, pool=None, stream=None, capture_error_mode="global") -> None:
        self.cuda_graph = cuda_graph
        self.pool = pool

    def __enter__(self):
        self.cuda_graph.capture_begin(pool=self.pool)
        return self.cuda_graph

    def __exit__(self, *exc) -> bool:
        self.cuda_graph.capture_end()
        return False


class SimStream:
    """``torch.cuda.Stream``; ``graph_capture()`` makes one, waits on the current one and enters it."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def wait_stream(self, other) -> None:
        pass


_DEFAULT_STREAM = SimStream()


@contextlib.contextmanager
def device_allocations():
    """``torch.empty``/``torch.zeros`` with ``device="cuda"`` allocate on ``meta`` while it is open."""
    import torch

    real = {name: getattr(torch, name) for name in ("empty", "zeros")}

    def on_meta(fn):
        def allocate(*args, device=None, **kwargs):
            if device is not None and torch.device(device).type == "cuda":
                device = "meta"
            return fn(*args, device=device, **kwargs)
        return allocate

    for name, fn in real.items():
        setattr(torch, name, on_meta(fn))
    try:
        yield
    finally:
        for name, fn in real.items():
            setattr(torch, name, fn)


def _identity(x):
    return x


def install() -> None:
    import torch

    import vllm.compilation.breakable_cudagraph as bcg
    import vllm.compilation.cuda_graph as cg
    import vllm.utils.torch_utils as torch_utils

    # The stand-in models' matmuls are a few rows by 8 columns: a second intra-op thread costs
    # them 50x (0.5 ms instead of 8 us per call on a 2-core machine) and decides nothing.
    torch.set_num_threads(1)
    torch.cuda.CUDAGraph = SimGraph
    torch.cuda.graph = sim_graph
    torch.cuda.Stream = SimStream
    torch.cuda.current_stream = lambda device=None: _DEFAULT_STREAM
    torch.cuda.stream = lambda stream: contextlib.nullcontext()
    torch.accelerator.synchronize = lambda device=None: None
    torch.accelerator.get_memory_info = lambda device=None: (0, 0)
    torch.accelerator.empty_cache = lambda: None
    torch.accelerator.current_device_index = lambda: 0
    torch.accelerator.set_device_index = lambda device: None
    torch.cuda.current_blas_handle = lambda: None
    torch_utils.prev_set_stream = lambda stream: None
    cg.current_stream = lambda: None
    cg.weak_ref_tensors = _identity
    bcg.weak_ref_tensors = _identity
    bcg.weak_ref_tensor = _identity
