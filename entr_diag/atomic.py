"""Atomic output: write to a temporary file beside the target, then rename over it.

A reader never sees a half-written report, and a failed run leaves no partial file.

Only a regular file (or a path where none exists yet) is written that way. A symlink is
followed: the temporary file and the rename happen beside the file it points to, so the
link stays. A character device, FIFO or socket (``/dev/null``, a named pipe) and the
standard streams (``/dev/stdout``, ``/dev/stderr``, ``/dev/fd/N``, ``/proc/self/fd/N``) are
written straight through: there is no file to replace, and renaming over them would put a
regular file in their place. Such a target is opened here, on the main thread, before a
writer gets it: a FIFO waits for its reader, and only a wait on the main thread, in short
sleeps, is cut short by Ctrl-C or SIGTERM (a polars sink opening it on a worker thread
waited past both, forever). When the reader of such an output goes away before its end
(EPIPE: ``| head``, a FIFO's reader exiting), the output is cut short:
:class:`~entr_diag.errors.OutputClosedError` (exit code 1), raised within :func:`together`
only once the group's other outputs are in place.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import os
import re
import signal
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from entr_diag.errors import InputError, OutputClosedError

#: a process's directory of open file descriptors (``/dev/fd`` resolves to one)
_FD_DIR = re.compile(r"^/proc/[^/]+/fd$")


def _names_open_fd(path: str) -> bool:
    """Whether ``path``, or a symlink on the way to its target, is an entry of a
    ``/proc/PID/fd`` directory (``/dev/stdout``, ``/dev/fd/1``, ``/proc/self/fd/1``)."""
    p = os.path.abspath(path)
    for _ in range(40):  # the kernel's limit on a symlink chain
        parent = os.path.realpath(os.path.dirname(p))
        if _FD_DIR.match(parent):
            return True
        p = os.path.join(parent, os.path.basename(p))
        if not os.path.islink(p):
            return False
        p = os.path.normpath(os.path.join(parent, os.readlink(p)))
    return False


def _new_file(target: Path) -> Path:
    """Where the kernel would create ``target``, a path naming no existing file: its
    symlinks followed (a dangling link is created at its target), then resolved by
    :func:`os.path.realpath` only when the folder it lies in exists. ``realpath`` resolves a
    missing folder's ``..`` by text (``nosuch/../in.parquet`` -> ``in.parquet``, an input!)
    where the kernel refuses the path; such a path is returned unresolved, for the
    caller's check of its folder to refuse."""
    p = str(target)
    for _ in range(40):  # symlink hops, as many as the kernel follows
        try:
            if not stat.S_ISLNK(os.lstat(p).st_mode):
                break
        except OSError:
            break
        link = os.readlink(p)
        p = link if os.path.isabs(link) else os.path.join(os.path.dirname(p), link)
    if os.path.isdir(os.path.dirname(p) or "."):  # (the kernel's lookup of the folder)
        return Path(os.path.realpath(p))
    return Path(p)


def output_target(target: str | Path, what: str = "") -> tuple[Path, bool]:
    """Where an output named ``target`` is written, and whether atomically.

    Returns ``(path, atomic)``: ``(target with symlinks resolved, True)`` for a regular file
    or a path that does not exist yet; ``(target, False)`` for a character device, FIFO,
    socket or an open file descriptor's path, written straight through.

    Raises:
        InputError: ``target`` is a directory, or a symlink loop (``what``: the option
            that named it, for the message).
    """
    target = Path(target)
    if _names_open_fd(str(target)):
        return target, False
    try:
        mode = os.stat(target).st_mode
    except OSError as e:  # nothing there yet (or a dangling link: written at its target)
        if e.errno == errno.ELOOP:  # a symlink loop: no file can be written through it
            raise InputError(f"cannot write {what + ' ' if what else ''}{target}: it is a "
                             "symlink loop (or a chain of "
                             "more links than the system follows); give a file name.") from None
        return _new_file(target), True
    if stat.S_ISDIR(mode):
        raise InputError(f"cannot write {target}: it is a directory; give a file name.")
    if stat.S_ISREG(mode):
        return Path(os.path.realpath(target)), True
    return target, False


@dataclass
class _Group:
    """The outputs of one :func:`together` block."""

    #: (temporary file, target, name shown) renames deferred to the block's end
    renames: list[tuple[Path, Path, Path]] = field(default_factory=list)
    #: the outputs begun within the block, by name shown
    outputs: set[str] = field(default_factory=set)
    #: (name shown, quiet, why) of the outputs whose reader left before their end (why:
    #: None), or whose writing failed otherwise (why: the reason, e.g. a full device)
    closed: list[tuple[str, bool, str | None]] = field(default_factory=list)
    #: (name shown, action) to run once the outputs are in place (:func:`when_written`)
    announcements: list[tuple[str, Callable[[], object]]] = field(default_factory=list)


#: the :func:`together` block being run, if any
_GROUP: contextvars.ContextVar[_Group | None] = contextvars.ContextVar(
    "entr_diag_atomic_group", default=None)


def _begun(shown: str | Path) -> None:
    """Count an output as one of the current group's, if any."""
    group = _GROUP.get()
    if group is not None:
        group.outputs.add(str(shown))


def _closed_error(closed: list[tuple[str, bool, str | None]], others: bool
                  ) -> OutputClosedError:
    """The error for the outputs cut short, ``closed`` as in :attr:`_Group.closed` (none
    but quiet ones: only stdout under ``--json -``, said nothing about); ``others``: other
    outputs of the run were written."""
    names = list(dict.fromkeys(s for s, quiet, why in closed if why is None and not quiet))
    failed = dict.fromkeys(f"cannot write {s}: {why}" for s, _q, why in closed if why)
    parts = list(failed)
    if names:
        whose = "its reader closed it" if len(names) == 1 else "their readers closed them"
        parts.insert(0, f"cannot write {' and '.join(names)}: {whose} before the end "
                        "(broken pipe)")
    if not parts:
        return OutputClosedError("")
    rest = "; every other output was written" if others else ""
    return OutputClosedError(f"{'; '.join(parts)}{rest}.")


def reader_left(shown: str | Path, *, quiet: bool = False, why: str | None = None) -> None:
    """The reader of the output ``shown`` went away before its end (EPIPE), or, with
    ``why`` (e.g. 'No space left on device'), writing it straight through failed for that
    reason (stdout redirected to a full device). Outside :func:`together` raise
    :class:`~entr_diag.errors.OutputClosedError` at once; within it note it and return: the
    group's other outputs are still written and the error is raised at its end. ``quiet``:
    the output is stdout itself (``--json -``) whose reader left, left without a word, as
    the tables are (a failure with ``why`` is always named).

    Raises:
        OutputClosedError: outside :func:`together`.
    """
    group = _GROUP.get()
    if group is None:
        raise _closed_error([(str(shown), quiet, why)], others=False)
    group.outputs.add(str(shown))
    group.closed.append((str(shown), quiet, why))


def when_written(target: str | Path, action: Callable[[], object]) -> None:
    """Run ``action`` (e.g. print ``wrote FILE``) once the output ``target`` is in place: at
    once outside :func:`together`; within it after the group's renames, and never when the
    group fails or ``target``'s reader left before its end."""
    group = _GROUP.get()
    if group is None:
        action()
    else:
        group.announcements.append((str(target), action))


@contextlib.contextmanager
def together() -> Iterator[None]:
    """The outputs written atomically within the block replace their targets together at
    its end, all or none: each is written to its temporary file as usual, and the renames
    run at the end with SIGINT and SIGTERM held back (a signal then arrives after the last
    rename). If the block fails, no target is touched and the temporary files are removed.
    (A report and its JSON, or the JSON and the export of a comparison, stay a pair.)

    An output written straight through whose reader leaves before its end (:func:`reader_left`)
    does not stop the others: they are all written and renamed, the :func:`when_written`
    actions of those completed run, and then :class:`~entr_diag.errors.OutputClosedError`
    names the outputs cut short.

    Raises:
        OutputClosedError: after the renames, when an output's reader left early.
    """
    group = _Group()
    token = _GROUP.set(group)
    try:
        yield
        held = {signal.SIGINT, signal.SIGTERM}
        old = signal.pthread_sigmask(signal.SIG_BLOCK, held)
        try:
            _rename_all(group.renames)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
    finally:
        _GROUP.reset(token)
        for tmp, _target, _shown in group.renames:
            with contextlib.suppress(OSError):
                tmp.unlink()
    closed = {shown for shown, _quiet, _why in group.closed}
    for shown, action in group.announcements:
        if shown not in closed:
            action()
    if group.closed:
        raise _closed_error(group.closed, others=len(group.outputs) > len(closed))


def _rename_all(renames: list[tuple[Path, Path, Path]]) -> None:
    """Rename each temporary file over its target, all or none: with several, each existing
    target is first kept under a hard link beside it, so that when a later rename fails
    (a target made immutable, a directory whose permissions changed meanwhile) the ones
    already done are undone (the earlier file put back, a new one removed) and no output
    is left replaced beside a stale one.

    Raises:
        InputError: naming the output that could not be written, and any output that could
            not be put back (then replaced).
    """
    # per target: (whether it existed, the hard link keeping its earlier file or None)
    backups: list[tuple[bool, Path | None]] = []
    try:
        for i, (_tmp, target, _shown) in enumerate(renames if len(renames) > 1 else ()):
            backup = None
            existed = os.path.lexists(target)
            if existed:
                backup = target.with_name(f".{target.name}.{os.getpid()}.{i}.bak")
                try:
                    os.link(target, backup)
                except OSError:  # (no hard link here: this rename cannot be undone)
                    backup = None
            backups.append((existed, backup))
        for i, (tmp, target, shown) in enumerate(renames):
            try:
                os.replace(tmp, target)
            except OSError as e:
                kept = _undo(renames[:i], backups)
                raise InputError(
                    f"cannot write {shown}: {e.strerror or e}"
                    + (f"; {' and '.join(kept)} already replaced (its earlier file could not "
                       "be put back)" if kept else "; no output was replaced") + ".") from None
    finally:
        for _existed, backup in backups:
            if backup is not None:
                with contextlib.suppress(OSError):
                    backup.unlink()


def _undo(done: list[tuple[Path, Path, Path]], backups: list[tuple[bool, Path | None]]
          ) -> list[str]:
    """Undo the renames ``done`` (:func:`_rename_all`): put each target's earlier file back
    from its hard link, or remove a target that did not exist before. Returns the names of
    the outputs that could not be put back."""
    kept = []
    for (_tmp, target, shown), (existed, backup) in zip(done, backups, strict=False):
        try:
            if backup is not None:
                os.replace(backup, target)
            elif not existed:  # (no earlier file: the new one goes)
                target.unlink()
            else:
                kept.append(str(shown))
        except OSError:
            kept.append(str(shown))
    return kept


@contextlib.contextmanager
def atomic_path(target: str | Path) -> Iterator[Path]:
    """Yield a temporary path in ``target``'s directory; on success rename it to ``target``.

    A symlink is followed (the link stays, its target is replaced); a device, FIFO or
    socket is yielded itself and written straight through (see the module docstring).

    Raises:
        InputError: the target's directory does not exist or is not writable.
    """
    shown = Path(target)
    target, atomic = output_target(target)
    if not atomic:
        yield target
        return
    directory = target.parent
    if not directory.is_dir():
        why = "is a file, not a directory" if directory.exists() else "does not exist"
        raise InputError(f"cannot write {shown}: {directory} {why}.")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    except OSError as e:
        raise InputError(f"cannot write {shown}: {e.strerror or e}.") from None
    os.close(fd)
    tmp_path = Path(tmp)
    group = _GROUP.get()
    _begun(shown)
    deferred = False
    try:
        yield tmp_path
        # mkstemp creates 0600; give the file the permissions a plain open() would
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp_path, 0o666 & ~umask)
        if group is not None:  # renamed with the group's other outputs (:func:`together`)
            group.renames.append((tmp_path, target, shown))
            deferred = True
            return
        try:
            os.replace(tmp_path, target)
        except OSError as e:
            raise InputError(f"cannot write {shown}: {e.strerror or e}.") from None
    finally:
        if not deferred and tmp_path.exists():
            tmp_path.unlink()


#: errors of the write side (a full disk, a quota, a file too large, a read-only or failing
#: device) named in an OSError or in a polars error raised by a sink
_WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO)
_WRITE_MESSAGES = tuple(os.strerror(e) for e in _WRITE_ERRNOS)


def _write_why(e: BaseException) -> str | None:
    """Why writing failed (e.g. 'No space left on device') when ``e`` is a failure to
    write, else None (a polars error from a sink may also be a failure to READ the
    input)."""
    if isinstance(e, OSError) and e.errno in _WRITE_ERRNOS:
        return str(e.strerror or e)
    text = str(e)
    return next((m for m in _WRITE_MESSAGES if m in text), None)


def _write_failure(target: str | Path, e: BaseException) -> InputError | None:
    """An InputError naming ``target`` when ``e`` is a failure to write it, else None."""
    why = _write_why(e)
    return None if why is None else InputError(f"cannot write {target}: {why}.")


def _reader_gone(e: BaseException) -> bool:
    """Whether ``e`` says a pipe's reader went away (EPIPE), as an OSError or in the text of
    a polars error raised by a sink ('... Broken pipe (os error 32)')."""
    if isinstance(e, OSError):
        return e.errno == errno.EPIPE
    return f"{os.strerror(errno.EPIPE)} (os error {errno.EPIPE})" in str(e)


#: seconds between two tries to open a FIFO that has no reader yet
_FIFO_RETRY = 0.05


def _open_for_writing(target: Path) -> BinaryIO:
    """``open(target, "wb")``, except that a FIFO without a reader is waited for in short
    sleeps instead of in a blocking open: a signal stops a sleep, but a blocking open of a
    FIFO is restarted by the kernel after a handler installed with SA_RESTART, as polars
    installs its SIGINT handler (Ctrl-C would then never reach Python's handler)."""
    try:
        fifo = stat.S_ISFIFO(os.stat(target).st_mode)
    except OSError:
        fifo = False
    if not fifo:
        return open(target, "wb")  # closed by the caller
    while True:
        try:
            fd = os.open(target, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError as e:
            if e.errno != errno.ENXIO:  # ENXIO: no reader yet
                raise
        time.sleep(_FIFO_RETRY)
    os.set_blocking(fd, True)  # then written like any file: a write waits for the reader
    return open(fd, "wb")  # closed by the caller


@contextlib.contextmanager
def _streamed(target: Path, shown: Path) -> Iterator[BinaryIO]:
    """Open the device, FIFO or socket ``target`` for writing, here on the main thread (a
    FIFO's open waits for its reader, cut short by Ctrl-C or SIGTERM), and close it at the
    end; its reader leaving before then goes to :func:`reader_left`.

    Raises:
        InputError: ``target`` cannot be opened (e.g. a socket).
        OutputClosedError: its reader left, outside :func:`together`.
    """
    try:
        f = _open_for_writing(target)
    except OSError as e:
        raise InputError(f"cannot write {shown}: {e.strerror or e}.") from None
    _begun(shown)
    try:
        with f:
            yield f
    except Exception as e:
        why = _write_why(e)
        if _reader_gone(e):
            reader_left(shown)
        elif why is not None:  # a full device (/dev/full): as a full stdout, exit 1 after
            reader_left(shown, why=why)  # the other outputs
        elif isinstance(e, OSError):
            raise InputError(f"cannot write {shown}: {e.strerror or e}.") from None
        else:
            raise


def _run_writer(shown: Path, writer: Callable, dest: Path | BinaryIO) -> None:
    """``writer(dest)``, a failure to write (a full disk, a quota...) said as one naming
    ``shown``; other errors (e.g. reading the input, a broken pipe) propagate."""
    try:
        writer(dest)
    except Exception as e:
        failure = _write_failure(shown, e) if not isinstance(e, InputError) else None
        if failure is None:
            raise
        raise failure from None


def write_text(target: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``target`` atomically; returns the target path.

    Raises:
        InputError: naming ``target`` when it cannot be written (e.g. the disk is full).
        OutputClosedError: ``target`` is a pipe whose reader left before the end (outside
            :func:`together`; within it, at the block's end).
    """
    def write(dest: Path | BinaryIO) -> None:
        if not isinstance(dest, Path):  # a device or FIFO: its failures are _streamed's
            dest.write(text.encode("utf-8"))
            return
        try:
            dest.write_text(text, encoding="utf-8")
        except OSError as e:  # only writing happens here
            raise InputError(f"cannot write {target}: {e.strerror or e}.") from None

    return write_with(target, write)


def write_with(target: str | Path, writer: Callable[[Path | BinaryIO], object]) -> Path:
    """Call ``writer(dest)`` (e.g. ``lf.sink_parquet``) and move the result to ``target``.

    ``dest`` is a temporary path beside ``target``, renamed over it afterwards; for a
    device, FIFO or socket it is the target opened for binary writing (see the module
    docstring), which ``writer`` writes to and leaves open.

    Raises:
        InputError: naming ``target`` when the writer fails to write it (a full disk, a
            quota...); other errors (e.g. reading the input) propagate.
        OutputClosedError: ``target`` is a pipe whose reader left before the end (outside
            :func:`together`; within it, at the block's end).
    """
    shown = Path(target)
    path, atomic = output_target(target)
    if not atomic:  # (a failure to write goes to _streamed: a device fills like stdout)
        with _streamed(path, shown) as f:
            writer(f)
        return shown
    with atomic_path(target) as tmp:
        _run_writer(shown, writer, tmp)
    return shown
