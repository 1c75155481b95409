"""Several data-parallel ranks as several processes joined by ``torch.distributed`` (gloo, on the
loopback address only), each running vLLM's own code for its rank.

``run(target, payload, world_size, timeout_s, deadline_s)`` forks ``world_size`` processes with
``torch.multiprocessing`` from a process that has set vLLM up (its platform chosen, a tree's
modules in place), so every rank starts from that state at no cost, and joins them into one gloo
group with a bound on every collective. Each process calls ``target(rank, world_size, payload)``,
which installs vLLM's DP group over that group (``install_dp_group``: a ``GroupCoordinator``, whose
``cpu_all_reduce_`` vLLM's DP sync calls, ``34:distributed/parallel_state.py:1385-1387``), and sends
back what it returns. A rank that does not answer by the deadline is reported as hung and every
process is killed: a disagreement ends as a reported hang, never as a stuck run. The ranks touch
no device (the DP sync is vLLM's CPU all-reduce). A long campaign spreads the same way over
machines: ``torch.distributed`` takes ``MASTER_ADDR`` from its launcher, and nothing here is
specific to one host but the address.
"""

from __future__ import annotations

import queue
import socket
import time
from collections.abc import Callable
from datetime import timedelta

LOOPBACK = "127.0.0.1"
HUNG = "hung"  # a rank's answer when it did not finish within the timeout


class RanksProblem(Exception):
    """A rank process failed before answering (not vLLM's code: the launch itself); one line."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def install_dp_group(timeout_s: float) -> None:
    """vLLM's DP ``GroupCoordinator`` for this rank over the gloo world group, once vLLM is set up
    (its platform chosen); the other groups stay world-size 1 (``contract/real/parallel_state.py``)."""
    import torch.distributed as dist
    import vllm.distributed.parallel_state as ps

    from contract.real.parallel_state import install_parallel_state

    rank, world_size = dist.get_rank(), dist.get_world_size()
    group = dist.new_group(list(range(world_size)), backend="gloo", timeout=timedelta(seconds=timeout_s))
    dp = ps.GroupCoordinator.__new__(ps.GroupCoordinator)
    dp.__dict__.update(unique_name="dp", rank=rank, ranks=list(range(world_size)), world_size=world_size,
                       local_rank=rank, rank_in_group=rank, device_communicator=None, cpu_group=group,
                       device_group=group, use_device_communicator=False, mq_broadcaster=None,
                       cpu_timeout=timedelta(seconds=timeout_s), dead_dp_ranks=set())
    ps._DP = dp
    install_parallel_state()


def _rank_main(rank: int, world_size: int, port: int, timeout_s: float, target: Callable, payload,
               answers) -> None:
    import torch.distributed as dist

    try:
        dist.init_process_group("gloo", init_method=f"tcp://{LOOPBACK}:{port}", rank=rank,
                                world_size=world_size, timeout=timedelta(seconds=timeout_s))
        answers.put((rank, "ok", target(rank, world_size, payload)))
    except BaseException as exc:  # noqa: BLE001 - sent to the parent, which decides
        answers.put((rank, "error", f"{type(exc).__name__}: {exc}"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run(target: Callable, payload, world_size: int, timeout_s: float, deadline_s: float) -> list:
    """Per rank, what ``target`` returned (plain data), or ``HUNG`` where it had not answered
    ``deadline_s`` after the start; ``timeout_s`` bounds each collective. ``target`` and ``payload``
    reach the ranks as they are in memory (forked, never pickled)."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("fork")
    answers = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, world_size, port, timeout_s, target, payload, answers),
                         daemon=True) for r in range(world_size)]
    for p in procs:
        p.start()
    got: dict[int, object] = {}
    end = time.monotonic() + deadline_s
    try:
        while len(got) < world_size:
            try:
                rank, status, value = answers.get(timeout=max(end - time.monotonic(), 0.1))
            except queue.Empty:
                break
            if status != "ok":
                raise RanksProblem(f"rank {rank}: {value}")
            got[rank] = value
    finally:
        for p in procs:
            p.join(timeout=5 if len(got) == world_size else 0)
            if p.is_alive():
                p.kill()
                p.join()
    return [got.get(r, HUNG) for r in range(world_size)]
