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
- :func:`run_starts` / :class:`PartialRows`: runs of consecutive rows of one sequence (the
  tokens of a sequence are usually contiguous) reduced with ``numpy.ufunc.reduceat``, the
  run rows kept and merged by key only when they grow, so no hash group-by sees every
  token; :func:`column` shares a batch's numpy arrays between accumulators.
- :class:`DenseSums`: ``numpy.bincount`` of weights on a dense integer key computed per
  batch; for fixed-size grids (bins x blocks), where it beats a hash group-by.
"""

from __future__ import annotations

import contextlib
import contextvars
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

import numpy as np
import polars as pl

__all__ = [
    "CHUNK_ROWS",
    "Accumulator",
    "DenseSums",
    "GroupAgg",
    "PartialRows",
    "column",
    "has_nulls",
    "progress_hook",
    "run_pass",
    "run_rows",
    "run_starts",
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
    count, ``.min()`` of a minimum). The partial tables are kept in a :class:`PartialRows`
    (merged when they exceed ``compact_rows`` and twice the rows of the last merged table:
    memory within about twice the number of distinct keys, linear merging work).
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
        self.prepare = prepare
        self._rows = PartialRows(self.keys, list(merge), compact_rows)

    def update(self, batch: pl.DataFrame) -> None:
        lf = batch.lazy()
        if self.prepare is not None:
            lf = self.prepare(lf)
        self._rows.add(lf.group_by(self.keys).agg(self.aggs).collect())

    def result(self, empty_schema: pl.DataFrame | None = None) -> pl.DataFrame:
        """The merged table; ``empty_schema`` (else an empty frame) when no batch was seen."""
        return self._rows.result(empty_schema)


class _ArrayCache:
    """numpy arrays of the columns of the batch being processed, shared by the accumulators
    of a pass (a batch's columns are usually several chunks: ``to_numpy`` copies them, once
    per batch instead of once per accumulator). Weakly bound to the batch: arrays of the
    previous batch are dropped when the next one is read."""

    def __init__(self) -> None:
        self._batch: weakref.ref[pl.DataFrame] | None = None
        self._arrays: dict[str, np.ndarray] = {}

    def get(self, batch: pl.DataFrame, name: str) -> np.ndarray:
        if self._batch is None or self._batch() is not batch:
            self._batch, self._arrays = weakref.ref(batch), {}
        a = self._arrays.get(name)
        if a is None:
            a = self._arrays[name] = batch[name].to_numpy()
        return a


_ARRAYS = _ArrayCache()


def column(batch: pl.DataFrame, name: str) -> np.ndarray:
    """``batch[name].to_numpy()``, computed once per batch (read-only: never modify it)."""
    return _ARRAYS.get(batch, name)


def run_starts(batch: pl.DataFrame, keys: list[str]) -> np.ndarray:
    """Start index of each run of consecutive rows of ``batch`` (non-empty) with equal
    ``keys`` (columns without nulls)."""
    change = np.empty(batch.height, dtype=bool)
    change[0] = True
    change[1:] = False
    for k in keys:
        v = column(batch, k)
        change[1:] |= v[1:] != v[:-1]
    return np.flatnonzero(change)


def run_rows(starts: np.ndarray, height: int, runs: np.ndarray) -> np.ndarray:
    """Row indices (ascending) of the runs ``runs`` (indices into ``starts``, ascending) of a
    batch of ``height`` rows whose runs start at ``starts``."""
    length = np.diff(np.append(starts, height))[runs]
    offset = starts[runs] - np.cumsum(length) + length
    return np.arange(int(length.sum())) + np.repeat(offset, length)


def has_nulls(batch: pl.DataFrame, cols: list[str]) -> bool:
    """Whether a column of ``cols`` (those in ``batch``) holds a null."""
    return any(batch[c].null_count() for c in cols if c in batch.columns)


class PartialRows:
    """Rows of partial sums (minima, ...) keyed by ``keys``, added per batch already reduced
    (e.g. one row per run of a sequence) and merged by ``group_by(keys).agg(merge)`` only
    when they exceed ``compact_rows`` and twice the rows of the last merged table: no
    per-batch group-by, memory within about twice the number of distinct keys, linear
    merging work. :class:`GroupAgg` feeds it its per-batch group-by results."""

    def __init__(self, keys: list[str], merge: list[pl.Expr],
                 compact_rows: int = 250_000) -> None:
        self.keys, self.merge, self.compact_rows = keys, merge, compact_rows
        self._parts: list[pl.DataFrame] = []
        self._rows = self._merged_rows = 0

    def add(self, part: pl.DataFrame) -> None:
        self._parts.append(part)
        self._rows += part.height
        if self._rows > max(self.compact_rows, 2 * self._merged_rows) and len(self._parts) > 1:
            self._compact()

    def _compact(self) -> None:
        merged = pl.concat(self._parts, how="vertical_relaxed").group_by(self.keys).agg(
            self.merge)
        self._parts = [merged]
        self._rows = self._merged_rows = merged.height

    def rows(self) -> pl.DataFrame | None:
        """The partial rows as chunks of one frame, not merged (a key may repeat: for
        readers that only sum them over coarser keys); None when nothing was added."""
        if not self._parts:
            return None
        self._parts = [pl.concat(self._parts, how="vertical_relaxed", rechunk=False)]
        return self._parts[0]

    def result(self, empty: pl.DataFrame | None = None) -> pl.DataFrame:
        """The merged table (one row per key, unsorted); ``empty`` (else an empty frame)
        when nothing was added."""
        if not self._parts:
            return empty if empty is not None else pl.DataFrame()
        if len(self._parts) > 1 or not self._merged_rows:
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

