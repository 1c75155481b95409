"""A vLLM source tree (``--vllm-src``): its ``vllm/`` package, the runner families it has, and its
rules read as a policy by the family the person chose."""

from __future__ import annotations

from pathlib import Path

from contract.core.family import Family
from contract.core.policy import Branch, BranchError
from contract.families import FAMILIES, by_name


def package_dir(path: Path) -> Path:
    """The ``vllm/`` package of a source tree, or ``path`` itself when it is that package."""
    try:
        return _package_dir(Path(path))
    except OSError as exc:  # a name too long, a loop of links
        raise BranchError(f"--vllm-src {path} cannot be read: {exc.strerror or exc}") from None


def _package_dir(path: Path) -> Path:
    if not path.exists():
        raise BranchError(f"--vllm-src {path} does not exist; pass a vLLM source tree")
    if not path.is_dir():
        raise BranchError(f"--vllm-src {path} is a file; pass a vLLM source tree (the folder holding vllm/)")
    for family in FAMILIES:
        for marker in family.markers:
            for pkg in (path / "vllm", path):
                if (pkg / marker).is_file():
                    return pkg
    # vllm/v1/ marks the V1 engine's package (every release since 0.8), with or without a runner.
    if not any((pkg / "__init__.py").is_file() and (pkg / "v1").is_dir() for pkg in (path / "vllm", path)):
        raise BranchError(f"--vllm-src {path} is not a vLLM source tree: neither it nor {path / 'vllm'} is "
                          "vLLM's package (vllm/__init__.py and vllm/v1/); pass the folder of a vLLM checkout")
    markers = " and no ".join(f"vllm/{m}" for f in FAMILIES for m in f.markers)
    raise BranchError(f"{path} is neither Model Runner V1 nor V2: no {markers}; "
                      "point --vllm-src at a vLLM source tree")


def families_in(pkg: Path) -> list[Family]:
    """The runner families whose marker files the tree holds, oldest runner first."""
    return [f for f in FAMILIES if any((pkg / m).is_file() for m in f.markers)]


def family_for(pkg: Path, runner: str = "auto") -> Family:
    """``auto``: the oldest runner the tree has (its MRV1 where it still has one, as the release's
    policy table does); ``mrv1``/``mrv2``: that runner, or one line naming what the tree has."""
    present = families_in(pkg)
    if runner == "auto":
        return present[0]
    family = by_name(runner)
    if family not in present:
        has = " and ".join(f.title for f in present)
        raise BranchError(f"--runner {runner}: the tree {pkg.parent} has no {family.title} (it has {has}); "
                          f"pass --runner {present[0].name}")
    return family


def load(path: str | Path, *, runner: str = "auto", as_policy: bool = False) -> Branch:
    """The tree's rules as a policy of the chosen family; ``as_policy`` runs a known revision's
    rules too instead of mapping them to the built-in policy."""
    given = Path(path)
    pkg = package_dir(given)
    return family_for(pkg, runner).read_tree(pkg, given, as_policy=as_policy)
