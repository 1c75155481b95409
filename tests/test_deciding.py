"""The deciding lines of a violation: the line tracer (``contract/real/lines.py``) on
code standing in for vLLM's, the difference and ranking of two replays and the nearest neighbour
(``contract/evidence/deciding.py``), the history of a statement (``contract/evidence/since.py``),
and, where vLLM 0.30.0 is installed, the P4 witness on its real code."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from contract.real import lines
from contract.evidence import deciding, since
from contract.core.explore import explore
from contract.core.modes import FULL_AND_PIECEWISE
from contract.families import load_policy
from contract.core.trace import load

ROOT = Path(__file__).resolve().parents[1]
P4 = ROOT / "tests" / "traces" / "lead3-drafter-capture-outside-window.json"

MODULE = '''import functools


def deco(f):
    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        return f(*args, **kwargs)
    return wrapper


class Runner:
    @deco
    def decide(self, capturing, mode, eager):
        use = (
            (capturing and mode == "PIECEWISE")
            or (not capturing and mode != "NONE")
        ) and not eager
        if use:
            out = "graph"
        elif mode == "FULL":
            out = "full"
        else:
            out = "eager"
        pad = 1 if capturing else 2
        assert out != "boom"
        return out, helper(mode), pad


def helper(mode):
    n = 0
    while n < 2:
        n += 1
    if mode == "NONE":
        raise RuntimeError("no mode here")
    return n


def guarded(flag):
    try:
        return helper("NONE")
    finally:
        if flag:
            flag.append(1)


def flags(obj, a, b):
    obj.flag = a and b
    return a != b


def closed(a, b):
    if (
        a
        and b
    ):
        return 1
    return 0
'''


@pytest.fixture()
def traced(tmp_path):
    """The stand-in module under a ``vllm`` folder, and a tracer rooted at ``Runner.decide`` and
    ``guarded``."""
    package = tmp_path / "vllm"
    path = package / "v1" / "worker" / "stand_in.py"
    path.parent.mkdir(parents=True)
    path.write_text(MODULE, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("stand_in_decide", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # Runner.decide's code starts at its decorator; guarded at its def.
    tracer = lines.Tracer([package], {("v1/worker/stand_in.py", 12), ("v1/worker/stand_in.py", 38),
                                                   ("v1/worker/stand_in.py", 46), ("v1/worker/stand_in.py", 51)})
    return module, tracer


def _run(tracer, step, call):
    tracer.step = step
    tracer.install()
    try:
        return call()
    except RuntimeError:
        return None
    finally:
        tracer.uninstall()


def _by_line(tracer) -> dict:
    return {tuple(s["lines"]): s for s in tracer.executions.to_json()}


def test_each_branch_records_which_way_it_went_and_which_operands_ran(traced):
    module, tracer = traced
    runner = module.Runner()
    _run(tracer, 0, lambda: runner.decide(True, "PIECEWISE", False))
    _run(tracer, 1, lambda: runner.decide(True, "FULL", False))
    got = _by_line(tracer)
    use = got[(14, 17)]
    assert use["function"] == "Runner.decide" and use["def"] == [12, 26] and use["kind"] == "assign"
    assert use["text"].startswith("use = (")
    (primary, detail, n), = use["steps"]["0"]
    assert primary == "use = True" and n == 1
    assert detail == 'capturing: T · mode == "PIECEWISE": T · not capturing: - · mode != "NONE": - · not eager: T'
    (primary, detail, _), = use["steps"]["1"]
    assert primary == "use = False" and detail.startswith('capturing: T · mode == "PIECEWISE": F · not capturing: F')
    assert got[(18, 18)]["steps"] == {"0": [["true", "", 1]], "1": [["false", "", 1]]}
    assert got[(20, 20)]["kind"] == "elif" and got[(20, 20)]["steps"] == {"1": [["true", "", 1]]}
    assert got[(24, 24)]["steps"]["0"] == [["pad = 1", "capturing: T", 1]]
    assert got[(25, 25)]["steps"]["0"] == [["passed", "", 1]]
    # the callee of a root is traced: its loop test ran three times, twice true
    assert got[(31, 31)]["function"] == "helper" and got[(31, 31)]["steps"]["0"] == [["false", "", 1], ["true", "", 2]]


def test_values_stored_in_attributes_and_returned_conditions_are_read(traced):
    module, tracer = traced
    import types

    obj = types.SimpleNamespace()
    _run(tracer, 0, lambda: module.flags(obj, True, False))
    got = _by_line(tracer)
    assert got[(47, 47)]["steps"]["0"] == [["obj.flag = False", "a: T · b: F", 1]]
    assert got[(48, 48)]["kind"] == "return" and got[(48, 48)]["steps"]["0"] == [["return True", "", 1]]


def test_a_parenthesised_condition_ends_at_its_colon(traced):
    module, tracer = traced
    _run(tracer, 0, lambda: module.closed(True, False))
    (got,) = tracer.executions.to_json()
    assert got["lines"] == [52, 55] and got["text"] == "if (\n    a\n    and b\n):"
    assert got["steps"]["0"] == [["false", "a: T · b: F", 1]]


def test_a_crash_names_the_raise_and_the_callers_statements(traced):
    module, tracer = traced
    _run(tracer, 0, lambda: module.Runner().decide(False, "NONE", False))
    chain = tracer.crash([{"halted": "RuntimeError: no mode here"}])
    assert [(c["function"], c["kind"], c["lines"]) for c in chain] == [
        ("helper", "raise", [34, 34]), ("Runner.decide", "return", [26, 26])]
    assert chain[0]["text"] == 'raise RuntimeError("no mode here")'
    assert tracer.crash([{"halted": "AssertionError"}]) == []
    assert tracer.crash([{}]) == []


def test_a_test_decided_before_an_exception_left_the_frame_is_not_a_raise(traced):
    module, tracer = traced
    flag = []
    _run(tracer, 0, lambda: module.guarded(flag))
    _run(tracer, 1, lambda: module.guarded([0]))
    assert _by_line(tracer)[(42, 42)]["steps"] == {"0": [["false", "", 1]], "1": [["true", "", 1]]}


def test_frames_outside_a_root_are_not_traced(traced):
    module, tracer = traced
    _run(tracer, 0, lambda: module.helper("FULL"))
    assert tracer.executions.to_json() == [] and tracer.frames == 0


def _statement(path, function, lines, kind, text, steps, def_lines=(1, 100)):
    return {"path": path, "function": function, "def": list(def_lines), "lines": list(lines), "kind": kind,
            "text": text, "steps": steps}


def _result(statements, path=(), crash=()):
    where = {"F.violating": {"owner": "vLLM", "path": "a.py", "lines": [1, 100]}}
    return {"statements": statements, "crash": list(crash), "where": where,
            "decision_path": [{"event": "config", "points": []}] + [{"event": "e", "points": list(p)} for p in path]}


def test_deciding_keeps_differing_outcomes_up_to_the_violating_step_and_ranks_them():
    flag = _statement("a.py", "F.violating", (5, 5), "if", "if self.compilation_config.cudagraph_mode == CUDAGraphMode.FULL:",
                      {"1": [["true", "", 1]]})
    late = _statement("a.py", "F.violating", (9, 9), "if", "if entry is None:", {"2": [["true", "", 1]]})
    after = _statement("a.py", "F.violating", (11, 11), "if", "if x:", {"3": [["true", "", 1]]})
    feeder = _statement("b.py", "G.caller", (20, 22), "assign", "use = mode == PIECEWISE and capturing",
                        {"1": [["use = False", "", 2]]}, def_lines=(10, 30))
    reader = _statement("a.py", "F.violating", (7, 7), "assign", "skip = not use", {"1": [["skip = True", "", 2]]})
    other = _statement("c.py", "H.other", (3, 3), "if", "if n > 2:", {"1": [["true", "", 1]]}, def_lines=(1, 9))
    same = _statement("c.py", "H.other", (5, 5), "if", "if m:", {"1": [["true", "", 1]]}, def_lines=(1, 9))
    only = _statement("c.py", "H.other", (7, 7), "if", "if k:", {"1": [["true", "", 1]]}, def_lines=(1, 9))
    mine = _result([flag, late, after, feeder, reader, other, same, only], path=[[], [], ["F.violating"]],
                   crash=[{"path": "m.py", "function": "guard", "def": [1, 4], "lines": [3, 3], "kind": "raise",
                           "text": "raise RuntimeError('x')", "message": "RuntimeError: x"}])

    def flipped(s, value):
        return {**s, "steps": {k: [[value, "", 1]] for k in s["steps"]}}

    theirs = _result([flipped(flag, "false"), flipped(late, "false"), flipped(after, "false"),
                      flipped(feeder, "use = True"), flipped(reader, "skip = False"), flipped(other, "false"), same])
    got = deciding.deciding(mine, theirs, 2, ("cudagraph_mode",))
    assert [(d.function, d.lines[0], d.role) for d in got] == [
        ("guard", 3, "raise"),
        ("F.violating", 9, "branch"),  # the violating step
        ("F.violating", 7, "branch"),  # earlier, in a function on the violating step's path
        ("G.caller", 20, "branch"),  # assigns `use`, which the statement above reads
        ("H.other", 3, "branch"),
    ]  # not: the branch on the differing setting, a step after the violation, equal or one-sided outcomes
    assert got[1].on_path and got[1].witness == [["true", "", 1]] and got[1].neighbour == [["false", "", 1]]
    assert [d.lines[0] for d in deciding.setting_reads(mine, theirs, 2, ("cudagraph_mode",))] == [5]
    alone = deciding.deciding(_result([flag]), _result([flipped(flag, "false")]), 2, ("cudagraph_mode",))
    assert [d.lines[0] for d in alone] == [5] and alone[0].explained_by_setting
    assert len(deciding.deciding(mine, theirs, 2, ("cudagraph_mode",), limit=2)) == 2


@pytest.mark.parametrize("kind, text, fields, expected", [
    ("if", "if self.compilation_config.cudagraph_mode == CUDAGraphMode.NONE:", ("cudagraph_mode",), True),
    ("elif", "elif self.compilation_config.cudagraph_mode.has_full_cudagraphs():", ("cudagraph_mode",), True),
    ("if", "if cudagraph_runtime_mode == CUDAGraphMode.NONE:", ("cudagraph_mode",), False),
    ("if", "if self.compilation_config.cudagraph_mode == CUDAGraphMode.NONE:", ("breakable",), False),
    ("assign", "use_cudagraphs = (is_graph_capturing and cudagraph_runtime_mode == CUDAGraphMode.PIECEWISE)",
     ("cudagraph_mode",), False),
    ("if", "if envs.VLLM_USE_BREAKABLE_CUDAGRAPH:", ("breakable",), True),
    ("assert", "assert self.speculative_config is not None, 'msg'", ("drafter",), True),
])
def test_the_setting_rule(kind, text, fields, expected):
    assert deciding.explained_by_setting(kind, text, fields) is expected


def test_the_nearest_neighbour_of_the_p4_witness_keeps_its_wrappers():
    """Two scenarios are one field from the witness and equally default-like (breakable off,
    FULL_AND_PIECEWISE); the one whose model steps look like the witness's is chosen: with
    FULL_AND_PIECEWISE the same breakable wrapper replays the drafter's PIECEWISE dispatch."""
    trace = load(P4)
    policy = load_policy(trace.policy)
    signature, step = deciding.violation(trace.scenario, trace.events, policy)
    assert (signature.property, step) == ("P0", 4)  # the capture guard stops vLLM (P0) where it refuses the capture (P4)
    exploration = explore(policy, classify=True)
    neighbour = deciding.nearest_neighbour(trace.scenario, trace.events, signature, step,
                                           exploration.occurrences, exploration.scenario_list, policy)
    assert neighbour.differing == ("cudagraph_mode",) and neighbour.scenario.cudagraph_mode == FULL_AND_PIECEWISE
    assert neighbour.events == tuple(trace.events) and deciding.violation(neighbour.scenario, trace.events, policy) is None
    assert neighbour.scenario not in {o.scenario for o in exploration.occurrences[signature]}
    import dataclasses

    off = dataclasses.replace(trace.scenario, breakable=False)
    given = deciding.given_neighbour(trace.scenario, off, trace.events, policy)
    assert given.chosen == "given" and given.differing == ("breakable",)
    # a neighbour whose runner stops earlier replays the events as far as it takes them
    assert len(deciding.takes(dataclasses.replace(trace.scenario, drafter=type(trace.scenario.drafter).NONE,
                                                  uniform_decode_query_len=1), trace.events, policy)) == 4


def _release(folder: Path, release: str, body: str) -> None:
    path = folder / release / "vllm" / "v1" / "m.py"
    path.parent.mkdir(parents=True)
    path.write_text(body, encoding="utf-8")


def test_since_finds_the_first_release_of_a_form_and_the_forms_around_it(tmp_path, monkeypatch):
    folder = tmp_path / "sources"
    _release(folder, "0.28.0", "class R:\n    def run(self, a, b):\n        if a:\n            return 1\n")
    _release(folder, "0.29.0", "class R:\n    def run(self, a, b):\n        x = 0\n        if a and b:\n            return 1\n")
    _release(folder, "0.30.0", "class R:\n    def run(self, a, b):\n        if a and b:\n            return 1\n")
    _release(folder, "0.31.0", "class R:\n    def run(self, a, b):\n        if a and (b or a):\n            return 1\n")
    _release(folder, "0.33.0", "class R:\n    pass\n")
    monkeypatch.setenv(since.ENV, str(folder))
    releases = since.sources(tmp_path / "no-venvs")
    assert sorted(releases) == ["0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.33.0"]
    got = since.since("0.30.0", "v1/m.py", "R.run", [3, 3], releases)
    assert got["first"] == "0.29.0" and got["last"] == "0.30.0"
    assert got["history"]["0.29.0"]["lines"] == [4, 4]
    assert got["before"]["release"] == "0.28.0" and got["before"]["text"] == "if a:"
    assert got["after"]["release"] == "0.31.0" and got["after"]["text"] == "if a and (b or a):"
    assert got["unchecked"] == ["0.32.0", "0.34.0"] and got["oldest"] == "0.28.0"
    text = deciding.since_text(got)
    assert "in this form from 0.29.0" in text and "before, in 0.28.0: `if a:`" in text
    assert "changed in 0.31.0 to `if a and (b or a):`" in text
    gone = since.since("0.31.0", "v1/m.py", "R.run", [3, 3], releases)
    assert gone["after"] == {"release": "0.33.0", "present": False, "note": "v1/m.py has no R.run"}
    assert since.since("0.32.0", "v1/m.py", "R.run", [3, 3], releases) is None


@pytest.mark.conformance
@pytest.mark.evidence
def test_the_p4_witness_on_vllm_0_30_names_the_drafter_condition_and_the_guard(tmp_path):
    """On 0.30.0's code: the capture guard's raise, and ``_dummy_run``'s ``use_cudagraphs``
    condition, False in every capture of the witness, True in the neighbour's PIECEWISE captures."""
    from vllm_envs import require_python

    require_python("0.30.0")
    from contract.evidence import deciding_run

    neighbour = tmp_path / "neighbour.json"
    neighbour.write_text(json.dumps({**load(P4).scenario.to_json(), "cudagraph_mode": "FULL_AND_PIECEWISE"}))
    result = deciding_run.run(P4, "0.30.0", neighbour)
    assert result["witness"]["agrees"] and result["neighbour"]["agrees"]
    items = result["deciding"]
    assert len(items) <= deciding.LIMIT
    raise_ = items[0]
    assert (raise_["role"], raise_["path"], raise_["function"]) == ("raise", "compilation/monitor.py",
                                                                      "validate_cudagraph_capturing_enabled")
    assert items[1]["function"] == "BreakableCUDAGraphWrapper._capture" and items[1]["text"] == \
        "validate_cudagraph_capturing_enabled()"
    (use,) = [d for d in items if d["text"].startswith("use_cudagraphs = (")]
    assert use["function"] == "GPUModelRunner._dummy_run" and use["step"] == 3
    assert {p for p, _, _ in use["witness"]} == {"use_cudagraphs = False"}
    assert "use_cudagraphs = True" in {p for p, _, _ in use["neighbour"]}
    assert use["def_lines"][0] < use["lines"][0] <= use["lines"][1] < use["def_lines"][1]


def test_only_replaces_the_findings_it_traced_and_keeps_the_rest_in_the_runs_order():
    from contract.evidence.deciding_batch import merged

    before = {"vllm": "0.33.0", "findings": [{"name": "a", "at": 1}, {"name": "b", "at": 1}, {"name": "gone"}]}
    traced = {"vllm": "0.33.0", "seconds": {"child": 1.0}, "findings": [{"name": "c", "at": 2}, {"name": "b", "at": 2}]}
    order = [{"name": n} for n in ("c", "a", "b", "d")]
    assert merged(before, traced, order) == {"vllm": "0.33.0", "seconds": {"child": 1.0}, "findings": [
        {"name": "c", "at": 2}, {"name": "a", "at": 1}, {"name": "b", "at": 2}]}
