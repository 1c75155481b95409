"""A tiny target model and drafter model shaped like what vLLM wraps.

Each forward is two compute pieces around an attention-like op, the op vLLM splits a compiled
graph at (``CompilationConfig._attention_ops``) and breaks a breakable capture at. The op writes
into a caller-provided output buffer, as ``unified_attention_with_output`` does; the replay passes
it in decorated as the release decorates its own (``contract/real/attention_op.py``), so this module
imports without vLLM. Inputs come from static buffers the
model owns, sliced per batch like the runner's persistent ``input_ids`` buffer, so a replay sees
the addresses its capture saw.

``on_compute`` is called each time a compute piece runs; the replay uses it to tell an eager run
from one inside a capture or replaced by a replay.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

HIDDEN_SIZE = 8


def attention(query: torch.Tensor, output: torch.Tensor) -> None:
    """Attention stand-in: writes its result into ``output`` and returns nothing."""
    output.copy_(torch.tanh(query))


class TinyModel(torch.nn.Module):
    def __init__(self, name: str, max_num_tokens: int, attention_op: Callable | None = None,
                 device: torch.device | str = "cpu") -> None:
        super().__init__()
        self.name = name
        # float32 throughout: a replay is compared with the eager forward at relative error 1e-6.
        self.weight = torch.nn.Parameter(torch.eye(HIDDEN_SIZE, device=device) * 0.5, requires_grad=False)
        self.input_ids = torch.zeros(max_num_tokens, HIDDEN_SIZE, device=device)  # static input buffer
        self.attn_output = torch.zeros(max_num_tokens, HIDDEN_SIZE, device=device)  # the op's output buffer
        self.attention = attention_op or attention
        self.on_compute: Callable[[], None] | None = None
        # The compiled graph once vLLM's backend has split and wrapped it; None runs eagerly.
        self.graph: Callable[[torch.Tensor], torch.Tensor] | None = None

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
        """Called as the runner calls a model (``input_ids``, ``positions``, ``intermediate_tensors``,
        ``inputs_embeds``); only ``input_ids`` is read."""
        if self.graph is not None:
            return self.graph(input_ids)
        return self.eager(input_ids)

    def _computed(self) -> None:
        if self.on_compute is not None:
            self.on_compute()

    def pre_attention(self, x: torch.Tensor) -> torch.Tensor:
        self._computed()
        return x @ self.weight + 1

    def attend(self, h: torch.Tensor) -> torch.Tensor:
        out = self.attn_output[: h.shape[0]]
        self.attention(h, out)
        return out

    def post_attention(self, a: torch.Tensor) -> torch.Tensor:
        self._computed()
        return a * 2

    def eager(self, x: torch.Tensor) -> torch.Tensor:
        return self.post_attention(self.attend(self.pre_attention(x)))

    def split(self, at_attention: bool) -> list[tuple[Callable, bool]]:
        """The pieces ``split_graph`` makes of this forward, as ``(piece, is_splitting_op)``: three
        when attention is a splitting op, else the whole forward as one piece."""
        if at_attention:
            return [(self.pre_attention, False), (self.attend, True), (self.post_attention, False)]
        return [(self.eager, False)]
