"""The ranks' DP syncs kept in phase, where a drafter makes some of them (``v1/worker/dp_utils.py``'s
``_synchronize_dp_ranks``, the one all-reduce ``coordinate_batch_across_dp`` makes for the target and
for the EAGLE proposer alike, 0.28.0 to 0.33.0).

vLLM pairs the ranks' all-reduces by order alone: a rank that makes one more in a step meets the other
ranks' first one of the next step, with other numbers, and the ranks hang at the latest where one of
them has no more to make. The replay makes that point deterministic: before each of vLLM's syncs every
rank says how many it has made in the step, and at the end of each step how many it made (one
``all_gather`` of the same shape either way, so a rank entering a sync meets a rank ending its step);
where they differ, every rank stops the step there with ``llm_base_proposer.out_of_phase``'s text, as
the model predicts. Where they agree, nothing of vLLM's changes.
"""

from __future__ import annotations

from contract.runners.mrv1.model.llm_base_proposer import out_of_phase

SYNC, END = 0, 1


class OutOfPhase(Exception):
    """The ranks' DP syncs in a step differ in number (the model's text)."""


class PhaseCheck:
    """Installed in one rank's process: wraps ``_synchronize_dp_ranks`` and counts its calls per step."""

    def __init__(self) -> None:
        import vllm.distributed.parallel_state as ps
        import vllm.v1.worker.dp_utils as vllm_dp_utils

        self.group = ps.get_dp_group().cpu_group
        self.made = 0
        synchronize = vllm_dp_utils._synchronize_dp_ranks

        def _synchronize_dp_ranks(*args, **kwargs):
            self.agree(SYNC, self.made + 1)
            self.made += 1
            return synchronize(*args, **kwargs)

        vllm_dp_utils._synchronize_dp_ranks = _synchronize_dp_ranks

    def agree(self, where: int, count: int) -> None:
        import torch
        import torch.distributed as dist

        mine = torch.tensor([where, count], dtype=torch.int64)
        every = [torch.empty_like(mine) for _ in range(dist.get_world_size(self.group))]
        dist.all_gather(every, mine, group=self.group)
        tags = [tuple(t.tolist()) for t in every]
        if len(set(tags)) > 1:
            raise OutOfPhase(out_of_phase([count for _, count in tags]))

    def end_step(self) -> None:
        """The step's end: every rank made as many syncs (else ``OutOfPhase``)."""
        made, self.made = self.made, 0
        self.agree(END, made)
