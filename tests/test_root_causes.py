"""Root causes: grouping by anchor and violation kind, the affected matrix, the pages and
``reports/findings.md`` (``contract/evidence/root_causes.py``, ``contract/reports/root_causes.py``)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from contract.core.scenario import Runner
from contract.evidence import root_causes as rc
from contract.evidence import severity
from contract.evidence.permalinks import parse
from contract.reports import first_screen
from contract.reports import root_causes as pages

ROOT = Path(__file__).resolve().parents[1]
REPORTS = ROOT / "reports"

ANCHOR_TEXT = ("if (\n    not compilation_config.cudagraph_mode.has_piecewise_cudagraphs()\n"
               "    or compilation_config.use_inductor_graph_partition\n):")
ANCHOR = {"path": "compilation/backends.py", "function": "wrap_with_cudagraph_if_needed", "def_lines": [633, 684],
          "lines": [655, 658], "text": ANCHOR_TEXT, "kind": "if", "step": 1, "witness": [["true", "", 2]],
          "neighbour": [["false", "", 2]], "role": "branch", "explained_by_setting": False}
NOISE = {"path": "compilation/cuda_graph.py", "function": "CUDAGraphWrapper.__call__", "def_lines": [235, 363],
         "lines": [268, 268], "text": "if self.cudagraph_options.debug_log_enable:", "kind": "if", "step": 3,
         "witness": [["true", "", 2]], "neighbour": [["false", "", 2]], "role": "branch", "explained_by_setting": False}
P1 = {"property": "P1", "role": "target", "runtime_mode": "PIECEWISE", "what": "no capturer"}


def fix_json(anchor_text: str = "if not compilation_config.cudagraph_mode.has_piecewise_cudagraphs() "
                                "or compilation_config.use_inductor_graph_partition:", kind=None, **extra) -> dict:
    return {"root_cause": "compiled-before-piecewise-upgrade", "title": "t",
            "kind": kind or {"property": "P1", "what": "no capturer"},
            "anchors": [{"path": "compilation/backends.py", "function": "wrap_with_cudagraph_if_needed",
                         "statement": anchor_text}],
            "test": "test_x.py", "expected": {"0.29.0": "fail", "0.30.0": "fail", "0.34.0": "fail"},
            "covers": [["MRV1", "target"], ["MRV2", "target"]], **extra}


def known(*args, **kwargs) -> rc.Known:
    return rc.Known.from_json(fix_json(*args, **kwargs), "fixes/compiled-before-piecewise-upgrade")


def entry(name: str, deciding: list[dict], release: str = "0.30.0", policy: str = "vllm_0_30",
          signature: dict = P1, runner: Runner = Runner.MRV1, klass: bool = True) -> rc.Entry:
    source = f"reports/{policy}/classes/{name}.json" if klass else f"tests/traces/{name}.json"
    return rc.Entry(release, runner, policy, f"{policy}-{name}" if klass else name, source, signature, 3,
                    deciding, {"describe": "cudagraph_mode FULL → FULL_AND_PIECEWISE"},
                    [{"kind": "load_model"}, {"kind": "profile_run"}, {"kind": "resolve"}, {"kind": "capture_model"}])


# -- statements and kinds ----------------------------------------------------------------------------

def test_statement_forms_ignore_line_breaks_and_the_colon():
    one_line = "if not compilation_config.cudagraph_mode.has_piecewise_cudagraphs() or compilation_config." \
               "use_inductor_graph_partition:"
    assert rc.normalise(ANCHOR_TEXT, "if") == rc.normalise(one_line) == rc.normalise("elif" + one_line[2:])
    assert rc.normalise("x = (\n  a\n  and b\n)") == rc.normalise("x = a and b")
    assert rc.normalise("if a and b:") != rc.normalise("if a or b:")


def test_kind_is_property_and_what_and_a_halts_exception():
    assert rc.kind_of(P1) == {"property": "P1", "what": "no capturer"}
    halt = {"property": "halt", "role": "-", "runtime_mode": "-", "what": "vLLM stops", "detail": "AssertionError"}
    stop = {"property": "P0", "role": "-", "runtime_mode": "-", "what": "vLLM stops at start-up",
            "detail": "AssertionError: assert mode.has_full_cudagraphs()"}
    assert rc.kind_of(halt) == rc.kind_of(stop) == {"property": "P0", "detail": "AssertionError"}  # data before P0
    assert rc.kind_matches({"property": "P0", "detail": "AssertionError"}, halt)
    assert not rc.kind_matches({"property": "P0", "detail": "ValueError"}, stop)
    assert not rc.kind_matches({"property": "P4"}, P1)


def test_severity_orders_crash_over_wrong_result_over_eager_over_log_and_drops_refusals():
    halt = {"property": "halt", "what": "vLLM stops", "detail": "AssertionError"}
    p4 = {"property": "P4", "what": "capture outside the capture phase"}
    p5 = {"property": "P5", "what": "replay of an entry captured under another mode"}
    p3 = {"property": "P3", "what": "wrong capturer"}
    guard = {"property": "halt", "what": "vLLM stops",
             "detail": "RuntimeError: CUDA graph capturing detected at an inappropriate time"}
    ranks = [severity.of(s).rank for s in (halt, guard, p5, P1, p3)]
    assert ranks == sorted(ranks) and len(set(ranks)) == 5, ranks
    assert severity.of(guard) == severity.of(p4) == severity.of({"property": "P0", "what": "vLLM stops when serving"})
    refusal = {"property": "halt", "what": "vLLM stops",
               "detail": "resolve rejected: CUDAGraphMode.FULL is not supported (support: NEVER)"}
    assert severity.finding(halt) and not severity.finding(refusal)


# -- grouping --------------------------------------------------------------------------------------

def test_a_class_whose_deciding_statements_hold_the_anchor_joins_that_root_cause():
    causes = rc.group([entry("P1-target-PIECEWISE-no-capturer--cudagraph_mode=FULL", [NOISE, ANCHOR])], [known()])
    assert [c.id for c in causes] == ["compiled-before-piecewise-upgrade"]
    (cause,) = causes
    assert cause.anchor is ANCHOR and len(cause.classes) == 1 and not cause.witnesses
    assert cause.found_on[(cause.units[0].key, "0.30.0", "MRV1")] == 1


def test_a_class_matching_no_anchor_is_a_root_cause_of_its_own_named_by_its_top_statement():
    causes = rc.group([entry("P1-target-PIECEWISE-no-capturer--cudagraph_mode=FULL", [NOISE])], [known()])
    fixed, (cause,) = [c for c in causes if c.known], [c for c in causes if not c.known]
    assert not fixed[0].units  # a root cause of fixes/ stays, with no class
    assert cause.anchor is NOISE and len(cause.units) == 1
    assert cause.id.startswith("p1-no-capturer-at-cudagraphwrapper-call-if-self-cudagraph-options")
    assert "CUDAGraphWrapper.__call__" in cause.title


def test_the_anchor_must_be_of_the_same_violation_kind():
    p4 = {"property": "P4", "role": "drafter", "runtime_mode": "PIECEWISE", "what": "capture outside the capture phase"}
    causes = rc.group([entry("P4-drafter-x", [ANCHOR], signature=p4)], [known()])
    assert [c.known for c in causes if c.units] == [None]
    mrv2 = rc.group([entry("P1-target-y", [ANCHOR], runner=Runner.MRV2, policy="mrv2_0_34")],
                    [rc.Known.from_json({**fix_json(), "runners": ["MRV1"]}, "fixes/x")])
    assert [c.known for c in mrv2 if c.units] == [None]  # a root cause of MRV1's code takes no MRV2 class


def test_units_without_an_anchor_share_a_root_cause_by_kind_and_top_statement():
    causes = rc.group([entry("P1-target-a", [NOISE]), entry("P1-target-b", [dict(NOISE, lines=[300, 300])]),
                       entry("P1-target-c", [ANCHOR])], [known()])
    ids = sorted((c.id, len(c.units)) for c in causes)
    assert len(causes) == 2 and ("compiled-before-piecewise-upgrade", 1) in ids
    assert any(n == 2 for _, n in ids)


def test_a_unit_is_grouped_by_its_home_release_and_other_releases_say_whether_the_anchor_was_found():
    home = entry("P1-target-a", [ANCHOR], release="0.30.0")
    other = entry("P1-target-a", [NOISE], release="0.31.0")
    (cause,) = rc.group([other, home], [known()])
    key = cause.units[0].key
    assert cause.units[0].home is home
    assert cause.found_on[(key, "0.30.0", "MRV1")] == 0 and cause.found_on[(key, "0.31.0", "MRV1")] is None


def test_regression_traces_are_witnesses_not_classes():
    (cause,) = rc.group([entry("P1-target-a", [ANCHOR]), entry("lead2-x", [ANCHOR], klass=False)], [known()])
    assert len(cause.classes) == 1 and len(cause.witnesses) == 1


# -- the matrix ------------------------------------------------------------------------------------

def test_matrix_cells_say_how_they_were_obtained(tmp_path):
    k = known(expected={"0.29.0": "fail", "0.32.0": "pass", "0.34.0": "skip"})
    (cause,) = rc.group([entry("P1-target-a", [ANCHOR]),
                         entry("P1-target-a", [ANCHOR], release="0.34.0", policy="mrv2_0_34", runner=Runner.MRV2)],
                        [k])
    cells = rc.matrix(cause, {}, tmp_path)
    mrv1, mrv2 = cells[("MRV1", "target")], cells[("MRV2", "target")]
    assert mrv1["0.30.0"] == rc.Cell(rc.CONFIRMED, rc.REPLAY, "vllm_0_30-P1-target-a")
    assert mrv1["0.29.0"].state == rc.CONFIRMED and mrv1["0.29.0"].how == rc.UNIT_TEST
    assert mrv1["0.32.0"].state == rc.NOT_AFFECTED and mrv1["0.32.0"].how == rc.UNIT_TEST
    assert mrv1["0.34.0"].state == rc.NOT_PRESENT and "gpu_model_runner.py" in mrv1["0.34.0"].detail
    assert mrv1["0.31.0"] == rc.Cell(rc.NOT_REPLAYED)
    assert mrv2["0.34.0"].state == rc.CONFIRMED and mrv2["0.34.0"].how == rc.REPLAY
    assert mrv2["0.28.0"].state == rc.NOT_REPLAYED
    assert rc.first_confirmed(cells) == "0.29.0"


def test_a_replayed_witness_confirms_refutes_or_shows_the_release_not_affected():
    lead2 = entry("lead2-compiled-under-full-then-upgraded", [ANCHOR], klass=False)
    p3 = {"property": "P3", "role": "target", "runtime_mode": "FULL", "what": "wrong capturer"}
    v029 = entry("v029-full-captured-by-breakable", [NOISE], release="0.29.0", policy="vllm_0_29", signature=p3,
                 klass=False)
    causes = {c.kind["property"]: c for c in rc.group([lead2, v029], [known()])}
    run = {"status": "replayed", "steps": 5, "agreeing": 5}
    conformance = {
        ("0.31.0", Runner.MRV1): {"traces": [dict(run, name=lead2.name), dict(run, name=v029.name)]},
        ("0.32.0", Runner.MRV1): {"traces": [dict(run, name=lead2.name, agreeing=4)]},
    }
    row = rc.matrix(causes["P1"], conformance, ROOT)[("MRV1", "target")]
    assert row["0.31.0"] == rc.Cell(rc.CONFIRMED, rc.REPLAY, lead2.name)  # 0.31.0's model shows the class
    assert row["0.32.0"].state == rc.REFUTED and "4 of 5" in row["0.32.0"].detail
    row = rc.matrix(causes["P3"], conformance, ROOT)[("MRV1", "target")]
    assert row["0.29.0"].state == rc.CONFIRMED  # its own finding there
    assert row["0.31.0"] == rc.Cell(rc.NOT_AFFECTED, rc.REPLAY, v029.name)  # #56312: no P3 from 0.30 on


def test_the_runner_table_matches_the_installed_sources():
    from contract.evidence import since

    sources = since.sources(ROOT)
    if not sources:
        pytest.skip("no release source at hand")
    for release, package in sources.items():
        present = {r for r, f in rc.RUNNER_FILES.items() if (package / f).is_file()}
        assert present == set(rc.RUNNERS_IN[release]), release


# -- pages -----------------------------------------------------------------------------------------

def test_a_page_quotes_at_most_fifteen_lines_per_release_and_links_functions_at_their_def():
    long = dict(NOISE, text="\n".join(["x = (", *["    a and"] * 12, "    b", ")"]), kind="assign",
                lines=[270, 284], function="CUDAGraphWrapper.__call__")
    e = entry("P1-target-a", [long, NOISE, ANCHOR, dict(NOISE, lines=[288, 288])])
    (cause,) = rc.group([e], [known()])
    view = pages.View(cause, rc.matrix(cause, {}, ROOT))
    text = pages.page(view)
    section = text.split("### vLLM 0.30.0 (MRV1)")[1].split("## Classes")[0]
    quoted = [line for block in re.findall(r"```python\n(.*?)\n *```", section, re.S) for line in block.splitlines()]
    assert 0 < len(quoted) <= pages.LINES_PER_RELEASE
    assert "**the anchor**" in section.splitlines()[4]  # the anchor comes first
    links = parse(section)
    assert links and len(links) % 2 == 0
    for function_link, statement_link in zip(links[::2], links[1::2]):  # the function at its def, then the lines
        assert function_link.function and (function_link.first, function_link.last) in {(633, 684), (235, 363)}
        assert statement_link.function is None and "lines" in statement_link.text
    assert links[0].function == "wrap_with_cudagraph_if_needed"


def test_findings_open_with_the_triage_table_and_list_untraced_findings_in_full(tmp_path):
    folder = tmp_path / "conformance"
    folder.mkdir()
    run = {"vllm": "0.30.0", "policy": "vllm_0_30", "steps": 5, "agreeing_steps": 5, "trace_files": 1,
           "generated_traces": 0, "traces": [],
           "findings": [{"name": "lead2-x", "source": "tests/traces/lead2-x.json", "outcome": "confirmed",
                         "violations": [{"property": "P1", "step": 3, "message": "m"}], "evidence": ["e"]}]}
    (folder / "vllm-0.30.0.json").write_text(json.dumps(run))
    root = tmp_path / "root"
    (root / "fixes" / "compiled-before-piecewise-upgrade").mkdir(parents=True)
    (root / "fixes" / "compiled-before-piecewise-upgrade" / "fix.json").write_text(json.dumps(fix_json()))
    text = pages.findings(folder, root)
    # the fix's root cause stands on its unit test; the untraced finding is listed in full
    assert text.startswith("# Findings") and "group **0 violation classes** and 0 other witnesses" in text
    assert text.count("**confirmed**") == 1 and "## Findings not grouped into a root cause" in text
    (folder / "deciding").mkdir()
    traced = {"vllm": "0.30.0", "runner": "MRV1", "policy": "vllm_0_30", "conformance": "vllm-0.30.0.json",
              "findings": [{"name": "lead2-x", "source": "tests/traces/lead2-x.json", "signature": P1, "step": 3,
                            "deciding": [ANCHOR], "neighbour": {"describe": "d"}, "events": []}]}
    (folder / "deciding" / "vllm-0.30.0.json.gz").write_bytes(rc.pack(traced))
    text = pages.findings(folder, root)
    head = text.split("## ", 1)[0]
    assert "| 1 | [compiled-before-piecewise-upgrade](root-causes/compiled-before-piecewise-upgrade.md) |" in head
    assert "**confirmed**" not in text and "**1 root causes** group **0 violation classes** and 1 other" in head


# -- the committed pages ---------------------------------------------------------------------------

def test_committed_findings_fit_a_reviewer_and_are_current():
    text = (REPORTS / "findings.md").read_text(encoding="utf-8")
    assert len(text.encode()) < 40_000
    head = text.split("\n## ", 1)[0]
    assert "| # | root cause | severity |" in head
    views = pages.build(REPORTS / "conformance", ROOT)
    assert views, "no traced findings committed: run `make findings`"
    assert text == pages.findings(REPORTS / "conformance", ROOT, views)
    for v in views:
        assert (REPORTS / pages.FOLDER / f"{v.id}.md").read_text(encoding="utf-8") == pages.page(v), v.id
    assert sorted(p.stem for p in (REPORTS / pages.FOLDER).glob("*.md")) == sorted(v.id for v in views)
    severities = [v.cause.severity.rank for v in views]
    assert severities == sorted(severities)


def test_every_committed_root_cause_quotes_at_most_fifteen_lines_per_release():
    for page in sorted((REPORTS / pages.FOLDER).glob("*.md")):
        text = page.read_text(encoding="utf-8")
        section = text.split("## Deciding lines per release", 1)[1].split("\n## ", 1)[0]
        for release in re.split(r"\n### ", section)[1:]:
            quoted = [line for block in re.findall(r"```python\n(.*?)\n *```", release, re.S) for line in block.splitlines()]
            # a release with no deciding statement says so instead (a setting nothing reads)
            assert 0 < len(quoted) <= pages.LINES_PER_RELEASE or pages.NO_STATEMENT in release, \
                (page.name, release.splitlines()[0])


def test_the_reports_index_links_the_triage_table_first():
    text = (REPORTS / "README.md").read_text(encoding="utf-8")
    first_link = re.search(r"\]\(([^)]+)\)", text).group(1)
    assert first_link == "findings.md#triage"


def test_every_fix_names_its_kind_anchors_and_the_rows_its_test_covers():
    known = rc.load_known(ROOT)
    assert len(known) == len(list((ROOT / "fixes").glob("*/fix.json"))) >= 8
    for k in known:
        assert (k.anchors or k.unread) and k.kind.get("property") and k.covers, k.id
        assert set(k.runners) <= {"MRV1", "MRV2"} and {r for r, _ in k.covers} <= set(k.runners), k.id
        assert set(k.expected.values()) <= {"fail", "pass", "skip"}, k.id


def test_every_anchor_is_a_statement_of_its_function_in_some_release():
    """Each anchor of ``fix.json``, normalised, is one of the statements of the function it names,
    in at least one installed release (the one its classes were traced on)."""
    from contract.evidence import since

    sources = since.sources(ROOT)
    if not sources:
        pytest.skip("no release source at hand")
    for k in rc.load_known(ROOT):
        for a in k.anchors:
            found = []
            for release, package in sources.items():
                got = since.locate(package, a.path, a.function)
                if isinstance(got, str):
                    continue
                _, fn, lines = got
                for node in since.statements(fn):
                    if rc.normalise(since.header(node, lines)[2]) == a.key[2]:
                        found.append(release)
            if not found:  # traced on a release not installed here: its committed deciding data holds it
                traced = [d["vllm"] for d in rc.traced(ROOT / "reports" / "conformance")
                          if d["vllm"] not in sources and a.statement in json.dumps(d)]
                assert traced, (k.id, a.function, a.statement)


# -- the first screen and the deciding line ---------------------------------------------------------

def test_every_root_cause_page_opens_with_what_a_maintainer_decides_on():
    """Title in a user's words, severity, measured impact, the command (or why none), the expected
    symptom, affected releases and runners, the fix, within the first 25 lines."""
    for page in sorted((REPORTS / pages.FOLDER).glob("*.md")):
        head = page.read_text(encoding="utf-8").splitlines()[:first_screen.SCREEN]
        text = "\n".join(head)
        title = head[0]
        assert title.startswith("# ") and page.stem not in title and "deciding statement" not in title, page.name
        assert re.search(r"\*\*(crash|hang|wrong|unsupported|memory|graph|silent|log)[^*]*\*\*", head[2]), page.name
        for field_name in ("Impact (measured)", "Affected", "Reproduce", "Expected", "Fix", "Deciding line"):
            assert f"**{field_name}" in text, (page.name, field_name)
        if "```bash" in text:
            assert "vllm serve" in text and "**Checked** on vLLM" in text, page.name
        runners = re.search(r"\*\*Affected:\*\* (.*)", text).group(1)
        if "MRV2" not in runners:
            assert "**backport only**" in runners, page.name


def test_fix_edits_are_the_statements_each_patch_edits_inside_its_hunks():
    from contract.evidence import fix_edits, since

    found = since.sources(ROOT)
    if not found:
        pytest.skip("no release source at hand")
    for folder in sorted(p.parent for p in (ROOT / "fixes").glob("*/fix.json")):
        data = json.loads((folder / "fix.json").read_text())
        assert fix_edits.computed(folder, found) == {r: e for r, e in data["fix_edits"].items() if r in found}, \
            f"{folder.name}: run python -m contract.evidence.fix_edits"
        for release, edits in data["fix_edits"].items():
            patch = (folder / data["patches"][release]).read_text()
            assert edits and all(fix_edits.inside(fix_edits.Edit(**e), patch) for e in edits), (folder.name, release)


def test_the_deciding_line_is_in_the_fix_and_duplicates_merge():
    views = pages.build(REPORTS / "conformance", ROOT)
    known = [v for v in views if v.cause.known is not None and v.cause.known.patches]
    assert known and all(first_screen.deciding_line(v.cause.known) for v in known)
    # the two P7 classes of 0.34.0 and the P8 ones are one root cause each, of fixes/
    by_kind = {}
    for v in views:
        by_kind.setdefault(v.cause.kind["property"], []).append(v.id)
    assert by_kind["P7"] == ["mrv2-draft-varlen-graphs-unchecked"]
    assert by_kind["P8"] == ["mrv2-draft-graphs-under-spec-enforce-eager"]
    assert all(v.cause.known is not None for v in views)


def test_fix_edits_reads_the_statement_a_pure_addition_lands_in():
    from contract.evidence import fix_edits

    source = "def f(x):\n    y = g(\n        x,\n        1,\n    )\n    return y\n"
    patch = ("--- a/vllm/m.py\n+++ b/vllm/m.py\n@@ -2,4 +2,5 @@\n     y = g(\n         x,\n         1,\n"
             "+        2,\n     )\n")
    hunk, = fix_edits.hunks(patch)
    assert (hunk.path, hunk.old_start, hunk.first_change) == ("m.py", 2, 4)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "m.py").write_text(source)
        edit, = fix_edits.edits(patch, Path(tmp))
    assert (edit.function, edit.line, edit.end, edit.text) == ("f", 2, 5, "y = g(x, 1,)")
    assert fix_edits.inside(edit, patch)
    assert not fix_edits.inside(fix_edits.Edit("m.py", "f", 6, 6, "return y"), patch)


def test_every_gpu_script_is_current_and_parses():
    from contract.evidence import reproduction
    from contract.reports import gpu_scripts

    scripts = 0
    for view in pages.build(REPORTS / "conformance", ROOT):
        text = gpu_scripts.script(view.cause, reproduction.choose(view.cause, view.cells, ROOT), ROOT)
        if text is None:
            continue
        path = ROOT / view.cause.known.folder / "gpu.sh"
        assert path.read_text() == text, f"{path}: run python -m contract.reports.root_causes"
        assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0, path
        scripts += 1
    assert scripts >= 8
    assert subprocess.run(["bash", "-n", str(ROOT / "fixes" / "gpu_reproduce.sh")]).returncode == 0


@pytest.mark.conformance
def test_the_gpu_hook_counts_forwards_no_graph_served():
    """fixes/gpu_observe.py, as a gpu.sh loads it, around vLLM 0.34.0's set_forward_context (a stand-in
    context here: the real one needs a model's config)."""
    from vllm_envs import require

    code = """
import contextlib, json, sys
import vllm.forward_context as fc
from vllm.config import CUDAGraphMode
fc.set_forward_context = contextlib.contextmanager(lambda *a, **k: (yield None))
import gpu_observe
for mode in (CUDAGraphMode.PIECEWISE, CUDAGraphMode.NONE, CUDAGraphMode.PIECEWISE):
    with fc.set_forward_context(None, None, cudagraph_runtime_mode=mode):
        pass
gpu_observe.ACTED[0] += 1  # what a capture_begin would count
print(json.dumps(dict(gpu_observe.COUNTS)))
"""
    python = require("0.34.0") / "bin" / "python"
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT / "fixes"), "VLLM_LOGGING_LEVEL": "ERROR"})
    assert done.returncode == 0, done.stderr[-2000:]
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    assert counts == {"PIECEWISE forwards": 2, "PIECEWISE forwards no graph served": 2}
    assert "cudagraph-contract-observe " in done.stderr
