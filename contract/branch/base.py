"""``--base REV``: what a branch is compared with, checked before any work.

REV is one of

- ``auto``: for a vLLM tree, the installed release whose files the tree's runner family reads and
  replays differ least from the tree's (its ``vllm/_version.py`` breaks a tie, and names the
  release when no release environment is installed); for a built-in policy, itself; for a policy
  file, the newest built-in policy of its runner and config revision;
- a release (``0.34.0``): the built-in policy modelling that release's runner family (the
  branch's), and, for the real-code replay, that release's installed code;
- a built-in policy name or a ``.py`` policy file;
- a vLLM source tree: its rules read by the branch's runner family.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from contract.branch import tree as tree_mod
from contract.core.family import Family
from contract.core.policy import Branch, Policy, PolicyError
from contract.families import BUILT_IN, by_runner, for_release, load_policy, names_file
from contract.real.installed import EnvironmentProblem, installed_releases, package_of, release

MAX_SPEC = 4096


class BaseError(PolicyError):
    """A ``--base`` that cannot be used; one line naming ``--base``."""


@dataclass(frozen=True)
class Base:
    policy: Policy  # the model's base
    said: str  # which base, and why, in one line
    release: str | None = None  # a released vLLM version, when the base is one
    package: Path | None = None  # the base's vllm/ package, where it is on this machine


def check(spec: str) -> str:
    """``spec`` as given to ``--base``, refused in one line when it cannot name a base; nothing is
    loaded or run. Releases are written in full (``0.30.0``)."""
    if not spec or len(spec) > MAX_SPEC or "\0" in spec:
        raise BaseError(f"--base {spec[:60]!r}{'...' if len(spec) > 60 else ''} is not a base: use auto, a release "
                        f"(0.34.0), one of {', '.join(BUILT_IN)}, a .py policy file or a vLLM source tree")
    if spec == "auto" or spec in BUILT_IN:
        return spec
    if _looks_like_version(spec):
        try:
            parsed = Version(spec)
        except InvalidVersion:
            raise BaseError(f"--base {spec}: not a vLLM version; write a release in full, e.g. 0.34.0") from None
        if len(parsed.release) != 3:
            raise BaseError(f"--base {spec}: write the release in full, e.g. {parsed.major}.{parsed.minor}.0")
        return spec
    path = Path(spec)
    try:
        exists, is_dir = path.exists(), path.is_dir()
    except OSError as exc:
        raise BaseError(f"--base {spec[:60]}: {exc.strerror or exc}; pass a release, a policy or a vLLM tree") from None
    if names_file(spec):
        if not exists:
            raise BaseError(f"--base {spec}: no such policy file")
        if is_dir:
            raise BaseError(f"--base {spec} is a folder, not a policy file")
        return spec
    if is_dir:
        tree_mod.package_dir(path, option="--base")
        return spec
    if exists:
        raise BaseError(f"--base {spec} is a file but not a .py policy file; pass a release, a policy or a vLLM tree")
    raise BaseError(f"--base {spec}: no such release, policy or folder; use auto, a release (0.34.0), one of "
                    f"{', '.join(BUILT_IN)}, a .py policy file or a vLLM source tree")


def _looks_like_version(spec: str) -> bool:
    return bool(spec) and spec[0].isdigit() and "/" not in spec and not spec.endswith(".py")


def release_base(version: str, family: Family) -> Base:
    """A release as the base of a ``family`` branch: its built-in policy and, when installed, its code."""
    try:
        fam = for_release(version, family.name)
    except EnvironmentProblem as exc:
        raise BaseError(f"--base {version}: {exc}") from None
    policy = load_policy(fam.release_policy(release(version)))
    return Base(policy, f"base vLLM {version} ({fam.title}, policy {policy.name})", version, package_of(version))


def nearest_release(branch: Branch) -> tuple[str, str] | None:
    """The installed release whose files ``branch``'s family reads and replays differ least from the
    tree's, with the reason in words; None when no release of that family is installed."""
    family = by_runner(branch.policy.runner)
    versions = [v for v, _ in installed_releases() if family.ships(release(v))]
    scored = tree_mod.distances(branch.package, lambda pkg: family_files(family, pkg), versions)
    chosen = tree_mod.nearest(scored, tree_mod.version(branch.package))
    if chosen is None:
        return None
    _, n, total = next(s for s in scored if s[0] == chosen)
    others = ", ".join(f"{v}: {k}" for v, k, _ in scored if v != chosen)
    return chosen, (f"{n} of the {total} files {family.title} reads and replays differ from vLLM {chosen}'s"
                    + (f" (other installed releases: {others})" if others else ""))


def family_files(family: Family, pkg: Path) -> tuple[str, ...]:
    """The files under ``pkg`` (a ``vllm/`` package) that ``family`` reads (``verify``) and replays
    (``conform``): each replayed module's file, or every file of a replayed package."""
    found = {path for path, _ in family.reads}
    for name in family.replays:
        rel = Path(*name.split(".")[1:])
        if (pkg / rel).is_dir():
            found |= {p.relative_to(pkg).as_posix() for p in (pkg / rel).rglob("*.py")}
        else:
            found.add(rel.with_suffix(".py").as_posix())
    return tuple(sorted(found))


def auto(branch_policy: Policy, tree: Branch | None) -> Base:
    family = by_runner(branch_policy.runner)
    if tree is not None:
        found = nearest_release(tree)
        declared = tree_mod.version(tree.package)
        if found is not None:
            version, why = found
            base = release_base(version, family)
            return Base(base.policy, f"base auto: vLLM {version} ({family.title}, policy {base.policy.name}): {why}",
                        version, base.package)
        if declared is not None:
            base = release_base(declared, family)
            return Base(base.policy, f"base auto: vLLM {declared} ({family.title}, policy {base.policy.name}), the "
                                     "tree's vllm/_version.py; no release environment to compare its files with "
                                     f"(cudagraph-contract env make {declared})", declared, None)
        raise BaseError(f"--base auto: {tree.tree} has no vllm/_version.py and no vLLM release environment is "
                        "installed to compare it with; name the release with --base VERSION")
    if branch_policy.source == "built-in":
        return Base(branch_policy, f"base auto: {branch_policy.name} itself")
    for name in reversed(family.policies):
        p = family.built_in(name)
        if p.config_revision is branch_policy.config_revision:
            return Base(p, f"base auto: {p.name}, the newest built-in {family.title} policy with the same config "
                           "revision; name another with --base")
    raise BaseError(f"--base auto: no built-in policy models {family.title}; name a base with --base")


def resolve(spec: str, branch_policy: Policy, tree: Branch | None = None) -> Base:
    """The base of ``branch_policy`` (read from ``tree`` when it is a vLLM tree) for a checked ``spec``."""
    spec = check(spec)
    family = by_runner(branch_policy.runner)
    if spec == "auto":
        return auto(branch_policy, tree)
    if spec in BUILT_IN or names_file(spec):
        base = load_policy(spec)
        return Base(base, f"base {base.name}")
    if _looks_like_version(spec):
        return release_base(spec, family)
    found = tree_mod.load(spec, runner=family.name)
    return Base(found.policy, f"base {spec}: {found.where}", found.release, found.package)

