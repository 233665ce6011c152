"""Gate specs (entr_diag.gates): hand-computed keep decisions, properties, spec parsing."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from entr_diag.compare import _first_value_where, _refine, matched_fixed_c, resolve_m2po_cut
from entr_diag.errors import ParameterError
from entr_diag.gates import (
    DEFAULT_PANEL,
    GATE_TYPES,
    M2PO,
    TIS,
    AReaLCap,
    CatastrophicVeto,
    EntrGate,
    FixedBand,
    GeoRS,
    IcePop,
    K3SeqRS,
    SeqIS,
    SeqTIS,
    TokenMIS,
    parse_gate_spec,
)

# Four sequences, eight tokens (seq_key, delta, entropy):
#   A (1): delta 0.1, -0.2, 0.05   H 1.0, 0.01, 0.0
#   B (2): delta 1.0, -0.5          H 0.5, 2.0
#   C (3): delta -10                H 0.1
#   D (4): delta 5e-4, -5e-4        H 0.3, 0.3
TINY = pl.DataFrame(
    {
        "seq_key": pl.Series([1, 1, 1, 2, 2, 3, 4, 4], dtype=pl.UInt64),
        "delta": [0.1, -0.2, 0.05, 1.0, -0.5, -10.0, 5e-4, -5e-4],
        "entropy": [1.0, 0.01, 0.0, 0.5, 2.0, 0.1, 0.3, 0.3],
    }
)


def keeps(gate, df: pl.DataFrame = TINY) -> list[bool]:
    return df.select(gate.keep_expr().alias("k"))["k"].to_list()


T, F = True, False


class TestTokenGates:
    def test_entr(self):
        """ENTR keeps delta^2/(H+eps) <= tau: scores 0.0099, 2, 0.25, 1.96, 0.124, 909, ~0."""
        assert keeps(EntrGate(tau=4, eps=0.01)) == [T, T, T, T, T, F, T, T]
        assert keeps(EntrGate(tau=1.0, eps=0.01)) == [T, F, T, F, T, F, T, T]

    def test_entr_zero_eps_zero_entropy(self):
        """With eps = 0 and H = 0 only delta == 0 is kept (score 0, else +inf)."""
        df = pl.DataFrame({"delta": [0.0, 1e-9], "entropy": [0.0, 0.0]})
        assert keeps(EntrGate(tau=4, eps=0.0), df) == [T, F]

    def test_fixed_band_inclusive(self):
        """The fixed band keeps |delta| <= c, boundary included (|-0.5| <= 0.5)."""
        assert keeps(FixedBand(c=0.5)) == [T, T, T, F, T, F, T, T]

    def test_icepop(self):
        """IcePop keeps 0.5 <= r <= 5: only r = e^-10 leaves the band."""
        assert keeps(IcePop()) == [T, T, T, T, T, F, T, T]

    def test_mis(self):
        """Token MIS keeps 0.5 <= r <= 2: r = e (delta 1) and e^-10 are masked."""
        assert keeps(TokenMIS()) == [T, T, T, F, T, F, T, T]

    def test_areal_cap(self):
        """AReaL's behaviour-weight cap keeps r <= cap (upper only, inclusive: r = e^1 stays
        at cap = e), and with a floor also r >= floor; r = e^-10 passes with no floor."""
        assert keeps(AReaLCap()) == [T] * 8
        assert keeps(AReaLCap(cap=2.0)) == [T, T, T, F, T, T, T, T]
        df = pl.DataFrame({"delta": [1.0, 1.0 + 1e-9, -0.5, -0.5 - 1e-9]})
        assert keeps(AReaLCap(cap=math.exp(1.0)), df) == [T, F, T, T]
        assert keeps(AReaLCap(cap=5.0, floor=math.exp(-0.5)), df) == [T, T, T, F]
        assert keeps(AReaLCap(cap=2.0, floor=0.2)) == [T, T, T, F, T, F, T, T]

    def test_tis_keeps_all(self):
        """TIS keeps every token and truncates the weight at cap."""
        g = TIS(cap=2.0)
        assert keeps(g) == [T] * 8
        w = TINY.select(g.weight_expr())["delta"].to_list()
        assert w[3] == 2.0 and w[0] == pytest.approx(math.exp(0.1))
        assert TINY.select(g.truncated_expr().sum()).item() == 1


class TestSequenceGates:
    def test_seq_is(self):
        """Sequence IS: sums A -0.05, B 0.5, C -10, D 0; upper 2 drops C, upper 1.5 also B."""
        assert keeps(SeqIS(upper=2.0)) == [T, T, T, T, T, F, T, T]
        assert keeps(SeqIS(upper=1.5)) == [T, T, T, F, F, F, T, T]
        assert SeqIS(upper=4.0).lower == 0.25

    def test_geo_rs(self):
        """Geo-RS: only D's geometric-mean ratio (exactly 1) is inside [0.999, 1.001]."""
        assert keeps(GeoRS()) == [F, F, F, F, F, F, T, T]

    def test_k3(self):
        """K3: mean k3 A 0.00839, B 0.359, C 9.00005, D 1.25e-7; threshold 0.01 keeps A, D."""
        assert keeps(K3SeqRS()) == [T, T, T, F, F, F, T, T]
        assert keeps(K3SeqRS(threshold=0.008)) == [F, F, F, F, F, F, T, T]

    def test_veto(self):
        """Veto drops only C (r = e^-10 < 1e-4)."""
        assert keeps(CatastrophicVeto()) == [T, T, T, T, T, F, T, T]
        assert keeps(CatastrophicVeto(min_ratio=0.7)) == [T, T, T, F, F, F, T, T]

    def test_row_order_free(self):
        """Window decisions follow the rows when the frame is shuffled."""
        perm = [5, 2, 7, 0, 3, 1, 6, 4]
        shuffled = TINY[perm]
        for g in (SeqIS(), SeqTIS(), GeoRS(), K3SeqRS(), CatastrophicVeto()):
            assert keeps(g, shuffled) == [keeps(g)[i] for i in perm]


    def test_partials_merge_to_the_statistics(self):
        """Per-sequence partials computed on two halves of the rows and merged give the
        statistics of seq_aggs, hence the same keep decision."""
        agg = {"sum": pl.Expr.sum, "count": pl.Expr.count, "min": pl.Expr.min,
               "max": pl.Expr.max}
        merge = {"sum": pl.Expr.sum, "count": pl.Expr.sum, "min": pl.Expr.min,
                 "max": pl.Expr.max}
        halves = [TINY[[0, 3, 5, 6]], TINY[[1, 2, 4, 7]]]
        for g in (SeqIS(), SeqTIS(), GeoRS(), K3SeqRS(), CatastrophicVeto()):
            parts = g.seq_partials()
            merged = (
                pl.concat(
                    h.group_by("seq_key").agg(
                        [agg[how](e).alias(k) for k, (e, how) in parts.items()]
                    )
                    for h in halves
                )
                .group_by("seq_key")
                .agg([merge[how](pl.col(k)) for k, (_, how) in parts.items()])
            )
            stats = g.stats_from_partials({k: pl.col(k) for k in parts})
            got = merged.select("seq_key", g.keep_from(stats).alias("k")).sort("seq_key")
            want = TINY.group_by("seq_key").agg(
                g.keep_from(g.seq_aggs()).alias("k")
            ).sort("seq_key")
            assert got.rows() == want.rows(), g.spec()
            got_s = merged.select("seq_key", **stats).sort("seq_key")
            want_s = TINY.group_by("seq_key").agg(**g.seq_aggs()).sort("seq_key")
            np.testing.assert_allclose(got_s.to_numpy(), want_s.to_numpy(), rtol=1e-12)


class TestM2PO:
    def test_order_of_removal(self):
        """delta^2 = 100, 1, 0.25 go first (means 0.186, 0.0504, 0.0105 of the rest)."""
        # 0.04: stop after three removals (C, B0, B1)
        assert keeps(M2PO(max_mean_sq=0.04)) == [T, T, T, F, F, F, T, T]
        # 0.06: the rest after two removals has mean 0.0504 <= 0.06: keep B1
        assert keeps(M2PO(max_mean_sq=0.06)) == [T, T, T, F, T, F, T, T]
        # 0.2: mean 0.186 after removing only C
        assert keeps(M2PO(max_mean_sq=0.2)) == [T, T, T, T, T, F, T, T]
        # 20: the whole batch (mean 12.66) already satisfies the bound
        assert keeps(M2PO(max_mean_sq=20)) == [T] * 8

    def test_ties_dropped_together(self):
        """Equal delta^2 at the cut are dropped as a group (row order cannot matter)."""
        df = pl.DataFrame({"delta": [1.0, -1.0, 0.0, 0.0, 0.0, 0.0]})
        # dropping one of the 1s would reach mean 0.2 <= 0.3, but both go
        assert keeps(M2PO(max_mean_sq=0.3), df) == [F, F, T, T, T, T]

    def test_nothing_kept_when_min_above(self):
        df = pl.DataFrame({"delta": [1.0, 2.0]})
        assert keeps(M2PO(max_mean_sq=0.5), df) == [F, F]

    def test_the_rest_must_be_below_the_bound(self):
        """'until the mean of the rest is below max_mean_sq' (METHOD.md, AReaL's strict <):
        a rest whose mean equals the bound is dropped too, in memory and streaming."""
        df = pl.DataFrame({"delta": [1.0, 0.5, -0.5, 0.0]})  # delta^2 = 1, .25, .25, 0
        g = M2PO(max_mean_sq=0.125)  # dropping the 1 leaves mean 0.5 / 3 = 0.1667: go on;
        # dropping the 0.25s leaves 0 < 0.125: keep only the 0
        assert keeps(g, df) == [F, F, F, T]
        g = M2PO(max_mean_sq=1.5 / 4 + 1e-12)  # the whole frame: mean 0.375 < bound
        assert keeps(g, df) == [T] * 4
        g = M2PO(max_mean_sq=0.375)  # equal: not below, the 1 goes
        assert keeps(g, df) == [F, T, T, T]
        for thr in (0.125, 0.375, 0.5 / 3):
            g = M2PO(max_mean_sq=thr)
            cut = resolve_m2po_cut(df.lazy(), g)
            assert df.select(g.keep_expr_with_cut(cut))["delta"].to_list() == keeps(g, df)
        assert keeps(M2PO(max_mean_sq=0.5 / 3), df) == [F, F, F, T]  # 0.1667 not below itself

    def test_streaming_cut_matches_window(self):
        """resolve_m2po_cut on a LazyFrame gives the window expression's decisions."""
        for thr in (0.04, 0.06, 0.2, 20.0):
            g = M2PO(max_mean_sq=thr)
            cut = resolve_m2po_cut(TINY.lazy(), g)
            got = TINY.select(g.keep_expr_with_cut(cut))["delta"].to_list()
            assert got == keeps(g)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.floats(-3, 3, allow_nan=False).map(lambda x: round(x, 2)), min_size=1, max_size=300
    ),
    st.floats(0.001, 2.0),
)
def test_m2po_refinement_exact(vals, thr):
    """Histogram refinement (tiny bins / candidate sets forced) equals the exact window rule."""
    df = pl.DataFrame({"delta": vals})
    g = M2PO(max_mean_sq=thr)
    u = _first_value_where(
        df.lazy(), pl.col("delta") ** 2, g.drops_prefix, bins=3, small=2
    )
    cut = math.inf if u is None else u
    assert df.select(g.keep_expr_with_cut(cut))["delta"].to_list() == keeps(g, df)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.floats(-3, 3, allow_nan=False).map(lambda x: round(x, 2)), min_size=1, max_size=200
    ),
    st.integers(0, 220),
)
def test_matched_c_is_order_statistic(vals, k):
    """matched_fixed_c(n_keep) is the n_keep-th smallest |delta| (clamped to the data)."""
    df = pl.DataFrame({"delta": vals})
    c = matched_fixed_c(df.lazy(), k)
    a = np.sort(np.abs(vals))
    if k <= 0:  # keeps none, except |delta| == 0 (c is clamped at 0)
        assert (a <= c).sum() == (a == 0).sum()
    elif k >= len(a):
        assert c == a[-1]
    else:
        assert c == a[k - 1]


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(-5, 5, allow_nan=False), st.floats(0, 8, allow_nan=False)),
        min_size=1,
        max_size=50,
    ),
    st.floats(0.01, 20),
    st.floats(0.0, 20),
    st.floats(0, 0.1),
)
def test_raising_tau_never_drops_a_kept_token(rows, tau, extra, eps):
    """ENTR at a larger tau keeps a superset of the tokens kept at a smaller tau."""
    df = pl.DataFrame({"delta": [r[0] for r in rows], "entropy": [r[1] for r in rows]})
    lo = keeps(EntrGate(tau=tau, eps=eps), df)
    hi = keeps(EntrGate(tau=tau + extra, eps=eps), df)
    assert all(h for low, h in zip(lo, hi, strict=True) if low)


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.floats(-5, 5, allow_nan=False), min_size=1, max_size=50),
    st.floats(0, 8),
    st.floats(0.01, 20),
    st.floats(0.001, 0.1),
)
def test_entr_with_constant_entropy_is_a_fixed_band(deltas, h, tau, eps):
    """ENTR with constant H equals the band c = sqrt(tau (H + eps)) (away from float ties)."""
    df = pl.DataFrame({"delta": deltas, "entropy": [h] * len(deltas)})
    c = math.sqrt(tau * (h + eps))
    a = keeps(EntrGate(tau=tau, eps=eps), df)
    b = keeps(FixedBand(c=c), df)
    for d, x, y in zip(deltas, a, b, strict=True):
        if abs(abs(d) - c) > 1e-9 * max(1.0, c):
            assert x == y


class TestParse:
    @pytest.mark.parametrize(
        "spec, expected",
        [
            ("fixed:c=0.5", FixedBand(c=0.5)),
            ("icepop:low=0.5,high=5", IcePop(low=0.5, high=5.0)),
            ("entr:tau=4,eps=0.01", EntrGate(tau=4.0, eps=0.01)),
            ("estr:tau=4", EntrGate(tau=4.0)),
            ("ESTR", EntrGate()),
            ("fixed:c=log2", FixedBand(c=math.log(2))),
            ("seq-is:upper=3", SeqIS(upper=3.0)),
            ("seqis", SeqIS()),
            ("geo-rs", GeoRS()),
            ("k3:threshold=0.02", K3SeqRS(threshold=0.02)),
            ("veto:min_ratio=1e-3", CatastrophicVeto(min_ratio=1e-3)),
            ("m2po:max_mean_sq=0.1", M2PO(max_mean_sq=0.1)),
            (" mis : low = 0.4 , high = 2.5 ", TokenMIS(low=0.4, high=2.5)),
            ("tis:cap=3", TIS(cap=3.0)),
            ("icepop:low=0,high=2", IcePop(low=0.0, high=2.0)),
            ("areal:cap=inf", AReaLCap(cap=math.inf)),
            ("mis:low=0.5,high=inf", TokenMIS(low=0.5, high=math.inf)),
            ("tis:cap=inf", TIS(cap=math.inf)),
            ("seq-tis:cap=inf", SeqTIS(cap=math.inf)),
            ("areal", AReaLCap()),
            ("seq-tis:cap=3", SeqTIS(cap=3.0)),
            ("sequence-tis", SeqTIS()),
            ("areal:cap=5,floor=0.2", AReaLCap(cap=5.0, floor=0.2)),
            ("behav-cap:cap=10", AReaLCap(cap=10.0)),
        ],
    )
    def test_valid(self, spec, expected):
        """Specs parse to the gate, aliases and case included, and round-trip via spec()."""
        g = parse_gate_spec(spec)
        assert g == expected
        assert parse_gate_spec(g.spec()) == g

    @pytest.mark.parametrize("spec", [5, None, ["fixed"]])
    def test_a_spec_that_is_not_a_str_is_a_type_error(self, spec):
        """A number, None or a list is a TypeError naming what was given, not "Empty gate
        spec"."""
        with pytest.raises(TypeError, match=r"parse_gate_spec: expected the spec as a str .*, "
                                            rf"got {type(spec).__qualname__}\."):
            parse_gate_spec(spec)

    @pytest.mark.parametrize(
        "spec, fragment",
        [
            ("bogus", "unknown gate 'bogus'"),
            ("", "empty gate spec"),
            ("fixed:d=1", "has no parameter 'd'"),
            ("fixed:c=abc", "is not a number"),
            ("fixed:c=1e400", "'1e400' of 'c' is too large for a float"),
            ("entr:tau=-1e999", "'-1e999' of 'tau' is too large for a float"),
            ("fixed:c", "expected param=value"),
            ("fixed:", "nothing after ':'"),
            ("icepop: ", "nothing after ':'"),
            ("fixed:c=1,", "expected param=value"),
            ("fixed:c=-1", "c must be a number >= 0"),
            ("fixed:c=nan", "c must be a number >= 0"),
            ("entr:tau=0", "tau must be a positive number"),
            ("icepop:low=5,high=1", "0 <= low <= high"),
            ("mis:low=-1,high=2", "0 <= low <= high"),
            ("icepop:low=0,high=0", "high > 0"),
            ("seq-is:upper=0.5", "lower <= upper"),
            ("m2po:max_mean_sq=0", "max_mean_sq must be > 0"),
            ("areal:cap=2,floor=3", "0 <= floor <= cap"),
            ("areal:cap=0", "cap must be a positive ratio"),
            ("areal:cap=nan", "cap must be a positive ratio"),
            ("tis:cap=-1", "cap must be a positive ratio"),
            ("fixed:c=1,c=2", "given twice"),
        ],
    )
    def test_errors_say_the_usage_on_one_line(self, spec, fragment):
        """A bad spec raises ParameterError naming the problem on one line, with the gate's
        parameters and defaults, or every gate name when the gate is unknown."""
        with pytest.raises(ParameterError) as ei:
            parse_gate_spec(spec)
        msg = str(ei.value)
        assert fragment in msg and "\n" not in msg
        name = spec.partition(":")[0]
        if name in GATE_TYPES:
            d = GATE_TYPES[name]()
            assert f"Usage: {name}:" in msg
            assert all(f"{k}=" in msg for k in d.params())
        else:
            assert all(g in msg for g in GATE_TYPES)

    def test_a_refused_value_is_named_in_the_spec_as_typed(self):
        """A value the gate refuses is echoed in the spec the user typed, not with the other
        parameters' defaults filled in (helper-28: tau=nan echoed an eps never typed)."""
        with pytest.raises(ParameterError) as ei:
            parse_gate_spec("entr:tau=nan")
        msg = str(ei.value)
        assert "tau must be a positive number (in gate spec 'entr:tau=nan')." in msg
        assert "eps=0.01" not in msg.split("Usage:")[0]

    def test_default_panel(self):
        """The default panel holds one of each non-ENTR gate, with documented sources."""
        names = [g.name for g in DEFAULT_PANEL]
        assert set(names) == set(GATE_TYPES) - {"entr"}
        assert all(g.source for g in DEFAULT_PANEL)
        assert FixedBand().c == pytest.approx(math.log(2))


def test_refinement_of_a_bracket_narrower_than_a_normal_float():
    """A bracket [0, 4e-311] (|delta| = 0 everywhere: train and infer logprobs identical)
    cannot be cut into bins (its width divides to NaN): its values are listed instead (the
    matched band's search failed as 'cannot read the input' on such a run)."""
    src = pl.DataFrame({"x": [0.0] * 50}).lazy()
    got = _refine(src, lambda n, s: n >= 30, 0.0, 4.3458e-311, 0, 0.0, 50, bins=4, small=2)
    assert got == 0.0


def test_sequence_ratio_bounds_may_be_open():
    """seq-is and geo-rs take an upper bound of inf and a lower bound of 0 (no bound on that
    side), as the README says of every ratio bound: upper=inf alone leaves no bound at
    all (lower defaults to 1/upper = 0); the rules then keep by the other bound only."""
    import math

    import polars as pl

    from entr_diag.gates import parse_gate_spec

    df = pl.DataFrame({"seq_key": [1, 1, 2, 2, 3], "delta": [0.5, 0.4, -0.2, -0.3, 0.005]})
    cases = {"seq-is:upper=inf,lower=0.9": [True, True, False, False, True],
             "seq-is:upper=inf": [True] * 5,
             "seq-is:upper=3,lower=0": [True] * 5,
             "seq-is:upper=1.5,lower=0": [False, False, True, True, True],
             "geo-rs:low=0.9,high=inf": [True, True, False, False, True],
             "geo-rs:low=0,high=1.01": [False, False, True, True, True]}
    for spec, want in cases.items():
        g = parse_gate_spec(spec)
        assert df.select(g.keep_expr())[:, 0].to_list() == want, spec
    assert parse_gate_spec("seq-is:upper=inf").lower == 0
    assert math.isinf(parse_gate_spec("geo-rs:high=inf").high)
    for bad in ("seq-is:upper=0", "seq-is:upper=1,lower=2", "geo-rs:low=2,high=1",
                "geo-rs:low=inf,high=inf", "seq-is:upper=nan"):
        with pytest.raises(ParameterError):
            parse_gate_spec(bad)
