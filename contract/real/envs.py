"""The environments a conformance replay runs vLLM's code in, made by the package itself, so that an
installed ``cudagraph-contract`` needs no checkout (``cudagraph-contract env make``; ``make test``
calls the same code with the repository's folders).

- ``base``: the shared environment ``.venv-vllm``: ``torch==2.13.0``, the pinned import closure
  (``constraints.txt`` beside this file, installed ``--no-deps``: it keeps out triton and the rest
  of vLLM's declared dependencies, which nothing the replay runs imports) and the project's own
  pins (``TOOLS``: a replay re-runs ``python -m contract.cli`` there).
- ``VERSION``: one small venv per release, without pip, whose site-packages holds only
  ``vllm==VERSION`` (``pip install --no-deps --target``) and a ``.pth`` line appending the shared
  environment's site-packages; it runs the shared environment's interpreter, so the closure's
  compiled wheels fit it. pip writes the bytecode of vLLM's modules at install (about 7 s of CPU):
  where ``PYTHONDONTWRITEBYTECODE`` is set, nothing else would, and every replay would compile the
  modules it imports again (about 1 s of CPU each).

Every step is skipped when its result is already in place (a re-run costs the import check). A
failing step is one line (``EnvProblem``: the step and the last error line of pip's log, kept in a
temporary file) and the command exits 2. ``torch==2.13.0`` comes from wherever the machine's pip
configuration finds it: a local CPU wheel (``find-links``) or the PyTorch CPU index where
configured, else the registry's CUDA build, which works on CPU too, only bigger.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from contract.real.installed import COMPLETE, SHARED

TORCH = "2.13.0"
# The project's exact pins (ci-constraints.txt); their own dependencies resolve under the closure's.
TOOLS = ("typer==0.29.2", "rich==15.0.0", "hypothesis==6.155.2", "networkx==3.6.1", "pytest==9.0.3")
CONSTRAINTS = Path(__file__).resolve().with_name("constraints.txt")
VERSION_FORM = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+[0-9A-Za-z.+-]*$")
PTH = "_vllm_shared_closure.pth"
PIP = ("-m", "pip", "--disable-pip-version-check", "--no-cache-dir")

_HAVE = """
import sys, importlib.metadata as md
try:
    v = md.version(sys.argv[1])
except md.PackageNotFoundError:
    sys.exit(1)
sys.exit(0 if v.split("+")[0] == sys.argv[2] else 1)
"""

_MISSING = """
import sys, importlib.metadata as md
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if not line:
        continue
    name, ver = line.split("==")
    try:
        ok = md.version(name) == ver
    except md.PackageNotFoundError:
        ok = False
    if not ok:
        print(line)
"""

# The release's vLLM comes from the release venv, the closure from the shared one, the version is right.
_SMOKE = """
import sys, os
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
import vllm, torch
assert vllm.__version__ == sys.argv[1], (vllm.__version__, sys.argv[1])
assert os.path.realpath(vllm.__file__).startswith(os.path.realpath(sys.argv[2])), vllm.__file__
assert os.path.realpath(torch.__file__).startswith(os.path.realpath(sys.argv[3])), torch.__file__
for m in ["vllm.config", "vllm.forward_context", "vllm.compilation.cuda_graph",
          "vllm.compilation.breakable_cudagraph", "vllm.compilation.backends",
          "vllm.compilation.decorators", "typer", "rich", "hypothesis", "networkx", "pytest"]:
    __import__(m)
print("ok", vllm.__version__, torch.__version__)
"""


class EnvProblem(Exception):
    """A step failed; the message is one line."""


def check_version(version: str) -> str:
    if version != "base" and not VERSION_FORM.match(version):
        raise EnvProblem(f"VERSION must be 'base' or look like 0.30.0, got {version!r}")
    return version


def _clean() -> dict:
    """The environment pip and the new interpreters run in: the caller's, less what changes which
    packages Python sees or how it runs them (``PYTHONPATH`` at a vLLM tree would make pip take that
    tree's packages as installed; ``PYTHONOPTIMIZE`` drops asserts), and vLLM's and pytest's switches.
    Package-index and proxy settings (``PIP_*``, ``HTTPS_PROXY``) stay: they say where packages come from."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PYTEST_", "VLLM_"))}


class _Steps:
    """Runs each step quietly into one log; a failure is one line naming the step and pip's last error."""

    def __init__(self, say):
        self.say = say
        fd, name = tempfile.mkstemp(prefix="cudagraph-contract-env.", suffix=".log")
        os.close(fd)
        self.log = Path(name)

    def run(self, what: str, argv: list[str], quiet: bool = False) -> None:
        if not quiet:
            self.say(what)
        with open(self.log, "a", encoding="utf-8") as log:
            log.write(f"$ {' '.join(argv)}\n")
            log.flush()
            try:
                code = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      env=_clean()).returncode
            except OSError as exc:
                raise EnvProblem(f"{what} failed: {exc.strerror or exc} (log: {self.log})") from None
        if code != 0:
            lines = self.log.read_text(encoding="utf-8", errors="replace").splitlines()
            why = next((line.strip() for line in reversed(lines) if re.search(r"^ERROR|Error|error:", line)), "")
            raise EnvProblem(f"{what} failed: {why or 'see log'} (log: {self.log})")

    def output(self, what: str, argv: list[str]) -> str:
        try:
            done = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, env=_clean())
        except OSError as exc:
            raise EnvProblem(f"{what} failed: {exc.strerror or exc}") from None
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise EnvProblem(f"{what} failed: {last}")
        return done.stdout.strip()

    def done(self) -> None:
        self.log.unlink(missing_ok=True)


def _have(python: Path, dist: str, version: str) -> bool:
    """``dist`` installed in ``python``'s environment at exactly ``version`` (a local tag ignored)."""
    try:
        return subprocess.run([str(python), "-c", _HAVE, dist, version], capture_output=True,
                              stdin=subprocess.DEVNULL, env=_clean()).returncode == 0
    except OSError:
        return False


def _site_packages(steps: _Steps, python: Path) -> Path:
    out = steps.output(f"reading {python}'s site-packages",
                       [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
    return Path(out)


def _ready(dest: Path) -> None:
    (dest / COMPLETE).write_text("")


def make_base(dest: Path, python: str | None = None, say=print) -> str:
    """The shared environment at ``dest``; returns the line saying it is ready."""
    t0 = time.monotonic()
    steps = _Steps(say)
    dest = Path(dest)
    py = dest / "bin" / "python"
    if not py.exists():
        steps.run(f"creating {dest}", [python or sys.executable, "-m", "venv", str(dest)])
    pip = [str(py), *PIP]
    if not _have(py, "torch", TORCH):
        steps.run(f"installing torch=={TORCH}", pip + ["install", f"torch=={TORCH}"])
    if not CONSTRAINTS.is_file():
        raise EnvProblem(f"missing {CONSTRAINTS}")
    missing = steps.output(f"reading {CONSTRAINTS} with {py}", [str(py), "-c", _MISSING, str(CONSTRAINTS)])
    if missing:
        steps.run(f"installing the import closure ({len(missing.splitlines())} pins, --no-deps)",
                  pip + ["install", "--no-deps", "-r", str(CONSTRAINTS)])
    need = [pin for pin in TOOLS if not _have(py, *pin.split("=="))]
    if need:
        steps.run(f"installing {' '.join(need)}", pip + ["install", "-c", str(CONSTRAINTS), *need])
    steps.run("import check", [str(py), "-c", "import torch, transformers, typer, rich, hypothesis, networkx, pytest"],
              quiet=True)
    torch = steps.output("reading torch's version", [str(py), "-c", "import torch; print(torch.__version__)"])
    steps.done()
    _ready(dest)
    return f"{dest} ready (shared closure, torch {torch}) in {time.monotonic() - t0:.0f}s"


def make_release(version: str, dest: Path, base: Path, say=print) -> str:
    """One release's environment at ``dest`` over the shared environment ``base`` (which must exist)."""
    check_version(version)
    t0 = time.monotonic()
    steps = _Steps(say)
    dest, base = Path(dest), Path(base)
    base_py = base / "bin" / "python"
    if not base_py.exists():
        raise EnvProblem(f"no shared environment at {base} (make it first: cudagraph-contract env make base "
                         f"--dir {base})")
    base = base.resolve()
    base_site = _site_packages(steps, base / "bin" / "python").resolve()
    base_exe = steps.output(f"running {base_py}", [str(base_py), "-c", "import sys, os; print(os.path.realpath(sys.executable))"])
    py = dest / "bin" / "python"
    if not py.exists():
        steps.run(f"creating {dest}", [base_exe, "-m", "venv", "--without-pip", str(dest)])
    site = _site_packages(steps, py)
    (site / PTH).write_text(f"{base_site}\n")
    if not _have(py, "vllm", version):
        for old in [site / "vllm", *site.glob("vllm-*.dist-info")]:
            shutil.rmtree(old, ignore_errors=True)
        steps.run(f"installing vllm=={version} (--no-deps --target)",
                  [str(base_py), *PIP, "install", "--no-deps", "--upgrade", "--target", str(site),
                   f"vllm=={version}"])
    steps.run("import check", [str(py), "-c", _SMOKE, version, str(site), str(base_site)], quiet=True)
    steps.done()
    _ready(dest)
    return f"{dest} ready (vllm {version} over {base}) in {time.monotonic() - t0:.0f}s"


def make(version: str, dest: Path, base: Path | None = None, python: str | None = None, say=print) -> list[str]:
    """``base`` or a release at ``dest``; a release's shared environment (``base``, default: ``.venv-vllm``
    beside ``dest``) is made first when it is missing. Returns the lines saying what is ready."""
    check_version(version)
    if version == "base":
        return [make_base(dest, python, say)]
    base = Path(base) if base is not None else Path(dest).parent / SHARED
    lines = []
    if not (base / "bin" / "python").exists() or not (base / COMPLETE).exists():
        lines.append(make_base(base, python, say))
    return lines + [make_release(version, dest, base, say)]


def main(argv: list[str] | None = None) -> int:
    """``python -m contract.real.envs VERSION|base --dir PATH [--base PATH] [--python PATH]``: what
    ``cudagraph-contract env make`` does, with the standard library alone, so that a checkout's
    ``make test`` starts the shared environment before the project's own ``.venv`` is ready."""
    parser = argparse.ArgumentParser(prog="python -m contract.real.envs")
    parser.add_argument("version", metavar="VERSION|base")
    parser.add_argument("--dir", required=True, type=Path)
    parser.add_argument("--base", type=Path)
    parser.add_argument("--python")
    args = parser.parse_args(argv)
    try:
        lines = make(args.version, args.dir, args.base, args.python,
                     say=lambda line: print(f"{line} ...", file=sys.stderr, flush=True))
    except EnvProblem as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
