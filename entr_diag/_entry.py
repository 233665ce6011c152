"""The ``entr-diag`` console script: loads the CLI, then runs it.

Loading the CLI imports polars, numpy, rich and typer (about half a second). A Ctrl-C in
that time raised ``KeyboardInterrupt`` out of an import, printed as a traceback: here it
exits 130 quietly, as a Ctrl-C during a command does (README, exit codes). This module
imports nothing heavy itself.
"""

from __future__ import annotations

import sys

__all__ = ["main"]


def main() -> None:
    """Import :mod:`entr_diag.cli` and run its :func:`~entr_diag.cli.main`; exit 130 on a
    Ctrl-C while importing."""
    try:
        from entr_diag.cli import main as cli_main
    except KeyboardInterrupt:
        sys.exit(130)
    cli_main()
