"""``verify --vllm-src`` on a tree with Model Runner V2 only (vLLM 0.34 and later): the release is
recognised from ``CudaGraphManager.__init__`` and the tree's own ``use_breakable_cg`` and
``piecewise_capture_available`` expressions are what the model runs.

The synthetic trees hold only those two statements and resolve's Mamba check, written here in
vLLM's layout; the released 0.34.0 tree is ``.venv-vllm-0.34.0``'s or the ``vllm/`` that
``CONTRACT_VLLM_0_34_SRC`` names (skipped without either, failed under ``CONTRACT_REQUIRE_VLLM=1``)."""

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from contract.branch import tree as branch
from contract.cli import app
from contract.core.expected import FAILS
from contract.core.explore import explore
from contract.runners.mrv2 import branch as mrv2_branch
from contract.runners.mrv2 import branch_ubatch as ubatch_branch
from contract.core.properties import PROPERTIES
from users import unprivileged
from vllm_envs import unavailable

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()
RELEASED_0_34 = mrv2_branch.RELEASED["0.34"]


def mrv2_tree(root: Path, use_breakable_cg: str = RELEASED_0_34[0], available: str = RELEASED_0_34[1],
              param: str = "decode_query_lens", mamba: str = mrv2_branch.MAMBA_RELEASED,
              twin: str | None = None) -> Path:
    gpu = root / "vllm" / "v1" / "worker" / "gpu"
    gpu.mkdir(parents=True)
    twin_method = "" if twin is None else (
        "\n    def _maybe_ubatch_twin(self, desc: BatchExecutionDescriptor) -> BatchExecutionDescriptor | None:\n"
        '        """Return a microbatched capture candidate when eligible."""\n'
        + "".join(f"        {line}\n" for line in twin.strip().splitlines()))
    (gpu / "cudagraph_utils.py").write_text(
        "class CudaGraphManager:\n"
        f"    def __init__(self, vllm_config, device, cudagraph_mode, {param}):\n"
        f"        self.use_breakable_cg = (\n            {use_breakable_cg}\n        )\n" + twin_method)
    (gpu / "model_runner.py").write_text(
        "class GPUModelRunner:\n"
        "    def initialize_kv_cache(self, kv_cache_config, is_profiling=False):\n"
        f"        piecewise_capture_available = {available}\n")
    (root / "vllm" / "config").mkdir()
    (root / "vllm" / "config" / "compilation.py").write_text(
        "class CompilationConfig:\n"
        "    def resolve_cudagraph_mode_and_sizes(self, kv_cache_config=None, max_num_reqs=None, is_profiling=False):\n"
        f"        if {mamba}:\n"
        "            raise ValueError('max_num_seqs exceeds available Mamba cache blocks')\n")
    return root


def failing(policy) -> set[str]:
    explored = explore(policy)
    return {p for p in PROPERTIES if not explored.holds(p)}


def test_released_rules_are_recognised(tmp_path):
    found = branch.load(mrv2_tree(tmp_path))
    assert found.release == "0.34.0" and found.policy.name == "mrv2_0_34"
    found = branch.load(mrv2_tree(tmp_path / "old", *mrv2_branch.RELEASED["0.33"], param="decode_query_len"))
    assert found.release == "0.33.0" and found.policy.name == "mrv2_0_33"


def test_edited_rule_reaches_the_model(tmp_path):
    """use_breakable_cg without the breakable switch: the match-any runner wraps the compiled model,
    so a PIECEWISE capture nests the compiled pieces' capture (P1) under the wrong capturer (P3)."""
    found = branch.load(mrv2_tree(tmp_path, "self.cudagraph_mode.has_piecewise_cudagraphs()"))
    assert found.release is None and found.policy.release == "0.34"
    result = explore(found.policy, first_only=True)
    assert {"P1", "P3"} <= set(result.counterexamples)
    assert "nested capture" in result.counterexamples["P1"].expected_violations[0]["message"]


def test_use_breakable_cg_without_has_piecewise_changes_no_verdict(tmp_path):
    """A manager whose mode has no piecewise graphs never reaches run_pw_graph, so dropping
    ``has_piecewise_cudagraphs()`` builds an unused runner: the verdicts are the release's."""
    found = branch.load(mrv2_tree(tmp_path, "is_breakable_cudagraph_enabled(self.compilation_config)"))
    assert found.release is None
    assert failing(found.policy) == FAILS["mrv2_0_34"]


def test_expression_reading_an_unmodelled_name_is_refused(tmp_path):
    tree = mrv2_tree(tmp_path, "is_breakable_cudagraph_enabled(self.compilation_config) and use_it_anyway")
    result = runner.invoke(app, ["verify", "--vllm-src", str(tree)])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and "use_it_anyway" in lines[0], result.output


def released_0_34() -> Path:
    """``CONTRACT_VLLM_0_34_SRC``, else the unpacked wheel in ``.venv-vllm-0.34.0`` (``make test`` makes it)."""
    root = Path(__file__).resolve().parents[1]
    found = [os.environ.get("CONTRACT_VLLM_0_34_SRC") or ""]
    found += [str(p) for p in sorted((root / ".venv-vllm-0.34.0" / "lib").glob("python3*/site-packages/vllm"))]
    for src in found:
        if src and (Path(src) / mrv2_branch.MANAGER_FILE).is_file():
            return Path(src)
    unavailable("no vLLM 0.34.0 tree: make .venv-vllm-0.34.0 (cudagraph-contract env make 0.34.0 --dir "
                ".venv-vllm-0.34.0) or set CONTRACT_VLLM_0_34_SRC to its vllm/")


def test_released_0_34_tree_reads_as_its_release(tmp_path):
    """The released tree is 0.34.0's rules (``verify`` on it exits 0 and says so: test_branch_review.py's
    unedited tree); without ``has_piecewise_cudagraphs()``'s guard its manager is a new policy."""
    pkg = released_0_34()
    assert branch.load(pkg).policy.name == "mrv2_0_34"
    edited = tmp_path / "vllm"
    for rel in (mrv2_branch.MANAGER_FILE, mrv2_branch.RUNNER_FILE, mrv2_branch.COMPILATION_FILE):
        (edited / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(pkg / rel, edited / rel)
    path = edited / mrv2_branch.MANAGER_FILE
    text = path.read_text()
    released = "is_breakable_cudagraph_enabled(self.compilation_config)\n            and self.cudagraph_mode.has_piecewise_cudagraphs()"
    assert released in text
    path.write_text(text.replace(released, "self.cudagraph_mode.has_piecewise_cudagraphs()"))
    found = branch.load(edited)
    assert found.release is None and {"P1", "P3"} <= set(explore(found.policy, first_only=True).counterexamples)


# -- a tree is data: only regular files are read ------------------------------------------------------

def _odd_tree(root: Path, odd: str, make) -> Path:
    tree = mrv2_tree(root)
    path = tree / "vllm" / odd
    path.parent.mkdir(parents=True, exist_ok=True)
    make(path)
    return tree


ODD = {
    "a FIFO in place of a release file": ("config/parallel.py", os.mkfifo, "is a FIFO, not a regular file"),
    "a FIFO the release lacks": ("v1/worker/gpu/extra.py", os.mkfifo, "is a FIFO, not a regular file"),
    "a link to /dev/zero": ("envs.py", lambda p: p.symlink_to("/dev/zero"), "is a character device, not a regular file"),
    "a file too large to be a source": ("config/vllm.py", lambda p: p.write_bytes(b"#" * (17 << 20)),
                                        "is 17 MiB; a source file of vLLM's is far smaller"),
}


@pytest.mark.parametrize("name", sorted(ODD))
def test_an_odd_file_in_a_tree_is_one_line(name, tmp_path):
    """Compared with the installed release (``--base 0.34.0``): the reader neither blocks nor fills
    memory; one line, exit 2, within seconds."""
    released_0_34()
    rel, make, needle = ODD[name]
    tree = _odd_tree(tmp_path / "tree", rel, make)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "contract.cli", "verify", "--vllm-src", str(tree), "--base", "0.34.0"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert time.monotonic() - started < 60
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and needle in lines[0], done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("what", ["file", "folder"])
def test_an_unreadable_file_or_folder_in_a_tree_is_one_line(what):
    """As a user who cannot read it (root reads everything, so the command runs as nobody)."""
    released_0_34()
    work = Path(tempfile.mkdtemp(prefix="unreadable-"))
    try:
        os.chmod(work, 0o755)
        tree = mrv2_tree(work / "tree")
        hidden = tree / "vllm" / "config" / ("secret.py" if what == "file" else "secret")
        hidden.parent.mkdir(parents=True, exist_ok=True)
        hidden.write_text("x = 1\n") if what == "file" else hidden.mkdir()
        hidden.chmod(0)
        as_user = unprivileged()
        done = subprocess.run([sys.executable, "-m", "contract.cli", "verify", "--vllm-src", str(tree), "--base",
                               "0.34.0"], cwd=work, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "HOME": str(work), "CUDAGRAPH_CONTRACT_CACHE": str(work / "cache")},
                              **as_user)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1, done.stderr
        assert f"{hidden} cannot be read: Permission denied" in lines[0], done.stderr
    finally:
        subprocess.run(["chmod", "-R", "u+rwx", str(work)])
        shutil.rmtree(work, ignore_errors=True)


TWIN_RELEASED = ubatch_branch.RELEASED
TWIN_ANY_BATCH = TWIN_RELEASED.replace("uniform_token_count=uniform_token_count)", "uniform_token_count=None)")


def test_the_released_twin_is_recognised_and_read_as_the_models_rule(tmp_path):
    """The released ``_maybe_ubatch_twin`` leaves the release recognised; run as the reader runs a tree's
    method, it gives the model's twin on every input the reader asks."""
    from contract.runners.mrv2.model.ubatch_utils import ubatch_twin

    assert branch.load(mrv2_tree(tmp_path, twin=TWIN_RELEASED)).release == "0.34.0"
    rows = dict(ubatch_branch.rows("class CudaGraphManager:\n    def _maybe_ubatch_twin(self, desc):\n"
                                   + "".join(f"        {line}\n" for line in TWIN_RELEASED.strip().splitlines()),
                                   "cudagraph_utils.py", lambda: False))
    table = ubatch_branch.checked([[k, v] for k, v in rows.items()], "the released twin")
    assert sum(v is not None for v in rows.values()) > 0
    for u in ubatch_branch.UBATCH_INPUTS:
        for desc in ubatch_branch.DESC_INPUTS:
            assert table(u, desc) == ubatch_twin(u, desc), (u, desc)


def test_an_edited_twin_reaches_the_model_as_a_p7_wrong_result(tmp_path):
    """A twin that keeps no query length serves mixed batches: a new P7 micro-batch class, as the
    mutant ``mrv2_ubatch_twin_any_batch`` and the replay of such a tree show."""
    from contract.core.classes import UBATCH_MIXED, of_records
    from contract.core.graphs import run_script
    from contract.core.modes import FULL
    from contract.core.properties import check
    from contract.core.scenario import Runner, Scenario

    def micro_batched(policy):
        return {sig.what for sig, _ in of_records(run_script(scenario, policy), scenario, Runner.MRV2, check)
                if sig.property == "P7"}

    found = branch.load(mrv2_tree(tmp_path, twin=TWIN_ANY_BATCH))
    assert found.release is None and isinstance(found.policy.ubatch_twin, ubatch_branch.TwinTable)
    scenario = Scenario(runner=Runner.MRV2, ubatching=True, data_parallel_size=2, cudagraph_mode=FULL)
    assert UBATCH_MIXED in micro_batched(found.policy)
    assert not micro_batched(branch.load(mrv2_tree(tmp_path / "r", twin=TWIN_RELEASED), as_policy=True).policy)


def test_a_twin_reading_what_the_model_does_not_have_is_one_line(tmp_path):
    tree = mrv2_tree(tmp_path, twin=TWIN_RELEASED.replace("get_num_ubatches(parallel_config)",
                                                          "parallel_config.num_ubatches * envs.FACTOR"))
    with pytest.raises(Exception, match="_maybe_ubatch_twin reads envs, which --vllm-src does not model"):
        branch.load(tree)
