"""The one-pass engine: accumulators fed batch by batch equal one in-memory computation."""

import dataclasses

import numpy as np
import polars as pl
import pytest

from entr_diag.passes import DenseSums, GroupAgg, progress_hook, run_pass


def _frame(n: int = 5000, seed: int = 0) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    return pl.DataFrame({
        "seq_key": rng.integers(0, 97, n).astype(np.uint64),
        "delta": rng.normal(0, 0.1, n),
        "entropy": rng.exponential(1.0, n),
    })


@pytest.mark.parametrize("chunk", [7, 333, 100_000])
def test_group_agg_equals_in_memory(chunk):
    """Per-batch group_by, merged, equals one group_by of the whole frame (any batch size)."""
    df = _frame()
    acc = GroupAgg(["seq_key", "delta"], ["seq_key"],
                   [pl.len().alias("n"), pl.col("delta").sum().alias("s"),
                    pl.col("delta").max().alias("mx")],
                   [pl.col("n").sum(), pl.col("s").sum(), pl.col("mx").max()],
                   compact_rows=50)
    rows = run_pass(df.lazy(), [acc], chunk_size=chunk)
    assert rows == df.height
    got = acc.result().sort("seq_key")
    want = (df.group_by("seq_key").agg(pl.len().alias("n"), pl.col("delta").sum().alias("s"),
                                       pl.col("delta").max().alias("mx")).sort("seq_key"))
    assert got["n"].to_list() == [int(x) for x in want["n"]]
    np.testing.assert_allclose(got["s"].to_numpy(), want["s"].to_numpy(), rtol=1e-12, atol=1e-12)
    assert got["mx"].to_list() == want["mx"].to_list()


def test_dense_sums_equal_bincount_and_progress_counts_rows():
    """Dense sums over batches equal numpy on the whole frame; the hook sees every row."""
    df = _frame()
    seen: list[int] = []
    acc = DenseSums(["seq_key", "delta"], 97, lambda b: b["seq_key"].to_numpy().astype(np.int64),
                    {"n": None, "s": lambda b: b["delta"].to_numpy()})
    with progress_hook(seen.append):
        run_pass(df.lazy(), [acc], chunk_size=600)
    k = df["seq_key"].to_numpy().astype(np.int64)
    np.testing.assert_array_equal(acc.sums["n"], np.bincount(k, minlength=97))
    np.testing.assert_allclose(acc.sums["s"], np.bincount(k, df["delta"].to_numpy(), minlength=97))
    assert sum(seen) == df.height and len(seen) >= 2


def test_dense_sums_ignore_keys_out_of_range():
    """Keys outside [0, size) (e.g. -1 for 'no bin') are not counted."""
    df = pl.DataFrame({"k": [-1, 0, 1, 5, 1]})
    acc = DenseSums(["k"], 2, lambda b: b["k"].to_numpy(), {"n": None})
    run_pass(df.lazy(), [acc])
    assert acc.sums["n"].tolist() == [1.0, 2.0]



def test_scattered_sequences_are_grouped_before_the_accumulators():
    """Rows of interleaved sequences (mean run below MIN_MEAN_RUN) reach the accumulators
    grouped by seq_key, each sequence's rows in their original order; contiguous rows are
    passed through as they are (the same object)."""
    from entr_diag.passes import MIN_MEAN_RUN, _by_sequence

    n = 40 * MIN_MEAN_RUN
    scattered = pl.DataFrame({"seq_key": pl.Series(np.arange(n) % 40, dtype=pl.UInt64),
                              "position": np.arange(n) // 40})
    out = _by_sequence(scattered)
    assert out.height == n and out["seq_key"].is_sorted()
    assert out.filter(pl.col("seq_key") == 3)["position"].to_list() == list(range(n // 40))
    contiguous = scattered.sort("seq_key")
    assert _by_sequence(contiguous) is contiguous

    seen = []

    class Runs:
        columns = ["seq_key"]

        def update(self, batch):
            k = batch["seq_key"].to_numpy()
            seen.append(1 + int(np.count_nonzero(k[1:] != k[:-1])))

    run_pass(scattered.lazy(), [Runs()])
    assert sum(seen) <= 40 * len(seen)  # one run per sequence and batch


def test_an_accumulator_is_fed_by_one_pass_only():
    """Running a plan's accumulators through a second pass would double its sums: refused."""
    from entr_diag.errors import ParameterError
    from entr_diag.metrics import metrics_plan

    lf = pl.LazyFrame({"seq_id": ["a", "a", "b"], "step": [0, 0, 0],
                       "train_logprob": [-0.1, -0.2, -0.3], "infer_logprob": [-0.1, -0.25, -0.3],
                       "position": [0, 1, 0]}).with_columns(
        pl.col("seq_id").hash(seed=0).alias("seq_key"),
        (pl.col("train_logprob") - pl.col("infer_logprob")).alias("delta"))
    plan = metrics_plan(lf)
    run_pass(lf, plan.accumulators)
    with pytest.raises(ParameterError, match="already been fed"):
        run_pass(lf, plan.accumulators)
    assert plan.finish().overall.tokens == 3


def test_batches_follow_memory_chunks_and_cover_the_frame_in_order():
    """A chunk's rows are cut into batches of at most ``size`` rows at the memory-chunk
    boundaries most columns share (columns then reach numpy without a copy); short memory
    chunks are batched together; every row is handed over once, in order."""
    from entr_diag.passes import MIN_ALIGNED_ROWS, _batches

    big = MIN_ALIGNED_ROWS + 10
    parts = [big, 3, 5, MIN_ALIGNED_ROWS, 2 * big + 7, 4]
    frame = pl.concat([pl.DataFrame({"a": np.arange(k), "b": np.ones(k)}) for k in parts],
                      rechunk=False)
    frame = frame.with_columns(pl.Series("c", np.arange(frame.height)))  # one memory chunk
    size = 2 * big
    out = list(_batches(frame, size))
    assert [b.height for b in out] == [big, MIN_ALIGNED_ROWS + 8, size, 11]
    assert pl.concat(out).equals(frame)
    assert [b["a"].n_chunks() for b in out] == [1, 3, 1, 2]
    assert all(b.height <= size for b in _batches(frame.rechunk(), 1000))
    assert sum(b.height for b in _batches(frame.rechunk(), 1000)) == frame.height
    assert list(_batches(frame.head(0), size)) == []


class _Reads:
    """A batch accumulator keeping the dtype of seq_id it was given."""

    def __init__(self, native: bool) -> None:
        self.columns = ["seq_id"]
        self.native_seq_id = native
        self.dtypes: set = set()

    def update(self, batch: pl.DataFrame) -> None:
        self.dtypes.add(batch["seq_id"].dtype)


def test_native_seq_id_only_when_every_reader_opts_in():
    from entr_diag.passes import NATIVE_SEQ_ID

    lf = pl.LazyFrame({"seq_id": ["9", "10"], NATIVE_SEQ_ID: [9, 10],
                       "seq_key": pl.Series([1, 2], dtype=pl.UInt64)})
    a, b = _Reads(True), _Reads(True)
    run_pass(lf, [a, b])
    assert a.dtypes == b.dtypes == {pl.Int64}  # no per-token cast to String
    a, c = _Reads(True), _Reads(False)
    run_pass(lf, [a, c])
    assert a.dtypes == c.dtypes == {pl.String}
    a = _Reads(True)  # a String seq_id as read: nothing to substitute
    run_pass(lf.with_columns(pl.col("seq_id").alias(NATIVE_SEQ_ID)), [a])
    assert a.dtypes == {pl.String}


def test_native_seq_id_gives_the_same_findings_and_offenders(tmp_path):
    """Integer seq_ids read as integers by the opted-in accumulators: every seq_id they
    report is the String of the canonical frame, in the same order (ties broken by the
    String, where "10" < "9")."""
    from entr_diag.forensics import run_forensics
    from entr_diag.io import load_dataset
    from entr_diag.passes import NATIVE_SEQ_ID
    from entr_diag.profiles import offenders

    rng = np.random.default_rng(3)
    n_seq, n_tok = 40, 30
    sid = np.repeat(np.arange(n_seq) + 5, n_tok)
    # three kinds of sequence, equal within a kind: ties across seq_ids
    h = np.tile(rng.exponential(0.5, n_tok), n_seq)
    d = np.tile(rng.normal(0, 0.3, n_tok), n_seq) * (1 + sid % 3)
    il = -np.tile(rng.exponential(1.0, n_tok), n_seq)
    il[sid % 7 == 0] = -80.0  # implausible logprobs: a finding naming sequences
    path = tmp_path / "ints.parquet"
    pl.DataFrame({"seq_id": sid, "position": np.tile(np.arange(n_tok), n_seq),
                  "step": sid % 2, "infer_logprob": il, "train_logprob": il + d,
                  "entropy": h}).write_parquet(path)
    ds = load_dataset([str(path)])
    assert ds.lf.collect_schema()[NATIVE_SEQ_ID] == pl.Int64
    got = offenders(ds.lf, top=15).to_dict()
    # the String column for every accumulator
    assert offenders(ds.lf.drop(NATIVE_SEQ_ID), top=15).to_dict() == got
    assert all(isinstance(r["seq_id"], str) for r in got["tokens"])
    f_native = run_forensics(load_dataset([str(path)])).to_dict()
    ds3 = load_dataset([str(path)])
    f_string = run_forensics(dataclasses.replace(ds3, lf=ds3.lf.drop(NATIVE_SEQ_ID))).to_dict()
    assert f_string == f_native
    assert "'top_seq_ids': ['" in str(f_native) or "seq_ids': ['" in str(f_native)


def test_partial_rows_from_numpy_columns_equal_frames(monkeypatch):
    """Parts given as numpy columns (buffered, made one frame per PENDING_ROWS rows, cast
    as asked) merge to the table the same parts give as frames, also mixed with frames and
    with a Series column."""
    import entr_diag.passes as P

    monkeypatch.setattr(P, "PENDING_ROWS", 700)  # several flushes
    rng = np.random.default_rng(0)
    parts = []
    for _ in range(12):
        n = int(rng.integers(50, 300))
        parts.append({"k": rng.integers(0, 40, n).astype(np.uint64),
                      "sid": rng.integers(0, 9, n),
                      "x": rng.normal(size=n), "m": rng.integers(0, 100, n)})
    merge = [pl.col("sid").min(), pl.col("x").sum(), pl.col("m").max()]
    ref = P.PartialRows(["k"], merge, compact_rows=500)
    for p in parts:
        ref.add(pl.DataFrame(p).with_columns(pl.col("sid").cast(pl.String)))
    got = P.PartialRows(["k"], merge, compact_rows=500, cast={"sid": pl.String})
    for i, p in enumerate(parts):
        if i % 4 == 3:  # a frame among the numpy parts
            got.add(pl.DataFrame(p).with_columns(pl.col("sid").cast(pl.String)))
        elif i % 4 == 2:  # a Series column
            got.add({**p, "m": pl.Series(p["m"])})
        else:
            got.add(p)
    a, b = (t.result().sort("k") for t in (ref, got))
    assert a["k"].to_list() == b["k"].to_list() and b["sid"].dtype == pl.String
    assert a["sid"].to_list() == b["sid"].to_list() and a["m"].to_list() == b["m"].to_list()
    np.testing.assert_allclose(a["x"].to_numpy(), b["x"].to_numpy(), rtol=1e-12)
    assert P.frame_of([{"a": np.arange(2)}, {"a": np.arange(3)}])["a"].to_list() == [0, 1, 0,
                                                                                    1, 2]
