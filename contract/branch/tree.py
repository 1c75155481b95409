"""A vLLM source tree (``--vllm-src``): its ``vllm/`` package, the runner families it has, and its
rules read as a policy by the family the person chose."""

from __future__ import annotations

from pathlib import Path

from contract.branch.diff import count_differing
from contract.core.family import Family
from contract.core.policy import Branch, BranchError
from contract.families import FAMILIES, KNOWN_RELEASES, by_name, for_release
from contract.real.installed import EnvironmentProblem, installed_releases, release, source_version


def package_dir(path: Path, option: str = "--vllm-src") -> Path:
    """The ``vllm/`` package of a source tree, or ``path`` itself when it is that package."""
    try:
        return _package_dir(Path(path), option)
    except OSError as exc:  # a name too long, a loop of links
        raise BranchError(f"{option} {path} cannot be read: {exc.strerror or exc}") from None


def _package_dir(path: Path, option: str) -> Path:
    if not path.exists():
        raise BranchError(f"{option} {path} does not exist; pass a vLLM source tree")
    if not path.is_dir():
        raise BranchError(f"{option} {path} is a file; pass a vLLM source tree (the folder holding vllm/)")
    for family in FAMILIES:
        for marker in family.markers:
            for pkg in (path / "vllm", path):
                if (pkg / marker).exists():
                    _regular_files(pkg, family, option)
                    return pkg
    # vllm/v1/ marks the V1 engine's package (every release since 0.8), with or without a runner.
    if not any((pkg / "__init__.py").is_file() and (pkg / "v1").is_dir() for pkg in (path / "vllm", path)):
        raise BranchError(f"{option} {path} is not a vLLM source tree: neither it nor {path / 'vllm'} is "
                          "vLLM's package (vllm/__init__.py and vllm/v1/); pass the folder of a vLLM checkout")
    markers = " and no ".join(f"vllm/{m}" for f in FAMILIES for m in f.markers)
    raise BranchError(f"{path} is neither Model Runner V1 nor V2: no {markers}; "
                      f"point {option} at a vLLM source tree")


def _regular_files(pkg: Path, family: Family, option: str) -> None:
    """The files a family reads are regular files (a FIFO, a device or a folder in their place would
    block or mislead the reader)."""
    for rel in (*family.markers, *(path for path, _ in family.reads)):
        path = pkg / rel
        if path.exists() and not path.is_file():
            raise BranchError(f"{option}: vllm/{rel} in {pkg.parent} is not a regular file; pass a vLLM source tree")


def version(pkg: Path) -> str | None:
    """The version the tree declares (``contract.real.installed.source_version``)."""
    return source_version(pkg)


def version_note(pkg: Path) -> str:
    """A plain note when the tree declares a version outside the releases the tool models."""
    declared = version(pkg)
    if declared is None:
        return ""
    try:
        found = release(declared)
    except EnvironmentProblem:
        return f"note: the tree declares version {declared!r}, which is not a vLLM release number"
    first, last = release(KNOWN_RELEASES[0]), release(KNOWN_RELEASES[-1])
    if found < first:
        return (f"note: the tree is vLLM {declared}, older than the releases this tool models "
                f"({KNOWN_RELEASES[0]} to {KNOWN_RELEASES[-1]}); its rules are read as the oldest")
    if found > last:
        return (f"note: the tree is vLLM {declared}, newer than the releases this tool models "
                f"({KNOWN_RELEASES[0]} to {KNOWN_RELEASES[-1]}); its rules are read as the newest")
    return ""


def families_in(pkg: Path) -> list[Family]:
    """The runner families whose marker files the tree holds, oldest runner first."""
    return [f for f in FAMILIES if any((pkg / m).is_file() for m in f.markers)]


def family_for(pkg: Path, runner: str = "auto") -> Family:
    """``mrv1``/``mrv2``: that runner, or one line naming what the tree has. ``auto``: the runner the
    tree has; where it has both (0.30 to 0.33), vLLM's default for its release (Model Runner V2 from
    0.33), the release read from its ``vllm/_version.py`` or, without one (a git checkout), taken as
    the installed release whose files differ least from the tree's; else the newer runner."""
    present = families_in(pkg)
    if runner == "auto":
        if len(present) == 1:
            return present[0]
        markers = [m for f in present for m in f.markers]
        version = source_version(pkg) or nearest(distances(pkg, lambda _: markers))
        if version is not None:
            try:
                family = for_release(version)
            except EnvironmentProblem:
                family = None
            if family in present:
                return family
        return present[-1]
    family = by_name(runner)
    if family not in present:
        has = " and ".join(f.title for f in present)
        raise BranchError(f"--runner {runner}: the tree {pkg.parent} has no {family.title} (it has {has}); "
                          f"pass --runner {present[0].name}")
    return family


def distances(pkg: Path, paths_of, versions=None) -> list[tuple[str, int, int]]:
    """(version, files differing, files compared) for each installed release (of ``versions``, when
    given): ``paths_of(release_pkg)`` names the files under ``vllm/`` to compare."""
    out = []
    for v, release_pkg in installed_releases():
        if versions is None or v in versions:
            paths = tuple(paths_of(release_pkg))
            out.append((v, count_differing(pkg, release_pkg, paths), len(paths)))
    return out


def nearest(scored: list[tuple[str, int, int]], prefer: str | None = None) -> str | None:
    """The release with the fewest differing files; ``prefer`` (the tree's declared version) among
    equals, else the newest."""
    if not scored:
        return None
    best = min(n for _, n, _ in scored)
    tied = [v for v, n, _ in scored if n == best]
    return prefer if prefer in tied else max(tied, key=release)


def load(path: str | Path, *, runner: str = "auto", as_policy: bool = False) -> Branch:
    """The tree's rules as a policy of the chosen family; ``as_policy`` runs a known revision's
    rules too instead of mapping them to the built-in policy."""
    given = Path(path)
    pkg = package_dir(given)
    return family_for(pkg, runner).read_tree(pkg, given, as_policy=as_policy)
