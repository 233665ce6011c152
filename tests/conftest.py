"""Test-session set-up shared by every test module."""

from __future__ import annotations

import compileall
from pathlib import Path

import entr_diag


def pytest_configure(config) -> None:
    """Compile the package's modules to bytecode once per session: many tests run the CLI
    in a subprocess, and where PYTHONDONTWRITEBYTECODE is set (as on this workplace's
    machines) each of them compiled the package's 30k lines from source again (~0.3 s a
    run; the output tests took a quarter longer). Python still reads bytecode with that setting; a folder
    that cannot be written (an installed package) is left as it is."""
    compileall.compile_dir(Path(entr_diag.__file__).parent, quiet=2, force=False)
