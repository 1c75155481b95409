"""The report of a branch replay (``conform --vllm-src``): a folder of its own that names the tree,
its changes against the base, what was replayed, the classes new, fixed and inherited with a
witness trace each, and every step where vLLM's code behaved differently on the branch."""

from __future__ import annotations

import json
from pathlib import Path

from contract.core.output import write_atomic

SECTIONS = ("new", "lost", "traded", "fixed", "inherited")
LABELS = {"new": "new", "lost": "lost graphs", "traded": "traded", "fixed": "fixed", "inherited": "inherited"}


def witness_files(folder: Path, run) -> dict[tuple[str, str], Path]:
    """(section, class id) -> the witness trace's path in the report folder."""
    return {(key, c.id): folder / key / f"{c.id}.json" for key in SECTIONS for c in getattr(run.differential, key)}


def _json_cell(value) -> str:
    return "—" if value is None else f"`{json.dumps(value, sort_keys=True)[:300]}`"


def markdown(run, folder: Path) -> str:
    r, d = run.review, run.differential
    lines = [f"# {r.tree.tree} against vLLM {run.version} ({run.family.title})", "",
             "Both sides ran vLLM's own code on CPU with CUDA graphs simulated (`cudagraph-contract conform "
             "--vllm-src`): the release as installed, and the release with the tree's differing modules on top.", "",
             f"- Base: {r.base.said}", f"- Tree: `{r.tree.tree}` ({r.tree.read})",
             f"- Modules taken from the tree: {', '.join(f'`{m}`' for m in run.tree_modules) or 'none'}",
             f"- Replayed: {len(run.traces)} traces ({run.selection.why})", "", "## What the tree changes", ""]
    lines += [f"- {line.strip()}" for line in r.lines("conform")[1:]] or ["- nothing"]
    lines += ["", f"## What the replay ran of it: {exercise_line(run)}", ""]
    if run.unexercised:
        lines += ["Changes no replayed trace ran (a function never called, a changed module level never imported): "
                  "the model's scenarios or events do not reach them, so this report says nothing of them.", ""]
        lines += [f"- `{change}`" for change in run.unexercised]
    lines += ["", f"## Classes: {d.summary()}", "",
              "Worst severity first. Lost graphs: traces where vLLM's code on the tree serves fewer dispatches of a "
              "kind with a CUDA graph than the release (each trace is the same serving script); traded: a class the "
              "release shows and the tree does not, in a trace where the tree lost graphs.", ""]
    files = witness_files(folder, run)
    for key in SECTIONS:
        for c in getattr(d, key):
            lines.append(f"- **{LABELS[key]}** ({c.severity_text}): {c.title} — witness "
                         f"[`{key}/{c.id}.json`]({files[(key, c.id)].relative_to(folder)})"
                         f" ({c.length} events: {c.events_text}): {c.message}")
    if run.sizes is not None:
        lines += ["", "## Capture sizes", "",
                  "Every setting of the boundary grid (`contract/core/sizes.py`) through vLLM's own size derivation "
                  "and `CudaGraphManager.dispatch`, on the release and on the tree, each batch up to one past the "
                  "requested capture ceiling judged by P8 (graph coverage) against the graphs the release's "
                  "derivation gives (the tree's own lists are compared, not judged). A "
                  "witness file is a setting: `conform --vllm-src TREE --base RELEASE --traces WITNESS` checks it "
                  "alone.", ""]
        lines += [f"- {line}" if not line.startswith("  ") else f"  - {line.strip()}"
                  for line in sizes_lines(run.sizes, size_witness_files(folder, run.sizes), folder)]
    lines += ["", f"## Steps where vLLM's observation differs ({len(run.changes)})", ""]
    if run.changes:
        lines += ["| trace | step | event | base | branch |", "|---|---|---|---|---|"]
        lines += [f"| `{c.trace}` | {c.step} | {c.event} | {_json_cell(c.base)} | {_json_cell(c.branch)} |"
                  for c in run.changes]
    else:
        lines.append("None: every replayed step is the same on the branch as on the base.")
    return "\n".join(lines) + "\n"


def sizes_lines(sizes, files: dict | None = None, relative_to: Path | None = None) -> list[str]:
    """The capture-size check (``contract/branch/sizes.py``) as a reviewer reads it: the counts, each
    class with its witness file (``files``, shown relative to ``relative_to``), where the tree derives
    other lists than the release, and what vLLM logged as a downgrade."""
    lines = [f"capture sizes: {sizes.settings} settings, {sizes.batches:,} batches dispatched on each side: "
             f"{len(sizes.new)} new, {len(sizes.fixed)} fixed, {len(sizes.inherited)} inherited"]
    for key in SIZE_SECTIONS:
        for c in getattr(sizes, key):
            path = (files or {}).get((key, c.id))
            lines.append(f"  {key}: " + c.line("" if path is None else str(path.relative_to(relative_to) if relative_to
                                                                         else path)))
    if sizes.changed:
        lines.append(f"  the tree derives other capture sizes than the release in {len(sizes.changed)} setting(s); "
                     f"first: {sizes.changed[0]}")
    if sizes.disagreements:
        lines.append(f"  the model's derivation differs from the release's in {len(sizes.disagreements)} setting(s) "
                     f"(a gap in the model); first: {sizes.disagreements[0]}")
    lines += [f"  documented downgrade: {line}" for line in sizes.documented[:3]]
    return lines


def exercise_line(run) -> str:
    """``2 of 3 changes ran`` and the like, with the verdict it allows."""
    n, left = len(run.changed), len(run.unexercised)
    if not n:
        return "no change of the tree's is code the replay could run"
    if not run.exercised:
        return f"none of the {n} change{'s' if n != 1 else ''} ran (not exercised: nothing new says nothing of them)"
    return f"{n - left} of {n} change{'s' if n != 1 else ''} ran" + (f"; {left} did not (below)" if left else "")


SIZE_SECTIONS = ("new", "fixed", "inherited")


def size_witness_files(folder: Path, sizes) -> dict[tuple[str, str], Path]:
    """(section, size class id) -> its witness's path in the report folder."""
    if sizes is None:
        return {}
    return {(key, c.id): folder / "sizes" / key / f"{c.id}.json" for key in SIZE_SECTIONS for c in getattr(sizes, key)}


def write(folder: Path, run) -> Path:
    for key in SECTIONS:
        for c in getattr(run.differential, key):
            write_atomic(folder / key / f"{c.id}.json", c.witness.dumps())
    if run.sizes is not None:
        for key in SIZE_SECTIONS:
            for c in getattr(run.sizes, key):
                write_atomic(folder / "sizes" / key / f"{c.id}.json", c.witness_json(run.version))
    write_atomic(folder / "branch.json", json.dumps(run.to_json(), indent=1, sort_keys=True) + "\n")
    index = folder / "README.md"
    write_atomic(index, markdown(run, folder))
    return index
