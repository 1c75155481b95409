"""Verifier speed and strength, written to reports/benchmarks.md and reports/mutation.md.

    .venv/bin/python benchmarks/verifier.py            # both files
    .venv/bin/python benchmarks/verifier.py --only mutation

For every defect (each failing (built-in policy, property) and each killable mutant): median time
and examples to the first counterexample per profile (generation only, no shrinking), the
Hypothesis `ci` shrunk length over the explorer's shortest; model steps and explorer states per
second; the real-replay cost ratio when a vLLM environment is there. Figures are measurements of
one run on the machine named in the file, never thresholds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hypothesis import Phase, settings  # noqa: E402

from contract.core import profiles  # noqa: E402
from contract.core.expected import FAILS  # noqa: E402
from contract.core.explore import explore  # noqa: E402
from contract.core.machine import run_machine  # noqa: E402
from contract.families import MUTANTS, mutant_policy  # noqa: E402
from contract.families import BUILT_IN, load_policy  # noqa: E402
from contract.core.output import write_atomic  # noqa: E402

DEV_SEEDS = range(5)
CI_REPEATS = 3


def machine_line() -> str:
    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, {date.today().isoformat()}"


def defects():
    """(name, policy, base, only): built-in failures per property, then every killable mutant."""
    for name in BUILT_IN:
        for prop in sorted(FAILS[name]):
            yield f"{name} {prop}", load_policy(name), None, frozenset({prop})
    for m in MUTANTS:
        if not m.equivalent:
            yield f"mutant {m.name}", mutant_policy(m), load_policy(m.base), None


def first_counterexample(policy, base, only, profile: str, seed):
    s = settings(profiles.get(profile), phases=[Phase.generate])
    stats: dict = {}
    started = time.perf_counter()
    found = run_machine(policy, s, only, seed=seed, base=base, stats=stats)
    return time.perf_counter() - started, stats["examples"], found is not None


def speed_rows():
    rows = []
    for name, policy, base, only in defects():
        row = {"defect": name}
        runs = [first_counterexample(policy, base, only, "ci", None) for _ in range(CI_REPEATS)]
        row["ci"] = (statistics.median(r[0] for r in runs), runs[0][1], all(r[2] for r in runs))
        runs = [first_counterexample(policy, base, only, "dev", seed) for seed in DEV_SEEDS]
        row["dev"] = (statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs),
                      sum(r[2] for r in runs))
        shrunk = run_machine(policy, profiles.get("ci"), only, base=base)
        shortest = explore(policy, only=only, base=base, first_only=base is not None)
        row["shrunk"] = len(shrunk.events) if shrunk else None
        row["shortest"] = min((len(t.events) for t in shortest.counterexamples.values()), default=None)
        rows.append(row)
        print(name, row, flush=True)
    return rows


def throughput():
    out = {}
    started = time.perf_counter()
    results = [explore(load_policy(name)) for name in BUILT_IN]
    seconds = time.perf_counter() - started
    out["explorer_seconds"] = seconds
    out["explorer_states"] = sum(r.states for r in results)
    out["model_steps"] = sum(r.transitions for r in results)
    out["states_per_s"] = out["explorer_states"] / seconds
    out["steps_per_s"] = out["model_steps"] / seconds
    return out


def replay_ratio():
    python = ROOT / ".venv-vllm-0.30.0" / "bin" / "python"
    if not python.exists():
        return None
    proc = subprocess.run([str(python), "benchmarks/conformance_cost.py", "--traces", "200", "--repeat", "1"],
                          cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return proc.stdout.strip().splitlines()[-6:] if proc.returncode == 0 else None


def benchmarks_page(rows, tp, ratio) -> str:
    lines = [
        "# Verifier benchmarks",
        "",
        "Regenerate: `.venv/bin/python benchmarks/verifier.py`",
        "",
        f"Machine: {machine_line()}. One run; no figure here is enforced by a test.",
        "",
        "## Time and examples to the first counterexample",
        "",
        f"Generation only (no shrinking). `ci`: derandomized, median of {CI_REPEATS} runs (the examples are "
        f"the same each run). `dev`: median over seeds {list(DEV_SEEDS)}; 'found' counts the seeds that found it. "
        "Shrunk: the `ci` profile's shrunk counterexample; shortest: the breadth-first explorer's "
        "(for mutants, the shortest within the first scenario that shows the difference).",
        "",
        "| defect | ci time (s) | ci examples | dev time (s) | dev examples | dev found | shrunk / shortest |",
        "|---|---|---|---|---|---|---|",
    ]
    exact = 0
    for r in rows:
        ratio_text = "-"
        if r["shrunk"] and r["shortest"]:
            ratio_text = f"{r['shrunk']} / {r['shortest']} = {r['shrunk'] / r['shortest']:.2f}"
            exact += r["shrunk"] == r["shortest"]
        ci_t, ci_n, ci_ok = r["ci"]
        dev_t, dev_n, dev_found = r["dev"]
        lines.append(f"| {r['defect']} | {ci_t:.2f}{'' if ci_ok else ' (not found)'} | {ci_n} | {dev_t:.2f} | "
                     f"{dev_n:.0f} | {dev_found}/{len(DEV_SEEDS)} | {ratio_text} |")
    slow = [r["defect"] for r in rows if r["ci"][0] >= 1.0]
    lines += [
        "",
        "Targets: every defect found in under 1 s median by `ci` — "
        + ("met." if not slow else f"missed for {len(slow)} of {len(rows)}: {', '.join(slow)}.")
        + f" Shrunk/shortest = 1.0 for at least 90% of defects — {exact} of {len(rows)} "
        f"({100 * exact / max(len(rows), 1):.0f}%)"
        + (", met." if exact >= 0.9 * len(rows) else ", missed: the start-up rule shrinks towards vLLM's default path "
           "(with `profile_cudagraph_memory`), one event longer than the explorer's shortest path when "
           "`--kv-cache-memory-bytes` skips it."),
        "",
        "## Throughput",
        "",
        f"- Explorer over the four built-in policies: {tp['explorer_states']} states, {tp['model_steps']} model steps "
        f"in {tp['explorer_seconds']:.1f} s: {tp['states_per_s']:.0f} states/s, {tp['steps_per_s']:.0f} model steps/s "
        "(target: under 30 s).",
    ]
    if ratio:
        lines += ["- Real-code replay on vLLM 0.30.0 (`benchmarks/conformance_cost.py --traces 200`):", "", "```", *ratio, "```"]
    else:
        lines.append("- Real-code replay: no `.venv-vllm-0.30.0` here; run `make vllm-envs` first.")
    lines.append("")
    return "\n".join(lines)


def kill_matrix():
    rows = []
    for m in MUTANTS:
        policy, base = mutant_policy(m), load_policy(m.base)
        ci = run_machine(policy, profiles.get("ci"), base=base)
        dev = run_machine(policy, profiles.get("dev"), base=base, seed=0)
        ex = explore(policy, base=base, first_only=True)
        first = min(ex.counterexamples.items(), key=lambda kv: (len(kv[1].events), kv[0]), default=None)

        def cell(found):
            return "survives" if found is None else f"{found.violation.property} ({len(found.events)})"

        rows.append((m, cell(ci), cell(dev), "survives" if first is None else f"{first[0]} ({len(first[1].events)})"))
        print(m.name, rows[-1][1:], flush=True)
    return rows


def mutation_page(rows) -> str:
    killable = [r for r in rows if not r[0].equivalent]
    lines = [
        "# Mutation kill matrix",
        "",
        "Regenerate: `.venv/bin/python benchmarks/verifier.py --only mutation`",
        "",
        f"Machine: {machine_line()}.",
        "",
        "Each mutant runs in lockstep with its base policy; it is killed where, on some sequence, a step "
        "violates a property under one and not the other, or vLLM stops under one only (`halt`). Cells: "
        "what the engine reported first and the counterexample's length in events. `dev` is seed 0.",
        "",
        "| mutant | area | base | ci | dev | explorer | what changes |",
        "|---|---|---|---|---|---|---|",
    ]
    for m, ci, dev, ex in rows:
        what = m.description + (f" **Equivalent:** {m.equivalent}" if m.equivalent else "")
        lines.append(f"| `{m.name}` | {m.area} | `{m.base}` | {ci} | {dev} | {ex} | {what} |")
    for engine, index in (("ci", 1), ("dev", 2), ("explorer", 3)):
        killed = sum(r[index] != "survives" for r in killable)
        lines.append("")
        lines.append(f"{engine}: {killed} of {len(killable)} killable mutants killed "
                     f"({100 * killed / len(killable):.0f}%).")
    lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description="verifier benchmarks and kill matrix")
    parser.add_argument("--only", choices=["benchmarks", "mutation"])
    args = parser.parse_args()
    if args.only in (None, "benchmarks"):
        page = benchmarks_page(speed_rows(), throughput(), replay_ratio())
        write_atomic(ROOT / "reports" / "benchmarks.md", page)
    if args.only in (None, "mutation"):
        write_atomic(ROOT / "reports" / "mutation.md", mutation_page(kill_matrix()))
    print(json.dumps({"written": args.only or "both"}))


if __name__ == "__main__":
    main()
