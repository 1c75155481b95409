"""``scripts/gpu-conformance.sh``: the GPU run's script path, exercised without a GPU.

``--device cpu-sim`` on the regression traces inside ``.venv-vllm-0.30.0`` (skipped without it,
failed when ``CONTRACT_REQUIRE_VLLM=1``) must agree on every step and write its result to ``--out``;
``--device cuda`` without CUDA must exit 2 with one line; and the bundle path: pack, carry the
tree, run with a Python that has only the GPU machine's packages and sees a GPU host. The runs on
vLLM are ``make evidence``'s, which CI runs after ``make test``.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from vllm_envs import per_kind, require_python

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu-conformance.sh"


def venv_python(version: str = "0.30.0") -> Path:
    return require_python(version)


def run(args: list[str], tmp_path: Path, version: str = "0.30.0") -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHON=str(venv_python(version)))
    env.pop("OUT", None)
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.evidence
def test_cpu_sim_run_agrees_and_writes_its_result_outside_reports(tmp_path):
    done = run(["--device", "cpu-sim", "--traces", str(ROOT / "tests" / "traces"), "--corpus", "none", "--out",
                str(tmp_path)], tmp_path)  # the corpus is replayed by test_conformance*.py
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["device"] == "cpu-sim" and result["steps"] > 0
    assert result["agreement"] == 1.0 and result["disagreeing_traces"] == 0
    assert "simulated" in (tmp_path / "result.md").read_text()


def test_cpu_sim_refuses_to_write_to_reports_gpu(tmp_path):
    done = run(["--device", "cpu-sim"], tmp_path, "0.34.0")  # refused before any replay
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1


@pytest.mark.evidence
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


# A Python like the GPU machine's: the distributions scripts/gpu-machine-packages.txt lists, taken
# from .venv-vllm-0.30.0 (torch, numpy, typer, ...), and nothing else: no vLLM, none of the
# compiled distributions the bundle must carry.
GPU_HOST_PYTHON = r"""
import importlib.metadata as md, re, sys
from pathlib import Path
target, listing = Path(sys.argv[1]), Path(sys.argv[2])
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
machine = {norm(l.strip()) for l in listing.read_text().splitlines() if l.strip() and not l.startswith("#")}
for dist in md.distributions():
    if norm(dist.metadata["Name"]) not in machine:
        continue
    for f in dist.files or []:
        if f.parts[0] == "..":
            continue
        link = target / f.parts[0]
        if not link.exists():
            link.symlink_to(Path(dist.locate_file(f.parts[0])).resolve())
"""


def gpu_host_python(tmp_path: Path) -> Path:
    python = venv_python()
    base = subprocess.run([str(python), "-c", "import sys; print(sys._base_executable)"],
                          capture_output=True, text=True, check=True).stdout.strip()
    host = tmp_path / "gpu-host"
    subprocess.run([base, "-m", "venv", "--without-pip", str(host)], check=True)
    site = next((host / "lib").glob("python3*/site-packages"))
    subprocess.run([str(python), "-c", GPU_HOST_PYTHON, str(site), str(ROOT / "scripts" / "gpu-machine-packages.txt")],
                   check=True)
    return host / "bin" / "python"


RELEASES = ("0.30.0", "0.34.0")  # Model Runner V1 and V2


@pytest.fixture(scope="module")
def carried(tmp_path_factory):
    """The working tree as carried, with one bundle of both releases packed in it, and a Python
    that has no vLLM and whose vLLM import sees a GPU host (tests/gpu_host)."""
    tmp_path = tmp_path_factory.mktemp("gpu-bundle")
    for version in RELEASES:
        venv_python(version)
    python = gpu_host_python(tmp_path)
    assert subprocess.run([str(python), "-c", "import vllm"], capture_output=True).returncode != 0
    # The emulation is in force: a plain `import vllm` there detects CUDA and loads platforms/cuda.py.
    plain = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    probe = subprocess.run([str(venv_python()), "-c", "import vllm"], capture_output=True, text=True,
                           env=dict(plain, PYTHONPATH=str(ROOT / "tests" / "gpu_host")), timeout=300)
    assert probe.returncode != 0 and "vllm/platforms/cuda.py" in probe.stderr, probe.stderr[-1000:]
    python_version = subprocess.run([str(python), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                    capture_output=True, text=True, check=True).stdout.strip()
    tree = tmp_path / "tree"
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout
    for name in filter(None, listed.decode().split("\0")):
        if (ROOT / name).is_file():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            (tree / name).write_bytes((ROOT / name).read_bytes())
    (tree / "scripts" / "gpu-conformance.sh").chmod(0o755)
    for version in RELEASES:
        (tree / f".venv-vllm-{version}").symlink_to(venv_python(version).parents[1])
    packed = subprocess.run(["bash", str(tree / "scripts" / "gpu-conformance.sh"), "--pack"],
                            capture_output=True, text=True, timeout=600,
                            env=dict(os.environ, GPU_PYTHON_VERSION=python_version))
    assert packed.returncode == 0, packed.stderr[-2000:]
    for version in RELEASES:
        (tree / f".venv-vllm-{version}").unlink()
    assert json.loads((tree / ".gpu-bundle" / "manifest.json").read_text())["releases"].keys() == set(RELEASES)
    return tree, python, python_version, tmp_path


@pytest.mark.xdist_group("gpu-bundle")
# make evidence's (CI runs it after make test), as the cpu-sim runs above
@pytest.mark.parametrize("version", per_kind(RELEASES, set()))
def test_the_bundle_alone_runs_the_replay_on_a_gpu_like_python(carried, version):
    """Pack, carry the tree and the bundle, run with a Python that has no vLLM and sees a GPU host:
    the release's runner replays (0.30.0: MRV1, 0.34.0: MRV2), every step agrees, and the result
    comes back in $OUT."""
    tree, python, python_version, tmp_path = carried
    out = tmp_path / f"out-{version}"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PYTHON=str(python), PYTHONPATH=str(ROOT / "tests" / "gpu_host"), OUT=str(out))
    done = subprocess.run(["bash", str(tree / "scripts" / "gpu-conformance.sh"), "--vllm", version, "--device",
                           "cpu-sim", "--traces", str(tree / "tests" / "traces")], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-2000:]
    result = json.loads((out / "result.json").read_text())
    assert result["vllm"] == version and result["steps"] > 0 and result["agreement"] == 1.0
    assert result["load_model_block"].get("runner", "MRV1") == ("MRV2" if version == "0.34.0" else "MRV1")
    assert result["machine"]["python"].startswith(python_version)
    assert sorted(p.name for p in (out / "traces").glob("*.md")) and (out / "conformance").is_dir()


@pytest.mark.xdist_group("gpu-bundle")
@pytest.mark.evidence
def test_the_bundle_leaves_room_for_the_tree_to_grow(carried, record_property):
    """Both releases' bundle and a clean clone fit the device tool's 64 MiB with ``SPARE_MIB`` to spare
    (what ``make evidence`` prints at its end)."""
    from contract.gpu import bundle

    tree, *_ = carried
    packed = bundle.size(tree / ".gpu-bundle")
    tracked, _ = bundle.tree_size(ROOT, tree / ".gpu-bundle")
    left = bundle.margin(packed, tracked)
    record_property("said", f"GPU bundle of vLLM {' and '.join(RELEASES)}: {packed / bundle.MIB:.1f} MiB, with the "
                            f"tracked tree ({tracked / bundle.MIB:.1f} MiB) {left:.1f} MiB of the device tool's "
                            f"{bundle.LIMIT_MIB:g} to spare (at least {bundle.SPARE_MIB:g})")
    assert left >= bundle.SPARE_MIB
