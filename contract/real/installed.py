"""Which vLLM is installed, where each release's environment is, and which built-in policy models it.

Environments (``conformance-env/make-env.sh``): ``.venv-vllm`` holds torch and the pinned import
closure once; ``.venv-vllm-VERSION`` holds only that release's vLLM package and appends
``.venv-vllm``'s site-packages to ``sys.path``. A branch checkout runs on ``.venv-vllm`` with its
tree first on ``PYTHONPATH``. The version is read without importing vLLM: from the ``vllm``
package found on ``sys.path`` (its ``_version.py``, as in a wheel or a built checkout), else from
the distribution metadata.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from pathlib import Path

SHARED = ".venv-vllm"


class EnvironmentProblem(Exception):
    """No usable vLLM for a conformance run; the message names the problem in one line."""


def environment(root: Path, version: str) -> Path:
    """The interpreter of a release's environment (it may not exist)."""
    return root / f"{SHARED}-{version}" / "bin" / "python"


ROOT = Path(__file__).resolve().parents[2]  # the checkout, when the package runs from one


def package_of(version: str, root: Path = ROOT) -> Path | None:
    """The installed ``vllm/`` package of a release's environment, or None."""
    found = sorted((root / f"{SHARED}-{version}").glob("lib/python*/site-packages/vllm"))
    return found[0] if found and (found[0] / "__init__.py").is_file() else None


def installed_releases(root: Path = ROOT) -> list[tuple[str, Path]]:
    """(version, ``vllm/`` package) of every release environment present, oldest first."""
    out = []
    for env in root.glob(f"{SHARED}-*"):
        version = env.name[len(SHARED) + 1:]
        pkg = package_of(version, root)
        if pkg is not None and (env / ".complete").exists():
            out.append((version, pkg))
    return sorted(out, key=lambda vp: tuple(int(x) for x in vp[0].split(".") if x.isdigit()))


def shared_environment(root: Path) -> Path:
    """The interpreter with torch and the closure but no vLLM, for a tree put first on ``sys.path``."""
    return root / SHARED / "bin" / "python"


def source_version(package: Path) -> str | None:
    """The version a ``vllm/`` package declares: ``_version.py`` (written by setuptools-scm into wheels
    and built checkouts), else ``version.py``'s ``__version__``; None when neither says."""
    for name in ("_version.py", "version.py"):
        path = package / name
        if path.is_file():
            found = re.search(r"""^(?:__version__|version)\s*(?::\s*str\s*)?=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""",
                              path.read_text(encoding="utf-8", errors="replace"), re.MULTILINE)
            if found:
                return found.group(1)
    return None


def installed_version() -> str:
    spec = importlib.util.find_spec("vllm")
    if spec is not None and spec.submodule_search_locations:
        version = source_version(Path(list(spec.submodule_search_locations)[0]))
        if version:
            return version
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        raise EnvironmentProblem(
            "vLLM is not installed in this Python environment; make one with "
            "conformance-env/make-env.sh VERSION .venv-vllm-VERSION, or pass --vllm VERSION"
        ) from None


def release(version: str) -> tuple[int, int]:
    """(major, minor) of a vLLM version string."""
    parts = version.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        raise EnvironmentProblem(f"cannot read the vLLM version {version!r}") from None
