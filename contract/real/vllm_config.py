"""A scenario as a real ``VllmConfig``: vLLM's own ``__post_init__`` normalises it.

Only the settings a scenario names are passed in; everything else is vLLM's default. The
configured capture sizes and scheduler size match the model's (``contract/core/scenario.py``):
``cudagraph_capture_sizes=[2, 4]``, ``max_cudagraph_capture_size=4``, ``max_num_seqs=4``.

Building a ``VllmConfig`` costs tens of milliseconds (a real ``ModelConfig`` from a local
``config.json`` only: no weights, no tokenizer, no network), so one is built per distinct
config-time input and restored to its post-init state before each trace; resolve and the
replay mutate ``compilation_config`` in place, exactly as in vLLM.
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
from dataclasses import dataclass, field

from contract.core.scenario import (
    CUDAGRAPH_CAPTURE_SIZES,
    MAX_NUM_SEQS,
    DrafterKind,
    Scenario,
    Speculator,
    SplittingOps,
)

# A tiny Llama: ModelConfig reads only config.json (HF_HUB_OFFLINE=1).
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
    "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 4,
    "num_hidden_layers": 2, "vocab_size": 256, "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6, "torch_dtype": "float32", "tie_word_embeddings": False,
}
MAX_MODEL_LEN = 256
MAX_NUM_BATCHED_TOKENS = 64


@dataclass(frozen=True)
class SpeculativeStandIn:
    """What the cudagraph path reads of ``speculative_config`` (``config/speculative.py``).

    Attached after ``__post_init__``: a real ``SpeculativeConfig`` needs a draft model, and at
    config time it only matters for dynamic speculative decoding and for default capture sizes,
    neither of which a scenario uses (sizes are given explicitly). ``VllmConfig.num_speculative_tokens``
    (a real property) reads it, and so do the dispatchers (``uniform_decode_query_len``).
    """

    num_speculative_tokens: int
    enforce_eager: bool
    method: str  # "eagle", "mtp", "dflash", "draft_model" (a drafter with a model) or "ngram" (none)
    multi_module: bool = False  # MTP with one module per speculative step
    enable_adaptive_verification: bool = False
    # What an MRV2 speculator's own __init__ reads (v1/worker/gpu/spec_decode/speculator.py):
    # the draft model's config (the target's tiny Llama), greedy drafting, no draft DCP.
    draft_model_config: object = field(default=None, compare=False)
    draft_sample_method: str = "greedy"
    use_local_argmax_reduction: bool = False
    draft_decode_context_parallel_size: int | None = None
    parallel_drafting: bool = False  # SpeculativeConfig's default; 0.33's max_decode_query_len reads it
    # dynamic speculative decoding's [(first batch size, last, tokens)], a list as vLLM validates it
    num_speculative_tokens_per_batch_size: list | None = field(default=None, compare=False)

    def use_eagle(self) -> bool:
        return self.method == "eagle"

    def uses_draft_model(self) -> bool:
        return self.method == "draft_model"

    @property
    def max_num_new_slots_for_drafting(self) -> int:
        """``33:config/speculative.py:2057-2097`` without parallel drafting (34: the speculator
        config's, ``standalone_ar/config.py:24``): the draft-model input keeps one unsliced token.
        Read by ``max_decode_query_len``, the varlen bound vLLM's builders declare."""
        return 1 if self.uses_draft_model() else 0

    def uses_extract_hidden_states(self) -> bool:
        return False

    def use_dflash(self) -> bool:
        return self.method == "dflash"

    def use_ngram(self) -> bool:
        return self.method == "ngram"

    def use_ngram_gpu(self) -> bool:
        return False  # MRV1's GPU n-gram proposer (33:compilation/backends.py:1115-1118)

    def use_multi_module_mtp(self) -> bool:
        return self.multi_module

    def use_gemma4_mtp(self) -> bool:
        return False

    def num_mtp_modules(self) -> int:
        return self.num_speculative_tokens

    def uses_dynamic_speculative_decoding(self) -> bool:
        return self.num_speculative_tokens_per_batch_size is not None  # 34:config/speculative.py:1786-1787

    def compile_factors(self) -> dict:
        """The compile cache's hash factors (``VllmConfig.compile_factors``, 0.34): the cache is off."""
        return {"method": self.method, "num_speculative_tokens": self.num_speculative_tokens}

    def compute_hash(self) -> str:
        """The compile cache's hash (``VllmConfig.compute_hash``, 0.33): the cache is off."""
        return f"{self.method}-{self.num_speculative_tokens}"


METHODS = {Speculator.EAGLE: "eagle", Speculator.MULTI_MODULE_MTP: "mtp", Speculator.DFLASH: "dflash",
           Speculator.STANDALONE_AR: "draft_model"}


def _draft_model_config(model_config, scenario: Scenario):
    """The draft model's config: the target's tiny Llama; a multi-module MTP checkpoint has one
    MTP module per speculative step (``num_nextn_predict_layers``, read by its capture,
    ``33:v1/worker/gpu/spec_decode/multi_module_mtp/speculator.py:124``)."""
    if scenario.speculator is not Speculator.MULTI_MODULE_MTP:
        return model_config
    draft = copy.copy(model_config)
    draft.hf_config = copy.deepcopy(model_config.hf_config)
    draft.hf_config.num_nextn_predict_layers = scenario.uniform_decode_query_len - 1
    return draft


def _split_for_speculator(vllm_config) -> None:
    """0.34 splits the shared capture sizes into prefill tokens and decode requests at post-init
    by the target's decode query lengths (``34:config/vllm.py:2381-2387,2548``), which the
    speculative config decides; it is attached after post-init here, so the split is run again,
    vLLM's own, from the unsplit sizes."""
    cc = vllm_config.compilation_config
    if not cc.cudagraph_capture_sizes:  # no CUDA graphs: post-init split nothing (34:…:2549-2553)
        return
    for name in ("prefill_cudagraph_capture_token_sizes", "max_prefill_cudagraph_capture_tokens",
                 "decode_cudagraph_capture_request_sizes", "max_decode_cudagraph_capture_requests"):
        setattr(cc, name, None)
    cc.cudagraph_capture_sizes = sorted(CUDAGRAPH_CAPTURE_SIZES)
    cc.max_cudagraph_capture_size = max(CUDAGRAPH_CAPTURE_SIZES)
    q = vllm_config.uniform_decode_query_len
    vllm_config._split_cudagraph_capture_sizes(True, vllm_config.get_decode_cudagraph_query_lens(q))


def set_breakable(on: bool) -> None:
    """``VLLM_USE_BREAKABLE_CUDAGRAPH`` is read through ``envs.__getattr__``, which only caches after
    ``enable_envs_cache()`` (engine start-up); ``disable_envs_cache()`` makes it re-read the
    environment. Set to "0" rather than unset: unset lets ``_maybe_enable_breakable_cudagraph``
    decide by architecture."""
    import vllm.envs as envs

    os.environ["VLLM_USE_BREAKABLE_CUDAGRAPH"] = "1" if on else "0"
    envs.disable_envs_cache()


def config_key(scenario: Scenario) -> tuple:
    """The scenario fields ``VllmConfig.__post_init__`` reads."""
    return (scenario.breakable, scenario.ubatching, scenario.ubatch_size, scenario.cudagraph_mode.name,
            scenario.compilation_mode.name, scenario.splitting_ops.name, scenario.extensible_kv_cache,
            scenario.max_loras, scenario.specialize_active_lora)


class ConfigCache:
    """One post-init ``VllmConfig`` per config key, handed out restored to its post-init state."""

    def __init__(self) -> None:
        self._model_config = None
        self._folder: tempfile.TemporaryDirectory | None = None
        self._built: dict[tuple, tuple[object, dict] | BaseException] = {}

    def model_config(self):
        if self._model_config is None:
            from vllm.config import ModelConfig

            # removed when the cache goes or the process exits (TemporaryDirectory's finalizer)
            self._folder = tempfile.TemporaryDirectory(prefix="tiny-llama-config-")
            folder = self._folder.name
            with open(os.path.join(folder, "config.json"), "w") as f:
                json.dump(TINY_LLAMA, f)
            self._model_config = ModelConfig(
                model=folder, skip_tokenizer_init=True, dtype="float32", max_model_len=MAX_MODEL_LEN
            )
        return self._model_config

    def get(self, scenario: Scenario):
        """The scenario's ``VllmConfig`` (raises what vLLM raised when it refuses the config)."""
        key = config_key(scenario)
        set_breakable(scenario.breakable)
        if key not in self._built:
            try:
                vllm_config = self._build(scenario)
                self._built[key] = (vllm_config, self._snapshot(vllm_config))
            except Exception as exc:  # vLLM's refusal is the observation
                self._built[key] = exc
        built = self._built[key]
        if isinstance(built, BaseException):
            raise built
        vllm_config, snapshot = built
        vllm_config.compilation_config.__dict__.update(copy.deepcopy(snapshot))
        q = scenario.uniform_decode_query_len
        with_model = scenario.drafter is DrafterKind.WITH_MODEL
        vllm_config.speculative_config = None if scenario.drafter is DrafterKind.NONE else SpeculativeStandIn(
            num_speculative_tokens=q - 1,
            enforce_eager=scenario.spec_enforce_eager,
            method=METHODS[scenario.speculator] if with_model else "ngram",
            multi_module=with_model and scenario.speculator is Speculator.MULTI_MODULE_MTP,
            enable_adaptive_verification=scenario.adaptive_verification,
            draft_model_config=_draft_model_config(vllm_config.model_config, scenario),
        )
        if vllm_config.speculative_config is not None and hasattr(vllm_config, "_split_cudagraph_capture_sizes"):
            _split_for_speculator(vllm_config)
        return vllm_config

    @staticmethod
    def _snapshot(vllm_config) -> dict:
        return copy.deepcopy(vllm_config.compilation_config.__dict__)

    def _build(self, scenario: Scenario):
        from vllm.config import (
            CacheConfig,
            CompilationConfig,
            CompilationMode,
            DeviceConfig,
            ParallelConfig,
            SchedulerConfig,
            VllmConfig,
        )

        kwargs = dict(
            mode=CompilationMode[scenario.compilation_mode.name],
            cudagraph_mode=scenario.cudagraph_mode.name,
            cudagraph_capture_sizes=list(CUDAGRAPH_CAPTURE_SIZES),
            max_cudagraph_capture_size=max(CUDAGRAPH_CAPTURE_SIZES),
        )
        if scenario.splitting_ops is SplittingOps.ATTENTION:
            kwargs["splitting_ops"] = list(CompilationConfig._attention_ops)
        elif scenario.splitting_ops is SplittingOps.EMPTY:
            kwargs["splitting_ops"] = []
        # use_ubatching = enable_dbo or ubatch_size > 1 (config/parallel.py); DBO asserts one of
        # the deepep/nixl all2all backends in ParallelConfig.__post_init__. Micro-batching scenarios
        # set the thresholds below the modelled batches.
        thresholds = dict(zip(("dbo_decode_token_threshold", "dbo_prefill_token_threshold"), scenario.dbo_thresholds))
        split = dict(ubatch_size=scenario.ubatch_size) if scenario.ubatch_size else dict(enable_dbo=True)
        parallel = (
            ParallelConfig(**split, all2all_backend="deepep_low_latency", **thresholds)
            if scenario.ubatching else ParallelConfig()
        )
        # --no-enable-extensible-kv-cache (0.34.0; 0.33.0 has no such setting). Left unset, post-init
        # turns it on as on CUDA (34:config/vllm.py:3252-3254).
        extra = {}
        if not scenario.extensible_kv_cache and "enable_extensible_kv_cache" in CacheConfig.__dataclass_fields__:
            extra["cache_config"] = CacheConfig(enable_extensible_kv_cache=False)
        if scenario.max_loras:  # --enable-lora --max-loras N [--specialize-active-lora]
            from vllm.config import LoRAConfig

            extra["lora_config"] = LoRAConfig(max_loras=scenario.max_loras,
                                              specialize_active_lora=scenario.specialize_active_lora)
        return VllmConfig(
            **extra,
            model_config=copy.deepcopy(self.model_config()),
            compilation_config=CompilationConfig(**kwargs),
            parallel_config=parallel,
            scheduler_config=SchedulerConfig.default_factory(
                max_num_seqs=MAX_NUM_SEQS, max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
                max_model_len=MAX_MODEL_LEN,
            ),
            device_config=DeviceConfig(device="cuda"),
        )
