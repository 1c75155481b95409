"""What the tool writes: whole files or nothing, and errors as one line.

Every file goes through ``write_atomic`` (a temporary file in the same folder, then a rename), so
a reader never sees half a file. Inside ``transaction()`` the renames wait until every file of the
run is written, so a run that fails on its tenth file (a full disk, a folder where a file should
go) leaves all ten as they were. Commands call ``check_folder`` on their output folder before the
work, so a folder that cannot be written is reported at once rather than after a long run.
"""

from __future__ import annotations

import errno
import os
import tempfile
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path


def one_line(text: str) -> str:
    """``text`` with line breaks and other control characters escaped: an error stays one line
    whatever a file name or a trace field holds."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class OutputError(Exception):
    """A file or folder the tool cannot write; the message names it and why, in one line."""

    def __init__(self, message: str):
        super().__init__(one_line(message))


# The renames a transaction holds back. A context variable rather than an argument, so that the
# report modules write as they always do and a command decides alone that its files go together.
_PENDING: ContextVar[list | None] = ContextVar("cudagraph_contract_pending_writes", default=None)


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


def _missing_folders(folder: Path) -> list[Path]:
    """The folders ``mkdir(parents=True)`` would create, deepest first."""
    missing = []
    while not os.path.lexists(folder) and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing


def _remove_folders(folders: list[Path]) -> None:
    for d in folders:  # deepest first
        try:
            d.rmdir()
        except OSError:
            pass


def check_folder(folder: Path, option: str) -> None:
    """Raise ``OutputError`` unless ``folder`` is, or can be made, a folder this process can write
    files into. Creates nothing but a probe file, removed at once, in ``folder`` or in its nearest
    existing ancestor: runs that share a parent folder start together (a test's jobs, two terminals),
    and a probe that made and removed folders would pull them from under each other."""
    try:
        missing = _missing_folders(folder)
        existing = missing[-1].parent if missing else folder
        if not existing.is_dir():
            where = "" if existing == folder else f": {existing}"
            raise OutputError(f"{option} {folder}{where} is a file, not a folder; pass a folder")
    except (OSError, ValueError) as exc:
        raise OutputError(f"{option} {folder} cannot be used: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        name_max = os.pathconf(existing, "PC_NAME_MAX")
        if any(len(os.fsencode(d.name)) > name_max for d in missing):
            raise OSError(errno.ENAMETOOLONG, os.strerror(errno.ENAMETOOLONG))
        fd, probe = tempfile.mkstemp(prefix=".cudagraph-contract-probe.", dir=existing)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise OutputError(f"{option} {folder} cannot be written: {_reason(exc)}; pass another folder") from None


def write_atomic(path: str | os.PathLike, text: str) -> None:
    """Write then rename, so a reader never sees half a file and an interrupted run loses nothing;
    inside ``transaction()`` the rename waits for the transaction's end."""
    p = Path(path)
    created = _missing_folders(p.parent)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        _remove_folders(created)
        raise OutputError(f"cannot create the folder {p.parent}: {_reason(exc)}") from None
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=p.parent)
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        pending = _PENDING.get()
        if pending is not None:
            pending.append((tmp, p, created))
            return
        if p.is_dir():
            raise IsADirectoryError(errno.EISDIR, "it is a folder")
        os.replace(tmp, p)
    except BaseException as exc:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        _remove_folders(created)
        if isinstance(exc, OSError):
            raise OutputError(f"cannot write {p}: {_reason(exc)}") from None
        raise


@contextmanager
def transaction():
    """Every ``write_atomic`` inside lands together at the end, or none does. Nested, it joins the
    outer one."""
    if _PENDING.get() is not None:
        yield
        return
    pending: list = []
    token = _PENDING.set(pending)
    try:
        yield
        for _, p, _ in pending:  # the one rename that can fail between writable files
            if p.is_dir():
                raise OutputError(f"cannot write {p}: it is a folder")
        while pending:
            tmp, p, _ = pending[0]
            try:
                os.replace(tmp, p)
            except OSError as exc:
                raise OutputError(f"cannot write {p}: {_reason(exc)}") from None
            pending.pop(0)
    except BaseException:
        for tmp, _, created in reversed(pending):
            if os.path.exists(tmp):
                os.unlink(tmp)
            _remove_folders(created)
        raise
    finally:
        _PENDING.reset(token)
