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
