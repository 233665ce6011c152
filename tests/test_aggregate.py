"""Mergeable aggregates (entr_diag.aggregate): grid, merge, row order, coarse bins, cells."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from entr_diag.aggregate import (
    H_MAX,
    H_MIN,
    N_FINE,
    SUM_COLUMNS,
    aggregate_blocks,
    aggregate_fine,
    coarse_binning,
    coarse_block_sums,
    fine_bin_expr,
    fine_edges,
    joint_binning,
)
from entr_diag.errors import FitError, ParameterError


def _tokens(n: int = 3000, n_seq: int = 60, seed: int = 0) -> pl.DataFrame:
    """A canonical-looking token frame built by hand (no loader): H log-uniform, delta ~ kH."""
    rng = np.random.default_rng(seed)
    h = np.exp(rng.uniform(math.log(1e-4), math.log(4.0), n))
    h[:20] = 0.0  # some exactly-zero entropies
    delta = rng.normal(0.0, np.sqrt(0.02 * h))
    infer = -h * rng.exponential(1.0, n)
    seq = rng.integers(0, n_seq, n).astype(str)
    return pl.DataFrame(
        {"seq_id": seq, "entropy": h, "delta": delta, "infer_logprob": infer,
         "train_logprob": infer + delta}
    ).with_columns(pl.col("seq_id").hash(seed=0).alias("seq_key"))


def _assert_same(a: pl.DataFrame, b: pl.DataFrame) -> None:
    keys = [c for c in a.columns if c not in SUM_COLUMNS]
    for k in keys:
        assert a[k].to_list() == b[k].to_list()
    for c in SUM_COLUMNS:
        np.testing.assert_allclose(a[c].to_numpy(), b[c].to_numpy(), rtol=1e-12, atol=1e-15)


def _cells(df: pl.DataFrame, bins: int = 7):
    counts = aggregate_fine(df.lazy()).counts_per_fine()
    return joint_binning(coarse_binning(counts, bins), coarse_binning(counts, 3 * bins))


def test_fine_bin_expr_matches_edges():
    """Every entropy falls in the fine bin whose [lo, hi) edges contain it; 0 -> bin 0."""
    lo, hi = fine_edges()
    h = np.array([0.0, 5e-7, H_MIN, 1e-5, 0.0123, 1.0, 3.9, 19.99, 25.0])
    idx = pl.DataFrame({"entropy": h}).select(fine_bin_expr().alias("f"))["f"].to_numpy()
    assert idx[0] == 0 and idx[1] == 0
    assert idx[-1] == N_FINE  # clipped into the last bin
    for v, i in zip(h[2:-1], idx[2:-1], strict=True):
        assert lo[i] * (1 - 1e-12) <= v < hi[i] * (1 + 1e-12)
    assert hi[-1] == H_MAX and lo[1] == pytest.approx(H_MIN)


def test_counts_add_up():
    """The fine aggregate holds every token once; its sums equal direct sums."""
    df = _tokens()
    agg = aggregate_fine(df.lazy(), eps=0.01)
    assert agg.n_tokens == df.height
    t = agg.table
    assert t["s_d2"].sum() == pytest.approx((df["delta"] ** 2).sum())
    assert t["s_z2"].sum() == pytest.approx((df["delta"] ** 2 / (df["entropy"] + 0.01)).sum())
    assert t["n_plow"].sum() == (df["infer_logprob"] < math.log(1e-3)).sum()
    assert agg.counts_per_fine().sum() == df.height
    blocks = aggregate_blocks(df.lazy(), _cells(df), n_blocks=16)
    assert blocks.n_tokens == df.height
    assert blocks.table["s_d2"].sum() == pytest.approx((df["delta"] ** 2).sum())


def test_row_order_does_not_change_the_aggregates():
    """A shuffled frame gives the same fine and block aggregates."""
    df = _tokens()
    sh = df.sample(fraction=1.0, shuffle=True, seed=7)
    _assert_same(aggregate_fine(df.lazy()).table, aggregate_fine(sh.lazy()).table)
    cells = _cells(df)
    _assert_same(aggregate_blocks(df.lazy(), cells, n_blocks=16).table,
                 aggregate_blocks(sh.lazy(), cells, n_blocks=16).table)


def test_merge_of_halves_equals_whole():
    """Aggregating two shards and merging equals aggregating the union (fixed split)."""
    df = _tokens()
    a, b = df.head(1234), df.tail(df.height - 1234)
    whole = aggregate_fine(df.lazy())
    fa, fb = aggregate_fine(a.lazy()), aggregate_fine(b.lazy())
    _assert_same(fa.merge(fb).table, whole.table)
    _assert_same(fb.merge(fa).table, whole.table)
    cells = _cells(df)
    wb = aggregate_blocks(df.lazy(), cells, n_blocks=16)
    ba = aggregate_blocks(a.lazy(), cells, n_blocks=16)
    bb = aggregate_blocks(b.lazy(), cells, n_blocks=16)
    _assert_same(ba.merge(bb).table, wb.table)


@settings(max_examples=25, deadline=None)
@given(mask=st.lists(st.booleans(), min_size=200, max_size=200))
def test_merge_any_split_property(mask):
    """For any split of the rows into two shards, merge(agg(A), agg(B)) == agg(A u B)."""
    df = _tokens(n=200, n_seq=12, seed=1)
    m = pl.Series(mask)
    a, b = df.filter(m).lazy(), df.filter(~m).lazy()
    _assert_same(aggregate_fine(a).merge(aggregate_fine(b)).table, aggregate_fine(df.lazy()).table)
    cells = _cells(df, bins=4)
    merged = aggregate_blocks(a, cells, n_blocks=8).merge(aggregate_blocks(b, cells, n_blocks=8))
    _assert_same(merged.table, aggregate_blocks(df.lazy(), cells, n_blocks=8).table)


def test_merge_refuses_different_grids():
    """Aggregates with different eps, n_blocks or cells cannot be merged."""
    df = _tokens(n=300)
    with pytest.raises(ParameterError):
        aggregate_fine(df.lazy(), eps=0.01).merge(aggregate_fine(df.lazy(), eps=0.1))
    cells = _cells(df)
    with pytest.raises(ParameterError):
        aggregate_blocks(df.lazy(), cells, n_blocks=8).merge(
            aggregate_blocks(df.lazy(), cells, n_blocks=9))
    with pytest.raises(ParameterError):
        aggregate_blocks(df.lazy(), cells, n_blocks=8).merge(
            aggregate_blocks(df.lazy(), _cells(df, bins=3), n_blocks=8))


def test_blocks_hold_whole_sequences():
    """All tokens of one sequence land in the same block."""
    df = _tokens()
    blocks = df.select(pl.col("seq_id"), (pl.col("seq_key") % 16).alias("b")).unique()
    assert blocks["seq_id"].n_unique() == blocks.height


def test_joint_cells_reproduce_each_binning():
    """Sums of the joint cells per coarse bin equal a direct aggregation on that binning."""
    df = _tokens(n=5000, n_seq=100)
    counts = aggregate_fine(df.lazy()).counts_per_fine()
    b1, b2 = coarse_binning(counts, 7), coarse_binning(counts, 20, "log")
    joint = aggregate_blocks(df.lazy(), joint_binning(b1, b2), n_blocks=16)
    for b in (b1, b2):
        direct = coarse_block_sums(aggregate_blocks(df.lazy(), b, n_blocks=16), b)
        via = coarse_block_sums(joint, b)
        for c in SUM_COLUMNS:
            np.testing.assert_allclose(via[c], direct[c], rtol=1e-12, atol=1e-15)


def test_quantile_bins_have_about_equal_counts():
    """Quantile coarse bins split the positive-entropy tokens evenly; H=0 gets its own bin."""
    df = _tokens(n=20000, n_seq=300)
    agg = aggregate_fine(df.lazy())
    b = coarse_binning(agg.counts_per_fine(), bins=10, edges="quantile")
    assert b.has_zero_bin and b.n_bins == 11
    S = coarse_block_sums(aggregate_blocks(df.lazy(), b, n_blocks=16), b)
    n = S["n"].sum(axis=1)
    assert n[0] == 20
    assert n.sum() == 20000
    assert np.all(np.abs(n[1:] - (20000 - 20) / 10) < 0.01 * 20000)
    assert np.all(np.diff(b.starts) > 0)
    assert np.all(b.h_lo[2:] >= b.h_hi[1:-1] * (1 - 1e-12))


def test_log_bins_drop_empty_bins():
    """Log-spaced coarse bins span the data range; no coarse bin is empty."""
    h = np.concatenate([np.full(50, 1e-3), np.full(50, 1.0)])
    df = pl.DataFrame({"seq_id": [str(i % 7) for i in range(100)], "entropy": h,
                       "delta": np.full(100, 0.01), "infer_logprob": np.full(100, -0.1)})
    df = df.with_columns(pl.col("seq_id").hash(seed=0).alias("seq_key"))
    agg = aggregate_fine(df.lazy())
    b = coarse_binning(agg.counts_per_fine(), bins=20, edges="log")
    n = coarse_block_sums(aggregate_blocks(df.lazy(), b, n_blocks=4), b)["n"].sum(axis=1)
    assert b.n_bins == 2 and list(n) == [50, 50]


def test_coarse_expr_matches_numpy_mapping():
    """The polars coarse-bin expression assigns every token the bin of its fine bin."""
    df = _tokens(n=5000, n_seq=100)
    agg = aggregate_fine(df.lazy())
    b = coarse_binning(agg.counts_per_fine(), bins=7, edges="quantile")
    out = df.select(fine_bin_expr().alias("f"), b.expr().alias("c"))
    np.testing.assert_array_equal(b.coarse_of_fine(out["f"].to_numpy()), out["c"].to_numpy())


def test_bad_parameters_and_missing_entropy():
    """bins/edges are validated; no entropy column is a FitError with a sentence."""
    with pytest.raises(ParameterError):
        coarse_binning(np.ones(N_FINE + 1), bins=0)
    with pytest.raises(ParameterError):
        coarse_binning(np.ones(N_FINE + 1), edges="linear")
    with pytest.raises(FitError):
        coarse_binning(np.zeros(N_FINE + 1))
    df = _tokens(n=10).drop("entropy")
    with pytest.raises(FitError, match="entropy"):
        aggregate_fine(df.lazy())
