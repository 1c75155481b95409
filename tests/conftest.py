"""Registers the Hypothesis profiles for `pytest --hypothesis-profile=ci|dev|thorough`. Tests that
assert what the `ci` profile finds (verdicts, mutant kills, reports) use it explicitly."""

from __future__ import annotations

from hypothesis import settings

from contract.core import profiles

profiles.register()
settings.load_profile("dev")
