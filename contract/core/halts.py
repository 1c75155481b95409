"""Where vLLM stops, in the words the model and the replay both write: the exception texts of the
wrappers' capture paths (``compilation/monitor.py:101-110``, ``compilation/breakable_cudagraph.py:161-166``
in 0.30.0)."""

CAPTURE_GUARD_ERROR = "RuntimeError: CUDA graph capturing detected at an inappropriate time"
NESTED_BREAKABLE_ERROR = "RuntimeError: Nested BreakableCUDAGraphCapture is not supported."
