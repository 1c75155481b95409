"""``verify --vllm-src`` compares a tree with the release it starts from (``--base auto``): an
edited copy with the pre-#56312 ``elif`` restored exits 1 and names what it adds; an unedited copy
exits 0 with nothing new. The trees are copies of ``.venv-vllm-0.30.0``'s files (0.33.0's wrapping
block is 0.30.0's, ``contract/runners/mrv1/real/wrapping.py``)."""

from typer.testing import CliRunner

from contract.runners.mrv1 import branch as mrv1_branch
from contract.cli import app
from test_vllm_src import SECOND_IF, copy_tree, installed

runner = CliRunner()


def elif_tree(tmp_path):
    tree = copy_tree(installed("0.30.0"), tmp_path / "elif-branch")
    path = tree / "vllm" / mrv1_branch.RUNNER_FILE
    path.write_text(path.read_text().replace(SECOND_IF, SECOND_IF.replace("if (", "elif (")))
    return tree


def test_elif_restored_exits_1_and_names_the_new_classes(tmp_path):
    result = runner.invoke(app, ["verify", "--vllm-src", str(elif_tree(tmp_path)), "--profile", "dev", "--seed", "0"])
    assert result.exit_code == 1, result.output
    assert "base auto: vLLM 0.30.0 (Model Runner V1, policy vllm_0_30)" in result.output  # which base, and why
    assert "new in branch@elif-branch" in result.output
    assert "P1 target FULL: no capturer, under breakable on" in result.output


def test_unedited_copy_exits_0_with_nothing_new(tmp_path):
    tree = copy_tree(installed("0.30.0"), tmp_path / "same")
    result = runner.invoke(app, ["verify", "--vllm-src", str(tree), "--profile", "dev", "--seed", "0"])
    assert result.exit_code == 0, result.output
    assert "base auto: vLLM 0.30.0" in result.output
    assert "nothing new" in result.output
