"""Read Parquet dumps of per-token rollout logs into one canonical, lazy token frame.

``load_dataset(paths)`` finds the files, detects each file's layout (long: one row per
token; nested: one row per sequence with equal-length list columns), maps the dump's column
names onto the canonical ones of :mod:`entr_diag.io.schema`, validates every loss-masked
token and counts the invalid ones by reason (:data:`~entr_diag.io.schema.EXCLUSION_REASONS`).
The returned :class:`Dataset` holds a ``pl.LazyFrame`` of the valid loss-masked tokens only
(columns in ``docs/CONTRACT.md``); nothing is collected whole and input files are only read.

Errors raised (all :class:`~entr_diag.errors.EntrDiagError`, CLI exit code 2):
:class:`~entr_diag.errors.InputError` for missing, unreadable, non-Parquet or empty inputs
and ragged nested rows; :class:`~entr_diag.errors.SchemaError` for missing, ambiguous or
wrongly typed columns.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import glob
import itertools
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.resources import as_file, files
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from entr_diag.errors import InputError, SchemaError
from entr_diag.io import schema as S
from entr_diag.passes import (
    FILE_INDEX,
    NATIVE_SEQ_ID,
    REGROUPED,
    Chunk,
    PartialRows,
    add_counts,
    column,
    register_chunks,
    run_pass,
    run_starts,
)

LAYOUTS = ("auto", "long", "nested")
ENTROPY_CHOICES = ("auto", "infer", "train")
_HIVE_SEGMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.+)$")
_POLARS_DTYPE = {S.FLOAT: pl.Float64, S.INT: pl.Int64, S.BOOL: pl.Boolean, S.ID: pl.String}
#: how many offending keys an error message lists at most
_MAX_LISTED = 5


def bundled_sample_path() -> Path:
    """Path of the bundled sample run (long layout) that ships inside the package.

    Raises:
        InputError: when the package was installed without its sample data.
    """
    res = files("entr_diag.sample_data").joinpath("sample_run_long.parquet")
    with as_file(res) as p:
        path = Path(p)
    if not path.is_file():
        raise InputError(
            "the bundled sample run is missing from this installation "
            f"(expected {path}); reinstall entr-diag or pass a Parquet path."
        )
    return path


# --------------------------------------------------------------------------- files


#: key of the Parquet file metadata entr-diag writes into its own Parquet outputs (flag,
#: compare --export): a directory walk skips such files (a run's folder may hold them)
OUTPUT_MARK = "entr_diag.output"
#: the file name endings (any case) a directory search reads as Parquet
PARQUET_SUFFIXES: tuple[str, ...] = (".parquet", ".pq", ".parq")
#: other tabular data files a directory of shards may hold (a step dumped as CSV or JSON
#: lines): not read, but named (:func:`resolve_paths`, ``others``), as they may hold tokens
#: (not configs or checkpoints: .json, .pt, .npy beside a dump are rarely its tokens)
OTHER_DATA_SUFFIXES: tuple[str, ...] = (
    ".csv", ".tsv", ".jsonl", ".ndjson", ".arrow", ".feather", ".ipc", ".orc", ".avro")
#: compression endings such a file may carry on top (``step6.csv.gz``)
COMPRESSED_SUFFIXES: tuple[str, ...] = (".gz", ".zst", ".bz2", ".xz", ".zip")


def inputs_named(paths: Sequence[str | Path]) -> str:
    """The input files as refusals name them: the one file, else the folder holding them
    and their number (``dumps (12 files)``)."""
    if len(paths) == 1:
        return str(paths[0])
    files = [os.path.abspath(str(p)) for p in paths]
    return f"{os.path.commonpath(files)} ({len(files):,} files)"


def _link_loops(path: str) -> bool:
    """Whether following the symbolic link ``path`` runs in a loop (the system says so)."""
    try:
        os.stat(path)
    except OSError as e:
        return e.errno == errno.ELOOP
    return False


def _broken_link(path: str) -> str:
    """What the symbolic link ``path``, which leads to no file, is: 'a symbolic link loop'
    or 'a symbolic link to TARGET, which does not exist'."""
    if _link_loops(path):
        return "a symbolic link loop"
    try:
        target = os.readlink(path)
    except OSError:
        target = "?"
    return f"a symbolic link to {target}, which does not exist"


def resolve_paths(paths: Sequence[str | Path], *, skipped: list[Path] | None = None,
                  walked: set[Path] | None = None,
                  repeated: list[Path] | None = None,
                  others: list[Path] | None = None) -> list[Path]:
    """Expand files, directories (recursively, the :data:`PARQUET_SUFFIXES`) and globs into
    Parquet files.

    A directory walk skips Parquet files whose names start with '.' or '_' (hidden,
    temporary or metadata files by the Spark/Hive convention), or that lie in a folder
    (under the one searched) so named (``.staging/``, ``_temporary/``); they are appended to
    ``skipped`` when given; the files it finds are added to ``walked`` when given; the other
    data files it meets (:data:`OTHER_DATA_SUFFIXES`, compressed or not, e.g. a step dumped
    as ``.csv``), which it does not read, are appended to ``others`` when given. Files
    named explicitly or matched by a glob are always read.

    Returns the files in natural order (numbers in names compared as numbers:
    ``part-9`` before ``part-10``), without duplicates: a file named twice, or matched again
    by a glob or a directory (the same file by its device and inode: through a symlink or a
    hard link too), is read once and appended to ``repeated`` when given.

    Raises:
        InputError: an empty path (``''``), a path that does not exist or is no file (a pipe such as
            ``/dev/stdin``, a device), a glob or directory that matches no
            Parquet file (naming the skipped ones), or no path at all.
    """
    if not paths:
        raise InputError("no input path given.")
    out: list[Path] = []
    for raw in paths:
        text = str(raw)
        if not text:  # Path("") is the current directory: never read it unasked
            raise InputError("empty input path (''): name a Parquet file, a directory or a "
                             "glob (the current directory is '.').")
        p = Path(text)
        if p.is_dir():
            found, hidden, other_here = _walk(p)
            if skipped is not None:
                skipped.extend(hidden)
            if others is not None:
                others.extend(other_here)
            if walked is not None:
                walked.update(found)
            if not found:
                raise InputError(f"directory {text} holds no Parquet files "
                                 + _none_found(hidden, other_here))
            out.extend(found)
        elif p.is_file():
            out.append(p)
        elif p.exists():  # a pipe (/dev/stdin, <(...), a FIFO), a terminal or a socket
            raise InputError(
                f"input {text} is a pipe or device, not a file: Parquet cannot be read from a "
                "pipe or stdin (it needs a seekable file: its footer is at the end); "
                "save it to a file first (e.g. `cat > run.parquet`) and pass that file.")
        elif any(ch in text for ch in "*?["):
            matched = sorted((Path(m) for m in glob.glob(text, recursive=True)), key=_natural)
            found = [m for m in matched if m.is_file() or _parquet_link_to_nothing(m)]
            # folders the pattern matches are searched like a folder named on its own
            # ('runs/step*' quoted, as the shell would have passed them)
            hidden, other_here, in_dirs = [], [], []
            for d in (m for m in matched if m.is_dir()):
                f_d, h_d, o_d = _walk(d)
                in_dirs += f_d
                hidden += h_d
                other_here += o_d
            named = set(found)
            found += [q for q in in_dirs if q not in named]
            read = set(found)  # (a folder under a matched one may be matched itself)
            hidden = list(dict.fromkeys(q for q in hidden if q not in read))
            other_here = list(dict.fromkeys(other_here))
            if skipped is not None:
                skipped.extend(hidden)
            if others is not None:
                others.extend(other_here)
            if walked is not None:
                walked.update(q for q in in_dirs if q not in named)
            if not found and any(m.is_dir() for m in matched):
                raise InputError(f"the pattern {text} matches only folders, and they hold no "
                                 "Parquet files " + _none_found(hidden, other_here))
            if not found:
                # a folder on the way whose name holds [ ] ? * is itself read as a pattern
                literal = next((str(d) for d in p.parents if d.exists() and d != Path(".")
                                and any(ch in d.name for ch in "*?[")), None)
                raise InputError(
                    f"the pattern {text} matches no file"
                    + (f": the folder {literal} exists, but in a pattern its name is a "
                       f"pattern too; escape it with glob.escape ({glob.escape(literal)}) or "
                       "pass the folder itself." if literal else "."))
            out.extend(found)
        elif os.path.islink(text):  # a link to nothing: a loop, or a missing target
            raise InputError(f"input {text} is {_broken_link(text)}.")
        else:
            raise InputError(f"input {text} does not exist.")
    seen: set[object] = set()
    uniq = []
    for q in out:
        try:  # the file itself: a symlink or a hard link to a file named already is it
            st = q.stat()
            key: object = (st.st_dev, st.st_ino)
        except OSError:  # (a link to nothing in a folder: refused or skipped when read)
            key = os.path.abspath(q)
        if key not in seen:
            seen.add(key)
            uniq.append(q)
        elif repeated is not None:
            repeated.append(q)
    return uniq


def _walk(p: Path) -> tuple[list[Path], list[Path], list[Path]]:
    """The files a search of the folder ``p`` meets, in natural order: (the Parquet files it
    reads, the Parquet files it skips as hidden: their name, or a folder under ``p`` holding
    them, starts with '.' or '_' (.staging/, a crashed Spark job's _temporary/,
    _delta_log/), the other data files outside such folders, :func:`_data_suffix`)."""
    found, hidden, other = [], [], []
    unlisted: list[OSError] = []  # folders under p that cannot be listed
    names = [Path(root, f) for root, _dirs, files in os.walk(p, onerror=unlisted.append)
             for f in files]  # (symbolic links to folders are not followed, as by rglob)
    if unlisted:
        e = unlisted[0]
        raise InputError(
            f"cannot search the input folder {p}: its folder {e.filename} cannot be listed "
            f"({e.strerror or e}), so the Parquet files in it, if any, would be left out. "
            "Make it readable, or name the files to read (e.g. a glob such as "
            f"'{p / '*.parquet'}').")
    for q in sorted(names, key=_natural):
        try:
            is_file = q.is_file()
        except OSError:  # e.g. a link into a folder this user may not enter
            is_file = False
        if not is_file and not _parquet_link_to_nothing(q):
            continue  # (a Parquet-named link to nothing is listed: read, refused or skipped)
        veiled = any(part.startswith((".", "_")) for part in q.relative_to(p).parts)
        if _looks_parquet(q.with_name("x" + q.name)):  # a Parquet name
            (hidden if veiled else found).append(q)
        elif not veiled and _data_suffix(q):
            other.append(q)
    return found, hidden, other


def _parquet_link_to_nothing(q: Path) -> bool:
    """Whether ``q`` is a symbolic link with a Parquet name that leads to no file (a loop,
    a missing target): a folder search or a glob lists it, so that reading it refuses it
    (or ``--skip-unreadable`` leaves it out with a warning) rather than skip it unsaid."""
    return (q.is_symlink() and not os.path.exists(q)
            and _looks_parquet(q.with_name("x" + q.name)))


def _none_found(hidden: Sequence[Path], other: Sequence[Path]) -> str:
    """The end of a refusal of a search that found no Parquet file to read: the suffixes
    read, and the hidden and other-format files it met instead."""
    return (f"({', '.join('*' + x for x in PARQUET_SUFFIXES)})"
            + (f" except {len(hidden)} skipped hidden or _-prefixed file(s) (or in such "
               f"folders), e.g. {hidden[0]}: pass them explicitly to read them."
               if hidden else ".")
            + (f" It holds {len(other)} data file(s) of another format "
               f"({', '.join(sorted({data_kind(q) for q in other}))}), e.g. "
               f"{other[0]}: entr-diag reads Parquet only; convert them." if other else ""))


def _natural(p: Path) -> tuple:
    """Sort key reading the numbers in a path as numbers: ``part-9`` before ``part-10``,
    ``step=2`` before ``step=10`` (shards are written in that order; a sequence that
    continues from one file into the next is numbered in it)."""
    return tuple((0, int(t), "") if t.isdigit() else (1, 0, t)
                 for t in re.split(r"(\d+)", str(p)) if t)


def data_kind(p: Path) -> str:
    """The data-format ending of ``p``, lower case, with its compression ending if any
    (``.csv``, ``.csv.gz``); '' when the name has none."""
    sfx = [x.lower() for x in p.suffixes]
    if len(sfx) >= 2 and sfx[-1] in COMPRESSED_SUFFIXES:
        return "".join(sfx[-2:])
    return sfx[-1] if sfx else ""


def _data_suffix(p: Path) -> bool:
    """Whether ``p`` is named like another data file (:data:`OTHER_DATA_SUFFIXES`, or one
    of them compressed: ``step6.csv.gz``)."""
    sfx = [x.lower() for x in p.suffixes]
    if sfx and sfx[-1] in COMPRESSED_SUFFIXES:
        sfx = sfx[:-1]
    return bool(sfx) and sfx[-1] in OTHER_DATA_SUFFIXES


def _looks_parquet(p: Path) -> bool:
    return p.suffix.lower() in PARQUET_SUFFIXES and not p.name.startswith((".", "_"))


def _scan(path: Path) -> pl.LazyFrame:
    """A lazy scan of the one file ``path``, read literally: polars would expand ``[``,
    ``*`` and ``?`` in it as a glob (``run[1].parquet`` matching ``run1.parquet``, or
    nothing); the input's patterns are expanded by :func:`resolve_paths` alone."""
    return pl.scan_parquet(path, hive_partitioning=False, glob=False)


def _read_footer(path: Path) -> tuple[pa.Schema, pq.FileMetaData]:
    """The Arrow schema and the Parquet metadata of ``path`` (its footer, read once: with
    thousands of small shards, reading it twice was a second per thousand files).
    InputError naming the file when it cannot be read as Parquet (a damaged one, starting
    with Parquet's magic bytes, told apart from another format) or when it holds several
    columns of one name (Parquet allows it; polars cannot read such a file, even when that
    column is not used)."""
    try:
        pf = pq.ParquetFile(path)
        schema, meta = pf.schema_arrow, pf.metadata
    except (pa.ArrowInvalid, OSError, ValueError) as e:
        try:
            with open(path, "rb") as f:
                head = f.read(4)
            parquet = head == b"PAR1"
        except OSError as oe:  # not a question of format: the file cannot be opened
            if os.path.islink(path) and not os.path.exists(path):  # e.g. a shard's link
                raise InputError(f"cannot read {path}: it is {_broken_link(str(path))}."
                                 ) from None
            raise InputError(f"cannot read {path}: {oe.strerror or oe}.") from None
        what = ("it starts like a Parquet file but cannot be read: truncated, or damaged"
                if parquet else "the file is empty (0 bytes): cut short, or still being "
                "written" if head == b"" else "entr-diag reads Parquet files only")
        raise InputError(f"cannot read {path} as Parquet ({_short(e)}); {what}.") from None
    names = schema.names
    if not names:  # (the required-columns message would list its columns as '')
        raise InputError(f"cannot read {path}: it holds no columns at all (an empty Parquet "
                         f"schema, {meta.num_rows:,} rows): no token logs in it.")
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        listed = ", ".join(f"{names.count(n)} named '{n}'" for n in dups[:3])
        more = ", ..." if len(dups) > 3 else ""
        raise InputError(
            f"cannot read {path}: it holds several columns of one name ({listed}{more}); "
            "Parquet allows it, but polars cannot read such a file: rewrite it with unique "
            "column names.")
    beyond = _chunk_beyond_end(path, meta)
    if beyond is not None:
        col, end, data = beyond
        raise InputError(
            f"cannot read {path}: its footer places column '{col}' at byte {end:,}, beyond "
            f"the {data:,} bytes before the footer: the file was cut short or "
            "rewritten while its footer stayed (a copy or a write that did not finish): "
            "write it again, or leave it out of the input.")
    return schema, meta


#: :func:`_chunk_beyond_end` checks every row group of a file with at most this many
#: (else the first and the last: Parquet writers lay row groups out in order)
_ALL_GROUPS_CHECKED = 64


def _chunk_beyond_end(path: Path, meta: pq.FileMetaData) -> tuple[str, int, int] | None:
    """(column, byte, bytes before the footer) of a column chunk that the footer places
    beyond the file's data - starting within or after the footer (its length and the
    magic bytes take the file's last ``serialized_size + 8``) or ending beyond the file -,
    or None. Polars' reader asserts on such a range and panics, printing several Rust
    backtraces on stderr before the error could name the file; or it decodes the footer's
    bytes as pages. (A chunk's end is judged against the file's size only: a writer that
    leaves its dictionary page's offset unset makes it look later by that page.)"""
    try:
        size = os.path.getsize(path)
    except OSError:
        return None
    data = size - 8 - meta.serialized_size
    n = meta.num_row_groups
    groups = range(n) if n <= _ALL_GROUPS_CHECKED else (0, n - 1)
    for g in groups:
        rg = meta.row_group(g)
        for j in range(rg.num_columns):
            c = rg.column(j)
            if c.file_path:  # (a chunk in another file: not this one's bytes)
                continue
            start = (c.dictionary_page_offset if c.has_dictionary_page
                     and c.dictionary_page_offset else c.data_page_offset)
            end = int(start) + int(c.total_compressed_size)
            if start >= data or end > size:
                return c.path_in_schema, (int(start) if start >= data else end), data
    return None


def _short(e: BaseException) -> str:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return msg[:200]


#: the folder name Hive and Spark write for a null partition value (``step=__HIVE_...__``)
_HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"


def _hive_values(path: Path) -> dict[str, str]:
    """The ``key=value`` partition folders above ``path`` (a new dict: the caller may
    change it)."""
    return dict(_hive_items(path))


#: a folder named for a training step without ``key=``: ``global_step_12`` (verl's
#: checkpoint and dump folders), ``step_12``, ``step-12``: read as the partition
#: ``step=12`` unless a ``step=`` folder is above the file too
_STEP_FOLDER = re.compile(r"^(?:global_step|step)[_-](\d+)$")


@functools.lru_cache(maxsize=65_536)
def _hive_items(path: Path) -> tuple[tuple[str, str], ...]:
    """:func:`_hive_values` as a tuple, parsed once per path (the loader asks for every file
    several times per canonical column: thousands of shards)."""
    vals: dict[str, str] = {}
    steps: dict[str, str] = {}
    for part in path.parent.parts:
        m = _HIVE_SEGMENT.match(part)
        if m:
            vals[m.group(1)] = m.group(2)
        elif m := _STEP_FOLDER.match(part):  # verl's global_step_N naming
            steps["step"] = m.group(1)
    if steps and "step" not in vals:
        vals.update(steps)
    return tuple(vals.items())


def _partition_conflicts(path: Path, meta: pq.FileMetaData, hive: Mapping[str, str],
                         mapping: Mapping[str, str]) -> list[str]:
    """Notes for mapped columns that exist in the file AND as a partition value in its path
    (``step=3/part.parquet`` holding a ``step`` column) whose values, by the file's column
    statistics, are not all that partition value: the file's column is the one used."""
    notes = []
    for canon, src in mapping.items():
        if src not in hive or hive[src] == _HIVE_NULL:
            continue
        rng = _stat_range(meta, src)
        if rng is None:  # not a scalar column of the file, or no statistics
            continue
        lo, hi = rng
        if not _holds_only(rng, hive[src]):
            want = hive[src]
            span = str(lo) if lo == hi else f"{lo}..{hi}"
            notes.append(f"{path}: the path says {src}={want} (a partition folder) but the "
                         f"file's '{src}' column ({canon}) holds {span}: the column is used")
    return notes


def _stat_range(meta: pq.FileMetaData, name: str) -> tuple[Any, Any] | None:
    """(min, max) of the scalar column ``name`` over the file's row groups, by their
    statistics; None when the file has no such column or a row group lacks them."""
    paths = [meta.schema.column(j).path for j in range(meta.num_columns)]
    if name not in paths:
        return None
    j = paths.index(name)
    lo = hi = None
    for g in range(meta.num_row_groups):
        if meta.row_group(g).num_rows == 0:  # an empty row group has no statistics
            continue
        st = meta.row_group(g).column(j).statistics
        if st is None or not st.has_min_max:
            return None
        lo = st.min if lo is None else min(lo, st.min)
        hi = st.max if hi is None else max(hi, st.max)
    return None if lo is None or hi is None else (lo, hi)


def _holds_only(rng: tuple[Any, Any], value: str) -> bool:
    """Whether a column's (min, max) is the partition ``value`` alone."""
    as_int = _int_like(value) and isinstance(rng[0], int)
    return all((int(v) == int(value)) if as_int else (str(v) == value) for v in rng)


def _agreeing_partitions(file_list: Sequence[Path], metas: Mapping[Path, pq.FileMetaData],
                         file_columns: set[str], overrides: Mapping[str, str]
                         ) -> dict[str, str]:
    """Partition keys that no file holds as a column (``step=3/``) but that are another
    name of a column the files do hold (``global_step``), and agree with it: in every
    file, that column holds the folder's value alone (by its statistics). key -> column.
    Both would be candidates of one canonical column and refused as ambiguous, though
    they say the same; the file's column is read instead. Keys a ``--column`` names are
    left alone."""
    out: dict[str, str] = {}
    hives = {f: _hive_values(f) for f in file_list}
    keys = {k for h in hives.values() for k in h} - file_columns - set(overrides.values())
    for k in sorted(keys):
        for col in S.COLUMNS:
            names = (col.name, *col.aliases)
            if k not in names or col.name in overrides:
                continue
            for c in names:
                if c == k or c not in file_columns:
                    continue
                if all(k in hives[f] and hives[f][k] != _HIVE_NULL
                       and (rng := _stat_range(metas[f], c)) is not None
                       and _holds_only(rng, hives[f][k]) for f in file_list):
                    out[k] = c
                    break
    return out


def _folder_vs_column(names: Sequence[str], file_list: Sequence[Path],
                      metas: Mapping[Path, pq.FileMetaData], file_columns: set[str]) -> str:
    """For an ambiguity refusal between the candidate columns ``names`` (the refusal's
    ``candidates``; '' without them), a partition key (``step=N/`` folders, no file holding
    it) and a file column: which one comes from the folders, and the first file whose
    column does not hold its folder's value alone (or has no statistics to tell); '' for
    another refusal."""
    keys = [k for k in names if k not in file_columns
            and any(k in _hive_values(f) for f in file_list)]
    cols = [c for c in names if c in file_columns]
    if len(keys) != 1 or not cols:
        return ""
    k, c = keys[0], cols[0]
    for f in file_list:
        v = _hive_values(f).get(k)
        rng = _stat_range(metas[f], c)
        if v is None or rng is None or not _holds_only(rng, v):
            what = ("has no statistics to compare with its folder" if rng is None and v
                    else f"holds {rng[0]}..{rng[1]} under {k}={v}" if rng and v
                    else f"is not below a {k}= folder")
            return (f"('{k}' comes from the partition folders {k}=...; the files' '{c}' "
                    f"does not say the same in every file: {f}'s '{c}' {what}.)")
    return ""


# --------------------------------------------------------------------------- mapping


@dataclass(frozen=True)
class FileInfo:
    """One input file: path, layout, row count (rows of the file, not tokens) and its columns."""

    path: Path
    layout: str
    rows: int
    columns: tuple[str, ...]
    hive: Mapping[str, str] = field(default_factory=dict)


def _null_typed(t: pa.DataType) -> bool:
    """Arrow's null type (or a list of it): a column that holds no value, e.g. one pandas
    wrote after ``df[c] = None``."""
    return pa.types.is_null(_value_type(t))


def _is_text(t: pa.DataType) -> bool:
    """A string column of any of Arrow's string types."""
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


def _kind_ok(kind: str, t: pa.DataType) -> bool:
    if pa.types.is_null(t):  # no value: read as nulls of any kind (load_dataset says so)
        return True
    if kind == S.FLOAT:
        return pa.types.is_floating(t) or pa.types.is_integer(t) or pa.types.is_decimal(t)
    if kind == S.INT:  # floats holding whole numbers (pandas writes an integer column with
        # a missing value as float64): read by _canonical_cast, the others as null
        return pa.types.is_integer(t) or pa.types.is_floating(t)
    if kind == S.BOOL:  # a numeric mask holds 0/1 (other values: invalid_loss_mask rows)
        return pa.types.is_boolean(t) or pa.types.is_integer(t) or pa.types.is_floating(t)
    if kind == S.ID:  # (floats: an integer id column with a missing value, from pandas)
        return pa.types.is_integer(t) or pa.types.is_floating(t) or _is_text(t)
    raise AssertionError(kind)


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def _value_type(t: pa.DataType) -> pa.DataType:
    """The type of one value: a list's element type; a dictionary-encoded column's value
    type (e.g. string ids written from a pandas categorical)."""
    t = t.value_type if _is_list(t) else t
    return t.value_type if pa.types.is_dictionary(t) else t


def _type_name(t: pa.DataType) -> str:
    return str(t)


def _or_list(names: Sequence[str], word: str = "or") -> str:
    """``a``, ``a or b``, ``a, b or c``."""
    names = list(names)
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + f" {word} " + names[-1]


def _whose(src: str, canon: str, foreign: Mapping[str, Sequence[str]],
           spelled: str | None = None) -> str:
    """``'old_log_probs' is the name verl and roll use for train_logprob``; ``spelled``: the
    known name ``src`` spells in another case (``'Old_Log_Probs'``)."""
    name = spelled or src
    users = S.users_of(name, canon) or tuple(foreign[name])
    verb = "uses" if len(users) == 1 else "use"
    return (f"'{src}' is {'' if name == src else '(ignoring case) '}the name "
            f"{_or_list(users, 'and')} {verb} for {canon}")


#: canonical columns that key or order the tokens: an override taking the column one of
#: them would be read from, when nothing else can be, is warned about (what is lost)
_STRUCTURAL_COLUMNS: dict[str, str] = {
    "position": "tokens are numbered in row order within each sequence",
    "step": "no per-step tables, every sequence keyed by its seq_id alone",
    "policy_version": "no staleness",
    "train_version": "no staleness",
    "loss_mask": "every token counts as loss-masked",
}


def resolve_mapping(
    available: Mapping[str, pa.DataType],
    *,
    overrides: Mapping[str, str] | None = None,
    framework: str | None = None,
    entropy: str = "auto",
    origins: Mapping[str, str] | None = None,
) -> tuple[dict[str, str], list[str]]:
    """Choose, for each canonical column, the source column that holds it.

    A canonical column's candidates are, in order: the framework's own name (with
    ``framework``), the canonical name, then its generic aliases. With ``framework`` the
    names only *other* frameworks use are never candidates (:func:`~entr_diag.io.schema.
    foreign_names`) for the column they read them as: ``--framework trl`` never reads
    verl's ``old_log_probs``; nor is a name the framework reads as one column a candidate
    for another (``--framework slime`` reads ``rollout_id`` as the step, never as the
    sequence id, a generic alias of which it is elsewhere). A column is
    never guessed between two present candidates: unless an override or the framework's own
    name decides, two or more candidates of the right type are refused as ambiguous.

    Args:
        available: source column name -> Arrow type (list types for nested columns), the
            union over all input files.
        overrides: ``canonical -> source`` from ``--column``; always wins.
        framework: a key of :data:`~entr_diag.io.schema.FRAMEWORKS`; its names are tried
            first and may resolve the ambiguous names (``logprobs``, ``log_probs``).
        entropy: ``auto`` (inference-side, else trainer-side), ``infer`` or ``train``.
        origins: source name -> where a column no file holds gets its values (partition
            folders whose value is not an integer, :func:`_hive_origin`): a type error on it
            says that instead of naming a column type.

    Returns:
        ``(mapping, notes)``: canonical -> source for every column found (``entropy`` maps
        to whichever entropy is used), and human-readable notes on the choices made.

    Raises:
        SchemaError: unknown canonical name or framework, an override naming a missing
            column or a column another override already takes, a required column missing
            (the message lists the columns that exist, any ambiguous column that could be
            mapped, and what an override or the framework took), two candidates for one
            column, or an alias of the wrong type.
    """
    overrides = dict(overrides or {})
    notes: list[str] = []
    taken_by: dict[str, str] = {}  # source -> the canonical column an override maps it to
    for canon, src in overrides.items():
        if canon not in S.BY_NAME:
            raise SchemaError(
                f"--column {canon}={src}: '{canon}' is not a canonical column; "
                f"known: {', '.join(S.CANONICAL)}."
            )
        if src not in available:
            raise SchemaError(
                f"--column {canon}={src}: the input has no column '{src}'; "
                f"columns: {', '.join(sorted(available))}."
            )
        if src in taken_by:
            raise SchemaError(
                f"--column {taken_by[src]}={src} and --column {canon}={src} map one source "
                f"column to two canonical columns; give {canon} its own column."
            )
        taken_by[src] = canon
    fw: dict[str, str] = {}
    foreign: dict[str, tuple[str, ...]] = {}
    key = None
    if framework is not None:
        key = framework.lower().replace("_", "-")
        if key not in S.FRAMEWORKS:
            raise SchemaError(
                f"unknown framework '{framework}'; known: {', '.join(sorted(S.FRAMEWORKS))}."
            )
        fw = S.FRAMEWORKS[key]
        foreign = S.foreign_names(key)
    if entropy not in ENTROPY_CHOICES:
        raise SchemaError(f"--entropy must be one of {', '.join(ENTROPY_CHOICES)}, not '{entropy}'.")

    mapping: dict[str, str] = {}
    used: set[str] = set(overrides.values())
    #: canonical -> present candidates that an override took (for the missing-column message)
    lost: dict[str, list[str]] = {}
    #: canonical -> present candidates skipped as another framework's names
    skipped: dict[str, list[str]] = {}
    # a name known to no column as spelled but as a known name in another case ('Entropy',
    # 'SEQ_ID'): a candidate in place of that name when it is the only such column and no
    # known name is spelled so
    known = {n for c in S.COLUMNS for n in (c.name, *c.aliases)} | {
        n for p in S.FRAMEWORKS.values() for n in p.values()}
    by_lower: dict[str, list[str]] = {}
    for name in available:
        if name not in known:
            by_lower.setdefault(name.lower(), []).append(name)
    case_matched: set[str] = set()
    #: the known name each case variant in use spells (``Old_Log_Probs`` -> old_log_probs)
    spelled_as: dict[str, str] = {}
    #: canonical -> why no case variant was used (two of them spell one of its names)
    case_clash: dict[str, str] = {}
    for col in S.COLUMNS:
        canon = col.name
        if canon in overrides:
            src = overrides[canon]
            t = _value_type(available[src])
            if not _kind_ok(col.kind, t):
                raise _wrong_type(src, canon, available[src], (origins or {}).get(src),
                                  mapped=True)
            mapping[canon] = src
            continue
        # candidates by their known spelling; ``real``: the column that holds one (itself,
        # or the only column spelling it in another case)
        candidates: list[str] = []
        real: dict[str, str] = {}
        for src in (fw.get(canon), canon, *col.aliases):
            if src is None or src in candidates:
                continue
            candidates.append(src)
            if src in available:
                real[src] = src
            elif src not in overrides.values():
                alt = by_lower.get(src.lower(), [])
                if len(alt) == 1:
                    real[src] = alt[0]
                    case_matched.add(alt[0])
                    spelled_as[alt[0]] = src
                elif alt:
                    case_clash[canon] = (f"{', '.join(repr(a) for a in sorted(alt))} match "
                                         f"'{src}' ignoring case; none is used: map one "
                                         f"with --column {canon}=NAME")
                    notes.append(f"{canon}: {case_clash[canon]}")
        usable: list[str] = []
        own: str | None = None  # the real column of the framework's own name
        for name in candidates:  # (the framework rules read the known spelling)
            if name not in real:
                continue
            src = real[name]
            if name in fw.values() and name != fw.get(canon):  # the framework's other column
                continue
            if name in foreign and name != fw.get(canon) and S.users_of(name, canon):
                skipped.setdefault(canon, []).append(src)
                continue
            if src in used:
                if src in taken_by:
                    lost.setdefault(canon, []).append(src)
                continue
            ok = _kind_ok(col.kind, _value_type(available[src]))
            if not ok:
                if name == canon or name == fw.get(canon) or col.required:
                    raise _wrong_type(src, canon, available[src], (origins or {}).get(src))
                notes.append(f"'{src}' not used as {canon}: type {_type_name(available[src])}")
                continue
            if name == fw.get(canon):
                own = src
            usable.append(src)
        for src in skipped.get(canon, []):
            notes.append(f"'{src}' not used as {canon} (--framework {key}): "
                         f"{_whose(src, canon, foreign, spelled_as.get(src))}; map it with "
                         f"--column {canon}={src}")
        for src in lost.get(canon, []):
            if usable or canon not in _STRUCTURAL_COLUMNS:
                notes.append(f"{canon}: '{src}' is taken by --column {taken_by[src]}={src}")
            else:  # e.g. --column seq_id=position: no position column is read at all
                notes.append(
                    f"warning: {canon}: '{src}' is taken by --column {taken_by[src]}={src}, "
                    f"so the input is read without a {canon} column "
                    f"({_STRUCTURAL_COLUMNS[canon]}): check that mapping, "
                    f"{taken_by[src]} usually has a column of its own")
        if not usable or (canon == "entropy" and entropy == "train"):  # not used: no choice
            continue
        if len(usable) > 1 and usable[0] != own:
            _refuse_ambiguous(canon, usable)
        src = usable[0]
        mapping[canon] = src
        used.add(src)
        if src != canon:
            spelled = next(n for n, r in real.items() if r == src)
            uses = S.other_uses(spelled, canon) if src != own else ()
            notes.append(f"{canon} <- '{src}'" + (
                " (its name matched ignoring case)" if src in case_matched else "") + "".join(
                f" (--framework {k} would read it as {c}: name the framework if the dump "
                f"is {k}'s)" for k, c in uses))
            notes += _key_read_as_other(canon, src, uses, available)
        if len(usable) > 1:  # the framework's own name decided
            notes.append(f"{canon}: using '{src}' (--framework {key}); also present and not "
                         "used: " + ", ".join(f"'{a}'" for a in usable[1:]))

    # which entropy is used
    if entropy == "train":
        if "train_entropy" not in mapping and "entropy" in overrides:
            # --column entropy=X took the trainer's own column: X is the trainer's entropy
            mapping["train_entropy"] = overrides["entropy"]
        if "train_entropy" not in mapping:
            raise SchemaError(
                "--entropy train: no trainer-side entropy column (train_entropy) found; "
                f"columns: {', '.join(sorted(available))}."
            )
        if "entropy" in overrides and overrides["entropy"] != mapping["train_entropy"]:
            raise SchemaError(
                f"--entropy train reads the trainer-side entropy ('{mapping['train_entropy']}'"
                f"), but --column entropy={overrides['entropy']} names another column as the "
                "entropy: drop one of the two (to use that column as the trainer's entropy, "
                f"give --column train_entropy={overrides['entropy']} with --entropy train).")
        mapping["entropy"] = mapping["train_entropy"]
        notes.append("entropy: trainer-side (--entropy train)")
    elif entropy == "infer" and "entropy" not in mapping:
        raise SchemaError(
            "--entropy infer: no inference-side entropy column found; "
            f"columns: {', '.join(sorted(available))}."
        )
    elif "entropy" not in mapping and "train_entropy" in mapping:
        mapping["entropy"] = mapping["train_entropy"]
        notes.append("entropy: no inference-side entropy; using the trainer-side entropy")
    notes += _near_miss_names(available, mapping, overrides)

    missing = [c for c in S.REQUIRED if c not in mapping]
    if missing:
        why = ""
        for c in missing:
            for src in lost.get(c, []):
                why += (f" --column {taken_by[src]}={src} takes '{src}', the column {c} is "
                        f"otherwise read from, so {c} has no source left: map it too "
                        f"(--column {c}=NAME), or map {taken_by[src]} to another column.")
            for src in skipped.get(c, []):
                why += f" {_whose(src, c, foreign, spelled_as.get(src))}"
                why += f" ({key}'s is '{fw[c]}')" if c in fw else f", not {key}'s"
                why += f": map it with --column {c}={src}"
                users = S.users_of(spelled_as.get(src, src), c)
                why += (f" (or, if the dump is {users[0]}'s, use --framework "
                        f"{users[0]})." if users else ".")
            if c in case_clash:  # several columns spell one of its names in other cases
                why += f" {case_clash[c][:1].upper()}{case_clash[c][1:]}."
        amb = [a for a in S.AMBIGUOUS if a in available and a not in used]
        hint = ""
        if amb:
            hint = " " + " ".join(
                f"Column '{a}' is ambiguous ({S.AMBIGUOUS[a]}): map it explicitly, e.g. "
                f"--column {missing[0]}={a}, or name the framework with --framework."
                for a in amb
            )
        odd = [a for a in available if not (a.isascii() and a.isprintable())]
        raise SchemaError(
            f"missing required column(s) {', '.join(missing)}.{why} The input has columns: "
            f"{', '.join(_shown_name(a) for a in sorted(available))}."
            + (f" (names with characters outside printable ASCII are shown escaped: "
               f"{_odd_chars(odd)}.)" if odd else "")
            + ("" if why else " Map yours with --column CANONICAL=SOURCE (e.g. --column "
               f"{missing[0]}=" + ("my_rollout_logp" if missing[0] == "infer_logprob"
                                   else "my_trainer_logp") + ") or pick --framework "
               f"({', '.join(sorted(S.FRAMEWORKS))}).")
            + hint
        )
    return mapping, notes


def _near_miss_names(available: Iterable[str], mapping: Mapping[str, str],
                     overrides: Mapping[str, str]) -> list[str]:
    """``warning:`` notes for input columns no canonical column reads whose name, without
    its characters outside printable ASCII (a zero-width space, a no-break space), is a
    canonical column's name or alias while that column is unmapped or read from another
    column (the entropy from the trainer's): helper-49's 'entropy' + U+200B was replaced
    by train_entropy with a note only."""
    used = set(mapping.values()) | set(overrides.values())
    out = []
    for name in sorted(available):
        if name in used or (name.isascii() and name.isprintable()):
            continue
        bare = re.sub(r"[^\x21-\x7e]", "", name).casefold()
        for col in S.COLUMNS:
            if col.name in overrides or (col.name in mapping and (
                    col.name != "entropy" or mapping["entropy"] != mapping.get("train_entropy"))):
                continue
            if bare in (col.name, *(a.casefold() for a in col.aliases)):
                out.append(
                    f"warning: column {_shown_name(name)} is not read: without its characters "
                    f"outside printable ASCII ({_odd_chars([name])}) it is named as "
                    f"{col.name} is, which "
                    + ("is read from the trainer-side entropy instead"
                       if col.name == "entropy" and "entropy" in mapping else "has no column")
                    + f"; rename it in the dump, or map it with --column {col.name}=NAME")
                break
    return out


def _shown_name(name: str) -> str:
    """A column name as an error message shows it: as it is when printable ASCII, else
    with the other characters escaped (``'infer_l\\u043egprob\\u200b'``): a zero-width
    space or a look-alike letter makes a name print like the one the loader looks for
    (helper-48)."""
    if name.isascii() and name.isprintable():
        return name
    return f"'{_escaped(name)}'"


def _escaped(text: str) -> str:
    """``text`` with its characters outside printable ASCII escaped (``\\u200b``)."""
    return text.encode("unicode_escape").decode("ascii")


def _odd_chars(names: Sequence[str], most: int = 4) -> str:
    """The characters outside printable ASCII in ``names``, escaped with their Unicode
    names (``\\u200b ZERO WIDTH SPACE``), at most ``most`` of them."""
    import unicodedata

    odd = list(dict.fromkeys(c for n in names for c in n
                             if not (c.isascii() and c.isprintable())))
    return ", ".join(f"{_escaped(c)} "
                     f"{unicodedata.name(c, 'unnamed')}" for c in odd[:most]) + (
        f" and {len(odd) - most:,} more" if len(odd) > most else "")


def _wrong_type(src: str, canon: str, typ: pa.DataType, origin: str | None, *,
                mapped: bool = False) -> SchemaError:
    """Source column ``src`` cannot hold ``canon``; ``origin``: where its values come from
    when no file holds it (partition folders, :func:`_hive_origin`)."""
    need = S.KIND_WORDS[S.BY_NAME[canon].kind]
    what = f"column '{src}' mapped to {canon}" if mapped else f"column '{src}' ({canon})"
    if origin is not None:
        return SchemaError(
            f"{what} comes from {origin}; {canon} needs {need} values: name the folders "
            f"{src}=<integer> (e.g. {src}=3) or move the files out of them."
        )
    text = _is_text(_value_type(typ))
    kind = S.BY_NAME[canon].kind
    hint = ("" if not text else
            " Text is not read as numbers: write the column as booleans or 0/1 (strings such "
            "as 'True' / 'False' or 'true' / 'false': df[c] = df[c].str.lower() == 'true')"
            if kind == S.BOOL else
            " Text is not read as numbers: write the column as integers (strings such as '3' "
            "or 'global_step_3': df[c] = df[c].str.extract(r'(\\d+)$', expand=False).astype(int))"
            if kind == S.INT else
            " Text is not read as numbers: write the column as floats (float32 or float64)"
            if kind == S.FLOAT else "")
    err = SchemaError(f"{what} has type {_type_name(typ)}; {canon} needs {need} values."
                      + (hint + "." if hint else ""))
    err.wrong_type = (src, typ)  # (for load_dataset to name the files holding it)
    return err


def _files_of_type(e: SchemaError, file_list: Sequence[Path],
                   schemas: Mapping[Path, pa.Schema]) -> str | None:
    """A wrong-type refusal (:func:`_wrong_type`) of several files, naming the files whose
    column has that type and the type the others have (``a.parquet: column 'x' (..) has
    type large_string; ... (other files have int64).``); None for another error or when
    every file holding the column has that type."""
    src, typ = getattr(e, "wrong_type", (None, None))
    holding = [f for f in file_list if src is not None and src in schemas[f].names]
    bad = [f for f in holding if schemas[f].field(src).type == typ]
    others = list(dict.fromkeys(_type_name(schemas[f].field(src).type)
                                for f in holding if f not in bad))
    if not bad or not others:
        return None
    more = f" (and {len(bad) - 1:,} more file(s))" if len(bad) > 1 else ""
    head, sep, hint = str(e).partition(" values.")  # (the others' type beside the need)
    if not sep:
        return f"{bad[0]}{more}: {str(e).rstrip('.')} (other files have {', '.join(others)})."
    return (f"{bad[0]}{more}: {head} values (other files have {', '.join(others)})."
            f"{hint}")


def _names_split(files: Sequence[Path], schemas: Mapping[Path, pa.Schema]) -> str:
    """``"the input's files name their columns differently: step is 'step' in a.parquet
    and 'global_steps' in b.parquet (3 files) ..."``: for the canonical columns whose names
    (canonical, aliases, framework presets' names) differ between files, no file holding
    two of them (e.g. shards dumped by two versions of a trainer); ``""`` when none."""
    splits = []
    for col in S.COLUMNS:
        names = {col.name, *col.aliases, *(p[col.name] for p in S.FRAMEWORKS.values()
                                           if col.name in p)}
        lower = {n.lower() for n in names}  # (a name in another case: 'SEQ_ID')
        groups: dict[frozenset[str], list[Path]] = {}
        for f in files:
            held = frozenset(n for n in schemas[f].names if n.lower() in lower)
            if held:
                groups.setdefault(held, []).append(f)
        if len(groups) > 1 and all(len(g) == 1 for g in groups) and len(
                set().union(*groups)) == len(groups):
            splits.append((col.name, groups))
    if not splits:
        return ""
    canon, groups = splits[0]
    where = " and ".join(
        f"'{next(iter(held))}' in {fs[0]}" + (f" ({len(fs):,} files)" if len(fs) > 1 else "")
        for held, fs in groups.items())
    more = (f" (likewise {_or_list([c for c, _ in splits[1:]], 'and')})"
            if len(splits) > 1 else "")
    return (f"the input's files name their columns differently: {canon} is {where}{more}; "
            "the files of one input must share their column names: rename one set, or "
            "analyse each set on its own.")


def _hive_origin(key: str, files: Sequence[Path]) -> str:
    """``the partition folder /x/step=abc (1 file; 3 files in 2 folders in all) whose value
    'abc' is not an integer``: where the values of partition key ``key`` come from, for
    ``files``, those under a folder ``key=VALUE`` whose value is not an integer."""
    folders: dict[Path, int] = {}
    for f in files:
        d = next(p for p in f.parents if _HIVE_SEGMENT.match(p.name)
                 and p.name.split("=", 1)[0] == key)
        folders[d] = folders.get(d, 0) + 1
    first = next(iter(folders))
    value = first.name.split("=", 1)[1]
    more = (f"; {len(files):,} files in {len(folders):,} such folders in all"
            if len(folders) > 1 else "")
    n = folders[first]
    return (f"the partition folder {first} ({n:,} file{'s' if n > 1 else ''}{more}) whose value "
            f"'{value}' is not an integer")


def _refuse_ambiguous(canon: str, usable: Sequence[str]) -> None:
    """Two or more present source columns could each be ``canon``: never guess."""
    names = " and ".join(f"'{s}'" for s in usable) if len(usable) == 2 else \
        ", ".join(f"'{s}'" for s in usable)
    fws = [f"--framework {_or_list(S.users_of(s, canon))} reads '{s}'"
           for s in usable if S.users_of(s, canon)]
    fws += [f"--framework {k} reads '{s}' as {c}" for s in usable
            for k, c in S.other_uses(s, canon)]
    err = SchemaError(
        f"ambiguous column {canon}: the input has {len(usable)} candidate columns, {names}, "
        f"and entr-diag never guesses between them. Choose one with --column {canon}=NAME "
        f"(e.g. --column {canon}={usable[0]})"
        + (f", or name the framework ({'; '.join(fws)})." if fws else ".")
    )
    err.candidates = tuple(usable)  # (the loader says which come from partition folders)
    raise err


# --------------------------------------------------------------------------- dataset


@dataclass(frozen=True)
class Accounting:
    """Token and sequence accounting of an input.

    Token counts are rows of the long (exploded) view. ``excluded`` maps an exclusion
    reason (:data:`~entr_diag.io.schema.EXCLUSION_REASONS`) to the number of loss-masked
    tokens excluded for it; tokens outside the loss mask are ignored, never counted as bad.
    """

    tokens_total: int
    tokens_unmasked: int
    tokens_masked: int
    tokens_valid: int
    excluded: Mapping[str, int]
    #: distinct (step, seq_id) keys of the input (rows without a seq_id are in none)
    sequences_total: int
    sequences_valid: int
    sequences_without_masked_tokens: int
    steps: tuple[int, ...] | None
    policy_versions: tuple[int, int] | None
    train_versions: tuple[int, int] | None
    staleness: Mapping[int, int] | None
    sequences_with_version_switch: int | None
    #: sequences holding more token rows than positions: the same (step, seq_id, position)
    #: appears twice, e.g. one dump copied into two shards (its tokens count twice)
    sequences_with_duplicate_positions: int = 0
    #: valid tokens whose step is null (their sequence is keyed (null, seq_id): apart from
    #: the same seq_id's tokens that have a step, and in no step's row)
    tokens_without_step: int = 0
    #: without a position column: sequence keys whose rows continue from one input file
    #: into a later one (numbered in file order as one sequence); more than the file
    #: boundaries could split means ids repeating across files (per-rank local indices);
    #: 0 when the rows of sequences are interleaved (a writer logging token by token and
    #: rotating its files leaves every sequence in flight continuing)
    sequences_across_files: int = 0
    #: without a position column: valid tokens (entropy >= REPEAT_H_MIN) repeating the row
    #: before them in their sequence exactly (both logprobs and the entropy): rows
    #: written twice, which count twice; and the tokens checked (0 with a position column)
    tokens_repeating_row: int = 0
    #: without a position column: (sequence keys, blocks, rows) of keys whose rows come in
    #: several separate blocks of one batch, other keys' rows between them
    sequences_in_separate_blocks: tuple[int, int, int] = (0, 0, 0)
    tokens_row_checked: int = 0
    #: ... and (rows sampled, of them repeating another sampled row of their sequence
    #: anywhere): 1 in REPEAT_SAMPLE of the checked tokens by hash (a sequence or shard
    #: written twice); (0, 0) with a position column
    repeated_rows_sampled: tuple[int, int] = (0, 0)
    #: per logprob column, valid tokens whose value is within POSITIVE_LOGPROB_TOL of 0
    #: (a near-certain token: its value reads the same negated)
    tokens_near_zero: Mapping[str, int] = field(default_factory=dict)
    #: valid tokens without a staleness though both version columns exist: a null
    #: policy_version or train_version (null, or NaN, fractional or out of the int64 range
    #: in a float column); in no staleness bucket (0 without both columns)
    tokens_without_staleness: int = 0
    #: rows of files without a loss mask taken for tensor padding (nested: leading or
    #: trailing rows whose logprobs and entropy are exactly 0.0 or -1.0,
    #: :func:`_unpadded_range`; long: rows whose entropy is exactly 0.0 and logprobs each
    #: exactly 0.0 or -1.0, :func:`_padding_rows`), counted in ``tokens_unmasked``
    tokens_padding: int = 0
    #: valid tokens whose entropy lies in [-ENTROPY_NEG_TOL, 0) nats (floating-point
    #: rounding of a near-certain distribution): read as 0 in the token frame
    tokens_entropy_below_zero: int = 0
    #: for the exclusion reason the warnings explain (:func:`entr_diag.caveats.hinted_reason`):
    #: reason -> ``{"columns": {canonical logprob column: rows}, "files": {path: rows},
    #: "valid_left": {path: tokens}, "input_files": n}``: which logprob column(s) meet the
    #: reason's condition (the logprob reasons only), in which input files the excluded
    #: rows are, and the valid tokens left in files the reason mostly excludes
    #: (:func:`_excluded_where`)
    excluded_where: Mapping[str, Mapping[str, Any]] | None = None
    #: valid tokens with policy_version > train_version per input file (path -> tokens;
    #: versions swapped in some shards?)
    negative_staleness_files: Mapping[str, int] = field(default_factory=dict)
    #: the sequences of ``sequences_with_duplicate_positions`` per input file holding
    #: their rows (path -> sequences; a sequence copied into two files counts in both;
    #: empty for one input file; beyond 64 input files, each sequence's lowest and highest
    #: file only)
    duplicate_position_files: Mapping[str, int] = field(default_factory=dict)
    #: per exclusion reason, the input files (several) where it excludes 20% or more of
    #: the loss-masked rows: reason -> {path: (rows excluded, loss-masked rows)}
    file_exclusions: Mapping[str, Mapping[str, tuple[int, int]]] = field(
        default_factory=dict)
    #: the input files (several) contributing few or no valid tokens, a tenth of the
    #: others' share at most: path -> {"rows", "valid", "outside_mask", "excluded":
    #: {reason: rows}, "others_share"} (:func:`_starved_files`)
    starved_files: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: valid tokens whose train_logprob equals their infer_logprob exactly (delta == 0)
    tokens_identical: int = 0
    #: per logprob column, (valid tokens exactly -1.0, the most valid tokens at any one of
    #: the control values MINUS_ONE_CONTROLS): :func:`_minus_one_padding`
    minus_one: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    #: the lowest value of each version column over the rows excluded as negative_version
    #: (:func:`_negative_versions`); {} without such rows
    negative_version_min: Mapping[str, int] = field(default_factory=dict)
    #: the input files and steps where train_logprob equals infer_logprob exactly on
    #: IDENTICAL_SHARE (20%) of their valid tokens or more while the rest of the input has
    #: real mismatch
    #: (:func:`_identical_logprobs`); None when none
    identical_logprobs: Mapping[str, Any] | None = None

    def to_dict(self) -> dict:
        return {
            "tokens_total": self.tokens_total,
            "tokens_unmasked": self.tokens_unmasked,
            "tokens_masked": self.tokens_masked,
            "tokens_valid": self.tokens_valid,
            "tokens_excluded": sum(self.excluded.values()),
            "exclusions": {k: int(v) for k, v in self.excluded.items()},
            "sequences_total": self.sequences_total,
            "sequences_valid": self.sequences_valid,
            "sequences_without_masked_tokens": self.sequences_without_masked_tokens,
            "steps": None if self.steps is None else {
                "count": len(self.steps), "min": min(self.steps, default=None),
                "max": max(self.steps, default=None)},
            "policy_versions": None if self.policy_versions is None else list(self.policy_versions),
            "train_versions": None if self.train_versions is None else list(self.train_versions),
            "staleness_tokens": None if self.staleness is None else {
                str(k): int(v) for k, v in sorted(self.staleness.items())},
            "sequences_with_version_switch": self.sequences_with_version_switch,
            "sequences_with_duplicate_positions": self.sequences_with_duplicate_positions,
            "tokens_without_step": self.tokens_without_step,
            "sequences_across_files": self.sequences_across_files,
            "tokens_without_staleness": self.tokens_without_staleness,
            "tokens_repeating_row": self.tokens_repeating_row,
            "sequences_in_separate_blocks": dict(zip(
                ("sequences", "blocks", "rows"), self.sequences_in_separate_blocks,
                strict=True)),
            "repeated_rows_sampled": {"sampled": self.repeated_rows_sampled[0],
                                      "repeating": self.repeated_rows_sampled[1],
                                      "one_in": REPEAT_SAMPLE},
            "tokens_near_zero": dict(self.tokens_near_zero),
            "tokens_padding": self.tokens_padding,
            "tokens_entropy_below_zero": self.tokens_entropy_below_zero,
            "tokens_identical": self.tokens_identical,
            "logprob_minus_one": {c: {"tokens": n, "most_at_a_control": ctrl}
                                  for c, (n, ctrl) in self.minus_one.items()},
            "identical_logprobs": (None if self.identical_logprobs is None
                                   else dict(self.identical_logprobs)),
            **({"negative_staleness_files": dict(self.negative_staleness_files)}
               if self.negative_staleness_files else {}),
            **({"duplicate_position_files": dict(self.duplicate_position_files)}
               if self.duplicate_position_files else {}),
            **({"starved_files": {f: dict(v) for f, v in self.starved_files.items()}}
               if self.starved_files else {}),
            **({"file_exclusions": {
                r: {f: {"excluded": e, "loss_masked": m} for f, (e, m) in fs.items()}
                for r, fs in self.file_exclusions.items()}}
               if self.file_exclusions else {}),
            **({"exclusions_where": {r: {k: dict(v) if isinstance(v, Mapping) else v
                                         for k, v in w.items()}
                                     for r, w in self.excluded_where.items()}}
               if self.excluded_where else {}),
        }


@dataclass(frozen=True)
class Dataset:
    """A loaded input: the lazy frame of valid loss-masked tokens plus how it was made.

    Attributes:
        lf: one row per valid loss-masked token, canonical columns (docs/CONTRACT.md).
        raw: every token row (masked or not) with the canonical columns and ``reason``
            (null for valid loss-masked tokens, ``"unmasked"``, ``"padding"`` (tensor
            padding of a nested file without a loss mask), or an exclusion reason).
        files: the input files with layout and row counts.
        mapping: canonical column -> source column.
        notes: how the mapping was chosen.
        entropy_source: ``"inference"``, ``"trainer"`` or ``None`` (no entropy column).
        accounting: token/sequence counts and exclusions by reason.
        bundled: True when the input is the bundled sample run.
    """

    lf: pl.LazyFrame
    raw: pl.LazyFrame
    files: tuple[FileInfo, ...]
    mapping: Mapping[str, str]
    notes: tuple[str, ...]
    entropy_source: str | None
    accounting: Accounting
    bundled: bool = False
    #: dtype of the input's seq_id (Int64 when every file has integer ids, else String);
    #: ``lf`` exposes seq_id as String, exports cast it back to this dtype
    seq_id_dtype: type[pl.DataType] = pl.String
    #: usable tokens (finite entropy >= 0 and delta) per fine entropy bin
    #: (:func:`entr_diag.aggregate.fine_bin_expr`, length ``N_FINE + 1``), counted by the
    #: accounting scan; None without an entropy column
    entropy_fine_counts: np.ndarray | None = field(default=None, repr=False)
    #: (lowest, highest) step of those tokens; None without a step column or such token
    step_range: tuple[int, int] | None = None
    #: input files left out as unreadable (``skip_unreadable``): (path, why)
    skipped_unreadable: tuple[tuple[str, str], ...] = ()
    #: seq_ids read as local to each file (``seq_id_per_file``): ``"<file path>:<id>"``
    seq_id_per_file: bool = False
    #: why an entropy column of the input is not used, as if absent (a phrase: it holds
    #: only nulls, no valid value for any loss-masked token, or is missing from some
    #: files); None when the input has none or it is used
    entropy_unused: str | None = None
    #: loss-masked tokens whose engine logprob of exactly 0.0 (the trainer's below -0.05
    #: nats) was read as a one-token nucleus of top-p / top-k sampling and kept as valid
    #: (:data:`~entr_diag.io.schema.NUCLEUS_TRAIN_MIN`); 0 when the loader read none so
    nucleus_zeros: int = 0

    def has(self, column: str) -> bool:
        """True when the canonical column ``column`` is present in :attr:`lf`."""
        return column in self.lf_schema

    @functools.cached_property
    def lf_schema(self) -> pl.Schema:
        """The schema of :attr:`lf`, resolved once (over thousands of input files it takes
        50 ms to resolve, and the analyses ask often)."""
        return self.lf.collect_schema()

    def unscored(self) -> pl.LazyFrame | None:
        """The loss-masked tokens excluded as ``invalid_entropy`` (their logprobs valid, their
        entropy null, NaN, infinite or out of range), columns ``seq_key`` and ``delta`` =
        train_logprob - infer_logprob (nats), one row per token; None when there is none.
        A gate that reads no entropy counts them (verl's and slime's sequence ratios and
        veto do): :func:`entr_diag.compare.compare_gates` merges them into the sequence
        gates' statistics. Lazy; reading it scans the input again."""
        if not self.accounting.excluded.get("invalid_entropy"):
            return None
        return (self.raw.filter(pl.col("reason") == "invalid_entropy")
                .select("seq_key", (pl.col("train_logprob") - pl.col("infer_logprob"))
                        .alias("delta")))

    @functools.cached_property
    def raw_schema(self) -> pl.Schema:
        """The schema of :attr:`raw`, resolved once."""
        return self.raw.collect_schema()

    @property
    def layouts(self) -> tuple[str, ...]:
        return tuple(sorted({f.layout for f in self.files}))

    def capabilities(self) -> dict[str, str | None]:
        """Analyses the data allow: name -> None when available, else the reason it is not."""
        caps: dict[str, str | None] = {}
        if self.accounting.tokens_valid == 0:  # nothing is available without a token
            return {k: "no valid loss-masked token" for k in (
                "scaling_law_fit", "entr_gate", "staleness", "version_switches", "per_step",
                "token_tables", "trainer_noise_floor")}
        caps["scaling_law_fit"] = None if self.has("entropy") else "no entropy column"
        caps["entr_gate"] = caps["scaling_law_fit"]
        caps["staleness"] = None if self.has("staleness") else (
            f"{S.missing_versions(self.has)}: staleness analysis unavailable")
        caps["version_switches"] = None if self.has("policy_version") else (
            "no policy_version: in-flight version switches unavailable")
        caps["per_step"] = None if self.has("step") else "no step column: per-step series unavailable"
        caps["token_tables"] = None if self.has("token_id") else "no token_id: worst-token table shows no ids"
        caps["trainer_noise_floor"] = None if self.has("train_logprob_recompute") else (
            "no train_logprob_recompute: trainer self-noise floor unavailable")
        return caps

    def describe(self) -> dict:
        """Plain-dict description for JSON/HTML (files, layout, mapping, accounting)."""
        return {
            "files": [
                {"path": str(f.path), "layout": f.layout, "rows": f.rows} for f in self.files
            ],
            "bundled_sample": self.bundled,
            # (paths are as given: relative ones were read from here; helper-44)
            "working_directory": os.getcwd(),
            "skipped_unreadable": [{"path": p, "reason": why}
                                   for p, why in self.skipped_unreadable],
            "layout": "+".join(self.layouts),
            "mapping": dict(self.mapping),
            # the input files' columns no canonical column reads (a mask, an id the
            # heuristics did not recognise: --column maps them)
            "unused_columns": sorted({c for f in self.files for c in f.columns}
                                     - set(self.mapping.values())),
            "mapping_notes": list(self.notes),
            "entropy_source": self.entropy_source,
            "accounting": self.accounting.to_dict(),
            "capabilities": self.capabilities(),
        }


def load_dataset(
    paths: str | Path | Sequence[str | Path] | None = None,
    *,
    columns: Mapping[str, str] | None = None,
    framework: str | None = None,
    layout: str = "auto",
    entropy: str = "auto",
    skip_unreadable: bool = False,
    seq_id_per_file: bool = False,
    _unusable_entropy: tuple[str, ...] = (),
    _nucleus_zeros: bool | pl.Series = False,
    _minus_one: tuple[str, ...] = (),
    _versions_below_zero: bool = False,
) -> Dataset:
    """Scan Parquet inputs lazily into a validated canonical token frame.

    Args:
        paths: files, directories (searched recursively) or globs (one path or a
            sequence of them); ``None`` uses the bundled sample run (an empty sequence is
            an error, not the sample).
        columns: ``canonical -> source`` overrides (``--column``).
        framework: name a framework's column naming (``--framework``).
        layout: ``auto`` (per file: nested when the logprob columns are lists), ``long`` or
            ``nested``.
        entropy: ``auto``, ``infer`` or ``train`` (which entropy column to use).
        skip_unreadable: leave out the input files that cannot be read as Parquet (no
            valid footer: truncated by a killed writer, empty, another format, several
            columns of one name) instead of refusing the input; they are listed in
            :attr:`Dataset.skipped_unreadable` with the reason and in a warning note. An
            input left without a readable file is still refused. A file whose footer
            reads but whose pages are damaged fails later, during a pass, either way.
        seq_id_per_file: the seq_ids are local to each input file (per-rank or per-shard
            indices restarting in each file): a sequence is keyed by (file, step, seq_id),
            its seq_id read as ``"<file path>:<seq_id>"`` (the path as the input named it,
            as the ``file`` column of the outputs spells it), so equal ids in two files
            never merge (nor continue from one file into the next without a position
            column).

    Returns:
        A :class:`Dataset`; one accounting pass over the input has been made (two when
        the entropy column chosen automatically holds no valid value for any loss-masked
        token: NaN, null, negative or above 20 nats, so that every token was excluded as
        ``invalid_entropy``; it is then not used, as if absent, with a warning note: the
        trainer-side entropy takes its place when it exists, else the input has none).

    Raises:
        InputError, SchemaError: see the module docstring.
        TypeError: ``paths`` is neither a path nor an iterable of paths (e.g. a DataFrame).
    """
    if isinstance(paths, (str, os.PathLike)):  # one path (not its characters)
        paths = [paths]
    elif paths is not None:
        given: object = paths
        if isinstance(paths, Iterable) and not isinstance(paths, pl.DataFrame | pl.LazyFrame):
            paths = list(paths)
            given = next((p for p in paths if not isinstance(p, (str, os.PathLike))), None)
        if given is not None:
            from entr_diag.frames import _given

            raise TypeError(
                "load_dataset: expected a path or a list of paths (str or pathlib.Path) to "
                f"Parquet files or folders, got {_given(given)}; a polars frame already in "
                "memory goes to the analysis functions directly (or write it with "
                ".write_parquet first).")
    bundled = paths is None
    if bundled:
        paths = [bundled_sample_path()]
    elif not paths:  # e.g. a glob.glob() that matched nothing: never the sample instead
        raise InputError("no input path given (an empty list of paths); pass None for the "
                         "bundled sample run.")
    if layout not in LAYOUTS:
        raise InputError(f"--layout must be one of {', '.join(LAYOUTS)}, not '{layout}'.")
    walked: set[Path] = set()
    file_list = resolve_paths(list(paths), walked=walked)  # type: ignore[arg-type]
    schemas: dict[Path, pa.Schema] = {}
    rows: dict[Path, int] = {}
    metas: dict[Path, pq.FileMetaData] = {}
    ours: list[Path] = []  # entr-diag's own outputs found by a directory walk: skipped
    unreadable: list[tuple[str, str]] = []  # (file, why) left out with skip_unreadable
    for f in list(file_list):
        try:
            schemas[f], metas[f] = _read_footer(f)
        except InputError as e:
            if not skip_unreadable:
                if len(file_list) > 1:  # one bad shard among many: say how to go on
                    raise InputError(f"{e} (--skip-unreadable leaves out the input files "
                                     "that cannot be read, with a warning)") from None
                raise
            unreadable.append((str(f), str(e)))
            file_list.remove(f)
            schemas.pop(f, None)
            metas.pop(f, None)
            continue
        if f in walked and OUTPUT_MARK.encode() in (metas[f].metadata or {}):
            ours.append(f)
            file_list.remove(f)
            del schemas[f], metas[f]
            continue
        rows[f] = metas[f].num_rows
    if unreadable and not file_list:
        raise InputError(
            f"no input file can be read as Parquet ({len(unreadable):,} left out by "
            f"--skip-unreadable), e.g. {unreadable[0][1]}")
    if ours and not file_list:
        raise InputError(
            f"the input holds only {len(ours)} file(s) written by entr-diag (flag or compare "
            f"--export outputs, e.g. {ours[0]}), skipped in directory searches: name them "
            "explicitly to read them.")

    # union of available columns (a partition key counts as an integer column when every
    # folder's value is an integer (or null), else as a string column)
    not_int: dict[str, list[Path]] = {}  # partition key -> files below a non-integer value
    for f in file_list:
        for k, v in _hive_values(f).items():
            if v != _HIVE_NULL and not _int_like(v):
                not_int.setdefault(k, []).append(f)
    file_columns = {n for f in file_list for n in schemas[f].names}
    available: dict[str, pa.DataType] = {}
    for f in file_list:
        for name, typ in zip(schemas[f].names, schemas[f].types, strict=True):
            prev = available.get(name)
            if prev is None or (_is_list(typ) and not _is_list(prev)) or (
                    _null_typed(prev) and not _null_typed(typ)):  # (another file's values)
                available[name] = typ
        for k, v in _hive_values(f).items():
            if v != _HIVE_NULL:  # a null value: typed by the other folders
                available.setdefault(k, pa.string() if k in not_int else pa.int64())
    for f in file_list:  # partition keys whose every value is null
        for k in _hive_values(f):
            available.setdefault(k, pa.string())
    agreeing = _agreeing_partitions(file_list, metas, file_columns, columns or {})
    for k in agreeing:  # say the same as a column of the files: that column is read
        del available[k]
    try:
        mapping, notes = resolve_mapping(
            available, overrides=columns, framework=framework, entropy=entropy,
            origins={k: _hive_origin(k, fs) for k, fs in not_int.items()
                     if k not in file_columns})
    except SchemaError as e:
        if len(file_list) == 1 and not str(e).startswith(("--", "unknown framework")):
            raise SchemaError(f"{file_list[0]}: {e}") from None  # one file's columns: name it
        split = _names_split(file_list, schemas)
        if split:  # the real cause: shards spelling a column differently
            raise SchemaError(f"{split} (Stopped at: {e})") from None
        typed = _files_of_type(e, file_list, schemas)
        if typed:  # the first file's type, unlike the others': name the file
            raise SchemaError(typed) from None
        folder = _folder_vs_column(getattr(e, "candidates", ()), file_list, metas,
                                   file_columns)
        if folder:
            raise SchemaError(f"{e} {folder}") from None
        raise
    if "loss_mask" not in mapping:
        notes += _unmapped_masks(available, mapping, lambda c: [
            rng for f in file_list if (rng := _stat_range(metas[f], c)) is not None])
    cu_src = mapping.get("cu_seqlens")
    if cu_src is not None and not any(  # packed rows: list columns of a nested file
            cu_src in schemas[f].names and _is_list(schemas[f].field(cu_src).type)
            and mapping["train_logprob"] in schemas[f].names
            and _is_list(schemas[f].field(mapping["train_logprob"]).type) for f in file_list):
        notes.append(f"cu_seqlens ('{cu_src}') not used: it splits the packed rows of nested "
                     "files (one list per row), and no input file holds such rows")
        del mapping["cu_seqlens"]
    if mapping.get("step") == "step" and any(  # the step from verl-style folder names
            "step" not in schemas[f].names and "step" in _hive_values(Path(f))
            and any(_STEP_FOLDER.match(part) for part in Path(f).parent.parts)
            for f in file_list):
        nested = [f for f in file_list if len({m.group(1) for part in Path(f).parent.parts
                                                if (m := _STEP_FOLDER.match(part))}) > 1]
        notes.append("step <- the folder names (global_step_N, step_N or step-N, read as "
                     "the partition step=N)"
                     + (f"; {len(nested):,} file(s) lie under several such folders with "
                        f"different numbers (e.g. {nested[0]}): the innermost is read"
                        if nested else ""))
    for k, c in agreeing.items():
        if c in mapping.values():
            notes.append(f"the partition folders {k}=... agree with the files' '{c}' column "
                         f"in every file: '{c}' is read")
    if mapping.get("entropy") in _unusable_entropy:  # a second load (see the end)
        notes = [n for n in notes if n != f"entropy <- '{mapping['entropy']}'"]
        train = mapping.get("train_entropy")
        if train and train not in _unusable_entropy and not all(
                _only_nulls(metas[f], train, schemas[f]) for f in file_list):
            mapping["entropy"] = train
        else:
            del mapping["entropy"]
    if mapping.get("train_entropy") in _unusable_entropy:
        del mapping["train_entropy"]
    if unreadable:
        notes.append(
            f"warning: {len(unreadable):,} input file(s) left out, unreadable as Parquet "
            f"(--skip-unreadable): {unreadable[0][1]}"
            + (f" ({len(unreadable) - 1:,} more: inputs.skipped_unreadable in the JSON)"
               if len(unreadable) > 1 else "")
            + " Their tokens are not in the results.")
    copies = _copies(file_list, rows, schemas, mapping)
    if copies:
        a, b = copies[0]
        notes.append(
            f"warning: {a} and {b} look like copies of each other (same size, rows and first "
            f"and last 64 kB): their tokens count twice; pass one of them"
            + (f" ({len(copies) - 1:,} more pair(s) like this)" if len(copies) > 1 else ""))
    tl_src = mapping["train_logprob"]
    unnamed = [f for f in file_list if tl_src in schemas[f].names
               and _is_list(schemas[f].field(tl_src).type)
               and mapping.get("seq_id") not in set(schemas[f].names) | set(_hive_values(f))]
    rewritten = _rewritten_copies(unnamed, mapping["train_logprob"], {b for _a, b in copies})
    if rewritten:
        a, b, k, n = rewritten[0]
        notes.append(
            f"warning: {b} repeats the rows of {a} ({k:,} of its {n:,} rows have their "
            f"{mapping['train_logprob']} list there too, though the files differ in "
            "bytes: a shard written twice?): without a seq_id column their sequences are "
            "named file:row, so their tokens count twice; pass one of them"
            + (f" ({len(rewritten) - 1:,} more pair(s) like this)" if len(rewritten) > 1
               else ""))
    if ours:
        notes.append(f"skipped {len(ours)} file(s) written by entr-diag (flag or compare "
                     f"--export outputs) found in input directories, e.g. {ours[0]}: name "
                     "them explicitly to read them")

    # optional columns must be present in every file, required ones in every file
    infos: list[FileInfo] = []
    conflicts: list[str] = []  # partition values contradicted by the file's own column
    # per file: (path, types, hive values, layout, scan, chunk row ranges, numbered)
    plans: list[tuple[Path, dict, dict, str, pl.LazyFrame, list, bool]] = []
    scalar_positions: list[Path] = []  # nested files whose position is not a list
    for f in file_list:
        names = set(schemas[f].names) | set(_hive_values(f))
        missing_req = [c for c in S.REQUIRED if mapping[c] not in names]
        if missing_req:
            split = _names_split(file_list, schemas)
            if split:  # shards spelling a column differently (in another case, too)
                raise SchemaError(split)
            raise SchemaError(
                f"{f}: missing required column(s) "
                + ", ".join(f"{c} ('{mapping[c]}')" for c in missing_req)
                + f" that other inputs have; this file has: {', '.join(sorted(names))}."
            )  # (a file without any column is refused as such by _read_footer)
    has_names = {f: set(schemas[f].names) | set(_hive_values(f)) for f in file_list}
    entropy_unused: str | None = None  # (Dataset.entropy_unused)
    for canon in list(mapping):
        src = mapping[canon]
        lacking = [f for f in file_list if src not in has_names[f]]
        if lacking and canon == "loss_mask":
            # a file without a loss mask trains on every token: all true for that file only
            notes.append(
                f"loss_mask ('{src}') is missing from {len(lacking)} of {len(file_list)} files "
                f"(e.g. {lacking[0]}): every token of those files counts as loss-masked"
            )
        elif lacking and canon in ("seq_id", "position") and all(
                _is_list(schemas[f].field(mapping["train_logprob"]).type)
                for f in lacking if mapping["train_logprob"] in schemas[f].names):
            # nested files name their rows file:row and number tokens by list index; the
            # other files keep their column
            how = "sequences are named file:row" if canon == "seq_id" else \
                "tokens are numbered by list index"
            notes.append(
                f"{canon} ('{src}') is missing from {len(lacking)} of {len(file_list)} files, "
                f"all nested (e.g. {lacking[0]}): their {how}")
        elif lacking and any(n.lower() == src.lower() and n != src
                             for f in lacking for n in has_names[f]):
            # the files spell it in two cases ('seq_id', 'SEQ_ID'): not a missing column
            cased = next(n for f in lacking for n in has_names[f]
                         if n.lower() == src.lower() and n != src)
            raise SchemaError(_names_split(file_list, schemas) or (
                f"the input's files name their columns differently: {canon} is '{src}' in "
                f"{next(f for f in file_list if f not in lacking)} and '{cased}' in "
                f"{lacking[0]}; the files of one input must share their column names: rename "
                "one set, or analyse each set on its own."))
        elif lacking:
            # (the entropy's a warning: without it every other command refuses the input,
            # and --quiet hid the note in inspect; helper-48)
            notes.append(
                ("warning: " if canon == "entropy" else "")
                + f"{canon} ('{src}') is missing from {len(lacking)} of {len(file_list)} files "
                f"(e.g. {lacking[0]}): not used"
                + (" in any file: the scaling law, its noise regime and the ENTR gate would "
                   "be unavailable, so fit, flag, compare and report refuse the input; pass "
                   "only the files that have it" if canon == "entropy" else "")
            )
            if canon == "entropy":
                entropy_unused = (f"the entropy column ('{src}') is missing from "
                                  f"{len(lacking)} of {len(file_list)} files")
            del mapping[canon]
    # a nested file's entropy holding one value per row (a per-sequence mean, as some dumps
    # store it) would be copied to every token of the row: no token's entropy, not used
    per_row_entropy = False
    for canon in ("entropy", "train_entropy"):
        src = mapping.get(canon)
        flat = [f for f in file_list if src in schemas[f].names
                and mapping["train_logprob"] in schemas[f].names
                and _is_list(schemas[f].field(mapping["train_logprob"]).type)
                and not _is_list(schemas[f].field(src).type)
                and not _null_typed(schemas[f].field(src).type)]  # (no value: said below)
        if src and flat:
            notes.append(
                f"warning: {canon} ('{src}') holds one value per row, not a list of one per "
                f"token, in {len(flat):,} nested file(s) (e.g. {flat[0]}): a per-sequence "
                "value (a mean?) is no token's entropy, so it is not used (as if absent); "
                "map a per-token entropy list with --column entropy=NAME")
            if canon == "entropy":
                per_row_entropy = True
                entropy_unused = (f"the entropy column ('{src}') holds one value per "
                                  "sequence row, not per token")
            del mapping[canon]
    if per_row_entropy and "train_entropy" in mapping and entropy == "auto":
        mapping["entropy"] = mapping["train_entropy"]  # (as without the column)
        entropy_unused = None
        notes.append(f"entropy: using the trainer-side entropy ('{mapping['entropy']}')")
    for canon in ("step", "policy_version", "train_version"):  # written, never filled
        src = mapping.get(canon)
        if src and all(_only_nulls(metas[f], src, schemas[f]) for f in file_list):
            notes.append(f"{canon}{'' if src == canon else f' ({src!r})'} holds only nulls "
                         "in every file: not used (as if absent)")
            del mapping[canon]
    train = mapping.get("train_entropy")
    if train and train != mapping.get("entropy") \
            and all(_only_nulls(metas[f], train, schemas[f]) for f in file_list):
        # nothing to fall back on, nor to offer (--entropy train)
        notes.append(f"train_entropy ('{train}') holds only nulls in every file: not used "
                     "(as if absent)")
        del mapping["train_entropy"]
    src = mapping.get("entropy")  # an engine that writes the column but fills it with nulls
    train = mapping.get("train_entropy")
    if src and src != train and entropy == "auto" and train \
            and all(_only_nulls(metas[f], src, schemas[f]) for f in file_list):
        # as if absent: the trainer-side entropy is used, as without the column
        if f"entropy <- '{src}'" in notes:
            notes.remove(f"entropy <- '{src}'")
        notes.append(f"entropy: the inference-side entropy ('{src}') holds only nulls in every "
                     f"file, as if absent: using the trainer-side entropy ('{train}')")
        mapping["entropy"] = src = train
    if src and all(_only_nulls(metas[f], src, schemas[f]) for f in file_list):
        notes.append(f"entropy ('{src}') holds only nulls in every file: not used (as if "
                     "absent)")
        entropy_unused = f"the entropy column ('{src}') holds only nulls"
        del mapping["entropy"]
    null_typed: dict[str, str] = {}  # canonical column -> what holds no value
    for canon, src in list(mapping.items()):  # Arrow's null type in every file holding it
        holding = [f for f in file_list if src in schemas[f].names]
        if not holding or not all(_null_typed(schemas[f].field(src).type) for f in holding):
            continue
        what = f"{canon}{'' if src == canon else f' ({src!r})'}"
        if S.BY_NAME[canon].required:
            raise SchemaError(
                f"{holding[0] if len(file_list) == 1 else 'the input'}: {what} holds no value "
                f"in any input file (Arrow type null, as pandas writes a column set to None): "
                f"{canon} is required; map the column that holds it with --column "
                f"{canon}=NAME")
        if canon == "loss_mask":  # (read as nulls: null_loss_mask rows, as a float column's)
            continue
        null_typed[canon] = (f"{what} holds no value in any input file (Arrow type null, as "
                             "pandas writes a column set to None)")
        notes.append(f"{null_typed[canon]}: not used (as if absent)")
        del mapping[canon]
    notes += _float_int_notes(mapping, file_list, schemas)
    for canon in ("train_logprob", "infer_logprob", "entropy"):  # read, but say so
        src = mapping.get(canon)
        ints = _files_typed(file_list, schemas, src, pa.types.is_integer)
        if ints:
            notes.append(
                f"warning: {canon}{'' if src == canon else f' ({src!r})'} holds integers in "
                f"{len(ints)} of "
                f"{len(file_list)} files (e.g. {ints[0]}): log-probabilities and entropies "
                "are real numbers in nats; rounded or scaled values make the statistics "
                "meaningless")

    # seq_id keeps an integer dtype when every file has integer ids (cheap to hash); the
    # String form is derived lazily for output only
    # (UInt64 when some file has uint64 ids and the signed ones hold no negative id, by
    # their statistics: ids above 2^63 fit; a writer upgraded from int64 to uint64 ids)
    sid_types = [dict(zip(schemas[f].names, schemas[f].types, strict=True))
                 .get(mapping.get("seq_id", "")) for f in file_list]
    sid_dtype: type[pl.DataType] = pl.Int64
    # (per-file ids 'file:id'; packed rows: ids 'row id:sequence index')
    if seq_id_per_file or "cu_seqlens" in mapping or any(
            t is None or not (pa.types.is_integer(_value_type(t))
                              or pa.types.is_floating(_value_type(t))) for t in sid_types):
        sid_dtype = pl.String
    elif any(_value_type(t) == pa.uint64() for t in sid_types):  # type: ignore[arg-type]

        def non_negative(f: Path, t: pa.DataType) -> bool:
            if pa.types.is_unsigned_integer(_value_type(t)):
                return True
            rng = _stat_range(metas[f], mapping["seq_id"])
            return rng is not None and rng[0] >= 0

        sid_dtype = (pl.UInt64 if all(non_negative(f, t)  # type: ignore[arg-type]
                                      for f, t in zip(file_list, sid_types, strict=True))
                     else pl.String)
    # (the position column's statistics, read before the footers are freed below)
    pos_ranges = {f: _stat_range(metas[f], mapping["position"]) for f in file_list
                  if "position" in mapping and mapping["position"] in schemas[f].names}
    frames: list[pl.LazyFrame] = []
    pieces: list[tuple[pl.LazyFrame, int, bool, str, _Alike | None]] = []  # (frame, tokens,
    # streamed, source, alike)
    piece_files: list[Path] = []  # the file of each piece
    for f in file_list:
        sch = schemas[f]
        hive = _hive_values(f)
        types = {n: t for n, t in zip(sch.names, sch.types, strict=True)}
        # the mapping was chosen on the union of the files' columns (each with the type of
        # the first file holding it): every file's own types must fit too
        for canon, src in mapping.items():
            if src in types and not _kind_ok(S.BY_NAME[canon].kind, _value_type(types[src])):
                raise SchemaError(
                    f"{f}: column '{src}' ({canon}) has type {_type_name(types[src])}; "
                    f"{canon} needs {S.KIND_WORDS[S.BY_NAME[canon].kind]} values (other files have "
                    f"{_type_name(available[src])})."
                )
        _refuse_unsigned_overflow(f, metas[f], types, mapping)
        tl_type = types.get(mapping["train_logprob"])
        il_type = types.get(mapping["infer_logprob"])
        nested = tl_type is not None and _is_list(tl_type)
        if tl_type is not None and il_type is not None and _is_list(tl_type) != _is_list(il_type):
            raise SchemaError(
                f"{f}: train_logprob ('{mapping['train_logprob']}', {tl_type}) and "
                f"infer_logprob ('{mapping['infer_logprob']}', {il_type}) must both be lists "
                "(nested layout) or both scalars (long layout)."
            )
        file_layout = "nested" if nested else "long"
        if layout != "auto" and layout != file_layout:
            raise SchemaError(
                f"{f}: --layout {layout} given but train_logprob ('{mapping['train_logprob']}') "
                f"is {'a list' if nested else 'a scalar'} column ({tl_type}), i.e. "
                f"{file_layout} layout."
            )
        infos.append(FileInfo(f, file_layout, rows[f], tuple(sch.names), hive))
        pos = mapping.get("position")
        if nested and pos in types and not _is_list(types[pos]):
            scalar_positions.append(f)
        if hive:
            conflicts.extend(_partition_conflicts(f, metas[f], hive, mapping))
        # positions numbered per sequence in row order: a chunk adds the rows its sequences
        # have in the chunks (and files) before it (unless seq_id is a partition value: then
        # one chunk per file)
        if file_layout == "long" and mapping.get("seq_id") not in set(types) | set(hive):
            if "seq_id" in null_typed:  # (the column exists, holding no value)
                raise SchemaError(f"{f}: the long layout (one row per token) needs a sequence "
                                  f"id, and {null_typed['seq_id']}: write the ids, or map "
                                  "another column with --column seq_id=NAME.")
            raise _needs_seq_id(f, mapping, columns)
        numbered = file_layout == "long" and "position" not in mapping
        ranges = _row_group_ranges(metas.pop(f), mapping["train_logprob"] if nested else None,
                                   split=not numbered or mapping.get("seq_id") in types)
        # (the footer is dropped once read: 20k row groups hold 200 MB of pyarrow metadata)
        plans.append((f, types, hive, file_layout, _scan(f),
                      ranges, numbered))
    if scalar_positions:  # one value per sequence row cannot number its tokens
        notes.append(
            f"position ('{mapping['position']}') holds one value per row in "
            f"{len(scalar_positions):,} nested file(s) (e.g. {scalar_positions[0]}), not a "
            "list: not used there, tokens are numbered by list index")
    for f, types, _hive, file_layout, *_ in plans:  # (before the positions are numbered)
        if file_layout == "long":
            _refuse_long_lists(f, types, mapping)
    offsets, file_offsets, continued = _position_offsets(plans, mapping, sid_dtype,
                                                         seq_id_per_file)
    def continued_note(interleaved: bool) -> None:
        unkeyed = unkeyed_partitions([p[2] for p in plans], mapping)
        # (a writer splitting the rows into files splits at most one sequence per boundary
        # unless it interleaves sequences: then any in flight at a rotation continue)
        merged = continued > len(plans) - 1 and not interleaved
        notes.append(
            ("warning: " if unkeyed or merged else "")
            + f"{continued:,} sequence(s) continue from one file into a later one: without a "
            "position column their rows are numbered in file order as one sequence"
            + (f", more than the {len(plans) - 1:,} file boundaries could split: their "
               "seq_ids probably repeat across files (per-rank or per-shard local indices "
               "restarting in each file), which merges different sequences into one for "
               "every per-sequence result (sequence gates, per-sequence metrics, "
               "resampling blocks, outliers); pass --seq-id-per-file, give each file's "
               "sequences distinct ids, or analyse one file at a time (if the files are "
               "copies of each other, map a position column to have them counted as "
               "duplicates)" if merged else
               (" (the rows of sequences are interleaved, as a writer logging them token by "
                "token and rotating its files would leave them)" if interleaved else "")
               + " (if those files are copies of each other, map a position column to have "
               "them counted as duplicates)") + unkeyed)
    labels = _file_labels([p[0] for p in plans])
    for i, (f, types, hive, file_layout, scan, ranges, _numbered) in enumerate(plans):
        # (per-file ids: the path as the outputs' file column spells it)
        id_prefix = str(f) if seq_id_per_file else None
        # (each row's input file: its index in Dataset.files, a constant per file)
        index = pl.lit(i, pl.UInt32).alias(FILE_INDEX)
        frames.append(_file_frame(f, types, hive, mapping, file_layout, sid_dtype, scan=scan,
                                  position_offsets=file_offsets.get(i), label=labels[f],
                                  id_prefix=id_prefix)
                      .with_columns(index))
        if len(ranges) == 1:
            off, n, tokens = ranges[0]
            # a whole long-layout file with its positions: read with the files beside it
            # by one scan when they look alike (_multi_file_frame)
            alike = None
            if file_layout == "long" and not _numbered and not seq_id_per_file:
                alike = _Alike((tuple(types), tuple(str(t) for t in types.values()),
                                tuple(sorted((k, v) for k, v in hive.items() if k not in types
                                             and k in set(mapping.values())))),
                               f, rows[f], i, types, hive)
            pieces.append((frames[-1], tokens, tokens > _STREAM_TOKENS, str(f), alike))
            piece_files.append(f)
            continue
        for j, (off, n, tokens) in enumerate(ranges):
            pieces.append((_file_frame(f, types, hive, mapping, file_layout, sid_dtype,
                                       rows=(off, n), position_offsets=offsets.get((i, j)),
                                       scan=scan, label=labels[f],
                                       id_prefix=id_prefix).with_columns(index),
                           tokens, tokens > _STREAM_TOKENS,
                           f"{f} (rows {off:,} to {off + n - 1:,})", None))
            piece_files.append(f)

    if conflicts:
        notes.append(conflicts[0] + (f" ({len(conflicts) - 1:,} more file(s) like this; the path "
                                     "values are ignored where the file has the column)"
                                     if len(conflicts) > 1 else ""))
    total_rows = sum(rows.values())
    if total_rows == 0:
        raise InputError(
            f"the input is empty: {len(file_list)} file(s) with 0 rows "
            f"({', '.join(str(f) for f in file_list[:_MAX_LISTED])})."
        )

    order = frames[0].collect_schema().names()
    if len(frames) > 1:  # same columns in the same order in every file's frame
        frames = [fr.select(order) for fr in frames]
    raw = pl.concat(frames, how="vertical") if len(frames) > 1 else frames[0]

    def canonical_raw(fr: pl.LazyFrame) -> pl.LazyFrame:
        return fr.with_columns(_seq_key_expr(mapping)).with_columns(
            _reason_expr(mapping, nucleus=_nucleus_zeros, minus_one=_minus_one,
                         below_zero=_versions_below_zero).alias("reason"))

    def canonical_valid(fr: pl.LazyFrame) -> pl.LazyFrame:
        # the filter is the reason's conjunction (the same rows as reason null)
        return (fr.with_columns(_seq_key_expr(mapping))
                .filter(_valid_expr(mapping, _nucleus_zeros, _minus_one, _versions_below_zero))
                .select(valid_cols))

    valid_cols = _valid_columns(mapping)
    lf = canonical_valid(raw)
    raw = canonical_raw(raw)

    entropy_source = None
    if "entropy" in mapping:
        entropy_source = (
            "trainer" if mapping.get("train_entropy") == mapping["entropy"] else "inference"
        )
    # the same frames per chunk (row-group ranges of each file; consecutive small files
    # together): passes run chunk by chunk
    raw_chunks, chunks = [], []
    def merged(group: Sequence[_Alike]) -> pl.LazyFrame:  # (for _group_small)
        return _multi_file_frame(group, mapping, sid_dtype).select(order)

    for fr, tokens, streamed, source, members in _group_small(
            [(fr.select(order), t, st, src, alike) for fr, t, st, src, alike in pieces],
            merged):
        # members as read (a read error is in them, not in the validation on top): one plan
        # per file, not two more (5000 small files: 250 MB of plans)
        raw_chunks.append(Chunk(canonical_raw(fr), tokens, streamed, source, tuple(members)))
        chunks.append(Chunk(canonical_valid(fr), tokens, streamed, source, tuple(members)))
    register_chunks(raw, raw_chunks)
    register_chunks(lf, chunks)
    regrouped = REGROUPED[0]
    accounting, fine = _account(raw, mapping, infos, _nucleus_zeros, _minus_one,
                                _versions_below_zero)
    if continued:  # (interleaved rows: batches of the accounting pass were regrouped)
        interleaved = REGROUPED[0] > regrouped
        continued_note(interleaved)
        if not interleaved:
            accounting = dataclasses.replace(accounting, sequences_across_files=continued)

    def read_again(**how: Any) -> Dataset:
        """The input read once more with the same options and what the accounting found
        (``how``: the private options that change, e.g. ``_minus_one``)."""
        private = {"_unusable_entropy": _unusable_entropy, "_nucleus_zeros": _nucleus_zeros,
                   "_minus_one": _minus_one, "_versions_below_zero": _versions_below_zero,
                   **how}
        return load_dataset(paths, columns=columns, framework=framework, layout=layout,
                            entropy=entropy, skip_unreadable=skip_unreadable,
                            seq_id_per_file=seq_id_per_file, **private)

    below = (_negative_versions(accounting)
             if not _versions_below_zero and accounting.excluded.get("negative_version")
             else None)
    if below is not None:  # version numbers below 0, not -1 markers: read again, kept
        from entr_diag.caveats import column_named

        ds = read_again(_versions_below_zero=True)
        n, lo, cols = below
        note = (f"warning: {n:,} loss-masked tokens with valid logprobs have "
                + " or ".join(column_named(c, mapping) for c in cols)
                + f" below 0 (from {lo:,}), not only -1: read as version numbers (e.g. step "
                "- lag at the start of an asynchronous run, or versions offset), not as the "
                "-1 prompt-token marker, and kept; the staleness is still train_version - "
                "policy_version")
        return dataclasses.replace(ds, notes=(note, *ds.notes), bundled=bundled)
    pads = _minus_one_padding(accounting.minus_one) if not _minus_one else {}
    if pads:  # -1.0 padding inside the loss mask: read again, excluded as sentinel_logprob
        from entr_diag.caveats import column_named

        ds = read_again(_minus_one=tuple(pads))
        note = ("warning: " + "; ".join(
            f"{n:,} loss-masked tokens have {column_named(c, mapping)} exactly -1.0 "
            f"(at most {ctrl:,} at any of -0.5, -0.9, -1.1 or -2.0)"
            for c, (n, ctrl) in pads.items())
            + ": a padding value (verl pads rollout_log_probs with -1), not logprobs, "
            "inside the loss mask (a mask that does not match the logprob arrays, or "
            "padding not masked): excluded as sentinel_logprob")
        # (the counts as first read: now excluded, those tokens are no longer valid)
        return dataclasses.replace(ds, notes=(note, *ds.notes), bundled=bundled,
                                   accounting=dataclasses.replace(
                                       ds.accounting, minus_one=accounting.minus_one))
    notes_extra: tuple[str, ...] = ()  # (the both-sides-0.0 warning)
    # (delta exactly 0 on every valid token: both sides 0.0 at an entropy of 0, which the
    # loader keeps as near-certain tokens, must be told from a bitwise on-policy run)
    all_same = (accounting.tokens_valid > 0
                and accounting.tokens_identical == accounting.tokens_valid)
    if _nucleus_zeros is False and (
            all_same
            or accounting.excluded.get("zero_placeholder", 0) >= S.NUCLEUS_MIN_TOKENS):
        nucleus, zero_cols, masked_rows, both_zero = _nucleus_zeros_seen(raw_chunks)
        if zero_cols:  # a logprob side never computed: nothing to measure
            from entr_diag.caveats import column_named

            both = len(zero_cols) == 2
            zero_cols = tuple(sorted(zero_cols, reverse=True))  # (train_logprob first)
            raise InputError(
                f"{inputs_named([i.path for i in infos])}: "
                + " and ".join(column_named(c, mapping) for c in zero_cols)
                + f" {'are both' if both else 'is'} exactly 0.0 on every one of the "
                f"{masked_rows:,} loss-masked rows: "
                + ("neither side's logprobs were recorded (zero-filled columns, or a loss "
                   "mask over zero-filled rows such as the prompt's: an inverted mask?"
                   if both else "that side's logprobs were never recorded (a zero-filled "
                   "column, e.g. " + ("rollout logprobs not requested from the engine"
                                      if zero_cols[0] == "infer_logprob" else
                                      "the trainer's logprobs not written to the dump"))
                + "), so there is no train-inference mismatch to measure. Dump the sampled "
                "tokens' logprobs from both sides, or map the right column"
                + ("s with " + " ".join(f"--column {c}=NAME" for c in zero_cols) if both
                   else f" with --column {zero_cols[0]}=NAME") + ".")
        if both_zero >= S.NUCLEUS_MIN_TOKENS and not zero_cols:  # say what they may be
            notes_extra = (
                f"warning: {both_zero:,} loss-masked tokens have both logprobs exactly 0.0 at "
                f"an entropy of {S.ZERO_BOTH_H_MIN:g} nats or more, excluded as "
                "zero_placeholder: rows zero-filled on both sides, one-token nuclei of "
                "top-p / top-k sampling applied on both sides (the trainer renormalised over "
                "the engine's nucleus, which lie at low entropy: the low-entropy bins are "
                "then thinned), or logprobs computed in bf16 / fp16 on both sides (a bf16 "
                "log-softmax gives exactly 0.0 for p above ~0.996, at an entropy up to ~0.03 "
                "nats); either way their delta of 0 measures no mismatch",)
        if nucleus is not None:  # one-token nuclei, not placeholders: read again, kept
            kept, other, keys = nucleus
            ds = read_again(_nucleus_zeros=keys if keys.len() else True)
            note = (f"{kept:,} loss-masked tokens have an engine logprob of exactly 0.0 where "
                    f"the trainer's is below {S.ZERO_PLACEHOLDER_OTHER_MAX:g} nats but above "
                    f"ln 0.5 = {S.NUCLEUS_TRAIN_MIN:.3f}, in sequences whose zeros all are and "
                    "that hold other engine logprobs: one-token nuclei of top-p / top-k "
                    "sampling (the engine renormalised the kept token to probability 1), "
                    "not placeholders, which leave trainer logprobs of every size: kept as "
                    "valid tokens (their delta is the truncation's log-ratio)"
                    + (f"; {other:,} such zeros in {keys.len():,} sequence(s) that read as "
                       "placeholders (a zero whose trainer logprob is below ln 0.5, or every "
                       "token zero: an engine side not computed, zero-filled prompt rows) "
                       "stay excluded as zero_placeholder" if other else ""))
            return dataclasses.replace(ds, notes=(note, *notes_extra, *ds.notes), bundled=bundled,
                                       nucleus_zeros=kept)
    from entr_diag.caveats import hinted_reason

    hinted = hinted_reason(accounting.excluded, accounting.tokens_masked, mapping)
    # what the warned-about reasons concern: which column(s), which file(s): the pooled
    # warning's, and the logprob reasons of the per-file warnings (which column holds the
    # -9999s of one shard); one more read for all of them, only when such a warning fires
    located = ([hinted] if hinted is not None else []) + [
        r for r in accounting.file_exclusions if r != hinted and r in _LOGPROB_REASONS][:2]
    if located:
        frames_raw = [canonical_raw(fr.select(order)) for fr, *_ in pieces]
        accounting = dataclasses.replace(accounting, excluded_where=_excluded_where(
            frames_raw, piece_files, located, mapping, _nucleus_zeros, _minus_one))
    src = mapping.get("entropy")
    if (src and accounting.tokens_masked and not accounting.tokens_valid
            and accounting.excluded.get("invalid_entropy")
            and (columns or {}).get("entropy") != src and entropy == "auto"):
        # an entropy column without a usable value (e.g. NaN-filled by an engine that does
        # not compute it) excluded every token: as if absent (the gates that need no
        # entropy can still be compared), or the trainer-side one instead
        ds = read_again(_unusable_entropy=(*_unusable_entropy, src))
        instead = ds.mapping.get("entropy")
        kinds = ((accounting.excluded_where or {}).get("invalid_entropy") or {}).get("kinds")
        what = (", ".join(f"{n:,} {k}" for k, n in kinds.items()) if kinds
                else f"NaN, null, negative or above {S.ENTROPY_MAX:g} nats")
        note = (f"warning: entropy ('{src}') holds no valid value for any loss-masked token "
                f"({what}): not used, as if absent"
                + (f"; using the trainer-side entropy ('{instead}')" if instead else ""))
        return dataclasses.replace(
            ds, notes=(note, *ds.notes), bundled=bundled,
            entropy_unused=ds.entropy_unused if instead else "; ".join(
                (f"the entropy column ('{src}') holds no valid value for any loss-masked "
                 f"token ({what})", *filter(None, [ds.entropy_unused]))))
    notes += _position_wrap(mapping.get("position"), file_list, schemas, pos_ranges,
                            accounting)
    return Dataset(
        lf=lf, raw=raw, files=tuple(infos), mapping=mapping, notes=(*notes_extra, *notes),
        entropy_source=entropy_source, accounting=accounting, bundled=bundled,
        seq_id_dtype=sid_dtype, entropy_fine_counts=fine[0], step_range=fine[1],
        skipped_unreadable=tuple(unreadable), entropy_unused=entropy_unused,
        seq_id_per_file=seq_id_per_file,
    )


#: Files read together in one chunk at most (see :func:`_group_small`).
_MAX_FILES_PER_CHUNK: int = 64
#: Token rows per chunk of a pass (whole row groups; :func:`entr_diag.passes.run_pass`).
CHUNK_TOKENS: int = 1_000_000
#: A single row group (or unsplittable file) above this many token rows is streamed in
#: batches instead of read as one chunk.
_STREAM_TOKENS: int = 8 * CHUNK_TOKENS


class _Alike(NamedTuple):
    """A whole long-layout input file that a scan of several files can read with others of
    the same ``key`` (column names and types, the mapped partition values it lacks)."""

    key: tuple
    path: Path
    rows: int
    index: int  # its FILE_INDEX
    types: Mapping[str, pa.DataType]
    hive: Mapping[str, str]


def _multi_file_frame(group: Sequence[_Alike], mapping: Mapping[str, str],
                      sid_dtype: type[pl.DataType]) -> pl.LazyFrame:
    """The canonical raw rows of the files of ``group`` (alike, in order) as one polars scan of
    them all, each row's ``FILE_INDEX`` found from the row's index among the files' row
    counts: the same rows as the concatenation of each file's :func:`_file_frame`, at half the
    cost over many small files (polars sets up each scan of a file on its own)."""
    first = group[0]
    starts = np.cumsum([0] + [g.rows for g in group[:-1]]).astype(np.int64)
    scan = pl.scan_parquet([g.path for g in group], hive_partitioning=False, glob=False,
                           row_index_name="_row_ix")
    # the file of a row: the last file starting at or before it (an empty file starts where
    # the next one does and holds no row)
    which = (pl.lit(pl.Series(starts)).search_sorted(pl.col("_row_ix").cast(pl.Int64),
                                                     side="right") - 1)
    index = pl.lit(pl.Series([g.index for g in group], dtype=pl.UInt32)).gather(which)
    scan = scan.with_columns(index.alias(FILE_INDEX))
    return _file_frame(first.path, first.types, first.hive, mapping, "long", sid_dtype,
                       scan=scan, keep=[FILE_INDEX])


def _group_small(pieces: list[tuple[pl.LazyFrame, int, bool, str, _Alike | None]],
                 merged: Callable[[Sequence[_Alike]], pl.LazyFrame] | None = None,
                 ) -> list[tuple[pl.LazyFrame, int, bool, str, list[tuple[pl.LazyFrame, str]]]]:
    """Consecutive pieces (file frames or file chunks, same columns) concatenated into chunks
    of at most :data:`CHUNK_TOKENS` tokens and ``_MAX_FILES_PER_CHUNK`` files (polars opens
    every file of a chunk on a thread of its own): a run dumped as thousands of small files
    (one per step and rank) costs one chunk per million tokens, not one per file (each chunk
    has a fixed cost of a few milliseconds per pass). Each output piece also lists its
    members (frame, source) when it holds more than one. Within a chunk, a run of
    consecutive whole files alike (each piece's last element, an :class:`_Alike`, of one
    key) is read by one scan of those files, ``merged(alikes)``, instead of the
    concatenation of their frames."""
    out: list[tuple[pl.LazyFrame, int, bool, str, list[tuple[pl.LazyFrame, str]]]] = []
    group: list[tuple[pl.LazyFrame, int, bool, str, _Alike | None]] = []

    def flush() -> None:
        if len(group) == 1:
            out.append((*group[0][:4], []))
        elif group:
            first, last = group[0][3], group[-1][3]
            # runs of consecutive alike files (one key) by one scan each, other pieces by
            # their own frames
            parts: list[pl.LazyFrame] = []
            for _, run_it in itertools.groupby(
                    group, key=lambda g: None if merged is None or g[4] is None
                    else g[4].key):
                run = list(run_it)
                if len(run) > 1 and merged is not None and run[0][4] is not None:
                    parts.append(merged([g[4] for g in run]))  # type: ignore[misc]
                else:
                    parts.extend(g[0] for g in run)
            frame = pl.concat(parts, how="vertical") if len(parts) > 1 else parts[0]
            out.append((frame, sum(g[1] for g in group), False,
                        f"one of {len(group)} files from {first} to {last}",
                        [(g[0], g[3]) for g in group]))
        group.clear()

    for piece in pieces:
        if piece[2] or piece[1] >= CHUNK_TOKENS:  # streamed or a full chunk: on its own
            flush()
            out.append((*piece[:4], []))
            continue
        if group and (sum(g[1] for g in group) + piece[1] > CHUNK_TOKENS
                      or len(group) >= _MAX_FILES_PER_CHUNK):
            flush()
        group.append(piece)
    flush()
    return out


def _row_group_ranges(meta: pq.FileMetaData, list_column: str | None, *,
                      split: bool = True) -> list[tuple[int, int, int]]:
    """Consecutive row groups of a file grouped into chunks of about :data:`CHUNK_TOKENS`
    token rows: ``(first row, rows, estimated token rows)`` each. Token rows of a nested
    file are the values of ``list_column`` (from the row-group metadata)."""
    sizes: list[tuple[int, int]] = []
    for i in range(meta.num_row_groups):
        rg = meta.row_group(i)
        tokens = rg.num_rows
        if list_column is not None:
            for j in range(rg.num_columns):
                col = rg.column(j)
                if col.path_in_schema.split(".")[0] == list_column:
                    tokens = max(col.num_values, rg.num_rows)
                    break
        sizes.append((rg.num_rows, tokens))
    if not split or len(sizes) <= 1:
        return [(0, meta.num_rows, sum(t for _, t in sizes) or meta.num_rows)]
    out: list[tuple[int, int, int]] = []
    start = n = tok = 0
    for rows, tokens in sizes:
        if n and tok + tokens > CHUNK_TOKENS:
            out.append((start, n, tok))
            start, n, tok = start + n, 0, 0
        n += rows
        tok += tokens
    if n:
        out.append((start, n, tok))
    return out


_I64_LIMIT = 2**63 - 1


def _refuse_unsigned_overflow(path: Path, meta: pq.FileMetaData,
                              types: Mapping[str, pa.DataType], mapping: Mapping[str, str]
                              ) -> None:
    """Refuse a uint64 column read as a signed 64-bit integer (step, position, versions,
    token_id) that holds values above 2^63 - 1 (by its statistics, or, without them, by
    reading that one column), counting them over the whole file: the cast would fail while
    a pass reads the file, counting one batch of it."""
    for canon, src in mapping.items():
        if S.BY_NAME[canon].kind != S.INT or src not in types \
                or _value_type(types[src]) != pa.uint64():
            continue
        leaves = [j for j in range(meta.num_columns) if meta.schema.column(j).path == src
                  or meta.schema.column(j).path.startswith(src + ".")]
        stats = [meta.row_group(g).column(j).statistics
                 for g in range(meta.num_row_groups) for j in leaves]
        if all(st is not None and st.has_min_max and st.max <= _I64_LIMIT for st in stats):
            continue
        x = pl.col(src).explode() if _is_list(types[src]) else pl.col(src)
        counts = _scan(path).select((x > _I64_LIMIT).sum().alias("big"), x.count().alias("n"),
                                    x.max().alias("top"))
        big, n, top = counts.collect(engine="streaming").row(0)
        if big:
            raise SchemaError(
                f"{path}: column '{src}' ({canon}) holds {big:,} of its {n:,} values above "
                f"{_I64_LIMIT:,}, the largest signed 64-bit integer (up to {top:,}): no "
                f"{canon} is that large (a hash, or -1 written unsigned?); map another column "
                f"with --column {canon}=NAME, or fix the dump."
            )


def _int_like(v: str) -> bool:
    return bool(re.fullmatch(r"-?\d+", v))


#: the largest value of each narrow integer type a position column may wrap past
_NARROW_INT_MAX = {pa.int8(): 127, pa.int16(): 32_767, pa.uint8(): 255, pa.uint16(): 65_535}


def _position_wrap(pos: str | None, files: Sequence[Path], schemas: Mapping[Path, pa.Schema],
                   ranges: Mapping[Path, tuple[Any, Any] | None],
                   accounting: Accounting) -> list[str]:
    """A warning when the position column ``pos`` is an 8- or 16-bit integer in some input
    files and its values wrapped past the type's maximum, by the files' statistics (a
    signed column reaching its minimum, -128 or -32,768, where a wrap lands: its negative
    positions are ``invalid_position`` rows; an unsigned one reaching its maximum and
    wrapping back to 0: sequences holding a position more than once, which the
    duplicate-position warning would put down to copied shards or shared ids); [] otherwise
    (-1 padding in an int8 column is no wrap, helper-45). ``ranges``: each file's (min,
    max) of the column by its statistics (:func:`_stat_range`; None without them)."""
    if not pos:
        return []
    narrow = _files_typed(files, schemas, pos, lambda t: t in _NARROW_INT_MAX)
    if not narrow:
        return []
    t = _value_type(schemas[narrow[0]].field(pos).type)
    signed = pa.types.is_signed_integer(t)
    edge = -_NARROW_INT_MAX[t] - 1 if signed else _NARROW_INT_MAX[t]
    seen = [r for f in narrow if (r := ranges.get(f)) is not None]
    if not any((r[0] if signed else r[1]) == edge for r in seen):
        return []
    n_bad = (int(accounting.excluded.get("invalid_position", 0)) if signed
             else int(accounting.sequences_with_duplicate_positions))
    if not n_bad:
        return []
    what = (f"to negative values, so the {n_bad:,} invalid_position rows are probably the "
            "later tokens of long sequences, excluded" if signed else
            f"back to 0, so the {n_bad:,} sequence(s) holding a position more than once "
            "probably hold more tokens than the type counts (not copied shards nor shared "
            "ids)")
    return [f"warning: position{'' if pos == 'position' else f' ({pos!r})'} is {t} in "
            f"{len(narrow):,} of {len(files):,} input files (e.g. {narrow[0]}): positions past "
            f"{_NARROW_INT_MAX[t]:,} wrap {what}; write positions as int32 or wider, or drop "
            "the column to number tokens in row order"]


def _files_typed(files: Sequence[Path], schemas: Mapping[Path, pa.Schema], src: str | None,
                 pred: Callable[[pa.DataType], bool]) -> list[Path]:
    """The ``files`` whose column ``src`` holds values of a type ``pred`` accepts (a list
    column's elements; a dictionary column's values)."""
    return [f for f in files if src in schemas[f].names
            and pred(_value_type(schemas[f].field(src).type))]


def _float_int_notes(mapping: Mapping[str, str], files: Sequence[Path],
                     schemas: Mapping[Path, pa.Schema]) -> list[str]:
    """A note per integer canonical column (step, position, versions, token_id) and
    sequence id whose source is floating-point in some input files: read as integers where
    whole, as null elsewhere (:func:`_canonical_cast`, :func:`_seq_id_expr`; a null seq_id
    is a missing_seq_id row)."""
    out = []
    for canon, src in mapping.items():
        if canon not in S.BY_NAME or S.BY_NAME[canon].kind not in (S.INT, S.ID):
            continue
        floats = _files_typed(files, schemas, src, pa.types.is_floating)
        if floats:
            out.append(
                f"{canon}{'' if src == canon else f' ({src!r})'} holds floating-point values "
                f"in {len(floats)} of {len(files)} files (e.g. {floats[0]}; an integer column "
                "with a missing value, as pandas writes it): whole values are read as "
                "integers, NaN, fractional ones and whole ones beyond the 64-bit integer "
                "range as null")
    return out


def _seq_id_expr(expr: pl.Expr, src_type: pa.DataType | None,
                 sid_dtype: type[pl.DataType], prefix: str | None = None) -> pl.Expr:
    """A source sequence id as ``sid_dtype``: floats (pandas writes an integer id column
    with a missing value as float64) are read as integers where whole, NaN and fractional
    ids as null (missing_seq_id rows), then as ``sid_dtype`` (``3.0`` -> ``"3"``).
    ``prefix`` (``seq_id_per_file``: the file's path; ``sid_dtype`` String): the id reads
    ``"<prefix>:<id>"`` (a null id stays null)."""
    if src_type is not None and pa.types.is_floating(_value_type(src_type)):
        expr = _whole_ints(expr)
    if prefix is not None:
        return pl.format("{}:{}", pl.lit(prefix), expr.cast(pl.String))
    return expr.cast(sid_dtype)


def _whole_ints(expr: pl.Expr) -> pl.Expr:
    """A floating-point column's whole values as Int64; NaN, infinite, fractional and
    out-of-range values as null."""
    return pl.when(expr == expr.floor()).then(expr).cast(pl.Int64, strict=False)


def _canonical_cast(canon: str, expr: pl.Expr, src_type: pa.DataType | None = None
                    ) -> pl.Expr:
    """``expr`` (a source column) as the canonical column ``canon``'s dtype. An integer
    column written as floats (``src_type`` floating: pandas writes an integer column with a
    missing value as float64) reads its whole values as integers and the others (NaN,
    infinite, fractional) as null (:func:`_float_int_notes` says so)."""
    kind = S.BY_NAME[canon].kind
    if kind == S.BOOL:
        return expr.cast(pl.Boolean)
    if kind == S.ID:
        return expr.cast(pl.String)
    if kind == S.INT and src_type is not None and pa.types.is_floating(_value_type(src_type)):
        return _whole_ints(expr)
    return expr.cast(_POLARS_DTYPE[kind])


def _needs_seq_id(path: Path, mapping: Mapping[str, str] | None = None,
                  overrides: Mapping[str, str] | None = None) -> SchemaError:
    """The refusal of a long file without a sequence id. A sequence id name the mapping
    gives another column (``--column entropy=seq_id``) is named as taken, not as missing."""
    names = ("seq_id", *S.BY_NAME["seq_id"].aliases)
    taken = [(canon, src) for canon, src in (mapping or {}).items()
             if canon != "seq_id" and src in names]
    if taken:
        by = "; ".join(
            f"'{src}' is mapped to {canon}"
            + (f" by --column {canon}={src}" if (overrides or {}).get(canon) == src else "")
            for canon, src in taken)
        return SchemaError(
            f"{path}: the long layout (one row per token) needs a sequence id column; {by}, "
            "so no sequence id is left. Map the sequence id explicitly with --column "
            "seq_id=NAME (sequence-level resampling and gates need it), and "
            f"{' and '.join(c for c, _ in taken)} to a column of its own.")
    return SchemaError(
        f"{path}: the long layout (one row per token) needs a sequence id column; none of "
        f"seq_id, {', '.join(S.BY_NAME['seq_id'].aliases)} exists. Map one with "
        "--column seq_id=NAME (sequence-level resampling and gates need it)."
    )


def _mask_exprs(src: str | None, typ: pa.DataType | None) -> list[pl.Expr]:
    """``loss_mask`` (Boolean) and ``_mask_bad`` (Boolean: a numeric mask value other than 0
    or 1, e.g. a loss weight; such rows get reason ``invalid_loss_mask``, their mask is
    null) from the source column ``src`` (``None``: no mask column, every token trained
    on)."""
    if src is None:
        return [pl.lit(True).alias("loss_mask"), pl.lit(False).alias("_mask_bad")]
    x = pl.col(src)
    if typ is not None and pa.types.is_boolean(_value_type(typ)):
        return [x.alias("loss_mask"), pl.lit(False).alias("_mask_bad")]
    ok = (x == 0) | (x == 1)  # null for a null value, false for NaN
    return [pl.when(ok).then(x == 1).alias("loss_mask"),
            (x.is_not_null() & ~ok.fill_null(False)).alias("_mask_bad")]


def _file_frame(
    path: Path,
    types: Mapping[str, pa.DataType],
    hive: Mapping[str, str],
    mapping: Mapping[str, str],
    layout: str,
    sid_dtype: type[pl.DataType] = pl.String,
    rows: tuple[int, int] | None = None,
    position_offsets: pl.DataFrame | None = None,
    scan: pl.LazyFrame | None = None,
    label: str | None = None,
    keep: Sequence[str] = (),
    id_prefix: str | None = None,
) -> pl.LazyFrame:
    """Canonical raw rows of one file: one row per token, every mapped column, ``_empty``.

    ``seq_id`` has dtype ``sid_dtype`` here (Int64, UInt64 or String); the valid frame exposes it as
    String. ``rows``: (first row, number of rows) for a chunk of the file (whole row
    groups; the file-level checks, e.g. ragged nested rows, run only for the whole file).
    ``position_offsets``: for a long file (or a chunk of one) without positions (numbered
    per sequence in input order), the rows (``_off``) each sequence has in the files and
    chunks before (:func:`_position_offsets`). ``scan``: the file's :func:`_scan`, shared
    by its chunks (polars keeps the parsed footer with the scan: one copy per file, not per
    chunk). ``label``: the file's name within the input (:func:`_file_labels`), the prefix
    of the ``file:row`` ids of a nested file without a seq_id column. ``keep``: columns of
    ``scan`` passed through (long layout; e.g. the file index of a scan of several files,
    :func:`_multi_file_frame`). ``id_prefix``: the file's path when seq_ids are local to
    each file (``seq_id_per_file``, :func:`_seq_id_expr`).
    """
    lf = _scan(path) if scan is None else scan
    first_row = 0
    if rows is not None:
        first_row = rows[0]
        lf = lf.slice(rows[0], rows[1])
    lf = _with_hive(lf, types, hive, mapping)
    srcs = dict(mapping)
    names = set(types) | set(hive)
    if "loss_mask" in srcs and srcs["loss_mask"] not in names:  # every token trained on
        del srcs["loss_mask"]
    if "seq_id" in srcs and srcs["seq_id"] not in names:  # a nested file: rows named file:row
        del srcs["seq_id"]

    if layout == "nested":
        lf = lf.with_row_index("_row", offset=first_row)
        list_srcs = [src for src in sorted(set(srcs.values())) if src in types and _is_list(types[src])]
        # a seq_id written as a list ([id], or the id once per token): one id per row, its
        # first value, once every row's list is checked to hold one value
        sid_list = "seq_id" in srcs and srcs["seq_id"] in list_srcs
        if sid_list:
            list_srcs.remove(srcs["seq_id"])
            if srcs["seq_id"] in types and pa.types.is_fixed_size_list(types[srcs["seq_id"]]):
                lf = lf.with_columns(pl.col(srcs["seq_id"]).arr.to_list())
        # packed rows: cu_seqlens splits a row into its sequences (a list, not per token)
        cu_src = srcs.get("cu_seqlens")
        packed = cu_src is not None and cu_src in list_srcs
        if packed:
            list_srcs.remove(cu_src)
            if pa.types.is_fixed_size_list(types[cu_src]):
                lf = lf.with_columns(pl.col(cu_src).arr.to_list())
        # fixed-size lists (a padded [batch, length] tensor written as is) read as polars
        # Arrays: as lists, they take the same path (padding is what the loss mask is for)
        fixed = [src for src in list_srcs if pa.types.is_fixed_size_list(types[src])]
        if fixed:
            lf = lf.with_columns(pl.col(src).arr.to_list() for src in fixed)
        ref = srcs["train_logprob"]
        # a per-sequence value written as a one-element list ([step], [version]) holds it
        # for every token of the row: repeated to the row's length before the lists are
        # checked for equal lengths
        one = [srcs[c] for c in _BROADCAST_LISTS if srcs.get(c) in list_srcs]
        if one:
            core = [src for src in list_srcs if src not in one]
            n_core = pl.coalesce([pl.col(src).list.len() for src in core])
            lf = lf.with_columns(
                pl.when((pl.col(src).list.len() == 1) & (n_core > 1))
                .then(pl.col(src).list.first().repeat_by(n_core)).otherwise(pl.col(src))
                .alias(src) for src in one)
        lens = {src: pl.col(src).list.len() for src in list_srcs}
        # a row's tokens: the length of its train_logprob list, or of the first other list
        # when that one is null (null when every list of the row is: an empty row)
        n_tok = pl.coalesce([lens[ref], *(lens[src] for src in list_srcs if src != ref)])
        # the row's seq_id as written (a list's first value)
        sid_raw = None if "seq_id" not in srcs else (
            pl.col(srcs["seq_id"]).list.first() if sid_list else pl.col(srcs["seq_id"]))
        if rows is None:
            if sid_list:
                _check_list_seq_id(path, lf, srcs["seq_id"])
            _check_ragged(path, lf, lens, n_tok, srcs, list_srcs, sid_raw)
            if packed:
                _check_packed(path, lf, cu_src, n_tok, sid_raw)
        sid = (_seq_id_expr(sid_raw, types.get(srcs["seq_id"]), sid_dtype, id_prefix)
               if sid_raw is not None
               else pl.format("{}:{}", pl.lit(label or path.name), pl.col("_row")))
        lf = lf.with_columns(
            sid.alias("_seq_id"),
            (n_tok.fill_null(0) == 0).alias("_empty"),
            pl.int_ranges(0, n_tok.fill_null(0)).alias("_pos"),
        )
        pad = pl.lit(False)
        if "loss_mask" not in srcs:  # no mask: leading / trailing all-zero rows are padding
            lo, hi = _unpadded_range(srcs, list_srcs)  # (a null list says nothing of it)
            lf = lf.with_columns(lo.alias("_pad_lo"), hi.alias("_pad_hi"))
            pad = ((pl.col("_pos") < pl.col("_pad_lo"))
                   | (pl.col("_pos") >= pl.col("_pad_hi"))).fill_null(False)
        # a null list beside present ones holds a null per token: excluded by the reason a
        # null value of its column has in the long layout (a null entropy: invalid_entropy)
        lf = lf.with_columns(pl.col(src).fill_null(pl.col("_pos").list.eval(pl.lit(None)))
                             for src in list_srcs)
        seg: list[str] = []
        if packed:  # per token: its sequence's index in the row and first token
            lf = _with_segments(lf, cu_src)
            seg = ["_seg", "_start"]
        # an empty list explodes to one null row: keep it, marked _empty, for the accounting
        lf = lf.explode([*list_srcs, "_pos", *seg], empty_as_null=True, keep_nulls=True)
        exprs = [(pl.format("{}:{}", pl.col("_seq_id"), pl.col("_seg")) if packed
                  else pl.col("_seq_id")).alias("seq_id"), pl.col("_empty"), pad.alias("_pad")]
        if "position" in srcs and srcs["position"] in list_srcs:
            exprs.append(_canonical_cast("position", pl.col(srcs["position"]),
                                         types.get(srcs["position"])).alias("position"))
        elif packed:
            exprs.append((pl.col("_pos") - pl.col("_start")).cast(pl.Int64).alias("position"))
        else:
            exprs.append(pl.col("_pos").cast(pl.Int64).alias("position"))
        for canon, src in srcs.items():
            if canon in ("seq_id", "position", "loss_mask", *S.ROW_COLUMNS):
                continue
            exprs.append(_canonical_cast(canon, pl.col(src), types.get(src)).alias(canon))
        if "loss_mask" in mapping:
            exprs += _mask_exprs(srcs.get("loss_mask"), types.get(srcs.get("loss_mask", "")))
        return lf.select(exprs)

    # long layout
    if "seq_id" not in srcs:
        raise _needs_seq_id(path, mapping)
    _refuse_long_lists(path, types, srcs)
    pad = _padding_rows(srcs) if "loss_mask" not in srcs else pl.lit(False)
    exprs = [pl.lit(False).alias("_empty"), pad.alias("_pad")]
    for canon, src in srcs.items():
        if canon == "seq_id":
            exprs.append(_seq_id_expr(pl.col(src), types.get(src), sid_dtype, id_prefix)
                         .alias(canon))
        elif canon != "loss_mask" and canon not in S.ROW_COLUMNS:
            exprs.append(_canonical_cast(canon, pl.col(src), types.get(src)).alias(canon))
    if "loss_mask" in mapping:
        exprs += _mask_exprs(srcs.get("loss_mask"), types.get(srcs.get("loss_mask", "")))
    lf = lf.select(*exprs, *keep)
    if "position" not in srcs:
        keys = _numbering_keys(mapping)
        lf = lf.with_columns(pl.int_range(pl.len()).over(keys).cast(pl.Int64).alias("position"))
        if position_offsets is not None and position_offsets.height:
            lf = (lf.join(position_offsets.lazy(), on=keys, how="left", nulls_equal=True,
                          maintain_order="left")
                  .with_columns((pl.col("position") + pl.col("_off").fill_null(0))
                                .alias("position"))
                  .drop("_off"))
    return lf


def unkeyed_partitions(hives: Iterable[Mapping[str, str]], mapping: Mapping[str, str]) -> str:
    """``"; the input's folders are partitioned by KEY, ..."``: the clause that warnings
    about merged sequences add when partition folders (``rank=0/``, ``rank=1/``) hold a key
    the sequence key (step, seq_id) does not (per-folder seq_ids that restart merge across
    folders); ``""`` when there is none. ``hives``: each file's partition values."""
    mapped = set(mapping.values())
    parts = sorted({k for h in hives for k in h if k not in mapped})
    if not parts:
        return ""
    return (f"; the input's folders are partitioned by {', '.join(parts)}, which is not part "
            "of the sequence key (step, seq_id): seq_ids numbered anew in each folder merge "
            "across folders; give each folder's sequences distinct ids, or analyse one folder "
            "at a time")


def _only_nulls(meta: pq.FileMetaData, src: str, schema: pa.Schema | None = None) -> bool:
    """Whether the file's Parquet statistics show column ``src`` (its leaf, for a list
    column) null in every row of every row group, or (``schema`` given) its type is Arrow's
    null type (pandas writes a column set to None so; it has no statistics); False when a
    statistic is missing or the file lacks the column."""
    if schema is not None and src in schema.names and _null_typed(schema.field(src).type):
        return True
    found = False
    for i in range(meta.num_row_groups):
        rg = meta.row_group(i)
        for j in range(rg.num_columns):
            col = rg.column(j)
            if col.path_in_schema != src and not col.path_in_schema.startswith(src + "."):
                continue
            found = True
            st = col.statistics
            if st is None or not st.has_null_count or st.null_count != col.num_values:
                return False
    return found


def _copies(files: Sequence[Path], rows: Mapping[Path, int], schemas: Mapping[Path, pa.Schema],
            mapping: Mapping[str, str]) -> list[tuple[Path, Path]]:
    """Pairs (first file, later file) of inputs that look like byte copies: same size, row
    count and values of the partition folders read (those naming a mapped column the file
    does not hold: a folder the file's own column overrides does not change its tokens),
    and the same first and last 64 kB (the footer holds every column chunk's offsets and
    statistics). Only files of equal size are read; files without rows are never copies
    (they hold no token to count twice: empty shards of one writer are byte-identical)."""
    import hashlib

    mapped = set(mapping.values())

    def read(f: Path) -> tuple:
        return tuple(sorted((k, v) for k, v in _hive_values(f).items()
                            if k in mapped and k not in schemas[f].names))

    groups: dict[tuple, list[Path]] = {}
    for f in files:
        key = (os.path.getsize(f), rows[f], read(f))
        groups.setdefault(key, []).append(f)
    out: list[tuple[Path, Path]] = []
    for (size, n, _h), group in groups.items():
        if len(group) < 2 or not n:  # (files without rows: no token to count twice)
            continue
        first: dict[str, Path] = {}
        for f in group:
            with open(f, "rb") as fh:
                head = fh.read(65536)
                fh.seek(max(0, size - 65536))
                digest = hashlib.sha1(head + fh.read()).hexdigest()
            if digest in first:
                out.append((first[digest], f))
            else:
                first[digest] = f
    return out


#: a nested file without a seq_id column repeats another when this share of its rows (and
#: at least REWRITTEN_MIN_ROWS) holds a train_logprob list of a row of the other: identical
#: responses of one prompt, sampled twice, are a few rows of a file, not most of them
REWRITTEN_SHARE = 0.9
REWRITTEN_MIN_ROWS = 2


def _rewritten_copies(files: Sequence[Path], col: str, skip: set[Path]
                      ) -> list[tuple[Path, Path, int, int]]:
    """(file repeated, file repeating it, rows shared, rows of the repeating file) for the
    nested ``files`` (without a seq_id column: rows named file:row, which a copy does not
    share) whose rows repeat another file's: :data:`REWRITTEN_SHARE` of a file's distinct
    ``col`` lists (train_logprob; rows holding a negative value, not padding alone) equal
    lists of one other file, whatever the order of the two (a part of a shard written
    again, under a name sorting before the original's, is found too); of two files
    repeating each other (a whole copy) the later one is named. A shard written twice
    (another row-group size or compression: no byte copy, which :func:`_copies` finds;
    those in ``skip`` are left out) would otherwise count twice unseen. One more read of
    ``col`` for these files (one 64-bit hash per row)."""
    files = [f for f in files if f not in skip]
    if len(files) < 2:
        return []
    hashes, owners = [], []
    for i, f in enumerate(files):
        lf, c = _scan(f), pl.col(col)
        if isinstance(lf.collect_schema()[col], pl.Array):
            c = c.arr.to_list()
        h = (lf.select(c.alias("x")).filter(pl.col("x").list.min() < 0)
             .select(pl.col("x").hash()).collect().to_series().unique().to_numpy())
        hashes.append(h)
        owners.append(np.full(h.size, i, dtype=np.int64))
    if not sum(h.size for h in hashes):
        return []
    all_h, all_f = np.concatenate(hashes), np.concatenate(owners)
    order = np.lexsort((all_f, all_h))
    all_h, all_f = all_h[order], all_f[order]
    starts = np.flatnonzero(np.r_[True, all_h[1:] != all_h[:-1]])
    sizes = np.diff(np.r_[starts, all_h.size])
    nf = len(files)
    two = starts[sizes == 2]  # (the usual case: one list in two files)
    a, b = all_f[two], all_f[two + 1]
    codes = [a * nf + b, b * nf + a]
    for st, sz in zip(starts[sizes > 2], sizes[sizes > 2], strict=True):  # (rare)
        grp = all_f[st:st + sz]
        codes.append((grp[:, None] * nf + grp[None, :])[~np.eye(sz, dtype=bool)])
    pair, count = np.unique(np.concatenate(codes), return_counts=True)
    best: dict[int, tuple[int, int]] = {}  # file -> (other file, rows shared)
    for code, k in zip(pair.tolist(), count.tolist(), strict=True):
        fi, gi = divmod(code, nf)
        if k >= max(REWRITTEN_MIN_ROWS, REWRITTEN_SHARE * hashes[fi].size) and (
                fi not in best or k > best[fi][1]):
            best[fi] = (gi, k)
    out = []
    for fi, (gi, k) in sorted(best.items()):
        if best.get(gi, (None,))[0] == fi and gi > fi:  # each repeats the other: the later
            continue
        out.append((files[gi], files[fi], int(k), int(hashes[fi].size)))
    return out


def _file_labels(files: Sequence[Path]) -> dict[Path, str]:
    """A name per input file, unique within the input: the file name, or when two files
    share one (``r0/part-0.parquet``, ``r1/part-0.parquet``) the path below the folder
    holding them all. Nested files without a seq_id name their sequences ``label:row``:
    the same label for two files would merge their sequences."""
    names = [f.name for f in files]
    if len(set(names)) == len(names):
        return {f: f.name for f in files}
    full = [f.resolve() for f in files]
    root = Path(os.path.commonpath([str(p.parent) for p in full]))
    return {f: str(p.relative_to(root)) for f, p in zip(files, full, strict=True)}


#: the values a padded tensor dumped without its mask holds at its padding, per column
PAD_VALUES = [0.0, -1.0]


def _unpadded_range(srcs: Mapping[str, str], list_srcs: Sequence[str]
                    ) -> tuple[pl.Expr, pl.Expr]:
    """Per list row of a nested file without a loss mask: the index range [lo, hi) outside
    which its tokens are tensor padding: lo is the first, hi - 1 the last token whose train
    or infer logprob (or entropy, when a list) is not a pad value, exactly 0.0 or -1.0, or
    NaN (a tensor padded with NaN: at the row's ends, where every column is a pad value;
    both 0 when every token is; a null is not padding, a null list is ignored).
    A padded ``[batch,
    length]`` tensor dumped without its mask pads with zeros, or with -1 (verl pads
    ``rollout_log_probs`` with -1 and ``old_log_probs`` with 0), on the right or on the
    left: counted as tokens, the padding would add tokens at H = 0 with delta = 0, or
    exclusions that read as logprobs the engine did not return."""
    cols = [srcs[c] for c in ("train_logprob", "infer_logprob", "entropy")
            if c in srcs and srcs[c] in list_srcs]
    assert cols
    # per column: the first and last token holding a value that is no pad value (null for
    # a null list, which says nothing of the padding: the others' pad values decide)
    v = pl.element().cast(pl.Float64)
    nz = [pl.col(c).list.eval(pl.arg_where(
        (~(v.is_in(PAD_VALUES) | v.is_nan())).fill_null(True))) for c in cols]
    lo = pl.min_horizontal([z.list.first() for z in nz]).cast(pl.Int64).fill_null(0)
    hi = pl.max_horizontal([z.list.last() for z in nz]).cast(pl.Int64).fill_null(-1) + 1
    return lo, hi


def _key_read_as_other(canon: str, src: str, uses: Sequence[tuple[str, str]],
                       available: Mapping[str, pa.DataType]) -> list[str]:
    """A ``warning: ...`` note (a list of none or one) when a sequence key column (seq_id,
    step, position) was taken from a name a framework reads as another column (slime's
    ``rollout_id`` is its step, elsewhere a sequence id) and the input holds two or more of
    that framework's other column names: the dump is probably that framework's, and its
    sequences are keyed wrongly (every sequence of a step read as one). ``uses``:
    :func:`~entr_diag.io.schema.other_uses` of the name."""
    if canon not in ("seq_id", "step", "position"):
        return []
    for k, other in uses:
        own = sorted(n for c, n in S.FRAMEWORKS[k].items()
                     if n in available and n != src and n not in S.SHARED_NAMES)
        if len(own) >= 2:
            return [f"warning: {canon} <- '{src}', which {k} writes as its {other} (and the "
                    f"input has {k}'s {', '.join(repr(n) for n in own)} too): if this is a "
                    f"{k} dump, its sequences are keyed wrongly here; pass --framework {k}"]
    return []


def _unmapped_masks(available: Mapping[str, pa.DataType], mapping: Mapping[str, str],
                    ranges: Callable[[str], list[tuple[Any, Any]]]) -> list[str]:
    """A ``warning: ...`` note (a list of none or one) when no loss mask is mapped but the
    input has boolean or integer columns whose names hold "mask" (``mask``,
    ``attention_mask``, ``loss_mask_0``): not known loss-mask names, so not used, yet each
    may be what marks the trained tokens; unused, every row counts as a trained token
    (padding and the prompt too), which dilutes keep rates, KL and the bins at H = 0.
    ``ranges``: a column's (min, max) per file where the Parquet statistics give it; a
    column with a value outside [0, 1] there (``mask_token_id``) is no mask."""
    mapped = set(mapping.values())

    def zero_one(n: str) -> bool:
        return all(lo >= 0 and hi <= 1 for lo, hi in ranges(n)
                   if isinstance(lo, (int, float)) and isinstance(hi, (int, float)))

    cands = sorted(n for n, t in available.items()
                   if "mask" in n.lower() and n not in mapped
                   and _kind_ok(S.BOOL, _value_type(t)) and zero_one(n))
    if not cands:
        return []
    shown = ", ".join(repr(c) for c in cands[:4]) + (", ..." if len(cands) > 4 else "")
    return [f"warning: no loss mask column is mapped, so every row counts as a trained "
            f"token, but the input has {shown}, not a known "
            f"loss-mask name and not used: if it marks the trained tokens, map it with "
            f"--column loss_mask={cands[0]} (an attention mask over prompt and response "
            "marks the prompt as trained too)"]


def _padding_rows(srcs: Mapping[str, str]) -> pl.Expr:
    """Per row of a long file without a loss mask: True where it is tensor padding, its
    entropy exactly 0.0 and its train and infer logprobs each exactly a pad value (0.0 or
    -1.0, :data:`PAD_VALUES`). A padded ``[batch, length]`` tensor flattened to one row per
    token without its mask holds such rows; a real token does not: an entropy of exactly 0
    with a logprob of -1 is no distribution, and an fp32 trainer's log-softmax is exactly 0
    only for a logit gap of about 17 nats or more, whose entropy (about gap * exp(-gap) *
    vocabulary) is not exactly 0 below a gap of about 100 nats (the bundled real-model run
    holds no such row). Without an entropy column no row is taken for padding: a token with
    both logprobs exactly 0 (a bf16 trainer's forced step) could be real."""
    if "entropy" not in srcs:
        return pl.lit(False)
    cond = pl.col(srcs["entropy"]).cast(pl.Float64, strict=False) == 0.0
    for c in ("train_logprob", "infer_logprob"):
        if c in srcs:
            cond = cond & pl.col(srcs[c]).cast(pl.Float64, strict=False).is_in(PAD_VALUES)
    return cond.fill_null(False)


def _with_hive(lf: pl.LazyFrame, types: Mapping[str, pa.DataType], hive: Mapping[str, str],
               mapping: Mapping[str, str]) -> pl.LazyFrame:
    """``lf`` with the mapped partition values the file lacks as literal columns."""
    hive_cols = [
        pl.lit(None if v == _HIVE_NULL else int(v) if _int_like(v) else v).alias(k)
        for k, v in hive.items() if k not in types and k in set(mapping.values())
    ]
    return lf.with_columns(hive_cols) if hive_cols else lf


def _numbering_keys(mapping: Mapping[str, str]) -> list[str]:
    """The columns whose groups are numbered 0, 1, ... in row order when a long file has no
    position column: one sequence is one (step, seq_id), or one seq_id without a step."""
    return ["step", "seq_id"] if "step" in mapping else ["seq_id"]


def _position_offsets(plans: Sequence[tuple], mapping: Mapping[str, str],
                      sid_dtype: type[pl.DataType], per_file: bool = False
                      ) -> tuple[dict[tuple[int, int], pl.DataFrame], dict[int, pl.DataFrame], int]:
    """Where positions are numbered in row order (long files without a position column;
    ``plans``: the loader's per-file tuples), the rows (``_off``, Int64) each sequence
    (:func:`_numbering_keys`) has before each chunk, so that numbering continues over chunks
    AND files in input order.

    Returns (offsets per (file index, chunk index) of a file read in several chunks, offsets
    per file index for its whole-file frame, the number of sequences found in more than
    one file); only sequences with rows before are listed. ``per_file``: the seq_ids
    are local to each file, prefixed by its path (``seq_id_per_file``). One streaming scan of the key
    columns per chunk, all in one ``collect_all``; memory O(sequences x files they span).
    """
    keys = _numbering_keys(mapping)
    queries, where = [], []
    for i, (f, types, hive, _layout, scan, ranges, numbered) in enumerate(plans):
        if not numbered:
            continue
        cols = [_seq_id_expr(pl.col(mapping["seq_id"]), types.get(mapping["seq_id"]),
                             sid_dtype, str(f) if per_file else None).alias("seq_id")]
        if "step" in mapping:
            cols.append(_canonical_cast("step", pl.col(mapping["step"]),
                                        types.get(mapping["step"])).alias("step"))
        for j, (off, n, _t) in enumerate(ranges):
            part = _with_hive(scan.slice(off, n) if len(ranges) > 1 else scan, types, hive,
                              mapping)
            queries.append(part.select(*cols, pl.lit(len(where), pl.Int64).alias("_c"),
                                       pl.lit(i, pl.Int64).alias("_f")))
            where.append((i, j))
    if not queries:
        return {}, {}, 0
    # one streaming query per _MAX_FILES_PER_CHUNK chunks (one query per chunk costs ~10 ms:
    # 20 s for 2000 small files; all in one query opens too many files at once)
    step = _MAX_FILES_PER_CHUNK
    t = pl.concat([
        pl.concat(queries[k:k + step]).group_by(["_c", "_f", *keys])
        .agg(pl.len().cast(pl.Int64).alias("_n")).collect(engine="streaming")
        for k in range(0, len(queries), step)]).sort("_c", maintain_order=True)
    # rows of the same sequence in the chunks before (input order: _c ascending)
    t = t.with_columns((pl.col("_n").cum_sum().over(keys) - pl.col("_n")).alias("_off"))
    per_file = (t.group_by(["_f", *keys]).agg(pl.col("_n").sum(), pl.col("_c").min())
                .sort("_c").with_columns((pl.col("_n").cum_sum().over(keys) - pl.col("_n"))
                                         .alias("_off")))
    continued = int((per_file.group_by(keys).len()["len"] > 1).sum())
    chunk_offs: dict[tuple[int, int], pl.DataFrame] = {}
    for (k,), g in t.filter(pl.col("_off") > 0).partition_by("_c", as_dict=True).items():
        chunk_offs[where[int(k)]] = g.select(*keys, "_off")  # type: ignore[call-overload]
    file_offs: dict[int, pl.DataFrame] = {}
    for (i,), g in per_file.filter(pl.col("_off") > 0).partition_by("_f", as_dict=True).items():
        file_offs[int(i)] = g.select(*keys, "_off")  # type: ignore[call-overload]
    return chunk_offs, file_offs, continued


#: canonical columns whose one-element list in a nested row is the value of all its tokens
_BROADCAST_LISTS: tuple[str, ...] = ("step", "policy_version", "train_version")


def _refuse_long_lists(path: Path, types: Mapping[str, pa.DataType],
                       mapping: Mapping[str, str]) -> None:
    """Refuse (:class:`SchemaError`) a long-layout file (scalar logprobs) with a mapped
    list column, naming the file and the column."""
    for canon, src in mapping.items():
        if src in types and _is_list(types[src]):
            raise SchemaError(
                f"{path}: column '{src}' ({canon}) is a list column but the file is in the long "
                "layout (scalar logprobs); map a scalar column or fix the dump."
            )


def _check_list_seq_id(path: Path, lf: pl.LazyFrame, src: str) -> None:
    """Refuse a nested file whose seq_id column ``src`` holds lists (``[id]``, or the id
    repeated per token) with more than one distinct value in a row: which id is the
    sequence's is not known. :class:`SchemaError` naming the file, the column, the number
    of such rows and the first of them (row number, values)."""
    many = pl.col(src).list.n_unique() > 1
    bad = (lf.filter(many.fill_null(False))
           .select(pl.len().alias("n"), pl.col("_row").first().alias("row"),
                   pl.col(src).list.unique(maintain_order=True).list.head(3)
                   .cast(pl.List(pl.String)).first().alias("ids"))
           .collect(engine="streaming"))
    n = int(bad["n"][0])
    if n:
        ids = ", ".join(str(x) for x in bad["ids"][0])
        raise SchemaError(
            f"{path}: column '{src}' (seq_id) holds a list per row, with different values "
            f"in {n:,} row(s) (e.g. row {bad['row'][0]}: {ids}, ...); seq_id needs one id "
            "per sequence (a list of one value, or the same value per token, is read as "
            "that value): map the sequence id with --column seq_id=NAME.")


def _row_key(sid: pl.Expr | None) -> pl.Expr:
    """How the checks of nested rows name a row: its seq_id, else ``row N``."""
    return sid.cast(pl.String) if sid is not None else pl.format("row {}", pl.col("_row"))


def _check_ragged(path: Path, lf: pl.LazyFrame, lens: Mapping[str, pl.Expr], n_tok: pl.Expr,
                  srcs: Mapping[str, str], list_srcs: Sequence[str],
                  sid: pl.Expr | None) -> None:
    """Refuse a nested file with a row whose per-token lists (``lens``: their lengths, null
    for a null list) differ in length, naming the culprit list columns (in each such row,
    those whose length most of the row's other lists do not share; all of them on a tie)
    with their numbers of rows, and the first seq_ids (``sid``: the row's seq_id, None
    without one: rows are then named by number). A null list is no culprit: its tokens
    hold nulls (see :func:`_file_frame`)."""
    if len(list_srcs) < 2:
        return
    key = _row_key(sid)
    ragged = pl.any_horizontal([(lens[src] != n_tok).fill_null(False) for src in list_srcs])
    # per list: how many of the row's lists share its length (0 for a null list)
    agree = {src: pl.sum_horizontal([(lens[d] == lens[src]).fill_null(False).cast(pl.Int32)
                                     for d in list_srcs]).alias(f"_a{i}")
             for i, src in enumerate(list_srcs)}
    most = pl.max_horizontal([pl.col(f"_a{i}") for i in range(len(list_srcs))])
    tie = pl.sum_horizontal([(pl.col(f"_a{i}") == most).cast(pl.Int32)
                             for i in range(len(list_srcs))]) > most
    # each list's length minus the reference list's (train_logprob's; for that one, minus
    # infer_logprob's): the same difference in every row says which entry is extra
    ref = srcs["train_logprob"]
    other = srcs.get("infer_logprob", next(src for src in list_srcs if src != ref))
    diff = {src: (lens[src].cast(pl.Int64) - lens[other if src == ref else ref].cast(pl.Int64))
            .alias(f"_d{i}")
            for i, src in enumerate(list_srcs)}
    culprit = {src: ((pl.col(f"_a{i}") > 0) & ((pl.col(f"_a{i}") < most) | tie))
               for i, src in enumerate(list_srcs)}
    bad = (
        lf.filter(ragged)
        .select(key.alias("_k"), *agree.values(), *diff.values())
        .select(pl.len().alias("n"), pl.col("_k").head(_MAX_LISTED).implode().alias("keys"),
                *[c.sum().alias(src) for src, c in culprit.items()],
                *[pl.col(f"_d{i}").filter(culprit[src]).min().alias(f"_lo{i}")
                  for i, src in enumerate(list_srcs)],
                *[pl.col(f"_d{i}").filter(culprit[src]).max().alias(f"_hi{i}")
                  for i, src in enumerate(list_srcs)])
        .collect(engine="streaming")
    )
    n = int(bad["n"][0])
    if n:
        keys = ", ".join(str(k) for k in bad["keys"][0])
        canon = {src: c for c, src in srcs.items()}
        culprits = [(i, src, int(bad[src][0])) for i, src in enumerate(list_srcs)
                    if bad[src][0]]
        culprits.sort(key=lambda c: -c[2])

        def extra(i: int, src: str, k: int) -> str:
            """'src' is d entries longer / shorter in every ragged row (a constant offset:
            an entry added or dropped at one end), else ''."""
            lo, hi = bad[f"_lo{i}"][0], bad[f"_hi{i}"][0]
            if lo is None or lo != hi or lo == 0 or k != n:
                return ""
            than = other if src == ref else ref
            return (f"'{src}' is {abs(lo):,} {'entry' if abs(lo) == 1 else 'entries'} "
                    f"{'longer' if lo > 0 else 'shorter'} than '{than}' in "
                    f"{'each of those rows' if n > 1 else 'that row'}")

        named = _or_list([f"'{src}'" + (f" ({canon[src]})" if canon.get(src, src) != src else "")
                          + f" in {k:,} row{'s' if k > 1 else ''}" for _i, src, k in culprits],
                         "and")
        # (with a tie, e.g. two lists only, the offset of a list against train_logprob)
        offsets = ([e for e in (extra(*c) for c in culprits if c[1] != ref) if e]
                   or [e for e in (extra(*c) for c in culprits if c[1] == ref) if e])
        detail = (f"; {' and '.join(offsets)}: an extra or missing leading or trailing "
                  "entry, such as a prompt / BOS logprob?" if offsets else "")
        raise InputError(
            f"{path}: {n:,} nested row(s) have per-token lists of different lengths: "
            f"{named} differ{'s' if len(culprits) == 1 else ''} from the row's other lists"
            f"{detail}; seq_id(s): {keys}. Every per-token list of a sequence must have one "
            "entry per token."
        )


def _cu_seqlens(src: str) -> pl.Expr:
    """The cu_seqlens list column ``src`` as Int64 lists: float values (lists written from
    float tensors) whole values only, NaN, infinite and fractional ones null (a list
    holding a null is then refused by :func:`_check_packed`, never cut to a whole number)."""
    e = pl.element().cast(pl.Float64)
    return pl.col(src).list.eval(
        pl.when(e == e.floor()).then(e).cast(pl.Int64, strict=False))


def _check_packed(path: Path, lf: pl.LazyFrame, src: str, n_tok: pl.Expr,
                  sid: pl.Expr | None) -> None:
    """Refuse a nested file with a packed row whose cu_seqlens list ``src`` does not split
    its ``n_tok`` tokens (it must start at 0, never fall and end at the row's length; a
    null list, or one holding a null, is no split), naming the file, the column, the
    number of such rows and the first of them (by seq_id, else row number) with their
    list and token count (:class:`InputError`)."""
    cu = _cu_seqlens(src)
    bad = (cu.is_null() | (cu.list.len() == 0) | cu.list.eval(pl.element().is_null()).list.any()
           | (cu.list.first() != 0)
           | (cu.list.last() != n_tok.fill_null(0))
           | (cu.list.diff(null_behavior="drop").list.min().fill_null(0) < 0))
    key = _row_key(sid) if sid is None else pl.format("seq_id {}", _row_key(sid))
    listed = pl.format("[{}]", pl.col(src).list.eval(
        pl.element().cast(pl.String).fill_null("null")).list.join(", "))
    t = (lf.filter(bad.fill_null(True))
         .select(pl.len().alias("n"),
                 pl.format("{} ({} tokens, cu_seqlens {})", key, n_tok.fill_null(0),
                           listed.fill_null("null"))
                 .head(_MAX_LISTED).implode().alias("rows"))
         .collect(engine="streaming"))
    n = int(t["n"][0])
    if n:
        raise InputError(
            f"{path}: {n:,} packed row(s) have a cu_seqlens ('{src}') that does not split the "
            "row's tokens: it must rise in whole numbers from 0 to the row's number of "
            "tokens (the cumulative lengths of the sequences the row packs); e.g. "
            + "; ".join(t["rows"][0]) + ".")


def _with_segments(lf: pl.LazyFrame, src: str) -> pl.LazyFrame:
    """``lf`` (nested rows with ``_row``) with two per-token lists from its cu_seqlens
    ``src`` (checked by :func:`_check_packed`): ``_seg``, the index of the token's sequence
    in the row (its place in ``src``), and ``_start``, that sequence's first token index
    in the row; sequences of length 0 hold no token. Empty lists for a row without tokens."""
    cu = _cu_seqlens(src)
    segs = (lf.select("_row", cu.list.diff(null_behavior="drop").alias("_len"))
            .explode("_len", empty_as_null=False)
            .with_columns(pl.int_range(pl.len()).over("_row").cast(pl.Int64).alias("_seg"),
                          (pl.col("_len").cum_sum().over("_row") - pl.col("_len"))
                          .alias("_start"))
            .filter(pl.col("_len") > 0)
            .select("_row", pl.col("_seg").repeat_by("_len"),
                    pl.col("_start").repeat_by("_len"))
            .explode(["_seg", "_start"])
            .group_by("_row", maintain_order=True).agg("_seg", "_start"))
    empty = pl.lit([], dtype=pl.List(pl.Int64))
    return (lf.join(segs, on="_row", how="left", maintain_order="left")
            .with_columns(pl.col("_seg").fill_null(empty), pl.col("_start").fill_null(empty)))


def _seq_key_expr(mapping: Mapping[str, str]) -> pl.Expr:
    """UInt64 sequence key: hash of (step, seq_id); stable for a given polars version."""
    if "step" in mapping:
        return pl.struct(pl.col("step"), pl.col("seq_id")).hash(seed=0).alias("seq_key")
    return pl.col("seq_id").hash(seed=0).alias("seq_key")


#: the exclusion reasons about the logprob values, in order of precedence: each is a
#: condition on either side (:func:`_side_conditions`)
_LOGPROB_REASONS = ("non_finite_logprob", "sentinel_logprob", "positive_logprob",
                    "zero_placeholder")


def _either(sides: Mapping[str, pl.Expr]) -> pl.Expr:
    return sides["train_logprob"] | sides["infer_logprob"]


def _reason_conditions(mapping: Mapping[str, str], nucleus: bool | pl.Series = False,
                       minus_one: Sequence[str] = (), below_zero: bool = False
                       ) -> list[tuple[str, pl.Expr]]:
    """(reason, condition) in order of precedence: a row's reason is the first whose
    condition is true (a null condition counts as false); no reason: a valid token.
    ``nucleus``: an engine logprob of exactly 0.0 is a one-token nucleus
    (:func:`_side_conditions`); ``below_zero``: versions below 0 are version numbers (no
    ``negative_version``: :func:`_negative_versions`)."""
    mask = pl.col("loss_mask") if "loss_mask" in mapping else pl.lit(True)
    out = [
        ("empty_row", pl.col("_empty")),
        *([("invalid_loss_mask", pl.col("_mask_bad"))] if "loss_mask" in mapping else []),
        ("null_loss_mask", mask.is_null()),
        ("unmasked", ~mask),
        ("padding", pl.col("_pad")),
        ("missing_seq_id", pl.col("seq_id").is_null()),
        *([("invalid_position", pl.col("position").is_null() | (pl.col("position") < 0))]
          if "position" in mapping else []),
        *[(r, _either(_side_conditions(r, nucleus, "entropy" in mapping, minus_one)))
          for r in _LOGPROB_REASONS],
    ]
    if "entropy" in mapping:
        h = pl.col("entropy")
        out.append(("invalid_entropy",
                    h.is_null() | ~h.is_finite() | (h < -S.ENTROPY_NEG_TOL)
                    | (h > S.ENTROPY_MAX)))
    vers = [pl.col(c) < 0 for c in ("policy_version", "train_version")
            if c in mapping and not below_zero]
    if vers:
        cond = vers[0]
        for v in vers[1:]:
            cond = cond | v
        out.append(("negative_version", cond.fill_null(False)))
    return out


def _reason_expr(mapping: Mapping[str, str], *, codes: bool = False,
                 minus_one: Sequence[str] = (),
                 nucleus: bool | pl.Series = False, below_zero: bool = False) -> pl.Expr:
    """The ``reason`` of each raw row (String, null for a valid loss-masked token); with
    ``codes``: its index in :func:`_reason_conditions` (UInt8; cheaper to group by)."""
    conds = _reason_conditions(mapping, nucleus, minus_one, below_zero)
    e = None
    for i, (name, cond) in enumerate(conds):
        val = pl.lit(i, dtype=pl.UInt8) if codes else pl.lit(name)
        e = pl.when(cond).then(val) if e is None else e.when(cond).then(val)
    assert e is not None
    return e.otherwise(pl.lit(None, dtype=pl.UInt8 if codes else pl.String))


def _valid_expr(mapping: Mapping[str, str], nucleus: bool | pl.Series = False,
                minus_one: Sequence[str] = (), below_zero: bool = False) -> pl.Expr:
    """True for a valid loss-masked token (``reason`` is null): no condition of
    :func:`_reason_conditions` holds (a null condition counting as false). Written as one
    term per column saying what a valid value is (a logprob in (SENTINEL_FLOOR,
    POSITIVE_LOGPROB_TOL], NaN and infinities failing the comparisons; an entropy in [0,
    ENTROPY_MAX]; ...), a null value making its term null and the row invalid: about half
    the per-row operations of negating each condition (a validation costs as much as
    decoding the columns). ``tests/test_io.py`` checks it against the conditions."""
    tl, il = pl.col("train_logprob"), pl.col("infer_logprob")
    terms = [~pl.col("_empty").fill_null(False), pl.col("loss_mask").fill_null(False)
             if "loss_mask" in mapping else pl.lit(True), ~pl.col("_pad").fill_null(False),
             pl.col("seq_id").is_not_null()]
    if "loss_mask" in mapping:
        terms.append(~pl.col("_mask_bad").fill_null(False))
    if "position" in mapping:
        terms.append(pl.col("position") >= 0)
    for x in (tl, il):
        terms += [x > S.SENTINEL_FLOOR, x <= S.POSITIVE_LOGPROB_TOL]
    terms += [pl.col(c) != -1.0 for c in minus_one]  # (a padding value: sentinel_logprob)
    terms.append(~_either(_side_conditions("zero_placeholder", nucleus,
                                           "entropy" in mapping)))
    if "entropy" in mapping:
        h = pl.col("entropy")
        terms += [h >= -S.ENTROPY_NEG_TOL, h <= S.ENTROPY_MAX]
    reasons = dict(_reason_conditions(mapping, nucleus, minus_one, below_zero))
    if "negative_version" in reasons:
        terms.append(~reasons["negative_version"])  # (never null)
    return pl.all_horizontal(terms).fill_null(False)


def _valid_columns(mapping: Mapping[str, str]) -> list[pl.Expr]:
    cols = [pl.col("seq_id").cast(pl.String), pl.col("seq_id").alias(NATIVE_SEQ_ID),
            pl.col(FILE_INDEX), pl.col("seq_key"), pl.col("position")]
    for canon in ("step", "train_logprob", "infer_logprob"):
        if canon in mapping:
            cols.append(pl.col(canon))
    cols.append((pl.col("train_logprob") - pl.col("infer_logprob")).alias("delta"))
    if "entropy" in mapping:  # (a valid entropy below 0 is rounding: read as 0, counted)
        cols.append(pl.col("entropy").clip(lower_bound=0.0))
    for canon in ("policy_version", "train_version"):
        if canon in mapping:
            cols.append(pl.col(canon))
    if "policy_version" in mapping and "train_version" in mapping:
        cols.append((pl.col("train_version") - pl.col("policy_version")).alias("staleness"))
    for canon in ("token_id", "advantage", "train_logprob_recompute"):
        if canon in mapping:
            cols.append(pl.col(canon))
    return cols


#: fill values of the per-token columns the accounting reduces with minima / maxima (a
#: token that does not count there: excluded, or a null version)
_I64_MAX, _I64_MIN = np.iinfo(np.int64).max, np.iinfo(np.int64).min


#: the entropy (nats) from which a valid token repeating the row before it exactly is
#: counted as a row written twice (:class:`_AccountingScan`): near-certain tokens (H ~ 0,
#: logprobs ~ 0) repeat their values legitimately; above 0.01 nats no real run repeats
#: all three values in consecutive tokens (0 of 160,000 tokens, bf16 columns included)
REPEAT_H_MIN = 0.01
#: without a position column: a sequence key whose rows come in several blocks of one
#: batch, other keys' rows between them (a per-step sample index reused as seq_id without
#: a step column), is warned about from this many such keys, blocks of this many rows on
#: average (rows logged interleaved come in shorter runs, regrouped by the passes) and
#: this share of the rows
SPLIT_MIN_KEYS = 10
SPLIT_MIN_RUN = 32
SPLIT_MIN_SHARE = 0.01
#: ... warned about from this many tokens and this share of those checked
REPEAT_MIN_TOKENS = 20
REPEAT_MIN_SHARE = 1e-3
#: rows repeating any row of their sequence (not in a row) are estimated on 1 in this many
#: hashed rows, and warned about from REPEAT_ANY_MIN_SAMPLED repeats in the sample and
#: REPEAT_ANY_MIN_SHARE of it (real runs with all three columns in bf16: 0.02% at most,
#: equal values by chance; a tenth of the sequences written twice: 10%)
REPEAT_SAMPLE = 64
REPEAT_ANY_MIN_SAMPLED = 10
REPEAT_ANY_MIN_SHARE = 5e-3


def _sampled_repeats(hashes: Sequence[np.ndarray]) -> tuple[int, int]:
    """(rows sampled, of them repeating another: rows minus distinct hashes)."""
    if not hashes:
        return 0, 0
    h = np.concatenate(hashes)
    return int(h.size), int(h.size - np.unique(h).size)


class _AccountingScan:
    """The accounting pass over the raw frame: a batch accumulator.

    The engine computes per row (:attr:`exprs`, while it reads the chunk) the row's
    ``code``: the index of its reason in :func:`_reason_conditions`, or, for a valid
    token, ``n_reasons`` (``n_reasons + 1`` when its policy_version is null), its step
    (a fill value when null) and, for valid tokens, their fine entropy bin. Per batch,
    numpy reduces the runs of consecutive rows of one sequence (the rows of a sequence are
    usually together; scattered rows are sorted by the pass): the rows per (run, code)
    with one ``bincount``, the ranges of the valid tokens' positions and versions with
    ``reduceat`` (masked by the code in numpy: the engine's reading of the chunk, not this
    thread, bounds the pass, so the masks cost it nothing); the run rows are merged by
    ``seq_key`` (:class:`PartialRows`: a sequence may span batches and chunks). The fine
    entropy bins and the staleness of the valid tokens are counted with ``bincount``. (A
    polars group-by of every row by (sequence, staleness, reason) did the same at twice the
    cost of the engine's reading of the chunk; polars operations here would wait for the
    thread pool the engine reads the next chunk with.)"""

    def __init__(self, mapping: Mapping[str, str], n_reasons: int,
                 nucleus: bool | pl.Series = False, minus_one: Sequence[str] = (),
                 below_zero: bool = False, neg_code: int | None = None) -> None:
        from entr_diag.aggregate import N_FINE, fine_bin_expr

        self.has_pv, self.has_tv = "policy_version" in mapping, "train_version" in mapping
        self.has_step = "step" in mapping
        self.fine = "entropy" in mapping
        self.n_codes = n_reasons + (2 if self.has_pv else 1)
        self.n_reasons = n_reasons
        valid = pl.col("_rc").is_null()
        i64 = pl.Int64
        self.stages = [[_reason_expr(mapping, codes=True, nucleus=nucleus,
                                     minus_one=minus_one, below_zero=below_zero)
                        .alias("_rc")]]
        # (a valid token without a policy_version: n_reasons + 1, set in numpy)
        exprs = [pl.col("_rc").fill_null(n_reasons).alias("_ac_code")]
        #: (name of the range, its column): the ranges over the valid tokens that hold a
        #: value, reduced in numpy from the canonical Int64 column (:meth:`_counted`)
        self.ranges = [("p", "position")]
        if self.has_pv:
            self.ranges.append(("pv", "policy_version"))
        if self.has_tv:
            self.ranges.append(("tv", "train_version"))
        if self.has_step:  # constant within a sequence key (the key hashes it)
            exprs.append(pl.col("step").cast(i64).fill_null(_I64_MIN).alias("_ac_step"))
        if self.fine:  # a valid token has a finite entropy >= 0 and a finite delta
            # (a valid entropy below 0, rounding, in a slot of its own: counted, then
            # added to bin 0, where the token frame's entropy clipped to 0 falls)
            exprs.append(pl.when(valid & (pl.col("entropy") < 0)).then(N_FINE + 2)
                         .when(valid).then(fine_bin_expr().cast(i64) + 1).otherwise(0)
                         .alias("_ac_fine"))
        # a valid token whose train_logprob equals its infer_logprob exactly (delta == 0)
        exprs.append((valid & (pl.col("train_logprob") == pl.col("infer_logprob")))
                     .fill_null(False).alias("_ac_same"))
        # per logprob column a digit (_m1_code): 1 for a valid token's logprob exactly
        # -1.0, 2 + i at the control value MINUS_ONE_CONTROLS[i] (values a rounded column
        # holds as often), and a flag for one within POSITIVE_LOGPROB_TOL of 0 (a value
        # that cannot tell a logprob from its negation)
        m1 = pl.lit(0, dtype=pl.UInt8)
        for b, c in enumerate(("train_logprob", "infer_logprob")):
            digit = pl.lit(0, dtype=pl.UInt8)
            for v, value in enumerate((-1.0, *S.MINUS_ONE_CONTROLS)):
                digit = digit + ((valid & (pl.col(c) == value)).fill_null(False)
                                 .cast(pl.UInt8) * (v + 1))
            near = (valid & (pl.col(c).abs() <= S.POSITIVE_LOGPROB_TOL)).fill_null(False)
            m1 = m1 + digit * _M1_DIGITS ** b + near.cast(pl.UInt8) * (_M1_NEAR << b)
        exprs.append(m1.alias("_ac_m1"))
        # rows without a seq_id (missing_seq_id, or outside the mask): keyed by the null
        # seq_id (and their step), which is no sequence of the input
        exprs.append(pl.col("seq_id").is_null().alias("_ac_nosid"))
        self.exprs = exprs
        self.columns = ["seq_key", FILE_INDEX, *(c for _, c in self.ranges)]
        #: without a position column (rows numbered in file order), valid tokens repeating
        #: the row before them in their sequence exactly (both logprobs and the entropy, at
        #: an entropy of REPEAT_H_MIN or more): rows written twice; and the tokens checked
        self.row_check = "position" not in mapping and self.fine
        self.row_repeats = self.row_checked = 0
        self.row_hashes: list[np.ndarray] = []  # (the sampled hashes, _repeated_rows)
        #: without a position column: sequence keys whose rows come in several separate
        #: blocks of one batch, those blocks and their rows (:meth:`_split_blocks`)
        self.block_check = "position" not in mapping
        self.split = [0, 0, 0]
        self.split_keys: set[int] = set()
        #: the reason code of negative_version (None: not a reason here) and the lowest
        #: version of each column over those rows
        self.neg_code = neg_code
        self.neg_min: dict[str, int] = {}
        if self.row_check:
            self.columns += ["train_logprob", "infer_logprob", "entropy"]
        #: valid tokens with a negative staleness per input file (by FILE_INDEX)
        self.ahead: dict[int, int] = {}
        cols = [f"c{i}" for i in range(self.n_codes)]
        merge = [pl.col(c).sum() for c in cols]
        for r, _ in self.ranges:
            merge += [pl.col(f"{r}lo").min(), pl.col(f"{r}hi").max()]
        if self.has_step:
            merge.append(pl.col("step").min())
        # the input files of each sequence (lowest, highest FILE_INDEX; a run's first and
        # last rows: a run spans files only within a chunk of several small files), and
        # those of the first 64 files as bits
        merge += [pl.col("flo").min(), pl.col("fhi").max(), pl.col("fbits").bitwise_or()]
        # valid tokens repeating the position of the row before them in the sequence (a
        # row written twice in a row): a duplicate however the mask is cut
        merge.append(pl.col("prep").sum())
        merge.append(pl.col("same").sum())  # valid tokens with delta == 0 exactly
        merge.append(pl.col("nosid").max())  # the key of rows without a seq_id
        self.parts = PartialRows(["seq_key"], merge, 4_000_000)
        self.counts = np.zeros(N_FINE + 3, dtype=np.int64)
        self.minus_one = np.zeros(256, dtype=np.int64)  # valid tokens per _ac_m1 code
        self.stale: dict[int, int] = {}

    def _repeated_rows(self, batch: pl.DataFrame, valid: np.ndarray) -> None:
        """Count the valid tokens (entropy >= REPEAT_H_MIN) that repeat the row before them
        in their sequence: the same train_logprob, infer_logprob and entropy (a row
        written twice in a row, which positions numbered by row order cannot show)."""
        h = column(batch, "entropy")
        ok = valid & (h >= REPEAT_H_MIN)
        self.row_checked += int(ok.sum())
        if batch.height < 2:
            return
        t, i, sk = (column(batch, c) for c in ("train_logprob", "infer_logprob", "seq_key"))
        same = ((t[1:] == t[:-1]) & (i[1:] == i[:-1]) & (h[1:] == h[:-1])
                & (sk[1:] == sk[:-1]) & ok[1:] & valid[:-1])
        self.row_repeats += int(same.sum())
        # rows repeating any row of their sequence (a sequence or a shard written twice,
        # not in a row): a hash of (sequence, logprobs, entropy) per checked token, kept
        # for 1 in REPEAT_SAMPLE of the hashes: the copies of a row share its hash, so
        # the sample holds all of them or none, and its repeats estimate the input's
        hx = np.ascontiguousarray(sk[ok]).astype(np.uint64)
        with np.errstate(over="ignore"):
            for x in (t[ok], i[ok], h[ok]):
                hx = (hx ^ np.ascontiguousarray(x, dtype=np.float64).view(np.uint64)) \
                    * np.uint64(0x9E3779B97F4A7C15)
                hx ^= hx >> np.uint64(29)
        self.row_hashes.append(hx[hx % np.uint64(REPEAT_SAMPLE) == 0])

    @staticmethod
    def _counted(batch: pl.DataFrame, name: str, valid: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
        """(values as int64, whether the row counts): the column's value of each valid
        token that has one (a null counts nowhere; an invalid row's value is whatever the
        dump holds)."""
        s = batch.get_column(name)
        if not s.null_count():
            return column(batch, name).astype(np.int64, copy=False), valid
        # (rare: a null version of a valid token; polars ops here wait for the engine)
        return (s.fill_null(0).cast(pl.Int64).to_numpy(),
                valid & s.is_not_null().to_numpy())

    def _split_blocks(self, keys: np.ndarray, starts: np.ndarray, height: int) -> None:
        """Counts the keys of a batch's runs (``keys``, one per run from ``starts``) that
        have several runs in it, their runs and rows (:attr:`split`)."""
        u, inv, cnt = np.unique(keys, return_inverse=True, return_counts=True)
        many = cnt[inv] > 1
        if many.any():
            lengths = np.diff(np.append(starts, height))
            self.split_keys.update(u[cnt > 1].tolist())
            self.split[1] += int(many.sum())
            self.split[2] += int(lengths[many].sum())

    def update(self, batch: pl.DataFrame) -> None:
        starts = run_starts(batch, ["seq_key"])
        code = column(batch, "_ac_code")
        if self.has_pv and batch.get_column("policy_version").null_count():
            code = code.copy()  # a valid token without a policy_version
            code[(code == self.n_reasons)
                 & batch.get_column("policy_version").is_null().to_numpy()] += 1
        rid = np.zeros(batch.height, dtype=np.int64)
        rid[starts[1:]] = 1
        np.cumsum(rid, out=rid)
        rid *= self.n_codes
        rid += code
        per = np.bincount(rid, minlength=starts.size * self.n_codes).reshape(
            starts.size, self.n_codes)
        cols: dict[str, np.ndarray] = {"seq_key": column(batch, "seq_key")[starts]}
        if self.block_check and starts.size > 1:
            self._split_blocks(cols["seq_key"], starts, batch.height)
        cols.update({f"c{i}": per[:, i] for i in range(self.n_codes)})
        valid = code >= self.n_reasons
        values: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for r, c in self.ranges:
            v, ok = values[r] = self._counted(batch, c, valid)
            cols[f"{r}lo"] = np.minimum.reduceat(np.where(ok, v, _I64_MAX), starts)
            cols[f"{r}hi"] = np.maximum.reduceat(np.where(ok, v, _I64_MIN), starts)
        if self.has_step:
            cols["step"] = column(batch, "_ac_step")[starts]
        if self.neg_code is not None:
            neg = code == self.neg_code
            if neg.any():  # (a null version reads 0 here: only the negatives matter)
                for r, c in self.ranges[1:]:
                    lo = int(values[r][0][neg].min())
                    self.neg_min[c] = min(self.neg_min.get(c, lo), lo)
        p, p_ok = values["p"]
        rep = np.zeros(p.size, dtype=np.int64)
        if p.size > 1:
            sk = column(batch, "seq_key")
            rep[1:] = (p[1:] == p[:-1]) & p_ok[1:] & p_ok[:-1] & (sk[1:] == sk[:-1])
        cols["prep"] = np.add.reduceat(rep, starts)
        if self.row_check:
            self._repeated_rows(batch, valid)
        cols["same"] = np.add.reduceat(column(batch, "_ac_same"), starts, dtype=np.int64)
        cols["nosid"] = column(batch, "_ac_nosid")[starts]
        if FILE_INDEX in batch.columns:
            f = column(batch, FILE_INDEX)
            first, last = f[starts], f[np.append(starts[1:], batch.height) - 1]
            cols["flo"], cols["fhi"] = np.minimum(first, last), np.maximum(first, last)
            one = np.uint64(1)
            cols["fbits"] = np.where(first < 64, np.left_shift(one, first.astype(np.uint64) % 64),
                                     np.uint64(0)) | np.where(
                last < 64, np.left_shift(one, last.astype(np.uint64) % 64), np.uint64(0))
        else:
            cols["flo"] = cols["fhi"] = np.zeros(starts.size, dtype=np.uint32)
            cols["fbits"] = np.ones(starts.size, dtype=np.uint64)
        self.parts.add(cols)
        if self.fine:
            self.counts += np.bincount(column(batch, "_ac_fine"), minlength=self.counts.size)
        self.minus_one += np.bincount(column(batch, "_ac_m1"), minlength=256)
        if self.has_pv and self.has_tv:
            (pv, pv_ok), (tv, tv_ok) = values["pv"], values["tv"]
            both = pv_ok & tv_ok
            every = bool(both.all())
            st = np.subtract(tv, pv) if every else np.subtract(tv[both], pv[both])
            ahead = st < 0
            if ahead.any() and FILE_INDEX in batch.columns:  # where: versions swapped?
                f = column(batch, FILE_INDEX)
                add_counts(self.ahead, (f if every else f[both])[ahead])
            if st.size:
                lo = int(st.min())
                if int(st.max()) - lo < 1 << 16:
                    cnt = np.bincount(st - lo)
                    vals = np.flatnonzero(cnt)
                    pairs = zip((vals + lo).tolist(), cnt[vals].tolist(), strict=True)
                else:
                    vals, cnt = np.unique(st, return_counts=True)
                    pairs = zip(vals.tolist(), cnt.tolist(), strict=True)
                for s, n in pairs:
                    self.stale[s] = self.stale.get(s, 0) + n

    def per_sequence(self, names: Sequence[str]) -> pl.DataFrame:
        """One row per sequence key: ``n`` rows, ``_valid`` valid tokens, the rows per
        reason (named), the ranges over its valid tokens (``_pos_lo`` ... null without
        one), ``_pv_nulls`` (valid tokens without a policy_version), ``_step`` (null
        for a sequence without valid tokens or whose step is null), ``_same`` (valid
        tokens whose train_logprob equals their infer_logprob exactly) and ``_no_seq_id``
        (the key of the rows without a seq_id: no sequence of the input)."""
        t = self.parts.result()
        if not t.height:
            return pl.DataFrame()
        nr = self.n_reasons
        valid = pl.col(f"c{nr}") + (pl.col(f"c{nr + 1}") if self.has_pv else 0)
        out = [pl.sum_horizontal([pl.col(f"c{i}") for i in range(self.n_codes)]).alias("n"),
               valid.alias("_valid"),
               *[pl.col(f"c{i}").alias(name) for i, name in enumerate(names)]]
        rename = {"p": "pos", "pv": "pv", "tv": "tv"}
        for r, _ in self.ranges:
            lo, hi = pl.col(f"{r}lo"), pl.col(f"{r}hi")
            out += [pl.when(lo != _I64_MAX).then(lo).alias(f"_{rename[r]}_lo"),
                    pl.when(hi != _I64_MIN).then(hi).alias(f"_{rename[r]}_hi")]
        if self.has_pv:
            out.append(pl.col(f"c{nr + 1}").alias("_pv_nulls"))
        if self.has_step:
            st = pl.col("step")
            out.append(pl.when((valid > 0) & (st != _I64_MIN)).then(st).alias("_step"))
        out += [pl.col("flo").alias("_file_lo"), pl.col("fhi").alias("_file_hi"),
                pl.col("fbits").alias("_file_bits"), pl.col("prep").alias("_pos_repeats"),
                pl.col("same").alias("_same"), pl.col("nosid").alias("_no_seq_id")]
        return t.select(out)


def _account(raw: pl.LazyFrame, mapping: Mapping[str, str], infos: Sequence[FileInfo],
             nucleus: bool | pl.Series = False, minus_one: Sequence[str] = (),
             below_zero: bool = False
             ) -> tuple[Accounting, tuple[np.ndarray | None, tuple[int, int] | None]]:
    """Token and sequence counts in one streaming pass (chunk by chunk), memory
    O(sequences); with an entropy column, the same pass counts the valid tokens per fine
    entropy bin (returned with their step range, for the fit: a valid token is one the fit
    uses). See :class:`_AccountingScan`."""
    reasons = ["unmasked", "padding", "empty_row", *S.EXCLUSION_REASONS]
    names = [name for name, _ in _reason_conditions(mapping, nucleus, minus_one, below_zero)]
    scan = _AccountingScan(mapping, len(names), nucleus, minus_one, below_zero,
                           names.index("negative_version")
                           if "negative_version" in names else None)
    try:
        run_pass(raw, [scan])
    except pl.exceptions.ComputeError as e:  # e.g. a value that does not cast
        raise InputError(f"cannot read the input ({_short(e)}).") from None
    per = scan.per_sequence(names)
    get = (lambda c: per[c]) if per.height else (lambda c: pl.Series(c, [], dtype=pl.Int64))
    count = {r: int(get(r).sum()) if r in per.columns else 0 for r in reasons}
    valid = get("_valid")
    masked = valid + sum((get(r) for r in S.EXCLUSION_REASONS if r in per.columns),
                         start=pl.Series([0] * len(valid), dtype=pl.Int64))
    file_excl: dict[str, dict[str, tuple[int, int]]] = {}
    starved: dict[str, dict[str, Any]] = {}
    if per.height and len(infos) > 1 and "_file_lo" in per.columns:  # files gone wrong
        by_file = _per_file(per)
        starved = _starved_files(by_file, infos)
        # (a starved file's few masked rows are excluded for whatever they hold: its own
        # warning, a mask that drops the file, explains them)
        file_excl = {r: kept for r, fs in _file_exclusions(by_file, infos).items()
                     if (kept := {f: v for f, v in fs.items() if f not in starved})}
    n_dup = 0
    dup_files: dict[str, int] = {}
    if per.height:
        span = pl.col("_pos_hi") - pl.col("_pos_lo") + 1
        # more valid tokens than positions, or a row repeating the position before it
        # (runs overlapping in span is no sign: shuffled rows split across chunks do)
        dup = per.filter(((pl.col("_valid") > span) | (pl.col("_pos_repeats") > 0))
                         .fill_null(False))
        n_dup = dup.height
        if n_dup and len(infos) > 1:  # which input files hold them (sequences per file)
            if len(infos) <= 64:  # every file of a sequence, as bits
                bits = dup["_file_bits"].to_numpy().astype(np.uint64)
                counts = [int(((bits >> np.uint64(i)) & np.uint64(1)).sum())
                          for i in range(len(infos))]
            else:  # the lowest and highest file of each sequence
                lo, hi = dup["_file_lo"].to_numpy(), dup["_file_hi"].to_numpy()
                both = np.concatenate([lo, hi[hi != lo]])
                counts = np.bincount(both.astype(np.int64)).tolist()
            dup_files = {str(infos[i].path): n for i, n in enumerate(counts)
                         if n and i < len(infos)}
    identical = _identical_logprobs(per, infos, valid_total=int(valid.sum())) \
        if per.height else None
    steps: tuple[int, ...] | None = None
    n_nullstep = 0
    if scan.has_step:
        st = get("_step")
        steps = tuple(int(x) for x in st.drop_nulls().unique().sort())
        n_nullstep = int(valid.filter(st.is_null()).sum()) if per.height else 0
    pv_pair = tv_pair = None
    n_switch = None
    if scan.has_pv:
        lo, hi, nulls = get("_pv_lo"), get("_pv_hi"), get("_pv_nulls")
        pv_pair = _pair(lo.min(), hi.max())
        n_switch = int(((lo != hi).fill_null(False) | ((nulls > 0) & lo.is_not_null())).sum())
    if scan.has_tv:
        tv_pair = _pair(get("_tv_lo").min(), get("_tv_hi").max())
    fine: tuple[np.ndarray | None, tuple[int, int] | None] = (None, None)
    below_zero = 0
    if scan.fine:
        below_zero = int(scan.counts[-1])
        counts = scan.counts[1:-1].copy()
        counts[0] += below_zero  # (their entropy is read as 0: bin 0, below H_MIN)
        fine = (counts, (min(steps), max(steps)) if steps else None)
    excluded = {r: count[r] for r in S.EXCLUSION_REASONS if count[r]}
    # keys of rows without a seq_id (one per step): no sequence of the input
    n_nosid = int(get("_no_seq_id").sum()) if per.height else 0
    # tensor padding inferred without a mask: outside the loss mask
    valid_n, unmasked = int(valid.sum()), count["unmasked"] + count["padding"]
    total = valid_n + unmasked + sum(excluded.values())
    return Accounting(
        tokens_total=total,
        tokens_unmasked=unmasked,
        tokens_masked=total - unmasked,
        tokens_valid=valid_n,
        excluded=excluded,
        sequences_total=per.height - n_nosid,
        sequences_valid=int((valid > 0).sum()),
        sequences_without_masked_tokens=int(((masked == 0) & ~get("_no_seq_id")).sum())
        if per.height else 0,
        steps=steps,
        policy_versions=pv_pair,
        train_versions=tv_pair,
        staleness=(dict(sorted(scan.stale.items())) if scan.has_pv and scan.has_tv
                   else None),
        sequences_with_version_switch=n_switch,
        minus_one={c: (int(scan.minus_one[_m1_codes(b, 1)].sum()),
                       max(int(scan.minus_one[_m1_codes(b, v + 2)].sum())
                           for v in range(len(S.MINUS_ONE_CONTROLS))))
                   for b, c in enumerate(("train_logprob", "infer_logprob"))},
        tokens_near_zero={c: int(scan.minus_one[[k for k in range(256) if k & (_M1_NEAR << b)]]
                                 .sum())
                          for b, c in enumerate(("train_logprob", "infer_logprob"))},
        sequences_with_duplicate_positions=n_dup,
        tokens_without_step=n_nullstep,
        tokens_without_staleness=(valid_n - sum(scan.stale.values())
                                  if scan.has_pv and scan.has_tv else 0),
        tokens_repeating_row=scan.row_repeats,
        sequences_in_separate_blocks=(len(scan.split_keys), *scan.split[1:]),
        negative_version_min=scan.neg_min,
        tokens_row_checked=scan.row_checked,
        repeated_rows_sampled=_sampled_repeats(scan.row_hashes),
        tokens_padding=count["padding"],
        tokens_entropy_below_zero=below_zero,
        negative_staleness_files={str(infos[i].path): n for i, n in sorted(scan.ahead.items())},
        duplicate_position_files=dup_files,
        file_exclusions=file_excl,
        starved_files=starved,
        tokens_identical=int(get("_same").sum()) if per.height else 0,
        identical_logprobs=identical,
    ), fine


def _negative_versions(accounting: Accounting) -> tuple[int, int, tuple[str, ...]] | None:
    """The rows excluded as ``negative_version`` when some version among them is below -1
    (``accounting.negative_version_min``, from the accounting pass): (rows, lowest
    version, the version columns below 0), else None. Only -1 is a marker (AReaL numbers prompt tokens
    -1); -2, -100, ... on tokens with valid logprobs are version numbers (policy_version =
    step - lag at the start of an asynchronous run, versions offset), which
    :func:`load_dataset` then reads as such, unless far below the valid tokens' versions
    (``accounting``'s ranges: lower than their lowest by more than their span and 2, e.g.
    -9999 among versions 0..9: a placeholder for an unknown version, left excluded)."""
    lows = {c: v for c, v in accounting.negative_version_min.items() if v < 0}
    if not lows or min(lows.values()) >= -1:
        return None
    for c, lo in lows.items():  # (a version far below the others: a placeholder)
        rng = (accounting.policy_versions if c == "policy_version"
               else accounting.train_versions)
        if rng is not None and lo < rng[0] - (rng[1] - rng[0]) - 2:
            return None
    return accounting.excluded["negative_version"], min(lows.values()), tuple(lows)


#: the accounting's ``_ac_m1`` code: a digit per logprob column (base _M1_DIGITS: 0 none,
#: 1 exactly -1.0, 2 + i at MINUS_ONE_CONTROLS[i]), plus _M1_NEAR << column index for a
#: value within POSITIVE_LOGPROB_TOL of 0
_M1_DIGITS = 2 + len(S.MINUS_ONE_CONTROLS)
_M1_NEAR = 64


def _m1_codes(column: int, digit: int) -> list[int]:
    """The ``_ac_m1`` codes whose digit of logprob column ``column`` (0 train, 1 infer) is
    ``digit``."""
    return [k for k in range(256) if (k % _M1_NEAR) // _M1_DIGITS ** column % _M1_DIGITS
            == digit]


def _minus_one_padding(counts: Mapping[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
    """The logprob columns whose exact -1.0 is a padding value (verl pads
    ``rollout_log_probs`` with -1) that the loss mask let in, from the accounting's
    ``minus_one`` (column -> (valid tokens exactly -1.0, the most at any one of the
    MINUS_ONE_CONTROLS)): at least MINUS_ONE_MIN_TOKENS of them, and MINUS_ONE_EXCESS
    times as many as at the most frequent control value (+1). A logprob computed in float
    is exactly -1.0 about once in 10^8 tokens; a column rounded to a decimal step holds
    one of -0.5, -0.9, -1.1 or -2.0 about as often as -1.0 (a whole-number column: -2.0;
    0.5 nats: -0.5 and -2.0; 0.1 nats: all four), so it is not flagged."""
    return {c: (n, ctrl) for c, (n, ctrl) in counts.items()
            if n >= S.MINUS_ONE_MIN_TOKENS and n >= S.MINUS_ONE_EXCESS * (ctrl + 1)}


#: an input file or a step is named as holding identical logprobs when train_logprob equals
#: infer_logprob exactly on this share of its valid tokens or more (:func:`_identical_logprobs`);
#: real runs of a bf16 or fp16 engine against an fp32 trainer: 0% to 0.39% of the tokens,
#: 0.49% of a step at most (both sides 0.0 at p ~ 1, or one rounding); a trainer column
#: copied from the rollout's on half the rows of some steps must be named too
IDENTICAL_SHARE: float = 0.2
#: ... and this many times the median file's or step's share (:func:`_identical_logprobs`)
IDENTICAL_OVER_BASE: float = 3.0
#: ... or on this share of its valid tokens or more, whatever the median (a copied part:
#: no scatter of a baseline reaches it, e.g. 17% with bf16 logprobs on both sides)
IDENTICAL_COPIED: float = 0.9
#: ... when it holds this many valid tokens or more
IDENTICAL_MIN_TOKENS: int = 50
#: ... and when the rest of the input has real mismatch: delta == 0 on less than this share
#: of its valid tokens (a run identical throughout is a bitwise on-policy run, or a column
#: dumped twice: ``fit`` refuses it, ``compare`` compares the gates)
IDENTICAL_REST_SHARE: float = 0.5


def _identical_logprobs(per: pl.DataFrame, infos: Sequence[FileInfo], *, valid_total: int
                        ) -> dict[str, Any] | None:
    """The input files, then the steps (of the other files), on which train_logprob equals
    infer_logprob exactly (delta == 0) on IDENTICAL_SHARE of the valid tokens or more, and
    IDENTICAL_OVER_BASE times the median file's or step's share (or on IDENTICAL_COPIED
    of them, whatever the median: half of the steps copied make the median), while
    the rest of the input has real mismatch (delta == 0 on less than IDENTICAL_REST_SHARE
    of its valid tokens): the trainer's column copied from the rollout's there (old
    logprobs not recomputed on a rank or for some steps, the same column dumped twice).

    ``per``: the accounting's per-sequence table (``_valid``, ``_same``, ``_file_lo``,
    ``_step``; a sequence counts in its lowest input file); ``valid_total``: the valid
    tokens of the input. Returns ``{"files": [{"file", "tokens", "identical"}], "steps":
    [{"step", "tokens", "identical"}], "tokens": identical tokens listed, "tokens_valid":
    valid_total, "others_share": share of delta == 0 among the other valid tokens}``
    (tokens: valid tokens), or None when no file or step qualifies."""
    if "_same" not in per.columns or not int(per["_same"].sum()):
        return None
    def big(groups: pl.DataFrame) -> pl.Expr:
        """IDENTICAL_SHARE of a group's valid tokens, and IDENTICAL_OVER_BASE times the
        median group's share (logprobs dumped in bf16 on both sides are equal on 17% of
        the tokens throughout: a step's binomial scatter above it is no copy)."""
        shares = (groups["_same"] / groups["_valid"]).filter(groups["_valid"] > 0)
        base = float(shares.median() or 0.0) if shares.len() else 0.0
        # (or IDENTICAL_COPIED whatever the median: with half of the steps or files copied
        # the median is theirs, and none stood out; helper-49)
        return ((pl.col("_same") >= max(IDENTICAL_SHARE, IDENTICAL_OVER_BASE * base)
                 * pl.col("_valid"))
                | (pl.col("_same") >= IDENTICAL_COPIED * pl.col("_valid"))) & (
            pl.col("_valid") >= IDENTICAL_MIN_TOKENS)

    files: list[dict[str, Any]] = []
    rest = per
    if len(infos) > 1 and "_file_lo" in per.columns:
        by_file = per.group_by("_file_lo").agg(pl.col("_valid", "_same").sum())
        by_file = by_file.filter(big(by_file)).sort("_file_lo")
        idx = [int(f) for f in by_file["_file_lo"].to_list()
               if f is not None and 0 <= int(f) < len(infos)]
        files = [{"file": str(infos[f].path), "tokens": int(v), "identical": int(n)}
                 for f, v, n in by_file.select("_file_lo", "_valid", "_same").iter_rows()
                 if f in idx]
        rest = per.filter(~pl.col("_file_lo").is_in(idx))
    steps: list[dict[str, Any]] = []
    if "_step" in per.columns:
        by_step = rest.drop_nulls("_step").group_by("_step").agg(
            pl.col("_valid", "_same").sum())
        by_step = by_step.filter(big(by_step)).sort("_step")
        steps = [{"step": int(st), "tokens": int(v), "identical": int(n)}
                 for st, v, n in by_step.select("_step", "_valid", "_same").iter_rows()]
        rest = rest.filter(~pl.col("_step").is_in([d["step"] for d in steps])
                           | pl.col("_step").is_null())
    if not files and not steps:
        return None
    others_valid, others_same = int(rest["_valid"].sum()), int(rest["_same"].sum())
    if not others_valid or others_same >= IDENTICAL_REST_SHARE * others_valid:
        return None  # identical (nearly) throughout: no part differs from the rest
    return {"files": files, "steps": steps,
            "tokens": sum(d["identical"] for d in files + steps),
            "tokens_valid": valid_total, "others_share": others_same / others_valid}


#: a file is starved when its share of valid tokens (of its rows) is below this fraction of
#: the other files' share (:func:`_starved_files`)
STARVED_SHARE: float = 0.1
#: ... and when, at the other files' share, it would hold this many valid tokens or more: a
#: shard of a few rows (one prompt-only sample, the remainder of a split) outside the mask
#: is no evidence of a wrong mask
STARVED_MIN_EXPECTED: float = 20.0


#: an exclusion reason is named for an input file when it excludes this share of the file's
#: loss-masked rows or more (:func:`_file_exclusions`): never so many in a sound file
FILE_EXCLUDED_SHARE: float = 0.2
#: rows outside the loss mask, by reason code name (not exclusions)
_OUTSIDE_MASK = ("unmasked", "padding", "empty_row")


def _per_file(per: pl.DataFrame) -> pl.DataFrame:
    """The accounting's per-sequence table summed per input file (``_file_lo``, each
    sequence's file): ``n`` rows, ``_valid`` and the rows per reason."""
    cols = [c for c in ("_valid", *_OUTSIDE_MASK, *S.EXCLUSION_REASONS) if c in per.columns]
    return per.group_by("_file_lo").agg(pl.col("n", *cols).sum())


def _starved_files(t: pl.DataFrame, infos: Sequence[FileInfo]) -> dict[str, dict[str, Any]]:
    """The input files (several) that contribute few or no valid tokens because most of
    their rows are outside the loss mask: their share of valid tokens among their rows
    below STARVED_SHARE times the other files' (an inverted or all-false loss mask, an
    attention mask taken for the loss mask, a file of prompts; a file whose rows are
    mostly excluded gets the exclusion warnings instead), and its rows many enough that
    the other files' share would give it STARVED_MIN_EXPECTED valid tokens or more.
    ``{path: {"rows", "valid", "outside_mask", "excluded": {reason: rows}, "others_share"}}``
    from the per-file table ``t`` (:func:`_per_file`)."""
    outside = [r for r in _OUTSIDE_MASK if r in t.columns]
    reasons = [r for r in S.EXCLUSION_REASONS if r in t.columns]
    rows, valid = t["n"].to_numpy().astype(np.float64), t["_valid"].to_numpy().astype(np.float64)
    out: dict[str, dict[str, Any]] = {}
    for j, f in enumerate(t["_file_lo"].to_list()):
        others_rows = rows.sum() - rows[j]
        if f is None or not 0 <= int(f) < len(infos) or not rows[j] or not others_rows:
            continue
        others = (valid.sum() - valid[j]) / others_rows
        r = t.row(j, named=True)
        # most rows outside the mask (rows lost to exclusions have their own warnings)
        if (valid[j] / rows[j] < STARVED_SHARE * others
                and others * rows[j] >= STARVED_MIN_EXPECTED
                and sum(r[c] for c in outside) > rows[j] / 2):
            out[str(infos[int(f)].path)] = {
                "rows": int(r["n"]), "valid": int(r["_valid"]),
                "outside_mask": int(sum(r[c] for c in outside)),
                "excluded": {c: int(r[c]) for c in reasons if r[c]},
                "others_share": float(others)}
    return out


def _file_exclusions(t: pl.DataFrame, infos: Sequence[FileInfo]
                           ) -> dict[str, dict[str, tuple[int, int]]]:
    """Per exclusion reason, the input files where it excludes FILE_EXCLUDED_SHARE or more
    of the loss-masked rows: ``{reason: {path: (rows excluded, loss-masked rows)}}``, from
    the per-file table ``t`` (:func:`_per_file`; a sequence counts in its lowest file)."""
    reasons = [r for r in S.EXCLUSION_REASONS if r in t.columns]
    if not reasons:
        return {}
    masked = t["_valid"].to_numpy() + sum(t[r].to_numpy() for r in reasons)
    out: dict[str, dict[str, tuple[int, int]]] = {}
    idx = t["_file_lo"].to_list()
    for r in reasons:
        n = t[r].to_numpy()
        for j in np.flatnonzero((n >= masked * FILE_EXCLUDED_SHARE) & (n > 0)):
            f = idx[j]
            if f is not None and 0 <= int(f) < len(infos):
                out.setdefault(r, {})[str(infos[int(f)].path)] = (int(n[j]), int(masked[j]))
    return out


def _side_conditions(reason: str, nucleus: bool | pl.Series = False,
                     entropy: bool = False, minus_one: Sequence[str] = ()
                     ) -> dict[str, pl.Expr]:
    """A logprob exclusion reason's condition on each side (canonical column -> condition;
    the reason's condition in :func:`_reason_conditions` is their disjunction); {} for any
    other reason. ``entropy``: the input has an entropy column (``zero_placeholder`` then
    also holds both sides exactly 0.0 at an entropy of ZERO_BOTH_H_MIN nats or more);
    ``minus_one``: the logprob columns whose exact -1.0 is a padding value
    (``sentinel_logprob``: :func:`_minus_one_padding`)."""
    tl, il = pl.col("train_logprob"), pl.col("infer_logprob")
    if reason == "zero_placeholder":
        # (nucleus: the engine's 0.0 is a one-token nucleus of truncated sampling, valid
        # unless the trainer gives its token less than half the probability; a Series: but
        # in these sequences (seq_key), whose zeros read as placeholders)
        thr: float | pl.Expr = S.ZERO_PLACEHOLDER_OTHER_MAX
        if isinstance(nucleus, pl.Series):
            thr = (pl.when(pl.col("seq_key").is_in(nucleus.implode()))
                   .then(pl.lit(S.ZERO_PLACEHOLDER_OTHER_MAX))
                   .otherwise(pl.lit(S.NUCLEUS_TRAIN_MIN)))
        elif nucleus:
            thr = S.NUCLEUS_TRAIN_MIN
        both = ((tl == 0) & (il == 0) & (pl.col("entropy") >= S.ZERO_BOTH_H_MIN)
                if entropy else pl.lit(False))
        return {"train_logprob": ((tl == 0) & (il < S.ZERO_PLACEHOLDER_OTHER_MAX)) | both,
                "infer_logprob": ((il == 0) & (tl < thr)) | both}
    cond = {"positive_logprob": lambda c: c > S.POSITIVE_LOGPROB_TOL,
            "sentinel_logprob": lambda c: c <= S.SENTINEL_FLOOR,
            "non_finite_logprob": lambda c: c.is_null() | ~c.is_finite()}.get(reason)
    if cond is None:
        return {}
    out = {"train_logprob": cond(tl), "infer_logprob": cond(il)}
    if reason == "sentinel_logprob":
        for c in minus_one:
            out[c] = out[c] | (pl.col(c) == -1.0)
    return out


def _entropy_kinds() -> dict[str, pl.Expr]:
    """What makes an entropy invalid, one condition per kind (their disjunction is the
    ``invalid_entropy`` condition of :func:`_reason_conditions`)."""
    h = pl.col("entropy")
    fin = h.is_finite()
    return {"null or NaN": h.is_null() | h.is_nan(), "infinite": h.is_infinite(),
            "negative": fin & (h < -S.ENTROPY_NEG_TOL),  # (beyond rounding)
            f"above {S.ENTROPY_MAX:g} nats": fin & (h > S.ENTROPY_MAX)}


#: the sums over the loss-masked rows excluded for an entropy above ENTROPY_MAX whose
#: infer_logprob is a plausible logprob (:func:`_above_range_sums`)
_ABOVE_SUMS = ("_hn", "_h", "_s", "_hh", "_ss", "_hs")


def _above_range_sums() -> list[pl.Expr]:
    """Sums over the rows excluded as ``invalid_entropy`` for an entropy above
    ENTROPY_MAX nats whose infer_logprob is finite, at most 0 and above SENTINEL_FLOOR:
    their count, the sums of the entropy H and of the surprisal s = -infer_logprob, of
    H^2, s^2 and H s (float64; :func:`_above_range` reads them)."""
    h = pl.col("entropy").cast(pl.Float64)
    s = -pl.col("infer_logprob").cast(pl.Float64)
    hit = ((pl.col("reason") == "invalid_entropy") & h.is_finite() & (h > S.ENTROPY_MAX)
           & s.is_finite() & (s >= 0) & (s < -S.SENTINEL_FLOOR)).fill_null(False)
    w = hit.cast(pl.Float64)
    return [hit.sum().cast(pl.Float64).alias("_hn"),
            *[(e * w).fill_nan(0.0).sum().alias(k) for k, e in
              (("_h", h), ("_s", s), ("_hh", h * h), ("_ss", s * s), ("_hs", h * s))]]


def _above_range(sums: Mapping[str, float]) -> dict[str, float] | None:
    """What the entropies above ENTROPY_MAX are, from :func:`_above_range_sums` added over
    the input: ``{"rows", "mean_entropy", "mean_surprisal", "corr"}`` (``corr``: the
    Pearson correlation of H and s over those rows, NaN when a side is constant), None
    without such a row. For a token drawn from a distribution, E[s | H] = H (METHOD.md),
    so an entropy column multiplied by a constant c reads mean_entropy / mean_surprisal
    near c over any selection by H, with H and s correlated (0.57 to 0.63 on the bundled
    run x100 and x1000); logits or unnormalised values show neither
    (:func:`entr_diag.caveats.entropy_scale_seen`)."""
    n = sums.get("_hn", 0.0)
    if n < 1:
        return None
    mh, ms = sums["_h"] / n, sums["_s"] / n
    vh, vs = sums["_hh"] / n - mh * mh, sums["_ss"] / n - ms * ms
    cov = sums["_hs"] / n - mh * ms
    corr = cov / (vh * vs) ** 0.5 if vh > 1e-12 * mh * mh and vs > 1e-12 * max(ms * ms, 1e-12) \
        else float("nan")
    return {"rows": int(n), "mean_entropy": mh, "mean_surprisal": ms, "corr": corr}


def _excluded_where(frames: Sequence[pl.LazyFrame], files: Sequence[Path],
                    reasons: Sequence[str], mapping: Mapping[str, str],
                    nucleus: bool | pl.Series = False, minus_one: Sequence[str] = ()
                    ) -> dict[str, dict[str, Any]]:
    """Where the rows excluded for each of ``reasons`` are, ``{reason: {"columns":
    {canonical logprob column: excluded rows whose value on that side meets the reason's
    condition}, "files": {path: excluded rows}, "valid_left": {path: valid tokens with a
    logprob of 0 or more},
    "input_files": number of input files}}`` (files without one left out; ``columns``
    empty for a reason that is not about the logprobs; for ``invalid_entropy``,
    ``"kinds"``: rows per kind of invalid value, :func:`_entropy_kinds`, and
    ``"above_range"``: what the entropies above 20 nats are, :func:`_above_range`, when
    any; ``valid_left``:
    the valid tokens of the files where the reason excludes most loss-masked rows, e.g.
    probabilities below 1e-4 that pass as log-probabilities near 0 in a file of
    probabilities; not when most of those rows are exactly +1.0, a sentinel; ``"ones"``:
    the reason's rows at exactly +1.0, when any; ``"above_one"``: the reason's rows above
    +1.0 on a side, which no probability is, when any). ``frames``: the raw canonical frame of
    each piece (a file or a row range of one), ``files`` their files. One more read of the
    input for all the reasons together, only when a warning explains an exclusion reason
    (e.g. one shard of two in probabilities: that shard and that column are named)."""
    rsn = pl.col("reason")
    # (rows at exactly +1.0: a sentinel value, not probabilities)
    one = (pl.col("train_logprob") == 1.0) | (pl.col("infer_logprob") == 1.0)
    # (rows above +1.0: no probability, e.g. negative log-likelihoods)
    above = (pl.col("train_logprob") > 1.0) | (pl.col("infer_logprob") > 1.0)
    # (valid tokens with a logprob of 0 or more: what a probability at most 1e-4 reads as)
    tiny = rsn.is_null() & ((pl.col("train_logprob") >= 0) | (pl.col("infer_logprob") >= 0))
    sides = {r: _side_conditions(r, nucleus, "entropy" in mapping, minus_one)
             for r in reasons}
    kinds = {r: (_entropy_kinds() if r == "invalid_entropy" else {}) for r in reasons}
    exprs = [(rsn.is_null() | ~rsn.is_in(["unmasked", "padding", "empty_row"])).sum()
             .alias("m"), tiny.fill_null(False).sum().alias("v")]
    if "invalid_entropy" in reasons and "entropy" in mapping:
        exprs += _above_range_sums()
    for j, r in enumerate(reasons):  # the columns of reason j are prefixed "{j}_"
        hit = rsn == r
        exprs += [hit.sum().alias(f"{j}_n"), (hit & one).sum().alias(f"{j}_ones"),
                  (hit & above).fill_null(False).sum().alias(f"{j}_above"),
                  *[(hit & c).sum().alias(f"{j}_{k}") for k, c in sides[r].items()],
                  *[(hit & c).sum().alias(f"{j}_kind{i}")
                    for i, c in enumerate(kinds[r].values())]]
    queries = [fr.select(exprs) for fr in frames]
    # per reason, per file: the reason's rows, the loss-masked rows, the valid tokens, the
    # reason's rows at +1.0
    per: dict[str, dict[str, list[int]]] = {r: {} for r in reasons}
    above_n = dict.fromkeys(reasons, 0)
    cols = {r: dict.fromkeys(sides[r], 0) for r in reasons}
    kind_n = {r: dict.fromkeys(kinds[r], 0) for r in reasons}
    range_sums = dict.fromkeys(_ABOVE_SUMS, 0.0)
    for i in range(0, len(queries), _MAX_FILES_PER_CHUNK):
        outs = pl.collect_all(queries[i:i + _MAX_FILES_PER_CHUNK], engine="streaming")
        for f, out in zip(files[i:i + _MAX_FILES_PER_CHUNK], outs, strict=True):
            row = out.row(0, named=True)
            for k in range_sums:
                range_sums[k] += float(row.get(k) or 0.0)
            for j, r in enumerate(reasons):
                acc = per[r].setdefault(str(f), [0, 0, 0, 0])
                for a, k in enumerate((f"{j}_n", "m", "v", f"{j}_ones")):
                    acc[a] += int(row[k] or 0)
                above_n[r] += int(row[f"{j}_above"] or 0)
                for k in cols[r]:
                    cols[r][k] += int(row[f"{j}_{k}"] or 0)
                for a, k in enumerate(kinds[r]):
                    kind_n[r][k] += int(row[f"{j}_kind{a}"] or 0)
    return {r: {
        "columns": {k: n for k, n in cols[r].items() if n and k in mapping},
        **({"kinds": {k: n for k, n in kind_n[r].items() if n}} if kinds[r] else {}),
        **({"above_range": scaled} if r == "invalid_entropy"
           and (scaled := _above_range(range_sums)) else {}),
        "files": {f: n for f, (n, _m, _v, _o) in per[r].items() if n},
        # rows at exactly +1.0 on a side (a placeholder, not a probability)
        **({"ones": ones} if (ones := sum(o for _n, _m, _v, o in per[r].values())) else {}),
        # rows above +1.0 on a side (no probability: negative log-likelihoods?)
        **({"above_one": above_n[r]} if above_n[r] else {}),
        # files where the reason excludes most loss-masked rows (not as +1.0 sentinels):
        # the valid tokens left
        "valid_left": {f: v for f, (n, m, v, o) in per[r].items()
                       if v and n > m / 2 and o <= n / 2},
        "input_files": len(per[r])} for r in reasons}


def _nucleus_zeros_seen(chunks: Sequence[Chunk]
                        ) -> tuple[tuple[int, int, pl.Series] | None, tuple[str, ...], int,
                                   int]:
    """Whether the rows excluded as ``zero_placeholder`` for an engine logprob of exactly
    0.0 are one-token nuclei of truncated sampling (top-p / top-k renormalise a nucleus of
    one token to probability 1: the token then holds at least top-p of the probability,
    and the trainer's logprob of it lies above ln 0.5 but for mismatch noise) rather than
    placeholders (an engine side not computed, zero-filled prompt rows: their trainer
    logprobs take every size, a share of them far below ln 0.5, and every token of such a
    sequence is zero). Decided per sequence: a sequence reads as placeholders when one of
    its zeros has a trainer logprob below ln 0.5 or every loss-masked token of it has an
    engine logprob of 0.0; the zeros of the other sequences are nuclei. (nucleus zeros,
    zero placeholders of the placeholder sequences, those sequences' seq_keys) when the
    nucleus zeros number NUCLEUS_MIN_TOKENS, else None; then the logprob columns that are
    exactly 0.0 on every loss-masked row (an engine or trainer side never computed: no
    nucleus is read then) and the number of those rows. One more read of three columns of
    the input (the raw ``chunks``), only when the accounting excluded NUCLEUS_MIN_TOKENS
    zero placeholders or more. Last, the zero placeholders with both sides 0.0."""
    rsn, il, tl = pl.col("reason"), pl.col("infer_logprob"), pl.col("train_logprob")
    masked = ~rsn.is_in(["unmasked", "padding", "empty_row"]).fill_null(False)
    # (both sides 0.0 is no nucleus: the trainer did not renormalise; they stay excluded)
    zero = ((rsn == "zero_placeholder") & (il == 0.0) & (tl != 0.0)).fill_null(False)
    q = [c.frame.filter(masked).group_by("seq_key").agg(
        pl.len().alias("m"), (il == 0.0).fill_null(False).sum().alias("z0"),
        (tl == 0.0).fill_null(False).sum().alias("t0"),
        zero.sum().alias("z"), (zero & (tl < S.NUCLEUS_TRAIN_MIN)).fill_null(False).sum()
        .alias("zb"), ((rsn == "zero_placeholder") & (il == 0.0) & (tl == 0.0))
        .fill_null(False).sum().alias("zz")) for c in chunks]
    parts = []
    for i in range(0, len(q), _MAX_FILES_PER_CHUNK):
        parts += pl.collect_all(q[i:i + _MAX_FILES_PER_CHUNK], engine="streaming")
    per = pl.concat(parts).group_by("seq_key").agg(pl.col("m", "z0", "t0", "z", "zb", "zz")
                                                   .sum())
    rows = int(per["m"].sum())
    both = int(per["zz"].sum())  # excluded with both sides 0.0
    zero_cols = tuple(c for c, z in (("infer_logprob", "z0"), ("train_logprob", "t0"))
                      if rows and int(per[z].sum()) == rows)
    if zero_cols:  # a side never computed: every sequence reads as placeholders
        return None, zero_cols, rows, both
    per = per.filter(pl.col("z") > 0)
    # the zeros of sequences that hold other engine logprobs: when a share of them has a
    # trainer logprob below ln 0.5, they are placeholders at random rows, not nuclei
    part = per.filter(pl.col("z0") < pl.col("m"))
    if int(part["zb"].sum()) >= S.NUCLEUS_MAX_LOW_SHARE * max(int(part["z"].sum()), 1):
        return None, (), rows, both
    ph = (pl.col("zb") > 0) | (pl.col("z0") >= pl.col("m"))
    kept = int(per.filter(~ph)["z"].sum())
    if kept < S.NUCLEUS_MIN_TOKENS:
        return None, (), rows, both
    placeholders = per.filter(ph)
    return (kept, int(placeholders["z"].sum()), placeholders["seq_key"]), (), rows, both


def _pair(lo, hi) -> tuple[int, int] | None:
    if lo is None or hi is None:
        return None
    return int(lo), int(hi)
