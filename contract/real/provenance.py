"""Which files vLLM's code ran from, checked against the release's own record of its files.

A release environment holds the wheel's ``vllm-<version>.dist-info/RECORD``: the path and sha256 of
every file the wheel installed. Before a replay of the release, the parent checks that the installed
``vllm/`` Python files still match it (an edited environment is no release); the replay's child
lists every ``vllm`` module it imported and the file it came from (``loaded``); after the run the
parent checks each of those files: on the base side it must be the release's own, unedited, and on
a branch side the release's or the tree's, the tree's only where the tree's file differs. A caller's
``PYTHONPATH``, a ``.pth`` file or a stray ``vllm`` folder that put other code in its place is then
a one-line refusal, never a verdict on the wrong code.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import sys
from pathlib import Path


class ProvenanceProblem(Exception):
    """vLLM's code did not come from where the run says; one line."""


def loaded() -> list[list[str]]:
    """In a replay's child: ``[module, file]`` of every imported module of the ``vllm`` package."""
    out = []
    for name, module in sorted(sys.modules.items()):
        if (name == "vllm" or name.startswith("vllm.")) and isinstance(getattr(module, "__file__", None), str):
            out.append([name, module.__file__])
    return out


def _record_file(pkg: Path) -> Path | None:
    found = sorted(pkg.parent.glob("vllm-*.dist-info/RECORD"))
    return found[0] if len(found) == 1 else None


def record(pkg: Path) -> dict[str, str]:
    """The release's files under ``pkg`` (an installed ``vllm/``), by path relative to its
    site-packages, with their urlsafe-base64 sha256 as RECORD writes it; empty without a RECORD."""
    path = _record_file(pkg)
    if path is None:
        return {}
    out = {}
    with open(path, newline="", encoding="utf-8") as f:
        for row in csv.reader(f):
            if len(row) >= 2 and row[1].startswith("sha256="):
                out[row[0]] = row[1][len("sha256="):]
    return out


def digest(pkg: Path) -> str:
    """A digest of what the release says it installed (its RECORD), for cache keys."""
    path = _record_file(pkg)
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16] if path is not None else "no-record"


def _sha(path: Path) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(path.read_bytes()).digest()).rstrip(b"=").decode()


def check_installed(pkg: Path, version: str) -> None:
    """The installed release's Python files are the ones its wheel installed."""
    recorded = record(pkg)
    if not recorded:
        raise ProvenanceProblem(f"vLLM {version} at {pkg} has no RECORD of its files; remake its environment "
                                f"(cudagraph-contract env make {version})")
    site = pkg.parent
    for rel, want in recorded.items():
        if not rel.endswith(".py"):
            continue  # compiled extensions: hundreds of MiB, and never what a change under review edits
        path = site / rel
        try:
            same = _sha(path) == want
        except OSError:
            same = False
        if not same:
            raise ProvenanceProblem(f"vLLM {version}'s environment was edited: {path} is not the file its wheel "
                                    f"installed; remake it (cudagraph-contract env make {version})")


def check_child(data: dict, pkg: Path, version: str, tree: Path | None) -> None:
    """A replay child's answer (``contract/branch/observe.py``) was given by the release asked for,
    says what of the tree it ran (``reached``, ``tree_modules``) and ran vLLM's code only from the
    release's files and the tree's (``check_loaded``)."""
    if data.get("vllm") != version:
        raise ProvenanceProblem(f"ran vLLM {data.get('vllm')!r}, not {version}")
    if not isinstance(data.get("reached"), list) or not isinstance(data.get("tree_modules"), list):
        raise ProvenanceProblem("did not say what of the tree it ran")
    check_loaded(data.get("modules"), pkg, version, tree, data["tree_modules"])


def check_loaded(modules: object, pkg: Path, version: str, tree: Path | None = None,
                 taken: list[str] = ()) -> None:
    """Every module the child listed came from the release at ``pkg`` unedited or, for a branch run,
    from ``tree`` (a ``vllm/`` package) where the child says it took the tree's (``taken``)."""
    if not isinstance(modules, list) or not modules:
        raise ProvenanceProblem("the replay did not say which files vLLM's code ran from")
    recorded, site = record(pkg), pkg.parent.resolve()
    taken = set(taken)
    for entry in modules:
        if not (isinstance(entry, list) and len(entry) == 2 and all(isinstance(x, str) for x in entry)):
            raise ProvenanceProblem("the replay listed its modules in a form it should not")
        name, file = entry
        path = Path(file).resolve()
        if tree is not None and name in taken and path.is_relative_to(tree.resolve()):
            continue
        if not path.is_relative_to(site):
            where = f"the tree {tree}" if tree is not None else f"vLLM {version}'s environment"
            raise ProvenanceProblem(f"{name} ran from {path}, not from {where} (a PYTHONPATH, .pth file or "
                                    "vllm folder put it first?)")
        rel = path.relative_to(site).as_posix()
        try:
            same = rel in recorded and (not rel.endswith(".py") or _sha(path) == recorded[rel])
        except OSError:
            same = False
        if not same:
            raise ProvenanceProblem(f"{name} ran from {path}, which is not the file vLLM {version}'s wheel installed")
