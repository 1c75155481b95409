"""Capture sizes: the model's derivation against vLLM's, P8 (graph coverage) on the release and on
mutants of the derivation and the dispatch, the size witness, and an edited 0.34.0 tree whose size
derivation loses graphs."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from contract.branch import sizes as branch_sizes
from contract.core import capture_sizes, sizes
from contract.core.capture_sizes import derive
from contract.core.modes import FULL, NONE, PIECEWISE
from contract.core.sizes import Batch, Gap, Served, SizeSetting, judge, served_from
from contract.families import by_name
from contract.real import sizes as real_sizes
from contract.runners.mrv1.model import sizes as mrv1_sizes
from contract.runners.mrv2.model import sizes as mrv2_sizes

ROOT = Path(__file__).resolve().parents[1]
MRV2 = by_name("mrv2")


def test_the_default_ladder_with_max_num_seqs_and_max_num_batched_tokens_off_the_stride():
    """``34:config/vllm.py:2380-2500``: 1, 2, 4, the 8-stride up to the ceiling, max_num_seqs (q = 1)
    and max_num_batched_tokens where they fit; the split's prefill sizes are the shared ones."""
    assert derive(SizeSetting(9), "0.33").cudagraph_capture_sizes == (1, 2, 4, 8, 9, 16)
    d = derive(SizeSetting(64, 0, 100), "0.34")
    assert d.cudagraph_capture_sizes[-3:] == (88, 96, 100) and d.prefill_cudagraph_capture_token_sizes[-1] == 100
    assert d.decode_cudagraph_capture_request_sizes[-1] == 64


def test_an_explicit_maximum_off_the_ladder_is_truncated_and_logged_and_an_inconsistent_pair_rejected():
    d = derive(SizeSetting(6, 6, max_cudagraph_capture_size=42), "0.34")
    assert d.logged == ("Truncating max_cudagraph_capture_size to 40",) and 42 not in d.cudagraph_capture_sizes
    both = SizeSetting(6, 0, cudagraph_capture_sizes=(1, 2, 4), max_cudagraph_capture_size=8)
    assert derive(both, "0.34").rejected.startswith("ValueError: customized max_cudagraph_capture_size(=8)")
    assert derive(SizeSetting(6, cudagraph_mode="NONE"), "0.34").cudagraph_capture_sizes == ()


def _served_by_model(s: SizeSetting, derived, release: str) -> dict[Batch, Served]:
    """A dispatch that serves every batch with the best graph ``derived`` gives, padded to it."""
    g = mrv2_sizes.graphs(s, derived, release)
    out = {}
    for b in sizes.batches(s):
        mode = mrv2_sizes.best(s, g, b)
        fitting = [(n, qq) for n, qq in g.decode if n >= b.num_reqs and qq == b.uniform_token_count]
        if mode == FULL and g.decode_mode == FULL and fitting:
            n, qq = min(fitting)
            out[b] = Served(FULL.name, n * qq, n)
        elif mode != NONE:
            t = min(t for t in g.tokens if t >= b.num_tokens and (mode != FULL or min(t, s.max_num_seqs) >= b.num_reqs))
            out[b] = Served(mode.name, t, min(t, s.max_num_seqs) if mode == FULL else None)
        else:
            out[b] = Served(NONE.name, b.num_tokens, b.num_reqs)
    return out


def _gaps(release: str, mutate=lambda s, d: d, serve=_served_by_model) -> set[Gap]:
    found = set()
    for s in sizes.grid():
        reference = derive(s, release)
        if reference.rejected:
            continue
        best = mrv2_sizes.reference(s, reference, release)
        found |= set(judge(serve(s, mutate(s, reference), release), best, list(reference.logged), s).gaps)
    return found


@pytest.mark.parametrize("release", capture_sizes.RELEASES)
def test_p8_holds_on_the_model_and_fails_on_each_mutant(release):
    """The model served by its own graphs shows no gap; each mutant of the derivation or the dispatch
    is killed by P8 (the mutants are the shapes of real bugs: bugs/<id>/)."""
    assert _gaps(release) == set()

    def no_max_num_batched_tokens(s, d):  # bugs/max-num-batched-tokens-not-captured
        if s.max_num_batched_tokens in d.cudagraph_capture_sizes and s.max_num_batched_tokens % 8:
            drop = tuple(x for x in d.cudagraph_capture_sizes if x != s.max_num_batched_tokens)
            return dataclasses.replace(d, cudagraph_capture_sizes=drop, max_cudagraph_capture_size=drop[-1],
                                       prefill_cudagraph_capture_token_sizes=drop if release == "0.34" else None)
        return d

    def no_decode_graphs(s, d):
        return dataclasses.replace(d, decode_cudagraph_capture_request_sizes=(),
                                   cudagraph_capture_sizes=() if release == "0.33" else d.cudagraph_capture_sizes)

    def smaller_graph(s, derived, rel):  # a dispatch that replays the graph below the batch
        served = _served_by_model(s, derived, rel)
        return {b: Served(g.mode, max(1, g.num_tokens - 1), g.num_reqs) if g.mode == PIECEWISE.name else g
                for b, g in served.items()}

    def weaker_decode(s, derived, rel):  # bugs/mrv2-uniform-decode-gap-falls-to-piecewise's shape
        served = _served_by_model(s, derived, rel)
        return {b: Served(PIECEWISE.name, g.num_tokens, None) if b.kind == "decode" and g.mode == FULL.name else g
                for b, g in served.items()}

    def full_for_every_mode(s, derived, rel):  # a manager that captures FULL whatever the mode names
        served = _served_by_model(s, derived, rel)
        return {b: Served(FULL.name, g.num_tokens, g.num_reqs or b.num_reqs) if g.mode == PIECEWISE.name else g
                for b, g in served.items()}

    def ignores_enforce_eager(s, d):  # graphs derived as if --enforce-eager were not given
        return derive(dataclasses.replace(s, enforce_eager=False), release) if s.enforce_eager else d

    assert {g.kind for g in _gaps(release, no_max_num_batched_tokens)} == {"mixed"}
    assert {(g.what, g.wanted) for g in _gaps(release, ignores_enforce_eager)} == {(sizes.UNWANTED, NONE.name)}
    assert {(g.what, g.wanted) for g in _gaps(release, serve=full_for_every_mode)} == {
        (sizes.UNCONFIGURED, "PIECEWISE"), (sizes.UNCONFIGURED, "FULL_AND_PIECEWISE")}
    assert {(g.kind, g.wanted) for g in _gaps(release, no_decode_graphs)} >= {("decode", FULL.name)}
    assert {g.what for g in _gaps(release, serve=smaller_graph)} == {sizes.SMALLER}
    assert {(g.kind, g.served) for g in _gaps(release, serve=weaker_decode)} == {("decode", PIECEWISE.name)}


def _served_by_mrv1(s: SizeSetting, derived) -> dict[Batch, Served]:
    """``CudagraphDispatcher.dispatch`` (``33:v1/cudagraph_dispatcher.py:233-322``) over the keys of
    ``derived``: pad to the next capture size, FULL where a decode or mixed FULL key has it, else
    PIECEWISE where the mixed mode is, else NONE."""
    g, out = mrv1_sizes.graphs(s, derived), {}
    for b in sizes.batches(s):
        padded = min((t for t in derived.cudagraph_capture_sizes if t >= b.num_tokens), default=None)
        if padded is None or g.mixed_mode == NONE and not g.decode:
            out[b] = Served(NONE.name, b.num_tokens, b.num_reqs)
        elif b.kind == "decode" and b.uniform_token_count == s.q and padded in g.decode:
            out[b] = Served(FULL.name, padded, min(padded // s.q, s.max_num_seqs))
        elif g.mixed_mode != NONE:
            out[b] = Served(g.mixed_mode.name, padded, min(padded, s.max_num_seqs) if g.mixed_mode == FULL else None)
        else:
            out[b] = Served(NONE.name, b.num_tokens, b.num_reqs)
    return out


def test_p8_holds_on_model_runner_v1s_keys_and_fails_where_max_num_seqs_is_not_a_decode_size():
    """MRV1's dispatcher served from the model's keys shows no gap; without ``max_num_seqs`` among
    the decode sizes (bugs/max-num-seqs-off-stride-piecewise-cliff, #57355) the largest decode
    batches fall to PIECEWISE, or run eagerly under FULL_DECODE_ONLY."""
    def gaps(mutate=lambda s, d: d) -> set[Gap]:
        found: set[Gap] = set()
        for s in sizes.grid():
            reference = mrv1_sizes.sizes(s, "0.33")
            if reference.rejected is None:
                best = mrv1_sizes.reference(s, reference, "0.33")
                found |= set(judge(_served_by_mrv1(s, mutate(s, reference)), best, [], s).gaps)
        return found

    def no_max_num_seqs(s, d):
        off_stride = s.q == 1 and s.max_num_seqs % 8 and s.max_num_seqs > 4 and s.max_num_seqs != s.ceiling()
        kept = tuple(x for x in d.cudagraph_capture_sizes if not (off_stride and x == s.max_num_seqs))
        return dataclasses.replace(d, cudagraph_capture_sizes=kept)

    assert gaps() == set()
    assert {(g.kind, g.served) for g in gaps(no_max_num_seqs)} == {("decode", PIECEWISE.name), ("decode", NONE.name)}
    # the spec-decode rounding (33:config/compilation.py:1537-1565) of (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 40, 48)
    assert mrv1_sizes.sizes(SizeSetting(8, 2), "0.33").cudagraph_capture_sizes == (3, 6, 9, 12, 18, 24, 33, 42, 48)


def test_the_real_sides_runs_must_cover_the_settings_batches_exactly():
    s = SizeSetting(1)
    every = list(sizes.batches(s))
    runs = [[b.kind, b.num_tokens, b.num_tokens, "NONE", b.num_tokens, b.num_reqs] for b in every]
    assert len(served_from(s, runs)) == len(every)
    for bad in (runs[:-1], [*runs, runs[-1]], [[*runs[0][:3], "EAGER", 1, 1], *runs[1:]]):
        with pytest.raises(sizes.RunsError):
            served_from(s, bad)


def test_a_size_witness_is_read_field_by_field(tmp_path):
    s = SizeSetting(64, 0, 100, "FULL")
    gap = Gap("mixed", "FULL", "NONE", sizes.WEAKER)
    data = sizes.witness_json(s, gap, [Batch("mixed", 97, 64)], "0.34.0")
    assert sizes.witness_setting(json.loads(json.dumps(data)), "w.json") == s
    dynamic = SizeSetting(100, 2, num_speculative_tokens_per_batch_size=((1, 8, 2), (20, 64, 1)), enforce_eager=True)
    assert sizes.witness_setting(json.loads(json.dumps(sizes.witness_json(dynamic, gap, [], "0.34.0"))), "w") == dynamic
    for setting in ({**data["setting"], "max_num_seqs": 0}, {**data["setting"], "cudagraph_mode": "EAGER"},
                    {**data["setting"], "extra": 1}, {**data["setting"], "cudagraph_capture_sizes": []},
                    {**data["setting"], "enforce_eager": 1},
                    {**dynamic.to_json(), "num_speculative_tokens_per_batch_size": [[2, 8, 2]]},
                    {**dynamic.to_json(), "num_speculative_tokens_per_batch_size": [[1, 8, 2], [8, 9, 1]]}):
        with pytest.raises(sizes.WitnessError, match="w.json is not a size witness"):
            sizes.witness_setting({**data, "setting": setting}, "w.json")


def _release_side(release: str, family=MRV2):
    from vllm_envs import installed

    from contract.real.installed import environment

    version = f"{release}.0"
    pkg = installed(version)
    settings = sizes.grid()
    data = branch_sizes._observe(environment(version), family, settings, None, 600, f"vLLM {version}", version, pkg,
                                 None)
    return settings, data


MODES = ("FULL_AND_PIECEWISE", "FULL_DECODE_ONLY", "FULL", "PIECEWISE")


@st.composite
def schedules(draw, k: int, mns: int):
    """A dynamic speculative decoding schedule vLLM accepts: ranges from batch size 1, in order."""
    cuts = sorted(draw(st.sets(st.integers(2, max(2, mns)), max_size=3)))
    starts = [1, *cuts]
    ends = [c - 1 for c in cuts] + [draw(st.integers(starts[-1], mns + 8))]
    return tuple((a, b, draw(st.integers(0, k))) for a, b in zip(starts, ends))


@st.composite
def size_settings(draw) -> SizeSetting:
    mns, k = draw(st.integers(1, 300)), draw(st.integers(0, 7))
    return SizeSetting(
        mns, k, draw(st.one_of(st.just(sizes.DEFAULT_MAX_NUM_BATCHED_TOKENS), st.integers(mns, 1024))),
        draw(st.sampled_from(MODES)),
        draw(st.one_of(st.none(), st.lists(st.integers(1, 600), min_size=1, max_size=8).map(tuple))),
        draw(st.one_of(st.none(), st.integers(1, 600))),
        num_speculative_tokens_per_batch_size=draw(st.one_of(st.none(), schedules(k, mns))) if k else None,
        decode_cudagraph_capture_request_sizes=draw(
            st.one_of(st.none(), st.lists(st.integers(1, 400), min_size=1, max_size=5).map(tuple))))


@pytest.mark.conformance
@settings(max_examples=1, deadline=None, derandomize=True, phases=(Phase.generate,))  # one child run
@given(st.lists(size_settings(), min_size=60, max_size=60, unique=True))
def test_the_model_derives_what_vllm_0_34_derives_for_drawn_settings(drawn):
    """Beyond the grid: 60 drawn settings (explicit lists and maxima anywhere, any query length,
    dynamic schedules, decode request sizes) through vLLM's own derivation, in one child; the model
    derives the same lists, or both reject."""
    from vllm_envs import installed

    from contract.real.installed import environment

    pkg = installed("0.34.0")
    data = branch_sizes._observe(environment("0.34.0"), MRV2, drawn, None, 600, "vLLM 0.34.0", "0.34.0", pkg, None)
    side = real_sizes.judged(MRV2.sizes, "0.34", drawn, data, "0.34")
    assert real_sizes.disagreements(MRV2.sizes, side, drawn, "0.34") == []
    assert not [g for g in side.found if "+" not in g.kind], [g.title for g in side.found]
    _only_dynamic_schedules_split_the_ranks(side.found)


def _only_dynamic_schedules_split_the_ranks(found: dict) -> None:
    """On two DP ranks, the gaps are of dynamic speculative decoding alone: ranks whose batches run
    at different query lengths (a decode batch beside an idle rank's dummy batch, of the widest
    length, or beside a decode batch of another tier) disagree on the uniform token count, so
    vLLM's sync drops both to the mixed mode (``34:v1/worker/gpu/dp_utils.py:100-105``)."""
    ranked = {g: where for g, where in found.items() if "+" in g.kind}
    assert {(g.kind.split("+")[1] in ("idle", "decode"), g.what) for g in ranked} <= {(True, sizes.WEAKER)}, ranked
    assert all(s.num_speculative_tokens_per_batch_size for where in ranked.values() for s in where), ranked


def _conforms(release: str, family=MRV2) -> dict:
    """vLLM's derived lists equal the model's on every setting; the gaps vLLM's dispatch shows (signature
    -> setting -> batches)."""
    settings, data = _release_side(release, family)
    side = real_sizes.judged(family.sizes, release, settings, data, release)
    disagree = real_sizes.disagreements(family.sizes, side, settings, release)
    assert disagree == [], disagree[:3]
    assert len(side.derived) == len(settings)
    return side.found


@pytest.mark.conformance
def test_the_model_derives_what_vllm_0_34_derives_and_its_dispatch_leaves_no_gap_on_one_rank():
    """One rank: no gap. Two DP ranks: an idle rank's dummy batch beside a decode batch of a shorter
    query length under dynamic speculative decoding (``docs/properties.md``, P9)."""
    found = _conforms("0.34")
    assert {(g.kind, g.served) for g in found} == {("decode+idle", PIECEWISE.name), ("decode+idle", NONE.name)}
    _only_dynamic_schedules_split_the_ranks(found)


@pytest.mark.evidence
@pytest.mark.conformance
def test_the_model_derives_what_vllm_0_33_derives_and_its_dispatch_misses_dynamic_decode_graphs():
    """0.33.0's dispatch walks one ladder of token counts for every query length, so under dynamic
    speculative decoding a decode batch whose next level is another query length's graph takes the
    PIECEWISE graph, or none, though its own is captured (bugs/mrv2-dynamic-sd-decode-graph-shadowed,
    vLLM #56136; 0.34.0 ladders each query length apart, above). Every other setting leaves no gap."""
    settings, data = _release_side("0.33")
    side = real_sizes.judged(MRV2.sizes, "0.33", settings, data, "0.33")
    assert real_sizes.disagreements(MRV2.sizes, side, settings, "0.33") == []
    one_rank = {g: where for g, where in side.found.items() if "+" not in g.kind}
    assert {(g.kind, g.served, g.what) for g in one_rank} == {
        (kind, served, sizes.WEAKER) for kind in ("decode", "partial") for served in (PIECEWISE.name, NONE.name)}
    _only_dynamic_schedules_split_the_ranks(side.found)
    showing = {s for where in one_rank.values() for s in where}
    assert all(s.num_speculative_tokens_per_batch_size for s in showing)
    assert {(s.max_num_seqs, s.cudagraph_mode) for s in showing} == {(100, "FULL_AND_PIECEWISE"),
                                                                     (100, "FULL_DECODE_ONLY")}


@pytest.mark.evidence
@pytest.mark.conformance
def test_model_runner_v1_keys_what_vllm_0_33_keys_and_its_dispatch_leaves_no_gap():
    """Model Runner V1's resolution rounds the sizes for speculative decoding and its dispatcher keys
    them: the model's lists are vLLM's on every setting, and no batch falls below its best graph."""
    assert _conforms("0.33", by_name("mrv1")) == {}


def cli(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "contract.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, **(env or {})}, timeout=900)


@pytest.mark.evidence  # make test's branch check on the size grid is the found bug's (tests/test_bugs.py)
@pytest.mark.conformance
def test_an_edited_0_34_tree_that_truncates_the_size_ladder_gives_a_new_p8_class(tmp_path):
    """A hand edit of 0.34.0's size derivation (``tests/trees.py``, "sizes"), checked on a size witness
    alone: a new P8 class with its witness file; the unedited tree on the same witness: nothing new."""
    import trees

    tree = trees.edited("0.34.0", "sizes", tmp_path / "tree")
    witness = tmp_path / "witness.json"
    gap = Gap("mixed", "PIECEWISE", "NONE", sizes.WEAKER)
    witness.write_text(json.dumps(sizes.witness_json(SizeSetting(64), gap, [], "0.34.0")))
    env = {"CUDAGRAPH_CONTRACT_CACHE": str(tmp_path / "cache")}
    done = cli("conform", "--vllm-src", tree, "--base", "0.34.0", "--traces", witness, "--reports", tmp_path / "r",
               env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "config/vllm.py: VllmConfig._set_cudagraph_sizes changed: replayed" in done.stdout, done.stdout
    assert "capture sizes: 1 settings" in done.stdout and "1 new" in done.stdout, done.stdout
    assert "; 1 new capture-size class(es)" in done.stdout and "nothing new" not in done.stdout, done.stdout
    assert "new: [silent eager fallback] P8 mixed batches a PIECEWISE graph could serve run eagerly — witness" \
        in done.stdout, done.stdout
    assert "8 of 129 mixed batches (tokens 121, 122, 123, 124, 125, 126, ...)" in done.stdout, done.stdout
    written = sorted(p.relative_to(tmp_path / "r") for p in (tmp_path / "r" / "sizes").rglob("*.json"))
    assert len(written) == 1 and written[0].parts[:2] == ("sizes", "new")
    again = json.loads((tmp_path / "r" / written[0]).read_text())
    assert sizes.witness_setting(again, "again") == SizeSetting(64)
    clean = cli("conform", "--vllm-src", trees.copy("0.34.0", tmp_path / "unedited"), "--base", "0.34.0",
                "--traces", witness, "--reports", tmp_path / "r2", env=env)
    assert clean.returncode == 0 and "0 new" in clean.stdout, clean.stdout + clean.stderr


@pytest.mark.evidence  # the second edit of the size derivation, beside the truncated ladder above
@pytest.mark.conformance
def test_an_edited_0_34_tree_that_captures_a_mode_not_configured_gives_a_monotonicity_class(tmp_path):
    """A hand edit of 0.34.0's manager (``tests/trees.py``, "unconfigured"): under FULL_DECODE_ONLY mixed
    batches take FULL graphs, which the configured mode does not name for them."""
    import trees

    tree = trees.edited("0.34.0", "unconfigured", tmp_path / "tree")
    witness = tmp_path / "witness.json"
    gap = Gap("mixed", "FULL_DECODE_ONLY", "FULL", sizes.UNCONFIGURED)
    witness.write_text(json.dumps(sizes.witness_json(SizeSetting(8, cudagraph_mode="FULL_DECODE_ONLY"), gap, [],
                                                     "0.34.0")))
    done = cli("conform", "--vllm-src", tree, "--base", "0.34.0", "--traces", witness, "--reports", tmp_path / "r",
               env={"CUDAGRAPH_CONTRACT_CACHE": str(tmp_path / "cache")})
    assert done.returncode == 1, done.stdout + done.stderr
    assert ("new: [graph of a mode not configured] P8 mixed batches take FULL graphs, a mode cudagraph_mode "
            "FULL_DECODE_ONLY does not name — witness") in done.stdout, done.stdout


@pytest.mark.evidence
@pytest.mark.conformance
def test_a_crash_in_the_edited_dispatch_is_a_p0_class_with_its_line(tmp_path):
    """tests/trees.py's "dispatch" edit indexes past the largest decode graph: the grid's decode batch
    past it raises in vLLM's dispatch, a new P0 class naming the line, and the lists it derived stand."""
    import trees

    tree = trees.edited("0.34.0", "dispatch", tmp_path / "tree")
    witness = tmp_path / "witness.json"
    witness.write_text(json.dumps(sizes.witness_json(SizeSetting(100, 6), Gap("decode", "FULL", "NONE", sizes.WEAKER),
                                                     [], "0.34.0")))
    done = cli("conform", "--vllm-src", tree, "--base", "0.34.0", "--traces", witness, "--reports", tmp_path / "r",
               env={"CUDAGRAPH_CONTRACT_CACHE": str(tmp_path / "cache")})
    assert done.returncode == 1, done.stdout + done.stderr
    assert ("new: [crash when serving] P0 vLLM stops when serving: IndexError: list index out of range at "
            "vllm/v1/worker/gpu/cudagraph_utils.py:") in done.stdout, done.stdout
    assert "derives other capture sizes" not in done.stdout, done.stdout


@pytest.mark.conformance
def test_a_broken_size_witness_is_one_line_and_exit_2(tmp_path):
    from vllm_envs import installed

    witness = tmp_path / "w.json"
    data = sizes.witness_json(SizeSetting(8), Gap("mixed", "PIECEWISE", "NONE", sizes.WEAKER), [], "0.34.0")
    witness.write_text(json.dumps({**data, "setting": {**data["setting"], "max_num_seqs": -1}}))
    done = cli("conform", "--vllm-src", installed("0.34.0").parent, "--base", "0.34.0", "--traces", witness,
               "--reports", tmp_path / "r")
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"error: {witness} is not a size witness: its setting needs max_num_seqs"), done.stderr
    assert not (tmp_path / "r").exists()
