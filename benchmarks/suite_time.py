"""Where the test suite's time goes: a pytest ``--durations=0`` log summed by test file, largest first,
then the slowest tests (docs/measurements.md).

    PYTEST_ADDOPTS=--durations=0 make test 2>&1 | tee make-test.log
    .venv/bin/python benchmarks/suite_time.py make-test.log [--top 30]

Where the log holds several tables (``make test`` runs the lowest-version tests first), the last is
read: the main suite's. Under pytest-xdist the durations are each worker's, so their sum is about
twice the suite's wall time on two workers. A log is only read.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections import Counter
from pathlib import Path

LINE = re.compile(r"^\s*(\d+(?:\.\d+)?)s (setup|call|teardown)\s+(\S.*)$")
HEADER = re.compile(r"^=+ slowest( \d+)? durations =+$")


def durations(text: str) -> list[tuple[float, str, str]]:
    """(seconds, phase, test id) for each line of the log's last durations table."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if HEADER.match(line.strip())]
    lines = lines[starts[-1]:] if starts else lines
    return [(float(m[1]), m[2], m[3].strip()) for m in map(LINE.match, lines) if m]


def by_file(rows: list[tuple[float, str, str]]) -> Counter:
    totals: Counter = Counter()
    for seconds, _, test in rows:
        totals[test.split("::")[0]] += seconds
    return totals


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path)
    parser.add_argument("--top", type=int, default=20, help="slowest tests to list")
    args = parser.parse_args(argv)
    try:
        rows = durations(args.log.read_text(encoding="utf-8", errors="replace"))
    except OSError as exc:
        print(f"error: {args.log} cannot be read: {exc.strerror}", file=sys.stderr)
        return 2
    if not rows:
        print(f"error: {args.log} has no durations table: run pytest with --durations=0", file=sys.stderr)
        return 2
    totals = by_file(rows)
    print(f"{sum(totals.values()):.0f} s in {len(rows)} timed phases, {len(totals)} files\n")
    print("| file | s |\n|---|---|")
    for name, seconds in totals.most_common():
        print(f"| {name} | {seconds:.1f} |")
    print("\n| slowest | phase | s |\n|---|---|---|")
    for seconds, phase, test in sorted(rows, reverse=True)[:args.top]:
        print(f"| {test} | {phase} | {seconds:.1f} |")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # a reader that stopped early (``| head``) has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
