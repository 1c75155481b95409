"""Mirrors of vLLM's mode enums.

``CUDAGraphMode`` follows ``config/compilation.py:53-110`` of vLLM 0.33.0 member for member and
method for method, including the int-tuple values of the two separate-routine members (inside the
class body ``FULL``/``NONE``/``PIECEWISE`` are still plain ints when the tuples are built).
"""

from __future__ import annotations

import enum


class CUDAGraphMode(enum.Enum):
    """``config/compilation.py:53-110``."""

    NONE = 0
    PIECEWISE = 1
    FULL = 2
    FULL_DECODE_ONLY = (FULL, NONE)
    FULL_AND_PIECEWISE = (FULL, PIECEWISE)

    def decode_mode(self) -> CUDAGraphMode:
        """``:65-66``."""
        return CUDAGraphMode(self.value[0]) if self.separate_routine() else self

    def mixed_mode(self) -> CUDAGraphMode:
        """``:68-69``."""
        return CUDAGraphMode(self.value[1]) if self.separate_routine() else self

    def has_mode(self, mode: CUDAGraphMode) -> bool:
        """``:71-75``; like vLLM, asserts that ``mode`` is a runtime mode."""
        if mode.separate_routine():
            raise AssertionError()
        if self.separate_routine():
            return mode.value in self.value
        return self == mode

    def requires_piecewise_compilation(self) -> bool:
        """``:77-78``."""
        return self.has_mode(CUDAGraphMode.PIECEWISE)

    def without_piecewise(self) -> CUDAGraphMode:
        """``:80-85`` (absent before vLLM 0.30.0)."""
        if self == CUDAGraphMode.PIECEWISE:
            return CUDAGraphMode.NONE
        if self == CUDAGraphMode.FULL_AND_PIECEWISE:
            return CUDAGraphMode.FULL_DECODE_ONLY
        return self

    def max_cudagraph_mode(self) -> CUDAGraphMode:
        """``:87-88``."""
        return CUDAGraphMode(max(self.value)) if self.separate_routine() else self

    def has_full_cudagraphs(self) -> bool:
        """``:90-91``."""
        return self.max_cudagraph_mode() == CUDAGraphMode.FULL

    def has_piecewise_cudagraphs(self) -> bool:
        """``:93-94``."""
        return self.requires_piecewise_compilation()

    def separate_routine(self) -> bool:
        """``:96-97``."""
        return isinstance(self.value, tuple)

    @classmethod
    def valid_runtime_modes(cls) -> frozenset[CUDAGraphMode]:
        """``:99-101``."""
        return frozenset({cls.NONE, cls.PIECEWISE, cls.FULL})

    def is_valid_runtime_mode(self) -> bool:
        """``:103-104``."""
        return self in CUDAGraphMode.valid_runtime_modes()

    def __str__(self) -> str:
        return self.name

    def __bool__(self) -> bool:
        return self != CUDAGraphMode.NONE

    def __lt__(self, other: CUDAGraphMode) -> bool:
        # Only for sorting in reports; vLLM defines no order on modes.
        return _ORDER.index(self) < _ORDER.index(other)


_ORDER = list(CUDAGraphMode)

NONE = CUDAGraphMode.NONE
PIECEWISE = CUDAGraphMode.PIECEWISE
FULL = CUDAGraphMode.FULL
FULL_DECODE_ONLY = CUDAGraphMode.FULL_DECODE_ONLY
FULL_AND_PIECEWISE = CUDAGraphMode.FULL_AND_PIECEWISE


class AttentionCGSupport(enum.Enum):
    """``v1/attention/backend.py:557-568``; ordered by ``value`` as vLLM compares them."""

    ALWAYS = 3
    UNIFORM_BATCH = 2
    UNIFORM_SINGLE_TOKEN_DECODE = 1
    NEVER = 0


class CompilationMode(enum.IntEnum):
    """``config/compilation.py`` ``CompilationMode``; the two values the contract depends on.

    ``STOCK_TORCH_COMPILE`` makes MRV1 ``load_model`` return before any wrapping
    (``v1/worker/gpu_model_runner.py:5113-5123``); it is outside the modelled scenario space.
    """

    NONE = 0
    VLLM_COMPILE = 3


def parse_enum(enum_cls: type[enum.Enum], name: str) -> enum.Enum:
    """``CUDAGraphMode[value.upper()]`` as in ``config/compilation.py:873-879``, with an error
    that lists the accepted names."""
    try:
        return enum_cls[str(name).upper()]
    except KeyError:
        names = ", ".join(m.name for m in enum_cls)
        raise ValueError(f"unknown {enum_cls.__name__} {name!r}; expected one of: {names}") from None
