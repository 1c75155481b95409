"""Whether a reproduction's checkpoints fit one GPU: their parameter count, estimated from each
``config.json`` under ``hf_configs/``, in the dtype the command loads them in, against one
141 GB GPU (H200) at vLLM's default ``gpu_memory_utilization`` of 0.9
(``config/cache.py``), less a reserve for the KV cache, activations and CUDA graphs.

The estimate counts the decoder's matrices (embedding, LM head unless tied, attention
projections, dense MLPs, routed and shared experts, routers) and, for a model that drafts with
its own MTP layers, those layers; norms, biases and a vision tower are not counted. It is within
3% of the totals the model cards state (``tests/test_weights.py``).

``--quantization fp8`` is vLLM's online FP8: from 0.34.0 its linear and MoE weights are created on
the meta device and quantized layer by layer as they load
(``34:model_executor/layers/quantization/online/fp8.py:132-134``), so the peak is the FP8 size;
embeddings and the LM head stay in the checkpoint's dtype.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

HF_CONFIGS = Path(__file__).with_name("hf_configs")
GPU_BYTES = 141e9  # one H200
GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default
RESERVE_BYTES = 8e9  # KV cache for 4 sequences of 4096 tokens, activations, CUDA graphs
BUDGET_BYTES = GPU_BYTES * GPU_MEMORY_UTILIZATION - RESERVE_BYTES
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
# The first release whose online FP8 quantizes layer by layer as weights load.
LAYERWISE_FP8_FROM = 34


@dataclass(frozen=True)
class Parameters:
    embedding: int  # embeddings and the LM head: kept in the checkpoint's dtype by online FP8
    linear: int  # attention, dense MLP and shared-expert matrices, routers: FP8 under --quantization fp8
    experts: int  # routed experts: FP8 too, and split across the GPUs under expert parallelism
    dtype: str

    @property
    def total(self) -> int:
        return self.embedding + self.linear + self.experts

    def bytes(self, fp8: bool, expert_parallel: int = 1) -> float:
        """One GPU's share: everything but the routed experts is replicated."""
        per = DTYPE_BYTES.get(self.dtype, 2)
        return self.embedding * per + (self.linear + self.experts / expert_parallel) * (1 if fp8 else per)


def _text(repo: str) -> dict:
    data = json.loads((HF_CONFIGS / repo / "config.json").read_text())
    return {**data, **(data.get("text_config") or {})}


def _layer(c: dict, moe: bool) -> tuple[int, int]:
    """(replicated, routed-expert) parameters of one decoder layer."""
    hidden = c["hidden_size"]
    heads, kv = c["num_attention_heads"], c.get("num_key_value_heads", c["num_attention_heads"])
    head_dim = c.get("head_dim") or hidden // heads
    attention = hidden * head_dim * (2 * heads + 2 * kv)
    if not moe:
        return attention + 3 * hidden * c.get("intermediate_size_mlp", c["intermediate_size"]), 0
    experts = c.get("num_experts") or c.get("n_routed_experts") or c.get("num_local_experts")
    shared = c.get("n_shared_experts", 1 if c["model_type"].startswith("llama4") else 0)
    size = c.get("moe_intermediate_size") or c["intermediate_size"]
    return attention + shared * 3 * hidden * size + hidden * experts, experts * 3 * hidden * size


def parameters(repo: str, with_mtp: bool = False) -> Parameters:
    """The estimate for the stored checkpoint ``repo``; ``with_mtp`` adds its MTP layers (method
    ``mtp`` loads them as the draft)."""
    c = _text(repo)
    vocab, hidden = c.get("draft_vocab_size") or c["vocab_size"], c["hidden_size"]
    embedding = c["vocab_size"] * hidden + (0 if c.get("tie_word_embeddings") else vocab * hidden)
    is_moe = any(k in c for k in ("num_experts", "n_routed_experts", "num_local_experts"))
    dense = c.get("first_k_dense_replace", 0) if is_moe else c["num_hidden_layers"]
    layers = c["num_hidden_layers"] + (int(c.get("num_nextn_predict_layers") or 0) if with_mtp else 0)
    if "Eagle3" in c["architectures"][0]:  # one layer on twice the hidden size, and the fc that folds three
        layers, embedding = 1, vocab * hidden + 3 * hidden * hidden
    replicated, experts = _layer(c, is_moe)
    linear = dense * _layer(c, False)[0] + (layers - dense) * replicated
    return Parameters(embedding, linear, (layers - dense) * experts, c.get("torch_dtype", "bfloat16"))


@dataclass(frozen=True)
class Fit:
    fp8: bool  # whether the command must add --quantization fp8
    gigabytes: float  # the weights as loaded
    fits: bool
    text: str  # the check as a page states it


def fit(repos: list[tuple[str, bool]], release: str, expert_parallel: int = 1) -> Fit:
    """Whether the checkpoints ``repos`` ((repo, with MTP layers)) fit each 141 GB GPU on
    ``release`` (``expert_parallel`` GPUs share the routed experts), in their dtype or else with
    online FP8 where it loads layer by layer."""
    params = [parameters(r, m) for r, m in repos]
    total = sum(p.total for p in params)
    options = [False] + ([True] if int(release.split(".")[1]) >= LAYERWISE_FP8_FROM else [])
    for fp8 in options:
        size = sum(p.bytes(fp8, expert_parallel) for p in params)
        if size <= BUDGET_BYTES:
            break
    dtype = "FP8 (--quantization fp8)" if fp8 else params[0].dtype
    verdict = "fits" if size <= BUDGET_BYTES else "does not fit"
    where = "one 141 GB GPU" if expert_parallel == 1 else \
        f"each 141 GB GPU (the routed experts split over {expert_parallel} by expert parallelism)"
    text = (f"{total / 1e9:.1f} B parameters (estimated from config.json) in {dtype}: {size / 1e9:.0f} GB of "
            f"weights per GPU, which {verdict} {where} (a budget of {BUDGET_BYTES / 1e9:.0f} GB: 0.9 of it, vLLM's "
            f"default gpu_memory_utilization, less {RESERVE_BYTES / 1e9:.0f} GB for the KV cache, activations and "
            "graphs)")
    return Fit(fp8, round(size / 1e9, 1), size <= BUDGET_BYTES, text)
