"""The model against real vLLM 0.30.0, 0.29.0 and 0.33.0 (Model Runner V1) on CPU (``cudagraph-contract conform``).

Each release runs in its own venv (``.venv-vllm-<version>``, its vLLM over the shared ``.venv-vllm``,
made by ``cudagraph-contract env make``) as a subprocess with ``PYTHONPATH`` at the repo root; all of
them start together and are shared by the tests of this module. Each replays the covering corpus
(one trace per observation cell); every release's full replay is ``make conformance-all``'s,
committed under ``reports/conformance/``. Without the venvs
the tests skip, or fail when ``CONTRACT_REQUIRE_VLLM=1``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_envs import per_kind, run_env, selected, shared_jobs, venv_python

ROOT = Path(__file__).resolve().parents[1]
VERSIONS = ("0.30.0", "0.29.0", "0.33.0")
# make test runs vLLM's code of the newest release only (0.34.0, Model Runner V2); these Model Runner
# V1 replays are make evidence's, which CI runs after make test (docs/measurements.md).
KEPT: set[str] = set()
TIMEOUT = 600

# one worker runs the module's jobs one after the other while the other worker runs other tests,
# rather than both workers waiting on a job's lock (vllm_envs.shared_jobs)
pytestmark = [pytest.mark.conformance, pytest.mark.xdist_group("conformance")]


# In one vLLM process: traces replay the same in any order; an MRV2 trace is not replayed; and a
# capture hidden from the comparison, two ways (the simulated layer captures without reporting it,
# the adapter drops the reports of PIECEWISE captures), shows as disagreeing steps.
MUTANT = r"""
import json, sys
from pathlib import Path
from contract.real import observe, simcuda
from contract.real.compare import compare
from contract.families import policy_for
from contract.runners.mrv1.real.replay import Session
from contract.core.events import CaptureModel, ExecuteModel, LoadModel, ProfileRun, Resolve
from contract.families import load_policy
from contract.core.scenario import Runner, Scenario
from contract.core.trace import load, record

session = Session()
policy = load_policy(policy_for(session.version, "mrv1"))
trace = load(sys.argv[1])
out = {"control": [d.index for d in compare(session, trace, policy, "control").diffs]}

traces = [load(p) for p in sorted(Path(sys.argv[1]).parent.glob("*.json"))]
def observe_all(order):
    return {t.name: session.replay(t.scenario, t.events) for t in order}
out["order_independent"] = observe_all(traces) == observe_all(traces[::-1])

mrv2 = record(Scenario(runner=Runner.MRV2, breakable=True), load_policy("mrv2_0_33"),
              [LoadModel(), ProfileRun(), Resolve(), CaptureModel(), ExecuteModel(3)])
result = compare(session, mrv2, policy, "mrv2")
out["mrv2"] = [result.status, result.steps]

begin = simcuda.SimGraph.capture_begin
def unreported_begin(self, pool=None, *args, **kwargs):
    simcuda.SimCuda.depth += 1
    self.depth = simcuda.SimCuda.depth
simcuda.SimGraph.capture_begin = unreported_begin
out["simcuda"] = [d.index for d in compare(session, trace, policy, "simcuda").diffs]
simcuda.SimGraph.capture_begin = begin

graph_event = observe.Recorder.graph_event
def drop_piecewise_begin(self, kind, graph):
    if not (kind == "begin" and self.runtime_mode == "PIECEWISE"):
        graph_event(self, kind, graph)
observe.Recorder.graph_event = drop_piecewise_begin
observe.install(session.recorder)
out["adapter"] = [d.index for d in compare(session, trace, policy, "adapter").diffs]
print(json.dumps(out))
"""

# vLLM refusing a scenario at start-up, injected: the trace cannot be replayed (exit 2, one line).
CANNOT_BUILD = r"""
import sys
from contract.real import vllm_config
def refuse(self, scenario):
    raise AssertionError("injected: VllmConfig refuses this scenario")
vllm_config.ConfigCache._build = refuse
from contract.cli import main
sys.argv = ["cudagraph-contract", "conform", "--traces", sys.argv[1], "--reports", sys.argv[2]]
main()
"""

# An environment without one module of the import closure (None in sys.modules: the import fails).
MISSING_MODULE = r"""
import sys
sys.modules["msgspec"] = None
from contract.cli import main
main(["conform", "--corpus", "none", "--reports", sys.argv[1]])
"""

NESTED = ROOT / "tests" / "traces" / "v030-nested-full-over-breakable.json"

# From 0.31 vLLM no longer configures its logger at import; VLLM_CONFIGURE_LOGGING=0 starts 0.30.0 the same way.
UNCONFIGURED = ["env", "-u", "VLLM_LOGGING_LEVEL", "VLLM_CONFIGURE_LOGGING=0"]


def commands(version: str, python: Path, reports: Path) -> dict[str, list]:
    out = {
        "conform": [python, "-m", "contract.cli", "conform", "--runner", "mrv1", "--json", "--reports", reports,
                    "--corpus", "covering"],
        "modes": [python, "-m", "contract.real.modes_table"],
    }
    if version == VERSIONS[0]:
        out["mutant"] = [python, "-c", MUTANT, NESTED]
        out["cannot-build"] = [python, "-c", CANNOT_BUILD, NESTED, reports / "cannot-build"]
        out["missing-module"] = [python, "-c", MISSING_MODULE, reports / "missing-module"]
        for name, flags in (("quiet", []), ("verbose", ["--verbose"])):
            out[name] = [*UNCONFIGURED, python, "-m", "contract.cli", "conform", "--corpus", "none", *flags,
                         "--reports", reports / name]
    return out


@pytest.fixture(scope="module")
def jobs(tmp_path_factory, request):
    """The module's conform jobs, started together and shared (``vllm_envs.shared_jobs``)."""
    versions = [v for v in VERSIONS if v in selected(request, "version") | {VERSIONS[0]}]
    yield from shared_jobs(tmp_path_factory, "conformance-jobs", versions, commands, TIMEOUT)


@pytest.mark.parametrize("version", per_kind(VERSIONS, KEPT))
def test_every_step_agrees_with_real_vllm(jobs, version):
    rc, out, err, reports = jobs("conform", version)
    assert out.strip(), err[-2000:]
    data = json.loads(out)
    assert data["vllm"] == version
    assert data["policy"] == ("vllm_0_29" if version == "0.29.0" else "vllm_0_30")
    assert data["load_model_block"]["revision"] == ("0.30.0" if version == "0.33.0" else version)
    assert data["trace_files"] >= 8
    assert data["generated_traces"] > 100 and data["steps"] > 2000
    assert data["agreeing_steps"] == data["steps"], json.dumps(data["disagreements"], indent=1)[:4000]
    # the several-rank traces, each rank a process joined by gloo running coordinate_batch_across_dp
    ranks = data["data_parallel"]
    assert ranks["traces"] >= 5 and ranks["agreeing_rank_steps"] == ranks["rank_steps"] > 200
    assert rc == 0


@pytest.mark.parametrize("version", per_kind(VERSIONS, KEPT))
def test_counterexamples_against_the_release_are_confirmed(jobs, version):
    rc, out, err, reports = jobs("conform", version)
    report = json.loads((reports / "conformance" / f"vllm-{version}.json").read_text())
    names = {f["name"]: f["outcome"] for f in report["findings"]}
    expected = {"v029"} if version == "0.29.0" else {"lead1", "lead2", "lead3"}
    assert {n.split("-")[0] for n in names} >= expected
    assert set(names.values()) == {"confirmed"}
    assert (reports / "findings.md").read_text().count("**confirmed**") == len(names)


@pytest.mark.evidence
def test_a_hidden_capture_is_a_disagreement_and_order_does_not_matter(jobs):
    rc, out, err, _ = jobs("mutant", VERSIONS[0])
    assert rc == 0, err[-2000:]
    diffs = json.loads(out.strip().splitlines()[-1])
    assert diffs["control"] == []
    assert diffs["order_independent"]
    assert diffs["mrv2"] == ["not replayed (MRV2)", 0]
    assert diffs["simcuda"], "a capture the simulated layer did not report went unnoticed"
    assert diffs["adapter"], "a PIECEWISE capture the adapter dropped went unnoticed"


@pytest.mark.evidence
def test_a_scenario_vllm_refuses_is_one_line_and_exit_2(jobs):
    rc, out, err, _ = jobs("cannot-build", VERSIONS[0])
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert rc == 2
    assert len(errors) == 1 and "cannot build its scenario" in errors[0] and "injected" in errors[0]


@pytest.mark.evidence
def test_a_module_missing_from_the_closure_is_named(jobs):
    rc, out, err, reports = jobs("missing-module", VERSIONS[0])
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert rc == 2 and len(errors) == 1, err[-2000:]
    assert "needs the module msgspec, which this environment lacks" in errors[0]
    assert not (reports / "missing-module").exists()


@pytest.mark.evidence
def test_vllm_logging_is_quiet_unless_verbose(jobs):
    rc, out, err, _ = jobs("quiet", VERSIONS[0])
    rc_verbose, out_verbose, err_verbose, _ = jobs("verbose", VERSIONS[0])
    assert rc == rc_verbose == 0, (err[-2000:], err_verbose[-2000:])
    assert len(err.splitlines()) < 20 and "is not supported with" not in err, err
    assert "is not supported with" in err_verbose and len(err_verbose.splitlines()) > len(err.splitlines())
    assert out.splitlines()[:-1] == out_verbose.splitlines()[:-1]  # the summary; the last line names the report


@pytest.mark.evidence
def test_quiet_on_a_release_that_leaves_logging_unconfigured(tmp_path):
    """0.31 and later, where ``.venv-vllm-0.33.0`` exists (make .venv-vllm-0.33.0/.complete)."""
    python = venv_python("0.33.0")
    if python is None:
        pytest.skip(".venv-vllm-0.33.0 is missing: make it with make .venv-vllm-0.33.0/.complete")
    environment = {k: v for k, v in run_env().items() if k != "VLLM_LOGGING_LEVEL"}
    proc = subprocess.run([str(python), "-m", "contract.cli", "conform", "--corpus", "none", "--reports",
                           str(tmp_path)], cwd=ROOT, env=environment, text=True, capture_output=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(proc.stderr.splitlines()) < 20, proc.stderr


@pytest.mark.parametrize("version", per_kind(VERSIONS, KEPT))
def test_mode_enum_truth_table_matches_vllm(jobs, version):
    rc, out, err, _ = jobs("modes", version)
    assert rc == 0, err[-2000:]
    tables = json.loads(out.strip().splitlines()[-1])
    real, model = tables["vllm"], tables["model"]
    assert real["AttentionCGSupport"] == model["AttentionCGSupport"]
    real, model = real["CUDAGraphMode"], model["CUDAGraphMode"]
    assert real["members"] == model["members"]
    assert real["valid_runtime_modes"] == model["valid_runtime_modes"]
    for member in model["members"]:
        differing = {k: (real[member][k], model[member][k])
                     for k in model[member] if real[member][k] != model[member][k]}
        # without_piecewise() arrived in 0.30.0 (PR #56191); the 0.29 policy never calls it.
        allowed = {"without_piecewise"} if version == "0.29.0" else set()
        assert set(differing) <= allowed, (member, differing)
        if version == "0.29.0":
            assert real[member]["without_piecewise"] == "<absent>"


# -- bad environments and traces: no vLLM needed -------------------------------------------------


def fake_vllm(tmp_path: Path, version: str) -> Path:
    """A folder holding only vLLM's distribution metadata, at ``version``."""
    site = tmp_path / f"fake-vllm-{version}"
    info = site / f"vllm-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    return site


def conform_here(*args: str, site: Path | None = None) -> subprocess.CompletedProcess:
    path = os.pathsep.join(str(p) for p in (site, ROOT) if p)
    return subprocess.run([sys.executable, "-m", "contract.cli", "conform", *args], cwd=ROOT, text=True,
                          capture_output=True, env={**os.environ, "PYTHONPATH": path}, timeout=120)


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed with this Python")
def test_missing_vllm():
    assert "vLLM is not installed" in one_error_line(conform_here())


def test_a_vllm_without_model_runner_v1(tmp_path):
    line = one_error_line(conform_here("--runner", "mrv1", site=fake_vllm(tmp_path, "0.34.0")))
    assert "0.34.0" in line and "Model Runner V1" in line and "--runner mrv2" in line


def test_an_unknown_runner():
    assert "--runner must be one of auto, mrv1, mrv2" in one_error_line(conform_here("--runner", "v3"))


def test_a_version_without_venv():
    assert "no environment for vLLM 9.9.9" in one_error_line(conform_here("--vllm", "9.9.9"))


def test_a_trace_in_an_order_vllm_never_runs(tmp_path):
    trace = json.loads(NESTED.read_text())
    trace["events"] = [{"event": "load_model"}, {"event": "capture_model"}]
    path = tmp_path / "out-of-order.json"
    path.write_text(json.dumps(trace))
    line = one_error_line(conform_here("--traces", str(path), site=fake_vllm(tmp_path, "0.30.0")))
    assert str(path) in line and "cannot happen" in line


def test_a_file_that_is_not_a_trace(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text("{not json")
    line = one_error_line(conform_here("--traces", str(path), site=fake_vllm(tmp_path, "0.30.0")))
    assert "not valid JSON" in line


def test_an_unknown_corpus():
    assert "--corpus" in one_error_line(conform_here("--corpus", "everything"))
