"""The MRV2 model against real vLLM 0.33.0 and 0.34.0 Model Runner V2 on CPU (``conform --runner mrv2``).

Each release runs in its environment (``.venv-vllm-<version>``) as a subprocess; the jobs start
together when the module starts and are shared by its tests. Without the environments the tests
skip, or fail when ``CONTRACT_REQUIRE_VLLM=1``.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from contract.families import policy_for
from vllm_envs import per_kind, require_python, run_env, selected, shared_jobs

ROOT = Path(__file__).resolve().parents[1]
VERSIONS = ("0.34.0", "0.33.0")
# make test replays the newest release; 0.33.0 is make evidence's, which CI runs after make test.
RUN = per_kind(VERSIONS, {"0.34.0"})
TRACES = ROOT / "tests" / "traces"
CONTROL = ("mrv2-0.33-l1-compiled-under-full-then-upgraded", "mrv2-0.33-multi-module-mtp-breakable-keyed-by-module")
TIMEOUT = 900

# one worker runs the module's jobs (as test_conformance.py's)
pytestmark = [pytest.mark.conformance, pytest.mark.xdist_group("conformance-mrv2")]


def commands(version: str, python: Path, reports: Path) -> dict[str, list]:
    conform = [python, "-m", "contract.cli", "conform", "--runner", "mrv2", "--corpus", "covering", "--json"]
    out = {"conform": [*conform, "--reports", reports / "own"]}
    if version == "0.34.0":
        # negative control: 0.34.0's code against 0.33.0's model, on 0.33.0's committed witnesses
        # (the extensible KV cache at its default, on); the covering run above replays the corpus.
        out["control"] = [python, "-m", "contract.cli", "conform", "--runner", "mrv2", "--corpus", "none", "--json",
                          *[x for t in CONTROL for x in ("--traces", TRACES / f"{t}.json")],
                          "--policy", policy_for("0.33.0", "mrv2"), "--reports", reports / "control"]
    return out


@pytest.fixture(scope="module")
def jobs(tmp_path_factory, request):
    """The module's conform jobs, started together and shared (``vllm_envs.shared_jobs``)."""
    versions = [v for v in VERSIONS if v in selected(request, "version") | {VERSIONS[0]}]
    yield from shared_jobs(tmp_path_factory, "conformance-mrv2-jobs", versions, commands, TIMEOUT)


@pytest.mark.parametrize("version", RUN)
def test_every_mrv2_step_agrees_with_real_vllm(jobs, version):
    rc, out, err, _ = jobs("conform", version)
    assert out.strip(), err[-2000:]
    data = json.loads(out)
    assert data["vllm"] == version
    assert data["policy"] == policy_for(version, "mrv2")
    assert data["load_model_block"]["runner"] == "MRV2"
    assert set(data["load_model_block"]["blocks"]) == {
        "attn_cg_support", "narrow", "adaptive_verification", "ubatch_runner", "initialize_kv_cache",
        "init_speculator_cudagraph_manager", "batch", "loras", "dispatch", "prepare_inputs", "pp_inputs", "run_model"}
    assert data["generated_traces"] > 50 and data["steps"] > 800
    steps = [x for d in data["disagreements"] for x in d.get("disagreements", [])]
    assert not steps, json.dumps(steps, indent=1)[:4000]
    assert data["agreeing_steps"] == data["steps"] and rc == 0
    # the several-rank traces: each rank a process joined by gloo, every rank's side compared
    ranks = data["data_parallel"]
    assert ranks["traces"] >= 10 and ranks["rank_steps"] > 300 and ranks["agreeing_rank_steps"] == ranks["rank_steps"]
    # the pipeline stages: each stage a process, the rows handed over by vLLM's PP group and copied by
    # execute_model's own statement, which raises where a stage pads beyond them
    stages = data["pipeline_parallel"]
    assert stages["traces"] >= 5 and stages["agreeing_stage_steps"] == stages["stage_steps"] > 50


@pytest.mark.parametrize("version", RUN)
def test_mrv2_decision_points_are_vllms_but_the_scheduled_batch(jobs, version):
    """Every replayed step notes its decision points (``mrv2/decision_points.py``): the harness
    makes only the scheduled batch's counts and a micro-batched step's state, each guarded against
    this release's source, and vLLM's code makes at least 90% of the step × point pairs."""
    from contract.real.decisions import MRV2_BATCH, MRV2_UBATCH_STATE, VLLM

    rc, out, err, _ = jobs("conform", version)
    assert out.strip(), err[-2000:]
    report = json.loads(Path(json.loads(out)["report"]).with_suffix(".json").read_text())
    dp = report["decision_points"]
    harness = {e["point"] for e in dp["steps"] if e["owner"] != VLLM}
    assert harness == {MRV2_BATCH, MRV2_UBATCH_STATE}, harness
    assert dp["mirrored"] and all(m["known"] for m in dp["mirrored"]), dp["mirrored"]
    assert dp["share_vllm"] >= 0.9, dp["share_vllm"]
    made = {(e["event"], e["point"]) for e in dp["steps"]}
    for expected in [("resolve", "CompilationConfig.resolve_cudagraph_mode_and_sizes"),
                     ("resolve", "has_compiled_submodule"), ("resolve", "ModelCudaGraphManager.__init__"),
                     ("capture_model", "graph_capture"), ("capture_model", "CudaGraphManager.capture"),
                     ("execute_model", "GPUModelRunner.gather_batch_req_state"),
                     ("execute_model", "dispatch_cg_and_sync_dp"), ("execute_model", "CudaGraphManager.dispatch"),
                     ("execute_model", "GPUModelRunner.execute_model (run-model branch)"),
                     ("profile_run", "wrap_with_cudagraph_if_needed"), ("config", "VllmConfig.__post_init__")]:
        assert expected in made, expected


def test_the_other_releases_model_disagrees_on_named_steps(jobs):
    """0.33.0 profiles CUDA-graph memory with a throwaway capture (``33:v1/worker/gpu/model_runner.py:1069-1073``);
    0.34.0 returns first under its extensible KV cache (``34:…:1123-1125``), on by default
    (``34:config/vllm.py:3252-3254``). On 0.33.0's two witnesses, one with an MTP drafter, the
    releases' managers dispatch alike, so only the memory-profiling step disagrees."""
    rc, out, err, _ = jobs("control", "0.34.0")
    assert out.strip(), err[-2000:]
    data = json.loads(out)
    assert data["policy"] == "mrv2_0_33" and data["trace_files"] == len(CONTROL)
    assert rc == 1 and data["agreeing_steps"] < data["steps"]
    named = {(d["name"], x["step"], x["event"]) for d in data["disagreements"] for x in d.get("disagreements", [])}
    assert named == {(t, 2, "profile_cudagraph_memory") for t in CONTROL}, sorted(named)


def test_0_34_profiles_only_with_the_extensible_kv_cache_off(tmp_path):
    """``--no-enable-extensible-kv-cache``: 0.34.0's ``profile_cudagraph_memory`` runs its throwaway
    capture (``34:v1/worker/gpu/cudagraph_utils.py:988-1095``), which the default skips
    (``34:…/model_runner.py:1123-1125``); the real code agrees with the model on both.

    The run leaves nothing in the temporary folder (vLLM's model config folder lies in the child's,
    which the parent removes) and keeps vLLM's own cache in this tool's cache folder, per release,
    never in the user's ``~/.cache/vllm``."""
    from contract.core.events import CaptureModel, ExecuteModel, LoadModel, ProfileCudagraphMemory, ProfileRun, Resolve
    from contract.families import load_policy
    from contract.core.scenario import Runner, Scenario
    from contract.core.output import write_atomic
    from contract.core.trace import record

    python = require_python("0.34.0")
    policy = load_policy(policy_for("0.34.0", "mrv2"))
    events = [LoadModel(), ProfileRun(), ProfileCudagraphMemory(), Resolve(), CaptureModel(), ExecuteModel(3)]
    folder, profiled = tmp_path / "traces", {}
    for name, extensible in {"default": True, "off": False}.items():
        trace = record(Scenario(runner=Runner.MRV2, extensible_kv_cache=extensible), policy, events, name=name)
        profiled[name] = len(trace.expected_steps[2].get("dispatches", []))
        write_atomic(folder / f"{name}.json", trace.dumps())
    assert profiled["default"] == 0 and profiled["off"] > 0, profiled
    tmp, home, cache = tmp_path / "tmp", tmp_path / "home", tmp_path / "cache"
    tmp.mkdir()
    proc = subprocess.run([str(python), "-m", "contract.cli", "conform", "--runner", "mrv2", "--traces", str(folder),
                           "--reports", str(tmp_path / "reports"), "--json"], cwd=ROOT, capture_output=True, text=True,
                          timeout=TIMEOUT, env=run_env(TMPDIR=str(tmp), HOME=str(home), CUDAGRAPH_CONTRACT_CACHE=str(cache),
                                                       XDG_CACHE_HOME="", VLLM_CACHE_ROOT=str(home / "vllm")))
    assert proc.stdout.strip(), proc.stderr[-2000:]
    data = json.loads(proc.stdout)
    assert data["vllm"] == "0.34.0" and data["steps"] == 2 * len(events), data
    assert data["agreeing_steps"] == data["steps"] and proc.returncode == 0, data["disagreements"]
    assert list(tmp.iterdir()) == []
    assert list((cache / "vllm" / "0.34.0" / "modelinfos").glob("*LlamaForCausalLM.json"))
    assert not home.exists()


# -- conform --vllm-src: a branch checkout's own code over the shared closure ----------------------

BREAKABLE_SWITCH = "is_breakable_cudagraph_enabled(self.compilation_config)\n            and "


def edited_tree(tmp_path: Path, old: str, new: str) -> Path:
    """A symlinked copy of the installed 0.34.0 ``vllm/`` whose ``cudagraph_utils.py`` is edited."""
    require_python("0.34.0")
    installed = next((ROOT / ".venv-vllm-0.34.0" / "lib").glob("python3*/site-packages/vllm"))
    tree = tmp_path / "tree"
    tree.mkdir(parents=True)
    subprocess.run(["cp", "-as", str(installed.resolve()), str(tree / "vllm")], check=True, capture_output=True)
    target = tree / "vllm" / "v1" / "worker" / "gpu" / "cudagraph_utils.py"
    text = target.read_text()
    assert text.count(old) == 1, old
    target.unlink()
    target.write_text(text.replace(old, new))
    return tree


def traces_dir(tmp_path: Path) -> Path:
    """Breakable on under F&P and under FULL, compiled F&P with breakable off: the scenarios whose
    PIECEWISE capturer ``use_breakable_cg`` decides."""
    from contract.core.events import CaptureModel, ExecuteModel, LoadModel, ProfileRun, Resolve
    from contract.core.modes import FULL
    from contract.families import load_policy
    from contract.core.scenario import Runner, Scenario
    from contract.core.output import write_atomic
    from contract.core.trace import record

    policy = load_policy(policy_for("0.34.0", "mrv2"))
    events = [LoadModel(), ProfileRun(), Resolve(), CaptureModel(), ExecuteModel(3), ExecuteModel(2, True)]
    folder = tmp_path / "traces"
    for name, scenario in {"breakable": Scenario(runner=Runner.MRV2, breakable=True),
                           "breakable-full": Scenario(runner=Runner.MRV2, breakable=True, cudagraph_mode=FULL),
                           "compiled": Scenario(runner=Runner.MRV2)}.items():
        write_atomic(folder / f"{name}.json", record(scenario, policy, events, name=name).dumps())
    return folder


def test_vllm_src_that_is_no_model_runner_is_one_line(tmp_path):
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text("")
    proc = subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "-m", "contract.cli", "conform", "--vllm-src",
                           str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "is not a vLLM source tree" in proc.stderr
