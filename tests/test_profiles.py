"""Report profiles (entr_diag.profiles): hand-computed small cases, invariances, unavailability."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from entr_diag.errors import ParameterError
from entr_diag.passes import run_pass
from entr_diag.profiles import (
    compute_profiles,
    density_2d,
    log_edges,
    mismatch_by_prob,
    offenders,
    profiles_plan,
    version_switch_profile,
)


def _frame(rows: list[dict]) -> pl.LazyFrame:
    """Canonical token frame (docs/CONTRACT.md dtypes) from row dicts."""
    df = pl.DataFrame(rows)
    df = df.with_columns(
        pl.col("seq_id").cast(pl.String),
        pl.col("seq_id").cast(pl.String).hash().alias("seq_key"),
        pl.col("position").cast(pl.Int64),
        (pl.col("train_logprob") - pl.col("infer_logprob")).alias("delta"),
    )
    for c in ("step", "policy_version", "token_id"):
        if c in df.columns:
            df = df.with_columns(pl.col(c).cast(pl.Int64))
    return df.lazy()


def _tok(seq, pos, il, tl, h=None, step=0, pv=None, tid=7):
    r = {
        "seq_id": seq,
        "position": pos,
        "infer_logprob": il,
        "train_logprob": tl,
        "step": step,
        "token_id": tid,
    }
    if h is not None:
        r["entropy"] = h
    if pv is not None:
        r["policy_version"] = pv
    return r


def _random_frame(n: int = 5000, seed: int = 0) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    seq = rng.integers(0, 200, n)
    h = rng.exponential(0.5, n)
    h[:50] = 0.0
    il = -rng.exponential(1.0, n)
    d = rng.normal(0, 0.1, n)
    d[:20] = 0.0
    df = pl.DataFrame(
        {
            "seq_id": seq.astype(str),
            "infer_logprob": il,
            "train_logprob": il + d,
            "entropy": h,
            "step": (seq // 50).astype(np.int64),
            "token_id": rng.integers(0, 1000, n),
        }
    ).with_columns(
        pl.col("seq_id").hash().alias("seq_key"),
        pl.int_range(pl.len()).over("seq_id").cast(pl.Int64).alias("position"),
        (pl.col("train_logprob") - pl.col("infer_logprob")).alias("delta"),
    )
    return df.with_columns(
        ((pl.col("position") >= 5) & (pl.col("seq_key") % 3 == 0))
        .cast(pl.Int64)
        .alias("policy_version")
    )


# --------------------------------------------------------------------- edges


def test_log_edges_shape_and_floor():
    """log_edges gives a floor bin [0, lo) then n log-spaced bins up to hi."""
    e = log_edges(1e-2, 1.0, 2)
    assert e[0] == 0.0
    assert e[1:] == pytest.approx([1e-2, 1e-1, 1.0])


@pytest.mark.parametrize("lo,hi,n", [(0.0, 1.0, 3), (1.0, 0.5, 3), (1e-3, 1.0, 0)])
def test_log_edges_rejects_bad_parameters(lo, hi, n):
    """Non-positive lo, hi <= lo or n < 1 raise ParameterError."""
    with pytest.raises(ParameterError):
        log_edges(lo, hi, n)


# --------------------------------------------------------------------- density


def test_density_2d_hand_case():
    """Each token lands in the hand-computed (H, |delta|) cell; zeros go to the floor bins."""
    lf = _frame(
        [
            _tok(1, 0, -0.1, -0.1, h=0.0),  # H=0, |d|=0 -> (0, 0)
            _tok(1, 1, -0.1, -0.15, h=0.05),  # H in [1e-2,1e-1) -> 1; |d|=0.05 -> [1e-2,1e-1) -> 1
            _tok(2, 0, -1.0, -0.5, h=5.0),  # H >= hi -> last bin 2; |d|=0.5 -> [1e-1, 1) -> 2
        ]
    )
    d = density_2d(lf, h_range=(1e-2, 1.0), h_bins=2, abs_delta_range=(1e-2, 1.0), abs_delta_bins=2)
    assert d.available and d.n_tokens == 3
    c = [list(r) for r in d.counts]
    assert c == [[1, 0, 0], [0, 1, 0], [0, 0, 1]]
    assert d.to_dict()["h_edges"][0] == 0.0


def test_density_2d_without_entropy_is_unavailable():
    """Without an entropy column the density says why instead of returning counts."""
    lf = _frame([_tok(1, 0, -0.1, -0.2)])
    d = density_2d(lf)
    assert not d.available and "entropy" in d.reason
    assert d.n_tokens == 0


def test_density_2d_bounded_and_complete():
    """The grid size is fixed by the edges and the counts add up to the token count."""
    df = _random_frame()
    d = density_2d(df.lazy(), h_bins=10, abs_delta_bins=12)
    assert len(d.counts) == 11 and all(len(r) == 13 for r in d.counts)
    assert sum(map(sum, d.counts)) == df.height == d.n_tokens


# --------------------------------------------------------------------- by p


def test_mismatch_by_prob_hand_case():
    """Per-bin tokens, signed/absolute/squared means and mass shares match a hand computation."""
    lf = _frame(
        [
            _tok(1, 0, math.log(0.5), math.log(0.5) + 0.2, h=1.0),
            _tok(1, 1, math.log(0.6), math.log(0.6) - 0.4, h=3.0),
            _tok(2, 0, math.log(1e-3), math.log(1e-3) + 1.0, h=0.01),
        ]
    )
    p = mismatch_by_prob(lf, p_range=(1e-4, 1.0), bins=4)  # decades
    bins = p.to_dict()["bins"]
    assert [b["tokens"] for b in bins] == [0, 0, 1, 0, 2]
    top = bins[4]
    assert top["p_lo"] == pytest.approx(0.1) and top["p_hi"] == pytest.approx(1.0)
    assert top["mean_delta"] == pytest.approx(-0.1)
    assert top["mean_abs_delta"] == pytest.approx(0.3)
    assert top["mean_delta_sq"] == pytest.approx(0.1)
    assert top["mean_entropy"] == pytest.approx(2.0)
    total = 0.04 + 0.16 + 1.0
    assert top["delta_sq_share"] == pytest.approx(0.2 / total)
    assert bins[2]["delta_sq_share"] == pytest.approx(1.0 / total)
    assert bins[0]["mean_delta"] is None
    assert p.n_tokens == 3


def test_mismatch_by_prob_row_order_invariant():
    """Shuffling the token rows changes no number."""
    df = _random_frame()
    a = mismatch_by_prob(df.lazy()).to_dict()
    b = mismatch_by_prob(df.sample(fraction=1.0, shuffle=True, seed=3).lazy()).to_dict()
    for x, y in zip(a["bins"], b["bins"], strict=True):
        assert x["tokens"] == y["tokens"]
        for k in ("mean_delta", "mean_abs_delta", "mean_delta_sq"):
            assert (x[k] is None and y[k] is None) or x[k] == pytest.approx(y[k], rel=1e-9)


# --------------------------------------------------------------------- switches


def test_version_switch_hand_case():
    """Offsets count from the first token of the new version; means per offset are exact."""
    rows = [
        _tok(1, 0, -0.1, -0.1 - 0.1, h=1.0, pv=3),
        _tok(1, 1, -0.1, -0.1 - 0.2, h=2.0, pv=3),
        _tok(1, 2, -0.1, -0.1 + 0.4, h=3.0, pv=4),  # switch at position 2
        _tok(1, 3, -0.1, -0.1 + 0.8, h=4.0, pv=4),
        _tok(2, 0, -0.1, -0.1 + 0.05, h=9.0, pv=4),  # no switch
        _tok(2, 1, -0.1, -0.1 + 0.05, h=9.0, pv=4),
    ]
    # rows in scrambled order: the profile orders by position itself
    v = version_switch_profile(_frame(rows[::-1]), max_offset=2)
    d = v.to_dict()
    assert d["available"] and d["offsets"] == [-2, -1, 0, 1, 2]
    assert d["tokens"] == [1, 1, 1, 1, 0]
    assert d["mean_abs_delta"][:4] == pytest.approx([0.1, 0.2, 0.4, 0.8])
    assert d["mean_abs_delta"][4] is None
    assert d["mean_entropy"][:4] == pytest.approx([1.0, 2.0, 3.0, 4.0])
    assert (d["n_sequences"], d["n_sequences_with_switch"], d["n_switches"]) == (2, 1, 1)
    assert d["non_contiguous_sequences"] == 0


def test_version_switch_unavailable_reasons():
    """No policy_version column, or no sequence switching, gives a reason instead of a chart."""
    no_col = version_switch_profile(_frame([_tok(1, 0, -0.1, -0.2, h=1.0)]))
    assert not no_col.available and "policy_version" in no_col.reason
    one = version_switch_profile(
        _frame([_tok(1, 0, -0.1, -0.2, h=1.0, pv=2), _tok(1, 1, -0.1, -0.2, h=1.0, pv=2)])
    )
    assert not one.available and "single policy version" in one.reason
    assert one.n_sequences == 1 and len(one.offsets) == 33


def test_version_switch_rejects_bad_offset():
    """max_offset < 1 is a ParameterError."""
    with pytest.raises(ParameterError):
        version_switch_profile(_frame([_tok(1, 0, -0.1, -0.2, pv=1)]), max_offset=0)


# --------------------------------------------------------------------- offenders


def test_offenders_hand_case():
    """Tokens rank by delta^2/(H+eps), sequences by mean |delta|, with their keys."""
    lf = _frame(
        [
            _tok("a", 0, -0.1, -0.2, h=0.0, step=3, tid=11),  # 0.01/0.01 = 1
            _tok("a", 1, -0.1, -0.1, h=1.0, step=3),  # 0
            _tok("b", 0, -2.0, -1.0, h=1.99, step=4, tid=12),  # 1/2 = 0.5
            _tok("c", 0, -0.5, -0.3, h=0.03, step=4, tid=13),  # 0.04/0.04 = 1 (tie)
        ]
    )
    o = offenders(lf, top=3, eps=0.01).to_dict()
    assert o["score_kind"] == "delta^2/(H+eps)"
    toks = o["tokens"]
    assert [t["seq_id"] for t in toks] == ["a", "c", "b"]  # tie broken by seq_id
    assert toks[0]["score"] == pytest.approx(1.0)
    assert toks[0]["position"] == 0 and toks[0]["step"] == 3 and toks[0]["token_id"] == 11
    assert toks[2]["p"] == pytest.approx(math.exp(-2.0))
    assert toks[2]["delta"] == pytest.approx(1.0)
    seqs = o["sequences"]
    assert [s["seq_id"] for s in seqs] == ["b", "c", "a"]
    assert seqs[2]["tokens"] == 2
    assert seqs[2]["mean_abs_delta"] == pytest.approx(0.05)
    assert seqs[2]["max_abs_delta"] == pytest.approx(0.1)


def test_offenders_without_entropy_scores_delta_squared():
    """Without entropy the token score is delta^2 and says so."""
    o = offenders(_frame([_tok(1, 0, -0.1, -0.4)]), top=5)
    assert o.score_kind == "delta^2"
    assert o.tokens[0]["score"] == pytest.approx(0.09)
    assert o.tokens[0]["entropy"] is None


@pytest.mark.parametrize("kw", [{"top": 0}, {"eps": -1.0}, {"eps": math.inf}])
def test_offenders_rejects_bad_parameters(kw):
    """top < 1 or a negative / infinite eps raise ParameterError."""
    with pytest.raises(ParameterError):
        offenders(_frame([_tok(1, 0, -0.1, -0.4, h=1.0)]), **kw)


def test_offenders_row_order_invariant():
    """Shuffling the token rows gives the same top tables."""
    df = _random_frame()
    a = offenders(df.lazy(), top=10).to_dict()
    b = offenders(df.sample(fraction=1.0, shuffle=True, seed=5).lazy(), top=10).to_dict()
    assert a["tokens"] == b["tokens"]
    assert [s["seq_id"] for s in a["sequences"]] == [s["seq_id"] for s in b["sequences"]]
    for x, y in zip(a["sequences"], b["sequences"], strict=True):
        assert x["mean_abs_delta"] == pytest.approx(y["mean_abs_delta"], rel=1e-12)


# --------------------------------------------------------------------- bundle


def test_compute_profiles_to_dict_keys():
    """The bundle's to_dict has the four keys the HTML report reads."""
    d = compute_profiles(_random_frame().lazy()).to_dict()
    assert set(d) == {"density_2d", "mismatch_by_prob", "version_switch", "offenders"}
    assert d["version_switch"]["available"]
    assert d["offenders"]["available"]


# --------------------------------------------------------------------- one pass


def _close(a, b, path=""):
    """Nested to_dict outputs equal, floats up to summation order."""
    if isinstance(a, dict):
        assert set(a) == set(b), path
        for k in a:
            _close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _close(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-9, abs=1e-12), path
    else:
        assert a == b, path


def _plan_dict(lf: pl.LazyFrame, chunk_size: int, **kw) -> dict:
    plan = profiles_plan(lf, **kw)
    run_pass(lf, plan.accumulators, chunk_size=chunk_size)
    run_pass(lf, plan.followup(), chunk_size=chunk_size)
    return plan.finish().to_dict()


@pytest.mark.parametrize("eps", [0.01, 0.0])
def test_profiles_plan_independent_of_batches(eps):
    """Batches of 97 rows, a shuffled frame in batches of 131 and one whole batch give the same profiles
    (sequences split across batches merge; eps=0 makes NaN and tied top scores)."""
    df = _random_frame()
    whole = _plan_dict(df.lazy(), 1_000_000, eps=eps, top=10)
    assert whole["version_switch"]["available"] and whole["offenders"]["available"]
    _close(whole, _plan_dict(df.lazy(), 97, eps=eps, top=10))
    shuffled = df.sample(fraction=1.0, shuffle=True, seed=11).lazy()
    _close(whole, _plan_dict(shuffled, 131, eps=eps, top=10))
    _close(whole, compute_profiles(df.lazy(), eps=eps, top=10).to_dict())


def test_offenders_tokens_match_a_whole_frame_top_k():
    """The merged top tokens are the top-k of the whole frame in (score desc, seq_id,
    position) order, NaN scores (0/0 at eps=0) first, whatever the batches."""
    df = _random_frame()
    ref = (
        df.with_columns(((pl.col("delta") ** 2) / pl.col("entropy")).alias("score"))
        .top_k(30, by=["score", "seq_id", "position"], reverse=[False, True, True])
        .sort(["score", "seq_id", "position"], descending=[True, False, False])
    )
    plan = profiles_plan(df.lazy(), eps=0.0, top=30)
    run_pass(df.lazy(), plan.accumulators, chunk_size=37)
    toks = plan.finish().offenders.tokens
    assert [(t["seq_id"], t["position"]) for t in toks] == list(
        zip(ref["seq_id"], ref["position"], strict=True))
    assert math.isnan(toks[0]["score"])


def test_profiles_plan_followup_only_with_switches():
    """The second pass is needed only when some sequence switches policy version; finish()
    runs it itself when the caller did not."""
    one = _frame([_tok(1, 0, -0.1, -0.2, h=1.0, pv=2), _tok(1, 1, -0.1, -0.3, h=1.0, pv=2)])
    plan = profiles_plan(one)
    run_pass(one, plan.accumulators)
    assert plan.followup() == []
    rows = [_tok(1, 0, -0.1, -0.2, h=1.0, pv=3), _tok(1, 1, -0.1, -0.5, h=2.0, pv=4)]
    lf = _frame(rows)
    plan = profiles_plan(lf, max_offset=1)
    run_pass(lf, plan.accumulators)
    assert len(plan.followup()) == 1
    v = plan.finish().version_switch
    assert v.tokens == (1, 1, 0)
    assert v.mean_abs_delta[:2] == pytest.approx((0.1, 0.4))


@pytest.mark.parametrize("kw", [{"top": 0}, {"eps": -1.0}, {"max_offset": 0}])
def test_profiles_plan_rejects_bad_parameters(kw):
    """The plan checks its parameters before any pass."""
    with pytest.raises(ParameterError):
        profiles_plan(_frame([_tok(1, 0, -0.1, -0.4, h=1.0)]), **kw)


def test_non_finite_tokens_as_the_polars_reference(monkeypatch):
    """Tokens with a NaN, infinite or null delta, entropy or infer_logprob are left out of
    the histograms, the p-bin sums and the top tokens exactly as polars' filters and
    null-skipping sums would; the per-(sequence, version) table reduced with numpy equals
    the polars group-by that batches with a null key take."""
    import entr_diag.profiles as P

    df = _random_frame(3000, seed=4)
    n = df.height
    bad = {"delta": [float("nan"), float("inf"), None], "entropy": [float("nan"), None, -0.0],
           "infer_logprob": [float("-inf"), None, float("nan")]}
    for j, (c, vals) in enumerate(bad.items()):
        col = df[c].to_list()
        for i in range(j * 7, n, 97):
            col[i] = vals[i % 3]
        df = df.with_columns(pl.Series(c, col, dtype=pl.Float64))
    lf = df.lazy()
    plan = profiles_plan(lf, eps=0.01, top=15)
    run_pass(lf, plan.accumulators, chunk_size=101)
    got = plan.finish()
    h, d, lp = pl.col("entropy"), pl.col("delta"), pl.col("infer_logprob")
    fin = df.filter((h.is_finite() & d.is_finite()).fill_null(False))
    cells = fin.group_by(P._log_bin(h, *P._H_GRID[0], P._H_GRID[1]).alias("i"),
                         P._log_bin(d.abs(), *P._ABS_DELTA_GRID[0], P._ABS_DELTA_GRID[1])
                         .alias("j")).len()
    ref = np.zeros((P._H_GRID[1] + 1, P._ABS_DELTA_GRID[1] + 1), dtype=np.int64)
    ref[cells["i"].to_numpy(), cells["j"].to_numpy()] = cells["len"].to_numpy()
    assert np.array_equal(np.array(got.density_2d.counts), ref)
    pb = (df.filter((d.is_finite() & lp.is_finite()).fill_null(False))
          .group_by(P._log_bin(lp.exp(), *P._P_GRID[0], P._P_GRID[1]).alias("b"))
          .agg(pl.len().alias("n"), d.mean().alias("m"), (d * d).mean().alias("q"),
               h.filter(h.is_finite()).mean().alias("mh")).sort("b"))
    bins = {b: row for b, row in enumerate(got.mismatch_by_prob.bins)}
    for b, n_b, m, q, mh in pb.iter_rows():
        assert bins[b].tokens == n_b
        assert bins[b].mean_delta == pytest.approx(m, rel=1e-9, abs=1e-15)
        assert bins[b].mean_delta_sq == pytest.approx(q, rel=1e-9)
        assert bins[b].mean_entropy == pytest.approx(mh, rel=1e-9)
    top = (fin.with_columns((d * d / (h + 0.01)).alias("score"))
           .top_k(15, by=["score", "seq_id", "position"], reverse=[False, True, True])
           .sort(["score", "seq_id", "position"], descending=[True, False, False]))
    assert [(t["seq_id"], t["position"]) for t in got.offenders.tokens] == list(
        zip(top["seq_id"], top["position"], strict=True))
    monkeypatch.setattr(P, "has_nulls", lambda batch, cols: True)
    grouped = profiles_plan(lf, eps=0.01, top=15)
    run_pass(lf, grouped.accumulators, chunk_size=101)
    _close(got.to_dict(), grouped.finish().to_dict())
    a, b = (P._seq_table(p._seq).sort("seq_key", "policy_version") for p in (plan, grouped))
    assert a.schema == b.schema
    assert a.select(pl.exclude("s_abs")).equals(b.select(pl.exclude("s_abs")))
    np.testing.assert_allclose(a["s_abs"].to_numpy(), b["s_abs"].to_numpy(), rtol=1e-12)
