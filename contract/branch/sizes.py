"""The capture-size check of a branch: every setting of ``contract/core/sizes.py``'s grid through
vLLM's own size derivation and manager, on the release and on the tree, judged by P8 against the
release's documented sizes, and compared as the trace replay's classes are (new, fixed, inherited,
per setting).

Both sides run in the release's environment, the tree's differing modules on top for the branch
(``observe.sizes``, a child with the same guarantees as the trace replay: ``contract/core/child.py``);
the release's side is kept in the base cache with its traces' observations.
The reference is the model: the release's derivation (``contract/core/capture_sizes.py``) and the
graphs its manager captures (the family's ``best_graph``). On the release, vLLM's derived lists must
equal the model's on every setting (``disagreements``, which a conformance run reports); on the
tree, where they differ from the release's is listed (``changed``) whatever P8 says of them.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from contract.branch import cache
from contract.core import child
from contract.core.family import Family
from contract.core.ranks import kind_count
from contract.core.sizes import Batch, Gap, SizeSetting, batches, class_flags, grid, witness_json
from contract.real import provenance
from contract.real.installed import EnvironmentProblem, import_root, replay_settings
from contract.real.sizes import Side, SizesProblem, disagreements, judged


@dataclass(frozen=True)
class SizeClass:
    """A signature and the settings that show it, the first (in grid order) its witness."""

    gap: Gap
    settings: tuple[SizeSetting, ...]
    batches: tuple[Batch, ...]  # the witness's batches that show it
    of: int  # the witness's batches of that kind

    @property
    def witness(self) -> SizeSetting:
        return self.settings[0]

    @property
    def id(self) -> str:
        """A file name: the signature's words, with a digest where a crash's text makes it long."""
        g = self.gap
        words = re.sub(r"[^A-Za-z0-9]+", "-", f"{g.property} {g.kind} {g.wanted} {g.served} {g.what}").strip("-")
        if len(words) <= 80:
            return words
        return f"{words[:70]}-{hashlib.sha256(words.encode()).hexdigest()[:8]}"

    def line(self, witness: str = "") -> str:
        """``[severity] title — witness FILE (where it shows)``, as the trace classes are listed."""
        w = self.witness
        where = f"{len(self.settings)} setting(s); first: {class_flags(w, self.gap.kind)}"
        if self.gap.property != "P0":
            shown = ", ".join(str(b.num_tokens) for b in self.batches[:6]) + (", ..." if len(self.batches) > 6 else "")
            what = "steps (the first rank's tokens" if "+" in self.gap.kind else "batches (tokens"
            where += f": {len(self.batches)} of {self.of} {self.gap.kind} {what} {shown})"
        return f"[{self.gap.severity}] {self.gap.title}" + (f" — witness {witness}" if witness else "") + f" ({where})"

    def witness_json(self, vllm: str) -> str:
        """The witness file: ``conform --vllm-src --traces`` checks its setting alone."""
        return json.dumps(witness_json(self.witness, self.gap, list(self.batches), vllm), indent=1) + "\n"

    def to_json(self) -> dict:
        return {**self.gap.to_json(), "settings": [s.to_json() for s in self.settings],
                "witness": {"setting": self.witness.to_json(), "flags": class_flags(self.witness, self.gap.kind),
                            "batches": [b.num_tokens for b in self.batches], "of": self.of}}


@dataclass
class SizesRun:
    settings: int
    batches: int
    new: list[SizeClass]
    fixed: list[SizeClass]
    inherited: list[SizeClass]
    disagreements: list[str]  # settings where the release's lists differ from the model's
    changed: list[str]  # settings where the tree's lists or rejection differ from the release's
    documented: list[str]  # "flags: vLLM's line", on the tree

    def to_json(self) -> dict:
        return {"settings": self.settings, "batches": self.batches,
                **{k: [c.to_json() for c in getattr(self, k)] for k in ("new", "fixed", "inherited")},
                "disagreements": self.disagreements, "changed": self.changed, "documented": self.documented}


def _observe(python: Path, family: Family, settings: list[SizeSetting], tree: Path | None, timeout: float | None,
             what: str, version: str, release_pkg: Path, watch: dict | None) -> dict:
    payload = {"runner": family.name, "settings": [s.to_json() for s in settings],
               "tree": str(Path(tree).resolve()) if tree is not None else None, "watch": watch or {}}
    try:
        data = child.run("contract.branch.observe:sizes", payload, what=what, timeout=timeout, python=python,
                         settings=replay_settings(), root=import_root()).value
    except (child.ChildProblem, EnvironmentProblem) as exc:
        raise SizesProblem(str(exc)) from None
    if not isinstance(data, dict) or not isinstance(data.get("records"), list):
        raise SizesProblem(f"{what} returned no size records")
    if [r.get("setting") if isinstance(r, dict) else None for r in data["records"]] != payload["settings"]:
        raise SizesProblem(f"{what} returned records of other settings than the {len(settings)} it was given")
    try:
        provenance.check_child(data, release_pkg, version, tree)
    except provenance.ProvenanceProblem as exc:
        raise SizesProblem(f"{what}: {exc}") from None
    return data


def _classes(pairs: dict[Gap, dict[SizeSetting, list[Batch]]], order: list[SizeSetting]) -> list[SizeClass]:
    out = []
    for gap, where in pairs.items():
        chosen = sorted(where, key=order.index)
        first = chosen[0]
        of = kind_count(first, gap.kind)
        out.append(SizeClass(gap, tuple(chosen), tuple(where[first]), of))
    return sorted(out, key=lambda c: (c.gap.property != "P0", c.gap))


def _split(mine: Side, theirs: Side, shared: bool) -> dict:
    out: dict = {}
    for gap, where in mine.found.items():
        for s, shown in where.items():
            if (s in theirs.found.get(gap, {})) == shared:
                out.setdefault(gap, {})[s] = shown
    return out


def base(python: Path, family: Family, version: str, release_pkg: Path, timeout: float | None,
         settings: list[SizeSetting] | None, entry: str, notes: cache.Notes) -> tuple[list[SizeSetting], list]:
    """The grid (or ``settings``) and the release's records of it: from the base cache (``entry``),
    else replayed now and kept there. Run it before the tree's code runs (the cache is watched then)."""
    settings = list(settings) if settings else grid()
    asked = [s.to_json() for s in settings]
    records = cache.load_sizes(entry, asked, notes)
    if records is None:
        records = _observe(python, family, settings, None, timeout, f"the size check of vLLM {version}", version,
                           release_pkg, None)["records"]
        cache.store_sizes(entry, asked, records)
    return settings, records


def run(python: Path, family: Family, version: str, release_pkg: Path, tree: Path, timeout: float | None,
        watch: dict, settings: list[SizeSetting], base_records: list) -> tuple[SizesRun, Side]:
    """The tree's side of ``settings``, judged and compared with the release's records (``base``);
    the tree's side also says what of it ran."""
    release = ".".join(version.split(".")[:2])
    branch_data = _observe(python, family, settings, tree, timeout, f"the size check of {tree}", version,
                           release_pkg, watch)
    base = judged(family.sizes, release, settings, {"records": base_records, "reached": [], "tree_modules": []},
                  f"the size check of vLLM {version}")
    branch = judged(family.sizes, release, settings, branch_data, f"the size check of {tree}")
    changed = [s.flags() for s in settings if base.derived.get(s) != branch.derived.get(s)]
    documented = [f"{s.flags()}: {line}" for s, lines in branch.documented.items() for line in lines]
    result = SizesRun(len(settings), sum(1 for s in settings for _ in batches(s)),
                      new=_classes(_split(branch, base, False), settings),
                      fixed=_classes(_split(base, branch, False), settings),
                      inherited=_classes(_split(branch, base, True), settings),
                      disagreements=disagreements(family.sizes, base, settings, release), changed=changed,
                      documented=documented)
    return result, branch
