"""The folder carried to a GPU machine that has torch but no vLLM and no network.

``python -m contract.gpu.bundle --out DIR [--python-version 3.12] [--machine-packages FILE] [--add-release]``,
run with the Python of a ``.venv-vllm-<version>`` environment, writes into ``DIR``:

- ``vllm.tar.xz``: per release packed, every ``.py`` file of its ``vllm`` package and its
  ``dist-info``, under ``<version>/``; the members sorted by path and then release, so a file two
  releases share (most of them) is compressed once;
- ``site.tar.xz``: the pure-Python distributions of ``contract/real/constraints.txt`` plus the
  CLI's (typer, rich, ...), each without its ``tests`` folders and without the members its RECORD
  places outside site-packages (console scripts, man pages: ``../../../bin/...``, which tar
  refuses to unpack);
- ``wheels/``: the wheels, for the target Python, of every compiled distribution the replay
  imports that the machine's package list lacks, fetched with ``pip download`` (only-binary, no
  dependencies, manylinux x86_64);
- ``manifest.json``: the releases packed (file counts), the pure distributions carried, the wheels
  carried, and the compiled distributions expected on the machine.

``--add-release``, run with another release's Python, adds its files to ``vllm.tar.xz`` of a folder
packed before: every release shares the closure (``.venv-vllm``) and the wheels, so MRV1 (0.30.0)
and MRV2 (0.34.0) travel together (``scripts/gpu-conformance.sh --vllm VERSION`` picks one, unpacked
by ``--unpack`` with the machine's own Python: no ``xz`` program is needed there).

Every ``.py`` file rather than the modules one CPU run imports: on a GPU host vLLM's import takes
other branches (triton active, ``VLLM_TARGET_DEVICE=cpu``), which reach modules a CPU run never
imports. The device tool carries at most 64 MiB, the working tree included: ``SPARE_MIB`` of it is
kept free for the tree to grow (``tests/test_gpu_script.py`` fails below it).
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import io
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RELEASES, SITE = "vllm.tar.xz", "site.tar.xz"
LIMIT_MIB, SPARE_MIB = 64.0, 16.0
MIB = 1 << 20
CLI_DISTRIBUTIONS = ("typer", "click", "rich", "shellingham", "markdown-it-py", "mdurl", "Pygments")
# The manylinux tags a cp312 x86_64 wheel of these distributions is published under (llguidance
# only as manylinux_2_31).
PLATFORMS = ("manylinux_2_31_x86_64", "manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_17_x86_64", "manylinux2014_x86_64")


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def machine_packages(path: Path) -> set[str]:
    return {normalise(line.strip()) for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip() and not line.startswith("#")}


def wanted_distributions() -> list[str]:
    names = [re.split("[=<>]", line.strip())[0]
             for line in (Path(__file__).resolve().parents[1] / "real" / "constraints.txt").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    return names + list(CLI_DISTRIBUTIONS)


def _tar(path: Path, members: list[tuple[str, bytes]]) -> None:
    """``members`` (name, content) as an xz tar, in the order given; no owner, time or mode of the
    machine that packed them."""
    with tarfile.open(path, "w:xz") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))


def _read(path: Path) -> list[tuple[str, bytes]]:
    with tarfile.open(path, "r:xz") as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar.getmembers() if m.isfile()]


def _release_files() -> tuple[str, dict[str, Path]]:
    """(version, name in the site folder -> file) of the installed vLLM: its ``.py`` files and its
    ``dist-info``."""
    import vllm

    # Relative to the site folder that holds them: vLLM's own folder and the shared closure's
    # site-packages are two folders in the per-release layout.
    site = Path(vllm.__file__).parents[1]
    files = {p.relative_to(site).as_posix(): p for p in (site / "vllm").rglob("*.py")}
    vllm_dist = md.distribution("vllm")
    files |= {Path(f).as_posix(): Path(vllm_dist.locate_file(f)) for f in vllm_dist.files or [] if ".dist-info" in str(f)}
    return vllm.__version__, files


def pack_release(out: Path) -> tuple[str, int]:
    """This Python's vLLM added to ``vllm.tar.xz`` (replacing the same release packed before);
    returns (version, files)."""
    version, files = _release_files()
    archive = out / RELEASES
    kept = [(n, d) for n, d in (_read(archive) if archive.exists() else []) if not n.startswith(f"{version}/")]
    members = kept + [(f"{version}/{name}", path.read_bytes()) for name, path in files.items()]
    # By path, then release: each file next to its copies in the other releases.
    members.sort(key=lambda m: (m[0].split("/", 1)[1], m[0].split("/", 1)[0]))
    out.mkdir(parents=True, exist_ok=True)
    _tar(archive, members)
    return version, len(files)


def add_release(out: Path) -> dict:
    """Another release into a folder ``pack`` wrote: its vLLM files only."""
    manifest_path = out / "manifest.json"
    if not manifest_path.is_file():
        raise SystemExit(f"error: {out} has no manifest.json: pack a first release without --add-release")
    manifest = json.loads(manifest_path.read_text())
    version, count = pack_release(out)
    manifest["releases"][version] = count
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def unpack(bundle: Path, version: str, site: Path) -> None:
    """``version``'s vLLM and the pure distributions into ``site``, with the Python that runs there."""
    site.mkdir(parents=True, exist_ok=True)
    with tarfile.open(bundle / SITE, "r:xz") as tar:
        _extract(tar, tar.getmembers(), site)
    with tarfile.open(bundle / RELEASES, "r:xz") as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(f"{version}/")]
        if not members:
            raise SystemExit(f"error: the bundle holds no vLLM {version}")
        for m in members:
            m.name = m.name.split("/", 1)[1]
        _extract(tar, members, site)


def _extract(tar: tarfile.TarFile, members, target: Path) -> None:
    if hasattr(tarfile, "data_filter"):  # Python 3.12 (and security releases before): no path outside target
        tar.extractall(target, members=members, filter="data")
    else:
        tar.extractall(target, members=members)


def pack(out: Path, python_version: str, machine: set[str]) -> dict:
    for old in (out / RELEASES, *out.glob("vllm-*.tar.gz"), out / "site.tar.gz"):  # only the releases packed now
        old.unlink(missing_ok=True)
    version, count = pack_release(out)
    files: dict[Path, Path] = {}
    pure, compiled = [], []
    for name in wanted_distributions():
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        dist_site = Path(os.path.normpath(dist.locate_file("")))
        paths = [Path(os.path.normpath(dist.locate_file(f))) for f in dist.files or []]
        if any(p.suffix in (".so", ".pyd") for p in paths):
            compiled.append((name, dist.version))
            continue
        pure.append(f"{name}=={dist.version}")
        # A distribution's own tests are never imported by the replay (sympy's and networkx's are a
        # third of their size).
        files |= {p: p.relative_to(dist_site) for p in paths if p.is_file() and p.is_relative_to(dist_site)
                  and p.suffix != ".pyc" and "__pycache__" not in p.parts and "tests" not in p.parts}
    _tar(out / SITE, [(name.as_posix(), path.read_bytes())
                      for path, name in sorted(files.items(), key=lambda f: f[1].as_posix())])
    lacking = [(n, v) for n, v in compiled if normalise(n) not in machine]
    wheels = out / "wheels"
    for old in wheels.glob("*.whl"):
        old.unlink()
    if lacking:
        command = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
                   "--no-deps", "--only-binary=:all:", "--implementation", "cp",
                   "--python-version", python_version, "--dest", str(wheels)]
        for platform in PLATFORMS:
            command += ["--platform", platform]
        subprocess.run(command + [f"{n}=={v}" for n, v in lacking], check=True)
    manifest = {
        "releases": {version: count},
        "python_version": python_version,
        "files": len(files),
        "pure": pure,
        "wheels": sorted(p.name for p in wheels.glob("*.whl")),
        "compiled_on_the_machine": sorted(f"{n}=={v}" for n, v in compiled if normalise(n) in machine),
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _files_size(root: Path, names: list[str]) -> int:
    return sum(p.stat().st_size for p in (root / n for n in names) if p.is_file() and not p.is_symlink())


def tree_size(root: Path, bundle: Path) -> tuple[int, int]:
    """(tracked, untracked): the sizes of what is carried besides the bundle, git's tracked files
    (what a clean clone holds) and the untracked ones it does not ignore (a working copy's own, which
    the device tool carries too); outside a git checkout (as on the machine it was carried to), every
    file but the bundle and the environments, as tracked."""
    def listed(*flags: str) -> list[str] | None:
        done = subprocess.run(["git", "-C", str(root), "ls-files", "-z", *flags], capture_output=True)
        return [n for n in done.stdout.decode().split("\0") if n] if done.returncode == 0 else None

    tracked = listed("--cached")
    if tracked is None:
        files = [p for p in root.rglob("*") if not p.is_relative_to(bundle)
                 and not any(part.startswith(".venv") for part in p.relative_to(root).parts)]
        return sum(p.stat().st_size for p in files if p.is_file() and not p.is_symlink()), 0
    return _files_size(root, tracked), _files_size(root, listed("--others", "--exclude-standard") or [])


def margin(bundle: int, tracked: int) -> float:
    """MiB the device tool's limit leaves once the bundle and a clean clone are carried."""
    return LIMIT_MIB - (bundle + tracked) / MIB


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m contract.gpu.bundle")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--python-version", default="3.12")
    parser.add_argument("--machine-packages", type=Path, default=ROOT / "scripts" / "gpu-machine-packages.txt")
    parser.add_argument("--add-release", action="store_true",
                        help="add this Python's vLLM to a folder packed before (closure and wheels shared)")
    parser.add_argument("--unpack", metavar="VERSION", help="unpack VERSION's vLLM and the closure of the bundle "
                        "--out into --site, with the Python that runs there")
    parser.add_argument("--site", type=Path)
    args = parser.parse_args(argv)
    if args.unpack:
        unpack(args.out, args.unpack, args.site)
        return 0
    if args.add_release:
        manifest = add_release(args.out)
    else:
        manifest = pack(args.out, args.python_version, machine_packages(args.machine_packages))
    bundle, (tracked, untracked) = size(args.out), tree_size(ROOT, args.out.resolve())
    releases = ", ".join(f"vLLM {v} ({n} files)" for v, n in manifest["releases"].items())
    left = margin(bundle, tracked)
    print(f"packed {releases}: {(args.out / RELEASES).stat().st_size / MIB:.1f} MiB; closure {manifest['files']} "
          f"files, {len(manifest['wheels'])} wheels (cp{manifest['python_version'].replace('.', '')}): bundle "
          f"{bundle / MIB:.1f} MiB; with the tracked tree ({tracked / MIB:.1f} MiB): {(bundle + tracked) / MIB:.1f} MiB "
          f"of {LIMIT_MIB:g}, {left:.1f} MiB to spare (at least {SPARE_MIB:g} kept)"
          + (f"; this checkout's untracked files add {untracked / MIB:.1f} MiB" if untracked else ""))
    if not args.add_release:
        print("wheels: " + (", ".join(manifest["wheels"]) or "none"))
    if left - untracked / MIB < 0:
        print(f"error: the bundle and the working tree exceed {LIMIT_MIB:g} MiB", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
