"""Atomic output: write to a temporary file beside the target, then rename over it.

A reader never sees a half-written report, and a failed run leaves no partial file.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from entr_diag.errors import InputError


@contextlib.contextmanager
def atomic_path(target: str | Path) -> Iterator[Path]:
    """Yield a temporary path in ``target``'s directory; on success rename it to ``target``.

    Raises:
        InputError: the target's directory does not exist or is not writable.
    """
    target = Path(target)
    if target.is_dir():
        raise InputError(f"cannot write {target}: it is a directory; give a file name.")
    directory = target.parent if str(target.parent) else Path(".")
    if not directory.is_dir():
        raise InputError(f"cannot write {target}: directory {directory} does not exist.")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    except OSError as e:
        raise InputError(f"cannot write {target}: {e.strerror or e}.") from None
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
            raise InputError(f"cannot write {target}: {e.strerror or e}.") from None
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
