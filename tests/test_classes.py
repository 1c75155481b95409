"""Violation classes: the explorer splits a property cell into the causes behind it, each with its
own shortest witness; the differential says what a branch adds, removes and shares with its base."""

import json
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from contract.core.classes import NESTED, NO_CAPTURER, OUTSIDE_WINDOW_SILENT, deviations
from contract.cli import app
from contract.core.differential import BaseMismatch, compare
from contract.families import MUTANTS, mutant_policy
from contract.families import BUILT_IN, load_policy
from contract.core.trace import replay
from explored import GROUP, explored

pytestmark = GROUP

runner = CliRunner()


def titles(classes):
    return [c.title for c in classes]


def test_vllm_0_30_p1_splits_into_its_causes():
    p1 = explored("vllm_0_30").classes_of("P1")
    where = {c.where for c in p1 if c.signature.role == "target"}
    # the three causes behind the one P1 cell
    assert "breakable on + micro-batching on" in where
    assert any(w.startswith("cudagraph_mode FULL + attention support") for w in where)  # compiled under FULL, upgraded
    assert any("compilation NONE + splitting_ops ATTENTION" in w and "drafter" in w for w in where)
    ids = [c.id for c in p1]
    assert len(ids) == len(set(ids)) >= 3


@pytest.mark.parametrize("name", BUILT_IN)
def test_every_class_has_its_own_shortest_witness(name):
    ex = explored(name)
    assert ex.classes
    for c in ex.classes:
        rep = replay(c.witness, load_policy(name))
        assert not rep.mismatches
        # the witness shows the class's signature and the settings are exactly its scenario's
        shown = {(v.property) for v in rep.violations}
        assert c.signature.property in shown
        devs = deviations(c.witness.scenario)
        assert {s.field for s in c.settings} == set(devs)
        assert all(devs[s.field] in s.values for s in c.settings)
    # a class's witness is no longer than any occurrence of its signature under the same settings
    for c in ex.classes:
        lengths = [len(o.events) for o in ex.occurrences[c.signature]
                   if all(deviations(o.scenario).get(s.field) in s.values for s in c.settings)
                   and set(deviations(o.scenario)) == {s.field for s in c.settings}]
        assert c.length == min(lengths)


def test_settings_are_minimal():
    """No class of a signature holds under a strict superset of another class's settings."""
    for name in BUILT_IN:
        ex = explored(name)
        for a in ex.classes:
            for b in ex.classes:
                if a is not b and a.signature == b.signature:
                    fa = {s.field: set(s.values) for s in a.settings}
                    fb = {s.field: set(s.values) for s in b.settings}
                    assert not (set(fa) < set(fb) and all(fa[k] & fb[k] for k in fa)), (a.title, b.title)


@pytest.mark.parametrize("name", BUILT_IN)
def test_a_policy_against_itself_shows_nothing_new(name):
    d = compare(load_policy(name), load_policy(name), branch_exploration=explored(name), base_exploration=explored(name))
    assert not d.new and not d.fixed
    assert len(d.inherited) == len(explored(name).classes)


WHAT = {  # what each load_model mutant's name says, as the class that is new
    "breakable_match_any_nested": ("P1", "target", "FULL", NESTED),
    "elif_restored": ("P1", "target", "FULL", NO_CAPTURER),
    "drafter_unwrapped": ("P1", "drafter", "PIECEWISE", NO_CAPTURER),
    "breakable_under_ubatching": ("P6", "target", "-", "unwrap stops at a wrapper"),
    "non_recursive_unwrap": ("P6", "target", "-", "unwrap stops at a wrapper"),
    "capture_window_never_closed": ("P4", "drafter", "PIECEWISE", OUTSIDE_WINDOW_SILENT),
}


@pytest.mark.parametrize("mutant", [m for m in MUTANTS if m.area == "policy" or m.name in WHAT], ids=lambda m: m.name)
def test_policy_mutants_show_a_new_class_that_names_them(mutant):
    d = compare(mutant_policy(mutant), load_policy(mutant.base), base_exploration=explored(mutant.base))
    if mutant.equivalent:
        assert not d.new and not d.fixed
        return
    assert d.new, f"{mutant.name} shows nothing new against {mutant.base}"
    wanted = WHAT[mutant.name]
    assert any((c.signature.property, c.signature.role, c.signature.runtime_mode, c.signature.what) == wanted
               for c in d.new), titles(d.new)
    for c in d.new:  # each new witness fails under the mutant and not under the base
        assert not replay(c.witness, mutant_policy(mutant)).mismatches


def test_draft_against_0_30_shows_its_own_defects():
    d = compare(load_policy("pr56312_draft"), load_policy("vllm_0_30"),
                branch_exploration=explored("pr56312_draft"), base_exploration=explored("vllm_0_30"))
    # the drafter under a FULL target: no breakable wrapper, since FULL has no piecewise graphs
    drafter = [c for c in d.new if c.signature.role == "drafter" and c.where == "breakable on + cudagraph_mode FULL + drafter WITH_MODEL"]
    assert drafter and drafter[0].signature.what == NO_CAPTURER
    # the late FULL -> FULL_AND_PIECEWISE upgrade leaves the target's PIECEWISE without a capturer
    upgrade = [c for c in d.new if c.signature.role == "target" and "cudagraph_mode FULL +" in c.where]
    assert upgrade and upgrade[0].signature.what == NO_CAPTURER
    # resolved after load_model wrapped for FULL (the first resolve runs in profile_cudagraph_memory)
    assert "FULL_AND_PIECEWISE" in [s.get("cudagraph_mode") for s in upgrade[0].witness.expected_steps]
    # and 0.30's P4 (the drafter captured after the window) is one the draft does not have
    # (and the capture guard stopping vLLM there, P0 when serving); no graph is lost there, so fixed, not traded
    assert [c.signature.property for c in d.fixed] == ["P0", "P4"] and not d.traded


def test_base_of_another_runner_is_refused():
    mrv1 = [n for n in BUILT_IN if load_policy(n).runner.value == "MRV1"][0]
    mrv2 = [n for n in BUILT_IN if load_policy(n).runner.value == "MRV2"]
    if not mrv2:
        pytest.skip("no MRV2 policy")
    with pytest.raises(BaseMismatch):
        compare(load_policy(mrv1), load_policy(mrv2[0]))


NESTED_FULL = '''
from contract.api import *

def load_model(ctx: LoadContext) -> Stacks:
    model, drafter = ctx.model, ctx.drafter_model
    if ctx.breakable and ctx.cudagraph_mode != NONE and not ctx.use_ubatching:
        model = BreakableCUDAGraphWrapper(model, runtime_mode=FULL)
        if drafter is not None:
            drafter = BreakableCUDAGraphWrapper(drafter, runtime_mode=PIECEWISE)
    if ctx.cudagraph_mode.has_full_cudagraphs() and not ctx.use_ubatching:
        model = CUDAGraphWrapper(model, runtime_mode=FULL)
    elif ctx.use_ubatching:
        model = UBatchWrapper(model, FULL if ctx.cudagraph_mode.has_full_cudagraphs() else NONE)
    return Stacks(model, drafter)
'''


def test_explore_base_cli_lists_new_fixed_inherited(tmp_path):
    path = tmp_path / "nested_full.py"
    path.write_text(NESTED_FULL)
    result = runner.invoke(app, ["explore", "--policy", str(path), "--base", "vllm_0_30", "--json",
                                 "--out", str(tmp_path / "out")])
    assert result.exit_code == 1, result.output
    payload = json.loads(result.stdout)["nested_full"]["differential"]
    assert set(payload) >= {"new", "fixed", "inherited", "base", "base_chosen"}
    assert payload["base"] == "vllm_0_30"
    nested = [c for c in payload["new"] if c["what"] == NESTED]
    assert nested and nested[0]["runtime_mode"] == "FULL" and nested[0]["witness"]["events"]
    assert not payload["fixed"] and payload["inherited"]
    assert (tmp_path / "out" / "new" / f"nested_full-{nested[0]['id']}.json").is_file()
    # the same policy as its own base: nothing new, exit 0
    same = runner.invoke(app, ["explore", "--policy", "vllm_0_30", "--base", "vllm_0_30"])
    assert same.exit_code == 0, same.output
    assert "nothing new" in same.output


@pytest.mark.parametrize("base", ["vllm_9", "no/such/tree", "0.99.0"])
def test_bad_base_is_one_line_and_exit_2(base):
    result = runner.invoke(app, ["explore", "--policy", "vllm_0_30", "--base", base, "--depth", "2"])
    assert result.exit_code == 2, result.output
    assert len([line for line in result.output.splitlines() if line.strip()]) == 1


def test_a_branch_refusing_at_start_up_what_its_base_starts_is_a_new_crash_at_start_up():
    """Records of a release whose resolve refuses FULL on a NEVER backend, against one where the same
    scenario starts: the refusal is the differential's class, not lost graphs, though the base runs
    mixed batches eagerly there (P1, a silent eager fallback); where both refuse, or only the base
    does, there is none."""
    from contract.core.classes import NEWLY_REFUSED, REFUSED, Severity, severity
    from contract.core.differential import lost_occurrence
    from contract.core.graphs import run_script
    from contract.core.modes import AttentionCGSupport, CUDAGraphMode
    from contract.core.scenario import Runner, Scenario

    policy = load_policy("mrv2_0_34")
    # The base's scenario, whose records are judged for the base's violations.
    s = Scenario(runner=Runner.MRV2, cudagraph_mode=CUDAGraphMode.FULL,
                 attention_support=AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE)
    starts, refuses = run_script(s, policy), run_script(replace(s, attention_support=AttentionCGSupport.NEVER), policy)
    assert refuses[-1].halted and not starts[-1].halted
    [(sig, occurrence)] = lost_occurrence(0, s, starts, refuses, Runner.MRV2).items()
    assert (sig.property, sig.what) == (REFUSED, NEWLY_REFUSED) and "NEVER" in sig.detail
    assert occurrence.step == refuses[-1].index and severity(sig) is Severity.CRASH_START_UP
    assert not [sig for sig in lost_occurrence(0, s, refuses, refuses, Runner.MRV2) if sig.property == REFUSED]
    assert not [sig for sig in lost_occurrence(0, s, refuses, starts, Runner.MRV2) if sig.property == REFUSED]


def test_refusing_what_the_base_runs_broken_is_a_fix_not_a_new_class():
    """0.34.0 refuses a hybrid model whose Mamba cache has fewer blocks than max_num_seqs; the mutant
    without that check captures FULL graphs its Mamba kernel cannot run (P7). Against that mutant as
    the base, 0.34.0's refusal is neither a new class nor lost graphs: it is how the P7 is fixed."""
    from contract.core.classes import REFUSED
    from contract.core.differential import lost_occurrence
    from contract.core.graphs import run_script
    from contract.core.scenario import Runner, Scenario

    fixed = load_policy("mrv2_0_34")
    broken = mutant_policy(next(m for m in MUTANTS if m.name == "mrv2_mamba_blocks_unchecked"))
    s = Scenario(runner=Runner.MRV2, mamba_cache_blocks=1)
    refuses, runs_broken = run_script(s, fixed), run_script(s, broken)
    assert refuses[-1].halted and not runs_broken[-1].halted
    assert lost_occurrence(0, s, runs_broken, refuses, Runner.MRV2) == {}
    # The same base with its graphs' dispatches left out shows no P7: the refusal is new again.
    clean = [replace(r, dispatches=()) for r in runs_broken]
    assert [sig.property for sig in lost_occurrence(0, s, clean, refuses, Runner.MRV2)] == [REFUSED]
