"""Beside ``v1/worker/gpu/dp_utils.py``: the capture-size grid's steps on two DP ranks, each a
process of its own joined by gloo (``contract/real/ranks.py``), each calling vLLM's
``dispatch_cg_and_sync_dp`` with its own manager and batch as ``execute_model`` calls it
(``34:v1/worker/gpu/model_runner.py:1894-1910``), with ``dp_size`` 2 and its ``dp_rank``: the
all-reduce is vLLM's ``cpu_all_reduce_`` over a real gloo group.

vLLM's own: the config and its derived sizes, the manager's candidates, ``dispatch_cg_and_sync_dp``
and ``sync_cudagraph_and_dp_padding``, the all-reduce. Stood in for: the capture (the manager is
marked captured, as in ``sizes.py``). An idle rank's batch is vLLM's own: ``Worker.execute_dummy_batch``
and ``GPUModelRunner._dummy_run`` run on a runner holding what they read (``idle_batch``) up to
``execute_model``, whose dispatch inputs follow ``execute_model`` and ``gather_batch_req_state``'s
dummy branch (``34:v1/worker/gpu/model_runner.py:1863-1866,1387-1391``); the model's idle batch
(``contract/core/ranks.py``) is what P8 holds the step to. A trace on several ranks takes an idle
rank's ``SchedulerOutput`` from the same code (``dummy_scheduler_output``), and its DP sync
timeout from here (``TIMEOUT_S``).
"""

from __future__ import annotations

import contextlib

from contract.core.ranks import rank_steps
from contract.core.sizes import DP_SIZE, SizeSetting
from contract.real import overlay, ranks, size_observer
from contract.real.errors import first_line
from contract.runners.mrv2.real.cudagraph_utils import size_check_manager

class _Dispatched(Exception):
    """``execute_model`` reached: the dummy batch is built."""

    def __init__(self, scheduler_output) -> None:
        super().__init__("execute_model")
        self.scheduler_output = scheduler_output


def dummy_scheduler_output(vllm_config):
    """The ``SchedulerOutput`` of the forward an idle DP rank runs: vLLM's ``execute_dummy_batch``
    and ``_dummy_run`` up to ``execute_model``."""
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner
    from vllm.v1.worker.gpu_worker import Worker

    class Runner:
        """What ``_dummy_run`` reads before ``execute_model``: the scheduler's limits and
        ``decode_query_len`` as ``GPUModelRunner.__init__`` sets them (``34:…/model_runner.py:239-240,451-454``);
        no speculator, connector, LoRA or pipeline stage of its own."""

        _dummy_run = GPUModelRunner._dummy_run
        speculator, lora_config, is_first_pp_rank = None, None, True
        kv_connector = type("NoConnector", (), {"set_disabled": lambda self, disabled: None})()

        def __init__(self) -> None:
            sc, spec = vllm_config.scheduler_config, vllm_config.speculative_config
            self.max_num_reqs, self.max_num_tokens = sc.max_num_seqs, sc.max_num_batched_tokens
            self.decode_query_len = 1 + (spec.num_speculative_tokens if spec is not None else 0)

        def maybe_dummy_run_with_lora(self, *args, **kwargs):
            return contextlib.nullcontext()

        def execute_model(self, scheduler_output, *args, **kwargs):
            raise _Dispatched(scheduler_output)

    worker = type("IdleWorker", (), {"model_runner": Runner(), "randomize_dummy_inputs": False})()
    try:
        Worker.execute_dummy_batch(worker)
    except _Dispatched as reached:
        return reached.scheduler_output
    raise RuntimeError("execute_dummy_batch returned without running a forward")


def idle_batch(vllm_config) -> tuple[int, int, int | None]:
    """``(num_reqs, num_tokens, uniform_token_count)`` of the forward an idle DP rank runs."""
    from vllm.v1.worker.utils import get_uniform_decode_token_count

    scheduled = dummy_scheduler_output(vllm_config)
    tokens = scheduled.num_scheduled_tokens
    num_reqs, num_tokens = len(tokens), scheduled.total_num_scheduled_tokens
    return num_reqs, num_tokens, get_uniform_decode_token_count(num_reqs, num_tokens, max(tokens.values()),
                                                               decode_graph_eligible=True)


TIMEOUT_S = ranks.DP_TIMEOUT_S
DEADLINE_S = 900.0  # the whole grid on every rank


def serve_ranks(rank: int, world_size: int, payload: dict) -> dict:
    """One rank's side of every setting (``payload["settings"]``), in a process forked from the
    size check's (``payload["session"]``, a tree's modules included): per setting ``{"served":
    [[mode, tokens] | ["raised", line], ...]}`` per step of ``rank_steps``, or ``{"rejected": line}``
    where vLLM refuses it (alike on every rank); the records end at the first raise, after which the
    rank runs no collective. With them, the watched functions of the tree the ranks reached."""
    from vllm.v1.worker.gpu.dp_utils import dispatch_cg_and_sync_dp

    ranks.install_group("dp", TIMEOUT_S)
    records = _serve(payload["session"], rank, world_size, payload["settings"], dispatch_cg_and_sync_dp)
    finder = overlay.installed()
    return {"records": records, "reached": sorted(finder.reached) if finder else []}


def _serve(session, rank: int, world_size: int, settings: list[SizeSetting], dispatch_cg_and_sync_dp) -> list[dict]:
    """``serve_ranks``'s records, vLLM set up."""
    import torch

    out = []
    for s in settings:
        try:
            vllm_config = size_observer._config(session, s)
            manager = size_check_manager(session, vllm_config, torch.device("cpu"))  # forked: no device
        except Exception as exc:  # noqa: BLE001 - the single-rank check reports start-up; here the setting is out
            out.append({"rejected": first_line(exc)})
            continue
        served: list[list] = []
        for step in rank_steps(s):
            b = step[rank]
            try:
                num_reqs, num_tokens, uniform = (idle_batch(vllm_config) if b.kind == "idle"
                                                 else (b.num_reqs, b.num_tokens, b.uniform_token_count))
                desc, _ = dispatch_cg_and_sync_dp(manager, num_reqs, num_tokens, uniform, world_size, rank,
                                                  max_query_len=uniform)
            except Exception as exc:  # noqa: BLE001 - vLLM's code raised: the step's finding
                served.append(["raised", first_line(exc)])
                # the other ranks wait for this one in their next collective, time out there and stop
                return [*out, {"served": served}]
            served.append([desc.cg_mode.name, desc.num_tokens])
        out.append({"served": served})
    return out


def observe(session, settings: list[SizeSetting]) -> list[list[dict] | str]:
    """Per rank, its records (``serve_ranks``), or ``ranks.HUNG``; what a tree's watched functions
    the ranks reached counts as reached here."""
    import vllm.v1.worker.gpu_worker  # noqa: F401 - imported once, before the ranks fork (idle_batch)

    answers = ranks.run(serve_ranks, {"session": session, "settings": settings}, DP_SIZE, TIMEOUT_S, DEADLINE_S)
    finder = overlay.installed()
    out: list[list[dict] | str] = []
    for answer in answers:
        if answer == ranks.HUNG:
            out.append(ranks.HUNG)
            continue
        if finder is not None:
            finder.reached.update(answer["reached"])
        out.append(answer["records"])
    return out
