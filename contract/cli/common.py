"""What every command shares: the consoles, one-line errors, policy and profile arguments, output
folders written as a whole, the differential against a base, and the progress bar."""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from pathlib import Path

import typer
from rich.console import Console

from contract.core.child import DEFAULT_TIMEOUT_S, checked_timeout, printable, set_time_limit  # noqa: F401
from contract.core.output import OutputError, one_line
from contract.core.policy import PolicyError
from contract.core.trace import TraceError
from contract.families import BUILT_IN, FAMILIES, load_policy

# 128 + SIGPIPE: what a shell reports for a writer whose reader went away (`... | head -1`); never
# the 1 of "a counterexample" or "a replay disagrees".
CLOSED_STDOUT = 141


def silence_stdout() -> int:
    """stdout's reader is gone: what is still buffered, and the interpreter's last flush, go to
    /dev/null instead of failing with a traceback."""
    stdout = getattr(sys.stdout, "wrapped", sys.stdout)  # typer's PacifyFlushWrapper
    sys.stdout = stdout
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # a stdout without a descriptor (a test's capture)
        pass
    return CLOSED_STDOUT


def _width() -> int | None:
    """``COLUMNS`` as rich reads it, except 0, which would print nothing at all: then 80."""
    return 80 if os.environ.get("COLUMNS", "").strip() == "0" else None


class Terminal(Console):
    """A rich console that, when its reader has gone (`| head`), stops the command with
    ``CLOSED_STDOUT`` instead of rich's exit 1 (which reads as "a counterexample"); text it is given
    reaches the terminal as text (control characters in a file name or a trace field are escaped,
    ``contract.core.child.printable``), and a ``COLUMNS=0`` prints at 80 columns."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("width", _width())
        super().__init__(*args, **kwargs)

    def print(self, *objects, **kwargs) -> None:
        super().print(*(printable(o) if isinstance(o, str) else o for o in objects), **kwargs)

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise SystemExit(silence_stdout() if not self.stderr else CLOSED_STDOUT)


out = Terminal(highlight=False)
err = Terminal(stderr=True, highlight=False)


def say(line: str) -> None:
    """A line of plain output on stdout, control characters escaped (a file name may hold them)."""
    typer.echo(printable(line))


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
    from contract.families import check_unique, named

    specs = list(dict.fromkeys(specs or BUILT_IN))  # a spec given twice is one policy
    try:
        check_unique([named(s) for s in specs if Path(s).suffix != ".json"])
        return [parse_policy(s) for s in specs]
    except (PolicyError, TraceError) as exc:
        fail(str(exc))


def unique_names(policies) -> None:
    """One policy per name in a run (``contract.families.check_unique``); one line otherwise."""
    from contract.families import check_unique, described

    try:
        check_unique([described(p) for p in policies])
    except PolicyError as exc:
        fail(str(exc))


def timeout_seconds(value: float | None) -> float | None:
    """A ``--timeout`` from 1 s to a week, finite (``contract.core.child.checked_timeout``)."""
    if value is None:
        return None
    try:
        return checked_timeout(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc).removeprefix("--timeout ")) from None


TIMEOUT_OPTION = typer.Option(DEFAULT_TIMEOUT_S, "--timeout", callback=timeout_seconds, help="Seconds a policy file "
                              "or a vLLM tree's rules may run (in a child process of their own) before the command "
                              "stops them; 1 to 604800.")


def check_out(folder: Path | None, option: str = "--out") -> None:
    from contract.core.output import check_folder

    if folder is not None:
        try:
            check_folder(folder, option)
        except OutputError as exc:
            fail(str(exc))


@contextmanager
def writing(folder: Path | None = None):
    """The command's files land together or not at all; a failure to write is one line. With
    ``folder``, yields the stage to write the folder's new content into, published as a whole
    (``contract.core.output.publish``); without, files are renamed together at the end."""
    from contract.core.output import publish, transaction

    try:
        if folder is None:
            with transaction():
                yield None
        else:
            with publish(folder) as stage:
                yield stage
    except OutputError as exc:
        fail(str(exc))


def profile_settings(profile: str):
    from contract.core.profiles import get

    try:
        return get(profile)
    except ValueError as exc:
        fail(str(exc))


def verdicts_json(verdicts) -> dict:
    return {pid: {"holds": v.holds, "expected": v.expected, "length": v.length, "drawn": v.drawn, "message": v.message,
                  "trace": v.trace.to_json() if v.trace is not None else None}
            for pid, v in verdicts.items()}


BASE_OPTION = typer.Option(
    None, "--base",
    help="Compare with a base and report new, fixed and inherited violation classes: auto (the release the "
         "branch is or starts from), a release (0.30.0), a built-in policy, a .py policy file or a vLLM tree. "
         "Exit 0 when nothing is new, 1 when something is.")


ALLOW_LOST_OPTION = typer.Option(
    False, "--allow-lost-graphs",
    help="With --base: exit 0 even where the branch serves fewer dispatches with a CUDA graph than the base "
         "(lost graphs are still listed).")


def differential_exit(differentials: dict, allow_lost_graphs: bool) -> int:
    """1 when a branch adds a class or loses graphs (unless allowed), else 0."""
    return max((d.exit_code(allow_lost_graphs) for d, _ in differentials.values()), default=0)


def resolve_base(base: str, policy, tree=None):
    """The base of ``policy`` (read from ``tree``, a vLLM tree, when it is one); one line on failure."""
    from contract.branch import base as base_mod

    try:
        return base_mod.resolve(base, policy, tree if tree is not None and tree.policy is policy else None)
    except PolicyError as exc:
        fail(str(exc))


def base_differentials(policies, base, explored, tree, say, resolved: dict | None = None) -> dict:
    """policy name -> (Differential, the line saying which base was chosen); ``say`` prints that
    line (a console, or None). ``resolved``: bases already chosen, by policy name."""
    if base is None:
        return {}
    from contract.core.differential import compare

    found = {}
    for p in policies:
        try:
            chosen = (resolved or {}).get(p.name) or resolve_base(base, p, tree)
            explored_base = next((explored[q.name] for q in policies
                                  if (q.name, q.source) == (chosen.policy.name, chosen.policy.source)), None)
            found[p.name] = (compare(p, chosen.policy, branch_exploration=explored.get(p.name),
                                     base_exploration=explored_base), chosen.said)
        except PolicyError as exc:
            fail(str(exc))
        if say is not None and p.name not in (resolved or {}):  # a tree's base was said with its changes
            say.print(f"{p.name}: {chosen.said}", soft_wrap=True)
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


def default_reports(command: str, quiet: bool = False) -> Path:
    """Where a command writes a branch's report unless told: a new folder under ``reports/`` in the
    tool's cache folder, never in the caller's working folder (a checkout under review); said on
    stderr before the work."""
    from contract.real.installed import cache_root

    folder = new_folder(cache_root().absolute() / "reports" / command)
    if not quiet:
        err.print(f"the report goes to {folder} (--reports/--out to choose)", soft_wrap=True, highlight=False,
                  markup=False)
    return folder


def checked_base(base: str | None) -> str | None:
    """``--base`` refused in one line before any work."""
    if base is None:
        return None
    from contract.branch import base as base_mod

    try:
        return base_mod.check(base)
    except PolicyError as exc:
        fail(str(exc))


RUNNER_OPTION = typer.Option("auto", "--runner", help="mrv1 or mrv2: which model runner of a --vllm-src tree "
                             "(or of a release --base) to read. auto: the tree's own (V2 where it has only V2, "
                             "else V1 on 0.33 and older trees).")


def load_tree(vllm_src: Path, runner: str):
    """A ``--vllm-src`` tree read by the family ``runner`` names; one line on failure."""
    from contract.branch import tree as tree_mod

    try:
        return tree_mod.load(vllm_src, runner=runner)
    except PolicyError as exc:
        fail(str(exc))


def say_review(console, tree, chosen, command: str) -> None:
    """What the command reads of the tree: its changes against the base ``chosen``, and which it
    exercises."""
    from contract.branch.review import VERIFY, review
    from contract.families import by_runner

    family = by_runner(tree.policy.runner)
    try:
        r = review(tree, chosen, family)
    except PolicyError as exc:
        fail(str(exc))
    for line in r.lines(command):
        console.print(line, soft_wrap=True, highlight=False, markup=False)
    if command == VERIFY:
        rules = (f"{tree.where}: " + (f"the rules of vLLM {tree.release}" if tree.release else
                                      f"not a release's rules, run as a policy ({tree.policy.name})"))
        console.print(f"verify reads {rules}", soft_wrap=True, highlight=False, markup=False)
        if r.recognised:
            console.print(f"recognised as vLLM {chosen.release}'s {family.title}: the files it reads and replays are "
                          "the release's", soft_wrap=True, highlight=False, markup=False)
        unread = r.unread(command)
        if unread:
            console.print(f"verify does not read {len(unread)} of the changes above; replay them on vLLM's own code: "
                          f"{r.conform_command(FAMILIES)}", soft_wrap=True, highlight=False, markup=False)
        elif unlisted := r.unlisted(FAMILIES):
            console.print(unlisted, soft_wrap=True, highlight=False, markup=False)
