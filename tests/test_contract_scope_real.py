"""P0, P7 and lost graphs on vLLM's own code (CPU, CUDA graphs simulated): the MRV2 replay runs
adaptive verification's check and cost profiling as vLLM does, and ``conform --vllm-src --base``
reports a new P7 class for an edited 0.34.0 manager and lost graphs for a 0.33.0 resolve without
its FULL -> FULL_AND_PIECEWISE upgrade. Without the release environments the tests skip, or fail
under ``CONTRACT_REQUIRE_VLLM=1``."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from vllm_envs import edited_tree, per_kind, require_python

from contract.core.halts import ADAPTIVE_PROFILE_ERROR, ADAPTIVE_REJECTED
from contract.core.modes import FULL
from contract.core.modes import AttentionCGSupport as S
from contract.core.output import write_atomic
from contract.core.scenario import DrafterKind, Runner, Scenario, SplittingOps
from contract.families import load_policy, policy_for
from contract.real import corpus

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 900
pytestmark = pytest.mark.conformance

AV = Scenario(runner=Runner.MRV2, drafter=DrafterKind.WITH_MODEL, uniform_decode_query_len=2,
              adaptive_verification=True)
# (scenario, where vLLM stops on each release: event and the halted text's start; None: it serves)
CASES = {
    "weak-target": (replace(AV, attention_support=S.UNIFORM_SINGLE_TOKEN_DECODE),
                    {"0.33.0": ("profile_cudagraph_memory", ADAPTIVE_REJECTED),
                     "0.34.0": ("resolve", ADAPTIVE_REJECTED)}),
    "bound-target": (replace(AV, attention_support=S.UNIFORM_BATCH, varlen_decode_bound=True),
                     {"0.33.0": None, "0.34.0": None}),
    "weak-draft": (replace(AV, attention_support=S.UNIFORM_SINGLE_TOKEN_DECODE, attention_support_draft_only=True),
                   {"0.33.0": ("resolve", "AssertionError"), "0.34.0": ("capture_model", ADAPTIVE_PROFILE_ERROR)}),
    "weak-draft-noext": (replace(AV, attention_support=S.NEVER, attention_support_draft_only=True,
                                 extensible_kv_cache=False),
                         {"0.34.0": ("resolve", "AssertionError")}),
    "ub-draft": (replace(AV, attention_support=S.UNIFORM_BATCH, attention_support_draft_only=True),
                 {"0.33.0": None, "0.34.0": None}),
}


def _traces(folder: Path, version: str) -> dict[str, Path]:
    policy = load_policy(policy_for(version, "mrv2"))
    out = {}
    for name, (scenario, where) in CASES.items():
        if version in where:
            trace = corpus.runnable_trace(scenario, policy, name)
            out[name] = folder / f"{name}.json"
            write_atomic(out[name], trace.dumps())
    return out


REPLAY = """
import json, sys
from pathlib import Path
from contract.core.scenario import Runner
from contract.core.trace import load
from contract.families import by_runner, load_policy, policy_for
from contract.real.compare import compare
from contract.real.judge import violations
from contract.runners.mrv2.real.replay import Session
import vllm
session = Session()
policy = load_policy(policy_for(vllm.__version__, "mrv2"))
family = by_runner(Runner.MRV2)
out = {}
for path in sorted(Path(sys.argv[1]).glob("*.json")):
    trace = load(path)
    result = compare(session, trace, policy, str(path), Runner.MRV2)
    records, found = violations(result.real_steps, trace.events, trace.scenario, family.descriptor_from_json,
                                profiling_skipped=family.profiling_skipped(trace.scenario, vllm.__version__))
    stop = next(((trace.events[i].kind, s["halted"]) for i, s in enumerate(result.real_steps) if s.get("halted")), None)
    out[trace.name] = {"steps": result.steps, "agreeing": result.agreeing, "stop": stop,
                       "violations": sorted({v.property for v in found})}
print(json.dumps(out))
"""


# 0.33.0 under -m evidence (make evidence): make test runs the newest release
@pytest.mark.parametrize("version", per_kind(["0.33.0", "0.34.0"], {"0.34.0"}))
def test_adaptive_verification_on_vllms_own_code(tmp_path, version):
    """On vLLM's own code every step agrees with the model; vLLM refuses a weak target backend with
    its ValueError, stops at start-up for a weak draft-only one (P0, judged on vLLM's observations),
    and 0.34.0's draft prefill captures varlen graphs a draft-only UNIFORM_BATCH backend cannot
    replay (P7 on vLLM's observations)."""
    python = require_python(version)
    _traces(tmp_path / "traces", version)
    proc = subprocess.run([str(python), "-c", REPLAY, str(tmp_path / "traces")], cwd=ROOT, capture_output=True,
                          text=True, timeout=TIMEOUT, env={**os.environ, "VLLM_LOGGING_LEVEL": "ERROR"})
    assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    for name, (_, where) in CASES.items():
        if version not in where:
            continue
        got, want = results[name], where[version]
        assert got["agreeing"] == got["steps"] > 0, (name, got)
        if want is None:
            assert got["stop"] is None, (name, got)
        else:
            assert got["stop"][0] == want[0] and got["stop"][1].startswith(want[1]), (name, got)
        props = set(got["violations"])
        if name.startswith("weak-draft"):
            assert "P0" in props, (name, got)
        if name == "ub-draft":
            assert ("P7" in props) == (version == "0.34.0"), (name, got)
        if name in ("weak-target", "bound-target"):
            assert not props & {"P0", "P7"}, (name, got)


# -- conform --vllm-src --base: an edited tree's new P7 class and lost graphs -----------------------

def _branch(tree: Path, base: str, traces: Path, reports: Path, *extra: str) -> tuple[int, dict]:
    proc = subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "-m", "contract.cli", "conform", "--vllm-src",
                           str(tree), "--base", base, "--runner", "mrv2", "--traces", str(traces), "--reports",
                           str(reports), "--json", *extra],
                          cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT,
                          env={**os.environ, "VLLM_LOGGING_LEVEL": "ERROR"})
    assert proc.stdout.strip(), proc.stderr[-3000:]
    return proc.returncode, json.loads(proc.stdout[proc.stdout.index("{"):])


def _trace_folder(folder: Path, version: str, scenarios: dict[str, Scenario]) -> Path:
    policy = load_policy(policy_for(version, "mrv2"))
    for name, scenario in scenarios.items():
        trace = corpus.runnable_trace(scenario, policy, name)
        write_atomic(folder / f"{name}.json", trace.dumps())
    return folder


def test_an_edited_0_34_manager_capturing_varlen_graphs_is_a_new_p7_class(tmp_path):
    """``_init_candidates`` captures adaptive verification's varlen decode graphs without adaptive
    verification: a UNIFORM_BATCH backend with no varlen bound gets FULL graphs of decode batches of
    1..2 tokens per request."""
    tree = edited_tree(tmp_path, "0.34.0", "v1/worker/gpu/cudagraph_utils.py",
                   "if capture_decode and self.varlen_decode:", "if capture_decode:")
    scenario = Scenario(runner=Runner.MRV2, drafter=DrafterKind.WITH_MODEL, uniform_decode_query_len=2,
                        attention_support=S.UNIFORM_BATCH)
    traces = _trace_folder(tmp_path / "traces", "0.34.0", {"ub-eagle": scenario})
    rc, data = _branch(tree, "0.34.0", traces, tmp_path / "report")
    assert rc == 1, data
    p7 = [c for c in data["new"] if c["property"] == "P7"]
    assert p7 and {c["role"] for c in p7} >= {"target"} and p7[0]["severity"] == "unsupported shape, result unverified", data["new"]
    assert data["new"][0]["property"] == "P7"  # worst first: nothing worse is new
    assert "vllm.v1.worker.gpu.cudagraph_utils" in data["tree_modules"]
    assert (tmp_path / "report" / "README.md").read_text().count("**new** (unsupported shape, result unverified): P7") >= 1


@pytest.mark.evidence  # P10's pools are shown on the model's mutant in make test; this edit is make evidence's
def test_an_edited_0_34_profiling_that_leaves_the_wrappers_pools_alone_is_a_new_p10_class(tmp_path):
    """``profile_cudagraph_memory`` without its wrapper pool swap: the compiled pieces, bound to the
    global pool when compiled, capture memory profiling's graphs into it (P10, a pool its phase does
    not intend); the unedited release captures them into the throwaway pool."""
    tree = edited_tree(tmp_path, "0.34.0", "v1/worker/gpu/cudagraph_utils.py",
                   "                wrapper.graph_pool = throwaway_pool\n", "                pass\n")
    scenario = Scenario(runner=Runner.MRV2, extensible_kv_cache=False)
    traces = _trace_folder(tmp_path / "traces", "0.34.0", {"compiled-profiling": scenario})
    rc, data = _branch(tree, "0.34.0", traces, tmp_path / "report")
    assert rc == 1, data
    p10 = [c for c in data["new"] if c["property"] == "P10"]
    assert p10 and p10[0]["role"] == "target" and p10[0]["runtime_mode"] == "PIECEWISE", data["new"]
    assert "pool its phase does not intend" in p10[0]["what"] and p10[0]["severity"] == "memory", p10


UPGRADE = '''            if self.splitting_ops_contain_attention():
                msg += "; setting cudagraph_mode=FULL_AND_PIECEWISE"'''


@pytest.mark.evidence
def test_a_0_33_resolve_without_the_upgrade_loses_graphs(tmp_path):
    """Resolve's FULL -> FULL_AND_PIECEWISE upgrade removed: under FULL with a UNIFORM_BATCH backend and
    the breakable runner, mixed batches the release served with PIECEWISE graphs run eagerly under
    FULL_DECODE_ONLY. Nothing new: lost graphs, exit 1; accepted with --allow-lost-graphs, exit 0."""
    tree = edited_tree(tmp_path, "0.33.0", "config/compilation.py", UPGRADE,
                   UPGRADE.replace("if self.splitting_ops_contain_attention():", "if False:"))
    scenario = Scenario(runner=Runner.MRV2, breakable=True, cudagraph_mode=FULL, splitting_ops=SplittingOps.ATTENTION,
                        attention_support=S.UNIFORM_BATCH)
    traces = _trace_folder(tmp_path / "traces", "0.33.0", {"breakable-full-ub": scenario})
    rc, data = _branch(tree, "0.33.0", traces, tmp_path / "report")
    assert rc == 1, data
    assert not data["new"], data["new"]
    lost = {c["what"] for c in data["lost_graphs"]}
    assert "fewer target mixed dispatches served by a graph" in lost, data["lost_graphs"]
    assert "lost graphs" in (tmp_path / "report" / "README.md").read_text()
    rc, allowed = _branch(tree, "0.33.0", traces, tmp_path / "report-allowed", "--allow-lost-graphs")
    assert rc == 0 and allowed["lost_graphs"], allowed
