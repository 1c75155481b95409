"""Data-parallel ranks on the capture-size grid (P9, rank agreement): the batches two ranks bring to
one step, and whether the descriptors they then run agree.

DP ranks run each forward together: their MoE all-to-alls and the padded token count they agreed
on must match, so vLLM agrees one descriptor across ranks before every forward
(``dispatch_cg_and_sync_dp``: the minimum mode, the largest token count, a re-dispatch on every
rank, ``34:v1/worker/gpu/dp_utils.py:49-230``). A rank with nothing scheduled runs the worker's
dummy batch: one request of ``uniform_decode_query_len`` tokens (``execute_dummy_batch``,
``34:v1/worker/gpu_worker.py:1576-1581``, ``33:v1/worker/gpu_worker.py:1466-1472``; ``_dummy_run``
then holds ``num_tokens // decode_query_len`` requests, ``34:v1/worker/gpu/model_runner.py:911-914``).

P9 holds for a step when every rank runs the same runtime mode and, where that mode has a graph,
the same padded token count; a rank that never answers (a collective another rank skipped) or
whose code raises leaves the others waiting. Either is a hang, the worst a server can do. Beside
it, a step is not served weaker than the weakest rank's own best graph (``best``, the family's
size reference): the agreement costs no rank more than the minimum it must take.
"""

from __future__ import annotations

from collections.abc import Callable

from contract.core.modes import NONE, CUDAGraphMode
from contract.core.observation import RankServed
from contract.core.sizes import (
    DIFFERENT_MODES,
    DIFFERENT_TOKENS,
    RANK_HUNG,
    STRENGTH,
    WEAKER,
    Batch,
    Gap,
    SizeSetting,
    batches,
)



def idle(s: SizeSetting) -> Batch:
    """The dummy batch of a rank with nothing scheduled."""
    return Batch("idle", s.q, 1)


def rank_steps(s: SizeSetting) -> list[tuple[Batch, Batch]]:
    """Per boundary decode batch of the grid (the smallest, the middle one, the largest):
    beside an idle rank, beside the next larger decode batch (the ranks pad to the larger), and
    beside a mixed batch of as many tokens (one rank prefills)."""
    every = list(batches(s))
    decode = [b for b in every if b.kind == "decode"]
    mixed = {b.num_tokens: b for b in every if b.kind == "mixed"}
    steps: list[tuple[Batch, Batch]] = []
    for i in sorted({0, len(decode) // 2, len(decode) - 1} & set(range(len(decode)))):
        b = decode[i]
        steps.append((b, idle(s)))
        if i + 1 < len(decode):
            steps.append((b, decode[i + 1]))
        if b.num_tokens in mixed:
            steps.append((b, mixed[b.num_tokens]))
    return steps


def step_kind(step: tuple[Batch, ...]) -> str:
    """A step's kind: its ranks' batch kinds, ``decode+idle``."""
    return "+".join(b.kind for b in step)


def kind_count(s: SizeSetting, kind: str) -> int:
    """How many of ``s``'s batches (or, for a step kind, its steps) are of ``kind``."""
    if "+" in kind:
        return sum(1 for step in rank_steps(s) if step_kind(step) == kind)
    return sum(1 for b in batches(s) if b.kind == kind)


def served(data: list) -> RankServed:
    """A size check's record of one rank's step: ``[mode, tokens]``, or ``["raised", line]``."""
    if data and data[0] == "raised":  # the exception's type: its text can name a port or a peer
        return RankServed.stopped(str(data[1]).split(":")[0])
    return RankServed(CUDAGraphMode[str(data[0])], int(data[1]))


def step_gap(step: tuple[Batch, ...], served: list[RankServed | None], weakest: CUDAGraphMode) -> Gap | None:
    """What is wrong with one step's descriptors (None: a rank never answered): the P9 finding,
    else a step served below ``weakest`` (P8), else None."""
    kind = step_kind(step)
    if any(r is None or r.raised for r in served):
        why = next((r.raised for r in served if r is not None and r.raised), RankServed.NO_ANSWER)
        return Gap(kind, "-", why, RANK_HUNG)
    modes = [r.runtime_mode.name for r in served]
    if len(set(modes)) > 1:
        return Gap(kind, "-", " and ".join(modes), DIFFERENT_MODES)
    if modes[0] != NONE.name and len({r.num_tokens for r in served}) > 1:
        return Gap(kind, "-", modes[0], DIFFERENT_TOKENS)
    if STRENGTH[modes[0]] < STRENGTH[weakest.name]:
        return Gap(kind, weakest.name, modes[0], WEAKER)
    return None


def weakest(step: tuple[Batch, ...], best: Callable[[Batch], CUDAGraphMode]) -> CUDAGraphMode:
    """The weakest of the ranks' own best graphs: what the minimum across ranks may lower a step to."""
    return min((best(b) for b in step), key=lambda m: STRENGTH[m.name])


def judged(s: SizeSetting, records: list[dict], best: Callable[[Batch], CUDAGraphMode]) -> dict[Gap, list[Batch]]:
    """One setting's steps, each rank's record (``{"served": [...]}``) beside the others': per
    signature, the batches of the first rank in the steps that show it."""
    out: dict[Gap, list[Batch]] = {}
    if any("served" not in r for r in records):
        return out  # refused at start-up, alike on every rank: the single-rank check reports it
    for k, step in enumerate(rank_steps(s)):
        sides = [served(r["served"][k]) if k < len(r["served"]) else None for r in records]
        if all(x is None for x in sides):
            break  # every rank stopped before this step
        gap = step_gap(step, sides, weakest(step, best))
        if gap is not None:
            out.setdefault(gap, []).append(step[0])
            if gap.what == RANK_HUNG:
                break  # what the ranks ran after one stopped is its consequence
    return out
