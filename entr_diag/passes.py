"""One streaming pass, many statistics: mergeable accumulators fed chunk by chunk.

Each analysis (fit, metrics, forensics, gates, profiles) reduces the token frame to small
tables: sums, counts, minima and maxima keyed by entropy bin, sequence block, step,
sequence. Written as separate polars queries, every table costs one scan of the Parquet
input (decode + validation); ``pl.collect_all`` shares the scan only by caching it, which
over a whole input makes memory grow with the input. Here the token frame is read ONCE per
pass, and every piece is handed to each accumulator, which reduces it and keeps only its
small running result. Memory is bounded by the pieces in flight plus the accumulators
(bins, sequences), never by the number of tokens; the progress callback sees rows as they
are read.

How the frame is read (:func:`run_pass`):

- **Chunks.** A loaded dataset registers its frames as chunks (:func:`register_chunks`):
  contiguous row-group ranges of about a million tokens of one file
  (``entr_diag.io.load.CHUNK_TOKENS``). Per chunk, one ``pl.collect_all`` runs every query
  accumulator's queries and the batch accumulators' projection together: common-subplan
  elimination decodes and validates the chunk once for all of them, and caches only that
  chunk. The next chunk is computed on a worker thread (polars releases the GIL) while
  the accumulators reduce the current one, in batches of at most :data:`CHUNK_BATCH_ROWS`
  rows cut where the engine's memory chunks end (no copy on the way to numpy).
- **Streaming.** Any other frame, and a chunk too large to hold (a file written as one
  huge row group), is streamed with :meth:`polars.LazyFrame.collect_batches` in batches of
  :data:`CHUNK_ROWS` rows; the query accumulators' queries then run as streaming queries
  of their own (each decodes the frame again).

Accumulators are mergeable by construction: a table of sums computed on two halves of the
input and added equals the table of the whole (up to float summation order), so the
result does not depend on how the frame is cut into chunks or batches, nor on row order.

Building blocks:

- ``Accumulator.exprs`` (and ``stages``): per-token keys and weights as polars
  expressions, computed by the engine while it reads the chunk (on its worker threads,
  overlapping the Python-side reduction of the previous chunk). On 2 cores the engine's
  work (decode, validation, these expressions) and the Python-side reductions are of
  the same order; both bound the speed.
- :class:`QueryAccumulator`: polars queries (e.g. a ``group_by``) over each chunk, run by
  the engine; ``absorb`` merges their small results.
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
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import polars as pl

from entr_diag.errors import InputError, ParameterError
from entr_diag.frames import token_frame

__all__ = [
    "CHUNK_BATCH_ROWS",
    "CHUNK_ROWS",
    "FILE_INDEX",
    "NATIVE_SEQ_ID",
    "Accumulator",
    "Chunk",
    "QueryAccumulator",
    "add_counts",
    "DenseSums",
    "GroupAgg",
    "PartialRows",
    "column",
    "frame_of",
    "has_nulls",
    "chunks_of",
    "progress_hook",
    "register_chunks",
    "run_pass",
    "run_rows",
    "run_starts",
]

#: Rows per batch handed to the accumulators when a frame is streamed (smaller batches: less
#: memory in flight).
CHUNK_ROWS: int = 250_000
#: Rows per batch when a chunk is cut into batches (its rows are in memory already; larger
#: batches: fewer, larger reductions, e.g. a ``bincount`` into a table of a million cells
#: costs as much for 1k rows as for 500k).
CHUNK_BATCH_ROWS: int = 500_000

ProgressFn = Callable[[int], None]
_PROGRESS: contextvars.ContextVar[ProgressFn | None] = contextvars.ContextVar(
    "entr_diag_progress", default=None
)
_EXPECT: contextvars.ContextVar[ProgressFn | None] = contextvars.ContextVar(
    "entr_diag_expect", default=None
)


@contextlib.contextmanager
def progress_hook(fn: ProgressFn | None, expect: ProgressFn | None = None) -> Iterator[None]:
    """Within the block, every :func:`run_pass` calls ``fn(rows)`` after each batch (rows of
    that batch) and, over a chunked frame, first ``expect(rows)`` with the input rows its
    chunks hold (from the Parquet metadata: token rows, masked or not). Used by the CLI for
    its progress bar; ``None`` disables."""
    token, token_e = _PROGRESS.set(fn), _EXPECT.set(expect)
    try:
        yield
    finally:
        _PROGRESS.reset(token)
        _EXPECT.reset(token_e)


class Accumulator(Protocol):
    """Reduces batches of the token frame. ``columns``: the canonical columns it reads.

    (Query accumulators instead have ``queries(lf)``, ``n_queries`` and ``absorb(results)``:
    see :class:`QueryAccumulator`.)

    Optionally ``exprs``: named polars expressions over the frame, computed by the streaming
    engine as part of the scan (on its worker threads, overlapping the Python-side work of
    the accumulators) and added to every batch; their names must be unique to the
    accumulator (a prefix such as ``_fit_``), unless two accumulators mean the same
    expression. Optionally ``stages``: lists of named expressions added (``with_columns``)
    one list after the other before ``exprs`` are computed, for intermediate values that
    several ``exprs`` use (computed once: polars does not share a sub-expression that holds
    a literal Series, such as a lookup table).
    """

    columns: Sequence[str]

    def update(self, batch: pl.DataFrame) -> None:  # pragma: no cover - protocol
        ...


@dataclass(frozen=True)
class Chunk:
    """One piece of a token frame: ``frame`` reads a contiguous range of row groups of one
    input file, or several consecutive small files (``rows``: its estimated token rows).
    ``streamed``: the piece is too large to hold (a file written as one huge row group): it
    is read in batches instead."""

    frame: pl.LazyFrame
    rows: int
    streamed: bool = False
    #: where the chunk's rows come from (file and row range), named in read errors
    source: str = ""
    #: for a chunk of several files: each file's frame (its columns as read, before any
    #: validation) and source, read one by one to name the file a read error comes from
    parts: tuple[tuple[pl.LazyFrame, str], ...] = ()


#: Chunks registered for frames (id -> (weak reference to the frame, chunks)).
_CHUNKS: dict[int, tuple[weakref.ref, tuple[Chunk, ...]]] = {}


def register_chunks(lf: pl.LazyFrame, chunks: Sequence[Chunk]) -> None:
    """Declare that ``lf`` is the concatenation of ``chunks`` (same schema, every row in
    exactly one chunk): :func:`run_pass` over ``lf`` then runs chunk by chunk. Used by the
    loader for :attr:`Dataset.lf` and :attr:`Dataset.raw`; frames derived from ``lf`` are
    not chunked."""
    for k in [k for k, (ref, _) in _CHUNKS.items() if ref() is None]:
        del _CHUNKS[k]
    _CHUNKS[id(lf)] = (weakref.ref(lf), tuple(chunks))


def chunks_of(lf: pl.LazyFrame) -> tuple[Chunk, ...] | None:
    """The chunks registered for ``lf`` (:func:`register_chunks`), else None."""
    hit = _CHUNKS.get(id(lf))
    if hit is None or hit[0]() is not lf:
        return None
    return hit[1]


def run_pass(
    lf: pl.LazyFrame,
    accumulators: Sequence[Accumulator],
    *,
    chunk_size: int | None = None,
) -> int:
    """Read ``lf`` once and feed every accumulator; return the row count.

    Two kinds of accumulators (:class:`Accumulator`): batch accumulators (``update``) get
    the frame in batches (of at most ``chunk_size`` rows when given; else a chunk's rows
    at once, or :data:`CHUNK_ROWS` when streaming), in no particular order; query
    accumulators (``queries`` / ``absorb``) get the results of their polars queries run on
    each piece of the frame, computed by the streaming engine.

    When ``lf`` has registered chunks (:func:`register_chunks`, e.g. a loaded
    :class:`~entr_diag.io.load.Dataset`), each chunk is one ``pl.collect_all`` of every
    query accumulator's queries plus the batch accumulators' columns: the queries share
    one decode of the chunk (common-subplan elimination caches only that chunk, so memory
    is bounded by the chunk size), and the next chunk is computed on a worker thread while
    the accumulators reduce the current one. Otherwise (and for a ``streamed`` chunk) the
    frame is streamed with ``collect_batches``, and each query runs as a streaming query of
    its own over the frame.

    Only the union of the batch accumulators' ``columns`` is read (projection pushdown),
    plus their ``exprs``, computed by the streaming engine. Errors of the scan (unreadable
    file, schema mismatch between shards) propagate as polars exceptions; an accumulator
    that an earlier pass already fed raises :class:`~entr_diag.errors.ParameterError` (its
    sums would count the input twice).
    """
    lf = token_frame(lf, "run_pass")
    if not accumulators:
        return 0
    for acc in accumulators:  # an accumulator sums ONE pass: a second would double its sums
        if getattr(acc, "_entr_diag_fed", False):
            raise ParameterError(
                f"{type(acc).__name__} has already been fed by a pass: its sums would count "
                "the input twice; build a new plan for another pass.")
        with contextlib.suppress(AttributeError):
            acc._entr_diag_fed = True  # type: ignore[attr-defined]
    chunks = chunks_of(lf)
    if chunks is None:
        return _stream(lf, accumulators, chunk_size or CHUNK_ROWS)
    rows = 0
    batch_accs = [a for a in accumulators if not _is_query(a)]
    query_accs = [a for a in accumulators if _is_query(a)]
    progress, expect = _PROGRESS.get(), _EXPECT.get()
    if expect is not None:
        expect(sum(c.rows for c in chunks))
    # every chunk's schema (register_chunks), resolved on the first: the whole frame's takes
    # a second over 5000 files
    schema = chunks[0].frame.collect_schema() if batch_accs and chunks else None

    def compute(chunk: Chunk) -> tuple[list[pl.DataFrame], pl.DataFrame | None]:
        qs: list[pl.LazyFrame] = []
        for acc in query_accs:
            qs.extend(acc.queries(chunk.frame))
        if batch_accs:
            qs.append(_project(chunk.frame, batch_accs, schema))
        else:
            qs.append(chunk.frame.select(pl.len().alias("n")))
        # a chunk of several small files (at most CHUNK_TOKENS rows by construction) on the
        # in-memory engine: the streaming engine's morsels are each file's rows, and its
        # per-morsel costs took twice the time (2000 files of 2500 tokens); one file's rows
        # stream (faster there)
        out = pl.collect_all(qs, engine="in-memory" if chunk.parts else "streaming")
        return out[:-1], _by_sequence(_contiguous(out[-1]))

    todo = [c for c in chunks if not c.streamed]
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(compute, todo[0]) if todo else None
        for i in range(len(todo)):
            with _naming(todo[i]):
                results, tail = pending.result()  # type: ignore[union-attr]
            pending = pool.submit(compute, todo[i + 1]) if i + 1 < len(todo) else None
            _absorb(query_accs, results)
            if not batch_accs:
                n = int(tail["n"][0])
                rows += n
                if progress is not None and n:
                    progress(n)
                continue
            for batch in _batches(tail, chunk_size or CHUNK_BATCH_ROWS):
                for acc in batch_accs:
                    acc.update(batch)
                rows += batch.height
                if progress is not None:
                    progress(batch.height)
    for c in chunks:
        if c.streamed:
            with _naming(c):
                rows += _stream(c.frame, accumulators, chunk_size or CHUNK_ROWS)
    return rows


#: a batch cut from a chunk's rows ends at a boundary of its memory chunks once it holds
#: this many rows (:func:`_batches`)
MIN_ALIGNED_ROWS: int = 65_536

#: a chunk's rows whose memory chunks average fewer rows than this are made contiguous
#: first (:func:`_contiguous`)
MIN_MEMORY_CHUNK_ROWS: int = 4_096


def _contiguous(frame: pl.DataFrame) -> pl.DataFrame:
    """``frame``, rechunked into one memory chunk per column when its memory chunks average
    fewer than :data:`MIN_MEMORY_CHUNK_ROWS` rows: the streaming engine returns each Parquet
    row group as memory chunks of its own, and a file written in row groups of 10 rows
    gave 22k chunks per column, on which every numpy conversion, slice and filter of the
    accumulators paid per chunk. Copied once, on the worker thread that read the chunk."""
    n = max(frame.n_chunks("all"), default=1)
    if n > 1 and frame.height < n * MIN_MEMORY_CHUNK_ROWS:
        return frame.rechunk()
    return frame


def _batches(frame: pl.DataFrame, size: int) -> Iterator[pl.DataFrame]:
    """``frame`` in consecutive batches of at most ``size`` rows, cut where its columns'
    memory chunks end (the streaming engine returns a chunk's rows as a few chunks of about
    100k rows per column): a batch within one memory chunk hands the accumulators its
    columns without a copy (``to_numpy`` of a column of several chunks copies them, and
    the fresh arrays cost their page faults: 1 CPU s per pass at 50M tokens). Consecutive
    memory chunks shorter than :data:`MIN_ALIGNED_ROWS` are batched together (copied). The
    cuts are those most columns share; a column cut elsewhere is copied."""
    n = frame.height
    # the memory chunks most columns share (others, e.g. a String column, are copied)
    cuts = Counter(tuple(len(c) for c in s.get_chunks()) for s in frame.get_columns())
    lens = list(cuts.most_common(1)[0][0]) if cuts else [n]
    bounds, end = [0], 0
    for length in lens:
        while length:  # at most size rows a batch, within or across memory chunks
            take = min(length, size - (end - bounds[-1]))
            end, length = end + take, length - take
            if end - bounds[-1] == size:
                bounds.append(end)
        if end - bounds[-1] >= MIN_ALIGNED_ROWS:  # the memory chunk ends the batch
            bounds.append(end)
    if bounds[-1] != n:
        bounds.append(n)
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        yield frame.slice(a, b - a)


@contextlib.contextmanager
def _naming(chunk: Chunk) -> Iterator[None]:
    """A decode or cast error while reading ``chunk`` becomes an :class:`InputError` naming
    the file and rows (with a thousand shards, polars' message alone names neither); so
    does a panic of the Parquet reader (a ``PanicException``, which is no ``Exception``:
    damaged data pages behind a valid footer made it assert on their row counts)."""
    try:
        yield
    except (pl.exceptions.ComputeError, pl.exceptions.InvalidOperationError,
            pl.exceptions.PanicException) as e:
        if not chunk.source:
            raise
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        source = chunk.source
        for frame, part in chunk.parts:  # a chunk of several files: find the one
            try:
                frame.collect(engine="streaming")
            except type(e):
                source = part
                break
        if isinstance(e, pl.exceptions.PanicException):
            raise InputError(
                f"cannot read {source}: the Parquet reader failed on its data pages (polars "
                f"panicked: {msg[:200]}); the file is probably damaged (overwritten or "
                "partly written pages behind a valid footer): write it again, or leave it "
                "out of the input (--skip-unreadable leaves out only files whose footer "
                "cannot be read, found before any pass).") from None
        raise InputError(f"cannot read {source} ({msg[:300]}); if the file is damaged, leave "
                         "it out of the input (--skip-unreadable leaves out only files whose "
                         "footer cannot be read, found before any pass).") from None


def _is_query(acc: Accumulator) -> bool:
    return hasattr(acc, "queries")


def _absorb(query_accs: Sequence[Accumulator], results: list[pl.DataFrame]) -> None:
    k = 0
    for acc in query_accs:
        m = acc.n_queries  # type: ignore[attr-defined]
        acc.absorb(results[k:k + m])  # type: ignore[attr-defined]
        k += m


#: the loader's canonical frame holds ``seq_id`` as read (before its cast to String) under
#: this name; see :func:`_project`
NATIVE_SEQ_ID: str = "_seq_id_native"
#: the loader's frames hold each row's input file (its index in ``Dataset.files``, a
#: constant per file) under this name
FILE_INDEX: str = "_file"


def add_counts(counts: dict[int, int], keys: np.ndarray) -> None:
    """Add the occurrences of each value of ``keys`` (non-negative integers, e.g.
    :data:`FILE_INDEX` values of some rows) to ``counts``."""
    for i, n in enumerate(np.bincount(keys.astype(np.int64))):
        if n:
            counts[i] = counts.get(i, 0) + int(n)


def _project(lf: pl.LazyFrame, accumulators: Sequence[Accumulator],
             schema: pl.Schema | None = None) -> pl.LazyFrame:
    """``lf`` reduced to the accumulators' ``columns`` and ``exprs`` (after their
    ``stages``). ``schema``: ``lf``'s, when known (a chunk has its frame's: resolving it
    anew over a chunk of 64 small files took 12 ms, per chunk and pass).

    When every accumulator reading ``seq_id`` declares ``native_seq_id = True`` (it casts
    the values it keeps to String, per run or group) and the frame holds an integer
    :data:`NATIVE_SEQ_ID`, the batches' ``seq_id`` is that integer column: the cast of every
    token's seq_id to String (about 1 CPU s per 50M tokens) is not computed."""
    if schema is None:
        schema = lf.collect_schema()
    names = schema.names()
    native = (NATIVE_SEQ_ID in schema and schema[NATIVE_SEQ_ID].is_integer()
              and all(getattr(a, "native_seq_id", False) for a in accumulators
                      if "seq_id" in getattr(a, "columns", ())))
    cols: list[str | pl.Expr] = []
    for acc in accumulators:
        for c in getattr(acc, "columns", ()):
            if c in names and c not in cols:
                cols.append(c)
    if native and "seq_id" in cols:
        cols[cols.index("seq_id")] = pl.col(NATIVE_SEQ_ID).alias("seq_id")
    exprs: dict[str, pl.Expr] = {}
    for acc in accumulators:
        for e in getattr(acc, "exprs", ()):
            exprs.setdefault(e.meta.output_name(), e)
    if not cols and not exprs:  # nothing to read but rows: count them
        cols = list(names[:1])
    depth = max((len(getattr(acc, "stages", ())) for acc in accumulators), default=0)
    for i in range(depth):
        stage: dict[str, pl.Expr] = {}
        for acc in accumulators:
            st = getattr(acc, "stages", ())
            if i < len(st):
                for e in st[i]:
                    stage.setdefault(e.meta.output_name(), e)
        lf = lf.with_columns(*stage.values())
    return lf.select(*cols, *exprs.values())


#: a piece whose runs of one ``seq_key`` are shorter than this on average (rows written
#: token by token as concurrent generations produced them, or shuffled) is sorted by
#: ``seq_key`` before the batch accumulators see it
MIN_MEAN_RUN: int = 8


def _by_sequence(frame: pl.DataFrame) -> pl.DataFrame:
    """``frame`` with each sequence's rows together when they are scattered (mean run of one
    ``seq_key`` below :data:`MIN_MEAN_RUN`; a stable sort keeps their order): the
    accumulators reduce runs of one sequence (their per-batch tables hold one slot per run
    and bin, so scattered rows took 20x the time and twice the memory). Unchanged
    otherwise, or without a ``seq_key`` column."""
    if "seq_key" not in frame.columns or frame.height < 2 * MIN_MEAN_RUN:
        return frame
    sk = frame.get_column("seq_key")
    if sk.null_count():
        return frame
    k = sk.to_numpy()
    runs = 1 + int(np.count_nonzero(k[1:] != k[:-1]))
    if runs * MIN_MEAN_RUN <= frame.height:
        return frame
    REGROUPED[0] += 1
    return frame.sort("seq_key", maintain_order=True)


#: batches :func:`_by_sequence` regrouped in this process (rows of sequences interleaved,
#: e.g. logged token by token): the loader reads it around its accounting pass
REGROUPED = [0]


def _stream(lf: pl.LazyFrame, accumulators: Sequence[Accumulator], chunk_size: int) -> int:
    """Streaming mode: the query accumulators' queries run as streaming queries of their own
    over ``lf`` (no common-subplan elimination: it would cache the whole frame); the batch
    accumulators get ``collect_batches`` of their columns."""
    batch_accs = [a for a in accumulators if not _is_query(a)]
    query_accs = [a for a in accumulators if _is_query(a)]
    progress = _PROGRESS.get()
    if query_accs:
        qs = [q for a in query_accs for q in a.queries(lf)]
        if not batch_accs:  # the rows, for the count and the progress bar
            qs.append(lf.select(pl.len().alias("n")))
        out = pl.collect_all(qs, engine="streaming",
                             optimizations=pl.QueryOptFlags(comm_subplan_elim=False))
        _absorb(query_accs, out)
        if not batch_accs:
            n = int(out[-1]["n"][0])
            if progress is not None and n:
                progress(n)
            return n
    rows = 0
    for batch in _project(lf, batch_accs).collect_batches(chunk_size=chunk_size,
                                                          maintain_order=False):
        if batch.height == 0:
            continue
        batch = _by_sequence(batch)
        for acc in batch_accs:
            acc.update(batch)
        rows += batch.height
        if progress is not None:
            progress(batch.height)
    return rows


class QueryAccumulator:
    """Base of query accumulators: :meth:`build` returns the polars queries (LazyFrames of
    small aggregated tables) over a piece of the token frame; :meth:`absorb` merges their
    results (one DataFrame per query, in order). The results of all pieces must merge into
    the result of the whole (sums, minima, ...)."""

    n_queries: int = 1

    def queries(self, lf: pl.LazyFrame) -> list[pl.LazyFrame]:
        qs = self.build(lf)
        if len(qs) != self.n_queries:  # pragma: no cover - programming error
            raise AssertionError(f"{type(self).__name__}: {len(qs)} queries, not {self.n_queries}")
        return qs

    def build(self, lf: pl.LazyFrame) -> list[pl.LazyFrame]:  # pragma: no cover - abstract
        raise NotImplementedError

    def absorb(self, results: list[pl.DataFrame]) -> None:  # pragma: no cover - abstract
        raise NotImplementedError


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
        #: arrays derived from the batch's columns (e.g. :func:`run_starts`), by key
        self._derived: dict[tuple, np.ndarray] = {}

    def _bind(self, batch: pl.DataFrame) -> None:
        if self._batch is None or self._batch() is not batch:
            self._batch, self._arrays, self._derived = weakref.ref(batch), {}, {}

    def get(self, batch: pl.DataFrame, name: str) -> np.ndarray:
        self._bind(batch)
        a = self._arrays.get(name)
        if a is None:
            a = self._arrays[name] = batch[name].to_numpy()
        return a

    def derived(self, batch: pl.DataFrame, key: tuple,
                make: Callable[[], np.ndarray]) -> np.ndarray:
        """``make()``, computed once per batch and ``key``."""
        self._bind(batch)
        a = self._derived.get(key)
        if a is None:
            a = self._derived[key] = make()
        return a


_ARRAYS = _ArrayCache()


def column(batch: pl.DataFrame, name: str) -> np.ndarray:
    """``batch[name].to_numpy()``, computed once per batch (read-only: never modify it)."""
    return _ARRAYS.get(batch, name)


def run_starts(batch: pl.DataFrame, keys: Sequence[str]) -> np.ndarray:
    """Start index of each run of consecutive rows of ``batch`` (non-empty) with equal
    ``keys`` (columns without nulls). Computed once per batch and set of keys, shared by
    the accumulators of a pass (read-only: never modify it)."""

    def make() -> np.ndarray:
        change = np.empty(batch.height, dtype=bool)
        change[0] = True
        change[1:] = False
        for k in keys:
            v = column(batch, k)
            change[1:] |= v[1:] != v[:-1]
        out = np.flatnonzero(change)
        out.flags.writeable = False
        return out

    return _ARRAYS.derived(batch, ("run_starts", *sorted(keys)), make)


def run_rows(starts: np.ndarray, height: int, runs: np.ndarray) -> np.ndarray:
    """Row indices (ascending) of the runs ``runs`` (indices into ``starts``, ascending) of a
    batch of ``height`` rows whose runs start at ``starts``."""
    length = np.diff(np.append(starts, height))[runs]
    offset = starts[runs] - np.cumsum(length) + length
    return np.arange(int(length.sum())) + np.repeat(offset, length)


def has_nulls(batch: pl.DataFrame, cols: list[str]) -> bool:
    """Whether a column of ``cols`` (those in ``batch``) holds a null."""
    return any(batch[c].null_count() for c in cols if c in batch.columns)


def frame_of(parts: Sequence[dict[str, np.ndarray | pl.Series]]) -> pl.DataFrame:
    """One frame of ``parts`` (non-empty; each a dict name -> 1-d numpy array or polars
    Series, of one length within a part, the same names in every part), end to end: the
    arrays of a column concatenated by numpy (by polars, with its type rules, when one is
    a Series). Lets a pass accumulator keep its per-batch rows as numpy and build one
    polars frame for many batches (see :class:`PartialRows`)."""

    def cat(values: list) -> np.ndarray | pl.Series:
        if all(isinstance(v, np.ndarray) for v in values):
            return np.concatenate(values)
        return pl.concat([pl.DataFrame({"v": v}) for v in values],
                         how="vertical_relaxed")["v"]

    return pl.DataFrame({c: cat([p[c] for p in parts]) for c in parts[0]})


#: rows of numpy parts a :class:`PartialRows` buffers before it makes them a frame
PENDING_ROWS: int = 262_144


class PartialRows:
    """Rows of partial sums (minima, ...) keyed by ``keys``, added per batch already reduced
    (e.g. one row per run of a sequence) and merged by ``group_by(keys).agg(merge)`` only
    when they exceed ``compact_rows`` and twice the rows of the last merged table: no
    per-batch group-by, memory within about twice the number of distinct keys, linear
    merging work. :class:`GroupAgg` feeds it its per-batch group-by results.

    A part may be given as columns (a dict name -> 1-d numpy array or polars Series, all
    of one length, the same names in every part):
    they are buffered and made into one frame per :data:`PENDING_ROWS` rows. Building a
    polars frame on the main thread of a pass waits for the thread pool the engine reads
    the next chunk with (about 1 ms a batch, where the frame itself takes 0.2 ms)."""

    def __init__(self, keys: list[str], merge: list[pl.Expr],
                 compact_rows: int = 250_000,
                 cast: dict[str, type[pl.DataType] | pl.DataType] | None = None) -> None:
        self.keys, self.merge, self.compact_rows = keys, merge, compact_rows
        #: casts applied to the frames made of dict parts (e.g. an integer seq_id kept as
        #: numpy, made a String once per frame instead of once per batch)
        self.cast = dict(cast or {})
        self._parts: list[pl.DataFrame] = []
        self._rows = self._merged_rows = 0
        self._pending: list[dict[str, np.ndarray | pl.Series]] = []
        self._pending_rows = 0

    def add(self, part: pl.DataFrame | dict[str, np.ndarray | pl.Series]) -> None:
        if isinstance(part, dict):
            self._pending.append(part)
            self._pending_rows += len(next(iter(part.values()))) if part else 0
            if self._pending_rows >= PENDING_ROWS:
                self._flush()
            return
        self._parts.append(part)
        self._rows += part.height
        if self._rows > max(self.compact_rows, 2 * self._merged_rows) and len(self._parts) > 1:
            self._compact()

    def _flush(self) -> None:
        """The buffered numpy parts as one frame, added."""
        pending, self._pending, self._pending_rows = self._pending, [], 0
        if pending:
            frame = frame_of(pending)
            if self.cast:
                frame = frame.with_columns(pl.col(c).cast(t) for c, t in self.cast.items()
                                           if c in frame.columns)
            self.add(frame)

    def _compact(self) -> None:
        merged = pl.concat(self._parts, how="vertical_relaxed").group_by(self.keys).agg(
            self.merge)
        self._parts = [merged]
        self._rows = self._merged_rows = merged.height

    def rows(self) -> pl.DataFrame | None:
        """The partial rows as chunks of one frame, not merged (a key may repeat: for
        readers that only sum them over coarser keys); None when nothing was added."""
        self._flush()
        if not self._parts:
            return None
        self._parts = [pl.concat(self._parts, how="vertical_relaxed", rechunk=False)]
        return self._parts[0]

    def result(self, empty: pl.DataFrame | None = None) -> pl.DataFrame:
        """The merged table (one row per key, unsorted); ``empty`` (else an empty frame)
        when nothing was added."""
        self._flush()
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

