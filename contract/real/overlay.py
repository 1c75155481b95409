"""A vLLM source tree run on an installed release: the tree's Python modules replace the release's
where they differ, everything else (compiled extensions, unchanged modules) is the release's.

``conform --vllm-src PATH --base 0.30.0`` replays the corpus twice in ``.venv-vllm-0.30.0``: once
as installed, once with this finder on ``sys.meta_path``, so a branch's edit to resolve, the
dispatcher, the wrappers or ``load_model`` runs as vLLM's own code. A module is taken from the tree
only when its bytes differ from the installed file, so an unedited copy replays the release exactly.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from pathlib import Path

ENV = "CONTRACT_VLLM_SRC"


class TreeFinder(importlib.abc.MetaPathFinder):
    def __init__(self, tree_pkg: Path, installed_pkg: Path):
        self.tree, self.installed = tree_pkg, installed_pkg
        self.taken: list[str] = []  # modules loaded from the tree, for the run's report

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith("vllm."):
            return None
        parts = fullname.split(".")[1:]
        candidate = self.tree.joinpath(*parts).with_suffix(".py")
        if not candidate.is_file():
            return None
        installed = self.installed.joinpath(*parts).with_suffix(".py")
        if installed.is_file() and installed.read_bytes() == candidate.read_bytes():
            return None
        self.taken.append(fullname)
        return importlib.util.spec_from_file_location(fullname, candidate)


def install(tree_pkg: Path) -> TreeFinder:
    """Put the differing modules of the tree's ``vllm/`` package ahead of the installed release
    (before vLLM is imported)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("vLLM is not installed in this environment")
    sys.dont_write_bytecode = True  # the tree is the person's: it gets no __pycache__ of ours
    finder = TreeFinder(Path(tree_pkg), Path(list(spec.submodule_search_locations)[0]))
    sys.meta_path.insert(0, finder)
    return finder
