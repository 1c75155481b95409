"""The package's layers (docs/architecture.md), as import-linter checks them (``[tool.importlinter]``
in pyproject.toml): the core imports no runner family, the families import neither each other nor
anything above them, and commands, reports and evidence reach a runner only through
``contract.families``. The check must fail on a deliberately added core -> family import. No module
imports itself through others, lazily or not (grimp's graph of every import statement)."""

from __future__ import annotations

import json
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


CIRCLES = """
import json, grimp, networkx as nx
graph = grimp.build_graph("contract", cache_dir=None)
edges = [(m, i) for m in graph.modules for i in graph.find_modules_directly_imported_by(m)]
print(json.dumps(sorted(sorted(c) for c in nx.strongly_connected_components(nx.DiGraph(edges)) if len(c) > 1)))
"""


def circles(package_root: Path) -> list[list[str]]:
    """The import circles among the package's modules (grimp, import-linter's graph builder, in a child
    so that the package it reads is ``package_root``'s): every import statement counts, the ones inside
    functions too, so a lazy import cannot hide a circle."""
    done = subprocess.run([sys.executable, "-c", CIRCLES], cwd=package_root, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(package_root)}, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_no_module_imports_itself_through_others():
    assert circles(ROOT) == []


def test_a_circle_through_a_lazy_import_is_found(tmp_path):
    shutil.copytree(ROOT / "contract", tmp_path / "contract", ignore=shutil.ignore_patterns("__pycache__"))
    simcuda = tmp_path / "contract" / "real" / "simcuda.py"
    simcuda.write_text(simcuda.read_text() + "\n\ndef _lazy():\n    from contract.real import device  # noqa: F401\n")
    assert ["contract.real.device", "contract.real.simcuda"] in circles(tmp_path)
