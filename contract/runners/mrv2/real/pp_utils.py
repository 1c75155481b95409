"""Beside ``v1/worker/gpu_worker.py``'s pipeline hand-over and ``v1/worker/gpu/model_runner.py``'s
stage set-up: a PP stage of the replay, one process per stage (``contract/real/ranks.py``).

vLLM's own: the ``GroupCoordinator``'s ``send_tensor_dict`` and ``recv_tensor_dict`` over the PP
group (the worker calls their asynchronous forms, ``isend_tensor_dict`` and ``irecv_tensor_dict``,
``34:v1/worker/gpu_worker.py:1461-1497``; the metadata and the tensors travel alike), and the
``execute_model`` statement that copies what was received into the runner's buffer
(``34:…/model_runner.py:2088-2105``, the ``pp_inputs`` block). Stand-ins: the runner's
``is_first_pp_rank``/``is_last_pp_rank`` and its buffer of intermediate tensors, as
``GPUModelRunner.__init__`` and ``load_model`` set them (``34:…/model_runner.py:249-250,563-572``)
but in the tiny model's dtype.
"""

from __future__ import annotations


def place(runner, model) -> None:
    """The stage's position and, past the first, the buffer the stage before's rows are copied into."""
    from vllm.distributed.parallel_state import get_pp_group

    runner.is_first_pp_rank, runner.is_last_pp_rank = get_pp_group().is_first_rank, get_pp_group().is_last_rank
    runner.use_pp = True
    if not runner.is_first_pp_rank:
        runner.intermediate_tensors = model.make_empty_intermediate_tensors(
            batch_size=runner.max_num_tokens, dtype=model.weight.dtype, device=runner.device)


def receive():
    """What the stage before sent this step."""
    from vllm.distributed.parallel_state import get_pp_group
    from vllm.sequence import IntermediateTensors

    return IntermediateTensors(get_pp_group().recv_tensor_dict())


def send(model_output) -> None:
    """This stage's output to the next (all its padded rows)."""
    from vllm.distributed.parallel_state import get_pp_group

    get_pp_group().send_tensor_dict(model_output.tensors)
