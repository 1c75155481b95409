"""``cudagraph-contract bugs``: the corpus of real vLLM CUDA-graph bugs, each re-injected into its
release and checked as a branch (``contract/branch/bugs.py``); writes ``bugs.md`` and ``bugs.json``
into ``--reports`` and, when ``--reports`` is the ``reports/`` beside the corpus, each bug's
``README.md`` and witness.

Exit 0 when it measured (whatever the recall), 1 with ``--check`` when an outcome differs from the
recorded one (``--reports``' ``bugs.json``: a bug found no longer is, or the report is stale), 2 on
bad input or environment. A found bug's first class's witness is kept as ``bugs/<id>/witness.json``:
the trace that shows it (or, for a capture-size class, its setting: ``contract/core/sizes.py``),
replayed by the tests.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from contract.branch import bugs as bugs_mod
from contract.cli.common import DEFAULT_TIMEOUT_S, err, fail, say, timeout_seconds, writing
from contract.core import child
from contract.core.output import OutputError, check_folder, write_atomic
from contract.real.installed import checkout

ROOT = checkout()


def bugs(
    corpus: Path = typer.Option(ROOT / "bugs" if ROOT else Path("bugs"), "--corpus",
                                show_default="the checkout's bugs/", help="The folder of bugs (bugs/<id>/bug.json)."),
    only: Optional[list[str]] = typer.Option(None, "--only", help="Check only this bug (repeatable)."),
    reports: Path = typer.Option(ROOT / "reports" if ROOT else Path("reports"), "--reports",
                                 show_default="the checkout's reports/", help="Writes bugs.md and bugs.json here."),
    check: bool = typer.Option(False, "--check", help="Write nothing; exit 1 when an outcome differs from the one "
                               "--reports' bugs.json records (a found bug no longer found, or a stale report)."),
    timeout: float = typer.Option(DEFAULT_TIMEOUT_S, "--timeout", callback=timeout_seconds,
                                  help="Seconds each replay may take; 1 to 604800."),
    as_json: bool = typer.Option(False, "--json", help="Print the outcomes as JSON."),
) -> None:
    """Re-inject each real vLLM bug of the corpus into a copy of its release and check the copy as a
    branch (conform --vllm-src --base RELEASE): found, missed or not exercised, and the recall.

    Example: [bold]cudagraph-contract bugs --only breakable-pw-padded-num-reqs --check[/]
    """
    from contract.reports import bugs as report

    try:
        corpus_bugs = bugs_mod.corpus(corpus)
    except bugs_mod.BugError as exc:
        fail(str(exc))
    unknown = sorted(set(only or ()) - {b.id for b in corpus_bugs})
    if unknown:
        fail(f"--only {unknown[0]}: no such bug in {corpus}")
    chosen = [b for b in corpus_bugs if not only or b.id in only]
    # Each bug's README and witness render the corpus's own record (the reports/ beside bugs/); a run
    # reported elsewhere leaves them as they are.
    records_corpus = reports.resolve() == corpus.resolve().parent / "reports"
    recorded = _recorded(reports / "bugs.json")
    conformance = corpus.resolve().parent / "reports" / "conformance"  # the releases' confirmed findings
    if not check:
        try:
            check_folder(reports, "--reports")
        except OutputError as exc:
            fail(str(exc))
    from contract.cli.progress import progress

    outcomes: dict[str, bugs_mod.Outcome] = {}
    with child.call_folder("cudagraph-contract-bugs-") as work, progress(len(chosen), "bugs", as_json, "bugs") as advance:
        for bug in chosen:
            try:
                outcomes[bug.id] = bugs_mod.check(bug, Path(work), timeout, conformance)
            except bugs_mod.BugError as exc:
                fail(str(exc))
            if not as_json:
                err.print(f"{bug.id}: {outcomes[bug.id].status}", markup=False, highlight=False)
            advance()
    differing = sorted(i for i, o in outcomes.items()
                       if (check and i not in recorded) or (i in recorded and recorded[i].status != o.status)
                       or (i in recorded and o.status == bugs_mod.IN_RELEASE and recorded[i].classes != o.classes))
    if not check:  # a run of some bugs keeps the recorded outcomes of the others
        every = {b.id: outcomes.get(b.id) or recorded.get(b.id) for b in corpus_bugs}
        every = {i: o for i, o in every.items() if o is not None}
        with writing():
            write_atomic(reports / "bugs.json", report.results_json(every))
            if len(every) == len(corpus_bugs):
                write_atomic(reports / "bugs.md", report.markdown(corpus_bugs, every))
            if records_corpus:
                for bug in corpus_bugs:
                    write_atomic(bug.folder / "README.md", report.readme(bug, every.get(bug.id)))
                for i, o in outcomes.items():
                    if o.witness is not None:
                        write_atomic(corpus / i / "witness.json", o.witness)
        for i, o in outcomes.items():  # a bug no longer found has no witness left to replay
            if o.witness is None and records_corpus:
                (corpus / i / "witness.json").unlink(missing_ok=True)
    if as_json:
        sys.stdout.write(json.dumps([o.to_json() for o in outcomes.values()], indent=1) + "\n")
    else:
        found = sum(o.status == bugs_mod.FOUND for o in outcomes.values())
        replayed = sum(o.status in report.MEASURED for o in outcomes.values())
        said = (f"found {found} of the {replayed} re-injected bug(s) checked" if replayed
                else f"checked {len(outcomes)} bug(s), none re-injected")
        say(said + ("" if check else f"; {reports / 'bugs.md'}"))
        for i in differing:
            was = recorded[i].status if i in recorded else "not recorded"
            say(f"{i}: {outcomes[i].status}, recorded as {was}")
    raise typer.Exit(1 if check and differing else 0)


def _recorded(path: Path) -> dict[str, bugs_mod.Outcome]:
    """The outcomes ``bugs.json`` recorded, by bug; none where there is no such file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return {o["bug"]: bugs_mod.Outcome.from_json(o) for o in data["outcomes"]}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        fail(f"{path} cannot be read as the recorded outcomes ({type(exc).__name__}: {exc}); remove it or pass "
             "another --reports")
