"""``make fixes``: ``cudagraph-contract fix-check`` on every patch and wrong fix under ``fixes/``, and
on ``fixes/drop-every-graph``'s patch for every release a root cause patches, each on the release it
is for, its verdict written into the root cause's ``fix.json`` (``fix_check``: patch file ->
"accepted" or "rejected: reasons"), which the root-cause pages show and ``tests/test_fix_check.py``
holds the newest release's patch and a wrong fix to.

    python scripts/fix_checks.py [--missing] [fixes/<root-cause> ...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from contract.core.output import write_atomic  # noqa: E402


def verdict(patch: Path, release: str, folder: Path) -> str:
    with tempfile.TemporaryDirectory(prefix="fix-checks-") as tmp:
        done = subprocess.run([sys.executable, "-m", "contract.cli", "fix-check", str(patch), "--vllm", release,
                               "--root-cause", str(folder), "--corpus", "witnesses", "--json",
                               "--reports", str(Path(tmp) / "reports")],
                              cwd=ROOT, capture_output=True, text=True, timeout=1800)
    try:
        data = json.loads(done.stdout)
    except ValueError:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return f"not checked: {tail}"
    return "accepted" if data["accepted"] else "rejected: " + "; ".join(data["reasons"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="*", type=Path)
    parser.add_argument("--missing", action="store_true", help="check only patches without a recorded verdict")
    args = parser.parse_args()
    folders = args.folders or sorted(p.parent for p in (ROOT / "fixes").glob("*/fix.json"))
    for folder in folders:
        path = folder / "fix.json"
        data = json.loads(path.read_text(encoding="utf-8"))
        found = dict(data.get("fix_check", {})) if args.missing else {}
        drops = {release: f"../drop-every-graph/vllm-{release}.patch" for release in data.get("patches", {})}
        for kind, named in (("patches", data.get("patches", {})), ("wrong_fixes", data.get("wrong_fixes", {})),
                            ("drop-every-graph", drops)):
            for release, name in sorted(named.items()):
                if name not in found:
                    found[name] = verdict(folder / name, release, folder)
                    print(f"{folder.name} {name}: {found[name]}", flush=True)
                    data["fix_check"] = dict(sorted(found.items()))
                    write_atomic(path, json.dumps(data, indent=2) + "\n")  # each verdict kept as it comes
    return 0


if __name__ == "__main__":
    sys.exit(main())
