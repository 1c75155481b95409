"""The attention backends whose metadata builders the replay's attention groups run, named as in
vLLM's registry (``AttentionBackendEnum``, ``v1/attention/backends/registry.py``).

A scenario names a support level per role (``contract.core.properties.layers_support``). The replay
runs, for each level, the builder of a backend that gives that level in every release, whatever the
GPU and config (:data:`BY_LEVEL`; ``tests/test_attention_roles.py`` checks each against the release
tables ``contract/evidence/release_facts.py`` reads from the source). The levels resolution takes
the minimum of are then vLLM's answers, not the scenario's: an edit to one of these builders reaches
every trace whose scenario runs it, and a tree that changes a level shows as the resolution,
captures and dispatches it changes.

A branch check (``conform --vllm-src``) that changes a backend's file runs that backend instead, at
the level the release's own getter gives it on the replay's platform (:func:`levels_in`, asked of the
release before either side replays): both sides then run it, and the change is on every trace of
that level.

NEVER is Llama 4's chunked local attention over FlashInfer, the builder vLLM derives for those
layers (``create_chunked_local_attention_backend``,
``34:model_executor/layers/attention/chunked_local_attention.py:29-76``), whose own override says
NEVER where FlashInfer's getter would say more (vLLM #28739).

Imported as vLLM imports them, with two stand-ins: on the simulated device, ``CUTLASS_MLA``'s module
allocates its 128 MB workspace on the device at import (``34:v1/attention/backends/mla/cutlass_mla.py:99``),
made on torch's ``meta`` device (``simcuda.device_allocations``); where the ``flashinfer`` package
is not installed, FlashInfer's module imports its names from a stub, since no support getter calls
them (``stub_library.stubbed``).
"""

from __future__ import annotations

import contextlib

from contract.real import device, simcuda, stub_library

BY_LEVEL = {
    "ALWAYS": "TRITON_ATTN",
    "UNIFORM_BATCH": "FLASHMLA",
    "UNIFORM_SINGLE_TOKEN_DECODE": "CUTLASS_MLA",
    "NEVER": "FLASHINFER",  # its chunked local-attention subclass
}
# What the replay runs of the backends (the branch review's replayed files): the package of every
# registered backend, any of which a branch that changes its file runs, and the chunked local
# attention module NEVER's builder comes from.
MODULES = ("vllm.v1.attention.backends", "vllm.model_executor.layers.attention.chunked_local_attention")
# Level -> the file outside the backends package whose builder the replay runs for it by default:
# a tree that changes it is on the traces of that level (``contract/branch/conform.py``'s selection).
DEFAULT_FILES = {"NEVER": MODULES[1].removeprefix("vllm.").replace(".", "/") + ".py"}
# Llama 4's attention_chunk_size (config.json of meta-llama/Llama-4-Scout-17B-16E-Instruct)
ATTENTION_CHUNK_SIZE = 8192


def _backend(name: str) -> type:
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    allocations = contextlib.nullcontext() if device.SELECTED == "cuda" else simcuda.device_allocations()
    with allocations, stub_library.stubbed(("flashinfer",)):
        return AttentionBackendEnum[name].get_class()


def builder_class(level: str, chosen: dict[str, str] | None = None) -> type:
    """The metadata builder class the replay runs for ``level``, through vLLM's registry
    (``AttentionBackendEnum[name].get_class().get_builder_cls()``): ``chosen``'s backend for the
    level where it names one, else :data:`BY_LEVEL`'s."""
    if chosen and level in chosen:
        return _backend(chosen[level]).get_builder_cls()
    backend = _backend(BY_LEVEL[level])
    if level == "NEVER":
        from vllm.model_executor.layers.attention.chunked_local_attention import (
            create_chunked_local_attention_backend,
        )

        backend = create_chunked_local_attention_backend(backend, ATTENTION_CHUNK_SIZE)
    return backend.get_builder_cls()


def levels_in(paths: list[str], vllm_config) -> dict[str, tuple[str, str]]:
    """Registry name -> (the level its builder's ``get_cudagraph_support`` gives under
    ``vllm_config``, the file of ``paths`` that defines it), for every registered backend defined in
    one of ``paths`` (relative to ``vllm/``). A backend that does not import here, or whose getter
    raises, is left out."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    out = {}
    for member in AttentionBackendEnum:
        try:
            path = member.get_path()
        except Exception:  # noqa: BLE001 - a member that must be registered first (CUSTOM)
            continue
        file = path.rsplit(".", 1)[0].removeprefix("vllm.").replace(".", "/") + ".py"
        if file not in paths:
            continue
        try:
            out[member.name] = (_backend(member.name).get_builder_cls().get_cudagraph_support(vllm_config, None).name,
                                file)
        except Exception:  # noqa: BLE001 - not importable on this machine
            continue
    return out


def choose(found: dict[str, tuple[str, str]]) -> tuple[dict[str, str], dict[str, str]]:
    """(level -> the backend run for it, level -> the file defining that backend): the first by name
    of ``levels_in``'s for each level."""
    chosen: dict[str, str] = {}
    files: dict[str, str] = {}
    for name in sorted(found):
        level, file = found[name]
        if level not in chosen:
            chosen[level], files[level] = name, file
    return chosen, files
