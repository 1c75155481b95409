"""The LoRA capture cases both runners key their graphs by (``get_captured_lora_counts``,
``33:lora/utils.py:55-69``, ``34:lora/utils.py:57-70``), under vLLM's default
``cudagraph_specialize_lora``."""

from __future__ import annotations

from contract.core.scenario import MAX_LORAS

# (max_loras, specialize_active_lora) the explorer tries: one adapter (cases 0 and 2) and three
# specialised ones (cases 0, 1, 2 and 4, where 3 active adapters round up)
LORA_SETTINGS = ((1, False), (MAX_LORAS, True))


def lora_capture_cases(max_loras: int, specialize_active_lora: bool) -> tuple[int, ...]:
    """0, then ``get_captured_lora_counts``: ``max_loras + 1``, and with ``specialize_active_lora``
    the powers of 2 up to it before; ``(0,)`` without LoRA. MRV1's ``_get_lora_cases``
    (``33:v1/cudagraph_dispatcher.py:110-128``) and MRV2's ``get_lora_capture_cases``
    (``33:v1/worker/gpu/lora_utils.py:20-35``, ``34:…:20-35``) agree on it."""
    if not max_loras:
        return (0,)
    if not specialize_active_lora:
        return (0, max_loras + 1)
    return (0, *(n for n in range(1, max_loras + 2) if n & (n - 1) == 0 or n == max_loras + 1))
