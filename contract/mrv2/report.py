"""Where in vLLM's MRV2 a violation comes from, for the counterexample pages (``release`` is
"0.33" or "0.34"; paths relative to that wheel's ``vllm/``)."""

from __future__ import annotations

from contract.observation import Dispatch
from contract.scenario import Scenario, Speculator

METHOD = {Speculator.EAGLE: "eagle", Speculator.MULTI_MODULE_MTP: "mtp", Speculator.DFLASH: "dflash",
          Speculator.STANDALONE_AR: "draft_model"}

_LINES = {
    "0.33": {
        "backends": "`compilation/backends.py:678-682` (inner PIECEWISE wrappers decided at the first forward)",
        "resolve": "`config/compilation.py:1395-1419` (resolve upgrades FULL to FULL_AND_PIECEWISE after the first forward)",
        "available": "`v1/worker/gpu/model_runner.py:748-750` (`piecewise_capture_available` reads the target model only)",
        "adaptive": "`v1/worker/gpu/spec_decode/adaptive_verification.py:36-43` (FULL rewritten to FULL_AND_PIECEWISE)",
        "draft": "`v1/worker/gpu/spec_decode/target_dependent_ar/speculator.py:89-96` (the draft prefill manager takes the target's mode)",
        "run_pw": "`v1/worker/gpu/cudagraph_utils.py:578-583` (`run_pw_graph`: breakable runner or the model)",
        "breakable": "`v1/worker/gpu/cudagraph_utils.py:195-198,570-576` (`use_breakable_cg`, the match-any runner)",
        "graphs": "`v1/worker/gpu/cudagraph_utils.py:486-515,555-568` (manager capture and `run_fullgraph`)",
        "profiling": "`v1/worker/gpu/cudagraph_utils.py:921-1028` (`profile_cudagraph_memory` clears every graph)",
        "mtp": "`v1/worker/gpu/spec_decode/multi_module_mtp/speculator.py:99-128` (mode remap and `key_fn`)",
    },
    "0.34": {
        "backends": "`compilation/backends.py:682-686` (inner PIECEWISE wrappers decided at the first forward)",
        "resolve": "`config/compilation.py:1558-1582` (resolve upgrades FULL to FULL_AND_PIECEWISE after the first forward)",
        "available": "`v1/worker/gpu/model_runner.py:783-786` (`piecewise_capture_available` reads the target model only)",
        "adaptive": "`v1/worker/gpu/spec_decode/adaptive_verification.py:37-44` (FULL rewritten to FULL_AND_PIECEWISE)",
        "draft": "`v1/worker/gpu/spec_decode/target_dependent_ar/speculator.py:42-53` (the draft prefill manager takes the target's mode)",
        "run_pw": "`v1/worker/gpu/cudagraph_utils.py:627-632` (`run_pw_graph`: breakable runner or the model)",
        "breakable": "`v1/worker/gpu/cudagraph_utils.py:228-231,619-625` (`use_breakable_cg`, the match-any runner)",
        "graphs": "`v1/worker/gpu/cudagraph_utils.py:521-550,604-617` (manager capture and `run_fullgraph`)",
        "profiling": "`v1/worker/gpu/cudagraph_utils.py:988-1095` (`profile_cudagraph_memory` clears every graph)",
        "mtp": "`v1/worker/gpu/spec_decode/multi_module_mtp/speculator.py:99-130` (mode remap and `key_fn`)",
    },
}


def responsible_lines(release: str, prop: str, scenario: Scenario, d: Dispatch | None) -> list[str]:
    lines = _LINES[release]
    if d is None:
        return [lines["graphs"]]
    if prop == "P5":
        return [lines["profiling"], lines["mtp"]] if d.role == "drafter" else [lines["profiling"]]
    if prop in ("P3", "P2") or (prop == "P1" and len(d.acting) > 1):
        return [lines["breakable"], lines["run_pw"]]
    if prop == "P1" and d.role == "drafter":
        return [lines["draft"], lines["available"], lines["run_pw"], lines["backends"]]
    if prop == "P1":
        out = [lines["backends"], lines["resolve"]]
        return out + ([lines["adaptive"]] if scenario.adaptive_verification else []) + [lines["run_pw"]]
    return [lines["graphs"]]
