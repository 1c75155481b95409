"""``fix-check PATCH --vllm RELEASE``: a candidate fix checked as a maintainer would want it checked.

The patch is applied to a copy of the release's installed ``vllm/`` package (hard links, the patched
files copied first), and the copy is then a branch like any other: its changes are reviewed, the
witnesses of the root cause (``fixes/<id>/fix.json`` ``witnesses``) and the corpus are replayed on
vLLM's own code against the release (``contract/branch/conform.py``), the model's differential runs
on the rules the copy's runner family reads, and the root cause's vLLM unit test runs on the patched
copy. The verdict accepts the fix when every class the witnesses show on the release is fixed, no
class is new on the corpus or in the model, and the unit test passes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from contract.core import child, graphs
from contract.core.graphs import dispatch_kind, served
from contract.core.modes import CUDAGraphMode
from contract.core.policy import PolicyError
from contract.core.trace import Trace
from contract.real.installed import vllm_cache_root

ROOT = Path(__file__).resolve().parents[2]


class FixCheckError(PolicyError):
    """A patch, root cause or release fix-check cannot use; one line."""


@dataclass(frozen=True)
class RootCause:
    """A ``fixes/<id>/`` folder: its unit test and the traces that reach the bug."""

    id: str
    folder: Path
    test: Path | None
    witnesses: tuple[Path, ...]
    kind: dict  # the violation kind its classes share (``contract/evidence/root_causes.py`` ``kind_of``)

    @classmethod
    def read(cls, folder: Path) -> RootCause:
        try:
            data = json.loads((folder / "fix.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise FixCheckError(f"--root-cause {folder}: no readable fix.json ({exc})") from None
        test = folder.resolve() / data["test"] if data.get("test") else None
        witnesses = tuple(ROOT / w for w in data.get("witnesses", []))
        missing = [str(w) for w in witnesses if not w.is_file()]
        if missing:
            raise FixCheckError(f"--root-cause {folder}: fix.json names witnesses that do not exist: {', '.join(missing)}")
        return cls(data.get("root_cause", folder.name), folder, test, witnesses, data.get("kind") or {})


def touched(patch_text: str) -> list[str]:
    """The files under ``vllm/`` a unified diff writes (its ``+++ b/vllm/...`` lines)."""
    out = []
    for line in patch_text.splitlines():
        if line.startswith("+++ "):
            path = line[4:].split("\t")[0].strip()
            if path.startswith("b/"):
                path = path[2:]
            if path != "/dev/null":
                out.append(path)
    return out


def patched_copy(release_pkg: Path, patch: Path, dest: Path) -> Path:
    """``dest/vllm``: the release's package hard-linked, the files the patch touches copied, the
    patch applied with ``patch -p1``; one line when it does not apply."""
    text = patch.read_text(encoding="utf-8", errors="replace")
    files = touched(text)
    if not files or not all(f.startswith("vllm/") for f in files):
        raise FixCheckError(f"{patch} is not a patch of vLLM's package (its +++ lines must name b/vllm/...)")
    tree = dest / "vllm"
    shutil.copytree(release_pkg, tree, copy_function=os.link, ignore=shutil.ignore_patterns("__pycache__"))
    for rel in files:
        target = dest / rel
        if target.exists():
            target.unlink()
            shutil.copy2(release_pkg.parent / rel, target)
    done = subprocess.run(["patch", "-p1", "-s", "--no-backup-if-mismatch", "-i", str(patch.resolve())],
                          cwd=dest, capture_output=True, text=True, env=child.environment())
    if done.returncode != 0:
        why = (done.stdout + done.stderr).strip().splitlines()
        raise FixCheckError(f"{patch} does not apply to vLLM {release_pkg}: {why[-1] if why else 'patch failed'}")
    return dest


def ungraphed(shown, branch_records) -> list[str]:
    """The serving dispatches a root cause's violations were on (``shown``: signature, record,
    violation, on the release) where a capturing layer acted on the release (captured, replayed or
    raised) and no graph serves them on the patched tree: a fix that makes them run eagerly removed
    the capturer instead of making it work. A dispatch no layer acted on ran eagerly already; a fix
    that says so (NONE) loses nothing. A P10 violation is on a capture (graphs memory profiling did
    not estimate): the patched step must still capture that role's graph, or the estimate was
    mended by capturing nothing."""
    out = []
    for signature, record, violation in shown:
        if violation.dispatch is None or record.index >= len(branch_records):
            continue
        was = record.dispatches[violation.dispatch]
        capture = signature.property == "P10" and was.capture_phase
        if was.runtime_mode is CUDAGraphMode.NONE or not was.acting or (
                dispatch_kind(record.event, was) is None and not capture):
            continue
        now = [d for d in branch_records[record.index].dispatches if (d.role, d.context) == (was.role, was.context)]
        if (now or capture) and not any(served(d) for d in now):
            modes = ", ".join(sorted({d.runtime_mode.name for d in now})) or "no dispatch"
            out.append(f"step {record.index} {was.role} {was.context}: {was.runtime_mode.name} on the release, "
                       f"{modes} without a graph with the patch")
    return out


def serving_trace(witness: Trace) -> Trace:
    """The witness's scenario through the fixed serving script (``contract/core/graphs.py``): where
    the release stops, whether the patched tree then serves anything with a graph."""
    return Trace(witness.scenario, witness.policy, graphs.script(witness.scenario), name=f"{witness.name}-serving")


def graphs_served(records) -> int:
    """How many serving dispatches of a run of the serving script a graph served."""
    return sum(graphs.coverage(records).served.values())


@dataclass(frozen=True)
class TestRun:
    outcome: str  # pass, fail, skip
    tail: str  # pytest's last lines, for the report

    @property
    def summary(self) -> str:
        """pytest's counts line without its duration and warnings, the same on every run."""
        last = self.tail.splitlines()[-1] if self.tail else ""
        return re.sub(r"(, \d+ warnings?)?( in [\d.]+s.*)?$", "", last.strip("= "))


def run_test(test: Path, tree: Path | None, shared_python: Path, release_python: Path, version: str,
             timeout: float | None) -> TestRun:
    """The root cause's vLLM unit test on ``tree`` (over the shared closure) or, with ``tree`` None, on
    the installed release ``version``: a child like any named code's (``contract.core.child``: the
    caller's ``PYTEST_ADDOPTS``, ``PYTHONOPTIMIZE`` and the like never reach it), never with this
    project on the path, and with the release's vLLM cache in this tool's cache folder, as a replay's."""
    env = child.environment(VLLM_LOGGING_LEVEL="ERROR", VLLM_CACHE_ROOT=str(vllm_cache_root(version)))
    python = release_python
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
        python = shared_python
    done = child.run_command([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test)],
                             what=f"the unit test {test.name}", timeout=timeout, env=env)
    out = (done.stdout + done.stderr).strip().splitlines()
    if done.returncode == 5 or (done.returncode == 0 and not any(" passed" in line for line in out[-3:])):
        outcome = "skip"
    else:
        outcome = "pass" if done.returncode == 0 else "fail"
    return TestRun(outcome, "\n".join(out[-6:]))


@dataclass
class Verdict:
    accepted: bool
    reasons: list[str] = field(default_factory=list)  # why it is rejected
    said: list[str] = field(default_factory=list)  # what was checked, one line each

    def line(self, patch: Path, release: str) -> str:
        head = f"fix-check {patch.name} on vLLM {release}: "
        return head + ("ACCEPTED" if self.accepted else "REJECTED: " + "; ".join(self.reasons))
