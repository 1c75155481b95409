"""The adapter manager ``LoRAModelRunnerMixin`` drives (``LRUCacheWorkerLoRAManager``), standing in:
the stand-in model has no LoRA layer to load the dummy adapters' weights into, so adding them does
nothing; it keeps how many adapters the mixin last activated (``set_active_adapters``,
``33:v1/worker/lora_model_runner_mixin.py:68-87``), what a graph captured then records."""

from __future__ import annotations

import contextlib


class LoRAManager:
    def __init__(self) -> None:
        self.selected = 0

    def get_dummy_lora_warmup_rank(self, rank: int) -> int:
        return rank

    def dummy_lora_cache(self):
        return contextlib.nullcontext()

    def add_dummy_lora(self, lora_request, rank: int) -> bool:
        return True

    def remove_all_adapters(self) -> None:
        self.selected = 0

    def set_active_adapters(self, lora_requests, lora_mapping) -> None:
        self.selected = len(lora_requests)


def selected(runner) -> int:
    """The dummy adapters the mixin last activated on ``runner``'s adapter manager; 0 without LoRA."""
    return getattr(getattr(runner, "lora_manager", None), "selected", 0)
