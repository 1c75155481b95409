"""What every command shares: the consoles, one-line errors, policy and profile arguments, output
folders written as a whole, the differential against a base, and the progress bar."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import typer
from rich.console import Console

from contract.core.output import OutputError, one_line
from contract.core.policy import PolicyError
from contract.core.trace import TraceError
from contract.families import BUILT_IN, load_policy

out = Console(highlight=False)
err = Console(stderr=True, highlight=False)


def error(message: str) -> None:
    from rich.markup import escape

    err.print(f"[bold red]error:[/] {escape(one_line(message))}", soft_wrap=True)


def fail(message: str) -> None:
    error(message)
    raise typer.Exit(2)


def parse_policy(spec: str):
    """A built-in name or a policy file; a trace given instead names the policy to pass."""
    if Path(spec).suffix == ".json":
        from contract.core.trace import load
        from contract.families import check_trusted

        t = load(spec)
        check_trusted(t.policy, spec)
        raise PolicyError(f"{spec} is a trace, not a policy: pass --policy {t.policy} to check the policy it "
                          f"was recorded under, or replay it with `cudagraph-contract replay {spec}`")
    return load_policy(spec)


def parse_policies(specs: list[str] | None):
    try:
        return [parse_policy(s) for s in (specs or list(BUILT_IN))]
    except (PolicyError, TraceError) as exc:
        fail(str(exc))


def check_out(folder: Path | None, option: str = "--out") -> None:
    from contract.core.output import check_folder

    if folder is not None:
        try:
            check_folder(folder, option)
        except OutputError as exc:
            fail(str(exc))


@contextmanager
def writing():
    """The command's files land together or not at all; a failure to write is one line."""
    from contract.core.output import transaction

    try:
        with transaction():
            yield
    except OutputError as exc:
        fail(str(exc))


def profile_settings(profile: str):
    from contract.core.profiles import get

    try:
        return get(profile)
    except ValueError as exc:
        fail(str(exc))


def verdicts_json(verdicts) -> dict:
    return {pid: {"holds": v.holds, "expected": v.expected, "length": v.length, "message": v.message,
                  "trace": v.trace.to_json() if v.trace is not None else None}
            for pid, v in verdicts.items()}


BASE_OPTION = typer.Option(
    None, "--base",
    help="Compare with a base and report new, fixed and inherited violation classes: auto (the release the "
         "branch is or starts from), a release (0.30.0), a built-in policy, a .py policy file or a vLLM tree. "
         "Exit 0 when nothing is new, 1 when something is.")


def base_differentials(policies, base, explored, tree, say) -> dict:
    """policy name -> (Differential, the line saying which base was chosen); ``say`` prints that
    line (a console, or None)."""
    if base is None:
        return {}
    from contract.branch import base as base_mod
    from contract.core.differential import compare

    found = {}
    for p in policies:
        try:
            base_policy, chosen = base_mod.resolve(base, p, tree if tree is not None and tree.policy is p else None)
            explored_base = next((explored[q.name] for q in policies
                                  if (q.name, q.source) == (base_policy.name, base_policy.source)), None)
            found[p.name] = (compare(p, base_policy, branch_exploration=explored.get(p.name),
                                     base_exploration=explored_base), chosen)
        except PolicyError as exc:
            fail(str(exc))
        if say is not None:
            say.print(f"{p.name}: {chosen}", soft_wrap=True)
    return found


def classes_note(exploration, pid: str) -> str:
    n = len(exploration.classes_of(pid))
    return f" · {n} class{'es' if n != 1 else ''}" if n else ""


def write_class_traces(out_dir: Path, explorations, differentials) -> None:
    """One trace per class (``POLICY-CLASS.json``) and per new class against the base."""
    from contract.core.output import write_atomic

    for ex in explorations:
        for c in ex.classes:
            write_atomic(out_dir / f"{c.witness.name}.json", c.witness.dumps())
    for d, _ in differentials.values():
        for c in d.new:
            write_atomic(out_dir / "new" / f"{c.witness.name}.json", c.witness.dumps())


def new_folder(stem: Path) -> Path:
    """``stem``, or ``stem-2``, ``stem-3``... : a folder that does not exist yet."""
    candidate, n = stem, 1
    while candidate.exists():
        n += 1
        candidate = stem.with_name(f"{stem.name}-{n}")
    return candidate


class progress:
    """A rich progress bar on a terminal; nothing otherwise (output stays byte-stable in CI)."""

    def __init__(self, total: int, what: str, quiet: bool):
        self.total, self.what, self.quiet = total, what, quiet or not err.is_terminal

    def __enter__(self):
        if self.quiet:
            return lambda: None
        from rich.progress import Progress

        self.bar = Progress(console=err, transient=True)
        self.bar.__enter__()
        task = self.bar.add_task(self.what, total=self.total)
        return lambda: self.bar.advance(task)

    def __exit__(self, *exc):
        if not self.quiet:
            self.bar.__exit__(*exc)
        return False


def base_policy(d, by_name, base, tree):
    from contract.branch import base as base_mod

    return base_mod.resolve(base, by_name[d.branch], tree if tree is not None and tree.policy is by_name[d.branch] else None)[0]
