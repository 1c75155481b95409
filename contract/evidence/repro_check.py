"""Every reproduction the report pages show, run through its release's parser and config code.

For each violation page under ``reports/`` (``*/P*.json`` and ``*/classes/*.json``), the page's
release (``matrix.witness_release``) and the commands ``serve.markdown`` writes for its witness (the
default start-up, and the ``--kv-cache-memory-bytes`` one where the page shows it too), and the
command each root-cause page leads with (``reproduction.choose``), are checked
by ``engine_check`` in one child process per release, and the settings vLLM builds are compared with
the scenario's (``engine_check.compare``); a scenario no stored checkpoint reaches is listed with
``reach``'s reason instead. The same child runs *mutants*, page commands with one setting made
wrong, which the comparison must report, and the support-table variants of ``release_facts.json``.

``python -m contract.evidence.repro_check [--reports reports] [--release 0.34.0 ...]`` prints, per
release, how many commands matched, each setting that differs (one line), what each mutant was
caught on, the unreachable pages and the time taken; it exits 1 when a command does not match its
scenario or a mutant is not caught.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from contract.evidence import engine_check, matrix, reach, reproduction, serve
from contract.evidence import root_causes as rc
from contract.evidence.matrix import RELEASES
from contract.evidence.release_facts import adaptive_refused, committed, support_by_capability
from contract.families import load_policy
from contract.core.trace import load

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Page:
    path: str  # the trace, relative to the reports folder
    release: str
    commands: tuple[serve.Command, ...]  # () when unreachable
    reason: str  # reach's reason when unreachable


def pages(reports: Path) -> list[Page]:
    conformance = matrix.load_conformance(Path(reports) / "conformance")
    facts = committed()
    out = []
    paths = sorted(Path(reports).glob("*/P*.json")) + sorted(Path(reports).glob("*/classes/*.json"))
    for path in paths:
        trace = load(path)
        release = matrix.witness_release(trace, conformance)
        rel = path.relative_to(reports).as_posix()
        found = reach.reach(trace.scenario, release)
        if not found.reachable:
            out.append(Page(rel, release, (), found.reason))
            continue
        out.append(Page(rel, release, tuple(serve.reproductions(trace, load_policy(trace.policy), facts[release])), ""))
    return out + root_cause_pages(Path(reports), conformance)


def root_cause_pages(reports: Path, conformance: dict) -> list[Page]:
    """The command each root-cause page leads with (``reproduction.choose``)."""
    out = []
    for cause in rc.group(rc.load_entries(reports / "conformance"), rc.load_known(ROOT)):
        found = reproduction.choose(cause, rc.matrix(cause, conformance, ROOT), ROOT)
        path = f"root-causes/{cause.id}.md"
        out.append(Page(path, found.release, (found.command,), "") if found.command is not None
                   else Page(path, RELEASES[-1], (), found.reason))
    return out


@dataclass(frozen=True)
class Outcome:
    page: Page
    command: serve.Command
    failures: tuple[str, ...]


@dataclass(frozen=True)
class Mutant:
    """A page's command with one setting changed the way a wrong reproduction would have it; the
    comparison must report a line starting with ``setting`` for it."""

    label: str
    setting: str
    page: Page
    command: serve.Command
    trtllm_cubins: bool = False


def _with_env(c: serve.Command, name: str, value: str) -> serve.Command:
    env = dict(c.environ())
    env[name] = value
    return serve.Command(tuple(f"{k}={v}" for k, v in env.items()), c.argv, c.plan)


def _with_json_flag(c: serve.Command, flag: str, change) -> serve.Command:
    argv = list(c.argv)
    i = argv.index(flag) + 1
    value = json.loads(argv[i])
    change(value)
    argv[i] = json.dumps(value)
    return serve.Command(c.env, tuple(argv), c.plan)


def mutants(release: str, release_pages: list[Page]) -> list[Mutant]:
    """Wrong commands, one per setting the check must catch, made from ``release``'s pages: the
    runner variable, the breakable variable, the ``--attention-config`` that pins FlashInfer's
    level, the cudagraph mode, (MRV2) an EAGLE-3 head where the scenario needs an uncompiled
    draft, which is what the reproduction of that class used to be, and a draft backend vLLM refuses
    under adaptive verification, which is what the crash's reproduction used to be."""
    commands = [(p, p.commands[0]) for p in release_pages if p.commands]

    def first(pred):
        return next(((p, c) for p, c in commands if pred(c.plan)), None)

    out = []
    if commands:
        p, c = commands[0]
        flipped = "1" if c.environ().get("VLLM_USE_V2_MODEL_RUNNER") == "0" else "0"
        # 0.34.0 refuses VLLM_USE_V2_MODEL_RUNNER=0 outright (Platform.validate_environ)
        out.append(Mutant("runner variable flipped", "config" if release == "0.34.0" else "runner", p,
                          _with_env(c, "VLLM_USE_V2_MODEL_RUNNER", flipped)))

        def other_mode(cc):
            cc["cudagraph_mode"] = "NONE" if cc["cudagraph_mode"] != "NONE" else "PIECEWISE"

        out.append(Mutant("cudagraph_mode changed", "cudagraph_mode", p,
                          _with_json_flag(c, "--compilation-config", other_mode)))
    found = first(lambda plan: plan.scenario.breakable)
    if found:
        p, c = found
        out.append(Mutant("breakable variable off", "breakable", p, _with_env(c, "VLLM_USE_BREAKABLE_CUDAGRAPH", "0")))
    found = first(lambda plan: plan.backend == "FLASHINFER" and plan.attention_config)
    if found:
        p, c = found
        argv = list(c.argv)
        i = argv.index("--attention-config")
        del argv[i:i + 2]
        # with the TRT-LLM kernels available FlashInfer's default level differs from the pinned one
        # on some GPU in every release (release_facts.json)
        out.append(Mutant("FlashInfer without the --attention-config, TRT-LLM kernels available", "attention_support",
                          p, serve.Command(c.env, tuple(argv), c.plan), trtllm_cubins=True))
    found = first(lambda plan: plan.scenario.runner.name == "MRV2" and not plan.scenario.draft_compiled)
    if found:
        p, c = found
        swapped = serve.Command(c.env, tuple(reach.EAGLE_TARGET if a == c.plan.model else a for a in c.argv), c.plan)
        out.append(Mutant("EAGLE-3 head where the scenario needs an uncompiled draft", "draft_compiled", p,
                          _with_json_flag(swapped, "--speculative-config",
                                          lambda spec: spec.update(method="eagle3", model=reach.EAGLE_HEAD))))
    found = first(lambda plan: plan.scenario.adaptive_verification and plan.speculative is not None)
    if found:
        p, c = found
        out.append(Mutant("FlashInfer draft under adaptive verification", "attention backend selection", p,
                          _with_json_flag(c, "--speculative-config",
                                          lambda spec: spec.update(attention_backend="FLASHINFER"))))
    return out


@dataclass(frozen=True)
class ReleaseRun:
    outcomes: list[Outcome]
    mutants: list[tuple[Mutant, tuple[str, ...]]]  # each mutant and the failure lines it got
    support_table: dict  # backend -> variant -> capability -> level, as this run found it
    adaptive_refused: dict  # backend -> variant -> capabilities refused under adaptive verification
    timings: dict


def run_release(release: str, python: Path, release_pages: list[Page], *, with_mutants: bool = True,
                with_support_table: bool = True) -> ReleaseRun:
    """One child process for every command of ``release``'s pages (identical commands once), the
    mutants and the support-table variants (``release_facts.SUPPORT_VARIANTS``)."""
    unique: dict[tuple, engine_check.Request] = {}

    def add(env: dict, argv: tuple, cubins: bool = False) -> str:
        key = (tuple(sorted(env.items())), tuple(argv), cubins)
        if key not in unique:
            unique[key] = engine_check.Request(f"c{len(unique)}", dict(env), list(argv), cubins)
        return unique[key].id

    page_ids = [(p, c, add(c.environ(), c.argv)) for p in release_pages for c in p.commands]
    mutant_ids = [(m, add(m.command.environ(), m.command.argv, m.trtllm_cubins))
                  for m in (mutants(release, release_pages) if with_mutants else [])]
    support_ids = [add(r.env, tuple(r.argv), r.trtllm_cubins)
                   for r in (engine_check.support_requests() if with_support_table else [])]
    results, timings = engine_check.check(release, python, list(unique.values()))
    by_id = {r.id: r for r in results}
    outcomes = [Outcome(p, c, tuple(engine_check.compare(c.plan, by_id[i]))) for p, c, i in page_ids]
    mutated = [(m, tuple(engine_check.compare(m.command.plan, by_id[i]))) for m, i in mutant_ids]
    table, refused = engine_check.support_tables([by_id[i] for i in support_ids]) if support_ids else ({}, {})
    return ReleaseRun(outcomes, mutated, table, refused, {**timings, "commands_checked": len(unique)})


def _child_cpu() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m contract.evidence.repro_check")
    parser.add_argument("--reports", type=Path, default=ROOT / "reports")
    parser.add_argument("--release", action="append", default=None)
    args = parser.parse_args(argv)
    all_pages = pages(args.reports)
    releases = args.release or sorted({p.release for p in all_pages})
    failed = False
    for release in releases:
        release_pages = [p for p in all_pages if p.release == release]
        python = ROOT / f".venv-vllm-{release}" / "bin" / "python"
        t0, cpu0 = time.monotonic(), _child_cpu()
        run = run_release(release, python, release_pages)
        cpu = _child_cpu() - cpu0
        bad = [o for o in run.outcomes if o.failures]
        t = run.timings
        print(f"vLLM {release}: {len(run.outcomes) - len(bad)} of {len(run.outcomes)} commands match their scenario "
              f"({t['commands_checked']} distinct commands checked with the mutants and support variants; "
              f"{time.monotonic() - t0:.1f} s wall, {cpu:.1f} s CPU in the child; child start {t.get('start')} s, "
              f"commands {t.get('commands')} s)")
        for o in bad:
            failed = True
            for line in o.failures:
                print(f"  {o.page.path}: {line}")
        for m, failures in run.mutants:
            caught = [line for line in failures if line.startswith(m.setting)]
            print(f"  mutant '{m.label}' ({m.page.path}): " + (caught[0][:200] if caught else "NOT CAUGHT"))
            failed |= not caught
        if (run.support_table, run.adaptive_refused) != (support_by_capability(release), adaptive_refused(release)):
            failed = True
            print(f"  release_facts.json's support tables differ from this run: refresh them with "
                  f"python -m contract.evidence.engine_check --support-table {release}")
        for p in release_pages:
            if not p.commands:
                print(f"  {p.path}: {p.reason}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
