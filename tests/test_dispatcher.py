"""The dispatcher model against the outcomes vLLM's own tests/v1/cudagraph/test_cudagraph_dispatch.py
asserts (spec §13), on this project's capture sizes (2, 4), max_num_seqs 4."""

import pytest

from contract.core.forward_context import BatchDescriptor as BD
from contract.runners.mrv1.model.cudagraph_dispatcher import DispatcherState, dispatch, drafter_cudagraph_mode, get_capture_descs, initialize_cudagraph_keys
from contract.core.modes import CUDAGraphMode

N, P, F = CUDAGraphMode.NONE, CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL
FDO, FAP = CUDAGraphMode.FULL_DECODE_ONLY, CUDAGraphMode.FULL_AND_PIECEWISE
SIZES = (2, 4)


def keyed(mode, q=1):
    return initialize_cudagraph_keys(DispatcherState(q), mode, SIZES, q)


@pytest.mark.parametrize("mode,count", [(N, 0), (P, 2), (F, 2), (FDO, 2), (FAP, 4)])
def test_key_counts(mode, count):
    assert len(keyed(mode).keys) == count


@pytest.mark.parametrize(
    "mode,uniform,want",
    [
        (F, False, (F, BD(4, 4))),
        (FAP, False, (P, BD(4))),
        (P, False, (P, BD(4))),
        (FDO, False, (N, BD(3))),
        (F, True, (F, BD(4, 4))),  # FULL ignores uniform_decode (not a separate routine)
        (FDO, True, (F, BD(4, 4, True))),
        (FAP, True, (F, BD(4, 4, True))),
        (P, True, (P, BD(4))),
        (N, True, (N, BD(3))),
    ],
)
def test_dispatch_pads_and_picks_the_mode(mode, uniform, want):
    assert dispatch(keyed(mode), 3, uniform) == want


def test_above_largest_capture_size_is_eager_and_unpadded():
    assert dispatch(keyed(FAP), 5) == (N, BD(5))


def test_uninitialised_keys_dispatch_none():
    assert dispatch(DispatcherState(1), 2) == (N, BD(2))


def test_invalid_and_valid_modes():
    assert dispatch(keyed(FAP), 2, True, invalid_modes={F}) == (P, BD(2))
    assert dispatch(keyed(FDO), 2, True, invalid_modes={F}) == (N, BD(2))
    assert dispatch(keyed(FAP), 2, True, valid_modes={N}) == (N, BD(2))


def test_uniform_decode_keys_respect_query_length():
    d = keyed(FAP, q=2)
    assert (F, BD(2, 1, True)) in d.keys and (F, BD(4, 2, True)) in d.keys
    assert dispatch(d, 2, True) == (F, BD(2, 1, True))


def test_capture_descs_piecewise_first_largest_first():
    assert get_capture_descs(keyed(FAP)) == [(P, [BD(4), BD(2)]), (F, [BD(4, 4, True), BD(2, 2, True)])]


def test_keys_accumulate_across_initialisations():
    d = initialize_cudagraph_keys(keyed(P), F, SIZES)
    assert {m for m, _ in d.keys} == {P, F}


@pytest.mark.parametrize("target,eager,want", [(N, False, N), (P, False, P), (F, False, P), (FDO, False, N),
                                               (FAP, False, P), (FAP, True, N)])
def test_drafter_mode_mapping(target, eager, want):
    assert drafter_cudagraph_mode(target, eager) == want
