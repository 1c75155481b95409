"""The vLLM environments without a checkout: where they are looked for (the override, the checkout's
root, the user cache folder), what a missing one says, and ``env make``'s one-line failures,
idempotent re-run and shipped constraints (``contract/real/envs.py``, ``cudagraph-contract env``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from contract.cli import main
from contract.real import envs, installed
from vllm_envs import require

ROOT = Path(__file__).resolve().parents[1]


def fake_env(folder: Path, version: str, complete: bool = True) -> Path:
    """A release environment's shape: an interpreter, its ``vllm`` package, the completion marker."""
    env = folder / f"{installed.SHARED}-{version}"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").write_text("#!/bin/sh\n")
    pkg = env / "lib" / "python3.11" / "site-packages" / "vllm"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    if complete:
        (env / installed.COMPLETE).write_text("")
    return env


@pytest.fixture
def places(tmp_path, monkeypatch):
    """An override folder and a cache folder, both empty; the checkout is this repository."""
    override, cache = tmp_path / "override", tmp_path / "cache"
    override.mkdir()
    monkeypatch.setenv(installed.ENVS_VARIABLE, str(override))
    monkeypatch.setenv("CUDAGRAPH_CONTRACT_CACHE", str(cache))
    return override, cache / "envs"


def test_the_search_order_is_override_checkout_cache(places):
    override, cache = places
    assert installed.checkout() == ROOT
    assert installed.search_path() == [override, ROOT, cache]
    fake_env(cache, "9.9.1")
    fake_env(override, "9.9.2")
    assert installed.environment("9.9.1") == cache / ".venv-vllm-9.9.1" / "bin" / "python"
    assert installed.environment("9.9.2") == override / ".venv-vllm-9.9.2" / "bin" / "python"
    fake_env(cache, "9.9.2")
    assert installed.environment("9.9.2").parent.parent.parent == override  # the override comes first
    # not found anywhere: where env make would put it, which does not exist
    assert installed.environment("9.9.3") == override / ".venv-vllm-9.9.3" / "bin" / "python"
    assert not installed.environment("9.9.3").exists()
    assert installed.environment("9.9.1", root=override) == override / ".venv-vllm-9.9.1" / "bin" / "python"


def test_installed_releases_take_the_first_found_and_only_complete_ones(places):
    override, cache = places
    fake_env(cache, "9.9.1")
    fake_env(override, "9.9.1")
    fake_env(cache, "9.9.4", complete=False)
    found = dict(installed.installed_releases())
    assert found["9.9.1"] == override / ".venv-vllm-9.9.1" / "lib" / "python3.11" / "site-packages" / "vllm"
    assert "9.9.4" not in found
    assert installed.package_of("9.9.1") == found["9.9.1"]


def test_without_the_override_new_environments_go_to_the_cache(tmp_path, monkeypatch):
    monkeypatch.delenv(installed.ENVS_VARIABLE, raising=False)
    monkeypatch.setenv("CUDAGRAPH_CONTRACT_CACHE", str(tmp_path / "c"))
    assert installed.envs_dir() == tmp_path / "c" / "envs"
    assert installed.search_path() == [ROOT, tmp_path / "c" / "envs"]
    monkeypatch.delenv("CUDAGRAPH_CONTRACT_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert installed.envs_dir() == tmp_path / "xdg" / "cudagraph-contract" / "envs"


def test_an_old_style_call_is_refused():
    with pytest.raises(TypeError):
        installed.environment(ROOT, "0.30.0")


def run_cli(argv, capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as stop:
        main([str(a) for a in argv])
    captured = capsys.readouterr()
    return stop.value.code, captured.out, captured.err


def one_line(code, err, needle):
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert needle in lines[0], lines[0]


def test_a_missing_environment_names_the_command_that_makes_it(places, capsys):
    code, out, err = run_cli(["env", "path", "9.9.7"], capsys)
    one_line(code, err, "make it with `cudagraph-contract env make 9.9.7`")
    code, out, err = run_cli(["conform", "--vllm", "9.9.7", "--reports", places[0] / "r"], capsys)
    one_line(code, err, "make it with `cudagraph-contract env make 9.9.7`")
    assert str(places[0]) in err  # where it was looked for


def test_env_path_and_list(places, capsys):
    override, cache = places
    fake_env(override, "9.9.1")
    fake_env(cache, "9.9.5", complete=False)
    code, out, err = run_cli(["env", "path", "9.9.1"], capsys)
    assert code == 0 and out.strip() == str(override / ".venv-vllm-9.9.1" / "bin" / "python")
    code, out, err = run_cli(["env", "list", "--json"], capsys)
    data = json.loads(out)
    assert code == 0 and data["search_path"] == [str(override), str(ROOT), str(cache)]
    assert data["new"] == str(override)
    listed = {(e["version"], e["path"]): e["complete"] for e in data["environments"]}
    assert listed[("9.9.1", str(override / ".venv-vllm-9.9.1"))] is True
    assert listed[("9.9.5", str(cache / ".venv-vllm-9.9.5"))] is False


@pytest.mark.parametrize("argv, needle", [
    (["env", "make", "0.30"], "VERSION must be 'base' or look like 0.30.0"),
    (["env", "make", "latest"], "VERSION must be 'base' or look like 0.30.0"),
    (["env", "path", "x.y"], "VERSION must be 'base' or look like 0.30.0"),
])
def test_env_bad_version_is_one_line(argv, needle, capsys):
    code, out, err = run_cli(argv, capsys)
    one_line(code, err, needle)


def test_a_failing_step_is_one_line_with_pips_error(tmp_path, capsys):
    """A shared environment whose pip fails: the step and pip's last error line, exit 2."""
    base = tmp_path / "base"
    (base / "bin").mkdir(parents=True)
    site = tmp_path / "site"
    site.mkdir()
    python = base / "bin" / "python"
    python.write_text(f"""#!/bin/sh
case "$1" in
  -m) echo "Collecting vllm==9.9.9"; echo "ERROR: No matching distribution found for vllm==9.9.9"; exit 1 ;;
  -c) case "$2" in *purelib*) echo "{site}" ;; *) echo "{python}" ;; esac ;;
esac
""")
    python.chmod(0o755)
    (base / installed.COMPLETE).write_text("")
    code, out, err = run_cli(["env", "make", "9.9.9", "--dir", tmp_path / "rel", "--base", base], capsys)
    lines = [line for line in err.strip().splitlines() if line.startswith("error: ")]
    assert code == 2 and len(lines) == 1, err
    assert "failed: ERROR: No matching distribution found for vllm==9.9.9 (log: " in lines[0], lines[0]
    assert "Traceback" not in err


def test_a_release_without_its_shared_environment_cannot_start(tmp_path, capsys):
    code, out, err = run_cli(["env", "make", "base", "--dir", tmp_path / "b", "--python", tmp_path / "no-python"], capsys)
    lines = [line for line in err.strip().splitlines() if line.startswith("error: ")]
    assert code == 2 and len(lines) == 1 and f"creating {tmp_path / 'b'} failed" in lines[0], err


@pytest.mark.parametrize("argv, needle", [
    (["0.34", "--dir", "{tmp}/r"], "VERSION must be 'base' or look like 0.30.0"),
    (["base", "--dir", "{tmp}/b", "--python", "{tmp}/no-python"], "creating {tmp}/b failed"),
])
def test_the_makefiles_entry_needs_the_standard_library_alone(tmp_path, argv, needle):
    """``python -m contract.real.envs``, which make test runs before .venv exists: under ``-S`` (no
    site-packages) a bad version or a failing step is one line and exit 2."""
    argv = [a.format(tmp=tmp_path) for a in argv]
    done = subprocess.run([sys.executable, "-S", "-m", "contract.real.envs", *argv], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert done.returncode == 2 and len(lines) == 1 and needle.format(tmp=tmp_path) in lines[0], done.stderr


def test_the_constraints_ship_in_the_package_and_the_tools_are_the_ci_pins():
    assert envs.CONSTRAINTS.is_file() and envs.CONSTRAINTS.parent.name == "real"
    pins = [line.split("#")[0].strip() for line in envs.CONSTRAINTS.read_text().splitlines()]
    assert "transformers==5.24.0" in pins and not any(p.startswith("torch==") for p in pins)
    ci = {line.strip() for line in (ROOT / "ci-constraints.txt").read_text().splitlines()}
    assert set(envs.TOOLS) <= ci
    assert f"torch=={envs.TORCH}" in ci
    assert '"contract.real" = ["constraints.txt"]' in (ROOT / "pyproject.toml").read_text()


def test_remaking_a_complete_environment_installs_nothing():
    """Idempotent: every step's result is in place, so only the import check runs."""
    venv = require("0.34.0")
    done = subprocess.run([sys.executable, "-m", "contract.cli", "env", "make", "0.34.0", "--dir", str(venv),
                           "--base", str(ROOT / installed.SHARED)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert "installing" not in done.stderr and "creating" not in done.stderr, done.stderr
    assert done.stdout.startswith(f"{venv} ready (vllm 0.34.0 over ")
    assert (venv / installed.COMPLETE).exists()
