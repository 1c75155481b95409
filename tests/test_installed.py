"""The package installed as the README says a user installs it, ``pip install './cudagraph-contract[plugin]'``
from a clone (it is on no package index), into a fresh venv (the exact versions of ci-constraints.txt,
from the package registry), and every command run from a folder outside the checkout. The replays use the
checkout's release environments through ``CUDAGRAPH_CONTRACT_ENVS`` (none is built here). A packaging
check, as the lowest-version run is: ``make evidence``'s, which CI runs after ``make test``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_envs import require

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "tests" / "traces" / "mrv2-0.34-l1-compiled-under-full-then-upgraded.json"
BUILT = ("pyproject.toml", "README.md", "contract", "models")  # what the wheel is built from

# one worker builds the venv (pytest-xdist: a module fixture is made once per worker that runs the module)
pytestmark = [pytest.mark.slow, pytest.mark.conformance, pytest.mark.evidence, pytest.mark.xdist_group("installed")]


@pytest.fixture(scope="module")
def user(tmp_path_factory):
    """A venv with the wheel installed, and a runner of its commands from an empty folder."""
    require("0.34.0")
    base = tmp_path_factory.mktemp("installed")
    src = base / "cudagraph-contract"  # a clone's folder
    src.mkdir()
    for name in BUILT:  # a copy, so no stale build/ of the checkout leaks into the wheel
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copy)(
            ROOT / name, src / name, **({"ignore": shutil.ignore_patterns("__pycache__")} if (ROOT / name).is_dir() else {}))
    pip_env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    pip_env.pop("PYTHONPATH", None)
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    readme = (ROOT / "README.md").read_text()
    assert "pip install './cudagraph-contract[plugin]'" in readme  # the line run here, from the clone's parent
    done = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "-c",
                           str(ROOT / "ci-constraints.txt"), "./cudagraph-contract[plugin]"],
                          capture_output=True, text=True, env=pip_env, timeout=600, cwd=base)
    assert done.returncode == 0, done.stderr
    outside = base / "elsewhere"
    outside.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CONTRACT_REQUIRE_VLLM")}
    env.update(CUDAGRAPH_CONTRACT_CACHE=str(base / "cache"), COLUMNS="200", VLLM_LOGGING_LEVEL="ERROR")

    def run(*argv, envs: bool = False, timeout: int = 600) -> subprocess.CompletedProcess:
        extra = {"CUDAGRAPH_CONTRACT_ENVS": str(ROOT)} if envs else {}
        exe = argv[0] if argv[0] == "python" else "cudagraph-contract"
        return subprocess.run([str(venv / "bin" / exe), *map(str, argv[1:] if exe == "python" else argv)],
                              cwd=outside, env={**env, **extra}, capture_output=True, text=True, timeout=timeout)
    run.venv, run.base = venv, base
    return run


def test_the_installed_package_is_the_wheel_not_the_checkout(user):
    done = user("python", "-c", "import contract.cli, contract.real.envs as e; print(contract.cli.__file__); "
                "print(e.CONSTRAINTS.is_file())")
    where, shipped = done.stdout.split()
    assert "site-packages" in where and not where.startswith(str(ROOT)) and shipped == "True", done.stdout


def test_version_and_help(user):
    done = user("--version")
    assert done.returncode == 0 and done.stdout == "cudagraph-contract 0.1.0\n", done.stderr
    done = user("--help")
    assert done.returncode == 0 and "conform" in done.stdout and "env" in done.stdout, done.stderr
    done = user("conform", "--help")
    assert done.returncode == 0, done.stderr
    assert "site-packages" not in done.stdout and str(user.venv) not in done.stdout, done.stdout
    assert "reports/ in the current folder" in done.stdout


def test_verify_a_built_in_policy(user):
    done = user("verify", "--policy", "vllm_0_30", "--profile", "dev", "--seed", "0", timeout=300)  # dev: quick, seeded
    assert done.returncode == 0, done.stdout + done.stderr
    assert "vllm_0_30" in done.stdout and "Traceback" not in done.stderr


def test_env_list_finds_the_checkouts_environments_through_the_override(user):
    done = user("env", "list", envs=True)
    assert done.returncode == 0 and f"{ROOT / '.venv-vllm-0.34.0'}" in done.stdout, done.stdout
    assert user("env", "path", "0.34.0", envs=True).stdout.strip() == str(ROOT / ".venv-vllm-0.34.0" / "bin" / "python")
    missing = user("env", "path", "0.34.0")  # without the override: not in the (empty) cache
    assert missing.returncode == 2 and "cudagraph-contract env make 0.34.0" in missing.stderr


def test_conform_a_trace_on_a_release(user):
    reports = user.base / "reports"
    done = user("conform", "--vllm", "0.34.0", "--traces", TRACE, "--reports", reports, envs=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "steps: 7 of 7 agree" in done.stdout, done.stdout
    assert (reports / "conformance" / "vllm-0.34.0-mrv2.md").is_file()


def test_the_pytest_plugin_on_an_unedited_release_tree(user):
    installed = next((ROOT / ".venv-vllm-0.34.0" / "lib").glob("python3*/site-packages/vllm"))
    tree = user.base / "tree"
    tree.mkdir()
    subprocess.run(["cp", "-as", str(installed.resolve()), str(tree / "vllm")], check=True, capture_output=True)
    done = user("python", "-m", "pytest", "-c", "/dev/null", "-p", "no:cacheprovider",
                "--cudagraph-contract-vllm-src", tree, "--cudagraph-contract-base", "auto", envs=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout and "0 new" in done.stdout, done.stdout
    assert "does not read" not in done.stdout, done.stdout  # an unedited tree has no change to name
