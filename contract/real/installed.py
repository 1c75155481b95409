"""Which vLLM is installed, where each release's environment is, and which built-in policy models it.

Environments (``contract/real/envs.py``, ``cudagraph-contract env make``): ``.venv-vllm`` holds torch
and the pinned import closure once; ``.venv-vllm-VERSION`` holds only that release's vLLM package
and appends ``.venv-vllm``'s site-packages to ``sys.path``. A branch checkout runs on ``.venv-vllm``
with its tree first on ``PYTHONPATH``. They are looked for, in this order, in
``$CUDAGRAPH_CONTRACT_ENVS``, in the checkout's root when the package runs from a checkout (where
``make test`` puts them), and in the user's cache folder (``envs/`` under ``cache_root()``), where
``env make`` puts them by default. The version is read without importing vLLM: from the ``vllm``
package found on ``sys.path`` (its ``_version.py``, as in a wheel or a built checkout), else from
the distribution metadata.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import importlib.metadata
import importlib.util
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

from contract.core.output import one_line

SHARED = ".venv-vllm"
ENVS_VARIABLE = "CUDAGRAPH_CONTRACT_ENVS"
COMPLETE = ".complete"  # written last by envs.make: the environment passed its import check
ROOT = Path(__file__).resolve().parents[2]  # the checkout, when the package runs from one
PACKAGES = ("contract", "models")  # the project's top-level packages a child process imports


class EnvironmentProblem(Exception):
    """No usable vLLM for a conformance run; the message names the problem in one line."""


def cache_root() -> Path:
    """``$CUDAGRAPH_CONTRACT_CACHE``, else ``$XDG_CACHE_HOME/cudagraph-contract``, else
    ``~/.cache/cudagraph-contract``."""
    if os.environ.get("CUDAGRAPH_CONTRACT_CACHE"):
        return Path(os.environ["CUDAGRAPH_CONTRACT_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cudagraph-contract"


def vllm_cache_root(version: str | None = None) -> Path:
    """The ``VLLM_CACHE_ROOT`` this tool gives vLLM's code (a replay, a root cause's unit test):
    ``vllm/<version>`` in the cache folder, apart from the user's own vLLM cache; ``version``
    defaults to the vLLM installed with this Python. One folder per release: vLLM keeps one
    model-info file per model class and rewrites it when the class's source differs
    (``_LazyRegisteredModel.inspect_model_cls``, ``model_executor/models/registry.py``), so releases
    sharing a folder would rewrite each other's."""
    if version is None:
        try:
            version = importlib.metadata.version("vllm")
        except importlib.metadata.PackageNotFoundError:
            version = "unversioned"
    return cache_root() / "vllm" / version


@functools.lru_cache(maxsize=1)
def writable_cache_root() -> Path:
    """``cache_root()`` when it can be written; else, with one line on stderr, a temporary folder
    this process removes when it exits: a cache folder that cannot be written costs time, never the
    result."""
    wanted = cache_root().absolute()
    try:
        wanted.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=wanted).close()
        return wanted
    except OSError as exc:
        folder = Path(tempfile.mkdtemp(prefix="cudagraph-contract-cache-"))
        atexit.register(shutil.rmtree, folder, True)
        sys.stderr.write(one_line(f"note: the cache folder {wanted} cannot be written ({exc.strerror or exc}); this "
                                  "run uses a temporary one and keeps nothing") + "\n")
        return folder


def replay_settings() -> dict:
    """The environment a replay's child is given on top of ``contract.core.child.environment``: this
    run's cache folder (the child's vLLM and torch caches live under it) and vLLM's log level (the
    caller's, else errors only: it changes what is logged, never what runs)."""
    return {"CUDAGRAPH_CONTRACT_CACHE": str(writable_cache_root()),
            "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "ERROR")}


def checkout() -> Path | None:
    """The project's checkout the package runs from (an editable install or ``PYTHONPATH``); None for
    an installed wheel, whose package sits in site-packages."""
    try:
        text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    except OSError:
        return None
    return ROOT if re.search(r'^name\s*=\s*"cudagraph-contract"', text, re.MULTILINE) else None


def envs_dir() -> Path:
    """Where ``env make`` puts an environment unless told (``--dir``): ``$CUDAGRAPH_CONTRACT_ENVS``,
    else ``envs/`` in the cache folder."""
    override = os.environ.get(ENVS_VARIABLE)
    return Path(override) if override else cache_root() / "envs"


def search_path() -> list[Path]:
    """The folders looked in for environments, first found first: the override, the checkout's root,
    the cache folder."""
    override = os.environ.get(ENVS_VARIABLE)
    found: list[Path] = []
    for folder in (Path(override) if override else None, checkout(), cache_root() / "envs"):
        if folder is not None and folder not in found:
            found.append(folder)
    return found


def _venv(name: str, root: Path | None) -> Path:
    if root is not None:
        return root / name
    for folder in search_path():
        if (folder / name / "bin" / "python").exists():
            return folder / name
    return envs_dir() / name


def environment(version: str, root: Path | None = None) -> Path:
    """The interpreter of a release's environment: under ``root`` when given, else the first found on
    ``search_path()``, else where ``env make`` would put it (then it does not exist: ``missing``)."""
    if not isinstance(version, str):
        raise TypeError("environment(version, root=None): the version comes first")
    return _venv(f"{SHARED}-{version}", root) / "bin" / "python"


def shared_environment(root: Path | None = None) -> Path:
    """The interpreter with torch and the closure but no vLLM, for a tree put first on ``sys.path``."""
    return _venv(SHARED, root) / "bin" / "python"


def make_command(version: str) -> str:
    return f"cudagraph-contract env make {version}"


def missing(version: str) -> str:
    """The one line saying a release has no environment, where it was looked for, and how to make it."""
    looked = ", ".join(str(f) for f in search_path())
    return f"no environment for vLLM {version} (looked in {looked}); make it with `{make_command(version)}`"


def package_of(version: str, root: Path | None = None) -> Path | None:
    """The installed ``vllm/`` package of a release's environment, or None."""
    found = sorted(_venv(f"{SHARED}-{version}", root).glob("lib/python*/site-packages/vllm"))
    return found[0] if found and (found[0] / "__init__.py").is_file() else None


def installed_releases(root: Path | None = None) -> list[tuple[str, Path]]:
    """(version, ``vllm/`` package) of every complete release environment, oldest first; a version
    found in two folders is the first one's (``search_path()``)."""
    out: dict[str, Path] = {}
    for folder in [root] if root is not None else search_path():
        for env in sorted(folder.glob(f"{SHARED}-*")):
            version = env.name[len(SHARED) + 1:]
            pkg = package_of(version, folder)
            if version not in out and pkg is not None and (env / COMPLETE).exists():
                out[version] = pkg
    return sorted(out.items(), key=lambda vp: tuple(int(x) for x in vp[0].split(".") if x.isdigit()))


def import_root() -> Path:
    """A folder whose only importable names are the project's packages, for a child process's
    ``PYTHONPATH``: the checkout itself, or for an installed wheel a folder of links in the cache
    (the wheel's site-packages would put the user's other distributions before the environment's)."""
    found = checkout()
    if found is not None:
        return found
    here = ROOT
    folder = writable_cache_root() / "import-root" / hashlib.sha256(str(here).encode()).hexdigest()[:16]
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for name in PACKAGES:
            link = folder / name
            if (here / name).is_dir() and not link.exists():
                try:
                    link.symlink_to(here / name, target_is_directory=True)
                except FileExistsError:  # another process made it first
                    pass
    except OSError as exc:
        raise EnvironmentProblem(f"cannot prepare {folder} for the replay's interpreter: {exc.strerror or exc}") from None
    return folder


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
            "vLLM is not installed in this Python environment; pass --vllm VERSION to replay a release "
            "in its own environment (made with `cudagraph-contract env make VERSION`)"
        ) from None


def release(version: str) -> tuple[int, int]:
    """(major, minor) of a vLLM version string."""
    parts = version.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        raise EnvironmentProblem(f"cannot read the vLLM version {version!r}") from None
