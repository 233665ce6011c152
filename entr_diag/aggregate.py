"""Mergeable aggregates of the canonical token frame (docs/CONTRACT.md).

The scaling-law fit of arXiv:2607.22186 (ENTR, earlier ESTR) needs, per entropy bin and per
bootstrap block of whole sequences, a handful of sums. They are computed by streaming polars
aggregations whose results are small whatever the number of tokens, and which can be added
across shards (``merge``: the aggregate of two halves of a frame, merged, equals the
aggregate of the whole, up to float summation order):

1. :class:`FineAggregate` - one pass, sums per FINE entropy bin (4097 groups). Its token
   counts choose the coarse bins (quantile or log edges) without another pass.
2. :class:`BlockAggregate` - one pass, sums per (cell, sequence block), where the cells are
   the common refinement of every coarse binning in use (display bins and breakpoint
   bins: at most ~100 cells x ``n_blocks`` blocks, ~20 k groups).

Why not a single (fine bin x block) pass: that table has up to 4097 x 200 = 0.8 M groups, and
polars' streaming ``group_by`` was measured to grow its memory with the number of input rows
once a group-by holds a few 100 k groups (15 M tokens: ~0.9 GB and rising), while ~20 k or
~130 k groups stay flat (~0.4-0.5 GB, mostly the Parquet reader). Two passes with small key
sets keep memory bounded.

The fine grid
-------------
Fine bin 0 holds ``H < H_MIN`` (1e-6 nats, including H = 0). Fine bins ``1..N_FINE`` are
log-spaced on ``[H_MIN, H_MAX)`` = ``[1e-6, 20)`` nats (each spans a factor
``(2e7) ** (1 / 4096) ~= 1.0041`` in H); ``H >= H_MAX`` is clipped into the last bin.
Quantile edges built from this grid are therefore approximate: an edge can be off from
the exact token quantile by at most one fine bin (0.41 % in H), and tokens sharing one
fine bin are never split between two coarse bins.

Blocks
------
``block = seq_key % n_blocks`` (``seq_key`` is the UInt64 hash of (step, seq_id) of the
contract): every token of one sequence lands in one block, so resampling blocks resamples
whole sequences (tokens inside a sequence are correlated; never resample tokens).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl

from entr_diag.errors import FitError, ParameterError

__all__ = [
    "BlockAggregate",
    "H_MAX",
    "H_MIN",
    "N_FINE",
    "P_LOW",
    "SUM_COLUMNS",
    "CoarseBinning",
    "FineAggregate",
    "aggregate_blocks",
    "aggregate_fine",
    "block_expr",
    "block_query",
    "coarse_binning",
    "coarse_block_sums",
    "fine_bin_expr",
    "fine_edges",
    "fine_query",
    "joint_binning",
    "staleness_labels",
    "staleness_step",
    "staleness_unit",
    "usable",
]

#: Lower end of the log-spaced fine grid (nats). Entropies below it share fine bin 0.
H_MIN: float = 1e-6
#: Upper end of the fine grid (nats); larger entropies are clipped into the last fine bin.
H_MAX: float = 20.0
#: Number of log-spaced fine bins (plus fine bin 0 for H < H_MIN).
N_FINE: int = 4096
#: Coarse entropy bins of the fit, the tables and the CLI (``--bins``) by default.
DEFAULT_BINS: int = 30
#: Threshold on the sampled-token probability p = exp(infer_logprob) counted per bin.
P_LOW: float = 1e-3

_LOG_MIN = math.log(H_MIN)
_SCALE = N_FINE / (math.log(H_MAX) - _LOG_MIN)

#: Per-(fine bin, block) sums held by :class:`FineAggregate` (besides the keys).
SUM_COLUMNS: tuple[str, ...] = (
    "n",  # tokens
    "s_h",  # sum of H (nats)
    "s_d",  # sum of delta (nats)
    "s_d2",  # sum of delta^2 (nats^2)
    "s_absd",  # sum of |delta| (nats)
    "s_z2",  # sum of z^2 = delta^2 / (H + eps) (dimensionless)
    "n_plow",  # tokens with p = exp(infer_logprob) < P_LOW
)


def fine_edges() -> tuple[np.ndarray, np.ndarray]:
    """Lower and upper entropy edge (nats) of every fine bin, arrays of length ``N_FINE + 1``.

    Fine bin 0 is ``[0, H_MIN)``; the last bin's upper edge is ``H_MAX`` (entropies above it
    are clipped into it).
    """
    i = np.arange(N_FINE + 1, dtype=np.float64)
    lo = np.where(i == 0, 0.0, np.exp(_LOG_MIN + (i - 1) / _SCALE))
    hi = np.where(i == 0, H_MIN, np.exp(_LOG_MIN + i / _SCALE))
    hi[-1] = H_MAX
    return lo, hi


def fine_bin_expr(entropy: pl.Expr | None = None) -> pl.Expr:
    """Polars expression: the fine-bin index (Int32, ``0..N_FINE``) of an entropy in nats
    (null for a null, NaN or infinite entropy).

    Bin 0 for ``H < H_MIN``; ``1 + floor((ln H - ln H_MIN) * N_FINE / (ln H_MAX - ln H_MIN))``
    clipped to ``[1, N_FINE]`` otherwise. The same expression is used by every pass, so the
    coarse bins built from fine bins are exactly reproducible.
    """
    h = pl.col("entropy") if entropy is None else entropy
    # (a NaN or infinite entropy gives a null bin, as a null one: not a cast error)
    idx = ((h.clip(lower_bound=H_MIN).log() - _LOG_MIN) * _SCALE).floor().cast(pl.Int64,
                                                                               strict=False)
    return (
        pl.when(h < H_MIN)
        .then(pl.lit(0, dtype=pl.Int64))
        .otherwise(idx.clip(0, N_FINE - 1) + 1)
        .cast(pl.Int32)
    )


def block_expr(n_blocks: int) -> pl.Expr:
    """Polars expression: the bootstrap block ``seq_key % n_blocks`` (Int32) of each token."""
    return (pl.col("seq_key") % pl.lit(n_blocks, dtype=pl.UInt64)).cast(pl.Int32)


def _check_blocks(n_blocks: int) -> None:
    if int(n_blocks) != n_blocks or n_blocks < 2:
        raise ParameterError(f"n_blocks must be an integer >= 2, got {n_blocks!r}.")


def _sums(eps: float) -> list[pl.Expr]:
    return [
        pl.len().cast(pl.Int64).alias("n"),
        pl.col("h").sum().alias("s_h"),
        pl.col("d").sum().alias("s_d"),
        (pl.col("d") ** 2).sum().alias("s_d2"),
        pl.col("d").abs().sum().alias("s_absd"),
        ((pl.col("d") ** 2) / (pl.col("h") + eps)).sum().alias("s_z2"),
        (pl.col("lp") < math.log(P_LOW)).sum().cast(pl.Int64).alias("n_plow"),
    ]


def _inputs(lf: pl.LazyFrame, *key_exprs: pl.Expr) -> pl.LazyFrame:
    return lf.select(
        *key_exprs,
        pl.col("entropy").alias("h"),
        pl.col("delta").alias("d"),
        pl.col("infer_logprob").alias("lp"),
    )


def _merge_tables(a: pl.DataFrame, b: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    return (
        pl.concat([a, b])
        .group_by(keys)
        .agg([pl.col(c).sum() for c in SUM_COLUMNS])
        .with_columns(pl.col("n").cast(pl.Int64), pl.col("n_plow").cast(pl.Int64))
        .sort(keys)
    )


@dataclass(frozen=True)
class FineAggregate:
    """Sums per fine entropy bin: the first pass of the fit.

    ``table`` is a ``pl.DataFrame`` with one row per non-empty fine bin, sorted: ``fine``
    (Int32, 0..N_FINE) and :data:`SUM_COLUMNS` (counts Int64, sums Float64; entropy and
    delta in nats). ``eps`` is the one used for ``s_z2`` (z = delta / sqrt(H + eps)).
    """

    table: pl.DataFrame
    eps: float

    def merge(self, other: FineAggregate) -> FineAggregate:
        """Add two aggregates (e.g. of two shards). Raises :class:`ParameterError` when
        ``eps`` differs."""
        if other.eps != self.eps:
            raise ParameterError(
                f"Cannot merge aggregates built with different eps ({self.eps} vs {other.eps})."
            )
        return FineAggregate(_merge_tables(self.table, other.table, ["fine"]), self.eps)

    @property
    def n_tokens(self) -> int:
        """Total number of tokens aggregated."""
        return int(self.table["n"].sum()) if self.table.height else 0

    def counts_per_fine(self) -> np.ndarray:
        """Tokens per fine bin, int64 array of length ``N_FINE + 1``."""
        out = np.zeros(N_FINE + 1, dtype=np.int64)
        if self.table.height:
            out[self.table["fine"].to_numpy()] = self.table["n"].to_numpy()
        return out

    def to_dict(self) -> dict:
        """Plain-Python summary (the grid, not the table)."""
        return {"fine_bins": N_FINE, "h_min": H_MIN, "h_max": H_MAX, "eps": self.eps,
                "tokens": self.n_tokens}


def fine_query(lf: pl.LazyFrame, *, eps: float = 0.01) -> pl.LazyFrame:
    """The lazy query behind :func:`aggregate_fine`. ``lf`` must hold usable tokens
    (:func:`usable`)."""
    return (
        _inputs(lf, fine_bin_expr().alias("fine"))
        .group_by("fine")
        .agg(_sums(eps))
        .sort("fine")
    )


def usable(lf: pl.LazyFrame) -> pl.LazyFrame:
    """Tokens the fit can use: entropy present, finite and >= 0, delta finite.

    Raises :class:`FitError` when the frame has no ``entropy`` column (or lacks delta,
    infer_logprob or seq_key).
    """
    names = lf.collect_schema().names()
    missing = [c for c in ("entropy", "delta", "infer_logprob", "seq_key") if c not in names]
    if "entropy" in missing:
        raise FitError(
            "The token frame has no entropy column: the scaling-law fit bins tokens by "
            "entropy, so map a per-token entropy column (e.g. verl 'entropys') into the dump."
        )
    if missing:
        raise FitError(
            f"The token frame lacks the canonical column(s) {', '.join(missing)}; "
            "build it with entr_diag.io.load (docs/CONTRACT.md)."
        )
    h = pl.col("entropy")
    return lf.filter(h.is_not_null() & h.is_finite() & (h >= 0) & pl.col("delta").is_finite())


def aggregate_fine(lf: pl.LazyFrame, *, eps: float = 0.01) -> FineAggregate:
    """One streaming pass: sums per fine entropy bin.

    ``lf``: canonical token frame (one row per valid loss-masked token; entropy, delta and
    infer_logprob in nats; seq_key UInt64). Tokens without a finite entropy are skipped.
    Returns a :class:`FineAggregate` of at most ``N_FINE + 1`` rows. Raises
    :class:`FitError` without an entropy column.
    """
    table = fine_query(usable(lf), eps=eps).collect(engine="streaming")
    return FineAggregate(table=table, eps=eps)


# ----------------------------------------------------------------------------- coarse bins


@dataclass(frozen=True)
class CoarseBinning:
    """Coarse entropy bins as unions of consecutive fine bins.

    ``starts``: int array (n_bins + 1,) of fine-bin indices; coarse bin j holds fine bins
    ``starts[j] .. starts[j+1]-1``. ``h_lo`` / ``h_hi``: entropy edges (nats) of each coarse
    bin. ``kind``: "quantile" or "log". Coarse bin 0 is the H < 1e-6 bin when
    ``has_zero_bin`` (kept apart: it cannot be placed on a log axis).
    """

    starts: np.ndarray
    h_lo: np.ndarray
    h_hi: np.ndarray
    kind: str
    has_zero_bin: bool

    @property
    def n_bins(self) -> int:
        return len(self.starts) - 1

    def coarse_of_fine(self, fine: np.ndarray) -> np.ndarray:
        """Coarse index of each fine index (-1 outside the binned range)."""
        j = np.searchsorted(self.starts, fine, side="right") - 1
        return np.where((fine >= self.starts[0]) & (fine < self.starts[-1]), j, -1)

    def expr(self, entropy: pl.Expr | None = None) -> pl.Expr:
        """Polars expression: coarse-bin index (Int32) of each token's entropy (-1 outside,
        and for a null entropy).

        A lookup table fine bin -> coarse bin (:meth:`coarse_of_fine`, N_FINE + 1 entries)
        indexed by the fine bin with ``gather``: one lookup per token, streaming (measured
        on 20M tokens: 0.6 s and 490 MB for a (cell, block) group_by, against 1.1 s / 590 MB
        for one comparison per edge summed with ``sum_horizontal``, and 1.4 GB for
        ``replace_strict``, which leaves the streaming engine)."""
        lut = self.coarse_of_fine(np.arange(N_FINE + 1)).astype(np.int32)
        return (
            pl.lit(pl.Series(lut, dtype=pl.Int32)).gather(fine_bin_expr(entropy))
            .fill_null(-1).cast(pl.Int32)
        )


def coarse_binning(counts: np.ndarray, bins: int = DEFAULT_BINS, edges: str = "quantile"
                   ) -> CoarseBinning:
    """Choose coarse bins from the token counts per fine bin (no pass over tokens).

    ``edges="quantile"``: about ``bins`` bins of equal token count among tokens with
    ``H >= H_MIN``; edges snap to fine-bin edges (approximate quantiles, see module
    docstring), so heavy ties give fewer bins. ``edges="log"``: ``bins`` bins of equal width
    in log H between the lowest and highest non-empty fine bins; empty bins are dropped.
    Tokens with ``H < H_MIN`` form a separate first bin when there are any.
    Raises :class:`ParameterError` for bad ``bins`` / ``edges``, :class:`FitError` when no
    token has an entropy.
    """
    if int(bins) != bins or bins < 1:
        raise ParameterError(f"bins must be a positive integer, got {bins!r}.")
    if edges not in ("quantile", "log"):
        raise ParameterError(f"bin edges must be 'quantile' or 'log', got {edges!r}.")
    counts = np.asarray(counts, dtype=np.int64)
    if counts.sum() == 0:
        raise FitError("No token with a valid entropy: nothing to bin.")
    pos = counts[1:]
    nz = np.nonzero(pos)[0]
    starts: list[int] = []
    has_zero = bool(counts[0] > 0)
    if has_zero:
        starts.append(0)
    if nz.size:
        first, last = int(nz[0]) + 1, int(nz[-1]) + 2  # fine indices [first, last)
        if edges == "quantile":
            cum = np.cumsum(pos)
            total = cum[-1]
            targets = total * np.arange(1, bins) / bins
            inner = np.searchsorted(cum, targets, side="left") + 2  # boundary after fine i+1
            cuts = np.unique(np.concatenate([[first], inner, [last]]))
            cuts = cuts[(cuts >= first) & (cuts <= last)]
        else:
            cuts = np.unique(np.round(np.linspace(first, last, bins + 1)).astype(np.int64))
        # drop empty coarse bins (possible with log edges)
        cum_all = np.concatenate([[0], np.cumsum(counts)])
        keep = [int(cuts[0])]
        for c in cuts[1:]:
            c = int(c)
            if cum_all[c] - cum_all[keep[-1]] > 0:
                keep.append(c)
            else:
                keep[-1] = c
        if has_zero:
            keep[0] = 1  # empty fine bins between H_MIN and the first token join that bin
        starts.extend(keep)
    else:
        starts.append(1)
    st = np.asarray(starts, dtype=np.int64)
    lo, hi = fine_edges()
    h_lo = lo[st[:-1]]
    h_hi = hi[st[1:] - 1]
    return CoarseBinning(starts=st, h_lo=h_lo, h_hi=h_hi, kind=edges, has_zero_bin=has_zero)


def joint_binning(*binnings: CoarseBinning) -> CoarseBinning:
    """The common refinement of several coarse binnings: cells bounded by every edge."""
    starts = np.unique(np.concatenate([b.starts for b in binnings]))
    lo, hi = fine_edges()
    return CoarseBinning(
        starts=starts,
        h_lo=lo[starts[:-1]],
        h_hi=hi[starts[1:] - 1],
        kind="joint",
        has_zero_bin=any(b.has_zero_bin for b in binnings),
    )


@dataclass(frozen=True)
class BlockAggregate:
    """Sums per (cell of ``cells``, sequence block): the second pass of the fit.

    ``table``: one row per non-empty (cell, block), sorted: ``cell`` (Int32), ``block``
    (Int32, 0..n_blocks-1) and :data:`SUM_COLUMNS`. Mergeable with an aggregate of the same
    cells, ``n_blocks`` and ``eps``.
    """

    table: pl.DataFrame
    cells: CoarseBinning
    n_blocks: int
    eps: float

    def merge(self, other: BlockAggregate) -> BlockAggregate:
        """Add two aggregates built on the same cells, blocks and eps (else
        :class:`ParameterError`)."""
        if (other.n_blocks != self.n_blocks or other.eps != self.eps
                or not np.array_equal(other.cells.starts, self.cells.starts)):
            raise ParameterError(
                "Cannot merge block aggregates built with different cells, n_blocks or eps."
            )
        table = _merge_tables(self.table, other.table, ["cell", "block"])
        return BlockAggregate(table, self.cells, self.n_blocks, self.eps)

    @property
    def n_tokens(self) -> int:
        return int(self.table["n"].sum()) if self.table.height else 0


def block_query(
    lf: pl.LazyFrame, cells: CoarseBinning, *, n_blocks: int = 200, eps: float = 0.01
) -> pl.LazyFrame:
    """Lazy query behind :func:`aggregate_blocks` (``lf``: usable tokens)."""
    _check_blocks(n_blocks)
    return (
        _inputs(lf, cells.expr().alias("cell"), block_expr(n_blocks).alias("block"))
        .filter(pl.col("cell") >= 0)
        .group_by(["cell", "block"])
        .agg(_sums(eps))
        .sort(["cell", "block"])
    )


def aggregate_blocks(
    lf: pl.LazyFrame, cells: CoarseBinning, *, n_blocks: int = 200, eps: float = 0.01
) -> BlockAggregate:
    """One streaming pass: sums per (cell, sequence block); at most ``cells.n_bins *
    n_blocks`` rows. Raises :class:`FitError` without an entropy column,
    :class:`ParameterError` for ``n_blocks < 2``."""
    table = block_query(usable(lf), cells, n_blocks=n_blocks, eps=eps).collect(engine="streaming")
    return BlockAggregate(table, cells, n_blocks, eps)


def coarse_block_sums(agg: BlockAggregate, binning: CoarseBinning) -> dict[str, np.ndarray]:
    """Sum a block aggregate into (n_bins, n_blocks) float arrays, one per
    :data:`SUM_COLUMNS`. ``binning``'s edges must be edges of ``agg.cells``."""
    t = agg.table
    nb, B = binning.n_bins, agg.n_blocks
    out = {c: np.zeros((nb, B), dtype=np.float64) for c in SUM_COLUMNS}
    if not t.height:
        return out
    cell_bin = binning.coarse_of_fine(agg.cells.starts[:-1])
    j = cell_bin[t["cell"].to_numpy()]
    b = t["block"].to_numpy().astype(np.int64)
    ok = j >= 0
    flat = j[ok] * B + b[ok]
    for c in SUM_COLUMNS:
        v = t[c].to_numpy().astype(np.float64)[ok]
        out[c] = np.bincount(flat, weights=v, minlength=nb * B).reshape(nb, B)
    return out


#: a common divisor of the staleness values at least this large is read as the unit of lag
#: of the staleness buckets (:func:`staleness_unit`): smaller steps (lags 0, 2, 4 of a
#: schedule that syncs every other version) are real lags in versions
STALENESS_UNIT_MIN: int = 8


def staleness_step(values: Iterable[int] | np.ndarray) -> int:
    """The greatest common difference of integer staleness values (``train_version -
    policy_version``): a version counted in steps of 1000, or one per sample, makes a lag
    of one version 1000 apart; 1 with fewer than two distinct values."""
    v = np.unique(np.asarray(list(values) if not isinstance(values, np.ndarray) else values,
                             dtype=np.int64))
    if v.size < 2:
        return 1
    return int(np.gcd.reduce(np.abs(v - v.min()))) or 1


def staleness_unit(values: Iterable[int] | np.ndarray | None) -> int:
    """The unit of lag the staleness buckets count in: the greatest common divisor of the
    non-zero staleness values (their absolute values) when it is at least
    :data:`STALENESS_UNIT_MIN` (versions counted in 1000s: the buckets 0, 1, 2-3, 4-7, 8+
    are lags of 0, 1000, 2000-3000, ... versions, where raw versions would put every stale
    token in 8+; a constant lag of 1000 is one lag), else 1 (``values`` None, empty or all
    0: 1). A mapping counts by its keys."""
    if values is None:
        return 1
    v = np.abs(np.asarray(list(values) if not isinstance(values, np.ndarray) else values,
                          dtype=np.int64))
    v = np.unique(v[v > 0])
    if v.size == 0:
        return 1
    g = int(np.gcd.reduce(v))
    return g if g >= STALENESS_UNIT_MIN else 1


def staleness_labels(labels: Sequence[str], unit: int) -> tuple[str, ...]:
    """Bucket labels (``"0"``, ``"2-3"``, ``"8+"``, ``"<0"``) in versions for buckets counted in
    lags of ``unit`` versions (``"2000-3000"``, ``"8000+"``); unchanged for ``unit`` 1."""
    if unit == 1:
        return tuple(labels)

    def scale(m: re.Match) -> str:
        return str(int(m.group(0)) * unit) if m.group(0) != "0" else "0"

    return tuple(re.sub(r"\d+", scale, lab) for lab in labels)
