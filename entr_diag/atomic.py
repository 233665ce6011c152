"""Atomic output: write to a temporary file beside the target, then rename over it.

A reader never sees a half-written report, and a failed run leaves no partial file.

Only a regular file (or a path where none exists yet) is written that way. A symlink is
followed: the temporary file and the rename happen beside the file it points to, so the
link stays. A character device, FIFO or socket (``/dev/null``, a named pipe) and the
standard streams (``/dev/stdout``, ``/dev/stderr``, ``/dev/fd/N``, ``/proc/self/fd/N``) are
written straight through: there is no file to replace, and renaming over them would put a
regular file in their place.
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
from collections.abc import Callable, Iterator
from pathlib import Path

from entr_diag.errors import InputError

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


def output_target(target: str | Path) -> tuple[Path, bool]:
    """Where an output named ``target`` is written, and whether atomically.

    Returns ``(path, atomic)``: ``(target with symlinks resolved, True)`` for a regular file
    or a path that does not exist yet; ``(target, False)`` for a character device, FIFO,
    socket or an open file descriptor's path, written straight through.

    Raises:
        InputError: ``target`` is a directory.
    """
    target = Path(target)
    if _names_open_fd(str(target)):
        return target, False
    try:
        mode = os.stat(target).st_mode
    except OSError:  # nothing there yet (or a dangling link: written at its target)
        return Path(os.path.realpath(target)), True
    if stat.S_ISDIR(mode):
        raise InputError(f"cannot write {target}: it is a directory; give a file name.")
    if stat.S_ISREG(mode):
        return Path(os.path.realpath(target)), True
    return target, False


#: within :func:`together`: the (temporary file, target, name shown) renames deferred to its end
_GROUP: contextvars.ContextVar[list[tuple[Path, Path, Path]] | None] = contextvars.ContextVar(
    "entr_diag_atomic_group", default=None)


@contextlib.contextmanager
def together() -> Iterator[None]:
    """The outputs written atomically within the block replace their targets together at
    its end, all or none: each is written to its temporary file as usual, and the renames
    run at the end with SIGINT and SIGTERM held back (a signal then arrives after the last
    rename). If the block fails, no target is touched and the temporary files are removed.
    (A report and its JSON, or the JSON and the export of a comparison, stay a pair.)"""
    pending: list[tuple[Path, Path, Path]] = []
    token = _GROUP.set(pending)
    try:
        yield
        held = {signal.SIGINT, signal.SIGTERM}
        old = signal.pthread_sigmask(signal.SIG_BLOCK, held)
        try:
            for tmp, target, shown in pending:
                try:
                    os.replace(tmp, target)
                except OSError as e:
                    raise InputError(f"cannot write {shown}: {e.strerror or e}.") from None
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
    finally:
        _GROUP.reset(token)
        for tmp, _target, _shown in pending:
            with contextlib.suppress(OSError):
                tmp.unlink()


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
        raise InputError(f"cannot write {shown}: directory {directory} does not exist.")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    except OSError as e:
        raise InputError(f"cannot write {shown}: {e.strerror or e}.") from None
    os.close(fd)
    tmp_path = Path(tmp)
    group = _GROUP.get()
    deferred = False
    try:
        yield tmp_path
        # mkstemp creates 0600; give the file the permissions a plain open() would
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp_path, 0o666 & ~umask)
        if group is not None:  # renamed with the group's other outputs (:func:`together`)
            group.append((tmp_path, target, shown))
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


def _write_failure(target: str | Path, e: BaseException) -> InputError | None:
    """An InputError naming ``target`` when ``e`` is a failure to write it, else None (a
    polars error from a sink may also be a failure to READ the input)."""
    if isinstance(e, OSError) and e.errno in _WRITE_ERRNOS:
        return InputError(f"cannot write {target}: {e.strerror or e}.")
    text = str(e)
    for m in _WRITE_MESSAGES:
        if m in text:
            return InputError(f"cannot write {target}: {m}.")
    return None


def write_text(target: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``target`` atomically; returns the target path.

    Raises:
        InputError: naming ``target`` when it cannot be written (e.g. the disk is full).
    """
    with atomic_path(target) as tmp:
        try:
            tmp.write_text(text, encoding="utf-8")
        except OSError as e:  # only writing happens here
            raise InputError(f"cannot write {target}: {e.strerror or e}.") from None
    return Path(target)


def write_with(target: str | Path, writer: Callable[[Path], object]) -> Path:
    """Call ``writer(tmp_path)`` (e.g. ``lf.sink_parquet``) and move the result to ``target``.

    Raises:
        InputError: naming ``target`` when the writer fails to write it (a full disk, a
            quota...); other errors (e.g. reading the input) propagate.
    """
    with atomic_path(target) as tmp:
        try:
            writer(tmp)
        except Exception as e:
            failure = _write_failure(target, e) if not isinstance(e, InputError) else None
            if failure is None:
                raise
            raise failure from None
    return Path(target)
