"""Class enumeration and differential cost, written to reports/classes-benchmark.md.

    .venv/bin/python benchmarks/classes.py

Per built-in policy: the explorer without and with class enumeration (wall time, one process),
the classes found; then every mutant's differential against its base (the base's enumeration
reused). Measurements of one run on the machine named in the file, never thresholds.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from contract.core.differential import compare  # noqa: E402
from contract.core.explore import explore  # noqa: E402
from contract.families import MUTANTS, mutant_policy  # noqa: E402
from contract.families import BUILT_IN, load_policy  # noqa: E402
from contract.core.output import write_atomic  # noqa: E402


def timed(fn):
    started = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - started


def main() -> None:
    lines = ["# Class enumeration benchmark", "", "Regenerate: `.venv/bin/python benchmarks/classes.py`", "",
             f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
             f"{date.today().isoformat()}. One run, one process; no figure here is enforced by a test.", "",
             "## Every class of every built-in policy", "",
             "| policy | explorer (s) | explorer + classes (s) | classes | of which halts |", "|---|---|---|---|---|"]
    explored, total_plain, total = {}, 0.0, 0.0
    for name in BUILT_IN:
        _, plain = timed(lambda: explore(load_policy(name)))
        ex, seconds = timed(lambda: explore(load_policy(name), classify=True))
        explored[name] = ex
        total_plain, total = total_plain + plain, total + seconds
        halts = sum(1 for c in ex.classes if c.signature.property == "halt")
        lines.append(f"| `{name}` | {plain:.2f} | {seconds:.2f} | {len(ex.classes)} | {halts} |")
        print(name, f"{seconds:.2f}s", len(ex.classes), flush=True)
    lines += [f"| all | {total_plain:.2f} | {total:.2f} | {sum(len(e.classes) for e in explored.values())} | |", "",
              "## Mutants against their base", "",
              "| mutant | differential (s) | new | fixed | first new class |", "|---|---|---|---|---|"]
    for m in MUTANTS:
        d, seconds = timed(lambda: compare(mutant_policy(m), load_policy(m.base), base_exploration=explored[m.base]))
        first = d.new[0].title if d.new else "-"
        lines.append(f"| `{m.name}` | {seconds:.2f} | {len(d.new)} | {len(d.fixed)} | {first} |")
        print(m.name, f"{seconds:.2f}s", len(d.new), len(d.fixed), flush=True)
    write_atomic(ROOT / "reports" / "classes-benchmark.md", "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
