"""docs/ci.md and .pre-commit-hooks.yaml name commands and options that exist and behave as documented,
trigger on exactly the paths derived from the runner families, and the workflow is a valid GitHub
Actions workflow."""

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from contract.branch import triggers
from contract.families import FAMILIES
from contract.real.installed import installed_releases, release
from contract.runners.mrv1 import branch as mrv1_branch
from contract.cli import app
from contract.plugin import pytest_addoption
from test_vllm_src import NEEDED, SECOND_IF, copy_tree
from vllm_envs import release_source

ROOT = Path(__file__).resolve().parents[1]
HOOKS = (ROOT / ".pre-commit-hooks.yaml").read_text()
DOC = (ROOT / "docs" / "ci.md").read_text()


def _field(name: str) -> str:
    return re.search(rf"^\s*{name}:\s*(.+)$", HOOKS, re.M).group(1).strip()


def test_hook_files_pattern_selects_the_contract_files():
    pattern = re.compile(_field("files"))
    for path in (*mrv1_branch.FILES,
                 "v1/cudagraph_dispatcher.py", "v1/worker/gpu/cudagraph_utils.py",
                 "v1/worker/gpu/spec_decode/eagle/speculator.py"):
        assert pattern.search(f"vllm/{path}"), path
    assert not pattern.search("vllm/model_executor/models/llama.py")
    assert not pattern.search("vllm/v1/worker/gpu_model_runner.pyc")


def test_workflow_and_hook_carry_exactly_the_derived_paths():
    assert triggers.drift(ROOT) == []
    assert _workflow()["on"]["pull_request"]["paths"] == list(triggers.patterns())


def test_drift_is_caught(tmp_path):
    """The control: a path dropped from the workflow, or the hook's pattern narrowed, is drift."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "ci.md").write_text(DOC.replace("      - vllm/v1/worker/gpu/model_runner.py\n", ""))
    (tmp_path / ".pre-commit-hooks.yaml").write_text(HOOKS)
    assert [p for p in triggers.drift(tmp_path) if "ci.md" in p]
    (tmp_path / "docs" / "ci.md").write_text(DOC)
    (tmp_path / ".pre-commit-hooks.yaml").write_text(HOOKS.replace("|config/.*", ""))
    assert [p for p in triggers.drift(tmp_path) if "hooks" in p]


def _covered(path: str) -> bool:
    return any(triggers.covers(p, path) for p in triggers.patterns())


def test_every_replayed_module_and_read_file_is_covered():
    for family in FAMILIES:
        for name in family.replays:
            rel = "/".join(name.split("."))
            path = f"{rel}/__init__.py" if name in triggers.PACKAGES else f"{rel}.py"
            assert _covered(path), (family.name, name)
        for path, function in family.reads:
            assert _covered(f"vllm/{path}"), (family.name, path, function)


def test_every_file_a_replayed_decision_path_cites_is_covered():
    cited = set()
    for report in sorted((ROOT / "reports" / "conformance").glob("*.json")):
        cited |= {w["path"] for w in json.loads(report.read_text())["decision_points"]["where"].values()}
    assert len(cited) > 10
    hook = re.compile(_field("files"))
    for path in sorted(cited):
        assert _covered(f"vllm/{path}"), path
        assert hook.search(f"vllm/{path}"), path


def test_the_hook_pattern_selects_what_the_workflow_paths_select():
    hook = re.compile(_field("files"))
    samples = [p.replace("/**", "/x/y.py") for p in triggers.patterns()]
    samples += ["vllm/config/__init__.py", "vllm/configs.py", "vllm/envs.pyx", "vllm/v1/worker/gpu/states.py",
                "tests/v1/worker/gpu_model_runner.py", "vllm/compilation/fix_functionalization.py"]
    for path in samples:
        assert bool(hook.search(path)) == _covered(path), path


def test_package_names_are_packages_in_the_installed_releases():
    """``triggers.PACKAGES`` says which replayed names are folders; the releases' own trees agree."""
    checked = 0
    for version, pkg in installed_releases():
        for family in FAMILIES:
            if not family.ships(release(version)):
                continue
            for name in family.replays:
                rel = Path(*name.split(".")[1:])
                if name in triggers.PACKAGES:
                    assert (pkg / rel / "__init__.py").is_file(), (version, name)
                else:
                    assert (pkg / rel.with_suffix(".py")).is_file(), (version, name)
                checked += 1
    if not checked:
        pytest.skip("no vLLM release environment to read the trees of")


def _workflow_text() -> str:
    return re.search(r"## GitHub Actions workflow.*?```yaml\n(.*?)```", DOC, re.S).group(1)


def _workflow() -> dict:
    from ruamel.yaml import YAML

    data = YAML(typ="safe").load(_workflow_text())
    return {("on" if k is True else k): v for k, v in data.items()}  # YAML 1.1 reads `on` as true


def _check_jsonschema(path: Path) -> subprocess.CompletedProcess:
    exe = shutil.which("check-jsonschema", path=str(Path(sys.executable).parent)) or shutil.which("check-jsonschema")
    assert exe, "check-jsonschema is not installed (the test extra)"
    return subprocess.run([exe, "--builtin-schema", "vendor.github-workflows", str(path)], capture_output=True,
                          text=True, timeout=120)


def test_the_workflow_is_a_valid_github_actions_workflow(tmp_path):
    path = tmp_path / "cudagraph-contract.yml"
    path.write_text(_workflow_text())
    done = _check_jsonschema(path)
    assert done.returncode == 0, done.stdout + done.stderr
    bad = tmp_path / "bad.yml"  # the control: a job without runs-on, a timeout that is not a number
    bad.write_text(_workflow_text().replace("    runs-on: ubuntu-latest\n", "").replace("timeout-minutes: 45",
                                                                                       "timeout-minutes: soon"))
    assert _check_jsonschema(bad).returncode != 0


def test_the_workflow_is_bounded_read_only_and_checks_mrv2():
    flow = _workflow()
    assert flow["permissions"] == {"contents": "read"}
    job = flow["jobs"]["contract"]
    assert 0 < job["timeout-minutes"] <= 60
    runs = [shlex.split(step["run"].replace("\\\n", " ")) for step in job["steps"] if "run" in step]
    commands = [argv[1:argv.index("||")] if "||" in argv else argv[1:] for argv in runs if argv[0] == "cudagraph-contract"]
    assert ["verify", "--vllm-src", ".", "--runner", "mrv2"] in commands
    assert any(c[:6] == ["conform", "--vllm-src", ".", "--base", "auto", "--runner"] and "mrv2" in c for c in commands)
    assert ["env", "make", "0.34.0"] in commands
    group = typer.main.get_command(app)
    for argv in commands:  # every option the workflow passes exists on its command
        command = group.commands[argv[0]]
        if argv[0] == "env":
            command = command.commands[argv[1]]
        names = {o for p in command.params for o in getattr(p, "opts", [])}
        assert {a for a in argv if a.startswith("--")} <= names, argv


def test_hook_entry_blocks_a_tree_that_adds_a_class(tmp_path, monkeypatch):
    argv = shlex.split(_field("entry"))
    assert argv[0] == "cudagraph-contract"
    # with its _version.py, as a checkout has: without a release environment, base auto takes that release
    tree = copy_tree(release_source("0.30.0"), tmp_path / "elif-branch", files=(*NEEDED, "_version.py"))
    path = tree / "vllm" / mrv1_branch.RUNNER_FILE
    path.write_text(path.read_text().replace(SECOND_IF, SECOND_IF.replace("if (", "elif (")))
    monkeypatch.chdir(tree)
    result = CliRunner().invoke(app, argv[1:] + ["--profile", "dev", "--seed", "0"])
    assert result.exit_code == 1
    assert "--quiet" not in argv
    # a failing hook says why: the new class, with its witness
    assert "1 new, 2 lost graphs, 0 traded, 0 fixed" in result.output, result.output  # elif drops FULL
    assert "new in branch@elif-branch:" in result.output, result.output
    new = result.output.split("new in branch@elif-branch:")[1].split("inherited from")[0]
    assert "P1 target FULL: no capturer" in new and "witness (3 events)" in new, result.output


def test_documented_plugin_options_exist():
    class Group:
        def __init__(self):
            self.names = []

        def addoption(self, name, **kwargs):
            self.names.append(name)

    class Parser:
        group = Group()

        def getgroup(self, *args):
            return self.group

    parser = Parser()
    pytest_addoption(parser)
    documented = set(re.findall(r"--cudagraph-contract-[a-z-]+", DOC))
    assert documented and documented <= set(parser.group.names)
    assert "cudagraph_contract" in (ROOT / "pyproject.toml").read_text()
