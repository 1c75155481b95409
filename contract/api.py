"""Everything a policy file needs: ``from contract.api import *``."""

from contract.modes import (
    FULL,
    FULL_AND_PIECEWISE,
    FULL_DECODE_ONLY,
    NONE,
    PIECEWISE,
    AttentionCGSupport,
    CompilationMode,
    CUDAGraphMode,
)
from contract.policy import LoadContext
from contract.scenario import ConfigRevision, Runner
from contract.stack import BreakableCUDAGraphWrapper, CUDAGraphWrapper, RawModel, Stacks, UBatchWrapper

__all__ = [
    "FULL",
    "FULL_AND_PIECEWISE",
    "FULL_DECODE_ONLY",
    "NONE",
    "PIECEWISE",
    "AttentionCGSupport",
    "BreakableCUDAGraphWrapper",
    "CompilationMode",
    "ConfigRevision",
    "CUDAGraphMode",
    "CUDAGraphWrapper",
    "LoadContext",
    "RawModel",
    "Runner",
    "Stacks",
    "UBatchWrapper",
]
