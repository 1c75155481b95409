"""P9 on two data-parallel ranks (``contract/core/ranks.py``): each step's judgment, and on vLLM's own
code (two processes joined by gloo on the loopback address) an edited 0.34.0 tree whose rank 1 skips
the sync: a new P9 class of severity hang, in bounded time; an idle rank's batch from vLLM's own
``execute_dummy_batch`` and ``_dummy_run``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from contract.core import ranks, sizes
from contract.core.modes import FULL, NONE, PIECEWISE
from contract.core.ranks import RankServed, step_gap
from contract.core.sizes import Batch, Gap, SizeSetting

ROOT = Path(__file__).resolve().parents[1]
DECODE, IDLE = Batch("decode", 8, 4), Batch("idle", 2, 1)


@pytest.mark.parametrize("served, weakest, what", [
    ([RankServed("FULL", 8), RankServed("FULL", 8)], FULL, None),
    ([RankServed("NONE", 8), RankServed("NONE", 2)], NONE, None),  # eager ranks run their own tokens
    ([RankServed("FULL", 8), RankServed("PIECEWISE", 8)], FULL, sizes.DIFFERENT_MODES),
    ([RankServed("PIECEWISE", 8), RankServed("PIECEWISE", 16)], PIECEWISE, sizes.DIFFERENT_TOKENS),
    ([RankServed("FULL", 8), None], FULL, sizes.RANK_HUNG),
    ([RankServed("FULL", 8), RankServed("NONE", 0, "AssertionError")], FULL, sizes.RANK_HUNG),
    ([RankServed("PIECEWISE", 8), RankServed("PIECEWISE", 8)], FULL, sizes.WEAKER)])
def test_a_step_is_judged_on_every_rank(served, weakest, what):
    gap = step_gap((DECODE, IDLE), served, weakest)
    assert (gap.what if gap else None) == what, gap
    if what in sizes.HANGS:
        assert gap.property == "P9" and gap.severity == "hang" and gap.title.startswith("P9 decode+idle steps")
    elif what:
        assert gap.property == "P8" and "decode+idle steps on two DP ranks" in gap.title


def test_the_steps_pair_boundary_decode_batches_with_an_idle_rank_a_larger_one_and_a_prefill():
    steps = ranks.rank_steps(SizeSetting(16, 1))
    assert {ranks.step_kind(s) for s in steps} == {"decode+idle", "decode+decode", "decode+mixed"}
    assert {s[0].num_reqs for s in steps} == {1, 9, 16}  # decode[16 // 2] holds 9 requests
    assert all(s[1] == ranks.idle(SizeSetting(16, 1)) == Batch("idle", 2, 1) for s in steps if s[1].kind == "idle")


def test_a_rank_that_never_answered_is_a_hang_on_its_setting():
    s = SizeSetting(4)
    answered = {"served": [["FULL", t] for t in range(len(ranks.rank_steps(s)))]}
    found = ranks.judged(s, [answered, {"served": []}], lambda b: FULL)
    assert [g.what for g in found] == [sizes.RANK_HUNG]


SKIP_SYNC = ("    if dp_size == 1:\n        return batch_desc, None\n",
             "    if dp_size == 1 or dp_rank == 1:\n        return batch_desc, None\n")


@pytest.mark.evidence  # make test's size checks run the two ranks; this edit is make evidence's
@pytest.mark.conformance
def test_an_edited_0_34_tree_whose_rank_skips_the_sync_is_a_new_p9_hang_in_bounded_time(tmp_path):
    from vllm_envs import installed

    tree = tmp_path / "tree"
    tree.mkdir()
    subprocess.run(["cp", "-as", str(installed("0.34.0").resolve()), str(tree / "vllm")], check=True,
                   capture_output=True)
    target = tree / "vllm" / "v1" / "worker" / "gpu" / "dp_utils.py"
    text = target.read_text()
    assert text.count(SKIP_SYNC[0]) == 1
    target.unlink()
    target.write_text(text.replace(*SKIP_SYNC))
    witness = tmp_path / "witness.json"
    witness.write_text(json.dumps(sizes.witness_json(SizeSetting(4), Gap("decode+idle", "-", "-", sizes.RANK_HUNG),
                                                     [], "0.34.0")))
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "contract.cli", "conform", "--vllm-src", str(tree), "--base", "0.34.0",
                           "--traces", str(witness), "--reports", str(tmp_path / "r"), "--json"],
                          capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env={**os.environ, "CUDAGRAPH_CONTRACT_CACHE": str(tmp_path / "cache")})
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    data = json.loads(done.stdout[done.stdout.index("{"):])
    new = [c for c in data["sizes"]["new"] if c["property"] == "P9"]
    assert new and new[0]["severity"] == "hang" and new[0]["what"] == sizes.RANK_HUNG, data["sizes"]["new"]
    assert time.monotonic() - started < 300  # a rank left waiting times out after 20 s, never hangs the run
