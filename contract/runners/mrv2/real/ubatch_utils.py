"""Beside ``v1/worker/gpu/ubatch_utils.py``: the micro-batch runner, built by vLLM's own
``maybe_build_ubatch_runner`` (``initialize_kv_cache``'s statement, ``33:…/model_runner.py:733-740``,
``34:…:768-775``), which decides whether one exists (``use_ubatching`` and more than one DP rank).

What it builds is ``StandInUBatchRunner``: ``UBatchRunner`` allocates per-micro-batch device
buffers, a communication and a capture stream, and runs each micro-batch in a thread of its own
that hands the GPU over at the model's all-to-alls, none of which decides a graph. The stand-in
runs the micro-batches as one forward over the whole batch under a NONE forward context, as each
thread's context is (``_make_forward_contexts``, ``34:…/ubatch_utils.py:427-459``), and splits
nothing (``prepare`` returns no slices). What vLLM decides about micro-batched graphs stays
vLLM's: the twins (``_maybe_ubatch_twin``), their capture on the runner's ``capture_stream``
(``create_forward_fn``'s micro-batch branch), the agreement (``dispatch_cg_and_sync_dp``) and the
run branch (``run_fullgraph``, else ``ubatch_runner.run``).
"""

from __future__ import annotations

import contextlib
import types


class StandInUBatchRunner:
    """``UBatchRunner``'s interface as ``CudaGraphManager`` and ``execute_model`` call it."""

    def __init__(self, vllm_config, device, model_state, attn_groups, kv_cache_config, max_num_reqs):
        self.vllm_config = vllm_config

    @property
    def capture_stream(self):
        """The stream the graph is captured on: the capture's own (threads and capture share it)."""
        import torch

        return torch.cuda.current_stream()

    def prepare(self, input_batch, block_tables, slot_mappings, *args, **kwargs):
        """0.34.0 passes the descriptor and the DP agreement, 0.33.0 the mode; the stand-in splits
        nothing and keeps the padded token count."""
        return types.SimpleNamespace(slices=None, num_tokens=input_batch.num_tokens_after_padding)

    def begin_capturable_run(self, model, model_inputs: dict, ubatch_state, for_capture: bool = False):
        from vllm.config import CUDAGraphMode
        from vllm.forward_context import set_forward_context

        num_tokens = ubatch_state.num_tokens

        def finish():
            with set_forward_context(None, self.vllm_config, num_tokens=num_tokens,
                                     cudagraph_runtime_mode=CUDAGraphMode.NONE):
                return model(**model_inputs)

        return finish

    def run(self, model, model_inputs: dict, ubatch_state):
        return self.begin_capturable_run(model, model_inputs, ubatch_state)()

    def abort_pending_run(self) -> None:
        return None


@contextlib.contextmanager
def runner_class():
    """``maybe_build_ubatch_runner`` builds ``StandInUBatchRunner`` while it runs."""
    import vllm.v1.worker.gpu.ubatch_utils as ubatch_utils

    real = ubatch_utils.UBatchRunner
    ubatch_utils.UBatchRunner = StandInUBatchRunner
    try:
        yield
    finally:
        ubatch_utils.UBatchRunner = real


def prepare(runner, input_batch, batch_desc, dp_sync_state):
    """``execute_model``'s ``ubatch_state`` statement for a micro-batched descriptor
    (``33:…/model_runner.py:1940-1951``, ``34:…:2007-2018``), with the stand-in's empty block tables
    and slot mappings."""
    assert runner.ubatch_runner is not None
    return runner.ubatch_runner.prepare(input_batch, (), None, batch_desc, dp_sync_state, for_capture=False)
