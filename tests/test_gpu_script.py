"""``scripts/gpu-conformance.sh``: the GPU run's script path, exercised without a GPU.

``--device cpu-sim`` on the regression traces inside ``.venv-vllm-0.30.0`` (skipped without it,
failed when ``CONTRACT_REQUIRE_VLLM=1``) must agree on every step and write its result to ``--out``;
``--device cuda`` without CUDA must exit 2 with one line.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu-conformance.sh"


def venv_python() -> Path:
    python = ROOT / ".venv-vllm-0.30.0" / "bin" / "python"
    if not python.exists():
        message = ".venv-vllm-0.30.0 is missing: conformance-env/make-env.sh 0.30.0 .venv-vllm-0.30.0"
        if os.environ.get("CONTRACT_REQUIRE_VLLM") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return python


def run(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHON=str(venv_python()))
    env.pop("OUT", None)
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=300)


def test_cpu_sim_run_agrees_and_writes_its_result_outside_reports(tmp_path):
    done = run(["--device", "cpu-sim", "--traces", str(ROOT / "tests" / "traces"), "--out", str(tmp_path)], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["device"] == "cpu-sim" and result["steps"] > 0
    assert result["agreement"] == 1.0 and result["disagreeing_traces"] == 0
    assert "simulated" in (tmp_path / "result.md").read_text()


def test_cpu_sim_refuses_to_write_to_reports_gpu(tmp_path):
    done = run(["--device", "cpu-sim"], tmp_path)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1


def test_cuda_without_cuda_exits_2_with_one_line(tmp_path):
    python = venv_python()
    if subprocess.run([str(python), "-c", "import torch, sys; sys.exit(torch.cuda.is_available())"]).returncode:
        pytest.skip("CUDA is available here")
    before = sorted((ROOT / "reports" / "gpu").glob("result.*"))
    done = run(["--device", "cuda"], tmp_path)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "torch.cuda.is_available() is False" in done.stderr
    assert sorted((ROOT / "reports" / "gpu").glob("result.*")) == before
    cli = subprocess.run([str(python), "-m", "contract.cli", "conform", "--device", "cuda", "--traces",
                          str(ROOT / "tests" / "traces")], env=dict(os.environ, PYTHONPATH=str(ROOT)),
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 2 and len(cli.stderr.strip().splitlines()) == 1
