"""One-pass mergeable aggregates (entr_diag.aggregate): grid, merge, row order, coarse bins."""

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
    aggregate_fine,
    coarse_binning,
    coarse_block_sums,
    fine_bin_expr,
    fine_edges,
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
    assert a["fine"].to_list() == b["fine"].to_list()
    assert a["block"].to_list() == b["block"].to_list()
    for c in SUM_COLUMNS:
        np.testing.assert_allclose(a[c].to_numpy(), b[c].to_numpy(), rtol=1e-12, atol=1e-15)


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
    """The aggregate holds every token once; sums equal direct sums."""
    df = _tokens()
    agg = aggregate_fine(df.lazy(), n_blocks=16, eps=0.01)
    assert agg.n_tokens == df.height
    t = agg.table
    assert t["s_d2"].sum() == pytest.approx((df["delta"] ** 2).sum())
    assert t["s_z2"].sum() == pytest.approx((df["delta"] ** 2 / (df["entropy"] + 0.01)).sum())
    assert t["n_plow"].sum() == (df["infer_logprob"] < math.log(1e-3)).sum()
    assert agg.counts_per_fine().sum() == df.height


def test_row_order_does_not_change_the_aggregate():
    """A shuffled frame gives the same aggregate table."""
    df = _tokens()
    a = aggregate_fine(df.lazy(), n_blocks=16).table
    b = aggregate_fine(df.sample(fraction=1.0, shuffle=True, seed=7).lazy(), n_blocks=16).table
    _assert_same(a, b)


def test_merge_of_halves_equals_whole():
    """Aggregating two shards and merging equals aggregating the union (fixed split)."""
    df = _tokens()
    whole = aggregate_fine(df.lazy(), n_blocks=16)
    a = aggregate_fine(df.head(1234).lazy(), n_blocks=16)
    b = aggregate_fine(df.tail(df.height - 1234).lazy(), n_blocks=16)
    _assert_same(a.merge(b).table, whole.table)
    _assert_same(b.merge(a).table, whole.table)


@settings(max_examples=25, deadline=None)
@given(mask=st.lists(st.booleans(), min_size=200, max_size=200))
def test_merge_any_split_property(mask):
    """For any split of the rows into two shards, merge(agg(A), agg(B)) == agg(A u B)."""
    df = _tokens(n=200, n_seq=12, seed=1)
    m = pl.Series(mask)
    whole = aggregate_fine(df.lazy(), n_blocks=8)
    merged = aggregate_fine(df.filter(m).lazy(), n_blocks=8).merge(
        aggregate_fine(df.filter(~m).lazy(), n_blocks=8)
    )
    _assert_same(merged.table, whole.table)


def test_merge_refuses_different_grids():
    """Aggregates with different n_blocks or eps cannot be merged."""
    df = _tokens(n=100)
    with pytest.raises(ParameterError):
        aggregate_fine(df.lazy(), n_blocks=8).merge(aggregate_fine(df.lazy(), n_blocks=9))


def test_blocks_hold_whole_sequences():
    """All tokens of one sequence land in the same block."""
    df = _tokens()
    blocks = df.select(pl.col("seq_id"), (pl.col("seq_key") % 16).alias("b")).unique()
    assert blocks["seq_id"].n_unique() == blocks.height


def test_quantile_bins_have_about_equal_counts():
    """Quantile coarse bins split the positive-entropy tokens evenly; H=0 gets its own bin."""
    df = _tokens(n=20000, n_seq=300)
    agg = aggregate_fine(df.lazy(), n_blocks=16)
    b = coarse_binning(agg.counts_per_fine(), bins=10, edges="quantile")
    assert b.has_zero_bin and b.n_bins == 11
    S = coarse_block_sums(agg, b)
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
    agg = aggregate_fine(df.lazy(), n_blocks=4)
    b = coarse_binning(agg.counts_per_fine(), bins=20, edges="log")
    n = coarse_block_sums(agg, b)["n"].sum(axis=1)
    assert b.n_bins == 2 and list(n) == [50, 50]


def test_coarse_expr_matches_numpy_mapping():
    """The polars coarse-bin expression assigns every token the bin of its fine bin."""
    df = _tokens(n=5000, n_seq=100)
    agg = aggregate_fine(df.lazy(), n_blocks=16)
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
