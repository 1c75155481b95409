"""``--base REV``: the revision a branch is compared with.

REV is a built-in policy, a ``.py`` policy file, a vLLM source tree, a release version
(``0.30.0``: the built-in policy modelling it), or ``auto``: the release the branch is recognised
as or starts from. ``auto`` for

- a vLLM tree whose wrapping block is a known revision: that revision;
- any other tree: the release its version file names, else the newest release with the tree's
  config revision;
- a built-in policy: itself;
- a policy file: the newest built-in policy of the same runner and config revision.
"""

from __future__ import annotations

import re
from pathlib import Path

from contract.families import BUILT_IN, load_policy, policy_for
from contract.real.installed import EnvironmentProblem
from contract.core.policy import Policy
from contract.core.policy import PolicyError

VERSION = re.compile(r"^\d+\.\d+(\.\d+)?([.+-].*)?$")


def _release_policy(version: str) -> Policy:
    try:
        return load_policy(policy_for(version))
    except EnvironmentProblem as exc:
        raise PolicyError(f"--base {version}: {exc}") from None


def _newest(runner, revision) -> Policy | None:
    for name in reversed(BUILT_IN):
        p = load_policy(name)
        if p.runner is runner and p.config_revision is revision:
            return p
    return None


def tree_version(path: str | Path) -> str | None:
    """``vllm/_version.py``'s version (written by setuptools-scm into installed and built trees)."""
    from contract.branch.tree import package_dir

    text_path = package_dir(Path(path)) / "_version.py"
    if not text_path.is_file():
        return None
    found = re.search(r"""(?:__version__|version)\s*(?::\s*str\s*)?=\s*['"]([^'"]+)['"]""",
                      text_path.read_text(encoding="utf-8", errors="replace"))
    return found.group(1) if found else None


def auto(branch: Policy, tree=None) -> tuple[Policy, str]:
    """The base ``auto`` picks and why, in words. ``tree`` is the ``branch.Branch`` read from
    ``--vllm-src``, when the branch is one."""
    if tree is not None:
        if tree.release is not None:
            return branch, f"base auto: vLLM {tree.release}, the revision the tree's wrapping block is"
        version = tree_version(tree.policy.source)
        if version is not None:
            base = _release_policy(version)
            return base, f"base auto: {base.name}, the policy of vLLM {version} (the tree's vllm/_version.py)"
        base = _newest(branch.runner, branch.config_revision)
        if base is None:
            raise PolicyError(f"--base auto: no built-in policy models {branch.runner.value}; name a base with --base")
        return base, (f"base auto: {base.name}, the newest release with the tree's config revision "
                      f"({branch.config_revision.value}); name another with --base")
    if branch.source == "built-in":
        return branch, f"base auto: {branch.name} itself"
    base = _newest(branch.runner, branch.config_revision)
    if base is None:
        raise PolicyError(f"--base auto: no built-in policy models {branch.runner.value}; name a base with --base")
    return base, f"base auto: {base.name}, the newest built-in policy of {branch.runner.value}; name another with --base"


def resolve(spec: str, branch: Policy, tree=None) -> tuple[Policy, str]:
    """The base policy for ``spec`` and a line saying which it is."""
    if spec == "auto":
        return auto(branch, tree)
    if spec in BUILT_IN or spec.endswith(".py"):
        base = load_policy(spec)
        return base, f"base {base.name}"
    if VERSION.match(spec):
        base = _release_policy(spec)
        return base, f"base {base.name}, the policy of vLLM {spec}"
    if Path(spec).is_dir():
        from contract.branch import tree as branch_mod

        found = branch_mod.load(spec)
        return found.policy, f"base {spec}: {found.recognised}"
    raise PolicyError(f"unknown base {spec!r}: use auto, a release (0.30.0), one of {', '.join(BUILT_IN)}, "
                      "a .py policy file or a vLLM source tree")
