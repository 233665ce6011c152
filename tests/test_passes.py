"""The one-pass engine: accumulators fed batch by batch equal one in-memory computation."""

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
