"""One streaming pass, many statistics: mergeable accumulators fed batch by batch.

Each analysis (fit, metrics, forensics, gates, profiles) reduces the token frame to small
tables: sums, counts, minima and maxima keyed by entropy bin, sequence block, step,
sequence. Written as separate polars queries, every table costs one scan of the Parquet
input (decode + validation), and ``pl.collect_all`` shares the scan only by caching it, which
makes memory grow with the input. Here the canonical token frame is streamed ONCE with
:meth:`polars.LazyFrame.collect_batches`, and every batch (a ``pl.DataFrame`` of at most
``chunk_size`` rows) is handed to each accumulator, which reduces it and keeps only its
small running result. Memory is bounded by one batch plus the accumulators (bins,
sequences), never by the number of tokens; the progress callback sees rows as they are
read.

Accumulators are mergeable by construction: a table of sums computed on two halves of the
input and added equals the table of the whole (up to float summation order), so the
result does not depend on how the frame is cut into batches, nor on row order.

Building blocks:

- ``Accumulator.exprs``: per-token keys and weights as polars expressions, computed by the
  streaming engine during the scan (on its worker threads, overlapping the Python-side
  reduction of the previous batch). On 2 cores the Python-side per-batch work is what
  bounds the speed, so it should be little more than the reductions below.
- :class:`GroupAgg`: a polars ``group_by`` per batch, partial tables re-aggregated with
  merge expressions (sum of sums, min of mins, ...). For keys whose number is bounded by
  bins or sequences.
- :func:`reduce_runs`: runs of consecutive equal keys (the tokens of one sequence are
  usually contiguous) collapsed by ``numpy.ufunc.reduceat`` before a :class:`GroupAgg`, so
  the hash group-by sees a few thousand rows per batch instead of every token.
- :class:`DenseSums`: ``numpy.bincount`` of weights on a dense integer key computed per
  batch; for fixed-size grids (bins x blocks), where it beats a hash group-by.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

import numpy as np
import polars as pl

__all__ = [
    "CHUNK_ROWS",
    "Accumulator",
    "DenseSums",
    "GroupAgg",
    "progress_hook",
    "reduce_runs",
    "run_pass",
]

#: Rows per batch handed to the accumulators (smaller batches: less memory in flight).
CHUNK_ROWS: int = 250_000

ProgressFn = Callable[[int], None]
_PROGRESS: contextvars.ContextVar[ProgressFn | None] = contextvars.ContextVar(
    "entr_diag_progress", default=None
)


@contextlib.contextmanager
def progress_hook(fn: ProgressFn | None) -> Iterator[None]:
    """Within the block, every :func:`run_pass` calls ``fn(rows)`` after each batch (rows of
    that batch). Used by the CLI for its progress bar; ``None`` disables."""
    token = _PROGRESS.set(fn)
    try:
        yield
    finally:
        _PROGRESS.reset(token)


class Accumulator(Protocol):
    """Reduces batches of the token frame. ``columns``: the canonical columns it reads.

    Optionally ``exprs``: named polars expressions over the frame, computed by the streaming
    engine as part of the scan (on its worker threads, overlapping the Python-side work of
    the accumulators) and added to every batch; their names must be unique to the
    accumulator (a prefix such as ``_fit_``), unless two accumulators mean the same
    expression.
    """

    columns: Sequence[str]

    def update(self, batch: pl.DataFrame) -> None:  # pragma: no cover - protocol
        ...


def run_pass(
    lf: pl.LazyFrame,
    accumulators: Sequence[Accumulator],
    *,
    chunk_size: int = CHUNK_ROWS,
) -> int:
    """Stream ``lf`` once and feed every batch to every accumulator; return the row count.

    Only the union of the accumulators' ``columns`` is read (projection pushdown to the
    Parquet reader), plus their ``exprs``, computed by the streaming engine. Batches arrive in no particular order (``maintain_order=False``):
    accumulators must not depend on it. Errors of the scan (unreadable file, schema
    mismatch between shards) propagate as polars exceptions.
    """
    if not accumulators:
        return 0
    names = lf.collect_schema().names()
    cols: list[str] = []
    for acc in accumulators:
        for c in acc.columns:
            if c in names and c not in cols:
                cols.append(c)
    exprs: dict[str, pl.Expr] = {}
    for acc in accumulators:
        for e in getattr(acc, "exprs", ()):
            exprs.setdefault(e.meta.output_name(), e)
    if not cols and not exprs:  # nothing to read but rows: count them
        cols = names[:1]
    progress = _PROGRESS.get()
    rows = 0
    q = lf.select(*cols, *exprs.values())
    for batch in q.collect_batches(chunk_size=chunk_size, maintain_order=False):
        if batch.height == 0:
            continue
        for acc in accumulators:
            acc.update(batch)
        rows += batch.height
        if progress is not None:
            progress(batch.height)
    return rows


class GroupAgg:
    """A ``group_by(keys).agg(aggs)`` computed per batch and merged.

    ``prepare``: maps the batch (a LazyFrame) to the frame to group (add key columns,
    filter); ``aggs``: the per-batch aggregations, each aliased; ``merge``: the
    aggregations that combine partial rows of one key (e.g. ``pl.col("n").sum()`` for a
    count, ``.min()`` of a minimum). Partial tables are compacted (merged into one) when
    they hold more than ``compact_rows`` rows and more than twice the rows of the last
    compacted table: memory stays within about twice the number of distinct keys, and the
    merging work stays linear in the input (a table of many keys is not re-merged at every
    batch).
    :meth:`result` returns the merged table (one row per key, unsorted).
    """

    def __init__(
        self,
        columns: Sequence[str],
        keys: Sequence[str],
        aggs: Sequence[pl.Expr],
        merge: Sequence[pl.Expr],
        prepare: Callable[[pl.LazyFrame], pl.LazyFrame] | None = None,
        compact_rows: int = 250_000,
    ) -> None:
        self.columns = list(columns)
        self.keys = list(keys)
        self.aggs = list(aggs)
        self.merge = list(merge)
        self.prepare = prepare
        self.compact_rows = compact_rows
        self._parts: list[pl.DataFrame] = []
        self._rows = 0
        self._merged_rows = 0

    def update(self, batch: pl.DataFrame) -> None:
        lf = batch.lazy()
        if self.prepare is not None:
            lf = self.prepare(lf)
        part = lf.group_by(self.keys).agg(self.aggs).collect()
        self._parts.append(part)
        self._rows += part.height
        if (self._rows > max(self.compact_rows, 2 * self._merged_rows)
                and len(self._parts) > 1):
            self._compact()

    def _compact(self) -> None:
        merged = pl.concat(self._parts, how="vertical_relaxed").group_by(self.keys).agg(self.merge)
        self._parts = [merged]
        self._rows = self._merged_rows = merged.height

    def result(self, empty_schema: pl.DataFrame | None = None) -> pl.DataFrame:
        """The merged table. With no batch seen: ``empty_schema`` when given, else the
        aggregation run on an empty frame is impossible to type, so an empty frame."""
        if not self._parts:
            return empty_schema if empty_schema is not None else pl.DataFrame()
        if len(self._parts) > 1:
            self._compact()
        return self._parts[0]


class DenseSums:
    """Sums of weights per dense integer key, by ``numpy.bincount`` (float64).

    ``key``: a function of the batch returning int64 indices in ``[0, size)`` (entries
    outside are ignored); ``weights``: name -> function of the batch returning float
    weights (``None`` for a count); ``prepare``: optional function of the batch computing the
    columns both need, once per batch. :attr:`sums` holds one ``(size,)`` array per name.
    """

    def __init__(
        self,
        columns: Sequence[str],
        size: int,
        key: Callable[[pl.DataFrame], np.ndarray],
        weights: dict[str, Callable[[pl.DataFrame], np.ndarray] | None],
        prepare: Callable[[pl.DataFrame], pl.DataFrame] | None = None,
    ) -> None:
        self.columns = list(columns)
        self.prepare = prepare
        self.size = int(size)
        self.key = key
        self.weights = dict(weights)
        self.sums = {name: np.zeros(self.size, dtype=np.float64) for name in self.weights}

    def update(self, batch: pl.DataFrame) -> None:
        if self.prepare is not None:
            batch = self.prepare(batch)
        k = np.asarray(self.key(batch), dtype=np.int64)
        ok = (k >= 0) & (k < self.size)
        all_ok = bool(ok.all())
        if not all_ok:
            k = k[ok]
        for name, fn in self.weights.items():
            if fn is None:
                self.sums[name] += np.bincount(k, minlength=self.size)
            else:
                w = np.asarray(fn(batch), dtype=np.float64)
                self.sums[name] += np.bincount(k, weights=w if all_ok else w[ok],
                                               minlength=self.size)


def reduce_runs(
    batch: pl.DataFrame,
    keys: Sequence[str],
    *,
    sums: Sequence[str] = (),
    mins: Sequence[str] = (),
    maxs: Sequence[str] = (),
    firsts: Sequence[str] = (),
    count: str | None = "n",
) -> pl.DataFrame:
    """Collapse runs of consecutive rows with equal ``keys`` into one row each (sums, minima,
    maxima, first values and the row count of the run), by ``numpy.ufunc.reduceat``.

    A cheap first step before a :class:`GroupAgg` keyed by the same keys: the tokens of one
    sequence are usually contiguous in a dump, so a batch of 250k tokens collapses to a few
    thousand rows without a hash table. Exact whatever the order (rows of one key that are
    not contiguous give several rows, which the group-by merges). ``sums`` / ``mins`` /
    ``maxs`` columns must be numeric without nulls or NaN (numpy's reductions, not polars'
    null-skipping ones); ``firsts`` may be any dtype; each column may appear once (else
    ``ValueError``). Returns a frame with ``keys``, then
    ``count`` (Int64, unless None), then the reduced columns under their own names.
    """
    names = [*keys, *sums, *mins, *maxs, *firsts]
    if len(set(names)) != len(names) or (count and count in names):
        raise ValueError(f"reduce_runs: a column is named twice in {names} (count={count!r}).")
    n = batch.height
    if n == 0:
        return batch.select(*keys, *sums, *mins, *maxs, *firsts).head(0).with_columns(
            *([pl.lit(0, dtype=pl.Int64).alias(count)] if count else []))
    change = np.zeros(n, dtype=bool)
    change[0] = True
    for k in keys:
        v = batch[k].to_numpy()
        change[1:] |= v[1:] != v[:-1]
    starts = np.flatnonzero(change)
    idx = pl.Series(starts)
    out: dict[str, object] = {k: batch[k].gather(idx) for k in keys}
    if count:
        out[count] = pl.Series(count, np.diff(np.append(starts, n)).astype(np.int64))
    for cols, fn in ((sums, np.add), (mins, np.minimum), (maxs, np.maximum)):
        for c in cols:
            out[c] = pl.Series(c, fn.reduceat(batch[c].to_numpy(), starts))
    for c in firsts:
        out[c] = batch[c].gather(idx)
    return pl.DataFrame(out)
