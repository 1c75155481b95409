"""What the tool writes: whole files or nothing, and errors as one line.

Every file goes through ``write_atomic`` (a temporary file in the same folder, then a rename), so
a reader never sees half a file. Inside ``transaction()`` the renames wait until every file of the
run is written, so a run that fails on its tenth file (a full disk, a folder where a file should
go) leaves all ten as they were. Commands call ``check_folder`` on their output folder before the
work, so a folder that cannot be written is reported at once rather than after a long run.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import hashlib
import os
import shutil
import signal
import sys
import tempfile
import threading
from contextlib import ExitStack, contextmanager
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
    and a probe that made and removed folders would pull them from under each other. What an
    interrupted publication of ``folder`` left beside it is completed or rolled back first."""
    recover(folder)
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


def write_atomic(path: str | os.PathLike, text: str | bytes) -> None:
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
        if isinstance(text, bytes):
            with os.fdopen(fd, "wb") as f:
                f.write(text)
        else:
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


# --- A folder published as a whole -------------------------------------------------------------
#
# A command that writes a report folder builds the new folder beside it (the *stage*: a copy of the
# old one, hard links where the file system allows, with the command's files written over theirs)
# and swaps it in with one ``renameat2(RENAME_EXCHANGE)``, after which the stage name holds the old
# folder and is removed. Where the exchange is not available the swap is two renames: the old folder
# aside, the stage in. Whatever kills the process, the names beside the folder say how far it got,
# and the next run (``recover``, at the start of a command and before a publication) completes or
# rolls back: a stage alone is unfinished or already swapped out, so it goes; an old folder aside
# with the folder missing means the stage was complete, so the stage goes in (or, without a stage,
# the old folder comes back). The folder is therefore always entirely old or entirely new, and
# nothing is left beside it after the next run.

_SUFFIXES = ("new", "old")
# Folders being published by this process, by absolute path: a nested publication joins the outer.
_PUBLISHING: ContextVar[dict | None] = ContextVar("cudagraph_contract_publishing", default=None)
_HELD = threading.local()  # the parent folders this thread holds the lock of


class _Terminated(BaseException):
    """SIGTERM during a publication: unwinds like Ctrl-C so that the stage is removed."""


def leftovers(folder: str | os.PathLike) -> dict[str, Path]:
    """The names an interrupted publication of ``folder`` can leave beside it: ``new`` (the stage)
    and ``old`` (the old folder moved aside)."""
    p = Path(folder)
    name = p.name
    if len(os.fsencode(name)) > 200:  # the suffix would pass NAME_MAX
        name = hashlib.sha256(os.fsencode(name)).hexdigest()[:32]
    return {s: p.with_name(f".{name}.cudagraph-contract-{s}") for s in _SUFFIXES}


def _remove_tree(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


def _complete(folder: Path) -> None:
    """Complete or roll back an interrupted publication of ``folder`` (the caller holds the lock)."""
    names = leftovers(folder)
    stage, old = names["new"], names["old"]
    if os.path.lexists(old):
        if not os.path.lexists(folder):
            # The old folder goes aside only once the stage is complete: finish the swap.
            os.rename(stage if os.path.lexists(stage) else old, folder)
        if os.path.lexists(old):
            _remove_tree(old)
    if os.path.lexists(stage):
        _remove_tree(stage)


def recover(folder: str | os.PathLike) -> None:
    """At the start of a run: finish what an interrupted publication of ``folder`` left, unless
    another process is publishing it now (then that process does)."""
    folder = _resolved(Path(folder))
    if not any(os.path.lexists(p) for p in leftovers(folder).values()):
        return
    try:
        with _locked(folder.parent, wait=False) as held:
            if held:
                _complete(folder)
    except OSError as exc:
        raise OutputError(f"cannot finish the interrupted publication of {folder}: {_reason(exc)}") from None


@contextmanager
def _locked(parent: Path, wait: bool = True):
    """An exclusive ``flock`` on ``parent``: one publication at a time per parent folder, across
    processes and threads; released by the kernel whatever kills the holder, and no lock file to leave."""
    held = getattr(_HELD, "parents", None)
    if held is None:
        held = _HELD.parents = set()
    key = os.path.realpath(parent)
    if key in held:
        yield True
        return
    fd = os.open(parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        held.add(key)
        try:
            yield True
        finally:
            held.discard(key)
    finally:
        os.close(fd)  # releases the lock


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst, follow_symlinks=False)
    except OSError:
        shutil.copy2(src, dst, follow_symlinks=False)


def _exchange_function():
    """``renameat2(..., RENAME_EXCHANGE)`` from the C library, or None where there is none."""
    if not sys.platform.startswith("linux") or os.environ.get("CUDAGRAPH_CONTRACT_NO_EXCHANGE") == "1":
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_AT_FDCWD, _RENAME_EXCHANGE = -100, 2


def exchange(a: Path, b: Path) -> bool:
    """Swap two folders in one step; False where the system or the file system cannot."""
    fn = _exchange_function()
    if fn is None:
        return False
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(b))


def _swap(stage: Path, folder: Path) -> None:
    """The stage in place of ``folder``; raises only before the swap took effect (then ``folder`` is
    as it was). What is left of the old folder afterwards is removed here or by the next run."""
    if not os.path.lexists(folder):
        os.rename(stage, folder)
        return
    if exchange(stage, folder):
        aside = stage  # the old folder, now under the stage's name
    else:
        aside = leftovers(folder)["old"]
        os.rename(folder, aside)
        try:
            os.rename(stage, folder)
        except OSError:
            os.rename(aside, folder)
            raise
    try:
        _remove_tree(aside)
    except OSError:
        pass  # the new folder is in; recover() removes the rest on the next run


def _resolved(folder: Path) -> Path:
    """The folder itself where ``folder`` is a link to it: the link stays, its target is replaced."""
    folder = Path(os.path.abspath(folder))
    return Path(os.path.realpath(folder)) if folder.is_symlink() else folder


def _why_not_swapped(folder: Path) -> str | None:
    """Why ``folder`` cannot be replaced by a rename, or None: a mount point, the working folder or
    one that holds it (the shell would be left in a removed folder), a parent this process cannot
    write (the stage goes there)."""
    if folder.parent == folder:
        return "the root folder"
    if os.path.isdir(folder) and os.path.ismount(folder):
        return "a mount point"
    cwd = os.path.realpath(os.getcwd())
    real = os.path.realpath(folder)
    if cwd == real or cwd.startswith(real.rstrip(os.sep) + os.sep):
        return "the working folder or one that holds it"
    existing = folder.parent
    while not os.path.lexists(existing) and existing.parent != existing:
        existing = existing.parent
    if not os.access(existing, os.R_OK | os.W_OK | os.X_OK):
        return "in a folder this process cannot write"
    return None


@contextmanager
def _signals_held():
    """SIGINT and SIGTERM wait while the swap and the removal of a stage run, so that neither is
    torn by an exception; a signal that came meanwhile acts after, under the handler it would have
    met. Handlers rather than a signal mask: another thread (the progress heartbeat) would take a
    signal the main thread blocks."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: came.append(signum))
                for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for s in dict.fromkeys(came):
            os.kill(os.getpid(), s)


@contextmanager
def _terminate_unwinds():
    """SIGTERM raises ``_Terminated`` while the stage is written, so the stage is removed on the way
    out; the process then dies of SIGTERM as it would have."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise _Terminated

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _discard(stage: Path, created: list[Path]) -> None:
    with _signals_held():
        try:
            _remove_tree(stage)
        except OSError:
            pass  # recover() removes it on the next run
        _remove_folders(created)


@contextmanager
def publish(folder: str | os.PathLike):
    """Yield a stage folder to write ``folder``'s new content into; on a normal exit the stage
    replaces ``folder`` in one step, on an exception it is removed and ``folder`` is as it was.

    The stage starts as a copy of ``folder`` (hard links), so files the run does not write (a
    user's, another command's) are kept; write into it with ``write_atomic`` only, which replaces a
    file rather than writing through the link into the old folder. A folder that cannot be replaced
    by a rename (``_why_not_swapped``) gets its files renamed together at the end instead
    (``transaction``). Nested, it joins the outer publication of the same folder."""
    target = _resolved(Path(folder))
    active = _PUBLISHING.get() or {}
    if str(target) in active:
        yield active[str(target)]
        return
    if _why_not_swapped(target) is not None:
        with transaction():
            yield Path(folder)
        return
    created = _missing_folders(target.parent)
    stage = leftovers(target)["new"]
    with ExitStack() as held:
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            held.enter_context(_locked(target.parent))
        except OSError as exc:
            _remove_folders(created)
            raise OutputError(f"cannot write {target}: {_reason(exc)}") from None
        try:  # the lock is held: what is beside the folder is this run's or an interrupted run's
            _complete(target)
            if os.path.isdir(target):
                shutil.copytree(target, stage, symlinks=True, copy_function=_link_or_copy)
            else:
                os.mkdir(stage)
        except OSError as exc:
            _discard(stage, created)
            raise OutputError(f"cannot write {target}: {_reason(exc)}") from None
        token = _PUBLISHING.set({**active, str(target): stage})
        try:
            with _terminate_unwinds():
                yield stage
        except BaseException as exc:
            _PUBLISHING.reset(token)
            _discard(stage, created)
            if isinstance(exc, _Terminated):
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGTERM)
                raise SystemExit(128 + signal.SIGTERM) from None
            raise
        _PUBLISHING.reset(token)
        try:
            with _signals_held():
                _swap(stage, target)
        except OSError as exc:
            _discard(stage, created)
            raise OutputError(f"cannot write {target}: {_reason(exc)}") from None
