"""Unpack one vLLM release's Python source (``vllm/**.py`` from its wheel) into ``DEST/<release>/vllm``.

The pages cite lines of releases that ``make test`` builds no environment for (0.28.0, 0.31.0,
0.32.0); the permalink and "since" checks read their source from here through
``CONTRACT_VLLM_SOURCES`` (``contract/evidence/since.py``). Only ``.py`` files are unpacked, so a
release costs its wheel's download and a few megabytes of disk.

Usage: python scripts/vllm_source.py RELEASE DEST
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path


def unpack(release: str, dest: Path) -> Path:
    target = dest / release
    with tempfile.TemporaryDirectory(prefix=f"vllm-{release}-") as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:",
                        f"vllm=={release}", "-d", tmp], check=True)
        wheels = sorted(Path(tmp).glob(f"vllm-{release}-*.whl"))
        if len(wheels) != 1:
            raise SystemExit(f"error: pip downloaded {len(wheels)} wheels for vllm=={release}; expected one")
        with zipfile.ZipFile(wheels[0]) as wheel:
            names = [n for n in wheel.namelist() if n.startswith("vllm/") and n.endswith(".py")]
            partial = Path(tempfile.mkdtemp(prefix=f".{release}-", dir=dest))
            wheel.extractall(partial, members=names)
    if target.exists():
        raise SystemExit(f"error: {target} exists; remove it to unpack {release} again")
    partial.rename(target)
    return target


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.rsplit("Usage: ", 1)[1].strip(), file=sys.stderr)
        return 2
    dest = Path(argv[1])
    dest.mkdir(parents=True, exist_ok=True)
    target = unpack(argv[0], dest)
    print(f"{target}: {sum(1 for _ in target.rglob('*.py'))} files")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
