"""``cudagraph-contract``: verify policies, explore, replay traces, write reports.

Exit codes: 0 the contract holds as expected; 1 a counterexample where none was expected (or an
expected one no longer found); 2 bad input or environment.
"""

from __future__ import annotations

import sys

import typer

from contract.cli import conform, explore, replay, report, verify
from contract.cli.common import err, error, exit_code_of, flushed

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode="rich",
    help="Verify vLLM's CUDA-graph dispatch contract: every non-NONE dispatch has exactly one capturer.",
    epilog="Exit codes: 0 contract holds as expected · 1 counterexample · 2 bad input or environment.",
)


for command in (verify.verify, replay.replay, explore.explore, report.report, conform.conform):
    app.command()(command)


def main(argv: list[str] | None = None) -> None:
    # typer 0.29 carries its own click (pinned in pyproject.toml). Its usage errors, a mistyped
    # command, option or value, are one line here like every other bad input.
    from typer._click.exceptions import ClickException, NoArgsIsHelpError

    try:
        code = app(args=argv, prog_name="cudagraph-contract", standalone_mode=False)
    except NoArgsIsHelpError:  # the help is already printed
        code = 2
    except ClickException as exc:
        ctx = getattr(exc, "ctx", None)
        error(exc.format_message() + (f" (see {ctx.command_path} --help)" if ctx is not None else ""))
        code = 2
    except KeyboardInterrupt:
        code = 130
    except SystemExit as exc:  # a closed stdout (`| head`): 141, not the 1 of a counterexample
        code = exit_code_of(exc)
    code = flushed(code) if isinstance(code, int) else code
    if code == 130:
        err.print("interrupted; reports already written are intact")
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
