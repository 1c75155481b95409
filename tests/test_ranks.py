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
from contract.core.modes import FULL, FULL_AND_PIECEWISE, NONE, PIECEWISE
from contract.core.observation import RankServed
from contract.core.ranks import step_gap
from contract.core.sizes import Batch, Gap, SizeSetting

ROOT = Path(__file__).resolve().parents[1]
DECODE, IDLE = Batch("decode", 8, 4), Batch("idle", 2, 1)


@pytest.mark.parametrize("served, weakest, what", [
    ([RankServed(FULL, 8), RankServed(FULL, 8)], FULL, None),
    ([RankServed(NONE, 8), RankServed(NONE, 2)], NONE, None),  # eager ranks run their own tokens
    ([RankServed(FULL, 8), RankServed(PIECEWISE, 8)], FULL, sizes.DIFFERENT_MODES),
    ([RankServed(PIECEWISE, 8), RankServed(PIECEWISE, 16)], PIECEWISE, sizes.DIFFERENT_TOKENS),
    ([RankServed(FULL, 8), None], FULL, sizes.RANK_HUNG),
    ([RankServed(FULL, 8), RankServed.stopped("AssertionError")], FULL, sizes.RANK_HUNG),
    ([RankServed(PIECEWISE, 8), RankServed(PIECEWISE, 8)], FULL, sizes.WEAKER)])
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


def skip_sync_tree(tmp_path: Path) -> Path:
    """An unpacked 0.34.0 (links to the installed files) whose ``dp_utils.py`` is edited: rank 1 skips the sync."""
    from vllm_envs import edited_tree

    return edited_tree(tmp_path, "0.34.0", "v1/worker/gpu/dp_utils.py", *SKIP_SYNC)


@pytest.mark.evidence  # make test's size checks run the two ranks; this edit is make evidence's
@pytest.mark.conformance
def test_an_edited_0_34_tree_whose_rank_skips_the_sync_is_a_new_p9_hang_in_bounded_time(tmp_path):
    tree = skip_sync_tree(tmp_path)
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


# -- ranks in traces (the model's lockstep steps, P9 per step, vLLM's code on one process per rank) --

from contract.core.events import ExecuteModel, Peer, event_from_json, event_to_json  # noqa: E402
from contract.core.observation import StepRecord  # noqa: E402
from contract.core.properties import rank_agreement  # noqa: E402
from contract.core.scenario import DrafterKind, Runner, Scenario  # noqa: E402
from contract.core.trace import TraceError, loads  # noqa: E402
from contract.real.ranks import merged  # noqa: E402
from contract.runners.mrv2.model import cudagraph_utils as cgu  # noqa: E402
from contract.runners.mrv2.model.dp_utils import (  # noqa: E402
    RankBatch,
    dispatch_cg_and_sync_dp,
    dummy_batch,
)

SPEC = Scenario(runner=Runner.MRV2, drafter=DrafterKind.WITH_MODEL, uniform_decode_query_len=2, data_parallel_size=2)
BUSY = RankServed(FULL, 4, (2, 4, 2))


@pytest.mark.parametrize("sides, found", [
    ([BUSY, RankServed(FULL, 4, (1, 2, 2), idle=True)], None),
    ([RankServed(NONE, 4, (2, 4, 2)), RankServed(NONE, 2, (1, 2, 2), need_eager=True)], None),
    ([BUSY, RankServed(PIECEWISE, 4, (3, 3, None))], "different runtime modes"),
    ([BUSY, RankServed(FULL, 2, (1, 2, 2))], "graphs of different token counts"),
    ([RankServed(PIECEWISE, 4, (2, 4, 2)), RankServed(PIECEWISE, 4, (2, 2, None), need_eager=True)], "needs eager"),
    ([RankServed(PIECEWISE, 4, (2, 4, 2)), RankServed(PIECEWISE, 4, (1, 1, 1), idle=True)], "not a uniform decode of 2"),
    ([BUSY, RankServed.stopped("RuntimeError: [gloo] Timed out")], "leaving the others waiting")])
def test_p9_judges_every_rank_of_a_step(sides, found):
    got = rank_agreement(SPEC, Runner.MRV2, StepRecord(5, ExecuteModel(4, True, peers=(Peer(0),)), ranks=tuple(sides)))
    assert (found is None and not got) or (len(got) == 1 and found in got[0].message), got


def test_the_model_agrees_as_sync_cudagraph_and_dp_padding():
    """34:v1/worker/gpu/dp_utils.py:52-230: the weakest mode, NONE at each rank's own token count,
    else a re-dispatch at the largest count with the uniform count only where every rank shares it."""
    m = cgu.build("target:CudaGraphManager", "0.34", FULL_AND_PIECEWISE, (2, 4), 2, target_q=2, use_breakable_cg=False)
    m = cgu.replace(m, graphs_captured=True)
    decode, mixed = RankBatch(1, 2, 2, 2), RankBatch(3, 3, None, 3)
    assert [d.cg_mode for d in dispatch_cg_and_sync_dp(m, (decode, dummy_batch(2)))] == [FULL, FULL]
    agreed = dispatch_cg_and_sync_dp(m, (decode, mixed))
    assert [(d.cg_mode, d.num_tokens) for d in agreed] == [(PIECEWISE, 4), (PIECEWISE, 4)]
    eager = dispatch_cg_and_sync_dp(m, (decode, RankBatch(3, 3, None, 3, need_eager=True)))
    assert [(d.cg_mode, d.num_tokens) for d in eager] == [(NONE, 2), (NONE, 3)]
    skipped = dispatch_cg_and_sync_dp(m, (decode, mixed), sync=False)
    assert [d.cg_mode for d in skipped] == [FULL, PIECEWISE]
    assert dummy_batch(2, aligned=False) == RankBatch(1, 1, 1, 1)


def test_peers_round_trip_and_bad_ones_get_one_line():
    event = ExecuteModel(4, True, peers=(Peer(0), Peer(3, False, True)))
    assert event_from_json(event_to_json(event)) == event
    assert event_to_json(ExecuteModel(4)) == {"event": "execute_model", "num_tokens": 4, "uniform_decode": False,
                                              "force_eager": False}
    head = '{"schema": "cudagraph-contract.trace", "version": 1, "policy": "mrv2_0_34", '
    scenario = '"scenario": {"runner": "MRV2", "data_parallel_size": 3}, '
    for events, says in ((['{"event": "execute_model", "num_tokens": 2, "peers": [[0, false, false]]}'],
                          "names 1 peer batch(es); data_parallel_size 3 needs 2"),
                         (['{"event": "execute_model", "num_tokens": 2, "peers": [[-1, false, false], [1, 0, 0]]}'],
                          "peers must be a list of [num_tokens >= 0, uniform_decode, force_eager]"),
                         (['{"event": "propose", "num_tokens": 2}'], "draft steps on several data-parallel ranks")):
        with pytest.raises(TraceError) as exc:
            loads(head + scenario + f'"events": [{", ".join(events)}]}}', "t.json")
        assert says in str(exc.value) and "\n" not in str(exc.value)
    with pytest.raises(TraceError, match="data_parallel_size is 1 to 4"):
        loads(head + '"scenario": {"runner": "MRV2", "data_parallel_size": 5}, "events": []}', "t.json")
    with pytest.raises(TraceError, match="on Model Runner V1 are modelled with EAGLE's or an n-gram drafter"):
        loads(head + '"scenario": {"runner": "MRV1", "data_parallel_size": 2, "drafter": "with_model", '
                     '"speculator": "STANDALONE_AR", "uniform_decode_query_len": 2}, "events": []}', "t.json")
    assert SPEC.to_json()["data_parallel_size"] == 2
    assert "data_parallel_size" not in Scenario(runner=Runner.MRV2).to_json()


def test_a_rank_left_waiting_is_p9_and_a_rank_that_raised_of_its_own_stops_the_step():
    side = {"batch": [1, 1, None], "runtime_mode": "NONE", "num_tokens": 1}
    start = {"event": {"event": "load_model"}}
    serve = {"event": {"event": "execute_model"}, "rank": side}
    waited = {"event": {"event": "execute_model"}, "halted": "RuntimeError: [gloo/transport/tcp] Timed out"}
    out = merged([[start, waited], [start, serve, serve]])
    assert len(out) == 2 and "halted" not in out[1]
    assert out[1]["ranks"] == [{"raised": "RuntimeError in a collective another rank skipped or left"}, side]
    own = {"event": {"event": "execute_model"}, "halted": "AssertionError: dp"}
    out = merged([[start, serve], [start, own]])
    assert out[1]["halted"] == "DP rank 1: AssertionError: dp" and out[1]["ranks"][1] == {"raised": "AssertionError: dp"}
    assert merged([[start, serve], None]) == [{**start, "ranks": [{"runtime_mode": "NONE", "num_tokens": 0},
                                                                 {"raised": "no answer"}]}]


@pytest.mark.evidence
@pytest.mark.conformance
def test_the_edited_tree_on_a_two_rank_trace_is_a_new_p9_hang(tmp_path):
    """The same tree on a trace of the multi-rank corpus: rank 1 skips the all-reduce at
    ``profile_run``'s dispatch, rank 0 is left waiting in it, a new P9 class of severity hang."""
    from vllm_envs import conform_tree

    from contract.core.graphs import script
    from contract.core.trace import record_runnable
    from contract.families import load_policy

    tree = skip_sync_tree(tmp_path)
    scenario = Scenario(runner=Runner.MRV2, data_parallel_size=2)
    data = conform_tree(tree, record_runnable(scenario, load_policy("mrv2_0_34"), script(scenario), name="two-ranks"),
                        tmp_path)
    new = [c for c in data["new"] if c["property"] == "P9"]
    assert new and new[0]["severity"] == "hang" and new[0]["what"] == sizes.RANK_HUNG, data["new"]


def test_model_runner_v1_agrees_as_coordinate_batch_across_dp():
    """33:v1/worker/dp_utils.py:114-187 and the re-dispatch of 33:v1/worker/gpu_model_runner.py:3728-3769:
    the minimum mode; under a graph every rank at the largest padded count, else each at its own; the
    agreed mode the only one the re-dispatch allows, and its count asserted."""
    from contract.core.forward_context import BatchDescriptor
    from contract.runners.mrv1.model.dp_utils import ASSERTION
    from contract.runners.mrv1.model.dp_utils import RankBatch as V1Batch
    from contract.runners.mrv1.model.dp_utils import (
        determine_batch_execution_and_padding as agree,
    )

    def dispatch(num_tokens, uniform, valid):  # graphs of 2 and 4 tokens: FULL for uniform batches, PIECEWISE
        allowed = valid or {NONE, PIECEWISE, FULL}
        mode = NONE if num_tokens > 4 else FULL if uniform and FULL in allowed else PIECEWISE if PIECEWISE in allowed \
            else NONE
        return mode, BatchDescriptor(num_tokens if mode is NONE else 2 if num_tokens <= 2 else 4)

    decode, mixed, eager = V1Batch(1, 1, True), V1Batch(3, 3, False), V1Batch(3, 3, False, force_eager=True)
    assert [(r.mode, r.desc.num_tokens) for r in agree(dispatch, (decode, mixed))] == [(PIECEWISE, 4)] * 2
    assert [(r.mode, r.desc.num_tokens) for r in agree(dispatch, (decode, eager))] == [(NONE, 2), (NONE, 3)]
    broken = agree(dispatch, (V1Batch(1, 1, False), eager), syncs_mode=False)
    assert broken[0].raised == ASSERTION and broken[1].mode is NONE  # PIECEWISE pads 3 to 4: the count's assert


@pytest.mark.evidence
@pytest.mark.conformance
def test_the_plugin_says_the_sync_change_it_does_not_read(tmp_path):
    """The model reads no DP sync: the plugin passes the tree's model items, and skips an item that
    names the change and the replay that runs it, as ``verify --vllm-src`` does; never a silent pass."""
    tree = skip_sync_tree(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    done = subprocess.run([sys.executable, "-m", "pytest", "-c", "/dev/null", "-p", "no:cacheprovider", "-rs",
                           "--cudagraph-contract-vllm-src", str(tree), "--cudagraph-contract-base", "auto"],
                          capture_output=True, text=True, cwd=empty, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "1 passed, 1 skipped" in done.stdout and "SKIPPED" in done.stdout, done.stdout[-3000:]
    assert ("the model does not read 1 of the tree's changes (v1/worker/gpu/dp_utils.py: dispatch_cg_and_sync_dp); "
            f"replay them on vLLM's own code: cudagraph-contract conform --vllm-src {tree} --base 0.34.0") \
        in done.stdout.replace("\n", " "), done.stdout
