"""Exception hierarchy. Every error a user can cause derives from :class:`EntrDiagError`;
the CLI turns it into one paragraph on stderr and exit code 2 (never a traceback)."""

from __future__ import annotations


class EntrDiagError(Exception):
    """Base class of all errors caused by input or parameters (CLI exit code 2)."""

    exit_code = 2


class SchemaError(EntrDiagError):
    """Columns missing, ambiguous, or of the wrong type."""


class InputError(EntrDiagError):
    """Files unreadable, not Parquet, empty, or inconsistent (e.g. ragged nested rows)."""


class FitError(EntrDiagError):
    """Too little (or degenerate) data to fit a statistic."""


class ParameterError(EntrDiagError):
    """A user-supplied parameter (gate spec, bins, tau...) is invalid."""


class OutputClosedError(EntrDiagError):
    """The reader of an output written straight through (stdout, ``/dev/stdout``, a FIFO)
    went away before the output was complete (EPIPE, e.g. ``| head``), or writing stdout
    failed otherwise (e.g. a full device, its message naming stdout): exit code 1, as when
    the tables' stdout is closed early, after every other output has been written (see
    :func:`entr_diag.atomic.together`). Its message names the outputs cut short; it is
    empty when they are only stdout under ``--json -``, which is left quietly like the
    tables."""

    exit_code = 1
