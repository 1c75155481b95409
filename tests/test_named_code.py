"""Code a person names (a policy file, a vLLM tree's rules, a release's environment) runs only in a
child process: whatever it does, exiting 0, hanging, forking, printing, returning something else, the
command says so in one line and exits 2; nothing it does is a pass.

Every case runs the entry point (``python -m contract.cli``) in a subprocess: exit code, exactly one
line on stderr, no traceback, no file changed in the output folder, within 60 s. The trees are copies
of the installed releases' files (``.venv-vllm-*``, as in ``tests/test_vllm_src.py``) with one edit.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from contract.runners.mrv1 import branch as mrv1_branch
from contract.runners.mrv2.branch import MAMBA_RELEASED
from vllm_envs import installed, release_source

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "tests" / "traces"
TRACE = TRACES / "v030-nested-full-over-breakable.json"
MARKER = "ran.marker"
LIMIT_S = 60
BLOCK_FIRST = "        cudagraph_mode = self.compilation_config.cudagraph_mode\n"
MRV1_FILES = mrv1_branch.FILES
MUST = "a policy file defines load_model(ctx) returning Stacks(target, drafter)"


def cli(*args) -> list[str]:
    return [sys.executable, "-m", "contract.cli", *map(str, args)]


@dataclass
class Ran:
    code: int
    out: str
    err: str
    seconds: float

    @property
    def error(self) -> str:
        lines = self.err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), self.err
        return lines[0]


def run(*args, env: dict | None = None) -> Ran:
    started = time.monotonic()
    proc = subprocess.run(cli(*args), cwd=ROOT, capture_output=True, text=True, timeout=LIMIT_S + 60,
                          env={**os.environ, **(env or {})})
    return Ran(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - started)


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else "folder"
            for p in sorted(folder.rglob("*"))}


def old_out(folder: Path) -> Path:
    out = folder / "out"
    out.mkdir()
    (out / "README.md").write_text("earlier report\n")
    (out / "vllm_0_30-P1.json").write_text(TRACE.read_text())
    return out


def refused(tmp_path: Path, argv: list, needle: str) -> Ran:
    """The command refuses in one line with exit 2, quickly, and changes no file."""
    before = snapshot(tmp_path)
    ran = run(*argv)
    assert ran.code == 2, (ran.code, ran.out[-2000:], ran.err[-2000:])
    assert "Traceback" not in ran.out + ran.err
    assert needle in ran.error, ran.error
    assert snapshot(tmp_path) == before, "a file changed, appeared or vanished"
    assert ran.seconds < LIMIT_S, ran.seconds
    return ran


def policy(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    return path


ZERO = "import os\nos._exit(0)\n"
POLICIES = {
    # name: (file text, the message's needle)
    "os._exit(0) at import": (ZERO, "exited with status 0 before reporting a result"),
    "os._exit(0) inside load_model": ("import os\ndef load_model(ctx):\n    os._exit(0)\n",
                                      "exited with status 0 before reporting a result"),
    "a fork at import": ("import os\nos.fork()\nprint('table')\nopen({marker!r}, 'a').write('x')\n"
                         "from contract.runners.mrv1.model.policies.vllm_0_30 import load_model\n",
                         "forked a process at import"),
    "a fork inside load_model": ("import os\nfrom contract.runners.mrv1.model.policies.vllm_0_30 import load_model as "
                                 "lm\ndef load_model(ctx):\n    os.fork()\n    return lm(ctx)\n",
                                 "load_model forked a process"),
    "while True at import": ("while True:\n    pass\n", "did not finish within 3 s"),
    "while True inside load_model": ("def load_model(ctx):\n    while True:\n        pass\n",
                                     "did not finish within 3 s"),
    "load_model returns None": ("def load_model(ctx):\n    return None\n", "returned None, not Stacks"),
    "load_model returns a string": ("def load_model(ctx):\n    return 'CUDAGraphWrapper(FULL)'\n",
                                    "returned a str, not Stacks"),
    "load_model returns a bare wrapper": ("from contract.api import *\ndef load_model(ctx):\n"
                                          "    return CUDAGraphWrapper(ctx.model, runtime_mode=FULL)\n",
                                          "returned a CUDAGraphWrapper, not Stacks"),
    "load_model(ctx, extra)": ("def load_model(ctx, extra):\n    return None\n",
                               "load_model(ctx, extra) cannot be called as load_model(ctx)"),
    "a 10,000-deep recursion": ("def down(n):\n    return down(n - 1) if n else None\n"
                                "def load_model(ctx):\n    return down(10_000)\n",
                                "raised RecursionError"),
    "a stack 10,000 wrappers deep": ("from contract.api import *\ndef load_model(ctx):\n    model = ctx.model\n"
                                     "    for _ in range(10_000):\n"
                                     "        model = CUDAGraphWrapper(model, runtime_mode=FULL)\n"
                                     "    return Stacks(model, ctx.drafter_model)\n",
                                     "a target stack more than 16 wrappers deep"),
    "a wrapper cycle": ("from contract.api import *\ndef load_model(ctx):\n"
                        "    w = CUDAGraphWrapper(ctx.model, runtime_mode=FULL)\n"
                        "    object.__setattr__(w, 'runnable', w)\n    return Stacks(w, ctx.drafter_model)\n",
                        "a target stack that is a cycle"),
    "a stack ending at another model": ("from contract.api import *\ndef load_model(ctx):\n"
                                        "    return Stacks(RawModel('other'), ctx.drafter_model)\n",
                                        "a target stack ending at RawModel('other'), not at ctx.model"),
    "sys.exit(0) at import": ("import sys\nsys.exit(0)\n", "failed to import: SystemExit: 0"),
    "killed by a signal": ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n", "was killed by SIGKILL"),
}


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_a_policy_file_is_one_line_and_exit_2(name, tmp_path):
    text, needle = POLICIES[name]
    marker = tmp_path.parent / f"{tmp_path.name}-{MARKER}"  # outside the folder compared
    path = policy(tmp_path, "bad.py", text.replace("{marker!r}", repr(str(marker))))
    ran = refused(tmp_path, ["verify", "--policy", path, "--out", old_out(tmp_path), "--timeout", "3"], needle)
    assert f"policy file {path}" in ran.error and MUST in ran.error
    assert ran.out == ""  # nothing the file printed reached the tool's stdout
    if "fork" in name and "import" in name:
        assert marker.read_text() == "x"  # the fork's copy ended before the rest of the import


def test_a_policy_printing_at_import_keeps_json_valid(tmp_path):
    path = policy(tmp_path, "printer.py", "print('hello from the policy')\n"
                  "from contract.runners.mrv1.model.policies.vllm_0_30 import load_model\n")
    ran = run("explore", "--policy", path, "--depth", "2", "--json")
    assert ran.code in (0, 1) and "Traceback" not in ran.err, ran.err
    assert list(json.loads(ran.out)) == ["printer"]


def test_a_policy_file_runs_as_its_built_in_twin(tmp_path):
    """The control: a copy of a built-in policy, read through its table, explores as the built-in."""
    from contract.core.explore import explore
    from contract.families import load_policy

    twin = policy(tmp_path, "twin.py", (ROOT / "contract/runners/mrv1/model/policies/vllm_0_29.py").read_text())
    mine, built_in = explore(load_policy(str(twin)), 8), explore(load_policy("vllm_0_29"), 8)
    assert (mine.states, mine.transitions) == (built_in.states, built_in.transitions)
    for pid in mine.counterexamples:
        assert mine.counterexamples[pid].events == built_in.counterexamples[pid].events


def test_the_same_name_twice_is_refused_before_any_file_runs(tmp_path):
    marker = tmp_path / MARKER
    body = f"open({str(marker)!r}, 'w').write('ran')\nfrom contract.runners.mrv1.model.policies.vllm_0_30 import *\n"
    twin = policy(tmp_path, "vllm_0_30.py", body)
    ran = refused(tmp_path, ["explore", "--policy", "vllm_0_30", "--policy", twin, "--json"],
                  f"policy file {twin} has the name of the built-in policy vllm_0_30; rename the file or pass only "
                  "one of them")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, b = policy(tmp_path / "a", "mine.py", body), policy(tmp_path / "b", "mine.py", body)
    refused(tmp_path, ["verify", "--policy", a, "--policy", b], f"policy file {a} and policy file {b} have the same name mine")
    assert not marker.exists() and ran.out == ""


# -- the parent killed while the child runs ------------------------------------------------------

def gone(pid: int) -> bool:
    """No such process (``os.kill(pid, 0)``), or a zombie not yet reaped, which runs nothing."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def pid_from(path: Path, seconds: float = 30) -> int:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return int(path.read_text())
        time.sleep(0.05)
    raise AssertionError(f"{path} was never written")


def killed_parent_takes_the_child(argv: list, pidfile: Path, sig: signal.Signals) -> None:
    """... and a command ended by SIGTERM leaves nothing in the temporary folder either."""
    temporary = pidfile.parent / "tmp"
    temporary.mkdir()
    parent = subprocess.Popen(cli(*argv), cwd=ROOT, env=dict(os.environ, TMPDIR=str(temporary)),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        pid = pid_from(pidfile)
        assert not gone(pid)
        parent.send_signal(sig)
        parent.wait(timeout=30)
        deadline = time.monotonic() + 5
        while not gone(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gone(pid), f"the child {pid} outlived its parent killed by {sig.name}"
        if sig != signal.SIGKILL:
            assert not list(temporary.iterdir()), f"a command ended by {sig.name} left its child's folder"
    finally:
        parent.kill()
        parent.wait()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_killed_command_takes_the_policy_files_child(tmp_path, sig):
    pidfile = tmp_path / "pid"
    path = policy(tmp_path, "hangs.py", f"import os\nopen({str(pidfile)!r}, 'w').write(str(os.getpid()))\n"
                                        "while True:\n    pass\n")
    killed_parent_takes_the_child(["explore", "--policy", path, "--timeout", "120"], pidfile, sig)


# -- a vLLM tree's rules ---------------------------------------------------------------------------

def mrv1_tree(folder: Path, statement: str) -> Path:
    """0.30.0's files with ``statement`` put first in ``load_model``'s wrapping block."""
    pkg = release_source("0.30.0")
    for rel in MRV1_FILES:
        (folder / "tree" / "vllm" / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(pkg / rel, folder / "tree" / "vllm" / rel)
    runner = folder / "tree" / "vllm" / MRV1_FILES[0]
    source = runner.read_text()
    assert source.count(BLOCK_FIRST) == 1
    runner.write_text(source.replace(BLOCK_FIRST, BLOCK_FIRST + f"        {statement}\n"))
    return folder / "tree"


def mrv2_tree(folder: Path, use_breakable_cg: str) -> Path:
    """A tree holding 0.34.0's MRV2 rules, the first replaced (as ``tests/test_vllm_src_mrv2.py``)."""
    gpu = folder / "tree" / "vllm" / "v1" / "worker" / "gpu"
    gpu.mkdir(parents=True)
    (gpu / "cudagraph_utils.py").write_text(
        "class CudaGraphManager:\n    def __init__(self, vllm_config, device, cudagraph_mode, decode_query_lens):\n"
        f"        self.use_breakable_cg = {use_breakable_cg}\n")
    (gpu / "model_runner.py").write_text(
        "class GPUModelRunner:\n    def initialize_kv_cache(self, kv_cache_config, is_profiling=False):\n"
        "        piecewise_capture_available = bool(is_breakable_cudagraph_enabled(self.vllm_config.compilation_config)"
        " or has_compiled_submodule(self.model))\n")
    (folder / "tree" / "vllm" / "config").mkdir()
    (folder / "tree" / "vllm" / "config" / "compilation.py").write_text(
        "class CompilationConfig:\n"
        "    def resolve_cudagraph_mode_and_sizes(self, kv_cache_config=None, max_num_reqs=None, is_profiling=False):\n"
        f"        if {MAMBA_RELEASED}:\n            raise ValueError('max_num_seqs exceeds available Mamba cache blocks')\n")
    return folder / "tree"


EXIT_0 = "__import__('os')._exit(0)"
FOREVER = "while True: pass"
TREE_CASES = {
    "verify: block with os._exit(0)": (lambda t: ["verify", "--vllm-src", mrv1_tree(t, EXIT_0), "--out", old_out(t)],
                                       "exited with status 0 before reporting a result"),
    "verify: block with while True": (lambda t: ["verify", "--vllm-src", mrv1_tree(t, FOREVER), "--timeout", "3"],
                                      "did not finish within 3 s"),
    "verify: block that forks": (lambda t: ["verify", "--vllm-src", mrv1_tree(t, "__import__('os').fork()")],
                                 "forked a process"),
    "conform: block with os._exit(0)": (
        lambda t: ["conform", "--vllm-src", mrv1_tree(t, EXIT_0), "--base", "0.30.0", "--traces", TRACE,
                   "--reports", old_out(t)], "exited with status 0 before reporting a result"),
    "conform: block with while True": (
        lambda t: ["conform", "--vllm-src", mrv1_tree(t, FOREVER), "--base", "0.30.0", "--traces", TRACE,
                   "--reports", old_out(t), "--timeout", "5"], "did not finish within 5 s"),
    "verify: MRV2 rule with os._exit(0)": (
        lambda t: ["verify", "--vllm-src", mrv2_tree(t, f"{EXIT_0} or True"), "--base", "mrv2_0_34"],
        "exited with status 0 before reporting a result"),
    "verify: MRV2 rule that never ends": (
        lambda t: ["verify", "--vllm-src", mrv2_tree(t, "any(iter(int, 1))"), "--base", "mrv2_0_34", "--timeout", "3"],
        "did not finish within 3 s"),
    "verify: MRV2 rule that raises": (
        lambda t: ["verify", "--vllm-src", mrv2_tree(t, "1 / 0"), "--base", "mrv2_0_34"],
        "use_breakable_cg = ... raised ZeroDivisionError"),
}


# conform runs a Model Runner V1 tree over 0.30.0's environment: make evidence's, which CI runs after make test
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.evidence if n.startswith("conform:") else ())
                                  for n in sorted(TREE_CASES)])
def test_a_trees_code_is_one_line_and_exit_2(name, tmp_path):
    build, needle = TREE_CASES[name]
    refused(tmp_path, build(tmp_path), needle)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_killed_command_takes_the_trees_child(tmp_path, sig):
    pidfile = tmp_path / "pid"
    tree = mrv1_tree(tmp_path, f"open({str(pidfile)!r}, 'w').write(str(__import__('os').getpid()))\n        {FOREVER}")
    killed_parent_takes_the_child(["verify", "--vllm-src", tree, "--timeout", "120"], pidfile, sig)


# -- conform re-run under a release's interpreter ----------------------------------------------------

def fake_python(folder: Path, body: str) -> Path:
    path = folder / "python"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def test_conform_under_an_interpreter_that_exits_0_is_no_pass(tmp_path):
    python = fake_python(tmp_path, "exit 0\n")
    refused(tmp_path, ["conform", "--vllm", python, "--traces", TRACE, "--reports", old_out(tmp_path)],
            "exited with status 0 before reporting a result")


def test_conform_under_an_interpreter_that_hangs_stops_at_the_timeout(tmp_path):
    python = fake_python(tmp_path, "exec sleep 600\n")
    refused(tmp_path, ["conform", "--vllm", python, "--traces", TRACE, "--reports", old_out(tmp_path),
                       "--timeout", "2"], "did not finish within 2 s")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_killed_conform_takes_the_release_child(tmp_path, sig):
    pidfile = tmp_path / "pid"
    python = fake_python(tmp_path, f"echo $$ > {pidfile}\nexec sleep 600\n")
    killed_parent_takes_the_child(["conform", "--vllm", python, "--traces", TRACE, "--reports", tmp_path / "r"],
                                  pidfile, sig)


def test_conform_decides_its_exit_from_the_childs_summary(tmp_path):
    """A real replay under 0.34.0's interpreter: the parent prints the summary the child returned, and
    the exit code follows it (0: every step agrees; 1: 0.33.0's model, the negative control, disagrees
    on its own witness)."""
    installed("0.34.0")
    agree = run("conform", "--vllm", "0.34.0", "--traces", TRACES / "mrv2-0.34-l1-compiled-under-full-then-upgraded.json",
                "--reports", tmp_path / "a", "--json")
    assert agree.code == 0, agree.err[-2000:]
    summary = json.loads(agree.out)
    assert summary["vllm"] == "0.34.0" and summary["steps"] == summary["agreeing_steps"] > 0
    assert Path(summary["report"]).is_file()
    differ = run("conform", "--vllm", "0.34.0", "--traces", TRACES / "mrv2-0.33-l1-compiled-under-full-then-upgraded.json",
                 "--reports", tmp_path / "b", "--policy", "mrv2_0_33")
    assert differ.code == 1, differ.err[-2000:]
    assert "disagreement: " in differ.out and "compared with policy mrv2_0_33" in differ.out


# -- a closed stdout ------------------------------------------------------------------------------------

@pytest.mark.parametrize("reader", ["head -c 10", "head -c 0"])
def test_replay_into_head_is_no_disagreement(tmp_path, reader):
    """`replay T | head -c 10` through a shell pipe: 0 or 141 (SIGPIPE's), never 1, and no traceback.
    Whether ``head -c 10`` is gone before the last write is a race, so it runs three times; ``head -c 0``
    is gone before the first write every time (before the change both ended 1)."""
    command = " ".join(cli("replay", TRACE))
    script = "set -o pipefail; " + "".join(f"{command} 2>>{tmp_path / 'err'} | {reader} >/dev/null; echo $?; "
                                           for _ in range(3))
    proc = subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=LIMIT_S)
    err = (tmp_path / "err").read_text()
    codes = proc.stdout.split()
    assert len(codes) == 3 and set(codes) <= {"0", "141"} and err == "", (codes, err)


@pytest.mark.parametrize("argv", [["replay", TRACE], ["replay", TRACE, "--json"],
                                  ["explore", "--policy", "vllm_0_30", "--depth", "2", "--json"],
                                  ["explore", "--policy", "vllm_0_30", "--depth", "2"]])
def test_a_reader_gone_before_the_output_is_141(argv):
    proc = subprocess.Popen(cli(*argv), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before anything is written
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.wait(timeout=LIMIT_S) == 141 and err == "", err


def test_conform_refuses_a_summary_that_does_not_answer_its_request(tmp_path):
    """The child's summary names the release, runner and policy it ran: one asked for another is refused."""
    from contract.cli.conform import ConformProblem, _checked

    report = tmp_path / "report.md"
    report.write_text("")
    counts = dict.fromkeys(("trace_files", "not_replayed_mrv2", "not_replayed_other", "generated_traces", "steps",
                            "agreeing_steps", "disagreeing_traces"), 0)
    summary = {**counts, "disagreements": [], "vllm": "0.34.0", "policy": "mrv2_0_34", "report": str(report),
               "load_model_block": {}}
    asked = {"runner": "auto", "policy": None}
    assert _checked({"runner": "mrv2", "summary": summary}, tmp_path, asked, "0.34.0")
    for value, request, version, needle in [
            (summary | {"vllm": "0.33.0"}, asked, "0.34.0", "not of vLLM 0.34.0"),
            (summary, asked | {"policy": "mrv2_0_33"}, "0.34.0", "not --policy mrv2_0_33"),
            (summary, asked | {"runner": "mrv1"}, "0.34.0", "not of --runner mrv1")]:
        with pytest.raises(ConformProblem, match=needle):
            _checked({"runner": "mrv2", "summary": value}, tmp_path, request, version)
