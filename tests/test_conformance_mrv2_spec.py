"""MRV2 speculators on real vLLM 0.33.0 and 0.34.0 (``conform --runner mrv2`` with a drafter).

The regression traces with a drafter (``tests/traces/mrv2-*``) are replayed on each release in its
environment: every step agrees with the model, and the replay's own observations show
the release's speculator acting: the draft prefill manager capturing at ``capture_model`` and
replaying at ``propose``, the decode manager capturing the draft decode grid, the draft model's
PIECEWISE prefill running eagerly under a compiled target when its class is not compiled (lead L2).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from test_conformance_mrv2 import ROOT, TIMEOUT
from vllm_envs import per_kind, require_python, run_env

pytestmark = pytest.mark.conformance

VERSIONS = ("0.34.0", "0.33.0")
# make test replays the newest release's speculators; 0.33.0's under -m evidence (make evidence), its
# covering corpus with drafters in test_conformance_mrv2.py
KEPT = {"0.34.0"}
L2 = "mrv2-0.34-l2-uncompiled-draft-piecewise-eager"
GRID = "mrv2-0.34-draft-decode-request-grid"
ADAPTIVE = "mrv2-0.34-l1-adaptive-verification-rewrites-full"
MTP = "mrv2-0.33-multi-module-mtp-breakable-keyed-by-module"
TRACES = [ROOT / "tests" / "traces" / f"{name}.json" for name in (L2, GRID, ADAPTIVE, MTP)]
STANDALONE = "standalone-ar"


def standalone_trace(folder: Path, version: str) -> Path:
    """A standalone AR drafter (q = 3) recorded by the release's model: 0.33 builds it no manager,
    0.34 a prefill and a decode manager, and its draft prefill adds a correction token per request."""
    from contract.families import policy_for
    from contract.core.events import CaptureModel, ExecuteModel, LoadModel, ProfileRun, Propose, Resolve
    from contract.families import load_policy
    from contract.core.scenario import DrafterKind, Runner, Scenario, Speculator
    from contract.core.output import write_atomic
    from contract.core.trace import record

    policy = load_policy(policy_for(version, "mrv2"))
    scenario = Scenario(runner=Runner.MRV2, drafter=DrafterKind.WITH_MODEL, speculator=Speculator.STANDALONE_AR,
                        uniform_decode_query_len=3)
    events = [LoadModel(), ProfileRun(), Resolve(), CaptureModel(), ExecuteModel(3), Propose(3), Propose(6, True)]
    path = folder / f"{STANDALONE}.json"
    write_atomic(path, record(scenario, policy, events, name=STANDALONE).dumps())
    return path

OBSERVE = """
import json, sys
from contract.core import trace as T
from contract.runners.mrv2.real.replay import Session
session = Session()
out = {}
for path in sys.argv[1:]:
    t = T.load(path)
    out[t.name] = session.replay(t.scenario, t.events)
print(json.dumps(out))
"""


@pytest.mark.parametrize("version", per_kind(VERSIONS, KEPT))
def test_speculator_traces_agree_with_real_vllm(tmp_path, version):
    python = require_python(version)
    argv = [str(python), "-m", "contract.cli", "conform", "--runner", "mrv2", "--corpus", "none", "--json",
            "--reports", str(tmp_path)]
    for path in [*TRACES, standalone_trace(tmp_path, version)]:
        argv += ["--traces", str(path)]
    proc = subprocess.run(argv, cwd=ROOT, env=run_env(), capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.stdout.strip(), proc.stderr[-2000:]
    data = json.loads((tmp_path / "conformance" / f"vllm-{version}-mrv2.json").read_text())
    assert data["vllm"] == version and data["not_replayed_mrv2"] == 0
    results = {t["name"]: t for t in data["traces"]}
    assert set(results) >= {L2, GRID, ADAPTIVE, MTP, STANDALONE} and all(t["status"] == "replayed" for t in results.values())
    assert not data["disagreements"], json.dumps(data["disagreements"], indent=1)[:4000]
    assert proc.returncode == 0 and data["agreeing_steps"] == data["steps"]
    assert data["steps"] >= 35


def _dispatches(step: dict, role: str = "drafter") -> list[dict]:
    return [d for d in step.get("dispatches", []) if d["role"] == role]


@pytest.mark.parametrize("version", per_kind(VERSIONS, KEPT))
def test_the_release_speculator_really_acts(tmp_path, version):
    """Observations of the replay itself, so a drafter that was not run (or was run by the
    harness instead of the release) cannot pass: the draft managers are the speculator's own,
    labelled when its ``init_cudagraph_manager`` built them, and act on the draft forwards."""
    python = require_python(version)
    traces = [*TRACES, standalone_trace(tmp_path, version)]
    proc = subprocess.run([str(python), "-c", OBSERVE, *map(str, traces)], cwd=ROOT, env=run_env(),
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs = json.loads(proc.stdout.strip().splitlines()[-1])
    l2 = {step["event"]["event"]: step for step in runs[L2]}
    assert l2["load_model"]["stacks"]["drafter"] == "drafter.model"
    capture = _dispatches(l2["capture_model"])
    full = [d for d in capture if d["runtime_mode"] == "FULL"]
    assert full and all(d["layers"] == [{"layer": "drafter:CudaGraphManager(prefill)", "action": "captured",
                                          "depth": 0}] for d in full)
    # Lead L2: the draft class is not compiled, the target is, so the draft prefill manager keeps
    # PIECEWISE and nothing captures it: the draft model runs eagerly.
    piecewise = [d for d in capture if d["runtime_mode"] == "PIECEWISE"]
    assert piecewise and all(d["layers"] == [] and d["ran_eager"] for d in piecewise)
    target = _dispatches(l2["capture_model"], "target")
    assert any(layer["layer"] == "target:compiled" for d in target for layer in d["layers"])
    (propose,) = _dispatches(l2["propose"])
    assert propose["context"] == "propose" and propose["runtime_mode"] == "PIECEWISE" and propose["ran_eager"]
    grid = {step["event"]["event"]: step for step in runs[GRID]}
    decode = [d for d in _dispatches(grid["capture_model"])
              if any(layer["layer"] == "drafter:CudaGraphManager(decode)" for layer in d["layers"])]
    assert {d["batch_descriptor"]["num_reqs"] for d in decode} == ({1, 2, 3, 4} if version == "0.34.0" else {2, 4})
    proposals = [d for step in runs[GRID] if step["event"]["event"] == "propose" for d in _dispatches(step)]
    assert {d["context"] for d in proposals} == {"propose", "propose_decode"}
    replayed = [layer for d in proposals for layer in d["layers"] if layer["action"] == "replayed"]
    assert replayed, proposals
    # Multi-module MTP with breakable on: the draft's breakable runner keys its graphs by module
    # (key_fn), so each module step of a PIECEWISE capture run captures its own graph.
    mtp = {step["event"]["event"]: step for step in runs[MTP]}
    steps = [(d["batch_descriptor"]["num_tokens"], d.get("spec_step_idx"))
             for d in _dispatches(mtp["capture_model"]) if d["runtime_mode"] == "PIECEWISE"
             and d["layers"] == [{"layer": "drafter:breakable_cg_runner", "action": "captured", "depth": 0}]]
    assert steps == [(4, 0), (4, 1), (2, 0), (2, 1)], steps
    # Standalone AR: the draft prefill runs the target's 3 tokens plus a correction token per request.
    standalone = [d for step in runs[STANDALONE] if step["event"]["event"] == "propose" for d in _dispatches(step)]
    assert standalone[0]["batch_descriptor"]["num_tokens"] == 6, standalone[0]
    managers = {layer["layer"] for step in runs[STANDALONE] for d in _dispatches(step) for layer in d["layers"]}
    assert managers == (set() if version == "0.33.0" else
                        {"drafter:CudaGraphManager(prefill)", "drafter:CudaGraphManager(decode)",
                         "drafter:compiled"}), managers
