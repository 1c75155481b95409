"""The records of the real side's size check (``contract/runners/<runner>/real/sizes.py``) judged:
P8 against the release's documented sizes (the model's derivation, ``contract/core/capture_sizes.py``,
and the graphs the family's manager captures from it), and vLLM's derived lists against the model's.
Used by the branch check (``contract/branch/sizes.py``) and by a release's conformance run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from contract.core import ranks
from contract.core.family import SizeModel
from contract.core.sizes import Batch, Gap, RunsError, SizeSetting, batches, class_flags, crash, judge, served_from


class SizesProblem(Exception):
    """The size check's child failed or answered something other than it was asked; one line."""


@dataclass
class Side:
    """One side's judged records: per signature, per setting, the batches that show it."""

    found: dict[Gap, dict[SizeSetting, list[Batch]]] = field(default_factory=dict)
    derived: dict[SizeSetting, dict | str] = field(default_factory=dict)  # the lists, or the rejection
    documented: dict[SizeSetting, list[str]] = field(default_factory=dict)
    reached: set[str] = field(default_factory=set)
    tree_modules: list[str] = field(default_factory=list)


def judged(model: SizeModel, release: str, settings: list[SizeSetting], data: dict, what: str) -> Side:
    """P8 over one side's records, against the release's documented sizes."""
    side = Side(reached=set(data["reached"]), tree_modules=list(data["tree_modules"]))
    for s, record in zip(settings, data["records"]):
        if "raised" in record:
            gap = crash(str(record.get("phase")), str(record["raised"]), record.get("at"))
            side.found.setdefault(gap, {})[s] = []
            if "derived" in record:  # it raised dispatching: the lists it derived stand
                side.derived[s] = {"cudagraph_mode": record.get("mode"), **record["derived"]}
            continue
        if "rejected" in record:
            side.derived[s] = str(record["rejected"])
            continue
        try:
            served = served_from(s, record["served"])
        except (RunsError, KeyError, TypeError, ValueError) as exc:
            raise SizesProblem(f"{what}: {exc}") from None
        side.derived[s] = {"cudagraph_mode": record.get("mode"), **record.get("derived", {})}
        best = model.best_graph(s, model.lists(s, release), release)
        result = judge(served, best, [str(x) for x in record.get("logged", [])], s)
        gaps = dict(result.gaps)
        if "ranks" in record:  # P9 on two DP ranks (contract/core/ranks.py); a rank past the deadline answered nothing
            try:
                per_rank = [r if isinstance(r, dict) else {"served": []} for r in record["ranks"]]
                gaps.update(ranks.judged(s, per_rank, best))
            except (KeyError, TypeError, ValueError, IndexError) as exc:
                raise SizesProblem(f"{what}: the ranks' records: {exc}") from None
        for gap, shown in gaps.items():
            side.found.setdefault(gap, {})[s] = shown
        if result.documented:
            side.documented[s] = result.documented
    return side


def model_lists(model: SizeModel, s: SizeSetting, release: str) -> dict | str:
    d = model.lists(s, release)
    return d.rejected if d.rejected is not None else {"cudagraph_mode": d.cudagraph_mode, **d.lists()}


def same(real: dict | str, model: dict | str) -> bool:
    if isinstance(real, str) or isinstance(model, str):
        return isinstance(real, str) and isinstance(model, str)  # both reject (vLLM's wording is its own)
    return real == model


def disagreements(model: SizeModel, side: Side, settings: list[SizeSetting], release: str) -> list[str]:
    """The settings (as flags) where vLLM's derived lists, or its rejection, are not the model's."""
    return [s.flags() for s in settings if s in side.derived and not same(side.derived[s], model_lists(model, s, release))]


def conformance(model: SizeModel, release: str, settings: list[SizeSetting], records: list[dict]) -> dict:
    """A release's size check for its conformance report: how many settings' derived lists (or
    rejections) agree with the model's, how many vLLM rejects, the batches of the others and their
    steps on two DP ranks (where the family runs them), the P8 and P9 classes (each with its first
    setting), the downgrades vLLM logged."""
    side = judged(model, release, settings, {"records": records, "reached": [], "tree_modules": []},
                  f"vLLM {release}")
    rejected = {s for s, d in side.derived.items() if isinstance(d, str)}
    return {"settings": len(settings), "derived": len(side.derived), "rejected": len(rejected),
            "dispatch": model.dispatch, "disagreements": disagreements(model, side, settings, release),
            "batches": sum(1 for s in settings if s not in rejected for _ in batches(s)),
            "rank_steps": sum(len(ranks.rank_steps(s)) for s, r in zip(settings, records)
                              if s not in rejected and "ranks" in r),
            "classes": [{**gap.to_json(), "settings": len(where),
                         "first": class_flags(min(where, key=settings.index), gap.kind)}
                        for gap, where in sorted(side.found.items())],
            "documented": [f"{s.flags()}: {line}" for s, lines in side.documented.items() for line in lines]}
