"""CUDAGraphMode against the truth table of spec §1 (config/compilation.py:53-110 in vLLM 0.33.0)."""

import pytest

from contract.core.modes import CUDAGraphMode, parse_enum

N, P, F = CUDAGraphMode.NONE, CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL
FDO, FAP = CUDAGraphMode.FULL_DECODE_ONLY, CUDAGraphMode.FULL_AND_PIECEWISE

# self: separate_routine, decode, mixed, max, has(N), has(P), has(F), has_piecewise, has_full,
#       without_piecewise, is_valid_runtime_mode, bool, value
TABLE = {
    N: (False, N, N, N, True, False, False, False, False, N, True, False, 0),
    P: (False, P, P, P, False, True, False, True, False, N, True, True, 1),
    F: (False, F, F, F, False, False, True, False, True, F, True, True, 2),
    FDO: (True, F, N, F, True, False, True, False, True, FDO, False, True, (2, 0)),
    FAP: (True, F, P, F, False, True, True, True, True, FDO, False, True, (2, 1)),
}


@pytest.mark.parametrize("mode", list(CUDAGraphMode))
def test_truth_table(mode):
    row = (
        mode.separate_routine(), mode.decode_mode(), mode.mixed_mode(), mode.max_cudagraph_mode(),
        mode.has_mode(N), mode.has_mode(P), mode.has_mode(F),
        mode.has_piecewise_cudagraphs(), mode.has_full_cudagraphs(), mode.without_piecewise(),
        mode.is_valid_runtime_mode(), bool(mode), mode.value,
    )
    assert row == TABLE[mode]
    assert mode.requires_piecewise_compilation() == mode.has_piecewise_cudagraphs()


@pytest.mark.parametrize("receiver", list(CUDAGraphMode))
@pytest.mark.parametrize("arg", [FDO, FAP])
def test_has_mode_asserts_on_separate_routine_argument(receiver, arg):
    with pytest.raises(AssertionError):
        receiver.has_mode(arg)


def test_parse_is_case_insensitive_and_names_the_choices():
    assert parse_enum(CUDAGraphMode, "full_and_piecewise") is FAP
    with pytest.raises(ValueError, match="FULL_DECODE_ONLY"):
        parse_enum(CUDAGraphMode, "FULL_PIECEWISE")
