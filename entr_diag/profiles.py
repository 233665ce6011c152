"""Profiles of the token frame that only the HTML post-mortem report needs (issue 5).

Every function takes the canonical token frame (``Dataset.lf``, one row per valid,
loss-masked token, see docs/CONTRACT.md) as a ``pl.LazyFrame`` and returns a small frozen
dataclass with ``to_dict()``. The work is done by mergeable accumulators fed by one
streaming pass (:func:`entr_diag.passes.run_pass`): fixed-edge histograms (``numpy.bincount``
on polars-computed bin indices), a per-(sequence, policy version) table merged by key, and
a top-k of tokens merged by keeping the top-k of the union. The token frame itself is never
collected, so memory is bounded by the size of the results (bins, sequences x versions,
top-k rows), not by the number of tokens.

- :func:`density_2d` - 2-D histogram of (entropy H, |delta|) on fixed log-spaced edges.
- :func:`mismatch_by_prob` - delta, |delta|, delta^2 per bin of sampled-token probability
  p = exp(infer_logprob) (METHOD.md, "the low-entropy noise regime": the excess of delta^2
  at low entropy is carried by tokens with small p).
- :func:`version_switch_profile` - mean entropy and |delta| by token offset from an
  in-flight policy-version switch inside a sequence (arXiv:2607.22186, figure 3).
- :func:`offenders` - the worst tokens by the ENTR score delta^2 / (H + eps)
  (arXiv:2607.22186, the ENTR gate) and the worst sequences by mean |delta|.
- :func:`compute_profiles` - all of the above, bundled for the report;
  :func:`profiles_plan` gives its accumulators, to run in a pass shared with other analyses.

Passes: everything is computed in one pass except the per-offset means of
:func:`version_switch_profile`, which need the switch positions (the first position of each
non-first version run of a sequence, known only once the whole sequence has been seen) to
select the tokens within ``max_offset`` of them: that is a second pass, run only when some
sequence switches version (:meth:`ProfilesPlan.followup`).

Units: entropy and delta in nats; p is a probability in [0, 1].
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from entr_diag.errors import ParameterError
from entr_diag.frames import token_frame
from entr_diag.passes import (
    Accumulator,
    PartialRows,
    column,
    has_nulls,
    run_pass,
    run_rows,
    run_starts,
)

__all__ = [
    "Density2D",
    "ProbProfile",
    "VersionSwitchProfile",
    "Offenders",
    "Profiles",
    "ProfilesPlan",
    "density_2d",
    "mismatch_by_prob",
    "version_switch_profile",
    "offenders",
    "compute_profiles",
    "profiles_plan",
    "log_edges",
]

#: Default grids of the report (density_2d, mismatch_by_prob): (range, number of log bins).
_H_GRID = ((1e-5, 20.0), 42)
_ABS_DELTA_GRID = ((1e-6, 100.0), 48)
_P_GRID = ((1e-6, 1.0), 24)

#: names of the per-token keys the streaming engine computes for the accumulators
_DENS = "_pf_density_cell"
_PBIN = "_pf_p_bin"
#: accumulators per bin of :class:`_ProbSums`
_LANES = 8


# ----------------------------------------------------------------------------- helpers


def _columns(lf: pl.LazyFrame) -> set[str]:
    return set(lf.collect_schema().names())


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


class _DensityCounts:
    """Accumulator of :func:`density_2d`: token counts per (entropy bin, |delta| bin) cell,
    by ``numpy.bincount`` on the flat cell index, which the streaming engine computes
    during the scan (:attr:`exprs`; -1 for a token without a finite entropy and delta, not
    counted). Mergeable (counts add). :attr:`counts`: int64, shape
    ``(h_bins + 1, abs_delta_bins + 1)``."""

    columns = ()

    def __init__(self, h_range: tuple[float, float], h_bins: int,
                 abs_delta_range: tuple[float, float], abs_delta_bins: int,
                 has_h: bool = True) -> None:
        self.h_range, self.h_bins = h_range, h_bins
        self.d_range, self.d_bins = abs_delta_range, abs_delta_bins
        self.counts = np.zeros((h_bins + 1, abs_delta_bins + 1), dtype=np.int64)
        self.exprs: list[pl.Expr] = []
        if has_h:
            h, d = pl.col("entropy"), pl.col("delta")
            cell = (_log_bin(h, *h_range, h_bins) * (abs_delta_bins + 1)
                    + _log_bin(d.abs(), *abs_delta_range, abs_delta_bins))
            self.exprs = [pl.when(h.is_finite() & d.is_finite()).then(cell).otherwise(-1)
                          .fill_null(-1).cast(pl.Int32).alias(_DENS)]

    def update(self, batch: pl.DataFrame) -> None:
        if _DENS not in batch.columns:
            return
        k = column(batch, _DENS)
        if int(k.min()) < 0:
            k = k[k >= 0]
        self.counts += np.bincount(k, minlength=self.counts.size).reshape(self.counts.shape)


def density_2d(
    lf: pl.LazyFrame,
    *,
    h_range: tuple[float, float] = _H_GRID[0],
    h_bins: int = _H_GRID[1],
    abs_delta_range: tuple[float, float] = _ABS_DELTA_GRID[0],
    abs_delta_bins: int = _ABS_DELTA_GRID[1],
) -> Density2D:
    """2-D histogram of (entropy H, |delta|) per token, for the report's heatmap.

    Input: the canonical token frame (needs ``entropy`` and ``delta``). One streaming pass
    counting tokens per pair of bin indices; the result has
    ``(h_bins + 1) * (abs_delta_bins + 1)`` cells whatever the token count. Edges are fixed
    (see :func:`log_edges`), so histograms of shards add up cell by cell.
    Returns an unavailable result (``available=False`` with a reason) when there is no
    entropy column or no token with a finite entropy.
    """
    lf = token_frame(lf, "density_2d")
    log_edges(h_range[0], h_range[1], h_bins)  # parameter checks before the pass
    log_edges(abs_delta_range[0], abs_delta_range[1], abs_delta_bins)
    has_h = "entropy" in _columns(lf)
    acc = _DensityCounts(h_range, h_bins, abs_delta_range, abs_delta_bins, has_h)
    if has_h:
        run_pass(lf, [acc])
    return _density_result(acc, has_h=has_h)


def _density_result(acc: _DensityCounts, *, has_h: bool) -> Density2D:
    h_edges = tuple(log_edges(acc.h_range[0], acc.h_range[1], acc.h_bins))
    d_edges = tuple(log_edges(acc.d_range[0], acc.d_range[1], acc.d_bins))
    total = int(acc.counts.sum())
    if not has_h or total == 0:
        empty = tuple(tuple(0 for _ in range(acc.d_bins + 1)) for _ in range(acc.h_bins + 1))
        reason = "the data carry no entropy column" if not has_h else "no token has a finite entropy"
        return Density2D(False, reason, h_edges, d_edges, empty, 0)
    return Density2D(
        True,
        None,
        h_edges,
        d_edges,
        tuple(tuple(int(v) for v in row) for row in acc.counts),
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


class _ProbSums:
    """Accumulator of :func:`mismatch_by_prob`: per p bin, the token count ``n`` and the
    sums ``s1`` (delta), ``sa`` (|delta|), ``s2`` (delta^2) and, with an entropy column,
    ``sh`` / ``nh`` (sum / count of the finite entropies), over tokens with a finite delta
    and infer_logprob. The p bin of each token is computed by the streaming engine
    (:attr:`exprs`, -1 for a token not counted); per batch, numpy adds the terms with
    ``bincount``. Mergeable (sums add). :attr:`sums`: name -> float64 ``(bins + 1,)``."""

    def __init__(self, p_range: tuple[float, float], bins: int, has_h: bool) -> None:
        self.p_range, self.bins, self.has_h = p_range, bins, has_h
        names = ("n", "s1", "sa", "s2", *(("sh", "nh") if has_h else ()))
        self.sums = {c: np.zeros(bins + 1, dtype=np.float64) for c in names}
        self.columns = ["delta", *(["entropy"] if has_h else [])]
        d, lp = pl.col("delta"), pl.col("infer_logprob")
        self.exprs = [pl.when(d.is_finite() & lp.is_finite())
                      .then(_log_bin(lp.exp(), *p_range, bins)).otherwise(-1).fill_null(-1)
                      .cast(pl.Int64).alias(_PBIN)]
        self._buf = np.empty(0)
        self._lane = np.empty(0, dtype=np.int64)

    def update(self, batch: pl.DataFrame) -> None:
        k = column(batch, _PBIN)
        d = column(batch, "delta")
        h = column(batch, "entropy") if self.has_h else None
        if int(k.min()) < 0:  # tokens not counted (a non-finite delta or infer_logprob)
            sel = k >= 0
            k, d = k[sel], d[sel]
            h = None if h is None else h[sel]
        n = k.size
        if self._lane.size < n:
            self._lane = np.arange(n, dtype=np.int64) % _LANES
            self._buf = np.empty(n)
        # most tokens fall in the last bins: one accumulator per (bin, lane) so that
        # consecutive tokens do not add to the same memory cell
        k = k * _LANES + self._lane[:n]
        buf = self._buf[:n]
        size = (self.bins + 1) * _LANES

        def add(name: str, w: np.ndarray | None) -> None:
            self.sums[name] += np.bincount(k, weights=w, minlength=size).reshape(
                -1, _LANES).sum(axis=1)

        add("n", None)
        add("s1", d)
        add("sa", np.abs(d, out=buf))
        add("s2", np.multiply(d, d, out=buf))
        if h is not None:
            fin = np.isfinite(h)
            if fin.all():
                add("nh", None)
                add("sh", h)
            else:
                add("nh", fin.astype(np.float64))
                add("sh", np.where(fin, h, 0.0))


def mismatch_by_prob(
    lf: pl.LazyFrame, *, p_range: tuple[float, float] = _P_GRID[0], bins: int = _P_GRID[1],
) -> ProbProfile:
    """Mismatch by sampled-token probability p = exp(infer_logprob), on log-spaced bins.

    Input: the canonical token frame (``infer_logprob``, ``delta``; ``entropy`` optional).
    One streaming pass summing per p bin; ``bins + 1`` rows out (floor bin included).
    METHOD.md: in the low-entropy noise regime E[delta^2 | q] grows like (1 - q)/q, so the
    small-p bins should carry a disproportionate share of the delta^2 mass.
    """
    lf = token_frame(lf, "mismatch_by_prob")
    log_edges(p_range[0], p_range[1], bins)  # parameter checks before the pass
    acc = _ProbSums(p_range, bins, "entropy" in _columns(lf))
    run_pass(lf, [acc])
    return _prob_result(acc)


def _prob_result(acc: _ProbSums) -> ProbProfile:
    edges = log_edges(acc.p_range[0], acc.p_range[1], acc.bins)
    s = acc.sums
    total_n = int(s["n"].sum())
    total_s2 = float(s["s2"].sum())
    out = []
    for b in range(acc.bins + 1):
        n = int(s["n"][b])
        if n:
            mh = None
            if acc.has_h and s["nh"][b]:
                mh = float(s["sh"][b]) / float(s["nh"][b])
            s2 = float(s["s2"][b])
            out.append(
                ProbBin(
                    edges[b],
                    edges[b + 1],
                    n,
                    float(s["s1"][b]) / n,
                    float(s["sa"][b]) / n,
                    s2 / n,
                    s2 / total_s2 if total_s2 > 0 else None,
                    mh,
                )
            )
        else:
            out.append(ProbBin(edges[b], edges[b + 1], 0, None, None, None, None, None))
    if total_n == 0:
        return ProbProfile(False, "no tokens", tuple(edges), tuple(out), 0)
    return ProbProfile(True, None, tuple(edges), tuple(out), total_n)


# ----------------------------------------------------------------------------- per sequence


_SEQ_TABLE_SCHEMA = {"seq_key": pl.UInt64, "policy_version": pl.Int64, "first": pl.Int64,
                     "last": pl.Int64, "seq_id": pl.String, "step": pl.Int64,
                     "n_fin": pl.UInt32, "s_abs": pl.Float64, "m_abs": pl.Float64}
_SEQ_COLS = list(_SEQ_TABLE_SCHEMA)


class _SeqVersions:
    """Accumulator of the per-(seq_key, policy_version) table shared by
    :func:`version_switch_profile` (version runs) and the sequence half of :func:`offenders`:
    the first and last position, ``seq_id``, ``step``, and the count, sum and max of |delta|
    over finite deltas. Without a policy_version column the version is null (one row per
    sequence). O(sequences x versions) rows.

    Per batch, runs of consecutive rows of one (sequence, version) are reduced with numpy
    ``reduceat`` (the tokens of a sequence are usually contiguous: a batch collapses to about
    one row per sequence); a batch with a null key or position takes a polars group-by.
    Partial rows of one key merge by min / max / sum (``seq_id`` and ``step`` are constant
    within a sequence) after the pass (:class:`~entr_diag.passes.PartialRows`).
    """

    def __init__(self, cols: set[str]) -> None:
        self.keys = [c for c in ("seq_key", "policy_version") if c in cols]
        self.columns = [c for c in ("seq_key", "policy_version", "position", "seq_id", "step",
                                    "delta") if c in cols]
        #: seq_id may come as read (an integer): kept as String (passes.NATIVE_SEQ_ID)
        self.native_seq_id = True
        #: columns the frame lacks, added as nulls
        self._add = [pl.lit(None, dtype=pl.Int64).alias(c) for c in ("policy_version", "step")
                     if c not in cols]
        d = pl.col("delta")
        fin = d.is_finite()
        self._aggs = [
            pl.col("position").min().alias("first"),
            pl.col("position").max().alias("last"),
            pl.col("seq_id").first().cast(pl.String),
            pl.col("step").first(),
            fin.sum().alias("n_fin"),
            pl.when(fin).then(d.abs()).sum().alias("s_abs"),
            pl.when(fin).then(d.abs()).max().alias("m_abs"),
        ]
        self.table = PartialRows(["seq_key", "policy_version"], [
            pl.col("first").min(),
            pl.col("last").max(),
            pl.col("seq_id").first(),
            pl.col("step").first(),
            pl.col("n_fin").sum(),
            pl.col("s_abs").sum(),
            pl.col("m_abs").max(),
        ])

    def update(self, batch: pl.DataFrame) -> None:
        if has_nulls(batch, [*self.keys, "position"]):
            self.table.add(batch.with_columns(self._add).group_by("seq_key", "policy_version")
                           .agg(self._aggs).select(_SEQ_COLS)
                           .with_columns(pl.col("n_fin").cast(pl.Int64)))
            return
        starts = run_starts(batch, self.keys)
        idx = pl.Series(starts)
        pos = column(batch, "position")
        ad = np.abs(column(batch, "delta"))
        fin = np.isfinite(ad)
        all_fin = bool(fin.all())
        if not all_fin:
            ad = np.where(fin, ad, 0.0)

        def first(c: str) -> Any:  # the value of column c at the start of each run
            if c not in batch.columns:
                return pl.Series(c, [None] * starts.size, dtype=_SEQ_TABLE_SCHEMA[c])
            if batch[c].dtype.is_numeric() and not batch[c].null_count():
                return column(batch, c)[starts]
            return batch[c].gather(idx)

        self.table.add({
            "seq_key": first("seq_key"),
            "policy_version": first("policy_version"),
            "first": np.minimum.reduceat(pos, starts),
            "last": np.maximum.reduceat(pos, starts),
            "seq_id": pl.Series(first("seq_id")).cast(pl.String),
            "step": first("step"),
            "n_fin": np.add.reduceat(fin, starts),  # (bool sums are int64)
            "s_abs": np.add.reduceat(ad, starts),
            # -1 for a run without a finite delta (null after the merge, as max of nothing)
            "m_abs": np.maximum.reduceat(ad if all_fin else np.where(fin, ad, -1.0), starts),
        })

    def result(self) -> pl.DataFrame:
        """The merged table (schema :data:`_SEQ_TABLE_SCHEMA`, one row per key)."""
        t = self.table.result(pl.DataFrame(schema=_SEQ_TABLE_SCHEMA))
        return t.with_columns(pl.col("n_fin").cast(pl.UInt32),
                              pl.when(pl.col("n_fin") > 0).then(pl.col("m_abs")).alias("m_abs"))


def _seq_table(acc: _SeqVersions) -> pl.DataFrame:
    return acc.result()


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


@dataclass(frozen=True)
class _Switches:
    """The version runs of the merged per-sequence table, reduced: ``n_seq`` sequences with
    a policy version, ``noncontig`` of them with interleaved runs, and ``table`` (seq_key,
    switch_pos), one row per switch."""

    n_seq: int
    noncontig: int
    table: pl.DataFrame


def _switches(seq_table: pl.DataFrame) -> _Switches:
    runs = seq_table.filter(pl.col("policy_version").is_not_null()).select(
        "seq_key", "policy_version", "first", "last")
    if runs.height == 0:
        return _Switches(0, 0, pl.DataFrame(schema={"seq_key": pl.UInt64, "switch_pos": pl.Int64}))
    n_seq = runs["seq_key"].n_unique()
    runs = runs.sort("seq_key", "first")
    runs = runs.with_columns(
        pl.col("last").shift(1).over("seq_key").alias("prev_last"),
        (pl.int_range(pl.len()).over("seq_key")).alias("k"),
    )
    noncontig = int(runs.filter(pl.col("prev_last") >= pl.col("first"))["seq_key"].n_unique())
    table = runs.filter(pl.col("k") > 0).select("seq_key", pl.col("first").alias("switch_pos"))
    return _Switches(int(n_seq), noncontig, table)


class _SwitchOffsets:
    """Accumulator of the second pass of :func:`version_switch_profile`: the tokens of each
    batch between ``max_offset`` positions before the first switch of their sequence and
    ``max_offset`` after its last one (per run of a sequence: a lookup of its switch range
    in the small sorted table) are paired with each switch of their sequence (numpy; a
    polars join for rows with a null), kept within ``max_offset`` positions of a switch, and
    summed per offset by ``numpy.bincount``: (token, switch) pairs ``n``, non-null deltas ``nd`` and their |delta|
    sum ``sad``, finite entropies ``nh`` and their sum ``sh``. Mergeable (sums add)."""

    columns = ("seq_key", "position", "delta", "entropy")

    def __init__(self, switches: pl.DataFrame, max_offset: int) -> None:
        self.switches = switches.lazy()
        self.max_offset = max_offset
        size = 2 * max_offset + 1
        self.sums = {c: np.zeros(size, dtype=np.float64) for c in ("n", "nd", "sad", "nh", "sh")}
        self.fed = False
        rng = switches.group_by("seq_key").agg(
            (pl.col("switch_pos").min() - max_offset).alias("lo"),
            (pl.col("switch_pos").max() + max_offset).alias("hi")).sort("seq_key")
        self._keys = rng["seq_key"].to_numpy()
        self._lo, self._hi = rng["lo"].to_numpy(), rng["hi"].to_numpy()
        sw = switches.sort("seq_key", "switch_pos")
        self._sw_key, self._sw_pos = sw["seq_key"].to_numpy(), sw["switch_pos"].to_numpy()

    def _near(self, batch: pl.DataFrame) -> np.ndarray | None:
        """Row indices of the tokens within the switch range of their sequence (found per
        run of a sequence); None for all rows (a null seq_key)."""
        if batch["seq_key"].null_count():
            return None
        starts = run_starts(batch, ["seq_key"])
        rk = column(batch, "seq_key")[starts]
        j = np.minimum(np.searchsorted(self._keys, rk), self._keys.size - 1)
        hit = np.flatnonzero(self._keys[j] == rk)
        if hit.size == 0:
            return hit
        # the rows of the runs of switching sequences, with their sequence's switch range
        rows = run_rows(starts, batch.height, hit)
        length = np.diff(np.append(starts, batch.height))[hit]
        pos = column(batch, "position")[rows]
        jj = j[hit]
        keep = (pos >= np.repeat(self._lo[jj], length)) & (pos <= np.repeat(self._hi[jj], length))
        return rows[keep]

    def update(self, batch: pl.DataFrame) -> None:
        self.fed = True
        near = self._near(batch)
        if near is not None and near.size == 0:
            return
        if near is None or has_nulls(batch, ["position", "delta"]):
            self._update_joined(batch if near is None else batch[near])
            return
        # offsets to each switch of the row's sequence (the r-th switch, r = 0, 1, ...)
        k = self.max_offset
        size = 2 * k + 1
        sk = column(batch, "seq_key")[near]
        a = np.searchsorted(self._sw_key, sk, side="left")
        b = np.searchsorted(self._sw_key, sk, side="right")
        pos = column(batch, "position")[near]
        ad = np.abs(column(batch, "delta")[near])
        h = column(batch, "entropy")[near] if "entropy" in batch.columns else None
        for r in range(int((b - a).max())):
            on = np.flatnonzero(b - a > r)
            off = pos[on] - self._sw_pos[a[on] + r] + k
            inside = (off >= 0) & (off < size)
            on, off = on[inside], off[inside]
            self.sums["n"] += np.bincount(off, minlength=size)
            self.sums["nd"] += np.bincount(off, minlength=size)
            self.sums["sad"] += np.bincount(off, weights=ad[on], minlength=size)
            if h is not None:
                fin = np.isfinite(h[on])
                self.sums["nh"] += np.bincount(off, weights=fin, minlength=size)
                self.sums["sh"] += np.bincount(off, weights=np.where(fin, h[on], 0.0),
                                               minlength=size)

    def _update_joined(self, batch: pl.DataFrame) -> None:
        """Rows with a null seq_key, position or delta, by a polars join."""
        k = self.max_offset
        d = pl.col("delta")
        exprs = [(pl.col("position") - pl.col("switch_pos") + k).alias("k"),
                 d.is_not_null().cast(pl.Float64).alias("nd"),
                 d.abs().fill_null(0.0).alias("sad")]
        if "entropy" in batch.columns:
            h = pl.col("entropy")
            fin = h.is_finite().fill_null(False)
            exprs += [fin.cast(pl.Float64).alias("nh"),
                      pl.when(fin).then(h).otherwise(0.0).alias("sh")]
        x = (
            batch.lazy()
            .select([c for c in self.columns if c in batch.columns])
            .join(self.switches, on="seq_key", how="inner")
            .select(exprs)
            .filter(pl.col("k").is_between(0, 2 * k))
            .collect()
        )
        if x.height == 0:
            return
        idx = x["k"].to_numpy()
        size = 2 * k + 1
        self.sums["n"] += np.bincount(idx, minlength=size)
        for c in x.columns:
            if c != "k":
                self.sums[c] += np.bincount(idx, weights=x[c].to_numpy(), minlength=size)


def _check_offset(max_offset: int) -> None:
    if max_offset < 1:
        raise ParameterError(f"max_offset must be at least 1; got {max_offset}.")


def version_switch_profile(lf: pl.LazyFrame, *, max_offset: int = 16) -> VersionSwitchProfile:
    """Entropy and |delta| around in-flight policy-version switches (paper figure 3).

    Input: the canonical token frame (``seq_key``, ``position``, ``policy_version``,
    ``delta``; ``entropy`` optional). Passes: (1) the first/last position of each
    (seq_key, policy_version) run, merged by key (O(sequences x versions) rows); (2) only
    when some sequence switches: each batch joined to the small switch table, kept within
    ``|offset| <= max_offset`` and summed per offset. Returns ``available=False`` with a
    reason when there is no ``policy_version`` column or no sequence switches version.
    Raises :class:`ParameterError` when ``max_offset < 1``.
    """
    lf = token_frame(lf, "version_switch_profile")
    _check_offset(max_offset)
    cols = _columns(lf)
    if "policy_version" not in cols:
        return _switch_result(max_offset, None, None, has_pv=False)
    acc = _SeqVersions(cols)
    run_pass(lf, [acc])
    sw = _switches(_seq_table(acc))
    offs = None
    if sw.table.height:
        offs = _SwitchOffsets(sw.table, max_offset)
        run_pass(lf, [offs])
    return _switch_result(max_offset, sw, offs, has_pv=True)


def _switch_result(max_offset: int, sw: _Switches | None, offs: _SwitchOffsets | None, *,
                   has_pv: bool) -> VersionSwitchProfile:
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

    if not has_pv or sw is None:
        return unavailable("the data carry no policy_version column")
    if sw.n_seq == 0:
        return unavailable("no token carries a policy version")
    if sw.table.height == 0 or offs is None:
        return unavailable(
            "no in-flight version switch: every sequence was sampled by a single policy version",
            sw.n_seq,
            sw.noncontig,
        )
    s = offs.sums
    tokens = tuple(int(v) for v in s["n"])
    mad = tuple(float(s["sad"][i] / s["nd"][i]) if s["nd"][i] else None for i in range(n_off))
    mh = tuple(float(s["sh"][i] / s["nh"][i]) if s["nh"][i] else None for i in range(n_off))
    return VersionSwitchProfile(
        True,
        None,
        max_offset,
        offsets,
        tokens,
        mh,
        mad,
        sw.n_seq,
        int(sw.table["seq_key"].n_unique()),
        int(sw.table.height),
        sw.noncontig,
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


#: Order of the top tokens: score (NaN above every number), then seq_id and position.
_TOK_BY = ["score", "seq_id", "position"]
_TOK_REVERSE = [False, True, True]


class _TopTokens:
    """Accumulator of the token half of :func:`offenders`: the ``top`` tokens by score
    (delta^2 / (H + eps), or delta^2 without entropy) over tokens with a finite delta (and
    entropy), ties broken by (seq_id, position) ascending.

    Mergeable: the kept rows are merged with each batch's candidates by keeping the top
    ``top`` of their union in that total order, which is the top of the whole frame (rows
    equal in score, seq_id and position - duplicated tokens - are interchangeable). The
    score is computed with numpy; the candidates of a batch are its rows scoring at or
    above the ``top``-th score kept so far (NaN scores, which sort above every number,
    included), usually none once ``top`` rows are kept. Memory O(top)."""

    def __init__(self, cols: set[str], top: int, eps: float) -> None:
        self.top, self.eps = top, eps
        self.has_h = "entropy" in cols

        def opt(c: str, dt: pl.DataType) -> pl.Expr:
            return pl.col(c) if c in cols else pl.lit(None, dtype=dt).alias(c)

        self.row = [pl.col("seq_id").cast(pl.String), pl.col("position"), opt("step", pl.Int64),
                    opt("token_id", pl.Int64), opt("entropy", pl.Float64),
                    pl.col("infer_logprob").exp().alias("p"), pl.col("delta")]
        self.columns = [c for c in ("seq_id", "position", "step", "token_id", "entropy",
                                    "infer_logprob", "delta") if c in cols]
        #: seq_id may come as read (an integer): kept as String (passes.NATIVE_SEQ_ID)
        self.native_seq_id = True
        self._kept: pl.DataFrame | None = None
        #: the lowest number among the kept scores once ``top`` rows are kept (+inf when
        #: they are all NaN): a row scoring below it cannot enter
        self._floor = -np.inf
        self._buf = np.empty((2, 0))

    def update(self, batch: pl.DataFrame) -> None:
        d = column(batch, "delta")
        if self._buf.shape[1] < d.size:  # reused temporaries (a fresh array: page faults)
            self._buf = np.empty((2, d.size))
        score, t = self._buf[:, :d.size]
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            np.multiply(d, d, out=score)
            ok = np.isfinite(d)
            if self.has_h:
                h = column(batch, "entropy")
                ok &= np.isfinite(h)
                score /= np.add(h, self.eps, out=t)
        cand = ok & ((score >= self._floor) | np.isnan(score))
        idx = np.flatnonzero(cand)
        if idx.size == 0:
            return
        sc = score[idx]
        num = sc[~np.isnan(sc)]
        if num.size > self.top:  # only the batch's top-th number and above can enter
            cut = np.partition(num, num.size - self.top)[num.size - self.top]
            keep = (sc >= cut) | np.isnan(sc)
            idx, sc = idx[keep], sc[keep]
        rows = (batch.select(self.columns)[idx].select(self.row)
                .with_columns(pl.Series("score", sc)))
        if self._kept is not None:
            rows = pl.concat([self._kept, rows], how="vertical_relaxed")
        rows = rows.top_k(self.top, by=_TOK_BY, reverse=_TOK_REVERSE)
        self._kept = rows
        if rows.height >= self.top:
            num = rows["score"].filter(rows["score"].is_not_nan())
            self._floor = float(num.min()) if num.len() else np.inf

    def result(self) -> pl.DataFrame | None:
        """The top rows, best first; None when no token was seen."""
        if self._kept is None:
            return None
        return self._kept.sort(_TOK_BY, descending=[not r for r in _TOK_REVERSE])


def _check_offenders(top: int, eps: float) -> None:
    if top < 1:
        raise ParameterError(f"top must be at least 1; got {top}.")
    if not (eps >= 0 and math.isfinite(eps)):
        raise ParameterError(f"eps must be a finite number >= 0; got {eps}.")


def offenders(lf: pl.LazyFrame, *, top: int = 20, eps: float = 0.01) -> Offenders:
    """Top tokens by delta^2 / (H + eps) and top sequences by mean |delta|.

    Input: the canonical token frame. One streaming pass: a top-k of tokens merged across
    batches (memory O(top)) and a per-(sequence, version) table merged by key, reduced to
    one row per sequence, then ``top_k``. Ties are broken by (seq_id, position) for tokens
    and by seq_id for sequences, so the result does not depend on row order or batches.
    Raises :class:`ParameterError` when ``top < 1`` or ``eps < 0``.
    """
    lf = token_frame(lf, "offenders")
    _check_offenders(top, eps)
    cols = _columns(lf)
    tok = _TopTokens(cols, top, eps)
    seq = _SeqVersions(cols)
    run_pass(lf, [tok, seq])
    return _offenders_result(tok, _seq_table(seq), top, eps)


def _offenders_result(tok: _TopTokens, seq_table: pl.DataFrame, top: int,
                      eps: float) -> Offenders:
    kind = "delta^2/(H+eps)" if tok.has_h else "delta^2"
    rows = tok.result()
    if rows is None or rows.height == 0:
        return Offenders(False, "no tokens", top, eps, kind, (), ())
    per_seq = (
        seq_table.group_by("seq_key")
        .agg(pl.col("seq_id").first(), pl.col("step").first(),
             pl.col("n_fin").sum().alias("tokens"), pl.col("s_abs").sum(),
             pl.col("m_abs").max().alias("max_abs_delta"))
        .filter(pl.col("tokens") > 0)
        .select("seq_id", "step", pl.col("tokens").cast(pl.UInt32),
                (pl.col("s_abs") / pl.col("tokens")).alias("mean_abs_delta"),
                "max_abs_delta")
        .top_k(top, by=["mean_abs_delta", "seq_id"], reverse=[False, True])
        .sort(["mean_abs_delta", "seq_id"], descending=[True, False])
    )
    return Offenders(True, None, top, eps, kind, tuple(rows.to_dicts()),
                     tuple(per_seq.to_dicts()))


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


class ProfilesPlan:
    """:func:`compute_profiles` as accumulators of one streaming pass
    (:mod:`entr_diag.passes`), possibly shared with other analyses, then :meth:`finish`.

    :attr:`accumulators` (pass 1): the (H, |delta|) cell counts and the per-p-bin sums on
    the report's default grids, the per-(seq_key, policy_version) table (version runs for
    the switch profile, per-sequence |delta| for the offenders) and the top tokens.
    The per-offset means of the switch profile need the switch positions, known only after
    pass 1: :meth:`followup` returns the accumulator of that second pass (empty when no
    sequence switches version), to run alone or fused with other analyses' second passes;
    :meth:`finish` runs it itself if it was not run.
    """

    def __init__(self, lf: pl.LazyFrame, *, eps: float = 0.01, top: int = 20,
                 max_offset: int = 16) -> None:
        _check_offset(max_offset)
        _check_offenders(top, eps)
        self._lf = lf
        self.eps, self.top, self.max_offset = eps, top, max_offset
        cols = _columns(lf)
        self._has_h = "entropy" in cols
        self._has_pv = "policy_version" in cols
        self._density = _DensityCounts(*_H_GRID, *_ABS_DELTA_GRID, self._has_h)
        self._prob = _ProbSums(*_P_GRID, self._has_h)
        self._seq = _SeqVersions(cols)
        self._tokens = _TopTokens(cols, top, eps)
        self.accumulators: list[Accumulator] = [self._density, self._prob, self._seq,
                                                self._tokens]
        self._sw: _Switches | None = None
        self._offsets: _SwitchOffsets | None = None

    def followup(self) -> list[Accumulator]:
        """The accumulators of the second pass over the same frame (after pass 1): the
        switch-offset sums, or ``[]`` when there is no policy_version column or no switch."""
        if self._has_pv and self._sw is None:
            self._sw = _switches(_seq_table(self._seq))
            if self._sw.table.height:
                self._offsets = _SwitchOffsets(self._sw.table, self.max_offset)
        return [self._offsets] if self._offsets is not None else []

    def finish(self) -> Profiles:
        """The profiles, after pass 1 (and the :meth:`followup` pass, run here when it was
        not)."""
        second = self.followup()
        if self._offsets is not None and not self._offsets.fed:
            run_pass(self._lf, second)
        return Profiles(
            _density_result(self._density, has_h=self._has_h),
            _prob_result(self._prob),
            _switch_result(self.max_offset, self._sw, self._offsets, has_pv=self._has_pv),
            _offenders_result(self._tokens, _seq_table(self._seq), self.top, self.eps),
        )


def profiles_plan(lf: pl.LazyFrame, *, eps: float = 0.01, top: int = 20,
                  max_offset: int = 16) -> ProfilesPlan:
    """The plan of :func:`compute_profiles` on ``lf``: run ``plan.accumulators`` in a pass
    over ``lf`` (alone or fused with other plans), then ``plan.finish()`` (which runs the
    version-switch second pass, :meth:`ProfilesPlan.followup`, unless it was run).
    Raises :class:`ParameterError` for the parameters :func:`offenders` and
    :func:`version_switch_profile` reject."""
    lf = token_frame(lf, "profiles_plan")
    return ProfilesPlan(lf, eps=eps, top=top, max_offset=max_offset)


def compute_profiles(
    lf: pl.LazyFrame, *, eps: float = 0.01, top: int = 20, max_offset: int = 16
) -> Profiles:
    """Run :func:`density_2d`, :func:`mismatch_by_prob`, :func:`version_switch_profile` and
    :func:`offenders` with their defaults (``eps`` is the ENTR eps, nats), sharing their
    work: one streaming pass, plus a second one when some sequence switches policy version
    (see :class:`ProfilesPlan`)."""
    lf = token_frame(lf, "compute_profiles")
    plan = profiles_plan(lf, eps=eps, top=top, max_offset=max_offset)
    run_pass(lf, plan.accumulators)
    return plan.finish()
