"""docs/ci.md and .pre-commit-hooks.yaml name commands and options that exist and behave as documented."""

import re
import shlex
from pathlib import Path

from typer.testing import CliRunner

from contract.runners.mrv1 import branch as mrv1_branch
from contract.cli import app
from contract.plugin import pytest_addoption
from test_vllm_src import SECOND_IF, copy_tree, installed

ROOT = Path(__file__).resolve().parents[1]
HOOKS = (ROOT / ".pre-commit-hooks.yaml").read_text()
DOC = (ROOT / "docs" / "ci.md").read_text()


def _field(name: str) -> str:
    return re.search(rf"^\s*{name}:\s*(.+)$", HOOKS, re.M).group(1).strip()


def test_hook_files_pattern_selects_the_contract_files():
    pattern = re.compile(_field("files"))
    for path in (mrv1_branch.RUNNER_FILE, mrv1_branch.CUDA_GRAPH_FILE, mrv1_branch.BREAKABLE_FILE, mrv1_branch.CONFIG_FILE,
                 "v1/cudagraph_dispatcher.py"):
        assert pattern.search(f"vllm/{path}"), path
    assert not pattern.search("vllm/model_executor/models/llama.py")


def test_hook_entry_blocks_a_tree_that_adds_a_class(tmp_path, monkeypatch):
    argv = shlex.split(_field("entry"))
    assert argv[0] == "cudagraph-contract"
    tree = copy_tree(installed("0.30.0"), tmp_path / "elif-branch")
    path = tree / "vllm" / mrv1_branch.RUNNER_FILE
    path.write_text(path.read_text().replace(SECOND_IF, SECOND_IF.replace("if (", "elif (")))
    monkeypatch.chdir(tree)
    result = CliRunner().invoke(app, argv[1:] + ["--profile", "dev", "--seed", "0"])
    assert result.exit_code == 1 and result.output == ""


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
