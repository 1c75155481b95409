"""Which public flags, environment variables, checkpoints and attention backends reach a scenario on
a vLLM release, or why none does.

Each scenario setting maps to something a user sets (``contract/core/scenario.py``):

- ``runner``: ``VLLM_USE_V2_MODEL_RUNNER`` (``envs.py``); 0.34.0 has only MRV2 and refuses the
  variable set to anything but 1 (``34:platforms/interface.py``, ``Platform.validate_environ``).
- ``breakable``: ``VLLM_USE_BREAKABLE_CUDAGRAPH``, set to 0 explicitly when off: unset,
  ``_maybe_enable_breakable_cudagraph`` turns it on for some architectures (``config/vllm.py``).
- ``ubatching``: ``--enable-dbo``, which needs data parallelism with expert parallelism and a
  DeepEP all-to-all backend (``config/parallel.py``), so a mixture-of-experts checkpoint; on several
  ranks with the modelled thresholds (``--dbo-decode-token-threshold``, ``--dbo-prefill-token-threshold``).
- ``data_parallel_size``: ``--data-parallel-size``, one GPU per rank.
- ``cudagraph_mode``, ``compilation_mode``, ``splitting_ops``: ``--compilation-config``.
- ``attention_support``: the minimum ``AttentionCGSupport`` over the model's attention metadata
  builders, so an attention backend, an ``--attention-config`` that pins what the backend's
  ``get_cudagraph_support`` depends on, and the GPUs (compute capabilities) on which the release's
  code reports that level, read from ``release_facts.json``'s ``support_by_capability`` (vLLM's own
  function, run per capability). NEVER comes from a model, not a backend: Llama 4's chunked local
  attention layers report it under every backend
  (``model_executor/layers/attention/chunked_local_attention.py``).
- ``drafter``, ``speculator``, ``uniform_decode_query_len``, ``spec_enforce_eager``,
  ``adaptive_verification``: ``--speculative-config`` (method, draft checkpoint,
  ``num_speculative_tokens``, ``enforce_eager``, ``enable_adaptive_verification``).
- ``model_compiled``, ``draft_compiled``: properties of the checkpoint's architecture, read from
  the release's source (``model_facts.json``): whether its class reaches an active
  ``@support_torch_compile`` class.
- ``extensible_kv_cache``: on by default on CUDA in 0.34.0; ``--no-enable-extensible-kv-cache``.
- ``pipeline_parallel_size``: ``--pipeline-parallel-size``, one GPU per stage;
  ``attention_support_stage`` needs a hybrid checkpoint whose stages hold different attention
  layers, reported as not stored.
- ``mamba_cache_blocks``: a hybrid (Mamba or GDN) checkpoint and a KV-cache budget that leaves its
  Mamba cache fewer blocks than ``--max-num-seqs``; no hybrid checkpoint is stored, so it is reported
  as not stored.
- ``max_loras``, ``specialize_active_lora``: ``--enable-lora --max-loras N`` and
  ``--specialize-active-lora`` (``engine/arg_utils.py``); the adapters a batch's requests ask for
  are the user's (``--lora-modules``), none is stored.
- ``attention_support_draft_only``: ``speculative_config.attention_backend`` names the weaker
  backend for the draft model's layers, the target on the ALWAYS one; ``varlen_decode_bound`` needs a
  backend no stored checkpoint and GPU pins, so it is reported as not stored.

The checkpoints are the public Hugging Face repositories whose ``config.json`` the project keeps in
``hf_configs/`` (``hf_configs/README.md``); a setting only other checkpoints reach is reported as
not reachable with these, with the architectures that would reach it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from contract.evidence import weights
from contract.evidence.release_facts import adaptive_refused, support_by_capability
from contract.core.scenario import (
    ConfigRevision,
    DrafterKind,
    Runner,
    Scenario,
    Speculator,
    SplittingOps,
)

HF_CONFIGS = Path(__file__).with_name("hf_configs")
RELEASES = ("0.29.0", "0.30.0", "0.33.0", "0.34.0")
# The one GPU-independent backend per support level, and the --attention-config that pins the
# inputs its get_cudagraph_support reads (release_facts.SUPPORT_VARIANTS names the same pairs).
LEVEL_BACKEND = {
    "ALWAYS": ("TRITON_ATTN", {}),
    "UNIFORM_BATCH": ("FLASH_ATTN", {"flash_attn_version": 2}),
    "UNIFORM_SINGLE_TOKEN_DECODE": ("FLASHINFER", {"use_trtllm_attention": False}),
    "NEVER": ("TRITON_ATTN", {}),  # the level comes from the model's chunked local attention
}
MAX_MODEL_LEN = 4096
MAX_NUM_SEQS = 4
# Methods whose proposer has no draft model (MRV1 n-gram/suffix, spec §7).
MODELLESS = ("ngram", "suffix", "ngram_gpu")


@dataclass(frozen=True)
class Checkpoint:
    """A stored public checkpoint: what its ``config.json`` says that a choice depends on."""

    repo: str
    architecture: str
    model_type: str
    moe: bool
    mtp_layers: int  # num_nextn_predict_layers: MTP heads shipped in the checkpoint
    chunked_local: bool  # attention_chunk_size set (Llama 4)
    eagle3_head: bool  # an EAGLE-3 draft head, not a model to serve

    @classmethod
    def read(cls, repo: str) -> Checkpoint:
        data = json.loads((HF_CONFIGS / repo / "config.json").read_text())
        text = data.get("text_config") or data
        arch = data["architectures"][0]
        return cls(repo, arch, data["model_type"],
                   moe=any(k in text for k in ("num_experts", "n_routed_experts", "num_local_experts")),
                   mtp_layers=int(text.get("num_nextn_predict_layers") or 0),
                   chunked_local=bool(text.get("attention_chunk_size")),
                   eagle3_head="Eagle3" in arch)


def chunk_size(repo: str) -> int | None:
    data = json.loads((HF_CONFIGS / repo / "config.json").read_text())
    return (data.get("text_config") or data).get("attention_chunk_size")


def checkpoints() -> dict[str, Checkpoint]:
    return {f"{p.parent.parent.name}/{p.parent.name}": Checkpoint.read(f"{p.parent.parent.name}/{p.parent.name}")
            for p in sorted(HF_CONFIGS.glob("*/*/config.json"))}


# The pairs a reproduction uses, by role; every repo is one of hf_configs/.
DENSE = "Qwen/Qwen3-0.6B"  # no drafter with a model: the smallest dense model
EAGLE_TARGET, EAGLE_HEAD = "Qwen/Qwen3-8B", "AngelSlim/Qwen3-8B_eagle3"  # vLLM's own e2e pair
MOE = "Qwen/Qwen3-30B-A3B"  # DBO needs experts
# DBO with a drafter: the draft must be MoE as well, as it gets the target's expert parallelism
# (0.30.0 refuses a dense EAGLE head: SpeculativeConfig -> ModelConfig._verify_with_expert_parallelism);
# an MTP layer of an MoE checkpoint is.
MOE_MTP = "zai-org/GLM-4.5-Air"
DRAFT_MODEL = "Qwen/Qwen3-0.6B"  # a separate draft model for Qwen3-8B (same tokenizer)
CHUNKED_LOCAL = "meta-llama/Llama-4-Scout-17B-16E-Instruct"  # NEVER from its chunked local layers


@dataclass(frozen=True)
class Plan:
    """A command for one scenario on one release, and what each choice rests on."""

    release: str
    scenario: Scenario
    env: tuple[tuple[str, str], ...]
    model: str
    backend: str
    attention_config: dict = field(default_factory=dict)
    speculative: dict | None = None
    extra: tuple[str, ...] = ()
    capabilities: tuple[str, ...] = ()  # compute capabilities on which the attention level holds
    draft: str | None = None  # the draft checkpoint (MTP: the target itself)
    notes: tuple[str, ...] = ()
    gpus: int = 1  # GPUs the command needs (DBO: data parallelism over 2)
    weights: str = ""  # weights.fit's check, as a page states it
    fits: bool = True  # whether the weights fit the GPUs (one 141 GB GPU each)

    @property
    def one_gpu(self) -> bool:
        return self.gpus == 1 and self.fits

    def argv(self, compilation: dict, skip_memory_profile_bytes: int | None = None) -> list[str]:
        argv = [self.model, "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", str(MAX_NUM_SEQS),
                "--attention-backend", self.backend]
        if self.attention_config:
            argv += ["--attention-config", json.dumps(self.attention_config)]
        argv += ["--compilation-config", json.dumps(compilation)]
        if self.speculative is not None:
            argv += ["--speculative-config", json.dumps(self.speculative)]
        argv += list(self.extra)
        if skip_memory_profile_bytes:
            argv += ["--kv-cache-memory-bytes", str(skip_memory_profile_bytes)]
        return argv


@dataclass(frozen=True)
class Reach:
    reachable: bool
    reason: str  # why not; "" when reachable
    plan: Plan | None = None


def revision(release: str) -> ConfigRevision:
    """Which ``VllmConfig.__post_init__`` drops piecewise modes: 0.29 to NONE, from 0.30
    ``without_piecewise()`` (``contract/core/scenario.py``, ``ConfigRevision``)."""
    return ConfigRevision.V0_29 if _minor(release) < 30 else ConfigRevision.V0_30


def _minor(release: str) -> int:
    return int(release.split(".")[1])


def capabilities_for(level: str, release: str) -> tuple[str, ...]:
    """The compute capabilities on which ``LEVEL_BACKEND[level]`` reports ``level`` in ``release``
    (``release_facts.json``, ``support_by_capability``); () when the table lacks the release."""
    backend, config = LEVEL_BACKEND[level]
    table = support_by_capability(release).get(backend, {})
    levels = table.get(variant_name(config), {})
    if level == "NEVER":  # any capability: the chunked local builder answers NEVER itself
        return tuple(levels)
    return tuple(cap for cap, got in levels.items() if got == level)


def _refused_under_adaptive(release: str, backends, attention_config: dict) -> set[str]:
    """The compute capabilities on which vLLM refuses any of ``backends`` (None: no backend) for a
    model under adaptive verification with this ``--attention-config``."""
    table = adaptive_refused(release)
    out: set[str] = set()
    for backend in filter(None, backends):
        out |= set(table.get(backend, {}).get(variant_name(attention_config), ()))
    return out


def variant_name(attention_config: dict) -> str:
    """The ``support_by_capability`` key of an ``--attention-config``: "default" or its JSON."""
    return json.dumps(attention_config, sort_keys=True) if attention_config else "default"


def not_reachable(release: str, why: str) -> Reach:
    return Reach(False, f"not reachable with the public models of vLLM {release}: {why}")


def not_stored(release: str, why: str) -> Reach:
    return Reach(False, f"no reproduction on vLLM {release} with the checkpoints this project stores: {why}")


def reach(s: Scenario, release: str) -> Reach:
    """Whether ``s`` can be set up on ``release`` with public flags and the stored checkpoints,
    with the plan when it can and the reason when it cannot."""
    from contract.evidence import model_facts

    facts = model_facts.committed().get(release)
    if facts is None:
        return Reach(False, f"no reproduction on vLLM {release}: no model facts committed for it (model_facts.json)")
    minor = _minor(release)
    notes: list[str] = []
    env: list[tuple[str, str]] = []
    if s.runner is Runner.MRV1:
        if minor >= 34:
            return not_reachable(release, "Model Runner V1 is gone (no v1/worker/gpu_model_runner.py); "
                                          "VLLM_USE_V2_MODEL_RUNNER=0 is refused by Platform.validate_environ")
        env.append(("VLLM_USE_V2_MODEL_RUNNER", "0"))
    elif minor < 34:
        env.append(("VLLM_USE_V2_MODEL_RUNNER", "1"))
    env.append(("VLLM_USE_BREAKABLE_CUDAGRAPH", "1" if s.breakable else "0"))

    level = s.attention_support.name
    if s.attention_support_stage is not None:
        return not_stored(release, "the weakest backend on one pipeline stage needs a hybrid checkpoint whose stages "
                                   "hold different attention layers; none is stored")
    if s.mamba_cache_blocks is not None:
        return not_stored(release, "a hybrid model's Mamba cache with fewer blocks than --max-num-seqs needs a hybrid "
                                   "(Mamba or GDN) checkpoint, such as granite-4.0-h or Qwen3-Next, and a KV-cache "
                                   "budget that small; none is stored")
    if s.varlen_decode_bound:
        return not_stored(release, "a UNIFORM_BATCH backend that declares a varlen bound (FlashInfer's trtllm-gen "
                                   "varlen decode, Mamba2/GDN layers) is not among the stored backends")
    draft_backend = None
    if s.attention_support_draft_only:
        if level == "NEVER":
            return not_stored(release, "attention support NEVER comes from Llama 4's chunked local attention, not a "
                                       "backend a draft model can be given")
        # the target on the ALWAYS backend, the draft's layers on the weaker one
        draft_backend = LEVEL_BACKEND[level][0]
        level = "ALWAYS"
    backend, attention_config = LEVEL_BACKEND[level]
    if draft_backend is not None:
        attention_config = LEVEL_BACKEND[s.attention_support.name][1]
    caps = capabilities_for(s.attention_support.name, release)
    if not caps:
        return not_reachable(release, f"no NVIDIA GPU makes {backend} report {level} with --attention-config "
                                      f"{variant_name(attention_config)} (release_facts.json support_by_capability)")
    if s.adaptive_verification:
        if "refused" in adaptive_refused(release):
            return not_reachable(release, "vLLM refuses adaptive verification for an EAGLE-3 draft: "
                                          f"'{adaptive_refused(release)['refused']}' (release_facts.json)")
        refused = _refused_under_adaptive(release, (backend, draft_backend), attention_config)
        kept = tuple(c for c in caps if c not in refused)
        if not kept:
            return not_reachable(release, f"on the GPUs where {draft_backend or backend} reports "
                                          f"{s.attention_support.name} ({', '.join(caps)}), vLLM refuses to select it "
                                          "under adaptive verification: 'device-cpu query lens mismatch not supported, "
                                          "this is needed for adaptive verification' (the backend's "
                                          "validate_configuration; release_facts.json adaptive_refused_by_capability)")
        caps = kept

    stored = checkpoints()
    ranks = max(s.data_parallel_size, 2 if s.ubatching else 1)  # MRV1's DBO scenarios leave it at 1
    with_model = s.drafter is DrafterKind.WITH_MODEL
    speculative: dict | None = None
    draft: str | None = None
    extra: list[str] = []
    if level == "NEVER":
        if s.drafter is not DrafterKind.NONE or s.ubatching:
            return not_stored(release, "attention support NEVER comes from Llama 4's chunked local attention; "
                                       "no Llama 4 draft head or DBO set-up is stored")
        model = CHUNKED_LOCAL
        notes.append(f"{model}: its RoPE layers are ChunkedLocalAttention (model_executor/models/llama4.py), whose "
                     "metadata builder reports NEVER under every backend")
    elif s.ubatching:
        model = MOE
        extra += ["--data-parallel-size", str(ranks), "--enable-expert-parallel", "--all2all-backend",
                  "deepep_low_latency", *(("--ubatch-size", str(s.ubatch_size)) if s.ubatch_size else ("--enable-dbo",))]
        # the modelled batches' thresholds where the ranks split them (vLLM's defaults, 32 and 512,
        # keep an MRV1 scenario of one rank, run on two, from splitting, as one rank never does)
        if s.runner is Runner.MRV2 or s.data_parallel_size > 1:
            decode, prefill = s.dbo_thresholds
            extra += ["--dbo-decode-token-threshold", str(decode), "--dbo-prefill-token-threshold", str(prefill)]
        notes.append("DBO needs data parallelism with expert parallelism and a DeepEP all-to-all backend: "
                     f"{ranks} GPUs and DeepEP installed")
        if with_model:
            model, speculative, draft = MOE_MTP, {"method": "mtp"}, MOE_MTP
            notes.append(f"{MOE_MTP}'s MTP layer drafts: a draft under expert parallelism must have experts "
                         "(ModelConfig._verify_with_expert_parallelism, reached from SpeculativeConfig)")
    elif with_model:
        chosen = _drafter(s, release, facts, stored)
        if not isinstance(chosen, tuple):
            return chosen
        model, speculative, draft, note = chosen
        notes.append(note)
    else:
        model = DENSE
    if s.data_parallel_size > 1 and not s.ubatching:
        extra += ["--data-parallel-size", str(ranks)]

    target = facts.target(stored[model].architecture)
    target_compiled = target is not None and target.status == model_facts.COMPILED
    if target_compiled != s.model_compiled:
        candidates = [m.arch for m in facts.targets if (m.status == model_facts.COMPILED) == s.model_compiled
                      and m.status in (model_facts.COMPILED, model_facts.NOT_COMPILED)]
        return not_stored(release, f"model_compiled={s.model_compiled} needs a target architecture "
                                   f"{'with' if s.model_compiled else 'without'} an active @support_torch_compile "
                                   f"class; architectures that are: {', '.join(candidates[:8])}"
                                   + (" ..." if len(candidates) > 8 else ""))

    if s.drafter is DrafterKind.WITHOUT_MODEL:
        speculative = {"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    if speculative is not None:
        speculative["num_speculative_tokens"] = s.uniform_decode_query_len - 1
        if s.spec_enforce_eager:
            speculative["enforce_eager"] = True
        if s.adaptive_verification:
            speculative["enable_adaptive_verification"] = True
        if draft_backend is not None:
            # config/speculative.py (33:444, 34:503): the draft model's own attention backend
            speculative["attention_backend"] = draft_backend
            notes.append(f"the draft model's layers run {draft_backend} ({s.attention_support.name}), the target's "
                         f"{backend} (ALWAYS): adaptive verification's check reads the target's layers only")
    if not s.extensible_kv_cache:
        if minor < 34:
            return not_reachable(release, "the extensible KV cache exists from 0.34.0")
        extra.append("--no-enable-extensible-kv-cache")
    if level != "ALWAYS":
        notes.append(f"{backend}{' with --attention-config ' + json.dumps(attention_config) if attention_config else ''} "
                     f"reports {level} on compute capability {', '.join(caps)}")
    if s.pipeline_parallel_size > 1:
        extra += ["--pipeline-parallel-size", str(s.pipeline_parallel_size)]
    if s.max_loras:
        extra += ["--enable-lora", "--max-loras", str(s.max_loras)]
        extra += ["--specialize-active-lora"] if s.specialize_active_lora else []
        notes.append(f"a batch with LoRA adapters needs its requests to name them: up to {s.max_loras} LoRA adapters "
                     f"of {model}, loaded with --lora-modules adapter-1=PATH ... (none is stored)")
    gpus_needed = ranks * s.pipeline_parallel_size
    loaded = [(model, draft == model)] + ([(draft, False)] if draft is not None and draft != model else [])
    fit = weights.fit(loaded, release, expert_parallel=ranks if s.ubatching else 1)
    if fit.fp8:
        extra += ["--quantization", "fp8"]
    return Reach(True, "", Plan(release, s, tuple(env), model, backend, dict(attention_config), speculative,
                                tuple(extra), caps, draft, tuple(notes), gpus_needed, fit.text, fit.fits))


def _drafter(s: Scenario, release: str, facts, stored: dict[str, Checkpoint]):
    """(target, speculative config, draft checkpoint, note) for a drafter with a model, or a Reach
    saying why none."""
    from contract.evidence import model_facts

    if s.speculator is Speculator.EAGLE and (s.runner is Runner.MRV1 or s.draft_compiled):
        head = facts.draft(stored[EAGLE_HEAD].architecture)
        if s.runner is Runner.MRV2 and (head is None or head.status != model_facts.COMPILED):
            return not_stored(release, f"{EAGLE_HEAD} ({stored[EAGLE_HEAD].architecture}) is not compiled here")
        note = (f"{EAGLE_HEAD} is {stored[EAGLE_HEAD].architecture}: "
                + (f"@support_torch_compile on {head.decorated[0]}" if head is not None and head.decorated else
                   "its compile status is not read for MRV1"))
        return EAGLE_TARGET, {"method": "eagle3", "model": EAGLE_HEAD}, EAGLE_HEAD, note
    if s.speculator is Speculator.EAGLE:  # draft_compiled False: an MTP head with no compiled class
        minor = _minor(release)
        for repo, c in stored.items():
            if c.mtp_layers < 1 or c.eagle3_head:
                continue
            mtp = [arch for arch, sources in facts.mtp_sources if c.architecture in sources or c.model_type in sources]
            rows = [facts.draft(a) for a in mtp]
            if rows and all(r is not None and r.status == model_facts.NOT_COMPILED for r in rows):
                # one MTP module, or fewer modules than tokens, is served by the single-module MTP
                # speculator, a TargetDependentARSpeculator (config/speculative.py use_multi_module_mtp)
                if min(c.mtp_layers, s.uniform_decode_query_len - 1) > 1:
                    continue
                note = (f"{repo} ships {c.mtp_layers} MTP layer(s): method mtp builds {', '.join(mtp)}, which reaches "
                        "no @support_torch_compile class (model_facts.json), served by the single-module "
                        + ("MTPSpeculator (v1/worker/gpu/spec_decode/mtp/speculator.py)" if minor >= 33 else "MTP proposer"))
                return repo, {"method": "mtp"}, repo, note
        candidates = [m.arch for m in facts.drafts if m.status == model_facts.NOT_COMPILED]
        return not_stored(release, "draft_compiled=False needs a draft architecture with no @support_torch_compile "
                                   f"class; architectures that have none: {', '.join(candidates)}")
    if s.speculator is Speculator.STANDALONE_AR:
        d = facts.target(stored[DRAFT_MODEL].architecture)
        if s.runner is Runner.MRV2 and (d is not None and d.status == model_facts.COMPILED) != s.draft_compiled:
            return not_stored(release, f"draft_compiled={s.draft_compiled} with a separate draft model: "
                                       f"{DRAFT_MODEL} is {d.status if d else 'unknown'}")
        return EAGLE_TARGET, {"method": "draft_model", "model": DRAFT_MODEL}, DRAFT_MODEL, \
            f"{DRAFT_MODEL} drafts for {EAGLE_TARGET} (method draft_model)"
    if s.speculator is Speculator.MULTI_MODULE_MTP:
        return not_stored(release, "the multi-module MTP speculator needs a checkpoint with at least two MTP "
                                   "layers and num_speculative_tokens >= 2 (SpeculativeConfig.use_multi_module_mtp); "
                                   "none is stored")
    return not_stored(release, f"the {s.speculator.value} speculator needs a draft of that family; none is stored")


def splitting_ops_flag(s: Scenario, attention_ops: tuple[str, ...]) -> dict:
    if s.splitting_ops is SplittingOps.ATTENTION:
        return {"splitting_ops": list(attention_ops)}
    if s.splitting_ops is SplittingOps.EMPTY:
        return {"splitting_ops": []}
    return {}


def draft_method(arch: str, facts) -> str:
    """The ``--speculative-config`` method that builds a draft architecture, read from the registry
    name for the EAGLE, DFlash and DSpark families, else ``mtp`` for the ones
    ``hf_config_override`` makes from a target's config (``config/speculative.py``)."""
    for marker, method in (("Eagle3", "eagle3"), ("Eagle", "eagle"), ("DSpark", "dspark"), ("DFlash", "dflash"),
                           ("XPress", "dflash"), ("LiLiCorr", "dflash"), ("MuseGlimmer", "dflash"),
                           ("ExtractHiddenStates", "extract_hidden_states")):
        if marker in arch:
            return method
    if arch in dict(facts.mtp_sources) or "MTP" in arch:
        return "mtp"
    return "?"


def compile_table(release: str) -> list[str]:
    """Markdown: per compile status, the draft architectures, their method and (MTP) the target
    architectures or model types whose checkpoints carry them; the target architectures with no
    compiled class; the stored checkpoints and what they give."""
    from contract.evidence import model_facts

    facts = model_facts.committed()[release]
    sources = dict(facts.mtp_sources)
    lines = [f"### vLLM {release}", "", "| draft architecture | method | target architecture / model type (mtp) "
             "| compiled | decorated class |", "|---|---|---|---|---|"]
    for m in sorted(facts.drafts, key=lambda m: (m.status, m.arch)):
        method = draft_method(m.arch, facts)
        made = ", ".join(sources.get(m.arch, ())) if method == "mtp" else ""
        lines.append(f"| `{m.arch}` | {method} | {made or '-'} | {m.status} | {'; '.join(m.decorated[:2]) or '-'} |")
    plain = [m.arch for m in facts.targets if m.status == model_facts.NOT_COMPILED]
    lines += ["", f"Target architectures with no `@support_torch_compile` class ({len(plain)}): "
              + ", ".join(f"`{a}`" for a in plain) + ".", "", "Stored checkpoints:", ""]
    for repo, c in checkpoints().items():
        row = facts.model(c.architecture)
        lines.append(f"- `{repo}`: `{c.architecture}`, {row.status if row else 'not in the registry'}"
                     + (f"; MTP layers {c.mtp_layers}" if c.mtp_layers else "")
                     + ("; chunked local attention (NEVER)" if c.chunked_local else ""))
    return lines


if __name__ == "__main__":
    import sys

    for release in sys.argv[1:] or RELEASES:
        print("\n".join(compile_table(release)) + "\n")
