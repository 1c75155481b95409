"""The stand-in models' attention: the release's own ``unified_attention_with_output``, marked for an
eager break as the release marks it.

vLLM breaks a breakable CUDA-graph capture at every op decorated with ``eager_break_during_capture``
(``34:compilation/breakable_cudagraph.py:75-124``); its attention op ``unified_attention_with_output``
carries the decorator (``34:model_executor/layers/attention/attention.py:800``, every release from
0.28.0 on). The stand-in attention runs that function's body as the release (or the tree under
review) defines it: ``get_attention_context`` reads the layer from the forward context, then its
``impl.forward`` runs, here the stand-in kernel. Around it goes the release's own
``eager_break_during_capture`` exactly where the release's source decorates the function with it.

The decorator list is read from the module's source, not from the imported function: 0.28.0 to
0.32.0 decide at decoration time (the decorator returns the bare function while breakable graphs are
off), so the imported object reflects the environment of the module's first import, which a replay
of many scenarios in one process does not share; a server sets it before the import. The decorator
is therefore applied when each model is built, after the scenario has set
``VLLM_USE_BREAKABLE_CUDAGRAPH``. ``maybe_transfer_kv_layer`` is a no-op without a KV connector,
which no scenario has.
"""

from __future__ import annotations

import ast
import functools
import inspect
from collections.abc import Callable
from pathlib import Path

from contract.real import decisions

ATTENTION_MODULE = "vllm.model_executor.layers.attention.attention"
ATTENTION_FUNCTION = "unified_attention_with_output"
MARKER = "eager_break_during_capture"
TARGET_LAYER = "model.layers.0.self_attn.attn"
DRAFT_LAYER = "drafter.layers.0.self_attn.attn"


def _name(decorator: ast.expr) -> str:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    if isinstance(target, ast.Attribute):
        return target.attr
    return target.id if isinstance(target, ast.Name) else ""


def marks_attention(source: Path) -> bool:
    """Whether ``unified_attention_with_output`` in ``source`` (the release's or the tree's
    ``attention.py``) is decorated with ``eager_break_during_capture``."""
    stat = source.stat()
    return _marks_attention(str(source), stat.st_mtime_ns, stat.st_size)


# Every stand-in model the replay builds asks (hundreds a run), and parsing the module each time
# took a thirtieth of a corpus replay. Keyed by the file's state, so an edited file is read again.
@functools.lru_cache(maxsize=8)
def _marks_attention(path: str, mtime_ns: int, size: int) -> bool:
    source = Path(path)
    tree = ast.parse(source.read_text(encoding="utf-8"), filename=path)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == ATTENTION_FUNCTION:
            return any(_name(d) == MARKER for d in node.decorator_list)
    raise RuntimeError(f"{source} defines no {ATTENTION_FUNCTION}: the replay cannot tell whether the "
                       f"release breaks a breakable capture at its attention op")


class _Impl:
    """The layer's ``impl``: tells the replay whether a breakable capture is open, then computes."""

    def __init__(self, kernel: Callable, on_attention: Callable[[bool], None]) -> None:
        self.kernel, self.on_attention = kernel, on_attention

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None, **scales) -> None:
        from vllm.compilation.breakable_cudagraph import BreakableCUDAGraphCapture

        self.on_attention(BreakableCUDAGraphCapture.current() is not None)
        self.kernel(query, output)


class _Layer:
    """What ``get_attention_context`` and the op's body read of an ``Attention`` layer."""

    def __init__(self, impl: _Impl) -> None:
        import torch

        self.impl = impl
        self.kv_cache = torch.empty(0)


class AttentionOp:
    """The op a stand-in model calls as ``op(query, output)``: the release's
    ``unified_attention_with_output`` body on the layer ``layer_name``, marked where the release
    marks it. ``register`` puts the layer in a config's ``static_forward_context`` (the forward
    context's ``no_compile_layers``), as an ``Attention`` layer registers itself when built; a model
    kept across traces is registered in each trace's config."""

    def __init__(self, layer_name: str, kernel: Callable, on_attention: Callable[[bool], None]) -> None:
        import importlib

        from vllm.compilation.breakable_cudagraph import eager_break_during_capture

        module = importlib.import_module(ATTENTION_MODULE)
        body = decisions.tracked(inspect.unwrap(getattr(module, ATTENTION_FUNCTION)), ATTENTION_FUNCTION)
        self.layer_name, self.layer = layer_name, _Layer(_Impl(kernel, on_attention))

        def attention(query, output) -> None:
            body(query, query, query, output, layer_name)

        marked = marks_attention(Path(module.__file__))
        self.run = eager_break_during_capture(attention) if marked else attention

    def register(self, vllm_config) -> None:
        vllm_config.compilation_config.static_forward_context[self.layer_name] = self.layer

    def __call__(self, query, output) -> None:
        self.run(query, output)
