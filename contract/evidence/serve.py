"""A counterexample's scenario as a ``vllm serve`` command a maintainer can paste.

Every flag is one the release's ``EngineArgs`` parser accepts (checked by the test suite with vLLM's
own parser); the models are public Hugging Face repositories this tool cannot download or run, so
the command is stated, not executed. The attention backend is chosen by name from what the
release's source says it reports (``release_facts.json``), and ``splitting_ops`` lists the
release's ``CompilationConfig._attention_ops``.

vLLM's default start-up (``Worker.determine_available_memory``, ``v1/worker/gpu_worker.py:527-570``
in 0.29.0) runs ``profile_cudagraph_memory`` whenever the mode is not NONE; ``--kv-cache-memory-bytes``
skips it. A counterexample found on the shorter path is shown on the default one when the model
says it fails there too, and with ``--kv-cache-memory-bytes`` only when it does not.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from contract.core.events import ProfileCudagraphMemory, ProfileRun
from contract.evidence import logs
from contract.evidence.release_facts import BackendSupport, ReleaseFacts
from contract.core.scenario import CUDAGRAPH_CAPTURE_SIZES, MAX_NUM_SEQS, DrafterKind, Runner, Scenario, Speculator, SplittingOps

# Public checkpoints: a small dense model; vLLM's own EAGLE-3 pair (tests/v1/e2e/test_spec_decode.py);
# a MoE model and its EAGLE-3 head for dual batch overlap, which needs expert parallelism.
DENSE = "Qwen/Qwen3-0.6B"
EAGLE_TARGET, EAGLE_HEAD = "Qwen/Qwen3-8B", "AngelSlim/Qwen3-8B_eagle3"
MOE, MOE_EAGLE_HEAD = "Qwen/Qwen3-30B-A3B", "AngelSlim/Qwen3-a3B_eagle3"
MAX_MODEL_LEN = 4096
KV_CACHE_MEMORY_BYTES = 2 * 1024**3  # 2 GiB: >= one 4096-token sequence for each model above
# Backends a dense decoder can use on NVIDIA GPUs, in the order vLLM's docs list them.
NVIDIA_DENSE = ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION")
REPO = "https://github.com/vllm-project/vllm/blob"
# The `--speculative-config` method of each MRV2 speculator kind.
METHOD = {Speculator.EAGLE: "eagle", Speculator.MULTI_MODULE_MTP: "mtp", Speculator.DFLASH: "dflash",
          Speculator.STANDALONE_AR: "draft_model"}
# Releases whose logging the test suite compares these lines with, for every MRV1 scenario class.
LOGS_CHECKED = ("0.29.0", "0.30.0")


def permalink(release: str, site: str) -> str:
    """``path:line`` (relative to ``vllm/``) at the release tag."""
    path, _, line = site.partition(":")
    return f"[`{path}:{line}`]({REPO}/v{release}/vllm/{path}#L{line})"


@dataclass(frozen=True)
class Backend:
    choice: BackendSupport | None
    note: str  # when the level holds, or why no NVIDIA dense backend gives it


def backend_for(level: str, facts: ReleaseFacts) -> Backend:
    rows = {b.backend: b for b in facts.attention_backends}
    dense = [rows[n] for n in NVIDIA_DENSE if n in rows]
    for b in dense:
        if b.support == (level,):
            return Backend(b, "")
    for b in dense:
        if b.gives(level):
            return Backend(b, b.condition)
    others = [b.backend for b in facts.attention_backends if b.gives(level)]
    return Backend(None, f"no attention backend for dense models on NVIDIA GPUs reports {level} in vLLM "
                         f"{facts.release}; backends that do: {', '.join(others) or 'none'}")


@dataclass(frozen=True)
class Command:
    env: tuple[str, ...]
    argv: tuple[str, ...]

    def shell(self) -> str:
        parts = [*self.env, "vllm", "serve", *(shlex.quote(a) for a in self.argv)]
        lines, line = [], ""
        for p in parts:
            if p.startswith("--") and line:
                lines.append(line)
                line = "  " + p
            else:
                line = f"{line} {p}" if line else p
        lines.append(line)
        return " \\\n".join(lines)


def command(s: Scenario, facts: ReleaseFacts, *, skip_memory_profile: bool = False) -> Command:
    env = [f"VLLM_USE_V2_MODEL_RUNNER={'1' if s.runner is Runner.MRV2 else '0'}",
           f"VLLM_USE_BREAKABLE_CUDAGRAPH={'1' if s.breakable else '0'}"]
    eagle = s.drafter is DrafterKind.WITH_MODEL
    model = MOE if s.ubatching else EAGLE_TARGET if eagle else DENSE
    argv = [model, "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", str(MAX_NUM_SEQS)]
    backend = backend_for(s.attention_support.name, facts).choice
    if backend is not None:
        argv += ["--attention-backend", backend.backend]
    compilation = {"mode": s.compilation_mode.name, "cudagraph_mode": s.cudagraph_mode.name,
                   "cudagraph_capture_sizes": list(CUDAGRAPH_CAPTURE_SIZES),
                   "max_cudagraph_capture_size": max(CUDAGRAPH_CAPTURE_SIZES)}
    if s.splitting_ops is SplittingOps.ATTENTION:
        compilation["splitting_ops"] = list(facts.attention_ops)
    elif s.splitting_ops is SplittingOps.EMPTY:
        compilation["splitting_ops"] = []
    argv += ["--compilation-config", json.dumps(compilation)]
    if s.drafter is not DrafterKind.NONE:
        spec: dict = ({"method": "eagle3", "model": MOE_EAGLE_HEAD if s.ubatching else EAGLE_HEAD} if eagle
                      else {"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 4})
        if eagle and s.speculator is not Speculator.EAGLE:
            # MTP heads ship inside the target checkpoint; the other MRV2 speculators name their draft.
            spec = {"method": METHOD[s.speculator]} | ({"model": EAGLE_HEAD} if s.speculator is not
                                                        Speculator.MULTI_MODULE_MTP else {})
        spec["num_speculative_tokens"] = s.uniform_decode_query_len - 1
        if s.spec_enforce_eager:
            spec["enforce_eager"] = True
        if s.adaptive_verification:
            spec["enable_adaptive_verification"] = True
        argv += ["--speculative-config", json.dumps(spec)]
    if s.ubatching:
        argv += ["--data-parallel-size", "2", "--enable-expert-parallel",
                 "--all2all-backend", "deepep_low_latency", "--enable-dbo"]
    if not s.extensible_kv_cache:
        argv += ["--no-enable-extensible-kv-cache"]  # 0.34.0: memory profiling captures again
    if skip_memory_profile:
        argv += ["--kv-cache-memory-bytes", str(KV_CACHE_MEMORY_BYTES)]
    return Command(tuple(env), tuple(argv))


def on_default_path(events: list) -> list | None:
    """The events with ``profile_cudagraph_memory`` after the first forward, as vLLM's default
    start-up runs it; None when the trace already has it or has no first forward."""
    if any(isinstance(e, ProfileCudagraphMemory) for e in events):
        return None
    for i, e in enumerate(events):
        if isinstance(e, ProfileRun):
            return [*events[: i + 1], ProfileCudagraphMemory(), *events[i + 1:]]
    return None


def default_path_fails(trace, policy) -> bool | None:
    """Whether the model reports the trace's property on vLLM's default start-up; None when the
    trace is already on it: it has the memory profile, or its mode makes vLLM skip it (the runner
    refuses the step), or it is MRV2 (no memory-profile step in the model)."""
    from contract.core.trace import TraceError, run_events

    if trace.scenario.runner is not Runner.MRV1:
        return None
    events = on_default_path(trace.events)
    if events is None:
        return None
    try:
        _, violations = run_events(trace.scenario, policy, events)
    except TraceError:
        return None
    return any(v.property == trace.property for v in violations)


def markdown(trace, policy, facts: ReleaseFacts) -> list[str]:
    """The reproduction section of a page: command(s), backend table, log lines."""
    s = trace.scenario
    default_fails = default_path_fails(trace, policy)
    shortest_differs = default_fails is False
    lines = [f"On vLLM {facts.release} (the models are public Hugging Face checkpoints; this tool does not "
             "download or run them):", "", "```bash", command(s, facts).shell(), "```"]
    if default_fails:
        lines += ["", "This is vLLM's default start-up path; the shortest counterexample skips "
                  "`profile_cudagraph_memory` (as `--kv-cache-memory-bytes` does) and fails the same way."]
    elif shortest_differs:
        lines += ["", "vLLM's default start-up above does not show it: the counterexample needs "
                  "`profile_cudagraph_memory` skipped, which `--kv-cache-memory-bytes` does:", "",
                  "```bash", command(s, facts, skip_memory_profile=True).shell(), "```"]
    lines += ["", *backend_table(s.attention_support.name, facts)]
    lines += ["", *log_section(s, facts, backend_class(s.attention_support.name, facts))]
    if any("silent eager fallback" in v["message"] for v in trace.expected_violations):
        lines.append("- nothing when a batch dispatched with a CUDA-graph mode then reaches no capturer and runs "
                     "eagerly: the log keeps naming the graph mode")
    if s.splitting_ops is SplittingOps.ATTENTION:
        lines += ["", "`splitting_ops` lists every op of `CompilationConfig._attention_ops`: "
                  "`splitting_ops_contain_attention()` is true only when all of them are listed."]
    return lines


def backend_table(level: str, facts: ReleaseFacts) -> list[str]:
    chosen = backend_for(level, facts)
    head = (f"The scenario needs the minimum `AttentionCGSupport` over the model's backends to be `{level}`: "
            + (f"`--attention-backend {chosen.choice.backend}`"
               + (" reports it only under the condition its source states (below)" if chosen.note else "")
               if chosen.choice else chosen.note) + ".")
    lines = [head, "", f"What vLLM {facts.release}'s NVIDIA dense-model backends report "
             "(`get_builder_cls().get_cudagraph_support`):", ""]
    rows = {b.backend: b for b in facts.attention_backends}
    for name in NVIDIA_DENSE:
        b = rows.get(name)
        if b is not None:
            how = ", ".join(f"`{x}`" for x in b.support) + (f" ({b.condition})" if b.condition else "")
            lines.append(f"- `{b.backend}`: {how}; {permalink(facts.release, b.where)}")
    return lines


def backend_class(level: str, facts: ReleaseFacts) -> str:
    """The class resolve's messages name: the chosen backend's, else any backend reporting ``level``."""
    chosen = backend_for(level, facts).choice
    if chosen is None:
        chosen = next((b for b in facts.attention_backends if b.gives(level)), None)
    return chosen.class_name if chosen else "AttentionBackend"


def log_section(s: Scenario, facts: ReleaseFacts, backend_class: str) -> list[str]:
    found = logs.start_up_lines(s, facts.release, backend_class)
    checked = s.runner is Runner.MRV1 and facts.release in LOGS_CHECKED
    lines = ["Log lines vLLM prints on this path (its templates, filled in; "
             + ("equal to what vLLM logs when its config and resolve run):" if checked
                else "not compared with a run of this release):"), ""]
    if not found:
        lines.append("- no cudagraph-mode message at start-up")
    for line in found:
        site = facts.site(line.site)
        lines.append(f"- `{line.level}` {line.text}" + (f" — {permalink(facts.release, site)}" if site else ""))
    return lines
