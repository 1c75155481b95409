"""Registers the Hypothesis profiles: `pytest --hypothesis-profile=ci` runs the verifier's own
machines with the `ci` settings too."""

from __future__ import annotations

import pytest
from hypothesis import settings

from contract import profiles

profiles.register()
settings.load_profile("dev")


@pytest.fixture(scope="session")
def active_settings(request):
    """The profile pytest was started with (``--hypothesis-profile``), for the runs we drive ourselves."""
    name = request.config.getoption("--hypothesis-profile", default=None) or "dev"
    return profiles.get(name)
