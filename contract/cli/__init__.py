"""``cudagraph-contract``: verify policies, explore, replay traces, write reports.

Exit codes: 0 the contract holds as expected; 1 a counterexample where none was expected (or an
expected one no longer found); 2 bad input or environment; 141 the reader of standard output went
away (``cudagraph-contract verify | head -1``), or there was none (``>&-``) and the command had
something to say, never 1, since no verdict was delivered. Standard output that cannot be written
(a full disk, ``/dev/full``) is one line on stderr and exit 2; a character its encoding cannot say
is written escaped (``\u2026``), never an error.

Only typer's and click's public API is used, so every typer from 0.12 works: typer 0.26 and later
carry their own copy of click, whose exceptions are told apart here by their public attributes
(``format_message``, ``exit_code``), not by importing the copy.
"""

from __future__ import annotations

import errno
import inspect
import io
import os
import select
import stat
import sys
import tempfile
import types
import typing

import typer

from contract.cli import bugs, conform, env, explore, fixcheck, replay, report, verify
from contract.cli.common import CLOSED_STDOUT, err, error, silence_stdout

PROG = "cudagraph-contract"

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},  # HELP
    help="Verify vLLM's CUDA-graph dispatch contract: every non-NONE dispatch has exactly one capturer.",
    epilog="Exit codes: 0 contract holds as expected · 1 counterexample · 2 bad input or environment.",
)


def version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version(PROG)
    except importlib.metadata.PackageNotFoundError:  # run from a checkout on PYTHONPATH, not installed
        import re
        from pathlib import Path

        text = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text(encoding="utf-8")
        found = re.search(r'^version\s*=\s*"([^"]+)"', text, re.MULTILINE)
        return found.group(1) if found else "unknown"


def _print_version(value: bool) -> None:
    if value is True:  # click 8.3 hands an old typer's callback a truthy "unset" marker
        typer.echo(f"{PROG} {version()}")
        raise typer.Exit()


@app.callback()
def _options(
    show_version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                      help="Print the version and exit."),
) -> None:
    pass


for command in (verify.verify, replay.replay, explore.explore, report.report, conform.conform):
    app.command()(command)
app.command(name="fix-check")(fixcheck.fix_check)
app.command(name="bugs")(bugs.bugs)
app.add_typer(env.app, name="env")


_TYPE_NAMES = {"Path": "PATH", "str": "TEXT", "int": "INTEGER", "float": "FLOAT"}


def _type_name(annotation) -> str:
    """``PATH``, ``TEXT``, ``INTEGER``, ``FLOAT`` as click names them; ``""`` for a flag."""
    while typing.get_origin(annotation) in (typing.Union, types.UnionType, list, tuple):
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    if annotation is bool:
        return ""
    return _TYPE_NAMES.get(getattr(annotation, "__name__", ""), "VALUE")


def _plain_types(t: typer.Typer) -> None:
    """Every option's type said the way click says it (``PATH``, ``TEXT``, ``INTEGER``), flags none:
    typer 0.29 writes ``<list[Path]>`` and ``<bool>``, while an explicit metavar is shown as given by
    every typer. Read from the commands' annotations, since typer 0.29's options carry no click type."""
    callbacks = [info.callback for info in t.registered_commands]
    if t.registered_callback is not None:
        callbacks.append(t.registered_callback.callback)
    for callback in callbacks:
        hints = typing.get_type_hints(callback)
        for name, parameter in inspect.signature(callback).parameters.items():
            option = parameter.default
            if isinstance(option, typer.models.OptionInfo) and option.metavar is None:
                option.metavar = _type_name(hints.get(name))
    for group in t.registered_groups:
        _plain_types(group.typer_instance)


_plain_types(app)
HELP = ["-h", "--help"]


def _plain_help(command, name: str = PROG) -> None:
    """The help option said as a flag, with no type (typer 0.29 writes ``<bool>``): click's public
    ``get_help_option``, which click 8.2 and later keep for the command's life."""
    option = command.get_help_option(typer.Context(command, info_name=name, help_option_names=HELP))
    if option is not None and option.metavar is None:
        option.metavar = ""
    for sub_name, sub in getattr(command, "commands", {}).items():
        _plain_help(sub, sub_name)


def _identity(fd: int):
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_mode


def _stdout_closed(before) -> bool:
    """Standard output was a pipe (or socket) whose reader has gone, or a library (rich, click) already
    put ``/dev/null`` in its place after a failed write."""
    now = _identity(1)
    if before is None:
        return False
    if now != before:
        return True
    if not (stat.S_ISFIFO(before[2]) or stat.S_ISSOCK(before[2])):
        return False
    poller = select.poll()
    poller.register(1, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def _usage_error(exc: Exception) -> bool:
    """click's own exceptions (``ClickException`` of whichever click typer uses): a message and an exit code."""
    return callable(getattr(exc, "format_message", None)) and isinstance(getattr(exc, "exit_code", None), int)


def run(argv: list[str]) -> int:
    """The command's exit code; a usage error is one line (exit 2), as every other bad input."""
    command = typer.main.get_command(app)
    _plain_help(command)
    if not argv:
        argv = ["--help"]
        code = 2
    else:
        code = None
    try:
        result = command.main(args=argv, prog_name=PROG, standalone_mode=False)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 - click's exceptions, told apart by their public attributes
        if isinstance(exc.__cause__, KeyboardInterrupt):  # click's Abort
            return 130
        if isinstance(exc, BrokenPipeError) or not _usage_error(exc):
            raise
        message = exc.format_message().strip()
        if message:  # a group run without a command has printed its help instead (no message)
            ctx = getattr(exc, "ctx", None)
            error(message + (f" (see {ctx.command_path} --help)" if ctx is not None else ""))
        return 2
    if code is not None:
        return code
    return result if isinstance(result, int) else 0


class StdoutFailed(Exception):
    """Standard output cannot be written (not a closed pipe: that is ``BrokenPipeError``)."""


class _Guarded(io.RawIOBase):
    """A standard stream's descriptor whose failed write is ``StdoutFailed``, whatever library wrote;
    on stderr (``lossy``) a failed write is dropped: there is nowhere left to say anything."""

    def __init__(self, fd: int, lossy: bool = False):
        super().__init__()
        self.fd, self.lossy = fd, lossy

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.fd

    def isatty(self) -> bool:
        return os.isatty(self.fd)

    def write(self, data) -> int:
        try:
            return os.write(self.fd, data)
        except OSError as exc:
            if self.lossy:
                return len(data)
            if isinstance(exc, BrokenPipeError) or exc.errno == errno.EPIPE:
                raise BrokenPipeError(*exc.args) from None
            raise StdoutFailed(exc.strerror or str(exc)) from None


def _stream(fd: int, old) -> io.TextIOWrapper:
    """The standard stream ``fd`` through ``_Guarded``, in its encoding but with characters it cannot
    say escaped."""
    encoding = getattr(old, "encoding", None) or "utf-8"
    return io.TextIOWrapper(io.BufferedWriter(_Guarded(fd, lossy=fd == 2)), encoding=encoding, errors="backslashreplace",
                            line_buffering=os.isatty(fd), write_through=False)


def _standard_streams() -> bool:
    """Standard output and error as the command writes them (``_stream``); a descriptor the caller
    closed (``>&-``) becomes a temporary file (stdout, whose size then says whether anything was lost)
    or /dev/null (stderr). True when stdout was closed."""
    closed = False
    for fd, name in ((1, "stdout"), (2, "stderr")):
        if _identity(fd) is None:
            if fd == 1:
                new, path = tempfile.mkstemp(prefix="cudagraph-contract-stdout-")
                os.unlink(path)
            else:
                new = os.open(os.devnull, os.O_WRONLY)
            if new != fd:  # else the lowest free descriptor landed in place already
                os.dup2(new, fd)
                os.close(new)
            closed = closed or fd == 1
        old = getattr(sys, name)
        if old is None or getattr(old, "fileno", None) is not None and _fd_of(old) == fd:
            setattr(sys, name, _stream(fd, old))
    return closed


def _fd_of(stream) -> int | None:
    try:
        return stream.fileno()
    except (OSError, ValueError, AttributeError):
        return None


def _unwritable(exc: StdoutFailed) -> int:
    silence_stdout()
    error(f"standard output cannot be written ({exc}); files already written are intact")
    return 2


def main(argv: list[str] | None = None) -> None:
    closed_from_start = _standard_streams()
    before = _identity(1)
    try:
        code = run(list(sys.argv[1:] if argv is None else argv))
    except BrokenPipeError:
        code = CLOSED_STDOUT
    except StdoutFailed as exc:
        code = _unwritable(exc)
    except SystemExit as exc:  # rich and click end a write to a closed pipe with exit 1
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    if code == 130:
        err.print("interrupted; reports already written are intact")
    try:
        sys.stdout.flush()
    except (BrokenPipeError, ValueError):  # what the command said went nowhere
        if code != 2:
            code = CLOSED_STDOUT
        silence_stdout()
    except StdoutFailed as exc:
        code = _unwritable(exc)
    if code not in (0, 2) and _stdout_closed(before):
        code = CLOSED_STDOUT
        silence_stdout()
    if closed_from_start and code != 2 and os.fstat(1).st_size > 0:
        code = CLOSED_STDOUT  # what the command said went nowhere
    sys.exit(code)


if __name__ == "__main__":
    main()
