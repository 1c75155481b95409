"""The settings that decide the wrapper stacks and the dispatches, and what vLLM's config-time
normalisation (``VllmConfig.__post_init__``) makes of them."""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass

from contract.core.modes import FULL, FULL_AND_PIECEWISE, NONE, PIECEWISE, AttentionCGSupport, CompilationMode, CUDAGraphMode

# Capture sizes every scenario uses. Batch sizes are abstracted to the classes the dispatcher
# distinguishes against them (`v1/cudagraph_dispatcher.py:71-108`): padded up to 2, exactly 2,
# padded up to 4, exactly 4, above the largest capture size.
CUDAGRAPH_CAPTURE_SIZES: tuple[int, ...] = (2, 4)
MAX_NUM_SEQS = 4
MAX_DATA_PARALLEL_SIZE = 4  # ranks a step runs on: what the explorer and Hypothesis reach
MAX_PIPELINE_PARALLEL_SIZE = 4  # stages a step runs through
MAX_LORAS = 3  # --max-loras: 3 is the least whose specialised cases round an active count up (3 -> 4)
NUM_TOKENS_DOMAIN: tuple[int, ...] = (1, 2, 3, 4, 5)
# --dbo-decode-token-threshold / --dbo-prefill-token-threshold every micro-batching scenario uses
# (vLLM's defaults, 32 and 512, are above every modelled batch): a uniform decode of 2 tokens and a
# mixed batch of 4 split, each at least one token per micro-batch; vLLM refuses thresholds below the
# micro-batch count (34:config/parallel.py:1271-1280), so with more micro-batches they are raised to it.
DBO_DECODE_TOKEN_THRESHOLD = 2
DBO_PREFILL_TOKEN_THRESHOLD = 4
DBO_NUM_UBATCHES = 2  # ParallelConfig.num_ubatches under --enable-dbo (34:config/parallel.py:724-725)
MAX_UBATCH_SIZE = 3  # --ubatch-size: 3 micro-batches, the least above --enable-dbo's 2


class Runner(enum.Enum):
    """Model Runner V1 (``v1/worker/gpu_model_runner.py``) or V2 (``v1/worker/gpu/``)."""

    MRV1 = "MRV1"
    MRV2 = "MRV2"


class DrafterKind(enum.Enum):
    """Speculative-decoding proposer, by what ``load_model`` can wrap (spec §7).

    ``WITH_MODEL``: EAGLE/MTP/draft-model proposers (a ``.model`` and a ``CudagraphDispatcher``).
    ``WITHOUT_MODEL``: n-gram/suffix proposers (no ``.model``, no dispatcher, never dispatch).
    """

    NONE = "none"
    WITH_MODEL = "with_model"
    WITHOUT_MODEL = "without_model"


class Speculator(enum.Enum):
    """Which MRV2 speculator serves a drafter with a model (``33:v1/worker/gpu/spec_decode/__init__.py:14-94``,
    ``34:…/__init__.py:18-49``). MRV1 models two proposer classes: ``EagleProposer`` (``EAGLE``) and,
    for ``method: draft_model``, ``DraftModelProposer`` (``STANDALONE_AR``), which the runner's checks
    name beside EAGLE's (``use_eagle() or uses_draft_model()``, ``33:v1/worker/gpu_model_runner.py:5796-5798,6803-6813``).

    ``EAGLE``: ``TargetDependentARSpeculator`` (eagle, eagle3, single-module ``mtp``, Gemma4 MTP).
    ``MULTI_MODULE_MTP``: one module per speculative step. ``DFLASH``: the DFlash family (DFlash,
    DFlash2, XPress, LiLiCorr, DSpark). ``STANDALONE_AR``: a separate draft model (``draft_model``).
    """

    EAGLE = "eagle"
    MULTI_MODULE_MTP = "multi_module_mtp"
    DFLASH = "dflash"
    STANDALONE_AR = "standalone_ar"


class SplittingOps(enum.Enum):
    """``compilation_config.splitting_ops`` as the user sets it (``config/compilation.py:1147``)."""

    DEFAULT = "default"  # None: all attention ops under VLLM_COMPILE, [] otherwise
    ATTENTION = "attention"  # an explicit list holding every attention op
    EMPTY = "empty"  # an explicit []


class ConfigRevision(enum.Enum):
    """Which ``VllmConfig.__post_init__`` drops piecewise modes without compilation.

    ``V0_29``: to NONE (``config/vllm.py:1469-1480`` in 0.29.0).
    ``V0_30``: ``without_piecewise()`` (``_normalize_piecewise_cudagraph_mode``,
    ``config/vllm.py:1129-1149`` in 0.33.0), from PR #55095/#56191.
    """

    V0_29 = "0.29"
    V0_30 = "0.30"


@dataclass(frozen=True)
class Scenario:
    """What a vLLM user sets. Field names follow vLLM's config fields."""

    runner: Runner = Runner.MRV1
    breakable: bool = False  # VLLM_USE_BREAKABLE_CUDAGRAPH=1
    # parallel_config.use_ubatching (--enable-dbo / --ubatch-size > 1), micro-batch count
    # ``ubatch_size``. MRV2: on several DP ranks, without a drafter (0.33.0 refuses DBO with one), LoRA,
    # pipeline stages, a hybrid model or cudagraph_mode PIECEWISE, which vLLM refuses at start-up
    # (34:config/vllm.py:3378-3410). MRV1: on one rank (which never splits) or several, without a
    # drafter on several (the EAGLE proposer asserts it never splits).
    ubatching: bool = False
    cudagraph_mode: CUDAGraphMode = FULL_AND_PIECEWISE
    compilation_mode: CompilationMode = CompilationMode.VLLM_COMPILE
    splitting_ops: SplittingOps = SplittingOps.DEFAULT
    drafter: DrafterKind = DrafterKind.NONE
    attention_support: AttentionCGSupport = AttentionCGSupport.ALWAYS  # minimum over backends
    spec_enforce_eager: bool = False  # speculative_config.enforce_eager
    uniform_decode_query_len: int = 1  # 1 + num_speculative_tokens
    # Settings only MRV2's model reads (see RUNNER_SCOPE); written to JSON only when not the default.
    speculator: Speculator = Speculator.EAGLE
    model_compiled: bool = True  # the model class has an active @support_torch_compile submodule
    draft_compiled: bool = True  # the draft model class has one (lead L2)
    adaptive_verification: bool = False  # speculative_config.enable_adaptive_verification
    # cache_config.enable_extensible_kv_cache as settled by VllmConfig.__post_init__: on by default
    # on CUDA (34:config/vllm.py:3252-3254), off with --no-enable-extensible-kv-cache (and where
    # vLLM finds it unsupported). Only 0.34.0's MRV2 reads it; 0.33.0 has no such setting.
    extensible_kv_cache: bool = True
    # Adaptive verification's second attention capability (MRV2, with a drafter and adaptive
    # verification only). ``varlen_decode_bound``: the non-ALWAYS backends declare the varlen bound
    # vLLM's own builders declare, ``get_varlen_cudagraph_max_query_len() == max_decode_query_len``
    # (the widest query any forward builds; ``34:v1/attention/backend.py:565-583,629-650``), so a
    # FULL graph of decode batches of 1..q tokens per request is theirs to replay. No
    # UNIFORM_SINGLE_TOKEN_DECODE builder declares one (``34:…/backends/flashinfer.py:1257-1279``),
    # so the setting needs UNIFORM_BATCH. ``attention_support_draft_only`` (a drafter with a model,
    # both runners): the backend with the minimum ``attention_support`` serves the draft model's
    # layers only (a separate draft backend, ``speculative_config.attention_backend``,
    # ``34:config/speculative.py:503``, ``33:v1/spec_decode/llm_base_proposer.py:1288``); the
    # target's layers are ALWAYS. Resolve reads the minimum over every group, draft layers included
    # (``get_attn_cg_support``, ``34:v1/worker/gpu/attn_utils.py:322-347``; MRV1's
    # ``_check_and_update_cudagraph_mode``, ``33:v1/worker/gpu_model_runner.py:6771-6785``);
    # adaptive verification's check reads the target's layers only (``target_attn_layer_names``,
    # ``34:v1/worker/gpu/model_runner.py:711-718``).
    varlen_decode_bound: bool = False
    attention_support_draft_only: bool = False
    # --data-parallel-size: the ranks every serving step runs on together (MRV2; 1 to
    # MAX_DATA_PARALLEL_SIZE). Each execute_model names the other ranks' batches (``peers``).
    data_parallel_size: int = 1
    # --pipeline-parallel-size: the stages every serving step runs through in turn (MRV2; 1 to
    # MAX_PIPELINE_PARALLEL_SIZE). Each stage's worker builds attention groups from its own layers
    # (``init_attn_backend``, ``34:v1/worker/gpu/attn_utils.py:200-260``) and resolves its own mode
    # and sizes from their minimum support (``34:v1/worker/gpu/model_runner.py:783-811``): a hybrid
    # model's stages can hold different backends. ``attention_support_stage``: the one stage whose
    # layers hold the backend with the minimum ``attention_support``, every other stage's being
    # ALWAYS; None: every stage holds it.
    pipeline_parallel_size: int = 1
    attention_support_stage: int | None = None
    # --enable-lora --max-loras N (both runners; 0: LoRA off). The target's graphs are captured per
    # LoRA case under vLLM's default ``cudagraph_specialize_lora`` (``contract/core/lora.py``): 0 and
    # N + 1, or with ``--specialize-active-lora`` 0, the powers of 2 up to N and N + 1; a batch of k
    # active adapters takes the smallest case >= k (MRV2's ``_build_lora_dispatch_map``,
    # ``34:v1/worker/gpu/cudagraph_utils.py:236-260``; MRV1's ``dispatch``,
    # ``33:v1/cudagraph_dispatcher.py:281-298``). Each ``execute_model`` names its k.
    max_loras: int = 0
    specialize_active_lora: bool = False
    # A hybrid model (Mamba or GDN layers beside attention; MRV2): the Mamba cache's blocks, one per
    # decode request (``kv_cache_config.num_blocks`` with ``has_mamba_layers``); None: no Mamba
    # layer. Resolve refuses FULL graphs when ``max_num_seqs`` exceeds them, outside memory
    # profiling (``34:config/compilation.py:1659-1681``, ``33:…:1510-1532``): a FULL capture runs the
    # Mamba decode kernel for each of its requests, which asserts ``num_cache_lines >= batch``.
    mamba_cache_blocks: int | None = None
    # --ubatch-size N (with ubatching): a step splits into N micro-batches rather than
    # --enable-dbo's 2 (``num_ubatches``, ``34:config/parallel.py:719-725``); 0: --enable-dbo.
    ubatch_size: int = 0

    def __post_init__(self) -> None:
        problem = self.problem()
        if problem:
            raise ValueError(f"invalid scenario: {problem}")

    def problem(self) -> str | None:
        has_spec = self.drafter is not DrafterKind.NONE
        if has_spec and self.uniform_decode_query_len < 2:
            return "a drafter proposes at least one token: uniform_decode_query_len must be >= 2"
        if not has_spec and self.uniform_decode_query_len != 1:
            return "without a drafter uniform_decode_query_len is 1"
        if self.spec_enforce_eager and not has_spec:
            return "spec_enforce_eager needs a drafter"
        if self.drafter is not DrafterKind.WITH_MODEL and (self.speculator is not Speculator.EAGLE
                                                           or not self.draft_compiled):
            return "speculator and draft_compiled describe a drafter with a model"
        if self.runner is Runner.MRV1 and self.speculator not in (Speculator.EAGLE, Speculator.STANDALONE_AR):
            return "Model Runner V1's drafters with a model are EAGLE's and the draft model's (speculator eagle or standalone_ar)"
        if self.adaptive_verification and not has_spec:
            return "adaptive_verification needs a drafter"
        if self.varlen_decode_bound and not (self.adaptive_verification
                                             and self.attention_support is AttentionCGSupport.UNIFORM_BATCH):
            return ("varlen_decode_bound describes UNIFORM_BATCH backends under adaptive verification (no other "
                    "builder declares a bound)")
        if self.attention_support_draft_only and not (
                self.drafter is DrafterKind.WITH_MODEL and self.attention_support is not AttentionCGSupport.ALWAYS):
            return ("attention_support_draft_only describes a weaker draft backend (a drafter with a model, "
                    "attention_support below ALWAYS)")
        if not 1 <= self.data_parallel_size <= MAX_DATA_PARALLEL_SIZE:
            return f"the modelled data_parallel_size is 1 to {MAX_DATA_PARALLEL_SIZE}"
        if self.data_parallel_size > 1 and self.runner is Runner.MRV1 and has_spec and (
                self.ubatching or self.speculator is not Speculator.EAGLE):
            # the draft model's proposer inserts tokens into its first pass; DBO asserts no EAGLE split
            return ("several DP ranks on Model Runner V1 are modelled with EAGLE's or an n-gram drafter, "
                    "and without micro-batching beside one")
        if not 1 <= self.pipeline_parallel_size <= MAX_PIPELINE_PARALLEL_SIZE:
            return f"the modelled pipeline_parallel_size is 1 to {MAX_PIPELINE_PARALLEL_SIZE}"
        if self.pipeline_parallel_size > 1 and (has_spec or self.data_parallel_size > 1):
            return "several pipeline stages are modelled without a drafter and on one DP rank"
        if self.attention_support_stage is not None and not (
                0 <= self.attention_support_stage < self.pipeline_parallel_size
                and self.attention_support is not AttentionCGSupport.ALWAYS):
            return ("attention_support_stage names the stage (0 to pipeline_parallel_size - 1) holding a backend "
                    "weaker than ALWAYS")
        if not 0 <= self.max_loras <= MAX_LORAS:
            return f"the modelled max_loras is 0 (LoRA off) to {MAX_LORAS}"
        if self.specialize_active_lora and not self.max_loras:
            return "specialize_active_lora needs LoRA (max_loras >= 1)"
        if self.max_loras and (self.data_parallel_size > 1 or self.pipeline_parallel_size > 1):
            return "LoRA is modelled on one DP rank and one pipeline stage"
        if self.mamba_cache_blocks is not None and self.mamba_cache_blocks < 1:
            return "mamba_cache_blocks is the Mamba cache's block count (>= 1), or absent for a model without Mamba layers"
        if self.mamba_cache_blocks is not None and (self.data_parallel_size > 1 or self.pipeline_parallel_size > 1):
            return "a hybrid model's Mamba cache is modelled on one DP rank and one pipeline stage"
        if self.runner is Runner.MRV2 and self.ubatching and (
                self.data_parallel_size < 2 or has_spec or self.cudagraph_mode == PIECEWISE):
            return ("micro-batching on Model Runner V2 is modelled on several DP ranks, without a drafter and with "
                    "FULL graphs (vLLM refuses it with cudagraph_mode PIECEWISE)")
        if self.ubatch_size and not (self.ubatching and DBO_NUM_UBATCHES < self.ubatch_size <= MAX_UBATCH_SIZE):
            return (f"ubatch_size is a micro-batching scenario's micro-batch count above --enable-dbo's "
                    f"{DBO_NUM_UBATCHES} (at most {MAX_UBATCH_SIZE}), or 0 for --enable-dbo")
        scope = RUNNER_SCOPE[self.runner]
        if self.uniform_decode_query_len > scope["max_uniform_decode_query_len"]:
            return f"the modelled {self.runner.name} covers uniform_decode_query_len <= {scope['max_uniform_decode_query_len']}"
        for name in scope["unmodelled"]:
            if getattr(self, name) != _DEFAULTS[name]:
                return f"{name} is outside the modelled {self.runner.name} space"
        return None

    @property
    def micro_batched(self) -> bool:
        """MRV2's micro-batching, where no serving batch needs eager: ``need_eager``'s one serving source
        is an encoder-decoder model's encoder step, which vLLM refuses with DBO (``events.ranks_problem``)."""
        return self.ubatching and self.runner is Runner.MRV2

    @property
    def num_ubatches(self) -> int:
        """``ParallelConfig.num_ubatches`` where micro-batching is on: 2 under --enable-dbo, else
        --ubatch-size (``34:config/parallel.py:719-725``)."""
        return self.ubatch_size or DBO_NUM_UBATCHES

    @property
    def dbo_thresholds(self) -> tuple[int, int]:
        """(decode, prefill) token thresholds the scenario sets: at least one token per micro-batch."""
        return max(DBO_DECODE_TOKEN_THRESHOLD, self.num_ubatches), max(DBO_PREFILL_TOKEN_THRESHOLD, self.num_ubatches)

    def stage_support(self, stage: int) -> AttentionCGSupport:
        """The minimum support over the attention groups of one pipeline stage's layers."""
        if self.attention_support_stage is None or self.attention_support_stage == stage:
            return self.attention_support
        return AttentionCGSupport.ALWAYS

    def to_json(self) -> dict:
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name in OPTIONAL_FIELDS and v == f.default:
                continue
            out[f.name] = v.name if isinstance(v, enum.Enum) else v
        return out

    @classmethod
    def from_json(cls, data: dict) -> Scenario:
        from contract.core.modes import parse_enum

        if not isinstance(data, dict):
            raise ValueError("scenario must be a JSON object")
        kinds = {f.name: f.type for f in dataclasses.fields(cls)}
        unknown = set(data) - set(kinds)
        if unknown:
            raise ValueError(f"unknown scenario field(s): {', '.join(sorted(unknown))}")
        enums = {
            "runner": Runner,
            "cudagraph_mode": CUDAGraphMode,
            "compilation_mode": CompilationMode,
            "splitting_ops": SplittingOps,
            "drafter": DrafterKind,
            "attention_support": AttentionCGSupport,
            "speculator": Speculator,
        }
        kwargs = {}
        for name, value in data.items():
            if name in enums:
                kwargs[name] = parse_enum(enums[name], value)
            elif name in ("uniform_decode_query_len", "data_parallel_size", "pipeline_parallel_size",
                          "attention_support_stage", "max_loras", "mamba_cache_blocks", "ubatch_size"):
                if not isinstance(value, int) or isinstance(value, bool):
                    raise ValueError(f"scenario field {name} must be an integer")
                kwargs[name] = value
            else:
                if not isinstance(value, bool):
                    raise ValueError(f"scenario field {name} must be true or false")
                kwargs[name] = value
        return cls(**kwargs)


# Fields added after the first trace format; a trace without them reads as their defaults.
OPTIONAL_FIELDS = ("speculator", "model_compiled", "draft_compiled", "adaptive_verification", "extensible_kv_cache",
                   "varlen_decode_bound", "attention_support_draft_only", "data_parallel_size",
                   "pipeline_parallel_size", "attention_support_stage", "max_loras", "specialize_active_lora",
                   "mamba_cache_blocks", "ubatch_size")
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Scenario)}

# What each runner's model covers: settings outside it must keep their defaults.
RUNNER_SCOPE = {
    # MRV1 compiles every decorated model alike, and its two proposer classes share the base proposer's graphs.
    Runner.MRV1: {"max_uniform_decode_query_len": 3,
                  "unmodelled": tuple(f for f in OPTIONAL_FIELDS
                                      if f not in ("data_parallel_size", "attention_support_draft_only", "speculator",
                                                   "ubatch_size", "max_loras", "specialize_active_lora"))},
    Runner.MRV2: {"max_uniform_decode_query_len": 3, "unmodelled": ()},
}


@dataclass(frozen=True)
class Config:
    """The parts of ``VllmConfig`` the contract reads, after ``__post_init__``."""

    cudagraph_mode: CUDAGraphMode
    compilation_mode: CompilationMode
    splitting_ops_contain_attention: bool
    cudagraph_capture_sizes: tuple[int, ...]
    max_cudagraph_capture_size: int


class ConfigRejected(Exception):
    """vLLM refuses the configuration at config time. ``halted`` is the model's text for it: a
    ``ValueError`` with advice is an accepted rejection (``config rejected: ...``); an assertion is
    a crash after validation, written as vLLM raises it (``AssertionError: ...``, P0)."""

    def __init__(self, message: str, assertion: bool = False):
        super().__init__(message)
        self.assertion = assertion

    @property
    def halted(self) -> str:
        return f"AssertionError: {self}" if self.assertion else f"config rejected: {self}"


def post_init(scenario: Scenario, revision: ConfigRevision = ConfigRevision.V0_30) -> Config:
    """``VllmConfig.__post_init__`` for the modelled settings, in source order (spec §8.1, §5.1, §5.2).

    - breakable on → ``compilation_config.mode = NONE`` (``config/vllm.py:867-869``, called ``:1793``);
    - piecewise modes without VLLM_COMPILE and without breakable are dropped
      (``_normalize_piecewise_cudagraph_mode``, ``config/vllm.py:1129-1149``; NONE in 0.29.0);
    - ``set_splitting_ops_for_v1`` (``config/compilation.py:1162-1258``): without VLLM_COMPILE a
      ``None`` becomes ``[]``; under VLLM_COMPILE ``None`` becomes every attention op, and an
      explicit ``[]`` turns PIECEWISE into NONE and FULL_AND_PIECEWISE into FULL;
    - final CUDA assert: piecewise modes need VLLM_COMPILE or breakable (``config/vllm.py:2166-2178``),
      an ``AssertionError`` (P0 if reached; no modelled scenario reaches it);
    - adaptive verification requires full CUDA graphs (``_validate_adaptive_verification``,
      ``34:config/vllm.py:3283-3288``).
    """
    mode = scenario.cudagraph_mode
    compilation_mode = scenario.compilation_mode
    sizes = CUDAGRAPH_CAPTURE_SIZES
    if scenario.breakable:
        compilation_mode = CompilationMode.NONE
    if (
        mode.requires_piecewise_compilation()
        and compilation_mode != CompilationMode.VLLM_COMPILE
        and not scenario.breakable
    ):
        mode = NONE if revision is ConfigRevision.V0_29 else mode.without_piecewise()
        if mode == NONE and revision is ConfigRevision.V0_30:
            sizes = ()
    if compilation_mode != CompilationMode.VLLM_COMPILE:
        contains_attention = scenario.splitting_ops is SplittingOps.ATTENTION
    elif scenario.splitting_ops is SplittingOps.EMPTY:
        contains_attention = False
        if mode == PIECEWISE:
            mode = NONE
        elif mode == FULL_AND_PIECEWISE:
            mode = FULL
    else:
        contains_attention = True
    if mode.requires_piecewise_compilation() and not (
        compilation_mode == CompilationMode.VLLM_COMPILE or scenario.breakable
    ):
        # An assert in VllmConfig.__post_init__, not a ValueError: a crash, not a rejection.
        raise ConfigRejected("Compilation mode should be CompilationMode.VLLM_COMPILE when cudagraph_mode piecewise "
                             f"cudagraphs is used (cudagraph_mode={mode.name})", assertion=True)
    if scenario.adaptive_verification and not mode.has_full_cudagraphs():
        raise ConfigRejected("Adaptive verification requires full CUDA graphs")
    return Config(
        cudagraph_mode=mode,
        compilation_mode=compilation_mode,
        splitting_ops_contain_attention=contains_attention,
        cudagraph_capture_sizes=sizes,
        max_cudagraph_capture_size=max(sizes) if sizes else 0,
    )


def all_scenarios(runner: Runner = Runner.MRV1) -> list[Scenario]:
    """Every valid scenario for a runner, vLLM's defaults first (so "simplest" means closest to a
    default configuration, which is where Hypothesis shrinks to)."""
    import itertools

    out = []
    for (breakable, ubatching, mode, compilation_mode, splitting_ops, drafter, support, eager, q) in itertools.product(
        (False, True),
        (False, True),
        (FULL_AND_PIECEWISE, PIECEWISE, FULL, CUDAGraphMode.FULL_DECODE_ONLY, NONE),
        (CompilationMode.VLLM_COMPILE, CompilationMode.NONE),
        tuple(SplittingOps),
        tuple(DrafterKind),
        tuple(AttentionCGSupport),
        (False, True),
        (1, 2, 3),
    ):
        # a draft-only backend changes no step (resolve reads the same minimum), only how P7 judges each
        # role: with the rarer settings (micro-batching, an eager drafter, q > 2) at their defaults
        for draft_only in (False, True) if not (ubatching or eager or q > 2) else (False,):
            fields = dict(runner=runner, breakable=breakable, ubatching=ubatching, cudagraph_mode=mode,
                          compilation_mode=compilation_mode, splitting_ops=splitting_ops, drafter=drafter,
                          attention_support=support, spec_enforce_eager=eager, uniform_decode_query_len=q,
                          attention_support_draft_only=draft_only)
            probe = object.__new__(Scenario)
            for k, v in {**_DEFAULTS, **fields}.items():
                object.__setattr__(probe, k, v)
            if probe.problem() is None:
                out.append(Scenario(**fields))
    return out
