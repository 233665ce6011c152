"""entr-diag: offline diagnostic for train-inference log-ratio mismatch in asynchronous RL.

Implements the diagnostics of arXiv:2607.22186 (ENTR, earlier ESTR): the entropy-ratio
scaling law E[delta^2 | H] ~ k*H, the low-entropy noise regime, and trust-region gate
simulation, on Parquet dumps of per-token rollout logs.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("entr-diag")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
