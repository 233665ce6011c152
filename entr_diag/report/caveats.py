"""Caveats printed beside a verdict (terminal, JSON ``verdict.caveat``, HTML summary).

Built only from a fit result's ``to_dict()`` and the token accounting: nothing is recomputed.
"""

from __future__ import annotations

from collections.abc import Mapping

#: Fewer independent resampling units than this (non-empty sequence blocks of the bootstrap;
#: whole sequences hashed into blocks, so at most the number of sequences) and the verdict
#: gets a caveat. A percentile bootstrap over m units has only C(2m-1, m) distinct resamples
#: (3 for m = 2, 35 for m = 4) and its 95% intervals cover well under 95% for small m; 30 is
#: the usual floor for a resampled mean to behave.
MIN_BOOTSTRAP_UNITS = 30


def small_sample_caveat(fit: Mapping, sequences: int | None = None) -> str | None:
    """A one-line caveat when the fit's sequence bootstrap rests on fewer than
    :data:`MIN_BOOTSTRAP_UNITS` units, else None.

    Args:
        fit: a fit result's ``to_dict()`` (``parameters.blocks_nonempty``: the non-empty
            sequence blocks the bootstrap resamples).
        sequences: the number of valid sequences (token accounting), to name in the line.
    """
    units = (fit.get("parameters") or {}).get("blocks_nonempty")
    if not isinstance(units, int) or units >= MIN_BOOTSTRAP_UNITS:
        return None
    if sequences is None or sequences == units:
        what = f"{units} sequence{'s' if units != 1 else ''}"
    else:
        what = f"{units} independent sequence blocks (of {sequences:,} sequences)"
    return (
        f"caveat: only {what} to resample (fewer than {MIN_BOOTSTRAP_UNITS}): the 95% "
        "intervals are likely too narrow and the verdict is tentative; add sequences before "
        "relying on it."
    )
