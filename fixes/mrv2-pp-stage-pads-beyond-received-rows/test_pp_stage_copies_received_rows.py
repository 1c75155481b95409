# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""A pipeline stage pads a batch for its own CUDA graph. The stage before resolved
and dispatched its own mode: it may have run the batch eagerly (or under a smaller
graph) and sent fewer rows. The later stage copies the rows it received into its
persistent buffers, keeps the rest as padding, and does not raise."""

import pytest
import torch

pp_utils = pytest.importorskip(
    "vllm.v1.worker.gpu.pp_utils", reason="Model Runner V2 has no PP utilities here"
)

from vllm.sequence import IntermediateTensors  # noqa: E402

KEYS = ("hidden_states", "residual")


def _buffers() -> IntermediateTensors:
    return IntermediateTensors({k: torch.full((8, 4), -1.0) for k in KEYS})


@pytest.mark.parametrize("sent", [3, 4, 6])
def test_a_stage_copies_the_rows_the_stage_before_sent(sent):
    # This stage pads 3 tokens to a graph of 4; the stage before ran 3 eagerly, or
    # padded them to 4, or to a larger graph of 6.
    buffers = _buffers()
    received = IntermediateTensors(
        {k: torch.arange(sent * 4, dtype=torch.float32).view(sent, 4) for k in KEYS}
    )
    got = pp_utils.copy_received_rows(buffers, received, 4)
    for k in KEYS:
        rows = min(sent, 4)
        assert got[k].shape == (4, 4)
        # The rows are this stage's persistent buffer, which its graphs read.
        assert got[k].data_ptr() == buffers[k].data_ptr()
        torch.testing.assert_close(got[k][:rows], received[k][:rows])
        assert (buffers[k][rows:4] == -1.0).all()


def test_a_dummy_run_copies_nothing():
    buffers = _buffers()
    got = pp_utils.copy_received_rows(buffers, None, 2)
    for k in KEYS:
        assert got[k].shape == (2, 4) and (got[k] == -1.0).all()
