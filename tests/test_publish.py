"""A report folder is published as a whole: killed at any instant, by SIGTERM or SIGKILL, it is
entirely the old folder or entirely the new one, files the command does not write survive, and
nothing is left beside it or in it after the next run.

The kill points are every file-system call of a publication (``os.open``, ``link``, ``mkdir``,
``rename``, ``replace``, ``unlink``, ``rmdir``, ``chmod``, ``utime``, ``flock`` and the
``renameat2`` exchange), counted in a forked child that signals itself just before the Nth call:
``DRIVER`` forks one child per point from a process that imported nothing but the output layer, so
several hundred kills take seconds. The swap is tried both ways: one ``renameat2(RENAME_EXCHANGE)``,
and the two renames used where the exchange is not available.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from contract.core import output

ROOT = Path(__file__).resolve().parents[1]

# The file-system calls of a publication, each a kill point; the driver wraps them in the child.
DRIVER = r'''
import contextlib, fcntl, json, os, shutil, signal, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from contract.core import output

spec = json.loads(sys.argv[2])
work, template, sig = Path(spec["work"]), Path(spec["template"]), spec["signal"]
target = work / "out"
CALLS = ("open", "link", "mkdir", "rename", "replace", "unlink", "rmdir", "chmod", "utime")
real = {name: getattr(os, name) for name in CALLS}
real_flock, real_exchange = fcntl.flock, output.exchange


def snapshot(folder):
    if not os.path.lexists(folder):
        return None
    out = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(folder))
            if p.is_symlink():
                out[rel] = "link:" + os.readlink(p)
            elif p.is_dir():
                out[rel] = "folder"
            else:
                out[rel] = p.read_text()
    return out


def command(folder):
    """What a report command does inside its publication: the files it owns, written whole."""
    with output.publish(folder) as stage:
        for rel, text in spec["writes"].items():
            output.write_atomic(stage / rel, text)


def child(kill_at):
    count = [0]

    def counted(name, fn):
        def call(*args, **kwargs):
            count[0] += 1
            if count[0] == kill_at:
                os.kill(os.getpid(), sig)
            return fn(*args, **kwargs)
        return call

    for name, fn in real.items():
        setattr(os, name, counted(name, fn))
    fcntl.flock = counted("flock", real_flock)
    output.exchange = counted("exchange", real_exchange)
    command(target)
    for name, fn in real.items():
        setattr(os, name, fn)
    os._exit(0 if kill_at == 0 else 3)  # 3: the kill point was never reached


def run_child(kill_at):
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        try:
            child(kill_at)
        finally:
            os._exit(4)
    _, status = os.waitpid(pid, 0)
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def reset():
    for p in work.iterdir():
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()
    shutil.copytree(template, target, symlinks=True)


def beside():
    return sorted(p.name for p in work.iterdir() if p.name != "out")


records = []
kill_at = 1
while True:
    reset()
    code = run_child(kill_at)
    if code == 3:  # past the last call: the publication ran whole
        break
    after_kill = snapshot(target)
    left_after_kill = beside()
    output.check_folder(target, "--out")  # the next run's start-up
    recovered, left_after_recovery = snapshot(target), beside()
    command(target)  # the next run
    records.append({"kill_at": kill_at, "code": code, "after_kill": after_kill, "left_after_kill": left_after_kill,
                    "recovered": recovered, "left_after_recovery": left_after_recovery,
                    "next_run": snapshot(target), "left_after_next_run": beside()})
    kill_at += 1
print(json.dumps(records))
'''


def tree(folder: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(text)


# An earlier report with files the command does not own: another command's pages, a user's notes,
# an empty folder and a link.
OLD = {
    "README.md": "old verdicts\n", "coverage.md": "old coverage\n", "benchmarks.md": "benchmarks, not ours\n",
    "mutation.md": "mutation, not ours\n", "notes.txt": "a user's notes\n",
    "gpu/rehearsal.md": "rehearsal, not ours\n", "conformance/README.md": "decisions\n", "findings.md": "findings\n",
    "gpu/README.md": "gpu, not ours\n", "gpu/result.json": "{}\n",
    **{f"conformance/vllm-{v}.{ext}": f"conformance {v} {ext}\n" for v in ("0.29.0", "0.30.0", "0.33.0")
       for ext in ("md", "json")},
    **{f"vllm_0_30/P{i}.{ext}": f"old P{i} {ext}\n" for i in (1, 4) for ext in ("md", "json")},
    **{f"vllm_0_30/classes/c{i}.{ext}": f"old class {i} {ext}\n" for i in range(9) for ext in ("md", "json")},
    "vllm_0_29/P1.md": "old 0.29 P1\n", "vllm_0_29/P1.json": "{}\n",
}
# What the command writes: some files replaced, some new, a new folder.
WRITES = {
    "README.md": "new verdicts\n", "coverage.md": "new coverage\n",
    **{f"vllm_0_30/P{i}.{ext}": f"new P{i} {ext}\n" for i in (1, 4) for ext in ("md", "json")},
    **{f"vllm_0_30/classes/c{i}.{ext}": f"new class {i} {ext}\n" for i in range(5, 12) for ext in ("md", "json")},
    **{f"mrv2_0_34/P1.{ext}": f"new mrv2 {ext}\n" for ext in ("md", "json")},
}


def expected(files: dict[str, str]) -> dict[str, str]:
    folders = {str(Path(rel).parents[i]) for rel in files for i in range(len(Path(rel).parents) - 1)}
    return {**files, **dict.fromkeys(folders, "folder"), "scratch": "folder", "latest": "link:vllm_0_30"}


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("template") / "out"
    tree(folder, OLD)
    (folder / "scratch").mkdir()
    (folder / "latest").symlink_to("vllm_0_30")
    assert len(OLD) >= 40
    return folder


def kill_everywhere(template: Path, work: Path, sig: signal.Signals, exchange: bool) -> list[dict]:
    work.mkdir()
    spec = {"work": str(work), "template": str(template), "signal": int(sig), "writes": WRITES}
    env = dict(os.environ, CUDAGRAPH_CONTRACT_NO_EXCHANGE="0" if exchange else "1")
    run = subprocess.run([sys.executable, "-c", DRIVER, str(ROOT), json.dumps(spec)], capture_output=True, text=True,
                         env=env, timeout=600)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2-exchange", "two-renames"])
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_killed_at_every_step_the_folder_is_old_or_new(template, tmp_path, sig, exchange):
    old, new = expected(OLD), expected(OLD | WRITES)
    records = kill_everywhere(template, tmp_path / "work", sig, exchange)
    outcomes = {"old": 0, "new": 0, "missing": 0}
    for r in records:
        assert r["code"] == -sig, r
        if exchange:  # one step: at no instant is the folder anything but old or new
            assert r["after_kill"] in (old, new), r["kill_at"]
        else:  # between the two renames the folder is aside; the next start-up puts it back
            assert r["after_kill"] in (old, new, None), r["kill_at"]
        outcomes["missing" if r["after_kill"] is None else "old" if r["after_kill"] == old else "new"] += 1
        assert r["recovered"] in (old, new), r["kill_at"]
        assert r["left_after_recovery"] == [], r
        assert r["next_run"] == new and r["left_after_next_run"] == [], r
    # every call of the publication was a kill point: links of the old files, writes, swap, clean-up
    assert len(records) > len(OLD) + 2 * len(WRITES), len(records)
    # the kills landed before the swap, after it, and (SIGKILL, two renames) between its renames;
    # a SIGTERM waits while the swap runs
    assert outcomes["old"] and outcomes["new"], outcomes
    assert bool(outcomes["missing"]) == (not exchange and sig == signal.SIGKILL), outcomes
    if sig == signal.SIGTERM:  # a SIGTERM while the stage is written removes the stage at once
        assert any(r["after_kill"] == old and r["left_after_kill"] == [] for r in records)
    # a kill before the stage is complete leaves something beside the folder only until the next run
    assert any(r["left_after_kill"] for r in records)
    print(f"{sig.name} {'exchange' if exchange else 'two renames'}: {len(records)} kill points, {outcomes}")


def test_a_failed_run_leaves_the_folder_and_nothing_beside(tmp_path):
    out = tmp_path / "out"
    tree(out, OLD)
    before = sorted(p.read_text() for p in out.rglob("*") if p.is_file())
    with pytest.raises(RuntimeError):
        with output.publish(out) as stage:
            output.write_atomic(stage / "README.md", "half a report\n")
            raise RuntimeError("the tenth page failed")
    assert sorted(p.read_text() for p in out.rglob("*") if p.is_file()) == before
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_files_not_written_are_kept_and_not_written_through(tmp_path):
    """The stage links the old files: a file the run replaces gets a new inode, the old one is
    untouched until the swap; a file it does not write is the same file after."""
    out = tmp_path / "out"
    tree(out, OLD)
    kept = (out / "benchmarks.md").stat().st_ino
    with output.publish(out) as stage:
        output.write_atomic(stage / "README.md", "new verdicts\n")
        assert (out / "README.md").read_text() == "old verdicts\n"  # nothing visible before the swap
    assert (out / "README.md").read_text() == "new verdicts\n"
    assert (out / "benchmarks.md").stat().st_ino == kept
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2-exchange", "two-renames"])
def test_start_up_completes_or_rolls_back_each_leftover(tmp_path, monkeypatch, exchange):
    """The states a kill can leave, made by hand: a stage alone (unfinished, or the old folder
    after an exchange) is removed; the old folder aside with the folder missing and a stage
    complete rolls forward; aside with no stage comes back."""
    monkeypatch.setenv("CUDAGRAPH_CONTRACT_NO_EXCHANGE", "0" if exchange else "1")
    out = tmp_path / "out"
    names = output.leftovers(out)
    tree(out, {"README.md": "old\n"})
    tree(names["new"], {"README.md": "half\n"})
    output.check_folder(out, "--out")
    assert (out / "README.md").read_text() == "old\n" and not names["new"].exists()
    out.rename(names["old"])
    tree(names["new"], {"README.md": "new\n"})
    output.check_folder(out, "--out")
    assert (out / "README.md").read_text() == "new\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    out.rename(names["old"])
    output.check_folder(out, "--out")
    assert (out / "README.md").read_text() == "new\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_folder_that_cannot_be_renamed_is_written_file_by_file(tmp_path, monkeypatch):
    """The working folder (a shell in it would be left in a removed folder) is not swapped: its
    files are renamed together at the end, as ``transaction`` does."""
    out = tmp_path / "out"
    tree(out, {"README.md": "old\n"})
    monkeypatch.chdir(out)
    inode = out.stat().st_ino
    with output.publish(Path(".")) as stage:
        assert stage == Path(".")
        output.write_atomic(stage / "README.md", "new\n")
        assert (out / "README.md").read_text() == "old\n"
    assert (out / "README.md").read_text() == "new\n" and out.stat().st_ino == inode


def test_concurrent_publications_of_one_folder_take_turns(tmp_path):
    """Two processes publishing the same folder: each swap is whole, the second starts from the
    first's result, and nothing is left beside it."""
    out = tmp_path / "out"
    script = ("import sys, time; sys.path.insert(0, sys.argv[1]); from pathlib import Path; "
              "from contract.core import output\n"
              "with output.publish(Path(sys.argv[2])) as stage:\n"
              "    for i in range(30):\n"
              "        output.write_atomic(stage / sys.argv[3] / f'{i}.txt', sys.argv[3]); time.sleep(0.01)\n")
    runs = [subprocess.Popen([sys.executable, "-c", script, str(ROOT), str(out), name]) for name in ("a", "b")]
    assert [r.wait(timeout=60) for r in runs] == [0, 0]
    assert sorted(p.name for p in out.iterdir()) == ["a", "b"]
    assert all(len(list((out / n).iterdir())) == 30 for n in ("a", "b"))
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


# The command itself: ``explore --out`` computes once, then each kill point is a fork taken where
# the publication starts, so the same files are written every time.
COMMAND_DRIVER = r'''
import contextlib, fcntl, json, os, shutil, signal, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from contract.core import output
from contract.cli import main

spec = json.loads(sys.argv[2])
out, template, sig = Path(spec["out"]), Path(spec["template"]), spec["signal"]
CALLS = ("open", "link", "mkdir", "rename", "replace", "unlink", "rmdir", "chmod", "utime")
real = {name: getattr(os, name) for name in CALLS}
real_flock, real_exchange, real_publish = fcntl.flock, output.exchange, output.publish
records = []


def snapshot():
    if not os.path.lexists(out):
        return None
    return {str(p.relative_to(out)): p.read_text() if p.is_file() else "folder" for p in sorted(out.rglob("*"))}


def beside():
    return sorted(p.name for p in out.parent.iterdir() if p.name != out.name)


def reset():
    for p in out.parent.iterdir():
        shutil.rmtree(p)
    shutil.copytree(template, out)


def kill_at(n):
    count = [0]

    def counted(fn):
        def call(*args, **kwargs):
            count[0] += 1
            if count[0] == n:
                os.kill(os.getpid(), sig)
            return fn(*args, **kwargs)
        return call

    for name, fn in real.items():
        setattr(os, name, counted(fn))
    fcntl.flock = counted(real_flock)
    output.exchange = counted(real_exchange)


@contextlib.contextmanager
def killing(folder):
    n = 1
    while True:
        reset()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            kill_at(n)
            with real_publish(folder) as stage:
                yield stage
            os._exit(3)  # past the last call: never killed
        _, status = os.waitpid(pid, 0)
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 3:
            break
        record = {"kill_at": n, "code": -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status),
                  "after_kill": snapshot()}
        output.check_folder(out, "--out")
        record.update(recovered=snapshot(), left=beside())
        records.append(record)
        n += 1
    reset()
    with real_publish(folder) as stage:
        yield stage


output.publish = killing
try:
    main(["explore", "--policy", "vllm_0_30", "--out", str(out), "--quiet"])
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "records": records, "final": snapshot(), "left": beside()}))
'''


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_explore_out_killed_at_every_step_of_its_publication(tmp_path, sig):
    template = tmp_path / "template"
    tree(template, {"README.md": "a user's notes\n", "vllm_0_30-P1.json": "an earlier run's trace\n",
                    "mine/keep.txt": "kept\n"})
    out = tmp_path / "work" / "out"
    out.parent.mkdir()
    spec = {"out": str(out), "template": str(template), "signal": int(sig)}
    run = subprocess.run([sys.executable, "-c", COMMAND_DRIVER, str(ROOT), json.dumps(spec)], capture_output=True,
                         text=True, timeout=600, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout.splitlines()[-1])
    assert result["code"] == 0 and result["left"] == []
    old = {"README.md": "a user's notes\n", "vllm_0_30-P1.json": "an earlier run's trace\n", "mine": "folder",
           "mine/keep.txt": "kept\n"}
    new = result["final"]
    assert new["README.md"] == old["README.md"] and new["mine/keep.txt"] == "kept\n"  # not explore's: kept
    assert new["vllm_0_30-P1.json"] != old["vllm_0_30-P1.json"] and len(new) > len(old) + 10
    records = result["records"]
    for r in records:
        assert r["code"] == -sig, r["kill_at"]
        assert r["after_kill"] in (old, new), r["kill_at"]
        assert r["recovered"] in (old, new) and r["left"] == [], r["kill_at"]
    assert len(records) > 2 * (len(new) - len(old)), len(records)
    assert any(r["after_kill"] == old for r in records) and any(r["after_kill"] == new for r in records)
    print(f"explore --out, {sig.name}: {len(records)} kill points")
