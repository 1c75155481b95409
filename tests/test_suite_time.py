"""``benchmarks/suite_time.py``: the last ``--durations=0`` table of a log summed by file; a log without
one is refused."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "suite_time.py"
LOG = """\
============================= slowest durations ==============================
9.00s call     tests/test_cli.py::test_from_the_lowest_version_run
114 passed in 35.07s
============================= slowest durations ==============================
108.50s setup    tests/test_branch_review.py::test_an_edit[0.34.0-model_runner]@branch-review
41.00s call     tests/test_conformance_mrv2.py::test_every_mrv2_step_agrees_with_real_vllm[0.34.0]
1.50s call     tests/test_branch_review.py::test_branch_runs_leave_the_checkout_as_it_was
(1728 durations < 0.005s hidden.  Use -vv to show these durations.)
"""


def run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=60)


def test_sums_the_last_table_by_file_largest_first(tmp_path):
    (tmp_path / "log").write_text(LOG)
    done = run(tmp_path / "log", "--top", "1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("151 s in 3 timed phases, 2 files")
    rows = [line for line in done.stdout.splitlines() if line.startswith("| tests/")]
    assert rows[:2] == ["| tests/test_branch_review.py | 110.0 |", "| tests/test_conformance_mrv2.py | 41.0 |"]
    assert rows[2] == "| tests/test_branch_review.py::test_an_edit[0.34.0-model_runner]@branch-review | setup | 108.5 |"
    assert len(rows) == 3


def test_a_log_without_durations_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "log").write_text("3 passed in 1.00s\n")
    for path in (tmp_path / "log", tmp_path / "missing"):
        done = run(path)
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert not done.stdout
