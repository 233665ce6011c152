"""The low-entropy noise regime: per-token flag and its summary (arXiv:2607.22186, ENTR).

Below the breakpoint H* of the scaling law E[delta^2 | H] ~ k H (see :mod:`entr_diag.fit`),
near-deterministic positions where the engine sampled an off-mode token carry a log-ratio
far above the entropy-normalized scale. A token is a **low-entropy noise token** when

    H < H*   and   score = delta^2 / (H + eps) > tau

(eps = 0.01 nats as in the paper; tau = 4 by default: the token lies outside the ENTR trust
region ``|delta| <= sqrt(tau (H + eps))``). ``delta`` and ``H`` in nats; the score is
dimensionless. Without a breakpoint (H* = None) no token is flagged.

Flagged tokens are split by the probability of the sampled token ``p = exp(infer_logprob)``
(:data:`P_BINS`): the signature of the regime is that its delta^2 mass sits at small p.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import polars as pl

from entr_diag.frames import token_frame

__all__ = [
    "P_BINS",
    "PBinShare",
    "RegimeResult",
    "flagged_tokens",
    "noise_flag_expr",
    "noise_score_expr",
    "p_bin_expr",
    "regime_query",
    "summarize_regime",
]

#: Bins of the sampled-token probability p: (label, lower, upper), lower inclusive.
P_BINS: tuple[tuple[str, float, float], ...] = (
    ("p<1e-4", 0.0, 1e-4),
    ("1e-4<=p<1e-3", 1e-4, 1e-3),
    ("1e-3<=p<1e-2", 1e-3, 1e-2),
    ("1e-2<=p<0.1", 1e-2, 0.1),
    ("p>=0.1", 0.1, 1.0),
)


def noise_score_expr(eps: float = 0.01) -> pl.Expr:
    """Polars expression: the ENTR score ``delta^2 / (H + eps)`` per token (dimensionless).

    Source: the ENTR / ESTR gate of arXiv:2607.22186 keeps a token iff score <= tau.
    """
    return pl.col("delta") ** 2 / (pl.col("entropy") + eps)


def noise_flag_expr(h_star: float | None, tau: float = 4.0, eps: float = 0.01) -> pl.Expr:
    """Polars boolean expression: the token is a low-entropy noise token.

    True iff ``entropy < h_star`` and ``delta^2 / (entropy + eps) > tau`` (entropy, delta in
    nats). ``h_star=None`` (no breakpoint found) flags nothing: ``pl.lit(False)``.
    Null entropy gives False.
    """
    if h_star is None:
        return pl.lit(False)
    return ((pl.col("entropy") < h_star) & (noise_score_expr(eps) > tau)).fill_null(False)


def p_bin_expr() -> pl.Expr:
    """Polars expression: index (Int32) into :data:`P_BINS` of p = exp(infer_logprob)."""
    lp = pl.col("infer_logprob")
    out = pl.lit(len(P_BINS) - 1, dtype=pl.Int32)
    for i in range(len(P_BINS) - 2, -1, -1):
        out = pl.when(lp < math.log(P_BINS[i][2])).then(pl.lit(i, dtype=pl.Int32)).otherwise(out)
    return out


def flagged_tokens(
    lf: pl.LazyFrame, h_star: float | None, *, tau: float = 4.0, eps: float = 0.01
) -> pl.LazyFrame:
    """The low-entropy noise tokens, lazily (for ``entr-diag flag -o noise.parquet``).

    ``lf``: the canonical token frame (docs/CONTRACT.md). Returns a LazyFrame with one row
    per flagged token and columns ``seq_id, position, step, token_id, train_logprob,
    infer_logprob, p, entropy, score`` (``step`` / ``token_id`` null when absent from
    ``lf``; ``p = exp(infer_logprob)``; ``score = delta^2 / (entropy + eps)``), then
    ``file`` when ``lf`` has it (the input file of each row: see
    :func:`entr_diag.compare.decisions_frame`). With ``h_star=None`` the result is empty
    (same columns). Sink it with ``sink_parquet``.
    """
    lf = token_frame(lf, "flagged_tokens")
    names = lf.collect_schema().names()

    def col(name: str, dtype: pl.DataType) -> pl.Expr:
        return pl.col(name) if name in names else pl.lit(None, dtype=dtype).alias(name)

    return lf.filter(noise_flag_expr(h_star, tau, eps)).select(
        pl.col("seq_id"),
        pl.col("position"),
        col("step", pl.Int64),
        col("token_id", pl.Int64),
        pl.col("train_logprob"),
        pl.col("infer_logprob"),
        pl.col("infer_logprob").exp().alias("p"),
        pl.col("entropy"),
        noise_score_expr(eps).alias("score"),
        *([pl.col("file")] if "file" in names else []),
    )


def regime_query(
    lf: pl.LazyFrame, h_star: float | None, *, tau: float = 4.0, eps: float = 0.01
) -> pl.LazyFrame:
    """Lazy aggregate for :func:`summarize_regime`: tokens and delta^2 sums per
    (below H*, flagged, p bin). ``lf`` must already be restricted to usable tokens."""
    lf = token_frame(lf, "regime_query")
    below = pl.lit(False) if h_star is None else (pl.col("entropy") < h_star)
    return (
        lf.select(
            below.alias("below"),
            noise_flag_expr(h_star, tau, eps).alias("flag"),
            p_bin_expr().alias("pbin"),
            (pl.col("delta") ** 2).alias("d2"),
        )
        .group_by(["below", "flag", "pbin"])
        .agg(pl.len().cast(pl.Int64).alias("n"), pl.col("d2").sum().alias("s_d2"))
        .sort(["below", "flag", "pbin"])
    )


@dataclass(frozen=True)
class PBinShare:
    """Flagged tokens with p in ``[p_lo, p_hi)``: count and shares."""

    label: str
    p_lo: float
    p_hi: float
    tokens: int
    share_of_flagged: float
    share_of_delta2_mass: float  # of the TOTAL delta^2 mass of all tokens

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class RegimeResult:
    """Summary of the low-entropy noise regime.

    Counts are tokens (valid, loss-masked, with entropy); delta^2 masses are sums of
    delta^2 in nats^2, given as shares of the total over all tokens. ``h_star`` is None
    when the fit found no breakpoint (then nothing is flagged).
    """

    h_star: float | None
    tau: float
    eps: float
    tokens: int
    tokens_below_h_star: int
    share_below_h_star: float
    delta2_mass_share_below_h_star: float
    flagged_tokens: int
    share_flagged: float
    delta2_mass_share_flagged: float
    by_p: tuple[PBinShare, ...]
    rule: str

    def to_dict(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k != "by_p"}
        d["by_p"] = [b.to_dict() for b in self.by_p]
        return d


def summarize_regime(
    table: pl.DataFrame, h_star: float | None, *, tau: float = 4.0, eps: float = 0.01
) -> RegimeResult:
    """Turn the collected :func:`regime_query` table into a :class:`RegimeResult`."""
    n = {(bool(r["below"]), bool(r["flag"]), int(r["pbin"])): (int(r["n"]), float(r["s_d2"]))
         for r in table.iter_rows(named=True)}
    tokens = sum(v[0] for v in n.values())
    mass = sum(v[1] for v in n.values())

    def tot(pred) -> tuple[int, float]:
        vals = [v for k, v in n.items() if pred(k)]
        return sum(v[0] for v in vals), sum(v[1] for v in vals)

    nb, mb = tot(lambda k: k[0])
    nf, mf = tot(lambda k: k[1])

    def share(a: float, b: float) -> float:
        return a / b if b > 0 else float("nan")

    by_p = []
    for i, (label, lo, hi) in enumerate(P_BINS):
        ni, mi = tot(lambda k, i=i: k[1] and k[2] == i)
        by_p.append(PBinShare(label, lo, hi, ni, share(ni, nf), share(mi, mass)))
    rule = (
        f"H < H* and delta^2/(H + {eps:g}) > {tau:g}"
        if h_star is not None
        else "no breakpoint: no token flagged"
    )
    return RegimeResult(
        h_star=h_star,
        tau=tau,
        eps=eps,
        tokens=tokens,
        tokens_below_h_star=nb,
        share_below_h_star=share(nb, tokens),
        delta2_mass_share_below_h_star=share(mb, mass),
        flagged_tokens=nf,
        share_flagged=share(nf, tokens),
        delta2_mass_share_flagged=share(mf, mass),
        by_p=tuple(by_p),
        rule=rule,
    )
