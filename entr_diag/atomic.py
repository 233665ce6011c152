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
import os
import re
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
    try:
        yield tmp_path
        # mkstemp creates 0600; give the file the permissions a plain open() would
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp_path, 0o666 & ~umask)
        try:
            os.replace(tmp_path, target)
        except OSError as e:
            raise InputError(f"cannot write {shown}: {e.strerror or e}.") from None
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def write_text(target: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``target`` atomically; returns the target path."""
    with atomic_path(target) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(target)


def write_with(target: str | Path, writer: Callable[[Path], object]) -> Path:
    """Call ``writer(tmp_path)`` (e.g. ``lf.sink_parquet``) and move the result to ``target``."""
    with atomic_path(target) as tmp:
        writer(tmp)
    return Path(target)
