"""The truth table of a ``CUDAGraphMode`` class: every member and every method's answer.

``python -m contract.real.modes_table`` prints vLLM's table and the model's as JSON, so a
test can compare them member by member (``config/compilation.py:53-110`` in 0.30.0). A method the
class does not have answers ``"<absent>"``; an assertion answers ``"AssertionError"``.
"""

from __future__ import annotations

import json

METHODS = ("separate_routine", "decode_mode", "mixed_mode", "max_cudagraph_mode", "requires_piecewise_compilation",
           "has_piecewise_cudagraphs", "has_full_cudagraphs", "without_piecewise", "is_valid_runtime_mode")


def table(mode_cls) -> dict:
    def answer(fn, *args):
        try:
            value = fn(*args)
        except AssertionError:
            return "AssertionError"
        return value.name if isinstance(value, mode_cls) else value

    out: dict = {"members": {m.name: json.loads(json.dumps(m.value)) for m in mode_cls}}
    out["valid_runtime_modes"] = sorted(m.name for m in mode_cls.valid_runtime_modes())
    for m in mode_cls:
        row = {}
        for name in METHODS:
            fn = getattr(m, name, None)
            row[name] = "<absent>" if fn is None else answer(fn)
        for other in mode_cls:
            row[f"has_mode({other.name})"] = answer(m.has_mode, other)
        row["str"] = str(m)
        row["bool"] = bool(m)
        out[m.name] = row
    return out


def attention_support(support_cls) -> dict:
    return {m.name: m.value for m in support_cls}


def main() -> None:
    from vllm.config import CUDAGraphMode
    from vllm.v1.attention.backend import AttentionCGSupport

    from contract.core import modes

    print(json.dumps({
        "vllm": {"CUDAGraphMode": table(CUDAGraphMode), "AttentionCGSupport": attention_support(AttentionCGSupport)},
        "model": {"CUDAGraphMode": table(modes.CUDAGraphMode),
                  "AttentionCGSupport": attention_support(modes.AttentionCGSupport)},
    }))


if __name__ == "__main__":
    main()
