"""``BatchDescriptor`` (``forward_context.py:29-57``), the key both runners' wrappers capture under."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class BatchDescriptor:
    """``forward_context.py:29-57``. LoRA fields are left out: the modelled scenarios have no LoRA,
    so ``has_lora`` is always False and ``num_active_loras`` always 0."""

    num_tokens: int
    num_reqs: int | None = None
    uniform: bool = False

    def __str__(self) -> str:
        if self.num_reqs is None and not self.uniform:
            return f"BD({self.num_tokens})"
        return f"BD({self.num_tokens},{self.num_reqs}{',uniform' if self.uniform else ''})"

    def to_json(self) -> dict:
        return {"num_tokens": self.num_tokens, "num_reqs": self.num_reqs, "uniform": self.uniform}

    @classmethod
    def from_json(cls, data: dict) -> BatchDescriptor:
        if not isinstance(data, dict) or not isinstance(data.get("num_tokens"), int):
            raise ValueError("batch_descriptor needs an integer num_tokens")
        num_reqs = data.get("num_reqs")
        if num_reqs is not None and not isinstance(num_reqs, int):
            raise ValueError("batch_descriptor num_reqs must be an integer or null")
        return cls(data["num_tokens"], num_reqs, bool(data.get("uniform", False)))
