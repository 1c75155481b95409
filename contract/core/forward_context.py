"""``BatchDescriptor`` (``forward_context.py:29-57``), the key both runners' wrappers capture under."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class BatchDescriptor:
    """``forward_context.py:29-57``. The LoRA fields are set only with ``--enable-lora``
    (``has_lora``: 0.33.0's MRV2 and MRV1, dropped in 0.34.0, ``34:forward_context.py:30-55``), and
    written out only when set."""

    num_tokens: int
    num_reqs: int | None = None
    uniform: bool = False
    has_lora: bool = False
    num_active_loras: int = 0

    def __str__(self) -> str:
        lora = (",lora" if self.has_lora else "") + (f",loras={self.num_active_loras}" if self.num_active_loras else "")
        if self.num_reqs is None and not self.uniform:
            return f"BD({self.num_tokens}{lora})"
        return f"BD({self.num_tokens},{self.num_reqs}{',uniform' if self.uniform else ''}{lora})"

    def to_json(self) -> dict:
        out = {"num_tokens": self.num_tokens, "num_reqs": self.num_reqs, "uniform": self.uniform}
        if self.has_lora or self.num_active_loras:
            out.update(has_lora=self.has_lora, num_active_loras=self.num_active_loras)
        return out

    @classmethod
    def from_json(cls, data: dict) -> BatchDescriptor:
        if not isinstance(data, dict) or not isinstance(data.get("num_tokens"), int):
            raise ValueError("batch_descriptor needs an integer num_tokens")
        num_reqs = data.get("num_reqs")
        if num_reqs is not None and not isinstance(num_reqs, int):
            raise ValueError("batch_descriptor num_reqs must be an integer or null")
        loras = data.get("num_active_loras", 0)
        if not isinstance(loras, int) or isinstance(loras, bool) or loras < 0:
            raise ValueError("batch_descriptor num_active_loras must be a non-negative integer")
        return cls(data["num_tokens"], num_reqs, bool(data.get("uniform", False)), bool(data.get("has_lora", False)),
                   loras)
