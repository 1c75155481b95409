"""An honest label per counterexample: known and fixed upstream, new, refuted or reading; and "confirmed"
spelled out as what ran.

The label follows the affected-release matrix (``contract/evidence/matrix.py``):

- **known, fixed upstream**: affected on a replayed release and fixed on a later replayed one;
- **new**: affected on a replayed release and on every later replayed one;
- **refuted**: a replay on a release the trace's policy models differs from the model;
- **reading**: no replay shows it (the policy models no release, or the trace was not replayed).

What a confirmation ran, per runner (the functions and lines themselves are cited on each page from
the replay's recorded path, ``decision_lines.py``). Model Runner V1: vLLM's own ``VllmConfig``,
``load_model`` wrapping block, runner steps (``profile_run``, ``_dummy_run``,
``profile_cudagraph_memory``, ``capture_model``), resolve, dispatchers and wrappers, on CPU with
CUDA graphs simulated (``contract/real/simcuda.py``); the harness mirrors the batch-to-dispatch
statements of ``execute_model`` and ``propose`` (``contract/runners/mrv1/real/replay.py``). Model Runner
V2: the blocks of ``v1/worker/gpu/model_runner.py`` that decide modes, cut with ``ast`` and run
unchanged, the CUDA-graph manager, ``profile_cudagraph_memory`` and ``capture_model`` entire, and a
first forward compiled by real Dynamo (``contract/runners/mrv2/real/``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from contract.evidence import matrix
from contract.core.scenario import DrafterKind, Runner
from contract.core.trace import Trace

# What upstream changed between an affected and a fixed release, where this project has read it
# (spec/vllm-releases.md: the 0.29.0 -> 0.30.0 wrapper and load_model diff).
UPSTREAM_FIXES: dict[tuple[str, str], str] = {
    ("0.29.0", "0.30.0"): "vLLM PR #56312 (\"Scope breakable cudagraphs to the piecewise path only\"), "
                          "first released in 0.30.0",
}

# What the harness writes itself instead of running vLLM's lines, per event (MRV1).
MIRRORED: dict[str, str] = {
    "execute_model": "`execute_model`'s batch-to-dispatch statements",
    "propose": "`propose`'s batch-to-dispatch statements",
}

NOT_REPLAYED = "reading: not replayed on real vLLM yet"


@dataclass(frozen=True)
class Status:
    kind: str  # "known, fixed upstream", "new", "refuted", "reading", "replayed"
    text: str


def what_ran(trace: Trace, release: str) -> str:
    if trace.scenario.runner is Runner.MRV2:
        return (f"on vLLM {release}'s code on CPU, CUDA graphs simulated: vLLM's own `VllmConfig`, resolve, "
                "`has_compiled_submodule`, the CUDA-graph manager (candidates, capture loop, `dispatch`, "
                "`run_fullgraph`, `run_pw_graph`, the breakable runner), `dispatch_cg_and_sync_dp` (one DP rank), "
                "`profile_cudagraph_memory` and `capture_model` entire, and the `initialize_kv_cache` and "
                "`execute_model` blocks that decide modes, cut from `v1/worker/gpu/model_runner.py` and run "
                "unchanged; the first forward compiled by real Dynamo through `VllmBackend`; stand-ins: the "
                "KV-cache plumbing, a tiny model, one pipeline rank")
    text = (f"on vLLM {release}'s code on CPU, CUDA graphs simulated: vLLM's own `VllmConfig`, `load_model` "
            "wrapping block, runner steps (`profile_run`, `_dummy_run`, `profile_cudagraph_memory`, "
            "`capture_model`), resolve, dispatchers and wrappers ran")
    kinds = list(dict.fromkeys(e.kind for e in trace.events if e.kind in MIRRORED))
    if kinds:
        text += "; mirrored by the harness: " + " and ".join(MIRRORED[k] for k in kinds)
    if trace.scenario.drafter is not DrafterKind.NONE:
        text += "; `speculative_config` is a stand-in (no draft model is loaded)"
    if trace.scenario.ubatching:
        text += "; the micro-batched forward itself is not executed (it needs data-parallel coordination)"
    return text


def not_replayed(trace: Trace, own: list[matrix.Cell], trace_path: str) -> str:
    """Why no replay ran: the replay's own reason where it skipped the trace, else how to run it."""
    reasons = sorted({re.sub(r"^not replayed \((.*)\)$", r"\1", c.detail.split(";")[0])
                      for c in own if c.detail and not c.detail.startswith("no replay")})
    if reasons:
        return f"{NOT_REPLAYED} ({'; '.join(reasons)})"
    return (f"{NOT_REPLAYED} (`cudagraph-contract conform --vllm {matrix.replay_release(trace)} "
            f"--traces {trace_path or trace.name + '.json'}` replays it)")


def status(trace: Trace, conformance: dict, trace_path: str = "") -> Status:
    cells = matrix.row(trace, conformance)
    affected = [c.release for c in cells if c.state == matrix.AFFECTED]
    own = [c for c in cells if matrix.release_policy(c.release, trace.scenario.runner) == trace.policy]
    refuted = [c for c in own if c.state == matrix.REFUTED]
    if refuted:
        return Status("refuted", "refuted: " + "; ".join(
            f"on vLLM {c.release}'s code ({c.detail}), vLLM does not do what the model says" for c in refuted))
    if not affected:
        why = own[-1].detail if own else "no replay shows it"
        if not [c for c in cells if c.state in (matrix.FIXED, matrix.REFUTED)]:
            return Status("reading", not_replayed(trace, own, trace_path))
        return Status("reading", f"reading: not confirmed on real vLLM ({why})")
    first = affected[0]
    fixed = [c.release for c in cells if c.state == matrix.FIXED and c.release > first]
    ran = what_ran(trace, " and ".join(affected))
    if trace.property is None:  # no property (a differential's lost graphs): the steps are the observation
        return Status("replayed", f"vLLM does at these steps what the model says: confirmed {ran}")
    modelled = {matrix.release_policy(r, trace.scenario.runner) for r in matrix.RELEASES}
    if trace.policy not in modelled:
        return Status("reading", f"reading: `{trace.policy}` models no released vLLM; the same events are "
                                 f"confirmed {ran}")
    if fixed and not [r for r in affected if r > fixed[0]]:
        fix = UPSTREAM_FIXES.get((affected[-1], fixed[0]), f"a change between {affected[-1]} and {fixed[0]}")
        return Status("known, fixed upstream",
                      f"known, fixed upstream by {fix}: a positive control. Confirmed {ran}; "
                      f"replayed fixed on {', '.join(fixed)}")
    return Status("new", f"new: confirmed {ran}")
