"""A command run as an unprivileged user, where a check needs one: root passes every permission
check, so as root the command runs as nobody."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

NOBODY = 65534


def unprivileged() -> dict:
    """``subprocess.run``'s arguments that run a command as nobody when the tests run as root (none
    otherwise). Where nobody cannot start the tests' interpreter with this project (a checkout, or a
    virtual environment, under a folder only its owner may enter, as ``mktemp -d`` makes), the
    check is skipped, saying so, rather than failing on a permission the tool does not decide."""
    if os.getuid() != 0:
        return {}
    as_nobody = {"user": NOBODY, "group": NOBODY, "extra_groups": []}
    try:
        subprocess.run([sys.executable, "-c", "import contract"], cwd="/", capture_output=True, check=True,
                       timeout=120, **as_nobody)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"as root this check runs as nobody, who cannot start {sys.executable} with this project "
                    f"({exc}): let others enter the checkout's folders (chmod o+x) to run it")
    return as_nobody
