"""The vLLM paths whose change must run the check in vLLM's CI and pre-commit hook, derived from the
runner families: every module and package a family's replay runs (``Family.replays``) and every file
``verify --vllm-src`` reads (``Family.reads``).

``docs/ci.md``'s workflow (``paths:``) and ``.pre-commit-hooks.yaml`` (``files:``) carry exactly these;
``python -m contract.branch.triggers`` prints them, ``--check`` exits 1 when either file has drifted
and ``--write`` rewrites both (``tests/test_ci_docs.py`` runs the check).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from contract.families import FAMILIES

# The dotted names in Family.replays that are packages (their every module may run), not single
# modules; tests/test_ci_docs.py checks each name against the installed releases' trees.
PACKAGES = frozenset({"vllm.config", "vllm.v1.attention.backends", "vllm.v1.worker.gpu.spec_decode"})
ROOT = Path(__file__).resolve().parents[2]
WORKFLOW_DOC = Path("docs") / "ci.md"
HOOKS = Path(".pre-commit-hooks.yaml")


def module_pattern(name: str) -> str:
    """``vllm.a.b`` -> ``vllm/a/b.py``, or ``vllm/a/b/**`` for a package."""
    path = "/".join(name.split("."))
    return f"{path}/**" if name in PACKAGES else f"{path}.py"


def covers(pattern: str, path: str) -> bool:
    """Whether a workflow ``paths:`` pattern (a file, or ``folder/**``) selects ``path``."""
    return path.startswith(pattern[:-2]) if pattern.endswith("/**") else path == pattern


def patterns() -> tuple[str, ...]:
    """The path patterns, sorted, none inside another's folder."""
    found = {module_pattern(name) for f in FAMILIES for name in f.replays}
    found |= {f"vllm/{path}" for f in FAMILIES for path, _ in f.reads}
    folders = [p for p in found if p.endswith("/**")]
    return tuple(sorted(p for p in found if not any(q != p and covers(q, p) for q in folders)))


def hook_regex(found: tuple[str, ...] | None = None) -> str:
    """The same patterns as one pre-commit ``files:`` regular expression."""
    parts = [re.escape(p[len("vllm/"):-3]) + "/.*" if p.endswith("/**") else re.escape(p[len("vllm/"):])
             for p in (found or patterns())]
    return "^vllm/(" + "|".join(parts) + ")$"


def _paths_block(found: tuple[str, ...]) -> str:
    return "".join(f"      - {p}\n" for p in found)


PATHS = re.compile(r"(    paths:\n)((?:      - .*\n)+)")
FILES = re.compile(r"^(  files: ).*$", re.MULTILINE)


def drift(root: Path = ROOT) -> list[str]:
    """What differs between the committed files and ``patterns()``; empty when they agree."""
    found = patterns()
    problems = []
    doc = (root / WORKFLOW_DOC).read_text(encoding="utf-8")
    block = PATHS.search(doc)
    if block is None or block.group(2) != _paths_block(found):
        problems.append(f"{WORKFLOW_DOC}: the workflow's paths: are not the derived patterns")
    hooks = (root / HOOKS).read_text(encoding="utf-8")
    files = FILES.search(hooks)
    if files is None or files.group(0) != f"  files: {hook_regex(found)}":
        problems.append(f"{HOOKS}: files: is not the derived pattern")
    return problems


def write(root: Path = ROOT) -> None:
    found = patterns()
    doc_path, hooks_path = root / WORKFLOW_DOC, root / HOOKS
    doc = PATHS.sub(lambda m: m.group(1) + _paths_block(found), doc_path.read_text(encoding="utf-8"), count=1)
    doc_path.write_text(doc, encoding="utf-8")
    hooks = FILES.sub(lambda m: m.group(1) + hook_regex(found), hooks_path.read_text(encoding="utf-8"), count=1)
    hooks_path.write_text(hooks, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m contract.branch.triggers", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/ci.md or the hook file has drifted")
    parser.add_argument("--write", action="store_true", help="rewrite both from the families")
    args = parser.parse_args(argv)
    if args.write:
        write()
    if args.check:
        problems = drift()
        for p in problems:
            print(p, file=sys.stderr)
        return 1 if problems else 0
    if not args.write:
        print("\n".join(patterns()))
        print(f"files: {hook_regex()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
