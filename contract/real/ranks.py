"""Several data-parallel ranks or pipeline stages as several processes joined by
``torch.distributed`` (gloo, on the loopback address only), each running vLLM's own code for its
rank or stage.

``run(target, payload, world_size, timeout_s, deadline_s)`` forks ``world_size`` processes with
``torch.multiprocessing`` from a process that has set vLLM up (its platform chosen, a tree's
modules in place), so every rank starts from that state at no cost, and joins them into one gloo
group with a bound on every collective. Each process calls ``target(rank, world_size, payload)``,
which installs vLLM's DP or PP group over that group (``install_group``: a ``GroupCoordinator``, whose
``cpu_all_reduce_`` vLLM's DP sync calls, ``34:distributed/parallel_state.py:1385-1387``), and sends
back what it returns. A rank that does not answer by the deadline is reported as hung and every
process is killed: a disagreement ends as a reported hang, never as a stuck run. ``replay_ranks``
runs a whole trace so, each rank through its family's ``Session.replay`` with its ``dp_rank``, and
joins the ranks' steps (``merged``); ``replay_stages`` does the same per PP stage, whose
``pp_stage`` gives it its own support, and the stages hand their rows over vLLM's PP group
(``merged_stages``). The ranks touch no device (the DP sync is vLLM's CPU all-reduce). A long campaign spreads the same way over
machines: ``torch.distributed`` takes ``MASTER_ADDR`` from its launcher, and nothing here is
specific to one host but the address.
"""

from __future__ import annotations

import queue
import socket
import time
from collections import Counter
from collections.abc import Callable
from datetime import timedelta

from contract.core.modes import NONE
from contract.core.observation import RankServed
from contract.real import decisions, lines, overlay

LOOPBACK = "127.0.0.1"
DP_TIMEOUT_S = 20.0  # per collective: a rank left waiting answers within it
HUNG = "hung"  # a rank's answer when it did not finish within the timeout


class RanksProblem(Exception):
    """A rank process failed before answering (not vLLM's code: the launch itself); one line."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def install_group(name: str, timeout_s: float) -> None:
    """vLLM's DP (``name`` "dp") or PP ("pp") ``GroupCoordinator`` for this process over the gloo
    world group, once vLLM is set up (its platform chosen); the other groups stay world-size 1
    (``contract/real/parallel_state.py``). The PP group's ``send_tensor_dict``/``recv_tensor_dict``
    send over the same gloo group (the tensors are on the CPU)."""
    import torch
    import torch.distributed as dist
    import vllm.distributed.parallel_state as ps

    from contract.real.parallel_state import install_parallel_state

    rank, world_size = dist.get_rank(), dist.get_world_size()
    group = dist.new_group(list(range(world_size)), backend="gloo", timeout=timedelta(seconds=timeout_s))
    coordinator = ps.GroupCoordinator.__new__(ps.GroupCoordinator)
    coordinator.__dict__.update(unique_name=name, rank=rank, ranks=list(range(world_size)), world_size=world_size,
                                device=torch.device("cpu"), local_rank=rank, rank_in_group=rank,
                                device_communicator=None, cpu_group=group, device_group=group,
                                use_device_communicator=False, mq_broadcaster=None,
                                cpu_timeout=timedelta(seconds=timeout_s), dead_dp_ranks=set(),
                                use_cpu_custom_send_recv=False, use_custom_op_call=False)
    setattr(ps, {"dp": "_DP", "pp": "_PP"}[name], coordinator)
    install_parallel_state()


def _rank_main(rank: int, world_size: int, port: int, timeout_s: float, target: Callable, payload,
               answers) -> None:
    import warnings

    import torch.distributed as dist

    # vLLM's send_object hands torch a read-only pickle buffer, and torch warns once per process
    warnings.filterwarnings("ignore", message="The given buffer is not writable")
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


# -- a trace on every rank -------------------------------------------------------------------

TRACE_DEADLINE_S = 300.0  # one trace on every rank, its first-forward compile included


def _replay_rank(rank: int, world_size: int, payload: dict) -> dict:
    """One rank's (stage's) replay of a trace (the family's ``Session.replay`` with its ``dp_rank``
    or ``pp_stage``), in a process forked from the replay's: its steps, and for rank 0 the decision
    points the trace reached."""
    install_group(payload["group"], payload["timeout_s"])
    session = payload["session"]
    before = Counter(session.decisions.steps)  # forked: the parent's counts so far
    where = {"dp_rank": rank} if payload["group"] == "dp" else {"pp_stage": rank}
    steps = session.replay(payload["scenario"], payload["events"], **where)
    finder = overlay.installed()
    out = {"steps": steps, "reached": sorted(finder.reached) if finder else []}
    if lines.ACTIVE is not None:  # a deciding-lines replay: what this rank's vLLM code ran
        out["lines"] = lines.ACTIVE.snapshot(steps)
    if rank == 0:
        out.update(path=session.decisions.path, counted=list((session.decisions.steps - before).items()),
                   where=dict(decisions.WHERE))
    return out


def replay_ranks(session, scenario, events, timeout_s: float) -> list[dict]:
    """A trace on ``scenario.data_parallel_size`` ranks, one process each joined by gloo
    (``run``), every rank replaying the whole trace with its own batch at each
    ``execute_model``: rank 0's steps, each serving step with every rank's side (``ranks``). A
    rank whose code raised stops the step (``DP rank r: ...``), and so does a rank that never
    answered (a hang, ended by the collectives' bound); the decision points are rank 0's."""
    return merged(_run_trace(session, scenario, events, timeout_s, "dp", scenario.data_parallel_size))


def replay_stages(session, scenario, events, timeout_s: float) -> list[dict]:
    """A trace on ``scenario.pipeline_parallel_size`` PP stages, one process each joined by gloo,
    every stage replaying the whole trace with its own support and hand-over: stage 0's steps,
    each serving step with every stage's side (``stages``, ``merged_stages``)."""
    return merged_stages(_run_trace(session, scenario, events, timeout_s, "pp", scenario.pipeline_parallel_size))


def _run_trace(session, scenario, events, timeout_s: float, group: str, size: int) -> list[list[dict] | None]:
    """Each process's steps (None: never answered); rank 0's decision points become the session's."""
    answers = run(_replay_rank, {"session": session, "scenario": scenario, "events": events, "timeout_s": timeout_s,
                                 "group": group}, size, timeout_s, TRACE_DEADLINE_S)
    finder = overlay.installed()
    for answer in answers:
        if answer != HUNG and finder is not None:
            finder.reached.update(answer["reached"])
        if answer != HUNG and "lines" in answer and lines.ACTIVE is not None:
            lines.ACTIVE.merge(answer["lines"])
    if answers[0] != HUNG:
        session.decisions.path = answers[0]["path"]
        for key, n in answers[0]["counted"]:
            session.decisions.steps[key] += n
        for point, found in answers[0]["where"].items():
            decisions.WHERE.setdefault(point, found)
    return [None if a == HUNG else a["steps"] for a in answers]


def left_waiting(text: str) -> bool:
    """Whether a rank stopped in a collective of the ranks' gloo group (a peer that skipped it, left
    or never came) or never answered, not for a reason of its own."""
    return text == RankServed.NO_ANSWER or "gloo" in text.lower()


def side_of(text: str) -> str:
    """A stopped rank's side: gloo's text names ports and peers, so a collective's failure is said by
    the exception's type alone (reports stay byte-stable); vLLM's own errors as normalised."""
    if text != RankServed.NO_ANSWER and left_waiting(text):
        return f"{text.split(':')[0]} in a collective another rank skipped or left"
    return text


def merged(per_rank: list[list[dict] | None]) -> list[dict]:
    """One trace's steps from every rank's (None: a rank that never answered): rank 0's, each serving
    step with every rank's side. Where a rank stopped, the step has every rank's side, the stopped
    ones as ``raised``, and the trace ends there; a rank whose own code raised (not a collective
    another rank left it waiting in) stops the step too (``halted``, ``DP rank r: ...``)."""
    base = next((steps for steps in per_rank if steps is not None), [])
    out: list[dict] = []
    for k, template in enumerate(base):
        own = per_rank[0][k] if per_rank[0] is not None and k < len(per_rank[0]) else template
        step = {key: value for key, value in own.items() if key not in ("rank", "halted", "raised_at")}
        sides = [steps[k] if steps is not None and k < len(steps) else None for steps in per_rank]
        stopped = {r: RankServed.NO_ANSWER if side is None else side["halted"]
                   for r, side in enumerate(sides) if side is None or "halted" in side}
        own_reason = next(((r, text) for r, text in stopped.items() if not left_waiting(text)), None)
        if own_reason is not None and own_reason[0] == 0:
            step.update({key: own[key] for key in ("halted", "raised_at") if key in own})
        elif own_reason is not None:
            step["halted"] = f"DP rank {own_reason[0]}: {own_reason[1]}"
        if stopped or any(side is not None and "rank" in side for side in sides):
            step["ranks"] = [RankServed.stopped(side_of(stopped[r])).to_json() if r in stopped
                             else side.get("rank", RankServed(NONE, 0).to_json()) for r, side in enumerate(sides)]
        out.append(step)
        if stopped:
            break
    return out


def merged_stages(per_stage: list[list[dict] | None]) -> list[dict]:
    """One trace's steps from every PP stage's (None: a stage that never answered): stage 0's, each
    serving step with the sides of the stages up to the first that stopped (``stages``; a later
    stage waits on the one that stopped and says nothing of its own). A stage that raised for a
    reason of its own stops the trace there (``halted``; past stage 0, ``PP stage s: ...``), and so
    does one that was left waiting (a send or receive another stage never made)."""
    base = next((steps for steps in per_stage if steps is not None), [])
    out: list[dict] = []
    for k, template in enumerate(base):
        own = per_stage[0][k] if per_stage[0] is not None and k < len(per_stage[0]) else template
        step = {key: value for key, value in own.items() if key != "stage"}
        sides = [steps[k] if steps is not None and k < len(steps) else None for steps in per_stage]
        stopped = {s: RankServed.NO_ANSWER if side is None else side["halted"]
                   for s, side in enumerate(sides) if side is None or "halted" in side}
        first = min(stopped, key=lambda s: (left_waiting(stopped[s]), s)) if stopped else None
        if first is not None and first > 0:
            step.pop("raised_at", None)
            step["halted"] = f"PP stage {first}: {side_of(stopped[first])}"
        if first != 0 and "stage" in own:
            last = first if first is not None else len(sides) - 1
            step["stages"] = [RankServed.stopped(side_of(stopped[s])).to_json() if s == first else sides[s]["stage"]
                              for s in range(last + 1)]
        out.append(step)
        if stopped:
            break
    return out
