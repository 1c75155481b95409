"""The attention backends whose metadata builders the replay's attention groups run, named as in
vLLM's registry (``AttentionBackendEnum``, ``v1/attention/backends/registry.py``).

A scenario names a support level per role (``contract.core.properties.layers_support``). The replay
runs, for each level, the builder of a backend that gives that level in every release, whatever the
GPU and config (:data:`BY_LEVEL`; ``tests/test_attention_roles.py`` checks each against the release
tables ``contract/evidence/release_facts.py`` reads from the source). The level resolution takes the
minimum of is then vLLM's answer, not the scenario's: an edit to one of these builders reaches every
trace whose scenario runs it, and a tree that changes a level shows as the resolution, captures and
dispatches it changes.

NEVER is Llama 4's chunked local attention over FlashInfer, the builder vLLM derives for those
layers (``create_chunked_local_attention_backend``,
``34:model_executor/layers/attention/chunked_local_attention.py:29-76``), whose own override says
NEVER where FlashInfer's getter would say more (vLLM #28739).

Imported as vLLM imports them, with two stand-ins on the simulated device: ``CUTLASS_MLA``'s module
allocates its 128 MB workspace on the device at import (``34:v1/attention/backends/mla/cutlass_mla.py:99``),
made on torch's ``meta`` device (``simcuda.device_allocations``); FlashInfer's module imports
names from the ``flashinfer`` package, absent here, which no support getter calls
(``stub_library.stubbed``).
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
# Llama 4's attention_chunk_size (config.json of meta-llama/Llama-4-Scout-17B-16E-Instruct)
ATTENTION_CHUNK_SIZE = 8192


def builder_class(level: str) -> type:
    """The metadata builder class the replay runs for ``level``, through vLLM's registry
    (``AttentionBackendEnum[name].get_class().get_builder_cls()``)."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    simulated = device.SELECTED != "cuda"
    with (simcuda.device_allocations() if simulated else contextlib.nullcontext()), \
            (stub_library.stubbed(("flashinfer",)) if simulated else contextlib.nullcontext()):
        backend = AttentionBackendEnum[BY_LEVEL[level]].get_class()
    if level == "NEVER":
        from vllm.model_executor.layers.attention.chunked_local_attention import (
            create_chunked_local_attention_backend,
        )

        backend = create_chunked_local_attention_backend(backend, ATTENTION_CHUNK_SIZE)
    return backend.get_builder_cls()
