"""An honest label per counterexample: known and fixed upstream, new, or reading; and "confirmed"
spelled out as what ran.

The label follows the affected-release matrix (``contract/evidence/matrix.py``):

- **known, fixed upstream**: affected on a replayed release and fixed on a later replayed one;
- **new**: affected on a replayed release and on every later replayed one;
- **reading**: no replay shows it (the policy models no release, or the runner is not replayed).

What a confirmation ran: vLLM's own ``VllmConfig``, ``load_model`` wrapping block, resolve
(``_check_and_update_cudagraph_mode``), dispatchers and wrappers, on CPU with CUDA graphs simulated
(``contract/conformance/simcuda.py``); the runner's orchestration between those calls is mirrored
from the vLLM 0.30.0 lines below (``contract/conformance/replay.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from contract.evidence import matrix
from contract.scenario import DrafterKind
from contract.trace import Trace

# What upstream changed between an affected and a fixed release, where this project has read it
# (spec/vllm-releases.md: the 0.29.0 -> 0.30.0 wrapper and load_model diff).
UPSTREAM_FIXES: dict[tuple[str, str], str] = {
    ("0.29.0", "0.30.0"): "vLLM PR #56312 (\"Scope breakable cudagraphs to the piecewise path only\"), "
                          "first released in 0.30.0",
}

# Runner steps the replay mirrors, per event: vLLM 0.30.0 ``v1/worker/gpu_model_runner.py`` lines
# (``llm_base_proposer.py`` for propose).
MIRRORED: dict[str, str] = {
    "profile_run": "`profile_run` → `_dummy_run` (:6464-6537, :5850-6255)",
    "profile_cudagraph_memory": "`profile_cudagraph_memory` (:6661-6828)",
    "resolve": "`initialize_kv_cache` → `_check_and_update_cudagraph_mode` call (:7416, :7131-7135)",
    "capture_model": "`capture_model` → `_capture_cudagraphs` (:6830-6934, :6936-7034)",
    "execute_model": "`execute_model` → `_determine_batch_execution_and_padding` (:3953-4060)",
    "propose": "`propose` (`llm_base_proposer.py:515-601`)",
}


@dataclass(frozen=True)
class Status:
    kind: str  # "known, fixed upstream", "new", "reading"
    text: str


def what_ran(trace: Trace, release: str) -> str:
    kinds = list(dict.fromkeys(e.kind for e in trace.events if e.kind in MIRRORED))
    text = (f"on vLLM {release}'s code on CPU, CUDA graphs simulated: vLLM's own `VllmConfig`, `load_model` "
            "wrapping block, resolve, dispatchers and wrappers ran")
    if kinds:
        text += "; runner steps mirrored from vLLM 0.30.0's `v1/worker/gpu_model_runner.py`: " + "; ".join(
            MIRRORED[k] for k in kinds)
    if trace.scenario.drafter is not DrafterKind.NONE:
        text += "; `speculative_config` is a stand-in (no draft model is loaded)"
    if trace.scenario.ubatching:
        text += "; the micro-batched forward itself is not executed (it needs data-parallel coordination)"
    return text


def status(trace: Trace, conformance: dict[str, dict]) -> Status:
    cells = matrix.row(trace, conformance)
    affected = [c.release for c in cells if c.state == matrix.AFFECTED]
    if not affected:
        own = [c for c in cells if matrix.release_policy(c.release, trace.scenario.runner) == trace.policy]
        why = own[-1].detail if own else "no replay shows it"
        return Status("reading", f"reading: not confirmed on real vLLM ({why})")
    first = affected[0]
    fixed = [c.release for c in cells if c.state == matrix.FIXED and c.release > first]
    ran = what_ran(trace, " and ".join(affected))
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
