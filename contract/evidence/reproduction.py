"""The ``vllm serve`` command a root-cause page leads with, or why it has none.

Among the root cause's witnesses (class witnesses, property witnesses, regression traces) and the
releases its affected matrix confirms for the witness's runner, newest first: the first command
``reach`` finds for the witness's scenario that runs on one GPU (``reach.Plan.one_gpu``), else the
first that runs on several (DBO's data parallelism), labelled so; else the reasons none does.
``repro_check`` runs every such command through its release's own code, like the report pages'.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from contract.core.scenario import Runner
from contract.core.trace import TraceError, load
from contract.evidence import reach, serve
from contract.evidence import root_causes as rc
from contract.evidence.matrix import RELEASES
from contract.evidence.release_facts import committed
from contract.families import load_policy

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Reproduction:
    release: str | None
    command: serve.Command | None
    witness: str  # the trace the command reproduces, relative to the project root; "" without one
    reason: str  # why no one-GPU command; "" when there is one

    @property
    def one_gpu(self) -> bool:
        return self.command is not None and self.command.plan.one_gpu


def _confirmed(cells: dict, runner: Runner) -> list[str]:
    """The releases the matrix confirms for ``runner``, newest first."""
    return [r for r in reversed(RELEASES)
            if any(row[r].state == rc.CONFIRMED for (name, _), row in cells.items() if name == runner.name)]


def choose(cause: rc.RootCause, cells: dict, root: Path = ROOT) -> Reproduction:
    facts = committed()
    several, reasons = None, []
    for unit in cause.units:
        try:
            trace = load(root / unit.home.source)
        except (TraceError, OSError):
            continue
        for release in _confirmed(cells, trace.scenario.runner):
            if release not in facts:
                continue
            found = reach.reach(trace.scenario, release)
            if not found.reachable:
                reasons.append((release, found.reason))
                continue
            if not found.plan.fits:
                reasons.append((release, f"{found.plan.model}'s weights do not fit: {found.plan.weights}"))
                continue
            command = serve.reproductions(trace, load_policy(trace.policy), facts[release])[-1]
            repro = Reproduction(release, command, unit.home.source, "")
            if found.plan.one_gpu:
                return repro
            several = several or Reproduction(release, command, unit.home.source,
                                              f"needs {found.plan.gpus} GPUs: "
                                              + "; ".join(n for n in found.plan.notes if "GPU" in n))
            break
    if several is not None:
        return several
    return Reproduction(None, None, "", summary(reasons) or "no witness could be loaded")


def summary(reasons: list[tuple[str, str]], width: int = 240) -> str:
    """Each distinct reason once, with the releases it holds on: ``vLLM 0.34.0, 0.33.0: ...``."""
    grouped: dict[str, list[str]] = {}
    for release, text in reasons:
        text = re.sub(r"^(not reachable with the public models of|no reproduction on) vLLM \S+:? ?", "", text)
        text = re.sub(r"^with the checkpoints this project stores: ", "", text)
        text = text if len(text) <= width else text[:width - 3] + "..."
        if release not in grouped.setdefault(text, []):
            grouped[text].append(release)
    return "; ".join(f"vLLM {', '.join(rs)}: {text}" for text, rs in grouped.items())
