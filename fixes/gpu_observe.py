# What a root cause's gpu.sh measures in every Python process of `vllm serve` (API server and
# engine core): loaded from a sitecustomize.py the script puts first on PYTHONPATH, before vLLM is
# imported. It counts the CUDA graphs captured and replayed, and the forwards run under each
# CUDA-graph runtime mode (vLLM's set_forward_context) during which no graph was captured or
# replayed: a PIECEWISE forward that no graph served ran eagerly although vLLM dispatched it to a
# graph. At exit it prints one line, "cudagraph-contract-observe <json>", to stderr.
import atexit
import collections
import contextlib
import json
import sys

COUNTS: collections.Counter = collections.Counter()
ACTED = [0]


def _install() -> None:
    import torch

    graph = torch.cuda.CUDAGraph
    begin, replay = graph.capture_begin, graph.replay

    def capture_begin(self, *args, **kwargs):
        ACTED[0] += 1
        COUNTS["graphs captured"] += 1
        return begin(self, *args, **kwargs)

    def replayed(self, *args, **kwargs):
        ACTED[0] += 1
        COUNTS["graphs replayed"] += 1
        return replay(self, *args, **kwargs)

    graph.capture_begin, graph.replay = capture_begin, replayed

    import vllm.forward_context as forward_context

    original = forward_context.set_forward_context

    @contextlib.contextmanager
    def set_forward_context(*args, **kwargs):
        mode = getattr(kwargs.get("cudagraph_runtime_mode"), "name", "NONE")
        before = ACTED[0]
        with original(*args, **kwargs) as context:
            yield context
        if mode != "NONE":
            COUNTS[f"{mode} forwards"] += 1
            COUNTS[f"{mode} forwards no graph served"] += ACTED[0] == before

    forward_context.set_forward_context = set_forward_context


def _report() -> None:
    if COUNTS:
        print("cudagraph-contract-observe " + json.dumps(dict(COUNTS), sort_keys=True), file=sys.stderr, flush=True)


try:
    _install()
    atexit.register(_report)
except Exception as exc:  # a process without torch or vLLM (a tool the script runs) is not observed
    print(f"cudagraph-contract-observe not installed: {type(exc).__name__}: {exc}", file=sys.stderr)
