"""Hypothesis profiles: ``ci`` (deterministic, no database; kills every killable mutant,
``tests/test_mutants.py``), ``dev`` (default, quick) and ``thorough`` (nightly). ``ci`` draws no
example of some built-in policies' failing properties (the MRV1 policies' P7, ``pr56312_draft``'s
P4): ``verify`` and ``report`` take those verdicts from the explorer (``core.verify.with_explorer``)."""

from __future__ import annotations

from hypothesis import HealthCheck, Phase, Verbosity, settings

_COMMON = dict(
    deadline=None,
    # Phase.explain re-runs every shrunk example many times to annotate source lines, which our
    # reports never show; it costs more than everything else together.
    phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
    print_blob=False,
    report_multiple_bugs=False,
    verbosity=Verbosity.quiet,
)

# Hypothesis's own ``default`` profile is the parent, not whichever profile is loaded: under a CI
# environment variable Hypothesis loads its built-in ``ci`` profile (derandomised), which would
# otherwise turn ``dev`` and ``thorough`` into fixed streams on CI machines only.
_PARENT = settings.get_profile("default")

PROFILES = {
    "ci": settings(_PARENT, derandomize=True, database=None, max_examples=500, stateful_step_count=6, **_COMMON),
    "dev": settings(_PARENT, max_examples=150, stateful_step_count=12, database=None, **_COMMON),
    "thorough": settings(_PARENT, max_examples=5000, stateful_step_count=25, database=None, **_COMMON),
}


def register() -> None:
    for name, s in PROFILES.items():
        settings.register_profile(name, s)


def get(name: str) -> settings:
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r}; expected one of: {', '.join(PROFILES)}")
    return PROFILES[name]
