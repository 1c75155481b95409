"""The folder carried to a GPU machine that has torch but no vLLM and no network.

``python -m contract.gpu.bundle --out DIR [--python-version 3.12] [--machine-packages FILE] [--add-release]``,
run with the Python of a ``.venv-vllm-<version>`` environment, writes into ``DIR``:

- ``vllm-<version>.tar.gz``: every ``.py`` file of the installed ``vllm`` package and its ``dist-info``;
- ``site.tar.gz``: the pure-Python distributions of ``contract/real/constraints.txt`` plus the
  CLI's (typer, rich, ...), each without the members its RECORD places outside site-packages
  (console scripts, man pages: ``../../../bin/...``, which tar refuses to unpack);
- ``wheels/``: the wheels, for the target Python, of every compiled distribution the replay
  imports that the machine's package list lacks, fetched with ``pip download`` (only-binary, no
  dependencies, manylinux x86_64);
- ``manifest.json``: the releases packed (file counts), the pure distributions carried, the wheels
  carried, and the compiled distributions expected on the machine.

``--add-release``, run with another release's Python, adds only its ``vllm-<version>.tar.gz`` to a
folder packed before: every release shares the closure (``.venv-vllm``) and the wheels, so MRV1
(0.30.0) and MRV2 (0.34.0) travel together (``scripts/gpu-conformance.sh --vllm VERSION`` picks one).

Every ``.py`` file rather than the modules one CPU run imports: on a GPU host vLLM's import takes
other branches (triton active, ``VLLM_TARGET_DEVICE=cpu``), which reach modules a CPU run never
imports.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
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


def _tar(path: Path, files: dict[Path, Path]) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for p in sorted(files):
            tar.add(p, arcname=str(files[p]))


def pack_release(out: Path) -> tuple[str, int]:
    """``vllm-<version>.tar.gz`` of the installed vLLM; returns (version, files)."""
    import vllm

    # path -> name in the bundle, relative to the site folder that holds it: vLLM's own folder and
    # the shared closure's site-packages are two folders in the per-release layout.
    site = Path(vllm.__file__).parents[1]
    files = {p: p.relative_to(site) for p in (site / "vllm").rglob("*.py")}
    vllm_dist = md.distribution("vllm")
    files |= {Path(vllm_dist.locate_file(f)): Path(f) for f in vllm_dist.files or [] if ".dist-info" in str(f)}
    out.mkdir(parents=True, exist_ok=True)
    _tar(out / f"vllm-{vllm.__version__}.tar.gz", files)
    return vllm.__version__, len(files)


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


def pack(out: Path, python_version: str, machine: set[str]) -> dict:
    for old in out.glob("vllm-*.tar.gz"):  # a fresh pack holds only the releases packed from now
        old.unlink()
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
        files |= {p: p.relative_to(dist_site) for p in paths if p.is_file() and p.is_relative_to(dist_site)
                  and p.suffix != ".pyc" and "__pycache__" not in p.parts}
    _tar(out / "site.tar.gz", files)
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


def tree_size(root: Path, bundle: Path) -> int:
    """What is carried besides the bundle: git's tracked and not-ignored files, or (outside a git
    checkout, as on the machine it was carried to) every file but the bundle."""
    listed = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True)
    if listed.returncode == 0:
        files = [root / name for name in listed.stdout.decode().split("\0") if name]
    else:
        files = [p for p in root.rglob("*") if not p.is_relative_to(bundle)
                 and not any(part.startswith(".venv") for part in p.relative_to(root).parts)]
    return sum(p.stat().st_size for p in files if p.is_file() and not p.is_symlink())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m contract.gpu.bundle")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--python-version", default="3.12")
    parser.add_argument("--machine-packages", type=Path, default=ROOT / "scripts" / "gpu-machine-packages.txt")
    parser.add_argument("--limit-mib", type=float, default=64.0)
    parser.add_argument("--add-release", action="store_true",
                        help="add this Python's vLLM to a folder packed before (closure and wheels shared)")
    args = parser.parse_args(argv)
    if args.add_release:
        manifest = add_release(args.out)
    else:
        manifest = pack(args.out, args.python_version, machine_packages(args.machine_packages))
    bundle, tree = size(args.out), tree_size(ROOT, args.out.resolve())
    mib = 2 ** 20
    releases = ", ".join(f"vLLM {v} ({n} files, {(args.out / f'vllm-{v}.tar.gz').stat().st_size / mib:.1f} MiB)"
                         for v, n in manifest["releases"].items())
    print(f"packed {releases}; closure {manifest['files']} files, {len(manifest['wheels'])} wheels "
          f"(cp{manifest['python_version'].replace('.', '')}): {bundle / mib:.1f} MiB; with the working tree "
          f"({tree / mib:.1f} MiB): {(bundle + tree) / mib:.1f} MiB of {args.limit_mib:g}")
    if not args.add_release:
        print("wheels: " + (", ".join(manifest["wheels"]) or "none"))
    if bundle + tree > args.limit_mib * mib:
        print(f"error: the bundle and the working tree exceed {args.limit_mib:g} MiB", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
