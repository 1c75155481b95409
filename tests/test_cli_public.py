"""The command line on typer's and click's public API: ``--version``, ``-h``, plain option types and
defaults in help, usage errors in one line, and a reader that closes standard output early. Run once
more by ``make test`` with the lowest versions ``pyproject.toml`` allows (``.venv-lowest``)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from contract.cli import main

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "tests" / "traces" / "lead3-drafter-capture-outside-window.json"
COMMANDS = ("verify", "replay", "explore", "report", "conform", "fix-check", "bugs", "env", "env make", "env list", "env path")


class Done:
    def __init__(self, returncode: int, stdout: str, stderr: str):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


@pytest.fixture
def cli(capsys, monkeypatch):
    """The entry point in this process (``contract.cli.main``), as a shell would call it."""
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setenv("TERM", "dumb")

    def run(*args, cwd=None) -> Done:
        if cwd is not None:
            monkeypatch.chdir(cwd)
        capsys.readouterr()
        with pytest.raises(SystemExit) as stop:
            main([str(a) for a in args])
        captured = capsys.readouterr()
        return Done(stop.value.code, captured.out, captured.err)
    return run


def test_version(cli):
    import importlib.metadata

    done = cli("--version")
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout == f"cudagraph-contract {importlib.metadata.version('cudagraph-contract')}\n"


@pytest.mark.parametrize("command", ("",) + COMMANDS)
def test_short_help_is_the_help(command, cli):
    argv = command.split()
    short, long = cli(*argv, "-h"), cli(*argv, "--help")
    assert short.returncode == long.returncode == 0, short.stderr
    assert short.stdout == long.stdout and "Usage" in short.stdout


@pytest.mark.parametrize("command", COMMANDS)
def test_help_shows_option_types_plainly_and_no_absolute_default(command, tmp_path, cli):
    out = cli(*command.split(), "--help", cwd=tmp_path).stdout
    assert not re.search(r"<(str|int|float|bool|path|list\[.*?\])>\s", out.split("Options")[-1]), out
    assert "[default: /" not in out and "site-packages" not in out, out


def test_option_types_are_named_as_click_names_them(cli):
    out = cli("conform", "--help").stdout
    for option, kind in (("--reports", "PATH"), ("--vllm", "TEXT"), ("--timeout", "FLOAT"), ("--traces", "PATH")):
        assert re.search(rf"{option}\s+{kind}\b", out), (option, out)
    assert re.search(r"--depth\s+INTEGER\b", cli("explore", "--help").stdout)
    assert re.search(r"--json\s+Print", out), out  # a flag has no type
    assert "(the checkout's reports/)" in out


@pytest.mark.parametrize("argv, needle", [
    (["verfy"], "No such command 'verfy'"),
    (["env", "mk"], "No such command 'mk'"),
    (["explore", "--depth", "0"], "Invalid value for '--depth'"),
    (["verify", "--seed", "seven"], "Invalid value for '--seed'"),
    (["verify", "--no-such-option"], "--no-such-option"),
    (["replay"], "Missing argument"),
    (["env", "make"], "Missing argument"),
])
def test_usage_errors_are_one_line_and_exit_2(argv, needle, cli):
    done = cli(*argv)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], done.stderr
    assert done.stdout == ""


def test_no_arguments_prints_the_help_and_exits_2(cli):
    done = cli()
    assert done.returncode == 2 and "Usage" in done.stdout and "Traceback" not in done.stderr


def test_the_package_uses_no_private_typer_or_click_module():
    for path in (ROOT / "contract").rglob("*.py"):
        text = path.read_text()
        assert "typer._" not in text and "click._" not in text, path


CLOSED = [
    ["replay", TRACE],
    ["replay", TRACE, "--json"],
    ["verify", "--policy", "vllm_0_30", "--profile", "dev", "--json"],  # the Hypothesis machine runs
    ["explore", "--policy", "vllm_0_30", "--depth", "4"],
    ["--help"],
    ["--version"],
    ["env", "list"],
]


@pytest.mark.parametrize("argv", CLOSED, ids=lambda a: " ".join(map(str, a[:2])))
def test_a_closed_stdout_is_not_a_counterexample(argv):
    """Through a real pipe whose reader is gone before the first write: 141 (a shell's code for a
    writer stopped by SIGPIPE), never 1, no traceback."""
    read, write = os.pipe()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "contract.cli", *map(str, argv)], cwd=ROOT, env=env,
                            stdout=write, stderr=subprocess.PIPE)
    os.close(write)
    os.close(read)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 141, (proc.returncode, err)
    assert b"Traceback" not in err and b"Exception ignored" not in err, err


def test_head_reads_what_it_wants_and_the_command_does_not_fail():
    """``replay TRACE | head -c 10``: the reader takes ten bytes and goes; 0 or 141, never 1."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for argv in (f"replay {TRACE}", f"replay {TRACE} --json", "explore --policy vllm_0_30 --depth 4 --json"):
        done = subprocess.run(["bash", "-c", f"{sys.executable} -m contract.cli {argv} | head -c 10; "
                               "echo; echo rc=${PIPESTATUS[0]}"], cwd=ROOT, env=env, capture_output=True,
                              timeout=300)
        out, err = done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace")
        rc = int(out.strip().splitlines()[-1].split("=")[1])
        assert rc in (0, 141), (argv, rc, err)
        assert len(done.stdout.splitlines()[0]) <= 10 and "Traceback" not in err, err


def test_an_open_stdout_keeps_the_verdict(cli):
    """The control: with the reader there, a counterexample is still exit 1."""
    done = cli("replay", TRACE, "--policy", "pr56312_draft")
    assert done.returncode == 1 and done.stdout


def shell(command: str, **env: str) -> subprocess.CompletedProcess:
    """``command`` (with ``CLI`` for the entry point) through a shell, as a person types it."""
    line = command.replace("CLI", f"{sys.executable} -m contract.cli")
    return subprocess.run(["bash", "-c", line], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **env},
                          capture_output=True, timeout=300)


def one_error_line(err: bytes) -> str:
    text = err.decode()
    assert "Traceback" not in text and "Exception ignored" not in text, text
    lines = text.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), text
    return lines[0]


@pytest.mark.parametrize("argv", CLOSED, ids=lambda a: " ".join(map(str, a[:2])))
def test_no_stdout_at_all_is_141_when_something_was_said(argv):
    """``>&-``: the descriptor is not there; what the command says goes nowhere, so 141, never 1."""
    done = shell("CLI " + " ".join(map(str, argv)) + " >&-")
    assert done.returncode == 141, (done.returncode, done.stderr)
    assert b"Traceback" not in done.stderr and b"Exception ignored" not in done.stderr, done.stderr


def test_no_stdout_and_nothing_to_say_keeps_the_verdict(tmp_path):
    """``--quiet``: nothing was to go to stdout, so the exit code is the verdict."""
    mine = tmp_path / "my_branch.py"
    mine.write_text("from contract.api import Stacks\n\n\ndef load_model(ctx):\n"
                    "    return Stacks(ctx.model, ctx.drafter_model)  # forgets every wrapper\n")
    assert shell(f"CLI verify --policy {mine} --profile dev --seed 1 --quiet >&-").returncode == 1


@pytest.mark.parametrize("argv", [["replay", TRACE, "--json"], ["--version"], ["env", "list", "--json"],
                                  ["verify", "--policy", "vllm_0_30", "--profile", "dev", "--json"]],
                         ids=lambda a: " ".join(map(str, a[:2])))
def test_a_full_stdout_is_one_line_and_exit_2(argv):
    done = shell("CLI " + " ".join(map(str, argv)) + " >/dev/full")
    assert done.returncode == 2, done.stderr
    assert "standard output cannot be written (No space left on device)" in one_error_line(done.stderr)


@pytest.mark.parametrize("encoding", ["ascii", "latin-1"])
def test_an_encoding_without_the_characters_gets_them_escaped(encoding):
    """A stdout whose encoding lacks "—" and the box characters (a C locale, a latin-1 terminal)."""
    done = shell(f"CLI replay {TRACE}", PYTHONIOENCODING=encoding, LC_ALL="C")
    assert done.returncode in (0, 1) and b"Traceback" not in done.stderr, done.stderr
    assert done.stdout.decode(encoding)


def test_columns_0_still_shows_the_error():
    done = shell("CLI verify --policy no_such_policy", COLUMNS="0")
    assert "unknown policy 'no_such_policy'" in one_error_line(done.stderr)


def test_control_characters_in_a_file_name_reach_the_terminal_escaped(tmp_path):
    """An escape sequence (clear the screen, set the window title) in the name of the report folder."""
    folder = tmp_path / "r\x1b[2J\x1b]0;owned\x07"
    done = shell(f"CLI report --policy vllm_0_30 --out '{folder}'")
    assert done.returncode == 0, done.stderr
    said = done.stdout + done.stderr
    assert b"\x1b" not in said and b"\x07" not in said and b"\\x1b[2J" in said, said
    # the verdict summary, not only where the files went
    assert b"verdicts (profile " in said and b"vllm_0_30: P0 fails (" in said and b"README.md" in said, said


@pytest.mark.parametrize("value", ["0", "0.5", "-3", "nan", "inf", "1e10"])
def test_a_timeout_out_of_range_is_one_line(value, cli):
    done = cli("verify", "--policy", "vllm_0_30", "--timeout", value)
    assert done.returncode == 2 and "must be a number of seconds from 1 to 604800" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("extra", [["--policy", "pr56312_draft", "--base", "vllm_0_30"],
                                   pytest.param(["--vllm-src", "TREE"], marks=pytest.mark.evidence)],
                         ids=["base", "vllm-src"])
def test_report_json_is_the_whole_stdout(extra, tmp_path, cli):
    """With a differential (``--base``) or a tree's review (``--vllm-src``), ``--json``'s stdout is the
    JSON alone; what the command says about its choices goes to stderr."""
    from test_vllm_src_mrv2 import mrv2_tree

    extra = [str(mrv2_tree(tmp_path / "tree")) if a == "TREE" else a for a in extra]
    done = cli("report", "--out", tmp_path / "r", *extra, "--profile", "dev", "--seed", "1", "--json")
    assert done.returncode in (0, 1), done.stderr
    assert isinstance(json.loads(done.stdout), dict), done.stdout[:300]
    assert ": base " in done.stderr


def test_a_verdict_never_contradicts_the_classes_of_its_run(cli, monkeypatch):
    """A Hypothesis run that draws no counterexample at all (as ``--profile dev``'s 150 examples can
    miss vllm_0_30's P0 and P4): the explorer of the same run shows them, so the table says they
    fail (as expected), never "holds, UNEXPECTED"."""
    import contract.core.verify

    monkeypatch.setattr(contract.core.verify, "run_machine", lambda *args, **kwargs: None)
    done = cli("verify", "--policy", "vllm_0_30", "--profile", "dev", "--seed", "2", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    verdicts = json.loads(done.stdout)["vllm_0_30"]
    for pid in ("P0", "P1", "P4", "P7"):
        assert verdicts[pid]["holds"] is False and verdicts[pid]["classes"], verdicts[pid]
        assert verdicts[pid]["trace"]["origin"]["engine"] == "explorer"
    assert all(verdicts[pid]["holds"] for pid in ("P2", "P3", "P5", "P6"))


def test_without_a_seed_one_is_drawn_said_and_replays(cli):
    first = cli("verify", "--policy", "pr56312_draft", "--profile", "dev")
    seed = re.search(r"seed (\d+) \(drawn for this run; --seed \1 replays it\)", first.stdout)
    assert seed, first.stdout
    again = cli("verify", "--policy", "pr56312_draft", "--profile", "dev", "--seed", seed.group(1))
    assert again.stdout == first.stdout.replace(seed.group(0) + "\n", "")
