"""Pages cite the vLLM functions that ran on the witness's path, per release it was replayed on, as
permalinks at that release's tag, with line ranges read from the installed release's source.

The rendering is checked on conformance data built here; the end-to-end check replays a report's
witness on vLLM 0.30.0 (``make evidence``; skipped without ``.venv-vllm-0.30.0``, failed with
``CONTRACT_REQUIRE_VLLM=1``) and checks every permalink the page then shows against that release's
source.
"""

from __future__ import annotations

import ast
import functools
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from contract.real.decisions import CONFIG_STEP, HARNESS, VLLM, where
from contract.evidence import decision_lines, matrix
from contract.core.scenario import Runner
from contract.core.trace import load
from vllm_envs import require, run_env

ROOT = Path(__file__).resolve().parents[1]
P4 = ROOT / "reports" / "vllm_0_30" / "P4.json"
LINK = re.compile(r"\]\((https://github\.com/vllm-project/vllm/blob/v([0-9.]+)/vllm/([^#)]+)#L(\d+)-L(\d+))\)")
SECTION = "## vLLM code on this path"


def _conformance(trace, release: str, path: list[dict], where_: dict, steps: int | None = None) -> dict:
    n = len(trace.events) if steps is None else steps
    entry = {"name": trace.name, "status": "replayed", "steps": n, "agreeing": n, "decision_path": path}
    return {(release, Runner.MRV1): {"vllm": release, "traces": [entry], "decision_points": {"where": where_}}}


WHERE = {
    "GPUModelRunner.load_model (wrapping block)": {"owner": VLLM, "function": "GPUModelRunner.load_model",
                                                   "path": "v1/worker/gpu_model_runner.py", "lines": [5456, 5495]},
    "BreakableCUDAGraphWrapper.__call__": {"owner": VLLM, "function": "BreakableCUDAGraphWrapper.__call__",
                                           "path": "compilation/breakable_cudagraph.py", "lines": [317, 342]},
    "propose: dispatch, forward": {"owner": HARNESS, "function": "SpecDecodeBaseProposer.propose",
                                   "path": "v1/spec_decode/llm_base_proposer.py", "lines": [574, 756]},
}


def _path(trace) -> list[dict]:
    steps = [{"event": CONFIG_STEP, "points": []}]
    for i, event in enumerate(trace.events):
        points = []
        if i == 0:
            points.append("GPUModelRunner.load_model (wrapping block)")
        if event.kind == "propose":
            points += ["propose: dispatch, forward", "BreakableCUDAGraphWrapper.__call__"]
        steps.append({"event": event.kind, "points": points})
    return steps


def test_lines_are_permalinks_at_the_replayed_release_and_mirrors_are_marked():
    trace = load(P4)
    text = "\n".join(decision_lines.markdown(trace, _conformance(trace, "0.30.0", _path(trace), WHERE), 4, "P4.json"))
    links = LINK.findall(text)
    assert {link[1] for link in links} == {"0.30.0"}
    assert ("https://github.com/vllm-project/vllm/blob/v0.30.0/vllm/compilation/breakable_cudagraph.py#L317-L342"
            in {link[0] for link in links})
    violation = text.split("At step 4 `propose(num_tokens=1)` (the violation):")[1].split("The rest of the path")[0]
    assert "BreakableCUDAGraphWrapper.__call__" in violation and "load_model" not in violation
    mirrored = next(line for line in text.splitlines() if "SpecDecodeBaseProposer.propose" in line)
    assert "mirrored by the harness: these statements did not run" in mirrored
    assert "(wrapping block)" in text and "(step 0)" in text


def test_an_unreplayed_witness_cites_no_line():
    trace = load(P4)
    for conformance in ({}, {("0.30.0", Runner.MRV1): {"vllm": "0.30.0", "traces": []}}):
        text = "\n".join(decision_lines.markdown(trace, conformance, 4, "reports/vllm_0_30/P4.json"))
        assert "has not been replayed on vLLM's code" in text and "conform --vllm 0.30.0" in text
        assert not LINK.search(text) and ".py:" not in text


def test_a_replay_without_a_recorded_path_says_so():
    trace = load(P4)
    conformance = _conformance(trace, "0.30.0", [], WHERE)
    text = "\n".join(decision_lines.markdown(trace, conformance, 4, "P4.json"))
    assert "### vLLM 0.30.0: affected" in text and "recorded no decision path" in text and not LINK.search(text)


def test_a_version_that_is_no_release_tag_gets_no_permalink():
    assert decision_lines.permalink("0.30.0", "forward_context.py", [1, 2]).endswith("/v0.30.0/vllm/forward_context.py#L1-L2")
    assert decision_lines.permalink("0.30.1.dev12+g1234", "forward_context.py", [1, 2]) is None


def test_where_reads_the_def_and_its_decorators_from_the_source(tmp_path):
    package = tmp_path / "vllm"
    source = package / "v1" / "worker" / "m.py"
    source.parent.mkdir(parents=True)
    text = "import functools\n\n\n@functools.lru_cache\n@functools.lru_cache\ndef decide(x):\n    y = x\n    return y > 1\n"
    source.write_text(text)
    namespace: dict = {}
    exec(compile(text, str(source), "exec"), namespace)
    assert where(namespace["decide"], package=package) == {"function": "decide", "path": "v1/worker/m.py",
                                                           "lines": [4, 8]}
    assert where(test_where_reads_the_def_and_its_decorators_from_the_source, package=package) is None


@functools.lru_cache(maxsize=None)
def _functions(source: Path) -> tuple[tuple[str, int, int, int], ...]:
    """(name, first line with decorators, def line, last line) of every function of a file, parsed once:
    the pages cite the same few files hundreds of times."""
    tree = ast.parse(source.read_text(encoding="utf-8"))
    return tuple((node.name, min([d.lineno for d in node.decorator_list] + [node.lineno]), node.lineno,
                  node.end_lineno) for node in ast.walk(tree)
                 if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)))


def _source_span(package: Path, path: str, first: int, last: int) -> dict[str, set[str]]:
    """The names of the functions whose def (decorators included) spans exactly first..last, and of
    those whose body holds first..last (a block cut from a method, mirrored statements)."""
    exact, holding = set(), set()
    for name, start, lineno, end in _functions(package / path):
        if (start, end) == (first, last):
            exact.add(name)
        elif lineno < first <= last <= end:
            holding.add(name)
    return {"exact": exact, "holding": holding}


def check_permalinks(text: str, packages: dict[str, Path]) -> int:
    """Every permalink of the page's code-path section names a range of the linked release's source:
    a whole function, or statements inside the method the bullet names. Returns the count checked."""
    section = text.split(SECTION, 1)[1] if SECTION in text else ""
    checked = 0
    for line in section.splitlines():
        found = LINK.search(line)
        if not found:
            continue
        _, release, path, first, last = found.groups()
        function = re.match(r"- `([^`]+)`", line).group(1).split(".")[-1]
        spans = _source_span(packages[release], path, int(first), int(last))
        if "(" in line.split("[")[0] or "mirrored by the harness" in line:  # a block or mirrored statements
            assert function in spans["holding"] | spans["exact"], line
        else:
            assert function in spans["exact"], line
        checked += 1
    return checked


@pytest.mark.evidence
def test_a_replayed_witness_page_cites_the_release_source(tmp_path):
    """Replay ``reports/vllm_0_30/P4.json`` on vLLM 0.30.0, then render its section from that run."""
    venv = require("0.30.0")
    reports = tmp_path / "reports"
    run = subprocess.run(
        [sys.executable, "-m", "contract.cli", "conform", "--vllm", "0.30.0", "--traces", str(P4),
         "--reports", str(reports)], cwd=ROOT, env=run_env(), capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    data = json.loads((reports / "conformance" / "vllm-0.30.0.json").read_text())
    assert data["decision_points"]["where"], "the run recorded no decision point locations"
    trace = load(P4)
    conformance = matrix.load_conformance(reports / "conformance")
    text = "\n".join(decision_lines.markdown(trace, conformance, 4, "reports/vllm_0_30/P4.json"))
    package = Path(subprocess.run([str(venv / "bin" / "python"), "-c", "import importlib.util as u; "
                                   "print(u.find_spec('vllm').origin)"], capture_output=True, text=True,
                                  check=True, env=run_env()).stdout.strip()).parent
    assert check_permalinks(text, {"0.30.0": package}) >= 10
    violation = text.split("(the violation):")[1].split("The rest of the path")[0]
    # the drafter's breakable wrapper is what tries to capture outside the capture window
    assert "`BreakableCUDAGraphWrapper.__call__`" in violation and "/v0.30.0/" in violation
    assert "`GPUModelRunner.load_model` (wrapping block)" in text and "`VllmConfig.__post_init__`" in text


def test_the_default_conform_corpus_replays_every_report_witness():
    """``conform`` without ``--traces`` replays the traces under reports/, class witnesses included,
    so every page can say what its witness did on each replayed release."""
    from contract.real.corpus import file_traces

    replayed = set(file_traces(ROOT))
    witnesses = set((ROOT / "reports").glob("*/classes/*.json")) | set((ROOT / "reports").glob("*/P*.json"))
    assert witnesses and witnesses <= replayed


def test_findings_cite_the_code_that_ran_at_the_violating_step(tmp_path):
    from contract.reports.conformance import findings_markdown

    trace = load(P4)
    step = len(trace.events) - 1  # the witness's propose
    run = _conformance(trace, "0.30.0", _path(trace), WHERE)[("0.30.0", Runner.MRV1)]
    run.update(policy="vllm_0_30", steps=step + 1, agreeing_steps=step + 1, trace_files=1, generated_traces=0,
               findings=[{"name": trace.name, "source": "reports/vllm_0_30/P4.json", "outcome": "confirmed",
                          "violations": [{"property": "P4", "step": step, "message": "m"}], "evidence": ["e"]}])
    (tmp_path / "vllm-0.30.0.json").write_text(json.dumps(run))
    text = findings_markdown(tmp_path)
    cited = [m.group(1) for m in LINK.finditer(text.split(f"vLLM's code at step {step}:")[1])]
    assert cited[:1] == ["https://github.com/vllm-project/vllm/blob/v0.30.0/vllm/v1/spec_decode/llm_base_proposer.py#L574-L756"]
    assert "compilation/breakable_cudagraph.py#L317-L342" in cited[1]
    run["traces"][0]["decision_path"] = []  # a run that recorded no path cites nothing
    (tmp_path / "vllm-0.30.0.json").write_text(json.dumps(run))
    assert "vLLM's code at step" not in findings_markdown(tmp_path)
