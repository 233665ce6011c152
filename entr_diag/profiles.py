"""Profiles of the token frame that only the HTML post-mortem report needs (issue 5).

Every function takes the canonical token frame (``Dataset.lf``, one row per valid,
loss-masked token, see docs/CONTRACT.md) as a ``pl.LazyFrame`` and returns a small frozen
dataclass with ``to_dict()``. Work is done by polars ``group_by`` / ``top_k`` / ``select``
aggregations collected with ``engine="streaming"``: the token frame itself is never
collected, so memory is bounded by the size of the result (bins, switch table, top-k rows),
not by the number of tokens.

- :func:`density_2d` - 2-D histogram of (entropy H, |delta|) on fixed log-spaced edges.
- :func:`mismatch_by_prob` - delta, |delta|, delta^2 per bin of sampled-token probability
  p = exp(infer_logprob) (METHOD.md, "the low-entropy noise regime": the excess of delta^2
  at low entropy is carried by tokens with small p).
- :func:`version_switch_profile` - mean entropy and |delta| by token offset from an
  in-flight policy-version switch inside a sequence (arXiv:2607.22186, figure 3).
- :func:`offenders` - the worst tokens by the ENTR score delta^2 / (H + eps)
  (arXiv:2607.22186, the ENTR gate) and the worst sequences by mean |delta|.
- :func:`compute_profiles` - all of the above, bundled for the report.

Units: entropy and delta in nats; p is a probability in [0, 1].
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from entr_diag.errors import ParameterError

__all__ = [
    "Density2D",
    "ProbProfile",
    "VersionSwitchProfile",
    "Offenders",
    "Profiles",
    "density_2d",
    "mismatch_by_prob",
    "version_switch_profile",
    "offenders",
    "compute_profiles",
    "log_edges",
]


# ----------------------------------------------------------------------------- helpers


def _collect(lf: pl.LazyFrame) -> pl.DataFrame:
    """Collect a (small, aggregated) lazy result on the streaming engine."""
    return lf.collect(engine="streaming")


def _columns(lf: pl.LazyFrame) -> set[str]:
    return set(lf.collect_schema().names())


def _num(x: Any) -> float | None:
    """Plain float (NaN kept) or None; polars may hand back None for empty aggregates."""
    if x is None:
        return None
    return float(x)


def log_edges(lo: float, hi: float, n: int) -> list[float]:
    """Fixed bin edges ``[0, lo, ..., hi]``: a floor bin ``[0, lo)`` then ``n`` log-spaced bins.

    Returns ``n + 2`` edges, i.e. ``n + 1`` bins. Bin 0 is the floor bin that holds zeros
    and every value below ``lo``; values at or above ``hi`` are clamped into the last bin.
    Raises :class:`ParameterError` unless ``0 < lo < hi`` and ``n >= 1``.
    """
    if not (lo > 0 and hi > lo and math.isfinite(hi)):
        raise ParameterError(f"Log-spaced bin edges need 0 < lo < hi; got lo={lo}, hi={hi}.")
    if n < 1:
        raise ParameterError(f"The number of log-spaced bins must be at least 1; got {n}.")
    return [0.0, *(float(v) for v in np.logspace(math.log10(lo), math.log10(hi), n + 1))]


def _log_bin(x: pl.Expr, lo: float, hi: float, n: int) -> pl.Expr:
    """Index (Int32, 0..n) of ``x`` in the bins of :func:`log_edges` ``(lo, hi, n)``."""
    width = (math.log10(hi) - math.log10(lo)) / n
    idx = ((x.clip(lower_bound=lo).log10() - math.log10(lo)) / width).floor() + 1
    return pl.when(x < lo).then(pl.lit(0)).otherwise(idx.clip(1, n)).cast(pl.Int32)


# ----------------------------------------------------------------------------- density 2-D


@dataclass(frozen=True)
class Density2D:
    """Token counts on a fixed (entropy, |delta|) grid.

    ``counts[i][j]`` is the number of tokens with entropy in ``[h_edges[i], h_edges[i+1])``
    and |delta| in ``[abs_delta_edges[j], abs_delta_edges[j+1])``; shape
    ``(len(h_edges) - 1, len(abs_delta_edges) - 1)``. Row/column 0 is the floor bin
    ``[0, lo)`` (exact zeros land there); values above the last edge are in the last bin.
    Units: nats for both axes. Tokens without a finite entropy are not counted.
    """

    available: bool
    reason: str | None
    h_edges: tuple[float, ...]
    abs_delta_edges: tuple[float, ...]
    counts: tuple[tuple[int, ...], ...]
    n_tokens: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "available": self.available,
            "reason": self.reason,
            "h_edges": list(self.h_edges),
            "abs_delta_edges": list(self.abs_delta_edges),
            "counts": [list(r) for r in self.counts],
            "n_tokens": self.n_tokens,
        }


def density_2d(
    lf: pl.LazyFrame,
    *,
    h_range: tuple[float, float] = (1e-5, 20.0),
    h_bins: int = 42,
    abs_delta_range: tuple[float, float] = (1e-6, 100.0),
    abs_delta_bins: int = 48,
    _joint: pl.DataFrame | None = None,
) -> Density2D:
    """2-D histogram of (entropy H, |delta|) per token, for the report's heatmap.

    Input: the canonical token frame (needs ``entropy`` and ``delta``). One streaming
    ``group_by`` over the two bin indices; the result has at most
    ``(h_bins + 1) * (abs_delta_bins + 1)`` cells whatever the token count. Edges are fixed
    (see :func:`log_edges`), so histograms of shards add up cell by cell.
    Returns an unavailable result (``available=False`` with a reason) when there is no
    entropy column or no token with a finite entropy.
    """
    h_edges = log_edges(h_range[0], h_range[1], h_bins)
    d_edges = log_edges(abs_delta_range[0], abs_delta_range[1], abs_delta_bins)
    empty = tuple(tuple(0 for _ in range(abs_delta_bins + 1)) for _ in range(h_bins + 1))

    def unavailable(reason: str) -> Density2D:
        return Density2D(False, reason, tuple(h_edges), tuple(d_edges), empty, 0)

    if "entropy" not in _columns(lf):
        return unavailable("the data carry no entropy column")
    h = pl.col("entropy")
    ad = pl.col("delta").abs()
    if _joint is not None:  # the table of _joint_histogram (compute_profiles)
        agg = (_joint.filter(pl.col("i").is_not_null()).group_by("i", "j")
               .agg(pl.col("n").sum()).select("i", "j", "n"))
    else:
        agg = _collect(
            lf.filter(h.is_finite() & pl.col("delta").is_finite())
            .select(
                _log_bin(h, *h_range, h_bins).alias("i"),
                _log_bin(ad, *abs_delta_range, abs_delta_bins).alias("j"),
            )
            .group_by("i", "j")
            .agg(pl.len().alias("n"))
        )
    grid = np.zeros((h_bins + 1, abs_delta_bins + 1), dtype=np.int64)
    for i, j, n in agg.iter_rows():
        grid[i, j] += n
    total = int(grid.sum())
    if total == 0:
        return unavailable("no token has a finite entropy")
    return Density2D(
        True,
        None,
        tuple(h_edges),
        tuple(d_edges),
        tuple(tuple(int(v) for v in row) for row in grid),
        total,
    )


# ----------------------------------------------------------------------------- by p


@dataclass(frozen=True)
class ProbBin:
    """One bin of sampled-token probability p = exp(infer_logprob), ``[p_lo, p_hi)``."""

    p_lo: float
    p_hi: float
    tokens: int
    mean_delta: float | None
    mean_abs_delta: float | None
    mean_delta_sq: float | None
    delta_sq_share: float | None
    mean_entropy: float | None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class ProbProfile:
    """Mismatch per bin of sampled-token probability p (rows per bin, all bins listed).

    Per bin: ``tokens``; ``mean_delta`` (signed, nats); ``mean_abs_delta`` (nats);
    ``mean_delta_sq`` (nats^2); ``delta_sq_share`` = the bin's share of the total delta^2
    mass; ``mean_entropy`` (nats, None without an entropy column). Means are None for
    empty bins. Bin 0 is the floor bin ``[0, p_min)``.
    """

    available: bool
    reason: str | None
    edges: tuple[float, ...]
    bins: tuple[ProbBin, ...]
    n_tokens: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "available": self.available,
            "reason": self.reason,
            "edges": list(self.edges),
            "bins": [b.to_dict() for b in self.bins],
            "n_tokens": self.n_tokens,
        }


def mismatch_by_prob(
    lf: pl.LazyFrame, *, p_range: tuple[float, float] = (1e-6, 1.0), bins: int = 24,
    _joint: pl.DataFrame | None = None,
) -> ProbProfile:
    """Mismatch by sampled-token probability p = exp(infer_logprob), on log-spaced bins.

    Input: the canonical token frame (``infer_logprob``, ``delta``; ``entropy`` optional).
    One streaming ``group_by`` on the p bin; ``bins + 1`` rows out (floor bin included).
    METHOD.md: in the low-entropy noise regime E[delta^2 | q] grows like (1 - q)/q, so the
    small-p bins should carry a disproportionate share of the delta^2 mass.
    """
    edges = log_edges(p_range[0], p_range[1], bins)
    has_h = "entropy" in _columns(lf)
    p = pl.col("infer_logprob").exp()
    d = pl.col("delta")
    aggs = _prob_aggs(has_h)
    if _joint is not None:  # the table of _joint_histogram (compute_profiles)
        sums = [pl.col(c).sum() for c in ("n", "s1", "sa", "s2", "sh", "nh") if c in _joint.columns]
        agg = _joint.filter(pl.col("b").is_not_null()).group_by("b").agg(sums)
    else:
        agg = _collect(
            lf.filter(d.is_finite() & pl.col("infer_logprob").is_finite())
            .group_by(_log_bin(p, *p_range, bins).alias("b"))
            .agg(aggs)
        )
    rows = {r["b"]: r for r in agg.iter_rows(named=True)}
    total_n = int(sum(r["n"] for r in rows.values()))
    total_s2 = float(sum(r["s2"] for r in rows.values()))
    out = []
    for b in range(bins + 1):
        r = rows.get(b)
        n = int(r["n"]) if r else 0
        if n:
            mh = None
            if has_h and r["nh"]:
                mh = float(r["sh"]) / float(r["nh"])
            out.append(
                ProbBin(
                    edges[b],
                    edges[b + 1],
                    n,
                    float(r["s1"]) / n,
                    float(r["sa"]) / n,
                    float(r["s2"]) / n,
                    float(r["s2"]) / total_s2 if total_s2 > 0 else None,
                    mh,
                )
            )
        else:
            out.append(ProbBin(edges[b], edges[b + 1], 0, None, None, None, None, None))
    if total_n == 0:
        return ProbProfile(False, "no tokens", tuple(edges), tuple(out), 0)
    return ProbProfile(True, None, tuple(edges), tuple(out), total_n)


def _prob_aggs(has_h: bool) -> list[pl.Expr]:
    d = pl.col("delta")
    aggs = [
        pl.len().alias("n"),
        d.sum().alias("s1"),
        d.abs().sum().alias("sa"),
        (d * d).sum().alias("s2"),
    ]
    if has_h:
        h = pl.col("entropy")
        # when/then rather than filter inside the aggregation: that stays streaming
        aggs += [
            pl.when(h.is_finite()).then(h).sum().alias("sh"),
            h.is_finite().sum().alias("nh"),
        ]
    return aggs


def _joint_histogram(lf: pl.LazyFrame) -> pl.DataFrame:
    """One streaming pass for :func:`density_2d` and :func:`mismatch_by_prob` (default
    grids): token counts and sums per (H bin i, |delta| bin j, p bin b), each key null where
    that profile's filter drops the token. At most 43 x 49 x 25 groups whatever the input
    size; each profile sums the groups of its non-null key."""
    h, d, lp = pl.col("entropy"), pl.col("delta"), pl.col("infer_logprob")
    has_h = "entropy" in _columns(lf)
    keys = []
    if has_h:
        dens_ok = h.is_finite() & d.is_finite()
        keys += [pl.when(dens_ok).then(_log_bin(h, 1e-5, 20.0, 42)).alias("i"),
                 pl.when(dens_ok).then(_log_bin(d.abs(), 1e-6, 100.0, 48)).alias("j")]
    prob_ok = d.is_finite() & lp.is_finite()
    keys.append(pl.when(prob_ok).then(_log_bin(lp.exp(), 1e-6, 1.0, 24)).alias("b"))
    return _collect(lf.group_by(keys).agg(_prob_aggs(has_h)))


# ----------------------------------------------------------------------------- switches


@dataclass(frozen=True)
class VersionSwitchProfile:
    """Mean entropy and |delta| by token offset from in-flight policy-version switches.

    A switch is the first position, within a sequence (``seq_key``), of a policy version
    other than the sequence's first one; offset = position - switch position, so offset 0
    is the first token sampled by the new weights and -1 the last one before. Offsets are
    measured in positions (gaps left by excluded tokens count). A token near two switches
    counts once for each. Rows: one per offset in ``-max_offset..max_offset``; ``tokens`` is
    the (token, switch) pair count, means are None when no token sits at that offset
    (``mean_entropy`` also without an entropy column). Units: nats.
    Source: arXiv:2607.22186, figure 3.

    ``non_contiguous_sequences`` counts sequences whose versions do not form contiguous
    runs (the switch position is then ill-defined; they are included as computed).
    """

    available: bool
    reason: str | None
    max_offset: int
    offsets: tuple[int, ...]
    tokens: tuple[int, ...]
    mean_entropy: tuple[float | None, ...]
    mean_abs_delta: tuple[float | None, ...]
    n_sequences: int
    n_sequences_with_switch: int
    n_switches: int
    non_contiguous_sequences: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "available": self.available,
            "reason": self.reason,
            "max_offset": self.max_offset,
            "offsets": list(self.offsets),
            "tokens": list(self.tokens),
            "mean_entropy": list(self.mean_entropy),
            "mean_abs_delta": list(self.mean_abs_delta),
            "n_sequences": self.n_sequences,
            "n_sequences_with_switch": self.n_sequences_with_switch,
            "n_switches": self.n_switches,
            "non_contiguous_sequences": self.non_contiguous_sequences,
        }


def version_switch_profile(
    lf: pl.LazyFrame, *, max_offset: int = 16, _seq_pv: pl.DataFrame | None = None
) -> VersionSwitchProfile:
    """Entropy and |delta| around in-flight policy-version switches (paper figure 3).

    Input: the canonical token frame (``seq_key``, ``position``, ``policy_version``,
    ``delta``; ``entropy`` optional). Passes: (1) a streaming ``group_by`` on
    (seq_key, policy_version) giving the first/last position of each version run, which
    is small (sequences x versions); (2) the token frame joined to the switch table of the
    sequences that switch (the small side is the build side), filtered to
    ``|offset| <= max_offset`` and grouped by offset. Returns ``available=False`` with a
    reason when there is no ``policy_version`` column or no sequence switches version.
    Raises :class:`ParameterError` when ``max_offset < 1``.
    """
    if max_offset < 1:
        raise ParameterError(f"max_offset must be at least 1; got {max_offset}.")
    offsets = tuple(range(-max_offset, max_offset + 1))
    n_off = len(offsets)

    def unavailable(reason: str, n_seq: int = 0, noncontig: int = 0) -> VersionSwitchProfile:
        return VersionSwitchProfile(
            False,
            reason,
            max_offset,
            offsets,
            (0,) * n_off,
            (None,) * n_off,
            (None,) * n_off,
            n_seq,
            0,
            0,
            noncontig,
        )

    cols = _columns(lf)
    if "policy_version" not in cols:
        return unavailable("the data carry no policy_version column")
    if _seq_pv is not None:  # the table of _seq_version_table (compute_profiles)
        runs = _seq_pv.filter(pl.col("policy_version").is_not_null()).select(
            "seq_key", "policy_version", "first", "last")
    else:
        runs = _collect(
            lf.filter(pl.col("policy_version").is_not_null())
            .group_by("seq_key", "policy_version")
            .agg(pl.col("position").min().alias("first"), pl.col("position").max().alias("last"))
        )
    n_seq = runs["seq_key"].n_unique() if runs.height else 0
    if runs.height == 0:
        return unavailable("no token carries a policy version")
    runs = runs.sort("seq_key", "first")
    runs = runs.with_columns(
        pl.col("last").shift(1).over("seq_key").alias("prev_last"),
        (pl.int_range(pl.len()).over("seq_key")).alias("k"),
    )
    noncontig = int(runs.filter(pl.col("prev_last") >= pl.col("first"))["seq_key"].n_unique())
    switches = runs.filter(pl.col("k") > 0).select("seq_key", pl.col("first").alias("switch_pos"))
    if switches.height == 0:
        return unavailable(
            "no in-flight version switch: every sequence was sampled by a single policy version",
            n_seq,
            noncontig,
        )
    has_h = "entropy" in cols
    aggs = [pl.len().alias("n"), pl.col("delta").abs().mean().alias("mad")]
    if has_h:
        h = pl.col("entropy")
        aggs.append(h.filter(h.is_finite()).mean().alias("mh"))
    prof = _collect(
        lf.select("seq_key", "position", "delta", *(["entropy"] if has_h else []))
        .join(switches.lazy(), on="seq_key", how="inner")
        .with_columns((pl.col("position") - pl.col("switch_pos")).alias("offset"))
        .filter(pl.col("offset").abs() <= max_offset)
        .group_by("offset")
        .agg(aggs)
    )
    by = {r["offset"]: r for r in prof.iter_rows(named=True)}
    tokens = tuple(int(by[o]["n"]) if o in by else 0 for o in offsets)
    mad = tuple(_num(by[o]["mad"]) if o in by else None for o in offsets)
    mh = tuple(_num(by[o]["mh"]) if (has_h and o in by) else None for o in offsets)
    return VersionSwitchProfile(
        True,
        None,
        max_offset,
        offsets,
        tokens,
        mh,
        mad,
        int(n_seq),
        int(switches["seq_key"].n_unique()),
        int(switches.height),
        noncontig,
    )


# ----------------------------------------------------------------------------- offenders


@dataclass(frozen=True)
class Offenders:
    """The worst tokens and sequences, with the keys to find them in the input.

    ``tokens``: up to ``top`` rows, highest ``score`` first, each a dict with ``seq_id``,
    ``position``, ``step``, ``token_id`` (None when the column is absent), ``entropy`` (H,
    nats), ``p`` (= exp(infer_logprob)), ``delta`` (nats) and ``score``. ``score_kind`` says
    what the score is: ``"delta^2/(H+eps)"`` (the ENTR statistic, arXiv:2607.22186) or
    ``"delta^2"`` when the data carry no entropy.
    ``sequences``: up to ``top`` rows, highest ``mean_abs_delta`` first, each with
    ``seq_id``, ``step``, ``tokens``, ``mean_abs_delta`` and ``max_abs_delta`` (nats).
    """

    available: bool
    reason: str | None
    top: int
    eps: float
    score_kind: str
    tokens: tuple[dict[str, Any], ...]
    sequences: tuple[dict[str, Any], ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "available": self.available,
            "reason": self.reason,
            "top": self.top,
            "eps": self.eps,
            "score_kind": self.score_kind,
            "tokens": [dict(r) for r in self.tokens],
            "sequences": [dict(r) for r in self.sequences],
        }


def offenders(
    lf: pl.LazyFrame, *, top: int = 20, eps: float = 0.01, _seq_pv: pl.DataFrame | None = None
) -> Offenders:
    """Top tokens by delta^2 / (H + eps) and top sequences by mean |delta|.

    Input: the canonical token frame. Tokens: one streaming ``top_k`` (memory O(top)).
    Sequences: a streaming ``group_by`` on ``seq_key`` (one row per sequence) then
    ``top_k``. Ties are broken by (seq_id, position) so the result does not depend on row
    order. Raises :class:`ParameterError` when ``top < 1`` or ``eps < 0``.
    """
    if top < 1:
        raise ParameterError(f"top must be at least 1; got {top}.")
    if not (eps >= 0 and math.isfinite(eps)):
        raise ParameterError(f"eps must be a finite number >= 0; got {eps}.")
    cols = _columns(lf)
    has_h = "entropy" in cols
    d = pl.col("delta")
    if has_h:
        score = (d * d) / (pl.col("entropy") + eps)
        kind = "delta^2/(H+eps)"
    else:
        score = d * d
        kind = "delta^2"
    opt = lambda c, dt: pl.col(c) if c in cols else pl.lit(None, dtype=dt).alias(c)  # noqa: E731
    base = lf.filter(d.is_finite())
    if has_h:
        base = base.filter(pl.col("entropy").is_finite())
    # a top_k of the whole rows (string seq_id as tie-break) held memory growing with the
    # tokens (+0.4 GB at 50M); first the top scores alone (one float column), then the
    # exact top_k with tie-breaks on the few rows at or above the top-th score (NaN scores
    # sort above every number: kept as well)
    top_scores = _collect(base.select(score.alias("score")).top_k(top, by="score"))["score"]
    if top_scores.len():
        thr = top_scores.min() if not top_scores.is_nan().all() else float("nan")
        at_least = pl.col("score").is_nan()
        if thr == thr:  # not NaN
            at_least = at_least | (pl.col("score") >= thr)
    else:
        at_least = pl.lit(False)
    tok = _collect(
        base.select(
            "seq_id",
            "position",
            opt("step", pl.Int64),
            opt("token_id", pl.Int64),
            opt("entropy", pl.Float64),
            pl.col("infer_logprob").exp().alias("p"),
            "delta",
            score.alias("score"),
        ).filter(at_least)
        .top_k(top, by=["score", "seq_id", "position"], reverse=[False, True, True])
    ).sort(["score", "seq_id", "position"], descending=[True, False, False])
    if _seq_pv is not None:  # the table of _seq_version_table (compute_profiles)
        per_seq = (
            _seq_pv.group_by("seq_key")
            .agg(pl.col("seq_id").first(), pl.col("step").first(),
                 pl.col("n_fin").sum().alias("tokens"), pl.col("s_abs").sum(),
                 pl.col("m_abs").max().alias("max_abs_delta"))
            .filter(pl.col("tokens") > 0)
            .select("seq_key", "seq_id", "step", pl.col("tokens").cast(pl.UInt32),
                    (pl.col("s_abs") / pl.col("tokens")).alias("mean_abs_delta"),
                    "max_abs_delta")
            .lazy()
        )
    else:
        per_seq = (
            lf.filter(d.is_finite())
            .group_by("seq_key")
            .agg(
                pl.col("seq_id").first(),
                (pl.col("step").first() if "step" in cols else pl.lit(None, pl.Int64))
                .alias("step"),
                pl.len().alias("tokens"),
                d.abs().mean().alias("mean_abs_delta"),
                d.abs().max().alias("max_abs_delta"),
            )
        )
    seq = _collect(
        per_seq.drop("seq_key")
        .top_k(top, by=["mean_abs_delta", "seq_id"], reverse=[False, True])
    ).sort(["mean_abs_delta", "seq_id"], descending=[True, False])
    if tok.height == 0:
        return Offenders(False, "no tokens", top, eps, kind, (), ())
    return Offenders(
        True,
        None,
        top,
        eps,
        kind,
        tuple(tok.to_dicts()),
        tuple(seq.to_dicts()),
    )


# ----------------------------------------------------------------------------- bundle


@dataclass(frozen=True)
class Profiles:
    """All report profiles of one run; ``to_dict()`` is the ``profiles`` input of
    :func:`entr_diag.report.html_report.build_report_html` and of the JSON report."""

    density_2d: Density2D
    mismatch_by_prob: ProbProfile
    version_switch: VersionSwitchProfile
    offenders: Offenders

    def to_dict(self) -> dict[str, Any]:
        return {
            "density_2d": self.density_2d.to_dict(),
            "mismatch_by_prob": self.mismatch_by_prob.to_dict(),
            "version_switch": self.version_switch.to_dict(),
            "offenders": self.offenders.to_dict(),
        }


def compute_profiles(
    lf: pl.LazyFrame, *, eps: float = 0.01, top: int = 20, max_offset: int = 16
) -> Profiles:
    """Run :func:`density_2d`, :func:`mismatch_by_prob`, :func:`version_switch_profile` and
    :func:`offenders` with their defaults (``eps`` is the ENTR eps, nats)."""
    joint = _joint_histogram(lf)
    seq_pv = _seq_version_table(lf)
    return Profiles(
        density_2d(lf, _joint=joint),
        mismatch_by_prob(lf, _joint=joint),
        version_switch_profile(lf, max_offset=max_offset, _seq_pv=seq_pv),
        offenders(lf, top=top, eps=eps, _seq_pv=seq_pv),
    )


def _seq_version_table(lf: pl.LazyFrame) -> pl.DataFrame | None:
    """One streaming pass for :func:`version_switch_profile` (version runs) and the
    sequence half of :func:`offenders`: per (seq_key, policy_version), the first and last
    position and the count, sum and max of |delta| over finite deltas. O(sequences x
    versions) rows. None without a policy_version column (each function then scans)."""
    cols = _columns(lf)
    if "policy_version" not in cols:
        return None
    d = pl.col("delta")
    fin = d.is_finite()
    return _collect(
        lf.group_by("seq_key", "policy_version").agg(
            pl.col("position").min().alias("first"),
            pl.col("position").max().alias("last"),
            pl.col("seq_id").first(),
            (pl.col("step").first() if "step" in cols else pl.lit(None, pl.Int64)).alias("step"),
            fin.sum().alias("n_fin"),
            pl.when(fin).then(d.abs()).sum().alias("s_abs"),
            pl.when(fin).then(d.abs()).max().alias("m_abs"),
        )
    )
