"""The package's layers (docs/architecture.md), as import-linter checks them (``[tool.importlinter]``
in pyproject.toml): the core imports no runner family, the families import neither each other nor
anything above them, and commands, reports and evidence reach a runner only through
``contract.families``. The check must fail on a deliberately added core -> family import."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")


def lint(cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT), "--no-cache"], cwd=cwd, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(cwd)}, timeout=300)


def test_the_layers_hold():
    done = lint(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 kept, 0 broken" in done.stdout


def test_a_core_module_importing_a_family_breaks_them(tmp_path):
    shutil.copytree(ROOT / "contract", tmp_path / "contract", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    explore = tmp_path / "contract" / "core" / "explore.py"
    explore.write_text(explore.read_text() + "\nfrom contract.runners.mrv1.model import space  # noqa: E402\n")
    done = lint(tmp_path)
    assert done.returncode != 0, done.stdout
    assert "contract.core is not allowed to import contract.runners" in done.stdout
    assert "contract.core.explore -> contract.runners.mrv1.model.space" in done.stdout
