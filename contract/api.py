"""Everything a policy file needs: ``from contract.api import *``."""

from contract.core.modes import FULL, FULL_AND_PIECEWISE, FULL_DECODE_ONLY, NONE, PIECEWISE, AttentionCGSupport, CompilationMode, CUDAGraphMode
from contract.runners.mrv1.model.wrappers import LoadContext
from contract.core.scenario import ConfigRevision, Runner
from contract.runners.mrv1.model.wrappers import BreakableCUDAGraphWrapper, CUDAGraphWrapper, RawModel, Stacks, UBatchWrapper

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
