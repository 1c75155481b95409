"""The built-in policies' explorations, each made once per worker: the modules reading them share
the ``explored`` xdist group (``pytestmark = explored.GROUP``), so a run explores each policy once."""

from __future__ import annotations

from functools import lru_cache

import pytest

from contract.core.explore import Exploration, explore
from contract.families import load_policy

GROUP = pytest.mark.xdist_group("explored")


@lru_cache(maxsize=None)
def explored(name: str) -> Exploration:
    """``name``'s exploration at the default depth, with its violation classes. Shared: read it,
    never change it."""
    return explore(load_policy(name), classify=True)
