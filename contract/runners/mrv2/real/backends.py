"""The model MRV2 runs, compiled at its first forward by real Dynamo through vLLM's ``VllmBackend``.

``TinyCompiledModel`` is ``TinyModel`` decorated with vLLM's ``@support_torch_compile`` (a scenario's
``model_compiled``; ``TinyModel`` itself stands for an undecorated class): its constructor decides
``do_not_compile`` from the config (``compilation/decorators.py``), so ``has_compiled_submodule``
(``v1/worker/gpu/cudagraph_utils.py:145-151`` in 0.34.0) answers about a real compiled class, and
its first call runs ``torch.compile`` with ``VllmBackend``, whose ``PiecewiseCompileInterpreter``
calls ``wrap_with_cudagraph_if_needed`` per piece under the mode in force at that moment
(``compilation/backends.py:682-686``, call at ``:793``). Pieces are compiled with the ``eager``
backend (no Inductor, no C++ toolchain) and with every ``pass_config`` switch off, since the fusion
passes need CUDA kernels that do not exist on CPU (``compilation/passes/pass_manager.py``).

The forward is two compute pieces around an attention stand-in, ``simcg::attention``, which writes
into a caller-provided buffer and is decorated with ``eager_break_during_capture`` where the release
decorates ``unified_attention_with_output`` (``contract/real/attention_op.py``); it is added to ``splitting_ops`` exactly when vLLM's config says
the splitting ops hold the attention ops, so the graph splits where vLLM would split a real model.
``simcg::compute`` runs a compute piece and tells the replay, so an eager run is seen even inside
a compiled graph (custom ops are opaque to Dynamo and run at every call).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from contract.real.attention_op import DRAFT_LAYER, TARGET_LAYER, AttentionOp

ATTENTION_OP = "simcg::attention"
MODEL_LABEL = "model"  # the target's raw model, as the model names it
HIDDEN_SIZE = 8
VOCAB_SIZE = 16

_on_compute: list[Callable[[], None]] = []


@torch.library.custom_op("simcg::compute", mutates_args=())
def compute(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    for listener in _on_compute:
        listener()
    return x @ weight + 1


@compute.register_fake
def _(x, weight):
    return torch.empty_like(x)


_attention: dict[str, AttentionOp] = {}  # a model's op key -> its attention op
_on_attention: list[Callable[[bool], None]] = []


@torch.library.custom_op(ATTENTION_OP, mutates_args=("output",))
def attention(query: torch.Tensor, output: torch.Tensor, key: str) -> None:
    _attention[key](query, output)


@attention.register_fake
def _(query, output, key):
    return None


def install(on_compute: Callable[[], None], on_attention: Callable[[bool], None]) -> None:
    """Once per process, after vLLM is imported: route compute and attention notices."""
    _on_compute[:] = [on_compute]
    _on_attention[:] = [on_attention]


def _attention_op(vllm_config, layer_name: str) -> str:
    """A new model's attention op (``contract/real/attention_op.py``), marked now, under the
    scenario's settings; its key in ``_attention``."""
    from models.tiny import attention as kernel

    key = f"{layer_name}#{len(_attention)}"
    _attention[key] = AttentionOp(layer_name, kernel, lambda open_: _on_attention[0](open_))
    _attention[key].register(vllm_config)
    return key


def register_attention(model, vllm_config) -> None:
    """A model kept across traces: its attention layer into this trace's config."""
    _attention[model.attention_key].register(vllm_config)


def configure(vllm_config) -> None:
    """What a CPU compile needs of ``compilation_config``; none of it touches CUDA-graph decisions."""
    cc = vllm_config.compilation_config
    cc.backend = "eager"
    for name, value in vars(cc.pass_config).items():
        if isinstance(value, bool):
            setattr(cc.pass_config, name, False)
    if cc.splitting_ops_contain_attention() and ATTENTION_OP not in cc.splitting_ops:
        cc.splitting_ops = [*cc.splitting_ops, ATTENTION_OP]


class TinyModel(torch.nn.Module):
    """A model class without ``@support_torch_compile`` (``model_compiled`` false): it never compiles."""

    def __init__(self, *, vllm_config, prefix: str = "") -> None:
        from vllm.distributed.parallel_state import get_pp_group
        from vllm.sequence import IntermediateTensors

        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB_SIZE, HIDDEN_SIZE)
        self.weight = torch.nn.Parameter(torch.eye(HIDDEN_SIZE) * 0.5, requires_grad=False)
        max_tokens = vllm_config.scheduler_config.max_num_batched_tokens
        self.register_buffer("attn_output", torch.zeros(max_tokens, HIDDEN_SIZE), persistent=False)
        self.attention_key = _attention_op(vllm_config, TARGET_LAYER)
        # A pipeline stage's model, as vLLM's models split: the first embeds, the others read the
        # stage before's hidden states; all but the last hand theirs on (``IntermediateTensors``).
        self.is_first_stage, self.is_last_stage = get_pp_group().is_first_rank, get_pp_group().is_last_rank
        self.intermediate_tensors_class = IntermediateTensors

    def make_empty_intermediate_tensors(self, batch_size: int, dtype, device):
        return self.intermediate_tensors_class({"hidden_states": torch.zeros(batch_size, HIDDEN_SIZE, dtype=dtype, device=device)})

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor,
                intermediate_tensors=None, inputs_embeds=None):
        x = self.embed(input_ids) if self.is_first_stage else intermediate_tensors["hidden_states"]
        h = torch.ops.simcg.compute(x, self.weight)
        out = self.attn_output[: h.shape[0]]
        torch.ops.simcg.attention(h, out, self.attention_key)
        hidden = torch.ops.simcg.compute(out, self.weight) * 2
        if self.is_last_stage:
            return hidden
        return self.intermediate_tensors_class({"hidden_states": hidden})


class TinyDraftModel(torch.nn.Module):
    """A draft model class without ``@support_torch_compile`` (``draft_compiled`` false), called
    as the speculators' ``_run_model`` calls ``self.model``: ``input_ids``, ``positions``,
    ``hidden_states`` (the target's, of the draft config's hidden size), ``inputs_embeds``
    (``v1/worker/gpu/spec_decode/target_dependent_ar/speculator.py``), and ``spec_step_idx`` (the
    module of a multi-module MTP step, ``…/multi_module_mtp/speculator.py``). Same pieces as ``TinyModel``."""

    def __init__(self, *, vllm_config, prefix: str = "", hidden_size: int = HIDDEN_SIZE) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.eye(hidden_size) * 0.5, requires_grad=False)
        self.embed = torch.nn.Embedding(VOCAB_SIZE, hidden_size)
        max_tokens = vllm_config.scheduler_config.max_num_batched_tokens
        self.register_buffer("attn_output", torch.zeros(max_tokens, hidden_size), persistent=False)
        self.attention_key = _attention_op(vllm_config, DRAFT_LAYER)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, hidden_states: torch.Tensor | None = None,
                inputs_embeds=None, spec_step_idx: int = 0) -> torch.Tensor:
        # A standalone draft model reads its own tokens only (no target hidden states).
        x = self.embed(input_ids) if hidden_states is None else hidden_states
        h = torch.ops.simcg.compute(x, self.weight)
        out = self.attn_output[: h.shape[0]]
        torch.ops.simcg.attention(h, out, self.attention_key)
        return torch.ops.simcg.compute(out, self.weight) * 2


_COMPILED_CLASSES: dict[str, type] = {}


def compiled_class(draft: bool = False):
    """``TinyModel`` (or ``TinyDraftModel``) under vLLM's ``@support_torch_compile`` (decorated
    once per process)."""
    name = "draft" if draft else "model"
    if name not in _COMPILED_CLASSES:
        from vllm.compilation.decorators import support_torch_compile

        if draft:
            class TinyCompiledDraftModel(TinyDraftModel):
                pass

            dims = {"input_ids": 0, "positions": 0, "hidden_states": 0}
            _COMPILED_CLASSES[name] = support_torch_compile(dynamic_arg_dims=dims)(TinyCompiledDraftModel)
        else:
            class TinyCompiledModel(TinyModel):
                pass

            dims = {"input_ids": 0, "positions": 0, "intermediate_tensors": 0}
            _COMPILED_CLASSES[name] = support_torch_compile(dynamic_arg_dims=dims)(TinyCompiledModel)
    return _COMPILED_CLASSES[name]


def build(vllm_config, decorated: bool = True, prefix: str = "model"):
    from vllm.config import set_current_vllm_config

    cls = compiled_class() if decorated else TinyModel
    with set_current_vllm_config(vllm_config):
        return cls(vllm_config=vllm_config, prefix=prefix)


def build_draft(vllm_config, hidden_size: int, decorated: bool = True, prefix: str = "draft_model"):
    from vllm.config import set_current_vllm_config

    cls = compiled_class(draft=True) if decorated else TinyDraftModel
    with set_current_vllm_config(vllm_config):
        return cls(vllm_config=vllm_config, prefix=prefix, hidden_size=hidden_size)
