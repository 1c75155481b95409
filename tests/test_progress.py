"""Long runs say what they are doing on stderr, never on stdout: a progress bar when stderr is a
terminal, a line a minute otherwise (``CUDAGRAPH_CONTRACT_HEARTBEAT_S`` shortens the minute here),
nothing with ``--quiet``; a child process in a release's environment reports through its parent.
The replay of one trace prints a summary and at most 40 steps unless ``--all``."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from contract.cli import progress as cli_progress
from contract.core import child, progress

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
# depth 4 keeps it short; its verdicts differ from the expected ones (exit 1), which is not the point here
EXPLORE = [PYTHON, "-m", "contract.cli", "explore", "--policy", "vllm_0_30", "--policy", "pr56312_draft", "--depth", "4"]
HEARTBEAT = re.compile(r"^explore: (\d) of 2 policies, \d+ s$")


def run(argv, heartbeat: float | None = 0.3, **kwargs) -> subprocess.CompletedProcess:
    env = dict(os.environ, VLLM_LOGGING_LEVEL="ERROR")
    if heartbeat is not None:
        env["CUDAGRAPH_CONTRACT_HEARTBEAT_S"] = str(heartbeat)
    return subprocess.run([str(a) for a in argv], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=kwargs.pop("timeout", 300), **kwargs)


def test_heartbeat_lines_on_stderr_when_it_is_not_a_terminal():
    proc = run([*EXPLORE, "--json"])
    assert proc.returncode in (0, 1), proc.stderr
    json.loads(proc.stdout)  # stdout is the JSON alone
    beats = [HEARTBEAT.match(line) for line in proc.stderr.splitlines()]
    assert beats and all(beats), proc.stderr
    assert {m.group(1) for m in beats} >= {"0", "1"}, proc.stderr  # the count moves


def test_the_default_heartbeat_is_a_minute():
    """Without the test's setting a short run prints nothing: one line a minute."""
    proc = run([*EXPLORE, "--json"], heartbeat=None)
    assert proc.returncode in (0, 1) and proc.stderr == "", proc.stderr
    assert cli_progress.HEARTBEAT_S == 60


def test_quiet_prints_nothing():
    proc = run([*EXPLORE, "--quiet"])
    assert proc.returncode in (0, 1) and proc.stdout == "" and proc.stderr == ""


def test_a_progress_bar_when_stderr_is_a_terminal():
    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen(EXPLORE + ["--json"], cwd=ROOT, stdout=subprocess.PIPE, stderr=follower,
                                env=dict(os.environ, COLUMNS="100"))
        os.close(follower)
        drawn = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            drawn += chunk
        stdout, _ = proc.communicate(timeout=120)
    finally:
        os.close(leader)
    assert proc.returncode in (0, 1)
    json.loads(stdout)
    text = drawn.decode("utf-8", "replace")
    assert "explore: policies" in text and re.search(r"[0-2]/2", text), text[-2000:]
    assert b"explore: policies" not in stdout


def test_heartbeat_line():
    state = cli_progress._State("verify")
    state.started -= 120.4
    state.unit, state.total, state.done = "policies", 5, 3
    assert state.line() == "verify: 3 of 5 policies, 2 min 0 s"
    state.what, state.unit, state.total, state.done = "vLLM 0.34.0", "traces", None, 1204
    assert state.line().startswith("verify: vLLM 0.34.0: 1,204 traces, 2 min 0 s")
    state.unit = ""
    assert state.line() == "verify: vLLM 0.34.0, 2 min 0 s"
    assert [cli_progress.duration(s) for s in (0, 59, 60, 3599, 3600 * 2 + 61)] == [
        "0 s", "59 s", "1 min 0 s", "59 min 59 s", "2 h 1 min"]


def test_a_heartbeat_that_spoke_ends_with_where_the_run_got_to(capsys):
    """Stages that arrive between two beats (a relayed child's last count) still reach the log;
    a run too short for one beat stays silent."""
    beat = cli_progress.Heartbeat("conform", every=0.05)
    time.sleep(0.3)
    beat.stage("trace files", 18, "vLLM 0.30.0")
    beat.advance(18)
    beat.close()
    assert capsys.readouterr().err.splitlines()[-1] == "conform: vLLM 0.30.0: 18 of 18 trace files, 0 s"
    quiet = cli_progress.Heartbeat("conform", every=60)
    quiet.stage("trace files", 18, "")
    quiet.close()
    assert capsys.readouterr().err == ""


class Recorder(progress.Reporter):
    def __init__(self):
        self.events = []

    def stage(self, unit, total, what):
        self.events.append(("stage", unit, total, what))

    def advance(self, n):
        self.events.append(("advance", n))


def test_a_childs_stages_reach_the_parents_reporter():
    """Through a file in the call's own folder, which goes with the call."""
    recorder = Recorder()
    with progress.reporting(recorder):
        path = child.run("tests.child_targets:progressing", {"n": 30, "sleep": 0.05}, what="the probe",
                         progress=True).value
    assert path and not os.path.exists(path) and not os.path.exists(os.path.dirname(path))
    assert recorder.events[0] == ("stage", "traces", 30, "the probe")
    advanced = [e[1] for e in recorder.events if e[0] == "advance"]
    assert sum(advanced) == 30 and len(advanced) > 1, recorder.events  # counted while it ran, and to the end


def test_without_a_reporter_nothing_is_relayed_or_shown(capsys, tmp_path):
    with progress.relayed(str(tmp_path)) as env:
        assert env == {}
    progress.stage("traces", 3)
    progress.advance()
    assert capsys.readouterr() == ("", "")


# -- conform and the branch replay, in a release's environment --------------------------------------------


@pytest.mark.evidence  # Model Runner V1 on 0.30.0: make evidence's, which CI runs after make test
def test_conform_reports_its_traces_and_publishes_its_files(tmp_path):
    from vllm_envs import require_python

    require_python("0.30.0")
    reports = tmp_path / "reports"
    (reports / "conformance").mkdir(parents=True)
    other = ROOT / "reports" / "conformance" / "vllm-0.29.0.json"  # another release's: kept, and in findings.md
    (reports / "conformance" / other.name).write_bytes(other.read_bytes())
    (reports / "benchmarks.md").write_text("not conform's\n")
    traces = sorted((ROOT / "tests" / "traces").glob("*.json"))
    proc = run([PYTHON, "-m", "contract.cli", "conform", "--vllm", "0.30.0", "--traces", ROOT / "tests" / "traces",
                "--corpus", "none", "--reports", reports, "--json"], heartbeat=0.1, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["trace_files"] == len(traces)
    lines = proc.stderr.splitlines()
    counted = rf"^conform: vLLM 0\.30\.0: \d+ of {len(traces)} trace files, \d+ s$"
    assert any(re.match(counted, line) for line in lines), lines
    # before vLLM's code starts, the line says only how long (vLLM's own error lines pass through)
    assert any(re.match(r"^conform, \d+ s$", line) for line in lines), lines
    assert sorted(str(p.relative_to(reports)) for p in reports.rglob("*")) == [
        "benchmarks.md", "conformance", "conformance/README.md", "conformance/vllm-0.29.0.json",
        "conformance/vllm-0.30.0.json", "conformance/vllm-0.30.0.md", "findings.md", "root-causes",
        *sorted(f"root-causes/{p.parent.name}.md" for p in (ROOT / "fixes").glob("*/fix.json"))]
    assert [p.name for p in tmp_path.iterdir()] == ["reports"]
    findings = (reports / "findings.md").read_text()  # written from the JSON of the same publication
    assert "on vLLM 0.29.0 (MRV1)" in findings and "on vLLM 0.30.0 (MRV1)" in findings


def test_the_branch_replay_reports_through_its_parent_and_publishes_its_folder(tmp_path):
    from test_conformance_mrv2 import BREAKABLE_SWITCH, edited_tree, traces_dir

    tree = edited_tree(tmp_path / "a", BREAKABLE_SWITCH, "")
    reports = tmp_path / "out" / "branch"
    proc = run([ROOT / ".venv" / "bin" / "python", "-m", "contract.cli", "conform", "--vllm-src", tree, "--traces",
                traces_dir(tmp_path), "--reports", reports, "--json"], heartbeat=0.2, timeout=900)
    assert proc.stdout.strip(), proc.stderr[-2000:]
    json.loads(proc.stdout)
    beats = [line for line in proc.stderr.splitlines() if line.startswith("conform: the replay of")]
    # the stage and its total come from the child replaying in vLLM 0.34.0's environment (the three
    # traces may all replay between two beats on a loaded machine, so the count may still read 0)
    assert any(re.match(rf"^conform: the replay of {re.escape(str(tree))}: [0-3] of 3 traces, \d+ s$", line)
               for line in beats), proc.stderr[-3000:]
    assert (reports / "README.md").is_file() and (reports / "branch.json").is_file()
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["branch"]


# -- replay -----------------------------------------------------------------------------------------------


def long_trace(folder: Path, target_bytes: int) -> tuple[Path, int]:
    """A regression trace's start-up followed by serving steps, up to ``target_bytes`` of JSON."""
    data = json.loads((ROOT / "tests" / "traces" / "lead2-compiled-under-full-then-upgraded.json").read_text())
    events = [e for e in data["events"] if e["event"] != "execute_model"]
    step = {"event": "execute_model", "num_tokens": 1}
    per_event = len(json.dumps(step)) + 2
    n = (target_bytes - len(json.dumps(data))) // per_event
    events += [{"event": "execute_model", "num_tokens": 1 + i % 8} for i in range(n)]
    data.update(events=events, expected={"violations": [], "steps": []})
    path = folder / "long.json"
    path.write_text(json.dumps(data))
    assert path.stat().st_size <= target_bytes
    return path, len(events)


def replay(*args, timeout=300) -> subprocess.CompletedProcess:
    return run([PYTHON, "-m", "contract.cli", "replay", *args], heartbeat=None, timeout=timeout)


def test_replay_prints_a_summary_and_at_most_forty_steps(tmp_path):
    path, events = long_trace(tmp_path, 200_000)
    short = replay(path)
    assert short.returncode == 1  # the recorded violations (none) differ
    rows = re.findall(r"^│ +(\d+) │", short.stdout, re.M)
    assert len(rows) == 40 and rows[0] == "0" and rows[-1] == str(events - 1), rows
    summary = next(line for line in short.stdout.splitlines() if line.startswith(str(path)))
    assert f"{events:,} steps under vllm_0_30" in summary and "violations (P1 " in summary
    assert "40 steps shown above, --all shows every step" in summary
    assert "mismatch: the violations differ from the recorded ones" in short.stdout
    assert "steps not shown" in short.stdout
    every = replay(path, "--all")
    assert len(re.findall(r"^│ +(\d+) │", every.stdout, re.M)) == events
    data = json.loads(replay(path, "--json").stdout)  # --json keeps every step
    assert len(data["steps"]) == events and data["violations"]


def test_replay_of_a_short_trace_shows_every_step():
    trace = ROOT / "tests" / "traces" / "lead3-drafter-capture-outside-window.json"
    proc = replay(trace)
    assert proc.returncode == 0
    assert re.findall(r"^│ +(\d+) │", proc.stdout, re.M) == ["0", "1", "2", "3", "4"]
    assert f"{trace}: 5 steps under vllm_0_30; 2 violations (P0 1, P4 1) at 1 step, the first at step 4" in proc.stdout
    assert "replay matches the recorded observations" in proc.stdout and "not shown" not in proc.stdout


def test_replay_of_the_largest_trace_finishes(tmp_path):
    """4 MiB, the loader's limit: about 93,000 events."""
    from contract.core.trace import MAX_TRACE_BYTES

    path, events = long_trace(tmp_path, MAX_TRACE_BYTES)
    started = time.monotonic()
    proc = replay(path, timeout=240)
    seconds = time.monotonic() - started
    assert proc.returncode == 1 and f"{events:,} steps" in proc.stdout, proc.stderr
    assert len(proc.stdout.splitlines()) < 400 and events > 90_000
    assert seconds < 120, seconds
