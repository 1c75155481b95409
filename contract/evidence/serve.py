"""A counterexample's scenario as a ``vllm serve`` command a maintainer can paste.

What each scenario setting becomes (flags, environment variables, checkpoint, backend, the GPUs on
which the backend reports the scenario's support level) is ``reach.reach``'s plan; a scenario no
stored public checkpoint reaches is labelled with the reason instead of a command. Every command
is run through the release's own parser and config code on CPU by the test suite
(``engine_check``), which compares the settings vLLM builds with the scenario's. The models are
public Hugging Face repositories this tool cannot download or run, so the command is stated, not
executed; ``splitting_ops`` lists the release's ``CompilationConfig._attention_ops``. A witness
whose violation needs a batch after start-up gets the requests that make it (``requests.py``).

vLLM's default start-up (``Worker.determine_available_memory``, ``v1/worker/gpu_worker.py:527-570``
in 0.29.0) runs ``profile_cudagraph_memory`` whenever the mode is not NONE; ``--kv-cache-memory-bytes``
skips it. A counterexample found on the shorter path is shown on the default one when the model
says it fails there too, and with ``--kv-cache-memory-bytes`` only when it does not.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from contract.core.events import ProfileCudagraphMemory, ProfileRun
from contract.evidence import logs, reach, requests
from contract.evidence.release_facts import CAPABILITY_GPUS, BackendSupport, ReleaseFacts, gpus, hardware
from contract.core.scenario import CUDAGRAPH_CAPTURE_SIZES, Runner, Scenario, SplittingOps

# Public checkpoints (reach.py chooses among them; hf_configs/ keeps their config.json).
DENSE, EAGLE_TARGET, EAGLE_HEAD = reach.DENSE, reach.EAGLE_TARGET, reach.EAGLE_HEAD
MOE, MOE_MTP = reach.MOE, reach.MOE_MTP
MAX_MODEL_LEN = reach.MAX_MODEL_LEN
KV_CACHE_MEMORY_BYTES = 2 * 1024**3  # 2 GiB: >= one 4096-token sequence for each model above
# Backends a dense decoder can use on NVIDIA GPUs, in the order vLLM's docs list them.
NVIDIA_DENSE = ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION")
REPO = "https://github.com/vllm-project/vllm/blob"
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
    plan: reach.Plan | None = field(default=None, compare=False)

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

    def environ(self) -> dict[str, str]:
        return dict(e.split("=", 1) for e in self.env)


def compilation_config(s: Scenario, facts: ReleaseFacts) -> dict:
    compilation = {"mode": s.compilation_mode.name, "cudagraph_mode": s.cudagraph_mode.name,
                   "cudagraph_capture_sizes": list(CUDAGRAPH_CAPTURE_SIZES),
                   "max_cudagraph_capture_size": max(CUDAGRAPH_CAPTURE_SIZES)}
    compilation.update(reach.splitting_ops_flag(s, facts.attention_ops))
    return compilation


def command(s: Scenario, facts: ReleaseFacts, *, skip_memory_profile: bool = False) -> Command | None:
    """The ``vllm serve`` command for ``s`` on ``facts.release``; None when no stored public
    checkpoint reaches it (``reach.reach`` says why)."""
    found = reach.reach(s, facts.release)
    if not found.reachable:
        return None
    plan = found.plan
    argv = plan.argv(compilation_config(s, facts), KV_CACHE_MEMORY_BYTES if skip_memory_profile else None)
    return Command(tuple(f"{k}={v}" for k, v in plan.env), tuple(argv), plan)


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


def reproductions(trace, policy, facts: ReleaseFacts) -> list[Command]:
    """The commands a page shows for ``trace`` on ``facts.release``, vLLM's default start-up first;
    the last is the one that shows the violation (``--kv-cache-memory-bytes`` when only the shorter
    start-up does); [] when no stored public checkpoint reaches the scenario."""
    first = command(trace.scenario, facts)
    if first is None:
        return []
    if default_path_fails(trace, policy) is False:
        return [first, command(trace.scenario, facts, skip_memory_profile=True)]
    return [first]


def markdown(trace, policy, facts: ReleaseFacts) -> list[str]:
    """The reproduction section of a page: command(s), the GPUs it needs, the requests, the
    backend table, log lines; or the reason no stored public checkpoint reaches the scenario."""
    s = trace.scenario
    found = reach.reach(s, facts.release)
    if not found.reachable:
        lines = [f"On vLLM {facts.release}: **{found.reason}**.", ""]
        lines += backend_table(s.attention_support.name, facts)
        return lines
    commands = reproductions(trace, policy, facts)
    cmd = commands[0]
    lines = [f"On vLLM {facts.release} (the models are public Hugging Face checkpoints; this tool does not "
             "download or run them):", "", "```bash", cmd.shell(), "```"]
    if len(commands) > 1:
        lines += ["", "vLLM's default start-up above does not show it: the counterexample needs "
                  "`profile_cudagraph_memory` skipped, which `--kv-cache-memory-bytes` does:", "",
                  "```bash", commands[1].shell(), "```"]
    elif default_path_fails(trace, policy):
        lines += ["", "This is vLLM's default start-up path; the shortest counterexample skips "
                  "`profile_cudagraph_memory` (as `--kv-cache-memory-bytes` does) and fails the same way."]
    lines += ["", *plan_lines(cmd.plan)]
    lines += ["", *requests.markdown(trace, cmd.plan.model)]
    lines += ["", *backend_table(s.attention_support.name, facts)]
    lines += ["", *log_section(s, facts, backend_class(s.attention_support.name, facts))]
    if any("silent eager fallback" in v["message"] for v in trace.expected_violations):
        lines.append("- nothing when a batch dispatched with a CUDA-graph mode then reaches no capturer and runs "
                     "eagerly: the log keeps naming the graph mode")
    if s.splitting_ops is SplittingOps.ATTENTION:
        lines += ["", "`splitting_ops` lists every op of `CompilationConfig._attention_ops`: "
                  "`splitting_ops_contain_attention()` is true only when all of them are listed."]
    return lines


def plan_lines(plan: reach.Plan) -> list[str]:
    """Where the command runs and what each choice rests on."""
    s = plan.scenario
    where = ("an NVIDIA GPU" if plan.one_gpu else
             f"{plan.gpus} NVIDIA GPUs" if plan.fits else "more than one NVIDIA GPU (the weights do not fit one)")
    lines = [f"Run it on {where} of compute capability {gpus(plan.capabilities)}. There "
             f"`--attention-backend {plan.backend}`"
             + (f" with `--attention-config '{reach.variant_name(plan.attention_config)}'`" if plan.attention_config else "")
             + f" gives the minimum `AttentionCGSupport` the scenario needs, `{s.attention_support.name}` "
             "(vLLM's `get_cudagraph_support` run per compute capability, `release_facts.json`)."]
    lines += [f"- {note}" for note in plan.notes if not note.startswith(plan.backend)]
    return lines + [f"- weights: {plan.weights}"]


def backend_table(level: str, facts: ReleaseFacts) -> list[str]:
    chosen = backend_for(level, facts)
    head = (f"The scenario needs the minimum `AttentionCGSupport` over the model's backends to be `{level}`: "
            + (f"`--attention-backend {chosen.choice.backend}`"
               + (" reports it only under the condition its source states (below)" if chosen.note else "")
               if chosen.choice else chosen.note) + ".")
    lines = [head, "", f"What vLLM {facts.release}'s NVIDIA dense-model backends report "
             "(`get_builder_cls().get_cudagraph_support`, run per GPU compute capability):", ""]
    rows = {b.backend: b for b in facts.attention_backends}
    for name in NVIDIA_DENSE:
        b = rows.get(name)
        if b is not None:
            levels = hardware(facts.release, name)
            how = ("; ".join(levels) if levels else
                   ", ".join(f"`{x}`" for x in b.support) + (f" ({b.condition})" if b.condition else ""))
            lines.append(f"- `{b.backend}`: {how}; decided at {permalink(facts.release, b.where)}")
    lines += ["", "Compute capabilities: " + "; ".join(f"{c} {g}" for c, g in CAPABILITY_GPUS.items())
              + ". FlashAttention's level follows the FlashAttention version vLLM picks for the GPU; the table "
              "takes FA3 on 9.0 and FA4 on 10.x, as vllm-flash-attn builds them."]
    return lines


def backend_class(level: str, facts: ReleaseFacts) -> str:
    """The class resolve's messages name (``attn_backend.__name__`` of the least-supporting
    backend): for NEVER, Llama 4's chunked local attention, ``subclass_attention_backend``'s
    ``ChunkedLocalAttention_<chunk>_`` + the backend's class (``v1/attention/backend.py``);
    otherwise the chosen backend's, else any backend reporting ``level``."""
    rows = {b.backend: b for b in facts.attention_backends}
    if level == "NEVER":
        backend = rows.get(reach.LEVEL_BACKEND[level][0])
        chunk = reach.chunk_size(reach.CHUNKED_LOCAL)
        if backend is not None and chunk:
            return f"ChunkedLocalAttention_{chunk}_{backend.class_name}"
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
