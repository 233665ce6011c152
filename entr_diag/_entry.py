"""The ``entr-diag`` console script: loads the CLI, then runs it.

Loading the CLI imports polars, numpy, rich and typer (about half a second). A Ctrl-C in
that time raised ``KeyboardInterrupt`` out of an import, printed as a traceback: here it
exits 130 quietly, as a Ctrl-C during a command does (README, exit codes). This module
imports nothing heavy itself.

A panic of polars' Rust code (its Parquet reader on damaged data pages) prints the Rust
panic hook's message on stderr before the command's own ``error:`` line; with
``RUST_BACKTRACE=1`` in the environment it adds a backtrace of some 30 lines of polars
internals. The console script sets ``RUST_BACKTRACE=0`` for itself (the hook reads it at
the first panic): the message stays a few lines.
"""

from __future__ import annotations

import os
import sys

__all__ = ["main"]


def main() -> None:
    """Import :mod:`entr_diag.cli` and run its :func:`~entr_diag.cli.main`; exit 130 on a
    Ctrl-C while importing."""
    os.environ["RUST_BACKTRACE"] = "0"  # (see the module docstring)
    try:
        from entr_diag.cli import main as cli_main
    except KeyboardInterrupt:
        sys.exit(130)
    cli_main()
