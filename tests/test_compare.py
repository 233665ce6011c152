"""Gate comparison (entr_diag.compare) and its terminal rendering."""

from __future__ import annotations

import io
import json
import math

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console

from entr_diag.compare import (
    CHI2_1_99,
    CompareResult,
    compare_gates,
    decision_column,
    decisions_frame,
)
from entr_diag.errors import InputError, ParameterError, SchemaError
from entr_diag.gates import (
    DEFAULT_PANEL,
    M2PO,
    TIS,
    EntrGate,
    FixedBand,
    GeoRS,
    IcePop,
    K3SeqRS,
    SeqIS,
    SeqTIS,
)
from entr_diag.report.terminal_compare import render_compare

# Same eight tokens as tests/test_gates.py, with keys, p, staleness and step.
TINY = pl.DataFrame(
    {
        "seq_id": ["A", "A", "A", "B", "B", "C", "D", "D"],
        "seq_key": pl.Series([1, 1, 1, 2, 2, 3, 4, 4], dtype=pl.UInt64),
        "position": [0, 1, 2, 0, 1, 0, 0, 1],
        "step": [0, 0, 0, 0, 0, 1, 1, 1],
        "delta": [0.1, -0.2, 0.05, 1.0, -0.5, -10.0, 5e-4, -5e-4],
        "entropy": [1.0, 0.01, 0.0, 0.5, 2.0, 0.1, 0.3, 0.3],
        "infer_logprob": [-0.5, -5.0, -0.01, -1.0, -2.0, -12.0, -0.3, -0.3],
        "staleness": [0, 0, 0, 1, 1, 2, 5, 5],
    }
).with_columns(train_logprob=pl.col("infer_logprob") + pl.col("delta"))

PANEL = (FixedBand(c=0.5), IcePop(), TIS(), SeqIS(), GeoRS(), K3SeqRS(), M2PO())


def run_tiny(**kw) -> CompareResult:
    args = dict(
        entr=EntrGate(tau=4, eps=0.01),
        panel=PANEL,
        h_star=0.2,
        law_k=0.1,
        law_alpha=1.0,
        flag_tau=1.0,
        flag_eps=0.01,
        sweep_tau=[1.0, 4.0],
        sweep_c=[0.5, 1.0],
    )
    args.update(kw)
    return compare_gates(TINY.lazy(), **args)


def by_name(res: CompareResult, spec: str):
    return next(g for g in res.gates if g.spec == spec)


def canonical(df: pl.DataFrame) -> pl.LazyFrame:
    """synth output -> canonical token frame (loss-masked rows, delta, seq_key, staleness)."""
    return (
        df.lazy()
        .filter(pl.col("loss_mask"))
        .with_columns(
            seq_id=pl.col("seq_id").cast(pl.String),
            delta=pl.col("train_logprob") - pl.col("infer_logprob"),
            staleness=pl.col("train_version") - pl.col("policy_version"),
        )
        .with_columns(seq_key=pl.struct("step", "seq_id").hash(7))
        .select(
            "seq_id",
            "seq_key",
            "position",
            "step",
            "train_logprob",
            "infer_logprob",
            "delta",
            "entropy",
            "staleness",
            "is_noise",
        )
    )


class TestHandCase:
    def test_counts(self):
        """Kept tokens/sequences per gate on the hand-made frame."""
        r = run_tiny()
        assert r.n_tokens == 8 and r.n_sequences == 4
        kept = {g.spec: g.kept_tokens for g in r.gates}
        assert kept == {
            "entr:tau=4,eps=0.01": 7,
            "fixed:c=0.5": 6,
            "icepop:low=0.5,high=5": 7,
            "tis:cap=2": 8,
            "seq-is:upper=2,lower=0.5": 7,
            "geo-rs:low=0.999,high=1.001": 2,
            "k3:threshold=0.01": 5,
            "m2po:max_mean_sq=0.04": 5,
        }
        f = by_name(r, "fixed:c=0.5")
        assert (f.kept_sequences, f.intact_sequences) == (3, 2)
        k3 = by_name(r, "k3:threshold=0.01")
        assert (k3.kept_sequences, k3.intact_sequences) == (2, 2)

    def test_agreement(self):
        """Fixed 0.5 vs ENTR: both keep 6, only ENTR keeps B0 (delta 1), both drop C."""
        a = by_name(run_tiny(), "fixed:c=0.5").agreement_vs_entr
        assert (a.both_keep, a.only_entr_keeps, a.only_other_keeps, a.both_drop) == (6, 1, 0, 1)
        # B0 has H = 0.5 and p = exp(-1) = 0.37
        r = run_tiny(entropy_edges=[0, 0.2, 1.5, 3])
        a = by_name(r, "fixed:c=0.5").agreement_vs_entr
        assert a.by_entropy["only_entr_keeps"] == [0, 1, 0]
        assert a.by_entropy["both_drop"] == [1, 0, 0]
        j = next(i for i, k in enumerate(a.by_p["keys"]) if k == "[0.25,0.5)")
        assert a.by_p["only_entr_keeps"][j] == 1 and sum(a.by_p["only_entr_keeps"]) == 1

    def test_noise_and_exploration(self):
        """Noise (H < 0.2, score > 1): A1, C0. Law-scale (H >= 0.2, d^2 <= 0.66 H): A0, B1, D."""
        r = run_tiny()
        assert r.n_noise == 2 and r.n_exploration == 4
        e = r.entr
        assert e.noise_admitted == 0.5 and e.exploration_discarded == 0.0
        geo = by_name(r, "geo-rs:low=0.999,high=1.001")
        assert geo.noise_admitted == 0.0 and geo.exploration_discarded == 0.5
        k3 = by_name(r, "k3:threshold=0.01")
        assert k3.noise_admitted == 0.5 and k3.exploration_discarded == 0.25

    def test_tis(self):
        """TIS: one truncated token (r = e > 2), mass removed (e - 2) / sum r."""
        t = by_name(run_tiny(), "tis:cap=2")
        assert t.kept_tokens == 8
        assert t.tis.truncated_tokens == 1
        rs = np.exp(TINY["delta"].to_numpy())
        assert t.tis.weight_mass_removed == pytest.approx((math.e - 2) / rs.sum())

    def test_tis_mass_with_a_ratio_beyond_a_float(self):
        """A placeholder's delta of +999 (exp overflows) leaves TIS's removed mass a number:
        the weights are summed scaled, in any batch order (here the huge one in the last
        batch and in the first), and equal the exact share where the float holds."""
        from entr_diag.compare import compare_plan
        from entr_diag.passes import run_pass

        def tis(df):
            plan = compare_plan(df.lazy(), entr=EntrGate(), panel=(TIS(),))
            run_pass(df.lazy(), plan.accumulators, chunk_size=3)
            run_pass(df.lazy(), plan.followup(), chunk_size=3)
            return by_name(plan.finish(), "tis:cap=2").tis

        big = TINY.with_columns(delta=pl.Series([0.1, -0.2, 0.05, 1.0, -0.5, -10.0, 5e-4, 999.0]))
        for df in (big, big.reverse()):
            t = tis(df)
            assert t.truncated_tokens == 2
            assert t.weight_mass_removed == pytest.approx(1.0)
        mid = TINY.with_columns(delta=pl.Series([0.1, -0.2, 0.05, 1.0, -0.5, -10.0, 650.0, 1.0]))
        for df in (mid, mid.reverse()):
            r = np.exp(df["delta"].to_numpy() - 650.0)
            want = np.maximum(r - 2 * math.exp(-650.0), 0).sum() / r.sum()
            assert tis(df).weight_mass_removed == pytest.approx(want, rel=1e-12)

    def test_matched_band_on_tied_values_says_both_budgets(self):
        """Quantised log-ratios (bf16) tie at c: the tightest band keeping as many tokens as
        ENTR keeps the whole tie group and drops fewer; the terminal note and the HTML say
        both counts (the HTML said 'drops as many tokens as ENTR')."""
        from entr_diag.report.html_report import _matched_budget

        df = pl.DataFrame({
            "seq_key": pl.Series(list(range(10)), dtype=pl.UInt64),
            "delta": [0.5] * 4 + [0.1] * 6,
            "entropy": [0.001, 0.001, 2.0, 2.0] + [1.0] * 6,
            "infer_logprob": [-1.0] * 10,
        }).with_columns(train_logprob=pl.col("infer_logprob") + pl.col("delta"))
        r = compare_gates(df.lazy(), entr=EntrGate(tau=4), panel=(FixedBand(),))
        assert (r.matched.entr_dropped, r.matched.fixed_dropped, r.matched.c) == (2, 0, 0.5)
        buf = io.StringIO()
        render_compare(r, Console(file=buf, width=200, color_system=None))
        flat = " ".join(buf.getvalue().split())
        assert "so the band drops 2 fewer" in flat
        assert _matched_budget(r.to_dict()) == (
            "drops 0 tokens against ENTR's 2: the tightest band keeping as many, tied |delta| "
            "values kept together")
        assert "drops as many" in _matched_budget(run_tiny().to_dict())

    def test_sequence_tis(self, tmp_path):
        """Sequence TIS keeps every token; its weights are the sequences' exp(sum delta)
        capped at 2 (A: e^-0.05, B: e^0.5, C: e^-10, D: 1; none above 2 at cap 2, B at cap
        1.5), as a straightforward computation gives them, in the result and the export."""
        sums = TINY.group_by("seq_key").agg(pl.col("delta").sum().alias("s"), pl.len().alias("n"))
        w, n = np.exp(sums["s"].to_numpy()), sums["n"].to_numpy()
        for cap in (2.0, 1.5, 0.5):
            g = SeqTIS(cap=cap)
            r = run_tiny(panel=(g,))
            t = by_name(r, g.spec())
            assert t.kept_tokens == 8 and t.kept_sequences == 4
            over = w > cap
            assert t.tis.truncated_sequences == int(over.sum())
            assert t.tis.truncated_tokens == int(n[over].sum())
            assert t.tis.weight_mass_removed == pytest.approx(
                (n * np.maximum(w - cap, 0)).sum() / (n * w).sum(), rel=1e-12)
            out = decisions_frame(TINY.lazy(), [g]).collect()
            want = TINY.join(sums, on="seq_key").select(
                pl.min_horizontal(pl.col("s").exp(), pl.lit(cap)))
            np.testing.assert_allclose(out[f"weight[{g.spec()}]"].to_numpy(),
                                       want.to_series().to_numpy(), rtol=1e-12)
            assert out[f"keep[{g.spec()}]"].all()

    def test_sequence_tis_long_sequences_do_not_overflow(self):
        """A sequence whose ratios multiply past a float (sum delta = 750) is truncated
        with the removed mass computed with scaled weights: not inf / inf."""
        df = TINY.with_columns(delta=pl.Series([250.0] * 3 + [-1.0] * 5))
        res = compare_gates(df.lazy(), entr=EntrGate(), panel=(SeqTIS(),))
        t = by_name(res, "seq-tis:cap=2").tis
        assert t.truncated_sequences == 1 and t.truncated_tokens == 3
        assert t.weight_mass_removed == pytest.approx(1.0)

    def test_matched(self):
        """ENTR drops 1 token; the 7th smallest |delta| is 1.0: the band drops only C."""
        m = run_tiny().matched
        assert m.c == 1.0 and m.entr_dropped == 1 and m.fixed_dropped == 1
        assert m.fixed.agreement_vs_entr.disagreements == 0

    def test_staleness_and_step(self):
        """Keep rates per staleness bucket and per step."""
        e = run_tiny().entr
        s = e.keep_by_staleness
        assert s.keys == ("0", "1", "2-3", "4-7", "8+")
        assert s.n == (3, 2, 1, 2, 0) and s.kept == (3, 2, 0, 2, 0)
        st_ = e.keep_by_step
        assert st_.keys == (0, 1) and st_.n == (5, 3) and st_.kept == (5, 2)

    def test_staleness_in_units_of_versions(self):
        """Versions counted in 1000s with staleness_unit 1000: the same buckets' counts, the
        labels in versions and the unit in the parameters; raw, every stale token is 8+."""
        tiny = TINY.with_columns(pl.col("staleness") * 1000).lazy()
        r = compare_gates(tiny, **{**dict(entr=EntrGate(tau=4, eps=0.01), panel=PANEL,
                                          h_star=0.2, law_k=0.1, flag_tau=1.0),
                                   "staleness_unit": 1000})
        s = r.entr.keep_by_staleness
        assert s.keys == ("0", "1000", "2000-3000", "4000-7000", "8000+")
        assert s.n == (3, 2, 1, 2, 0) and s.kept == (3, 2, 0, 2, 0)
        assert r.parameters["staleness_unit"] == 1000
        raw = compare_gates(tiny, entr=EntrGate(tau=4, eps=0.01), panel=PANEL, h_star=0.2,
                            law_k=0.1, flag_tau=1.0).entr.keep_by_staleness
        assert raw.keys[-1] == "8+" and raw.n[-1] == 5
        for bad in (0, -1, 2.5, True, "1000"):
            with pytest.raises(ParameterError, match="staleness_unit"):
                compare_gates(tiny, staleness_unit=bad)

    def test_sweeps(self):
        """Sweeps: ENTR keeps 5/8 at tau 1 and 7/8 at tau 4; the band 6/8 and 7/8."""
        r = run_tiny()
        assert r.sweep["tau"].keep_rate == (5 / 8, 7 / 8)
        assert r.sweep["tau"].noise_admitted == (0.0, 0.5)
        assert r.sweep["c"].keep_rate == (6 / 8, 7 / 8)
        assert r.sweep["c"].exploration_discarded == (0.0, 0.0)

    def test_null_reasons(self):
        """Without H* noise admitted is None with a reason; without k so is exploration."""
        r = run_tiny(h_star=None, law_k=None)
        assert r.entr.noise_admitted is None and r.entr.exploration_discarded is None
        assert set(r.null_reasons) == {"noise_admitted", "exploration_discarded"}
        assert math.isnan(r.sweep["tau"].noise_admitted[0])
        r = run_tiny(h_star=None)
        # every token is a candidate: A1 (d^2 .04 <= .0066?) no; A2 (H=0) no; C0 no
        assert r.n_exploration == 4

    def test_null_reasons_say_why_no_law_was_fitted(self):
        """``no_fit`` (why the fit failed) replaces "not given" in the null reasons and the
        definitions; given beside a law it is refused."""
        why = "all tokens fall into one sequence block"
        d = run_tiny(h_star=None, law_k=None, no_fit=why).to_dict()
        texts = [*d["null_reasons"].values(), d["definitions"]["noise_token"],
                 d["definitions"]["law_scale_token"]]
        assert len(texts) == 4
        for t in texts:
            assert f"no scaling law could be fitted ({why})" in t and "given" not in t, t
        for kw in (dict(h_star=0.2, law_k=None), dict(h_star=None, law_k=0.1)):
            with pytest.raises(ParameterError, match="no_fit"):
                run_tiny(no_fit=why, **kw)

    def test_specs_for_export(self):
        """The result carries its gate specs, so decisions_frame can export the same gates."""
        r = run_tiny()
        assert r.entr_spec == EntrGate(tau=4, eps=0.01)
        assert r.panel_specs == PANEL
        assert r.matched_spec == FixedBand(c=1.0)
        out = decisions_frame(TINY.lazy(), [r.entr_spec, *r.panel_specs]).collect()
        for g, spec in zip(r.gates, r.gate_specs, strict=True):
            assert out[decision_column(spec)].sum() == g.kept_tokens

    def test_bin_labels(self):
        """End bins are labelled open-ended when values beyond the edges fall in them."""
        r = run_tiny(entropy_edges=[0.05, 0.2, 1.5, 3])
        assert r.entr.keep_by_entropy.keys == ("<0.2", "[0.2,1.5)", ">=1.5")
        assert r.entr.keep_by_entropy.n == (3, 4, 1)

    def test_sweep_disabled(self):
        assert run_tiny(sweep_tau=[], sweep_c=[]).sweep == {}


class TestDecisionsFrame:
    def test_columns_and_values(self, tmp_path):
        """One Boolean per gate with the join keys; sinks to Parquet."""
        gates = [EntrGate(), FixedBand(c=0.5), SeqIS(), M2PO(), TIS()]
        lf = decisions_frame(TINY.lazy(), gates)
        out = lf.collect()
        assert out.columns[:4] == ["seq_id", "seq_key", "position", "step"]
        assert out[decision_column(FixedBand(c=0.5))].to_list() == [
            True,
            True,
            True,
            False,
            True,
            False,
            True,
            True,
        ]
        assert out["keep[m2po:max_mean_sq=0.04]"].to_list() == [
            True,
            True,
            True,
            False,
            False,
            False,
            True,
            True,
        ]
        assert out["keep[seq-is:upper=2,lower=0.5]"].to_list() == [
            True,
            True,
            True,
            True,
            True,
            False,
            True,
            True,
        ]
        assert out["weight[tis:cap=2]"][3] == 2.0
        lf.sink_parquet(tmp_path / "d.parquet")
        assert pl.read_parquet(tmp_path / "d.parquet").height == 8

    def test_missing_entropy(self):
        with pytest.raises(SchemaError, match="entropy"):
            decisions_frame(TINY.lazy().drop("entropy"), [EntrGate()])


class TestErrors:
    def test_empty(self):
        with pytest.raises(InputError, match="no valid"):
            compare_gates(TINY.lazy().filter(pl.lit(False)))

    def test_null_entropy(self):
        lf = TINY.lazy().with_columns(
            entropy=pl.when(pl.col("position") == 0).then(None).otherwise(pl.col("entropy"))
        )
        with pytest.raises(InputError, match="null/NaN entropy"):
            compare_gates(lf)

    def test_missing_column(self):
        with pytest.raises(SchemaError, match="infer_logprob"):
            compare_gates(TINY.lazy().drop("infer_logprob"))

    @pytest.mark.parametrize(
        "kw",
        [
            dict(entropy_edges=[1, 0]),
            dict(sweep_tau=[-1]),
            dict(h_star=-1.0),
            dict(law_k=0.0),
            dict(sweep_c=[math.nan]),
        ],
    )
    def test_bad_parameters(self, kw):
        with pytest.raises(ParameterError):
            run_tiny(**kw)


class TestWithoutEntropy:
    """A token frame without an entropy column: the gates that need none are compared,
    ENTR is listed as unavailable with the reason."""

    def test_panel_equals_the_panel_with_entropy(self):
        """Every panel gate keeps the same tokens and sequences (overall, per step, per
        staleness, TIS's truncation) as on the same frame with entropy; ENTR, the matched
        band, the agreement with ENTR, the tau sweep and the entropy bins are left out."""
        full = run_tiny(h_star=None, law_k=None)
        r = compare_gates(TINY.lazy().drop("entropy"), entr=EntrGate(tau=4, eps=0.01),
                          panel=PANEL, sweep_tau=[1.0, 4.0], sweep_c=[0.5, 1.0])
        assert [g.spec for g in r.gates] == [g.spec() for g in PANEL]
        for g, h in zip(r.gates, full.gates[1:], strict=True):
            assert (g.kept_tokens, g.kept_sequences, g.intact_sequences) == \
                (h.kept_tokens, h.kept_sequences, h.intact_sequences), g.spec
            assert g.keep_by_step == h.keep_by_step and g.keep_by_staleness == h.keep_by_staleness
            assert g.agreement_vs_entr is None and g.keep_by_entropy is None
        assert r.gates[2].tis.truncated_tokens == full.gates[3].tis.truncated_tokens
        assert r.entr is None and r.entr_spec is None and r.panel_specs == PANEL
        assert r.matched is None and r.matched_spec is None and list(r.sweep) == ["c"]
        assert r.sweep["c"].keep_rate == full.sweep["c"].keep_rate
        (u,) = r.unavailable
        assert u.spec == "entr:tau=4,eps=0.01" and "no entropy column" in u.reason
        d = json.loads(json.dumps(r.to_dict(), default=str))
        assert d["matched"] is None and d["unavailable"][0]["spec"] == u.spec
        assert "entropy column" in d["null_reasons"]["noise_admitted"]

    def test_export_marks_entr_with_nulls(self):
        """export_frame: ENTR's keep column is all null (no decision), the others as
        decisions_frame gives them."""
        from entr_diag.compare import export_frame

        lf = TINY.lazy().drop("entropy")
        r = compare_gates(lf, panel=PANEL)
        out = export_frame(lf, r).collect()
        col = decision_column(EntrGate())
        assert out.columns.index(col) == 4 and out[col].null_count() == out.height
        ref = decisions_frame(lf, list(PANEL)).collect()
        for g in PANEL:
            assert out[decision_column(g)].to_list() == ref[decision_column(g)].to_list()

    def test_render_says_unavailable(self):
        """The terminal table has ENTR's row marked unavailable, and the reason."""
        r = compare_gates(TINY.lazy().drop("entropy"), panel=PANEL)
        buf = io.StringIO()
        render_compare(r, Console(file=buf, width=200, color_system=None))
        text = buf.getvalue()
        assert "entr tau=4 eps=0.01 (unavailable)" in text and "ENTR unavailable" in text
        assert "needs the entropy H" in text and "Matched budget" not in text

    @pytest.mark.parametrize("kw", [dict(h_star=0.2), dict(law_k=0.1),
                                    dict(entropy_edges=[0, 1, 2]), dict(panel=())])
    def test_refusals(self, kw):
        """Entropy-based parameters without entropy, or nothing left to compare, are refused."""
        with pytest.raises(ParameterError):
            compare_gates(TINY.lazy().drop("entropy"), **{"panel": PANEL, **kw})

    def test_panel_gate_needing_entropy_is_a_schema_error(self):
        """An ENTR gate inside the panel is asked for explicitly: a missing entropy is an
        error there."""
        with pytest.raises(SchemaError, match="entropy"):
            compare_gates(TINY.lazy().drop("entropy"), panel=(FixedBand(), EntrGate(tau=2)))


def _frame(seed: int, n_seq: int) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    lens = rng.integers(1, 8, n_seq)
    n = int(lens.sum())
    key = np.repeat(np.arange(n_seq), lens)
    h = np.round(rng.exponential(0.5, n), 3)
    d = np.round(rng.normal(0, 0.3, n) * np.sqrt(h + 0.01), 3)
    return pl.DataFrame(
        {
            "seq_id": key.astype(str),
            "seq_key": pl.Series(key * 7919 + 3, dtype=pl.UInt64),
            "position": np.concatenate([np.arange(k) for k in lens]),
            "step": key % 3,
            "delta": d,
            "entropy": h,
            "infer_logprob": -np.round(rng.exponential(1.0, n), 3),
            "staleness": key % 5,
        }
    )


def _result(lf: pl.LazyFrame) -> dict:
    return compare_gates(
        lf,
        entr=EntrGate(tau=2.0),
        panel=DEFAULT_PANEL,
        h_star=0.05,
        law_k=0.09,
        entropy_edges=[0, 0.05, 0.2, 1, 10],
    ).to_dict()


def _assert_same(a, b, path="") -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            _assert_same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and not isinstance(b, int):
        assert (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-9), path
    else:
        assert a == b, path


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10_000), st.integers(2, 25), st.randoms(use_true_random=False))
def test_row_order_and_sharding_do_not_change_results(seed, n_seq, rnd):
    """Shuffling rows, or scanning the same tokens as several shards, gives the same result."""
    df = _frame(seed, n_seq)
    base = _result(df.lazy())
    perm = list(range(df.height))
    rnd.shuffle(perm)
    shuffled = df[perm]
    _assert_same(base, _result(shuffled.lazy()))
    cuts = sorted(rnd.sample(range(1, df.height), min(2, df.height - 1)))
    shards = [shuffled[a:b] for a, b in zip([0, *cuts], [*cuts, df.height], strict=True)]
    _assert_same(base, _result(pl.concat([s.lazy() for s in shards])))


@pytest.fixture(scope="module")
def planted():
    from entr_diag.synth import SynthSpec, generate

    spec = SynthSpec(
        n_tokens=60_000,
        seed=11,
        k=0.02,
        alpha=1.0,
        h_star=0.03,
        noise_share=0.3,
        noise_sigma=0.5,
    )
    lf = canonical(generate(spec))
    res = compare_gates(
        lf, entr=EntrGate(tau=4.0), h_star=spec.h_star, law_k=spec.k, law_alpha=spec.alpha
    )
    return spec, lf, res


class TestSynth:
    def test_entr_beats_matched_fixed_band(self, planted):
        """At an equal keep rate, ENTR admits less noise and discards less exploration."""
        _, _, r = planted
        m = r.matched
        assert abs(m.fixed_dropped - m.entr_dropped) <= 1
        assert r.n_noise > 1000 and r.n_exploration > 10_000
        assert r.entr.noise_admitted < m.fixed.noise_admitted
        assert r.entr.exploration_discarded < m.fixed.exploration_discarded
        assert m.fixed.noise_admitted > 0.05 and m.fixed.exploration_discarded > 0.005

    def test_ground_truth_at_matched_budget(self, planted):
        """Against the planted truth (is_noise), not the flag: at the matched budget ENTR
        keeps fewer planted noise tokens and drops fewer law tokens above H*."""
        spec, lf, r = planted
        e, f = r.entr_spec.keep_expr(), r.matched_spec.keep_expr()
        noise, law = pl.col("is_noise"), ~pl.col("is_noise") & (pl.col("entropy") >= spec.h_star)
        t = lf.select(
            e_noise=e.filter(noise).mean(),
            f_noise=f.filter(noise).mean(),
            e_law=(~e).filter(law).mean(),
            f_law=(~f).filter(law).mean(),
        ).collect()
        assert t["e_noise"][0] < t["f_noise"][0] - 0.05
        assert t["e_law"][0] < t["f_law"][0]

    def test_entr_beats_matched_band_at_other_tau(self, planted):
        """At tau = 8 (flag still at 4, so ENTR admits some flagged noise) ENTR still admits
        less noise and discards less exploration than the band matched to it."""
        spec, lf, _ = planted
        r = compare_gates(
            lf,
            entr=EntrGate(tau=8.0),
            panel=[],
            h_star=spec.h_star,
            law_k=spec.k,
            sweep_tau=[],
            sweep_c=[],
        )
        assert 0 < r.entr.noise_admitted < r.matched.fixed.noise_admitted
        assert r.entr.exploration_discarded < r.matched.fixed.exploration_discarded

    def test_noise_tokens_are_planted_noise(self, planted):
        """Flagged noise tokens are (almost all) planted noise: the definition is meaningful."""
        spec, lf, r = planted
        flagged = (
            lf.filter(
                (pl.col("entropy") < spec.h_star)
                & (pl.col("delta") ** 2 / (pl.col("entropy") + 0.01) > 4.0)
            )
            .select(pl.col("is_noise").mean(), pl.len())
            .collect()
        )
        assert flagged.item(0, 1) == r.n_noise
        assert flagged.item(0, 0) > 0.95

    def test_noise_count_matches_regime_flag(self, planted):
        """The noise tokens counted here are the tokens entr_diag.regime flags."""
        from entr_diag.regime import noise_flag_expr

        spec, lf, r = planted
        n = lf.select(noise_flag_expr(spec.h_star, 4.0, 0.01).sum()).collect().item()
        assert n == r.n_noise

    def test_sweep_matches_gate(self, planted):
        """The one-pass sweep at tau = 4 equals ENTR's own keep share."""
        _, _, r = planted
        j = r.sweep["tau"].values.index(4.0)
        assert r.sweep["tau"].keep_rate[j] == pytest.approx(r.entr.kept_share, abs=0)
        assert r.sweep["tau"].noise_admitted[j] == pytest.approx(r.entr.noise_admitted)

    def test_to_dict_is_plain_json(self, planted):
        """to_dict holds plain types only and the documented top-level keys."""
        d = planted[2].to_dict()
        assert {"parameters", "gates", "matched", "sweep", "definitions"} <= d.keys()
        text = json.dumps(d)  # raises on numpy types
        assert "noise_admitted" in text
        g = d["gates"][0]
        for key in (
            "name",
            "params",
            "source",
            "kept_tokens",
            "kept_share",
            "kept_sequences",
            "keep_by_entropy",
            "keep_by_staleness",
            "keep_by_step",
            "noise_admitted",
            "exploration_discarded",
            "agreement_vs_entr",
            "tis",
        ):
            assert key in g
        assert d["parameters"]["law_scale_factor"] == pytest.approx(CHI2_1_99)
        assert set(d["sweep"]) == {"tau", "c"}

    def test_render(self, planted):
        """The terminal report shows each section and the matched comparison numbers."""
        r = planted[2]
        buf = io.StringIO()
        render_compare(r, Console(file=buf, width=120, color_system=None))
        out = buf.getvalue()
        for s in (
            "Gates on",
            "Agreement with ENTR",
            "Matched budget",
            "Keep rate by entropy",
            "Sweep of tau",
            "Sweep of c",
            "How to read this",
            "(matched)",
            "noise admitted",
            "exploration discarded",
        ):
            assert s in out, s
        assert f"{100 * r.matched.fixed.noise_admitted:.1f}%" in out
        # ENTR at the flag's tau admits no noise token by definition: marked, and said
        flat = " ".join(out.split())
        assert "0.0% (def.)" in out and "ENTR keeps none of them by definition (def.)" in flat
        assert out.count("(def.)") == 3  # gate table, matched table, note
        assert "seqs kept: for a token gate, the sequences with at least one token kept" in flat
        assert "at least one token kept" in r.to_dict()["definitions"]["kept_sequence_share"]
        assert max(len(line) for line in out.splitlines()) <= 120
        narrow = io.StringIO()
        render_compare(r, Console(file=narrow, width=80, color_system=None))
        lines = narrow.getvalue().splitlines()
        assert max(len(line) for line in lines) <= 80
        assert "…" not in narrow.getvalue()  # numbers are never truncated
        assert f"{r.entr.kept_tokens:,}" in narrow.getvalue()
        # every keep-rate column is shown at 80 columns: the tables split, never cropped
        # (rich crops a table of unwrappable number columns on the right, silently)
        text = narrow.getvalue()
        part = text[text.index("Keep rate by entropy bin"):text.index("Keep rate by staleness")]
        heads = " ".join(part.split())
        for g in r.to_dict()["gates"]:
            if not g.get("tis"):
                assert f" {g['name']} " in heads or g["label"] in heads, g["name"]
        assert "matched" in heads and "(2 of " in part
        # no table is cropped at the right edge (every row ends with its border), and no
        # gate label wraps inside a number ('threshold=0' / '.01')
        rows = [ln.rstrip() for ln in lines if ln.startswith(("┏", "┃", "┡", "│", "└"))]
        assert rows and all(ln.endswith(("┓", "┃", "┩", "│", "┘")) for ln in rows)
        gate_tables = text[:text.index("tis cap=2: keeps every token")]
        assert "max_mean_sq=0.04" in gate_tables and "threshold=0.01" in gate_tables

        # also renders from the plain dict (e.g. JSON read back)
        buf2 = io.StringIO()
        render_compare(
            json.loads(json.dumps(r.to_dict())), Console(file=buf2, width=120, color_system=None)
        )
        assert buf2.getvalue() == out

    def test_keep_rate_columns_of_two_gates_of_one_name_say_which(self, planted):
        """--gate areal --gate areal:cap=2: the keep-rate tables head them by their labels
        (the names alone read 'areal | areal')."""
        from entr_diag.gates import AReaLCap

        lf = planted[1]
        r = compare_gates(lf, entr=EntrGate(), panel=(AReaLCap(), AReaLCap(cap=2, floor=0.5)),
                          h_star=0.03, law_k=0.02)
        buf = io.StringIO()
        render_compare(r, Console(file=buf, width=200, color_system=None))
        part = buf.getvalue()
        part = part[part.index("Keep rate by entropy bin"):]
        flat = " ".join(part.split())
        assert "areal cap=5 floor=0" in flat and "areal cap=2 floor=0.5" in flat


# ----------------------------------------------------------------------- the pass plan


def _reference(df: pl.DataFrame, res: CompareResult) -> None:
    """Check every gate of ``res`` against per-token decisions computed in memory with the
    gates' own window expressions (sequence gates ``.over``, M2PO's rank rule)."""
    from entr_diag.compare import _bin_index

    gates = [*res.gate_specs, res.matched_spec]
    results = [*res.gates, res.matched.fixed]
    edges = list(res.entropy_edges)
    eb = df.select(_bin_index(pl.col("entropy"), edges).alias("eb"))["eb"].to_numpy()
    k0 = df.select(res.entr_spec.keep_expr().alias("k"))["k"].to_numpy()
    for g, r in zip(gates, results, strict=True):
        k = df.select(g.keep_expr().fill_null(False).alias("k"))["k"].to_numpy()
        assert r.kept_tokens == int(k.sum()), g.spec()
        assert list(r.keep_by_entropy.kept) == np.bincount(eb, k, len(edges) - 1).tolist()
        per_seq = pl.DataFrame({"s": df["seq_key"], "k": k}).group_by("s").agg(
            pl.col("k").any().alias("a"), pl.col("k").all().alias("l")
        )
        assert r.kept_sequences == per_seq["a"].sum(), g.spec()
        assert r.intact_sequences == per_seq["l"].sum(), g.spec()
        steps = pl.DataFrame({"t": df["step"], "k": k}).group_by("t").agg(pl.col("k").sum())
        assert dict(zip(r.keep_by_step.keys, r.keep_by_step.kept, strict=True)) == dict(
            steps.iter_rows()
        )
        if r.agreement_vs_entr is not None:
            assert r.agreement_vs_entr.both_keep == int((k & k0).sum()), g.spec()


class TestPlan:
    def test_batch_size_does_not_change_results(self):
        """run_pass with 7-row batches (sequences split across batches) equals one batch."""
        from entr_diag.compare import compare_plan
        from entr_diag.passes import run_pass

        df = _frame(3, 40)
        kw = dict(entr=EntrGate(tau=2.0), panel=(*DEFAULT_PANEL, M2PO(max_mean_sq=0.01)),
                  h_star=0.05, law_k=0.09)
        out = []
        for chunk in (7, 1_000_000):
            plan = compare_plan(df.lazy(), **kw)
            run_pass(df.lazy(), plan.accumulators, chunk_size=chunk)
            run_pass(df.lazy(), plan.followup(), chunk_size=chunk)
            out.append(plan.finish().to_dict())
        _assert_same(out[0], out[1])
        _assert_same(out[1], compare_gates(df.lazy(), **kw).to_dict())

    def test_batch_size_and_order_with_missing_values(self):
        """Shuffled rows with NaN / null deltas, a null seq_key and null steps (the batches
        that skip the run reduction) give the same result whatever the batch size."""
        from entr_diag.compare import compare_plan
        from entr_diag.passes import run_pass

        df = _frame(5, 40).sample(fraction=1.0, shuffle=True, seed=3)
        i = pl.int_range(pl.len())
        df = df.with_columns(
            delta=pl.when(i % 17 == 3).then(float("nan"))
            .when(i % 23 == 5).then(None).otherwise(pl.col("delta")),
            seq_key=pl.when(i == 11).then(None).otherwise(pl.col("seq_key")),
            step=pl.when(i % 29 == 7).then(None).otherwise(pl.col("step")),
        )
        kw = dict(entr=EntrGate(tau=2.0), panel=(*DEFAULT_PANEL, M2PO(max_mean_sq=0.01)),
                  h_star=0.05, law_k=0.09)
        out = []
        for chunk in (7, 64, 1_000_000):
            plan = compare_plan(df.lazy(), **kw)
            run_pass(df.lazy(), plan.accumulators, chunk_size=chunk)
            run_pass(df.lazy(), plan.followup(), chunk_size=chunk)
            out.append(plan.finish().to_dict())
        _assert_same(out[0], out[1])
        _assert_same(out[0], out[2])

    def test_finish_runs_the_second_pass_once(self, monkeypatch):
        """finish() runs the second pass itself, unless the caller fed followup()."""
        import entr_diag.compare as C
        from entr_diag.passes import run_pass

        calls = []
        monkeypatch.setattr(C, "run_pass", lambda lf, accs, **kw: calls.append(1) or
                            run_pass(lf, accs, **kw))
        plan = C.compare_plan(TINY.lazy(), panel=PANEL)
        run_pass(TINY.lazy(), plan.accumulators)
        run_pass(TINY.lazy(), plan.followup())
        plan.finish()
        assert calls == []
        plan = C.compare_plan(TINY.lazy(), panel=PANEL)
        run_pass(TINY.lazy(), plan.accumulators)
        plan.finish()
        assert calls == [1]

    @pytest.mark.parametrize("seed", [0, 1, 2])
    @pytest.mark.parametrize("mode", ["default", "coarse", "refine"])
    def test_matches_per_token_decisions(self, seed, mode, monkeypatch):
        """Every gate, the matched band and M2PO included, agrees with per-token decisions,
        whether the thresholds are resolved from the listed bin (fine or coarse histogram,
        many ties) or by refinement scans (crowded bin)."""
        import entr_diag.compare as C

        if mode == "coarse":  # exponent-only bins: one bin holds many distinct values
            monkeypatch.setattr(C, "_HIST_SHIFT", 52)
            monkeypatch.setattr(C, "_HIST_SIZE", 1 << 11)
        if mode == "refine":
            monkeypatch.setattr(C, "_BOUNDARY_ROWS", 0)
        df = _frame(seed, 60)
        for tau, m2 in ((2.0, 0.01), (0.3, 0.002), (50.0, 1.0)):
            res = compare_gates(
                df.lazy(),
                entr=EntrGate(tau=tau),
                panel=(*DEFAULT_PANEL, M2PO(max_mean_sq=m2)),
                h_star=0.05,
                law_k=0.09,
            )
            _reference(df, res)

    def test_matched_keeps_none(self):
        """ENTR keeping nothing gives a band below the smallest |delta| (clamped at 0)."""
        df = TINY.with_columns(delta=pl.col("delta") + 3.0)
        res = compare_gates(df.lazy(), entr=EntrGate(tau=1e-6), panel=PANEL, sweep_tau=[],
                            sweep_c=[])
        assert res.entr.kept_tokens == 0 and res.matched.fixed.kept_tokens == 0
        assert res.matched.c == np.nextafter(np.abs(df["delta"]).min(), -np.inf)
        _reference(df, res)


_EDGE_FLOATS = st.one_of(
    st.floats(-2, 40, allow_nan=False),
    st.sampled_from([0.0, -0.0, 1e-300, 5e-324, 0.5, 1.0, 2.0, math.log(2.0)]),
)


@settings(max_examples=80, deadline=None)
@given(
    st.lists(_EDGE_FLOATS, min_size=0, max_size=12, unique=True),
    st.lists(st.one_of(_EDGE_FLOATS, st.sampled_from([math.nan, math.inf, -math.inf])),
             min_size=1, max_size=60),
    st.booleans(),
    st.sampled_from(["left", "right"]),
)
def test_searcher_equals_search_sorted(values, xs, with_null, side):
    """The lookup-table search gives the polars search's bin for every float, edge values,
    signed zeros, infinities, NaN and null included."""
    from entr_diag.compare import _search, _Searcher

    v = sorted(set(values))
    xs = xs + v + [np.nextafter(a, math.inf) for a in v] + [np.nextafter(a, -math.inf) for a in v]
    s = pl.Series("x", xs, dtype=pl.Float64)
    if with_null:
        s = pl.concat([s, pl.Series("x", [None], dtype=pl.Float64)])
    want = pl.DataFrame(s).with_columns(r=_search(v, pl.col("x"), side))["r"].to_list()
    assert _Searcher(v, side).series(s).tolist() == want


@pytest.mark.parametrize("n_fixed", [53, 58])
def test_many_gates(n_fixed):
    """Panels of more keep bits than one 63-bit word holds (53: only TIS's truncation bits
    spill into the second word; 58: gates too) give every gate's per-token counts."""
    from entr_diag.gates import CatastrophicVeto

    df = _frame(7, 30)
    panel = (
        *[FixedBand(c=0.005 * k) for k in range(n_fixed)],
        SeqIS(), GeoRS(low=0.9, high=1.1), K3SeqRS(), CatastrophicVeto(min_ratio=0.8),
        TIS(cap=1.05), TIS(cap=1.2), M2PO(max_mean_sq=0.005),
    )
    res = compare_gates(df.lazy(), entr=EntrGate(tau=1.0), panel=panel, h_star=0.05,
                        law_k=0.09)
    _reference(df, res)
    d = np.exp(df["delta"].to_numpy())
    assert by_name(res, "tis:cap=1.2").tis.truncated_tokens == int((d > 1.2).sum())
    assert by_name(res, "tis:cap=1.05").tis.truncated_tokens == int((d > 1.05).sum())


def test_chi2_constant_is_scipys_quantile():
    """CHI2_1_99 is written out (importing scipy.stats at import time costs 0.6 s): it must
    be exactly scipy's 99% quantile of chi-square(1)."""
    from scipy import stats

    assert CHI2_1_99 == float(stats.chi2.ppf(0.99, 1))


def test_first_pass_before_the_law_equals_the_law_given_up_front():
    """The CLI runs the first pass with the fit (no law yet) and sets the fitted law after:
    the result equals compare_gates with the law given up front, for the sweeps and the
    categories too (they are counted in the second pass)."""
    from entr_diag.compare import compare_plan
    from entr_diag.passes import run_pass

    df = _frame(7, 40)
    law = {"h_star": 0.5, "law_k": 0.02, "law_alpha": 1.0, "flag_tau": 0.2,
           "entropy_edges": [0, 0.05, 0.2, 1, 10]}
    gates = {"entr": EntrGate(tau=2.0), "panel": DEFAULT_PANEL}
    plan = compare_plan(df.lazy(), **gates)
    run_pass(df.lazy(), plan.accumulators)
    plan.set_law(**law)
    late = plan.finish().to_dict()
    _assert_same(compare_gates(df.lazy(), **gates, **law).to_dict(), late)
    assert late["n_noise"] > 0 and late["n_exploration"] > 0
    tau = late["sweep"]["tau"]
    assert any(0 < v < 1 for v in tau["noise_admitted"] + tau["exploration_discarded"])
    # a different law after the same first pass changes the categories and the sweeps
    plan2 = compare_plan(df.lazy(), **gates)
    run_pass(df.lazy(), plan2.accumulators)
    plan2.set_law(**{**law, "h_star": 0.05})
    other = plan2.finish().to_dict()
    assert other["n_noise"] != late["n_noise"]
    assert other["sweep"]["tau"]["noise_admitted"] != tau["noise_admitted"]


def test_set_law_checks_and_refuses_after_the_second_pass():
    from entr_diag.compare import compare_plan
    from entr_diag.passes import run_pass

    plan = compare_plan(TINY.lazy(), panel=PANEL)
    with pytest.raises(ParameterError, match="law_k must be positive"):
        plan.set_law(law_k=-1.0)
    with pytest.raises(TypeError, match="h_star"):
        plan.set_law(h_star="0.2")
    with pytest.raises(ParameterError, match="no_fit"):
        plan.set_law(law_k=0.1, no_fit="too few tokens")
    run_pass(TINY.lazy(), plan.accumulators)
    plan.finish()
    with pytest.raises(ParameterError, match="after the second pass"):
        plan.set_law(h_star=0.2)
    no_h = compare_plan(TINY.drop("entropy").lazy(), panel=(FixedBand(c=0.5),))
    with pytest.raises(ParameterError, match="h_star given, but the token frame has no entropy"):
        no_h.set_law(h_star=0.2)


def test_noise_by_definition_needs_the_flag_gate_and_noise_tokens():
    """Only the ENTR gate at the flag's tau and eps, with noise tokens to admit, is marked."""
    from entr_diag.compare import noise_by_definition

    params = {"flag_tau": 4.0, "flag_eps": 0.01}
    entr = {"name": "entr", "params": {"tau": 4.0, "eps": 0.01}, "noise_admitted": 0.0}
    assert noise_by_definition(entr, params)
    assert not noise_by_definition({**entr, "noise_admitted": None}, params)  # no H*: n/a
    assert not noise_by_definition({**entr, "params": {"tau": 8.0, "eps": 0.01}}, params)
    assert not noise_by_definition({**entr, "name": "fixed"}, params)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 20), st.integers(1, 13), st.integers(0, 5), st.integers(1, 3000),
       st.integers(0, 2**32 - 1))
def test_distinct_counts_equal_the_sorted_counts(nb, extra, steps, n, seed):
    """The gate pass's linear-time count of (step, cell, pattern) keys gives the distinct keys
    in ascending order and their counts, as sorting them does, whether the ranges fit its
    table or it falls back to the sort."""
    from entr_diag.compare import _distinct_counts, _sorted_counts

    rng = np.random.default_rng(seed)
    kb = nb + extra
    top = rng.integers(0, steps + 1, n) + int(rng.integers(0, 1000))
    mid = rng.integers(0, 1 << extra, n)
    pat = rng.choice(rng.integers(0, 1 << nb, int(rng.integers(1, 80))), n)
    key = (top << kb) | (mid << nb) | pat
    u, c = _distinct_counts(key.copy(), nb, kb)
    u2, c2 = _sorted_counts(np.sort(key))
    np.testing.assert_array_equal(u, u2)
    np.testing.assert_array_equal(c, c2)


def test_unscored_tokens_enter_the_sequence_gates_only():
    """``unscored`` rows (tokens left out for their entropy, log-ratio valid) are merged into
    the sequence gates' statistics of the sequences holding analysed tokens: the result
    equals the gates' rules over analysed + unscored rows together (polars group-by), the
    export's decisions agree, the token gates and every kept count are unchanged, sequence
    TIS's truncated tokens count analysed tokens only, and rows of a sequence without
    analysed tokens are ignored."""
    from entr_diag.gates import CatastrophicVeto

    df = _frame(3, 400)
    rng = np.random.default_rng(5)
    keys = df["seq_key"].unique().sort()
    side = pl.DataFrame({
        "seq_key": pl.concat([keys.sample(60, seed=1), pl.Series([999_999], dtype=pl.UInt64)]),
        "delta": np.append(rng.choice([-12.0, -1.0, 0.8, 0.0005], 60), -20.0),
    })
    panel = [SeqIS(), SeqTIS(cap=1.5), GeoRS(low=0.9, high=1.1), K3SeqRS(), CatastrophicVeto(),
             IcePop()]
    kw = dict(entr=EntrGate(tau=2.0), panel=panel, h_star=0.05, law_k=0.09,
              entropy_edges=[0, 0.05, 0.2, 1, 10])
    base = compare_gates(df.lazy(), **kw)
    res = compare_gates(df.lazy(), unscored=side.lazy(), **kw)
    assert res.parameters["unscored_tokens_in_sequence_gates"] == 60
    assert base.parameters["unscored_tokens_in_sequence_gates"] is None
    assert res.n_tokens == base.n_tokens == df.height
    both = pl.concat([df.select("seq_key", "delta"), side]).join(
        df.select("seq_key").unique(), on="seq_key", how="semi")
    per = both.group_by("seq_key").agg(
        s=pl.col("delta").sum(), m=pl.col("delta").mean(), mn=pl.col("delta").min(),
        k3=(pl.col("delta").exp() - 1 - pl.col("delta")).mean())
    n_tok = df.group_by("seq_key").len()
    per = per.join(n_tok, on="seq_key")
    want = {"seq-is": pl.col("s").is_between(math.log(0.5), math.log(2.0)),
            "geo-rs": pl.col("m").is_between(math.log(0.9), math.log(1.1)),
            "k3": pl.col("k3") <= 0.01, "veto": pl.col("mn") >= math.log(1e-4)}
    got = {g.name: g for g in res.gates}
    for name, rule in want.items():
        kept = per.filter(rule)
        assert got[name].kept_sequences == kept.height, name
        assert got[name].kept_tokens == int(kept["len"].sum()), name
    assert got["veto"].kept_sequences < {g.name: g for g in base.gates}["veto"].kept_sequences
    assert got["icepop"] == {g.name: g for g in base.gates}["icepop"]
    tis = got["seq-tis"].tis
    trunc = per.filter(pl.col("s") > math.log(1.5))
    assert tis.truncated_sequences == trunc.height
    assert tis.truncated_tokens == int(trunc["len"].sum())
    dec = decisions_frame(df.lazy(), panel, unscored=side.lazy()).collect()
    for g in res.gates[1:]:
        assert int(dec[decision_column(g_spec := next(
            p for p in panel if p.spec() == g.spec))].sum()) == g.kept_tokens, g_spec
    with pytest.raises(TypeError, match="expected unscored as a polars LazyFrame"):
        compare_gates(df.lazy(), unscored={"seq_key": [1]}, **kw)
