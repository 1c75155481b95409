"""Registers the Hypothesis profiles for `pytest --hypothesis-profile=ci|dev|thorough`. Tests that
assert what the `ci` profile finds (verdicts, mutant kills, reports) use it explicitly."""

from __future__ import annotations

from hypothesis import settings

from contract.core import profiles

profiles.register()
settings.load_profile("dev")


def pytest_terminal_summary(terminalreporter):
    """What a test measured and said (``record_property("said", ...)``), printed at the end of the run,
    from the workers too."""
    said = [value for report in terminalreporter.stats.get("passed", [])
            for key, value in getattr(report, "user_properties", ()) if key == "said"]
    if said:
        terminalreporter.section("measured")
        for line in said:
            terminalreporter.write_line(line)
