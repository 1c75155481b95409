"""``BatchDescriptor`` (``forward_context.py:29-57``), the key both runners' wrappers capture under."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class BatchDescriptor:
    """``forward_context.py:29-57``. The LoRA fields are set only with ``--enable-lora``
    (``has_lora``: 0.33.0's MRV2 and MRV1, dropped in 0.34.0, ``34:forward_context.py:30-55``), and
    written out only when set. ``num_ubatches`` is MRV1's micro-batch split, which vLLM keeps beside
    the descriptor in the same forward context (``ForwardContext.ubatch_slices``, ``33:forward_context.py:160``)
    and ``UBatchWrapper.__call__`` reads with it; 1: not split. Written out only when above 1, as
    MRV2's descriptor holds it (``num_ubatches``)."""

    num_tokens: int
    num_reqs: int | None = None
    uniform: bool = False
    has_lora: bool = False
    num_active_loras: int = 0
    num_ubatches: int = 1

    def __str__(self) -> str:
        lora = (",lora" if self.has_lora else "") + (f",loras={self.num_active_loras}" if self.num_active_loras else "")
        lora += f",ubatches={self.num_ubatches}" if self.num_ubatches > 1 else ""
        if self.num_reqs is None and not self.uniform:
            return f"BD({self.num_tokens}{lora})"
        return f"BD({self.num_tokens},{self.num_reqs}{',uniform' if self.uniform else ''}{lora})"

    def to_json(self) -> dict:
        out = {"num_tokens": self.num_tokens, "num_reqs": self.num_reqs, "uniform": self.uniform}
        if self.has_lora or self.num_active_loras:
            out.update(has_lora=self.has_lora, num_active_loras=self.num_active_loras)
        if self.num_ubatches > 1:
            out["num_ubatches"] = self.num_ubatches
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
        ubatches = data.get("num_ubatches", 1)
        if not isinstance(ubatches, int) or isinstance(ubatches, bool) or ubatches < 1:
            raise ValueError("batch_descriptor num_ubatches must be a positive integer")
        return cls(data["num_tokens"], num_reqs, bool(data.get("uniform", False)), bool(data.get("has_lora", False)),
                   loras, ubatches)
