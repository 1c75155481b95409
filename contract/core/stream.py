"""Hypothesis's example stream as a function of the settings and the seed alone.

Besides the seed, Hypothesis (6.131 and later) feeds its integer draws with constants it mines from
every *local* module the process has imported (``internal/conjecture/providers.py``,
``_get_local_constants``): the tool's own modules when installed editable, the test modules pytest
collected, a user's policy file. The same seed then draws different scenarios depending on which
modules happened to be imported and on where the package is installed, and the reports' coverage
counts change with them. ``pinned_stream`` empties that pool for the duration of a run, so a seed
replays the same examples in a CLI process, an xdist worker or a test run alone.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager

from hypothesis.internal.conjecture import providers

#: The seed of a derandomised (``ci``) run when none is given: reports, verdict tests and
#: ``verify --profile ci`` all draw the same stream.
CI_SEED = 0


def _empty_constants():
    return providers.Constants()


@contextmanager
def pinned_stream() -> Iterator[None]:
    """Run Hypothesis without the constants of the modules this process imported.

    A Hypothesis without the mining hook has nothing to pin; the cache of permitted constants is
    cleared on entry and exit, since it holds the pool of whichever run filled it.
    """
    mined = getattr(providers, "_get_local_constants", None)
    cache = getattr(providers, "CONSTANTS_CACHE", None)
    if mined is None or not hasattr(providers, "Constants"):
        yield
        return
    providers._get_local_constants = _empty_constants
    if cache is not None:
        cache.cache.clear()
    try:
        yield
    finally:
        providers._get_local_constants = mined
        if cache is not None:
            cache.cache.clear()


def run_seed(settings, seed: int | None) -> int:
    """The one seed of a whole run: ``seed_for``'s, else one drawn now, which every Hypothesis run
    inside it reuses (the re-runs after a property is found, every policy) and the run reports, so
    the run replays with ``--seed``."""
    found = seed_for(settings, seed)
    return found if found is not None else secrets.randbelow(1 << 32)


def seed_for(settings, seed: int | None) -> int | None:
    """The seed a run uses: the one given, else ``CI_SEED`` for a derandomised profile (an explicit
    seed instead of Hypothesis's digest of its own state-machine runner, which changes with the
    Hypothesis release), else None (a fresh random stream)."""
    if seed is not None:
        return seed
    return CI_SEED if settings.derandomize else None
