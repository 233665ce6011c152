"""entr-diag: offline diagnostic for train-inference log-ratio mismatch in asynchronous RL.

Implements the diagnostics of arXiv:2607.22186 (ENTR, earlier ESTR): the entropy-ratio
scaling law E[delta^2 | H] ~ k*H, the low-entropy noise regime, and trust-region gate
simulation, on Parquet dumps of per-token rollout logs.
"""

from __future__ import annotations

__all__ = ["__version__"]


def __getattr__(name: str) -> str:
    """``__version__``, read from the installed package's metadata when first asked for
    (importing the package stays instant: the console script catches a Ctrl-C only once
    its own module is loaded)."""
    if name != "__version__":
        raise AttributeError(f"module 'entr_diag' has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("entr-diag")
    except PackageNotFoundError:  # pragma: no cover - a source tree without install
        return "0.0.0+unknown"
