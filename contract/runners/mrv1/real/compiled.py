"""The compiled model's inner PIECEWISE capturers, decided by vLLM at the model's first forward.

Two of vLLM's decisions, called for real:

- whether the model is compiled at all: ``do_not_compile`` as set by ``@support_torch_compile``'s
  ``__init__`` (``compilation/decorators.py:392-399`` in 0.30.0), read from a probe class built
  with vLLM's decorator under the scenario's config;
- whether each compiled piece gets a capturer: ``wrap_with_cudagraph_if_needed``
  (``compilation/backends.py:633-686``), called per piece with the config as it is at the first
  forward (``profile_run``), exactly where ``PiecewiseCompileInterpreter.call_module``
  (``:730-777``) calls it; what it returns (a ``CUDAGraphWrapper(PIECEWISE)`` or the bare piece)
  becomes the piece the model's compiled graph calls.

Dynamo and Inductor themselves do not run: the graph is split where ``VllmBackend.__call__``
would split it (``split_graph`` on ``compilation_config.splitting_ops``, ``:1174-1179``), here
at the tiny model's attention op when the splitting ops hold the attention ops.
"""

from __future__ import annotations

from collections.abc import Callable

_PROBE = None
_DECIDED: dict[int, tuple[object, bool]] = {}  # id(vllm_config) -> (vllm_config, do_not_compile)


def _probe_class():
    global _PROBE
    if _PROBE is None:
        import torch

        from vllm.compilation.decorators import support_torch_compile

        class CompileProbe(torch.nn.Module):
            """Built only to read the decorator's ``do_not_compile``; never called."""

            def __init__(self, *, vllm_config, prefix: str = "") -> None:
                super().__init__()

            def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
                return input_ids

        _PROBE = support_torch_compile(dynamic_arg_dims={"input_ids": 0})(CompileProbe)
    return _PROBE


def do_not_compile(vllm_config) -> bool:
    """Decided once per config object: it reads only the config-time compilation mode, and each
    probe built under a compiling mode registers a ``torch.compile`` wrapper."""
    decided = _DECIDED.get(id(vllm_config))
    if decided is None or decided[0] is not vllm_config:
        from vllm.config import set_current_vllm_config

        with set_current_vllm_config(vllm_config):
            decided = (vllm_config, _probe_class()(vllm_config=vllm_config).do_not_compile)
        _DECIDED[id(vllm_config)] = decided
    return decided[1]


class PiecewiseBackend:
    """Stands for the ``PiecewiseBackend`` of one compiled submodule: runs that piece."""

    def __init__(self, piece: Callable, index: int, total: int) -> None:
        self.piece = piece
        self.is_first_graph = index == 0
        self.is_last_graph = index == total - 1

    def __call__(self, *args):
        return self.piece(*args)


class SplitGraph:
    """The split graph module: calls the (possibly wrapped) submodules in order."""

    def __init__(self, submodules: list[Callable]) -> None:
        self.submodules = submodules

    def __call__(self, x):
        for submodule in self.submodules:
            x = submodule(x)
        return x


def compile_model(model, vllm_config) -> list:
    """Compile ``model`` as its first forward would; return the capturers installed in it."""
    if do_not_compile(vllm_config):
        return []
    from vllm.compilation.backends import wrap_with_cudagraph_if_needed

    compilation_config = vllm_config.compilation_config
    items = split_graph(model, compilation_config)
    compiled = [piece for piece, is_splitting_op in items if not is_splitting_op]
    submodules, capturers = [], []
    for piece, is_splitting_op in items:
        if is_splitting_op:
            submodules.append(piece)
            continue
        backend = PiecewiseBackend(piece, compiled.index(piece), len(compiled))
        wrapped = wrap_with_cudagraph_if_needed(
            backend, vllm_config, compilation_config, backend.is_first_graph, backend.is_last_graph
        )
        submodules.append(wrapped)
        if wrapped is not backend:
            capturers.append(wrapped)
    model.graph = SplitGraph(submodules)
    return capturers


def split_graph(model, compilation_config) -> list:
    """Where ``VllmBackend.__call__`` splits the graph (``split_graph(graph, fx_split_ops)``,
    ``compilation/backends.py:1174-1179``): at the attention op when the splitting ops hold the
    attention ops and Inductor does not partition the graph itself. Mirrored: guarded by
    ``decisions.MIRRORED``."""
    split_at_attention = (
        not compilation_config.use_inductor_graph_partition
        and compilation_config.splitting_ops_contain_attention()
    )
    return model.split(at_attention=split_at_attention)
