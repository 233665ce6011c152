"""Mismatch forensics: each known cause is detected on an input made to show it, and every
check stays silent (nothing above info) on clean synthetic runs."""

from __future__ import annotations

import dataclasses
import io
import json
import math
import re
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from rich.console import Console

from entr_diag import forensics as FX
from entr_diag.errors import ParameterError
from entr_diag.forensics import (
    CHECKS,
    CheckStatus,
    Finding,
    Findings,
    detect_misalignment,
    run_forensics,
)
from entr_diag.io import load_dataset
from entr_diag.report.terminal_findings import render_findings
from entr_diag.synth import SynthSpec, generate

N_TOKENS = 40_000
IL, TL, H = pl.col("infer_logprob"), pl.col("train_logprob"), pl.col("entropy")
DELTA = TL - IL


def _load(tmp_path: Path, df: pl.DataFrame, name: str = "run.parquet"):
    p = tmp_path / name
    df.write_parquet(p)
    return load_dataset([p])


def _with_delta(df: pl.DataFrame, new_delta: pl.Expr) -> pl.DataFrame:
    """Set train_logprob = infer_logprob + new_delta, flipping the sign where it would be > 0."""
    return df.with_columns(
        pl.when(IL + new_delta > 0).then(IL - new_delta.abs()).otherwise(IL + new_delta)
        .alias("train_logprob")
    )


@pytest.fixture(scope="module")
def base() -> pl.DataFrame:
    return generate(SynthSpec(n_tokens=N_TOKENS, seed=11))


# ------------------------------------------------------------------ clean runs


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_clean_synth_is_silent(tmp_path, seed):
    """A clean synthetic run (several seeds, with and without dirty rows) has no finding above info."""
    spec = SynthSpec(n_tokens=N_TOKENS, seed=seed, dirty=seed % 2 == 1,
                     mean_seq_len=40 if seed >= 2 else 200)
    res = run_forensics(_load(tmp_path, generate(spec)))
    assert res.silent, [f.title for f in res.findings]
    assert [c.name for c in res.checks] == list(CHECKS)
    st = {c.name: c.status for c in res.checks}
    for name in ("misalignment", "one_sided_temperature", "truncated_sampling", "drift",
                 "staleness", "corrupt_rows", "implausible_logprobs"):
        assert st[name] == "clear", (name, res.status(name))
    assert st["trainer_noise_floor"] == "cannot_tell"
    assert detect_misalignment(_load(tmp_path, generate(spec), "again.parquet")) is None


def test_to_dict_is_json_ready(tmp_path, base):
    """to_dict() holds findings and one status+reason per check, and serialises to JSON."""
    res = run_forensics(_load(tmp_path, base))
    d = res.to_dict()
    assert set(d) == {"findings", "checks"}
    assert set(d["checks"]) == set(CHECKS)
    for v in d["checks"].values():
        assert v["status"] in ("found", "clear", "cannot_tell") and v["reason"]
    json.dumps(d)


def test_unknown_check_raises(tmp_path, base):
    """An unknown check name is a ParameterError naming the known checks."""
    with pytest.raises(ParameterError, match="known: misalignment"):
        run_forensics(_load(tmp_path, base), checks=["nope"])


def test_a_check_that_fails_numerically_cannot_tell(tmp_path, base, monkeypatch):
    """A check whose fit breaks on extreme values (e.g. an SVD that does not converge)
    reports cannot_tell with the reason; the other checks still run."""
    def broken(ctx):
        raise np.linalg.LinAlgError("SVD did not converge")

    monkeypatch.setitem(FX._CHECK_FUNCS, "truncated_sampling", broken)
    res = run_forensics(_load(tmp_path, base))
    st = {c.name: c for c in res.checks}
    assert st["truncated_sampling"].status == "cannot_tell"
    assert "SVD did not converge" in st["truncated_sampling"].reason
    assert st["drift"].status == "clear" and len(res.checks) == len(CHECKS)


def test_checks_subset_runs_only_those(tmp_path, base):
    """checks= runs the named checks only, in the given order."""
    res = run_forensics(_load(tmp_path, base), checks=["staleness", "drift"])
    assert [c.name for c in res.checks] == ["staleness", "drift"]


# ------------------------------------------------------------------ off-by-one


@pytest.mark.parametrize("shift", [-1, 1])
def test_misalignment_detected_with_likely_shift(tmp_path, base, shift):
    """infer_logprob shifted by one token inside each sequence is critical, naming the lag."""
    # shift=-1: infer_new[t] = infer[t+1], so train[t] matches infer_new[t-1]: lag -1;
    # shift=+1: infer_new[t] = infer[t-1], so train[t] matches infer_new[t+1]: lag +1
    df = base.with_columns(IL.shift(shift).over("seq_id", order_by="position"))
    ds = _load(tmp_path, df)
    f = detect_misalignment(ds)
    assert f is not None and f.kind == "misalignment" and f.severity == "critical"
    ev = f.evidence
    assert ev["likely_shift"] == shift
    lag = "mean_abs_diff_lag_plus1" if ev["likely_shift"] == 1 else "mean_abs_diff_lag_minus1"
    assert ev[lag] < 0.2 * ev["mean_abs_diff_lag0"]
    res = run_forensics(ds)
    assert res.findings[0].kind == "misalignment"
    # the slope of uncorrelated columns is no temperature finding
    assert res.status("one_sided_temperature").status == "cannot_tell"


@pytest.mark.parametrize("every", [7, 50])
def test_periodic_placeholders_are_no_shift(tmp_path, base, every):
    """A placeholder (-300) on one side at every k-th row: implausible logprobs, not a
    shift (the lag that misses them at the start of short sequences looked better)."""
    df = base.with_columns(pl.when(pl.int_range(pl.len()) % every == 0).then(-300.0)
                           .otherwise(IL).alias("infer_logprob"))
    ds = _load(tmp_path, df)
    assert detect_misalignment(ds) is None
    res = run_forensics(ds)
    assert res.status("misalignment").status == "clear"
    assert any(f.kind == "implausible_logprobs" for f in res.findings)
    # a real shift among such placeholders is still found
    shifted = df.with_columns(IL.shift(1).over("seq_id", order_by="position"))
    f = detect_misalignment(_load(tmp_path, shifted, name="shifted.parquet"))
    assert f is not None and f.evidence["likely_shift"] == 1


@pytest.mark.parametrize("shift", [-2, 2, 3])
def test_shift_by_more_than_one_token_is_detected(tmp_path, base, shift):
    """A shift by 2 or 3 tokens (a doubled offset) is critical too, naming the lag; lag +-1
    alone does not fit such data, so a check trying only +-1 called it clear."""
    df = base.with_columns(IL.shift(shift).over("seq_id", order_by="position"))
    f = detect_misalignment(_load(tmp_path, df))
    assert f is not None and f.severity == "critical" and "partial" not in f.evidence
    assert f.evidence["likely_shift"] == shift
    assert f.evidence[f"ratio_lag_{'minus' if shift < 0 else 'plus'}{abs(shift)}"] < 0.2


@pytest.mark.parametrize("shift", [-1, 2])
def test_shift_in_some_steps_only_is_detected_and_names_the_steps(tmp_path, base, shift):
    """Sequences shifted in two steps of ten (about 20% of the tokens): the pooled lag 0 still
    fits best, yet the sequences that fit the lag on their own are found, with their steps."""
    steps = sorted(base["step"].unique().to_list())[-2:]
    moved = IL.shift(shift).over("seq_id", order_by="position")
    df = base.with_columns(pl.when(pl.col("step").is_in(steps)).then(moved).otherwise(IL)
                           .alias("infer_logprob"))
    f = detect_misalignment(_load(tmp_path, df))
    assert f is not None and f.severity == "critical"
    ev = f.evidence
    assert ev["partial"] is True and ev["likely_shift"] == shift
    assert 0.1 < ev["shifted_share"] < 0.35
    assert set(ev["shifted_steps"]) == {str(s) for s in steps}
    assert f"in {ev['shifted_share']:.1%} of sequences" in f.title


@pytest.mark.parametrize("order", ["shuffled", "descending", "within_sequence"])
def test_shift_in_some_steps_is_found_whatever_the_row_order(tmp_path, base, order):
    """The same partial shift with rows out of position order (the whole file shuffled,
    each sequence written backwards, or shuffled within its sequence): the pass pairs few
    consecutive rows, so the sorted sample decides the lags +-1, and finds it."""
    steps = sorted(base["step"].unique().to_list())[-2:]
    moved = IL.shift(-1).over("seq_id", order_by="position")
    df = base.with_columns(pl.when(pl.col("step").is_in(steps)).then(moved).otherwise(IL)
                           .alias("infer_logprob"))
    rng = np.random.default_rng(4)
    if order == "shuffled":
        df = df.sample(fraction=1.0, shuffle=True, seed=4)
    elif order == "descending":
        df = df.sort(["seq_id", "position"], descending=[False, True])
    else:
        df = df.with_columns(pl.Series("_r", rng.random(df.height))).sort("seq_id", "_r").drop("_r")
    f = detect_misalignment(_load(tmp_path, df))
    assert f is not None and f.severity == "critical"
    ev = f.evidence
    assert ev["partial"] is True and ev["likely_shift"] == -1
    assert 0.1 < ev["shifted_share"] < 0.35 and ev["pass_pair_share"] < FX.MISALIGN_PASS_PAIRED
    assert set(ev["shifted_steps"]) == {str(s) for s in steps}
    ordered = detect_misalignment(_load(tmp_path, df.sort("seq_id", "position"), "o.parquet"))
    assert "pass_pair_share" not in ordered.evidence
    assert ordered.evidence["shifted_sequences"] == ev["shifted_sequences"]

def test_shift_in_under_one_percent_of_sequences_is_detected(tmp_path):
    """A handful of shifted sequences (0.8% here; 0.5% already flips the fitted law) fit
    their lag so much better than lag 0 that they are called without the 1% share."""
    df = generate(SynthSpec(n_tokens=200_000, seed=5))
    ids = df["seq_id"].unique().sort()
    bad = ids.gather(np.random.default_rng(0).choice(ids.len(), 8, replace=False))
    moved = IL.shift(-1).over("seq_id", order_by="position")
    df = df.with_columns(pl.when(pl.col("seq_id").is_in(bad.implode()))
                         .then(pl.coalesce(moved, IL)).otherwise(IL).alias("infer_logprob"))
    f = detect_misalignment(_load(tmp_path, df))
    assert f is not None and f.severity == "critical" and f.evidence["partial"] is True
    assert f.evidence["shifted_share"] < 0.01 and f.evidence["shifted_sequences"] >= 5
    assert f.evidence["ratio_in_shifted_sequences"] < FX.MISALIGN_PARTIAL_STRONG


def test_a_few_shifted_sequences_are_found_outside_the_sample(tmp_path, monkeypatch):
    """Lags +-1 are tested on every sequence in the pass, not only on the hash-sampled
    ones: with a sample of ~10% of the sequences, 6 shifted sequences of ~1000 are found."""
    monkeypatch.setattr(FX, "MISALIGN_MAX_TOKENS", 20_000)
    df = generate(SynthSpec(n_tokens=200_000, seed=6))
    ids = df["seq_id"].unique().sort()
    bad = ids.gather(np.random.default_rng(1).choice(ids.len(), 6, replace=False))
    moved = IL.shift(1).over("seq_id", order_by="position")
    df = df.with_columns(pl.when(pl.col("seq_id").is_in(bad.implode()))
                         .then(pl.coalesce(moved, IL)).otherwise(IL).alias("infer_logprob"))
    f = detect_misalignment(_load(tmp_path, df))
    assert f is not None and f.evidence["partial"] is True and f.evidence["likely_shift"] == 1
    assert f.evidence["sampled_share"] < 0.2
    assert f.evidence["sequences_tested"] > 0.9 * ids.len()
    assert f.evidence["shifted_sequences"] >= 5
    # named by their seq_ids (the best-fitting first), in the message too
    named = f.evidence["example_seq_ids"]
    assert len(named) >= 5 and set(named) <= {str(x) for x in bad.to_list()}
    assert f"E.g. seq_id {', '.join(named[:5])}." in f.message


@pytest.mark.parametrize("n_bad", [1, 3])
def test_one_to_three_strongly_shifted_sequences_are_called(tmp_path, n_bad):
    """Fewer shifted sequences than MISALIGN_PARTIAL_MIN_SEQS (3 of ~1000 flipped a user's
    fitted law unnoticed) are called when they fit their lag far better than lag 0 over
    enough token pairs together."""
    df = generate(SynthSpec(n_tokens=200_000, seed=7))
    ids = df["seq_id"].unique().sort()
    bad = ids.gather(np.random.default_rng(2).choice(ids.len(), n_bad, replace=False))
    moved = IL.shift(-1).over("seq_id", order_by="position")
    df = df.with_columns(pl.when(pl.col("seq_id").is_in(bad.implode()))
                         .then(pl.coalesce(moved, IL)).otherwise(IL).alias("infer_logprob"))
    f = detect_misalignment(_load(tmp_path, df))
    assert n_bad < FX.MISALIGN_PARTIAL_MIN_SEQS
    assert f is not None and f.evidence["partial"] is True and f.evidence["likely_shift"] == -1
    assert f.evidence["shifted_sequences"] == n_bad
    assert sorted(f.evidence["example_seq_ids"]) == sorted(str(x) for x in bad.to_list())
    assert f.evidence["ratio_in_shifted_sequences"] < FX.MISALIGN_PARTIAL_STRONG


def test_clean_run_has_no_sequence_fitting_another_lag(tmp_path, base):
    """On a clean run no sampled sequence fits a lag of +-1..3 (the partial test's margin)."""
    from entr_diag.forensics import misalignment_plan
    from entr_diag.passes import run_pass

    ds = _load(tmp_path, base)
    plan = misalignment_plan(ds)
    run_pass(ds.lf, plan.accumulators)
    status, finding = plan.result()
    assert finding is None and status.status == "clear"
    assert "no sequence fits" in status.reason


# ------------------------------------------------------------------ temperature


@pytest.mark.parametrize("scale", [1.25, 0.8])
def test_one_sided_temperature(tmp_path, base, scale):
    """infer_logprob = scale * (train-side logprob) + c(H) is found with slope ~= scale."""
    df = base.with_columns(IL * scale - 0.05 * H)
    res = run_forensics(_load(tmp_path, df), checks=["one_sided_temperature"])
    f = res.by_kind("one_sided_temperature")
    assert f is not None and f.severity == "warning"
    assert f.evidence["slope_geometric_mean"] == pytest.approx(scale, rel=0.02)
    assert f.evidence["implied_temperature"] == pytest.approx(1 / scale, rel=0.02)
    assert f.evidence["within_bin_correlation"] > 0.9
    # both sides' readings (it assumed the engine: an impossible T = 1.41, helper-34 F4)
    m = re.search(r"T ~ ([\d.]+) if the engine's logprobs are tempered and the trainer's "
                  r"not, or T ~ ([\d.]+) if the trainer's are", f.message)
    assert m and float(m.group(1)) == pytest.approx(1 / scale, rel=0.02), f.message
    assert float(m.group(2)) == pytest.approx(scale, rel=0.02), f.message


def test_temperature_on_stale_tokens_only_is_info(tmp_path, base):
    """With too few fresh tokens the slope is fitted on stale ones too, and only informs."""
    fresh = (pl.col("train_version") - pl.col("policy_version")) == 0
    df = base.filter(~fresh | (pl.col("seq_id") % 25 == 0)).with_columns(IL * 1.25)
    res = run_forensics(_load(tmp_path, df), checks=["one_sided_temperature"])
    f = res.by_kind("one_sided_temperature")
    assert f is not None and f.severity == "info"
    assert f.evidence["stale_tokens_in_fit"] is True


# ------------------------------------------------------------------ truncated sampling


def test_truncated_sampling(tmp_path, base):
    """An engine-side renormalisation log Z = 0.08 H makes delta one-sided, growing with H;
    the de-biased law recovers the planted k = 0.02, alpha = 1."""
    g = pl.min_horizontal(0.08 * H, -IL * 0.99)
    df = base.with_columns((IL + g).alias("infer_logprob"))
    res = run_forensics(_load(tmp_path, df))
    f = res.by_kind("truncated_sampling")
    assert f is not None and f.severity == "warning"
    ev = f.evidence
    assert ev["mean_delta_above_h_min"] < -0.05
    assert ev["bias_share_above_h_min"] > FX.TRUNC_BIAS_SHARE
    assert ev["share_delta_negative_above_h_min"] > 0.7
    assert ev["kendall_tau_entropy_vs_neg_mean_delta"] > 0.8
    assert ev["k_debiased"] == pytest.approx(0.02, rel=0.15)
    assert ev["k_raw"] > 1.5 * ev["k_debiased"]
    assert ev["alpha_debiased"] == pytest.approx(1.0, abs=0.1)
    assert res.status("one_sided_temperature").status == "clear"


def test_truncation_of_the_flattest_distributions_only_is_found(tmp_path, base):
    """A truncation that takes mass only from the flattest distributions (log Z = 0.3 (H -
    2) above 2 nats: a top-k with a large k) leaves the pooled bias share above 0.3 nats
    under TRUNC_BIAS_SHARE; the upper tail's share finds it, naming the tail (helper-43: a
    real top-k 20 run read clear at a pooled 19%, its flattest third at 42%). The clean
    run's upper tail stays far below."""
    g = 0.3 * (H - 2.0).clip(lower_bound=0.0)
    df = base.with_columns((IL + g).alias("infer_logprob"))
    res = run_forensics(_load(tmp_path, df), checks=["truncated_sampling"])
    f = res.by_kind("truncated_sampling")
    assert f is not None and f.severity == "warning", res.status("truncated_sampling")
    ev = f.evidence
    assert ev["bias_share_above_h_min"] < FX.TRUNC_BIAS_SHARE
    assert ev["bias_share_upper_tail"] >= FX.TRUNC_BIAS_SHARE
    assert ev["mean_delta_upper_tail"] < ev["mean_delta_above_h_min"] < 0
    assert FX.TRUNC_TAIL_SHARE <= ev["upper_tail_token_share"] < 0.5
    assert "in the flattest " in f.message
    clean = run_forensics(_load(tmp_path, base, "clean.parquet"), checks=["truncated_sampling"])
    st = clean.status("truncated_sampling")
    assert st.status == "clear" and "in the flattest" in st.reason
    share_t = float(re.search(r"; ([0-9.]+)% in the flattest", st.reason).group(1)) / 100
    assert share_t < 0.05


def test_truncation_reads_the_freshest_tokens_and_a_tail_rising_over_the_bins(tmp_path, base):
    """A one-sided negative delta at high entropy on the stale tokens only (a policy's
    change, whose mean is -KL) is no truncation: the check reads the staleness-0 tokens
    (helper-45: untruncated stale runs read a 20% share); a truncation of the flattest
    distributions beside a negative bias in the 0.01 to 0.05-nat bins (bf16 rounding),
    which breaks the Kendall trend over all bins, is found by its tail's mean delta far
    below the lower bins' (helper-45: a real top-k 30 run, p = 0.026, read clear)."""
    stale = (pl.col("train_version") - pl.col("policy_version")) > 0
    g = 0.3 * (H - 2.0).clip(lower_bound=0.0)
    df = base.with_columns(pl.when(stale).then(IL + g).otherwise(IL).alias("infer_logprob"))
    st = run_forensics(_load(tmp_path, df), checks=["truncated_sampling"]).status(
        "truncated_sampling")
    assert st.status == "clear" and "on staleness 0 tokens" in st.reason, st
    low = pl.when(H.is_between(0.01, 0.05)).then(0.02).otherwise(0.0)
    df = base.with_columns((IL + g + low).alias("infer_logprob"))
    f = run_forensics(_load(tmp_path, df, "b.parquet"),
                      checks=["truncated_sampling"]).by_kind("truncated_sampling")
    assert f is not None, "tail truncation beside a low-bin bias missed"
    ev = f.evidence
    assert ev["kendall_p"] > FX.TRUNC_TREND_P and ev["upper_tail_z_vs_lower_bins"] >= FX.TRUNC_TAIL_Z
    assert ev["tokens_selection"] == "staleness 0 tokens"
    assert "standard errors above the lower bins'" in f.message


def test_sequence_outliers_beside_truncation_point_at_it_first():
    """Sequence outliers found beside a truncated-sampling warning: their message says the
    truncation may explain them and their check names it first (it pointed at MoE routing
    alone); beside an info-level truncation finding, or none, they are unchanged."""
    from entr_diag.forensics import _outliers_beside_truncation

    o = Finding(kind="sequence_outliers", severity="info", title="t", message="21 of 1536.",
                evidence={}, check="MoE routing consistency ...")
    tr = Finding(kind="truncated_sampling", severity="warning", title="t", message="m",
                 evidence={}, check="c")
    (_, t2), (_, o2) = _outliers_beside_truncation([(2, tr), (3, o)])
    assert t2 is tr
    assert o2.message.startswith("21 of 1536. The truncated-sampling check warns too")
    assert o2.check.startswith("first the engine-side truncation (see truncated_sampling)")
    assert o2.check.endswith("; then MoE routing consistency ...")
    assert o2.severity == "info"
    info = dataclasses.replace(tr, severity="info")
    assert _outliers_beside_truncation([(2, info), (3, o)]) == [(2, info), (3, o)]
    assert _outliers_beside_truncation([(3, o)]) == [(3, o)]


# ------------------------------------------------------------------ logit-level toys


def _logit_run(kind: str, *, n_seq=240, seq_len=100, vocab=128, seed=0, temperature=0.7, top_p=0.9):
    """A toy run from real softmaxes: random logits (scales spread the entropy), a bf16-rounded
    engine, and optionally an engine-side temperature or top-p renormalisation."""
    rng = np.random.default_rng(seed)
    n = n_seq * seq_len
    scale = np.exp(rng.uniform(np.log(0.3), np.log(8.0), n))[:, None]
    z = rng.standard_normal((n, vocab)) * scale
    def lsm(x):
        m = x.max(1, keepdims=True)
        return x - m - np.log(np.exp(x - m).sum(1, keepdims=True))
    lp_train = lsm(z)
    # bf16-like engine: logits rounded to 8 mantissa bits, plus small kernel noise
    zi = z.astype(np.float32).view(np.uint32)
    zi = ((zi + 0x8000) & 0xFFFF0000).view(np.float32).astype(np.float64)
    zi = zi + rng.standard_normal(zi.shape) * 0.01
    if kind == "temperature":
        zi = zi / temperature
    if kind == "top_k":  # an engine sampling at T = 0.6 from its 5 most likely tokens
        zi = zi / 0.6
        zi = np.where(zi >= np.sort(zi, 1)[:, -5][:, None], zi, -np.inf)
    lp_inf = lsm(zi)
    if kind == "top_p":
        p = np.exp(lp_inf)
        order = np.argsort(-p, 1)
        ps = np.take_along_axis(p, order, 1)
        keep_sorted = (np.cumsum(ps, 1) - ps) < top_p
        keep = np.zeros_like(keep_sorted)
        np.put_along_axis(keep, order, keep_sorted, 1)
        p = np.where(keep, p, 0.0)
        p /= p.sum(1, keepdims=True)
        with np.errstate(divide="ignore"):
            lp_inf = np.where(p > 0, np.log(p), -np.inf)
    pi = np.exp(lp_inf)
    ent = -(pi * np.where(pi > 0, lp_inf, 0.0)).sum(1)
    y = np.minimum((np.cumsum(pi, 1) < rng.random(n)[:, None]).sum(1), vocab - 1)
    idx = np.arange(n)
    # the engine's logprob of another token: gathered at token_id + 1, or its argmax token's
    y_inf = ((y + 1) % vocab if kind == "wrong_id" else lp_inf.argmax(1) if kind == "argmax"
             else y)
    return pl.DataFrame({
        "seq_id": idx // seq_len, "position": idx % seq_len, "step": (idx // seq_len) * 8 // n_seq,
        "train_logprob": lp_train[idx, y], "infer_logprob": np.minimum(lp_inf[idx, y_inf], 0.0),
        "entropy": ent,
    })


def test_another_tokens_logprob_makes_the_verdict_not_assessable(tmp_path):
    """Engine logprobs gathered at token_id + 1: delta compares two different tokens, so the
    verdict leads with 'not assessable' (it read 'law does not hold: alpha = -0.197' and
    JSON assessable true, helper-34 F6); a clean run stays assessable."""
    from typer.testing import CliRunner

    from entr_diag.cli import app

    for kind, void in (("wrong_id", True), ("clean", False)):
        p = tmp_path / f"{kind}.parquet"
        _logit_run(kind, n_seq=120).write_parquet(p)
        js = tmp_path / f"{kind}.json"
        r = CliRunner().invoke(app, ["fit", str(p), "--json", str(js), "-q", "--n-boot", "200"])
        assert r.exit_code == 0, r.output
        verdict = json.loads(js.read_text())["verdict"]
        assert verdict["assessable"] is not void, verdict
        assert verdict["text"].startswith(
            "not assessable (infer_logprob does not look like the logprob of the sampled "
            "token: delta compares two different tokens") is void, verdict["text"]


@pytest.mark.parametrize("kind,expect", [("wrong_id", "infer_logprob"),
                                         ("argmax", "infer_logprob"), ("clean", None),
                                         ("temperature", None), ("top_p", None),
                                         ("top_k", None)])
def test_logprob_of_another_token_is_named(kind, expect, tmp_path):
    """Engine logprobs gathered at token_id + 1, or of the argmax token: the units check
    names the engine's column (its surprisal is far from the entropy, the trainer's is
    not); a clean run, an engine temperature and top-p sampling are not taken for it. With
    unrelated columns the alignment check does not call lag 0 a fit. An engine sampling
    with T = 0.6 and top-k 5 moves the trainer's mean surprisal by 2x too, but the two
    columns still correlate within the entropy bins: not taken for another token."""
    from entr_diag.caveats import units_caveat
    from entr_diag.fit import fit_scaling_law

    ds = _load(tmp_path, _logit_run(kind, n_seq=120))
    units = fit_scaling_law(ds.lf, n_boot=100, with_strata=False).units
    assert units is not None and units.likely_mistake is None
    assert units.other_token == expect, units
    if expect:
        text = units_caveat(units.to_dict(), {"infer_logprob": "rollout_log_probs",
                                              "train_logprob": "train_logprob"})
        assert text.startswith("caveat: infer_logprob ('rollout_log_probs') does not look "
                               "like the logprob of the sampled token"), text
        assert re.search(r"its mean surprisal is [\d.]+ nats, train_logprob's ([\d.]+) nats, "
                         r"for a mean entropy of ([\d.]+) nats", text), text
    if kind == "top_k":
        assert units.train_over_infer > 1.5 and units.within_bin_corr > 0.5
    if expect:
        assert units.within_bin_corr < 0.35
    mis = run_forensics(ds, checks=["misalignment"]).status("misalignment")
    assert mis.status == ("cannot_tell" if kind == "wrong_id" else "clear"), mis.reason


def test_logit_level_clean_is_silent(tmp_path):
    """bf16-vs-fp32 logits on the same softmax give no finding above info."""
    res = run_forensics(_load(tmp_path, _logit_run("clean")))
    assert res.silent, [f.title for f in res.findings]


def test_logit_level_temperature(tmp_path):
    """An engine sampling at T = 0.7 (tempered logprobs) gives slope ~1/T at fixed entropy."""
    res = run_forensics(_load(tmp_path, _logit_run("temperature")))
    f = res.by_kind("one_sided_temperature")
    assert f is not None and f.severity == "warning"
    assert f.evidence["implied_temperature"] == pytest.approx(0.7, abs=0.05)
    assert res.by_kind("truncated_sampling") is None


def test_logit_level_top_p(tmp_path):
    """Engine-side top-p 0.9 renormalisation: one-sided delta near log(0.9), exact-zero logprobs."""
    res = run_forensics(_load(tmp_path, _logit_run("top_p")))
    f = res.by_kind("truncated_sampling")
    assert f is not None and f.severity == "warning"
    ev = f.evidence
    assert ev["mean_delta_above_h_min"] == pytest.approx(math.log(0.9), abs=0.03)
    assert ev["bias_share_above_h_min"] > 0.8
    assert ev["engine_logprob_exactly_zero_tokens"] > 0
    # one-token nuclei, kept as valid tokens (the loader's note says so)
    assert ev["engine_logprob_zero_kept_as_nuclei"] == ev["engine_logprob_exactly_zero_tokens"]
    assert "kept as valid tokens" in f.message
    assert ev["k_debiased"] < 0.1 * ev["k_raw"]
    assert res.by_kind("one_sided_temperature") is None


def test_a_small_temperature_slope_beside_truncation_is_info():
    """A top-k engine alone tilts the within-bin slope a little (0.92: 'temperature 1.09')
    while the truncated-sampling check warns: the temperature finding is info, saying so; a
    real temperature (slope 1.4) beside truncation, or a small slope alone, stays a
    warning."""
    def f(kind, slope=None, sev="warning"):
        ev = {} if slope is None else {"slope_geometric_mean": slope}
        return Finding(kind, sev, kind, "m.", ev, "c")

    trunc = f("truncated_sampling")
    out = dict(FX._defer_temperature_to_truncation([(1, f("one_sided_temperature", 0.92)),
                                                    (2, trunc)]))
    assert out[1].severity == "info" and "may be that, not a temperature" in out[1].message
    assert out[2] is trunc
    for pair in ([(1, f("one_sided_temperature", 1.4)), (2, trunc)],
                 [(1, f("one_sided_temperature", 0.92))],
                 [(1, f("one_sided_temperature", 0.92)), (2, f("truncated_sampling", sev="info"))]):
        assert FX._defer_temperature_to_truncation(pair)[0][1].severity == "warning"


# ------------------------------------------------------------------ sequence outliers


def test_sequence_outliers(tmp_path, base):
    """Sequences whose delta is 6x larger at every token are listed with their delta^2 share."""
    bad = pl.col("seq_id") % 41 == 0
    df = _with_delta(base, pl.when(bad).then(DELTA * 6).otherwise(DELTA))
    planted = {str(s) for s in base.filter(bad)["seq_id"].unique().to_list()}
    res = run_forensics(_load(tmp_path, df), checks=["sequence_outliers"])
    f = res.by_kind("sequence_outliers")
    assert f is not None and f.severity == "warning"
    ev = f.evidence
    assert set(ev["top_seq_ids"]) <= planted
    assert ev["sequences_flagged"] >= 2
    assert ev["delta2_share_flagged"] > FX.OUTLIER_SHARE_WARN
    assert ev["k_without_flagged"] < ev["k_with_flagged"]
    # a whole-sequence shift: every token carries it, no "catastrophic token" reading
    assert ev["flagged_carried_by_few_tokens"] == 0
    assert min(ev["top_tokens_carrying_abs_delta"]) > FX.FEW_CARRIERS
    assert "catastrophic token" not in f.message and "MoE routing" in f.check
    # which k: this check's own fit, not the verdict's (the two differ)
    assert (f"k of delta^2 = k H (fitted through the origin over every entropy bin, not the "
            f"verdict's law-regime fit) = {ev['k_with_flagged']:.3g} with them") in f.message


def test_tied_outlier_sequences_are_listed_in_one_order(tmp_path, base):
    """Identical outlier sequences (one copied under new seq_ids) tie on their robust z:
    the list orders them by sequence key, the same on every run and row order (the tie
    was broken by the sort's thread timing: the JSON differed between identical runs)."""
    bad = pl.col("seq_id") % 41 == 0
    df = _with_delta(base, pl.when(bad).then(DELTA * 6).otherwise(DELTA))
    one = df.filter(pl.col("seq_id") == df.filter(bad)["seq_id"].min())
    top = int(df["seq_id"].max())
    df = pl.concat([df] + [one.with_columns(pl.lit(top + i, dtype=one["seq_id"].dtype)
                                            .alias("seq_id")) for i in range(1, 4)])
    seen = set()
    for seed in range(4):
        d = tmp_path / f"r{seed}"
        d.mkdir()
        shuffled = df.sample(fraction=1.0, shuffle=True, seed=seed)
        f = run_forensics(_load(d, shuffled), checks=["sequence_outliers"]).by_kind(
            "sequence_outliers")
        seen.add(tuple(f.evidence["top_seq_ids"]))
    assert len(seen) == 1


def test_sequence_outlier_carried_by_one_token_says_so(tmp_path, base):
    """A sequence flagged for one catastrophic token (delta = -10 among normal ones) is said
    to be carried by one token, with advice on tokens, not on whole-sequence causes (MoE
    routing, KV cache), which the finding gave."""
    seqs = base.filter(pl.col("loss_mask"))["seq_id"].unique().sort().to_list()[:3]
    first = (pl.col("seq_id").is_in(seqs) & (pl.col("position") == 5))
    df = _with_delta(base, pl.when(first).then(pl.lit(-10.0)).otherwise(DELTA))
    f = run_forensics(_load(tmp_path, df), checks=["sequence_outliers"]).by_kind(
        "sequence_outliers")
    assert f is not None
    ev = f.evidence
    assert ev["flagged_carried_by_few_tokens"] == ev["sequences_flagged"] >= 1
    assert all(c < FX.FEW_CARRIERS for c in ev["top_tokens_carrying_abs_delta"])
    assert "one or two tokens (or a few in a long sequence) carry the sequence's" in f.message
    assert f.check.startswith("the tokens that carry those sequences") and "MoE" not in f.check
    # heavy tails of the token mismatch, not a sequence fault: info, no caveat on the verdict
    assert f.severity == "info" and "a few tokens carry" in f.title
    assert ev["delta2_share_flagged_whole_sequence"] == 0


def test_sequence_outlier_carried_by_a_few_tokens_of_a_long_sequence(tmp_path, base):
    """Long sequences flagged for six spiking tokens each (participation ratio 9 to 12,
    above the absolute 3 but below 5% of their 400+ tokens) are read as a few catastrophic
    tokens, info only, not as whole-sequence outliers pointing at MoE routing (a warning
    before); a routing-like shift of other sequences beside them still warns, on its own
    share of sum delta^2."""
    stale = pl.col("train_version") - pl.col("policy_version")
    long = (base.filter(pl.col("loss_mask")).group_by("seq_id")
            .agg(pl.len(), stale.first().alias("stale")).filter(pl.col("len") >= 400))
    # two long sequences of different lags (their spikes inflate no one cell's expectation)
    spiked = long.sort("seq_id").unique("stale", keep="first").sort("seq_id")["seq_id"].head(2)
    spike = pl.col("seq_id").is_in(spiked.implode()) & (pl.col("position") % 31 == 7) & (
        pl.col("position") < 31 * 6)
    df = _with_delta(base, pl.when(spike).then(pl.lit(-20.0)).otherwise(DELTA))
    f = run_forensics(_load(tmp_path, df), checks=["sequence_outliers"]).by_kind(
        "sequence_outliers")
    assert f is not None
    ev = f.evidence
    assert set(ev["top_seq_ids"]) == {str(x) for x in spiked}
    assert all(FX.FEW_CARRIERS < c < 20 for c in ev["top_tokens_carrying_abs_delta"])
    assert ev["flagged_carried_by_few_tokens"] == 2 and f.severity == "info"
    assert ev["delta2_share_flagged"] > FX.OUTLIER_SHARE_WARN
    # beside whole-sequence outliers: a warning on their share, the spiked ones named apart
    moe = pl.col("seq_id") % 41 == 0
    df = _with_delta(base, pl.when(spike).then(pl.lit(-20.0))
                     .when(moe).then(DELTA * 6).otherwise(DELTA))
    f = run_forensics(_load(tmp_path, df, "both.parquet"),
                      checks=["sequence_outliers"]).by_kind("sequence_outliers")
    ev = f.evidence
    assert f.severity == "warning" and "whatever their entropy" in f.title
    assert ev["flagged_carried_by_few_tokens"] == 2 < ev["sequences_flagged"]
    assert FX.OUTLIER_SHARE_WARN <= ev["delta2_share_flagged_whole_sequence"] < ev[
        "delta2_share_flagged"]
    assert "MoE routing" in f.check


def test_outliers_are_scored_without_impossible_logprobs(tmp_path, base):
    """Sequences holding -500 placeholders are no outliers once those tokens are left out
    (the implausible-logprobs finding reports them), nor do they fill the list up to its
    'broad tail' cap and hide real ones: routing-like outliers (|delta| x8 on every token)
    are found beside them, and still when each holds one placeholder itself."""
    ids = base["seq_id"].unique().sort()
    moe, ph = ids.slice(0, 5).to_list(), ids.slice(5, 40).to_list()
    df = _with_delta(base, pl.when(pl.col("seq_id").is_in(moe)).then(DELTA * 8).otherwise(DELTA))
    control = run_forensics(_load(tmp_path, df, "control.parquet"),
                            checks=["sequence_outliers"]).by_kind("sequence_outliers")
    found = set(control.evidence["top_seq_ids"])
    assert control.severity == "warning" and len(found) >= 4
    assert found <= {str(x) for x in moe}
    ph_rows = pl.col("seq_id").is_in(ph) & (pl.col("position") % 10 == 3)
    res = run_forensics(_load(tmp_path, df.with_columns(
        pl.when(ph_rows).then(-500.0).otherwise(IL).alias("infer_logprob"))),
        checks=["sequence_outliers", "implausible_logprobs"])
    f = res.by_kind("sequence_outliers")
    assert f is not None and f.severity == "warning"
    assert set(f.evidence["top_seq_ids"]) == found
    assert "flagged_with_impossible_logprobs" not in f.evidence
    assert res.by_kind("implausible_logprobs").severity in ("warning", "critical")
    # each outlier holding one placeholder of its own: scored on its other tokens
    one = pl.col("seq_id").is_in(moe) & (pl.col("position") == 2)
    res = run_forensics(_load(tmp_path, df.with_columns(
        pl.when(one).then(-500.0).otherwise(IL).alias("infer_logprob")), "one.parquet"),
        checks=["sequence_outliers"])
    f = res.by_kind("sequence_outliers")
    assert f is not None and f.severity == "warning"
    assert set(f.evidence["top_seq_ids"]) == found
    assert f.evidence["flagged_with_impossible_logprobs"] == len(found)
    assert "left out of their scores" in f.message
    # the law with and without the outliers leaves the placeholders out of both sums
    for k in ("k_with_flagged", "k_without_flagged"):
        assert f.evidence[k] == pytest.approx(control.evidence[k], rel=0.02)
    # placeholders alone make no outlier
    only = run_forensics(_load(tmp_path, base.with_columns(
        pl.when(ph_rows).then(-500.0).otherwise(IL).alias("infer_logprob")), "ph.parquet"),
        checks=["sequence_outliers"])
    assert only.by_kind("sequence_outliers") is None


# ------------------------------------------------------------------ drift


def test_drift(tmp_path, base):
    """|delta| scaled by (1 + 0.1 step) is found as drift of about x1.9 over 10 steps."""
    df = _with_delta(base, DELTA * (1 + 0.1 * pl.col("step")))
    res = run_forensics(_load(tmp_path, df), checks=["drift", "staleness"])
    f = res.by_kind("drift")
    assert f is not None and f.severity == "warning"
    assert 1.6 < f.evidence["growth_over_run"] < 2.2
    assert f.evidence["p_value"] < 1e-6
    assert res.status("staleness").status == "clear"



def test_a_one_step_spike_is_a_drift_warning(tmp_path, base):
    """One step whose mismatch is 3x the others' (a failed weight sync): neither a trend
    over the run nor a lasting jump, it read 'clear' beside x1.73 at p = 3e-9; now a
    warning naming the step and its factor. The clean run has no spike."""
    df = _with_delta(base, pl.when(pl.col("step") == 5).then(DELTA * 3).otherwise(DELTA))
    res = run_forensics(_load(tmp_path, df), checks=["drift"])
    f = res.by_kind("drift")
    assert f is not None and f.severity == "warning", res.status("drift")
    assert f.evidence["spike_steps"] == [5]
    assert f.evidence["spike_factor_over_median_step"][0] == pytest.approx(3.0, rel=0.15)
    assert "Mismatch spikes at step 5" in f.title and "weight sync" in f.check
    clean = run_forensics(_load(tmp_path, base, "clean.parquet"), checks=["drift"])
    assert clean.by_kind("drift") is None and clean.status("drift").status == "clear"
    # two steps of eight are a quarter: still spikes; three are a pattern, not a spike
    levels = np.log([1, 1, 1.1, 0.9, 3, 1, 1, 1.05])
    assert FX._step_spikes(np.arange(8), levels) == [(4, pytest.approx(3 / 1.0, rel=0.1))]
    assert FX._step_spikes(np.arange(8), np.log([1, 3, 1, 3, 1, 3, 1, 1])) == []

@pytest.mark.parametrize("gain", [0.0, 0.15])
def test_drift_with_few_steps(tmp_path, gain):
    """With 5 steps a planted drift (x1.6) is found and a clean run is not."""
    b = generate(SynthSpec(n_tokens=N_TOKENS, seed=5, n_steps=5))
    res = run_forensics(_load(tmp_path, _with_delta(b, DELTA * (1 + gain * pl.col("step")))),
                        checks=["drift"])
    assert (res.by_kind("drift") is not None) == (gain > 0)


def test_drift_not_fooled_by_entropy_change(tmp_path, base):
    """A policy that sharpens over training (entropy falls, delta follows the law) is no drift."""
    # drop high-entropy tokens more often at later steps: mean |delta| falls, law unchanged
    rng = np.random.default_rng(3)
    u = pl.Series(rng.random(base.height))
    df = base.with_columns(u.alias("_u")).filter(
        (pl.col("_u") > pl.col("step") / 12) | (H < 0.1)).drop("_u")
    res = run_forensics(_load(tmp_path, df), checks=["drift"])
    assert res.status("drift").status == "clear"


def test_drift_cannot_tell_without_step(tmp_path, base):
    """Without a step column drift is cannot_tell with the reason."""
    res = run_forensics(_load(tmp_path, base.drop("step")), checks=["drift"])
    st = res.status("drift")
    assert st.status == "cannot_tell" and "step" in st.reason


# ------------------------------------------------------------------ staleness


def test_staleness_found(tmp_path):
    """A planted staleness gain makes |delta| grow per version of lag at fixed entropy."""
    df = generate(SynthSpec(n_tokens=N_TOKENS, seed=11, staleness_gain=1.0, h_star=None))
    res = run_forensics(_load(tmp_path, df), checks=["staleness", "drift"])
    f = res.by_kind("staleness")
    assert f is not None and f.severity == "info"
    ratios = dict(zip(f.evidence["ratio_staleness_values"],
                      f.evidence["ratio_to_freshest_per_staleness"], strict=True))
    assert ratios[0] == 1.0
    assert ratios[3] == pytest.approx(2.0, rel=0.15)
    # planted |delta| growth: sqrt(1 + s), i.e. x1.41 at lag 1, x2 at lag 3
    assert 1.15 < f.evidence["growth_per_version"] < 1.45
    # not geometric: the log-linear model's x(per version)^3 overstates lag 3's x2, which
    # the headline and growth_lag_min_to_max give as measured
    assert f.evidence["growth_lag_min_to_max"] == pytest.approx(ratios[3], rel=1e-3)
    assert f"x{ratios[3]:.3g} at lag 3 against lag 0" in f.title
    assert (f.evidence["growth_lag_min_to_max_loglinear"]
            == pytest.approx(f.evidence["growth_per_version"] ** 3, rel=1e-3))
    assert f.evidence["p_value"] < 1e-6
    assert res.status("drift").status == "clear"
    # lags spread evenly over the steps: pooled and within-step ratios agree, no word on it
    assert f.evidence["pooled_ratio_lag_min_to_max"] == pytest.approx(ratios[3], rel=0.25)
    assert "Pooled over entropies and steps" not in f.message


def test_staleness_names_the_pooled_rise_the_steps_make(tmp_path):
    """Fresh tokens mostly at the first steps, |delta| rising over the steps for every lag:
    pooled, mean |delta| rises far more with the lag than at fixed step; the message gives
    both and says they read different things, naming no cause (helper-43: 'x3.22 at lag 4'
    in the title beside mean |delta| rising x43 in the evidence, unexplained; helper-45: a
    cause named first was the wrong one on real stale runs)."""
    df = generate(SynthSpec(n_tokens=N_TOKENS, seed=11, staleness_gain=1.0, h_star=None))
    stale = pl.col("train_version") - pl.col("policy_version")
    df = df.with_row_index("_i").filter(
        (stale > 0) | (pl.col("step") < 3) | (pl.col("_i") % 10 == 0)).drop("_i")
    df = _with_delta(df, DELTA * (1 + 2 * pl.col("step")))
    f = run_forensics(_load(tmp_path, df), checks=["staleness"]).by_kind("staleness")
    assert f is not None, "no staleness finding"
    far = max(f.evidence["ratio_staleness_values"])
    measured = f.evidence["growth_lag_min_to_max"]
    assert f.evidence["pooled_ratio_lag_min_to_max"] > 2 * measured
    assert (f"Pooled over entropies and steps, mean |delta| reads "
            f"x{f.evidence['pooled_ratio_lag_min_to_max']:.3g} at lag {far} against lag 0"
            in f.message), f.message
    assert "the pooled one holds neither" in f.message and "not the lag itself" not in f.message


def test_swapped_version_columns_make_staleness_cannot_tell(tmp_path):
    """The version columns swapped (most tokens with policy_version > train_version): the
    lag would be read backwards (a planted growth read x0.93 per version, 'clear'), so
    the check cannot tell and says to swap them."""
    df = generate(SynthSpec(n_tokens=N_TOKENS, seed=11, staleness_gain=1.0, h_star=None))
    swapped = df.with_columns(pl.col("policy_version").alias("train_version"),
                              pl.col("train_version").alias("policy_version"))
    st = run_forensics(_load(tmp_path, swapped), checks=["staleness"]).status("staleness")
    assert st.status == "cannot_tell" and "look swapped" in st.reason
    assert run_forensics(_load(tmp_path, df, "ok.parquet"),
                         checks=["staleness"]).by_kind("staleness") is not None


def test_staleness_carrying_most_of_delta_is_a_warning_with_a_caveat(tmp_path):
    """|delta| x(1 + 4 lag) at equal entropy (lags 0..3): policy drift carries over 90% of
    sum delta^2, so the finding is a warning naming that share and the staleness-0 law,
    and puts a caveat beside the verdict; the planted x sqrt(1 + lag) growth (drift about
    60% of sum delta^2) stays info."""
    from entr_diag.caveats import findings_caveats

    b = generate(SynthSpec(n_tokens=N_TOKENS, seed=11, h_star=None))
    lag = pl.col("train_version") - pl.col("policy_version")
    res = run_forensics(_load(tmp_path, _with_delta(b, DELTA * (1 + 4 * lag))),
                        checks=["staleness"])
    f = res.by_kind("staleness")
    assert f is not None and f.severity == "warning", f
    assert f.title.startswith("Policy drift carries most of delta: ")
    assert f.evidence["delta2_share_policy_drift"] > 0.9
    assert f.evidence["delta2_share_stale_tokens"] >= f.evidence["delta2_share_policy_drift"]
    assert "the engine's is the law of the staleness-0 stratum" in f.message
    (cav,) = findings_caveats(res.to_dict())
    assert "[staleness]" in cav
    mild = generate(SynthSpec(n_tokens=N_TOKENS, seed=11, staleness_gain=1.0, h_star=None))
    f = run_forensics(_load(tmp_path, mild, "mild.parquet"),
                      checks=["staleness"]).by_kind("staleness")
    assert f is not None and f.severity == "info"
    assert 0.3 < f.evidence["delta2_share_policy_drift"] < 0.75


def _lag_from_step(df: pl.DataFrame, first_stale_step: int, seed: int = 5) -> pl.DataFrame:
    """Staleness 0 before ``first_stale_step`` (a synchronous warm-up), from then on a lag of
    1 to 3 drawn per sequence: policy_version = train_version - lag."""
    seqs = df["seq_id"].unique().sort()
    lag = pl.DataFrame({"seq_id": seqs, "_lag": np.random.default_rng(seed).integers(
        1, 4, size=seqs.len())})
    return df.join(lag, on="seq_id").with_columns(
        pl.when(pl.col("step") >= first_stale_step)
        .then(pl.col("train_version") - pl.col("_lag"))
        .otherwise(pl.col("train_version")).alias("policy_version")).drop("_lag")


def test_staleness_onset_with_an_engine_change_is_drift(tmp_path):
    """The lag begins at step 5, where the engine's mismatch jumps x3 whatever the lag: no
    staleness finding (lags 1 to 3 within a step do not differ), the jump is drift at step 5
    (a linear step trend let it pass for staleness, and lag-0 tokens, only in steps 0-4,
    hid it from the drift check)."""
    b = generate(SynthSpec(n_tokens=2 * N_TOKENS, seed=3, h_star=None))
    df = _lag_from_step(_with_delta(b, DELTA * pl.when(pl.col("step") >= 5).then(3.0)
                                    .otherwise(1.0)), 5)
    res = run_forensics(_load(tmp_path, df), checks=["staleness", "drift"])
    st = res.status("staleness")
    assert st.status == "clear", st.reason
    assert "lag 0 never shares a step with the others" in st.reason
    f = res.by_kind("drift")
    assert f is not None and f.severity == "warning"
    assert f.evidence["jump_between_steps"] == [4, 5]
    assert f.evidence["jump_growth"] == pytest.approx(3.0, rel=0.15)
    assert "all tokens: |delta| does not grow with the lag within steps" in f.message
    assert "most of it at once between step 4 and 5" in f.message


def test_staleness_ratios_relative_to_the_lags_that_share_steps(tmp_path):
    """A real staleness effect (|delta| x sqrt(1 + s)) in a run whose lag-0 tokens are all
    in its first steps: the ratios are read against lag 1 (lag 0 shares no step with the
    others: listed apart, never a NaN ratio in the message)."""
    b = generate(SynthSpec(n_tokens=2 * N_TOKENS, seed=4, h_star=None))
    df = _lag_from_step(b, 5)
    df = _with_delta(df, DELTA * (1 + pl.col("train_version") - pl.col("policy_version")).sqrt())
    f = run_forensics(_load(tmp_path, df), checks=["staleness"]).by_kind("staleness")
    assert f is not None
    assert f.evidence["ratio_staleness_values"] == [1, 2, 3]
    assert f.evidence["staleness_values_not_compared"] == [0]
    r = f.evidence["ratio_to_freshest_per_staleness"]
    assert r[0] == 1.0
    assert r[1:] == pytest.approx([math.sqrt(3 / 2), math.sqrt(4 / 2)], rel=0.1)
    assert "relative to lag 1" in f.message and "nan" not in f.message.lower()
    assert "lag 0 never shares a step with the others" in f.message


def test_drift_with_a_lag_rising_with_the_step_is_a_warning_that_cannot_tell_why(tmp_path):
    """The mismatch x(1 + lag) with lag = step // 2 (each lag in 2 of the 10 steps): held
    at fixed staleness, the trend within a lag says nothing of the run (it read 'clear, x1.02
    over 10 steps', then 'cannot tell' with no caveat). Read with the lag not held fixed the
    mismatch rises over the run: a warning saying the engine's drift and the lag's policy
    drift read alike. The same lag with a mismatch that does not change: cannot tell."""
    b = generate(SynthSpec(n_tokens=2 * N_TOKENS, seed=5, h_star=None))
    lag = pl.col("step") // 2
    df = _with_delta(b, DELTA * (1 + lag).sqrt()).with_columns(
        (pl.col("train_version") - lag).alias("policy_version"))
    res = run_forensics(_load(tmp_path, df), checks=["drift"])
    st, f = res.status("drift"), res.by_kind("drift")
    assert st.status == "found" and "drift and policy drift cannot be told apart" in st.reason
    assert f is not None and f.severity == "warning"
    assert f.title.startswith("Mismatch rises over training with the version lag")
    assert f.evidence["growth_over_run"] > 1.5 and f.evidence["steps_per_lag_value_max"] == 2
    assert f.evidence["mean_lag_first_step"] == 0 and f.evidence["mean_lag_last_step"] == 4
    assert abs(f.evidence["growth_within_lags"] - 1) < 0.2
    flat = _with_delta(b, DELTA).with_columns(
        (pl.col("train_version") - lag).alias("policy_version"))
    st = run_forensics(_load(tmp_path, flat, "flat.parquet"), checks=["drift"]).status("drift")
    assert st.status == "cannot_tell", st
    assert st.reason.startswith("the version lag changes with the step (each lag value is "
                                "in at most 2 of the ")


def test_drift_reads_fresh_tokens_only_when_they_span_the_run(tmp_path):
    """Fresh (lag-0) tokens in the first half of the run only do not stand for the run: a
    mismatch that doubles in the second half is found on all tokens."""
    b = generate(SynthSpec(n_tokens=2 * N_TOKENS, seed=6, h_star=None))
    df = _lag_from_step(_with_delta(b, DELTA * (1 + 0.15 * pl.col("step"))), 5)
    f = run_forensics(_load(tmp_path, df), checks=["drift"]).by_kind("drift")
    assert f is not None
    assert not f.evidence["tokens_selection"].startswith("staleness 0")
    assert f.evidence.get("jump_between_steps") is None  # gradual: no single step holds it


def test_engine_change_at_the_onset_of_the_lag_is_an_info_jump(tmp_path):
    """Lag 0 before step 5, lag 1 from it on, and the engine's mismatch x3 from step 5: no
    step holds both lags, so staleness cannot tell and the drift held apart by lag sees
    nothing; the jump where the lag changes is an info finding saying the two read alike."""
    b = generate(SynthSpec(n_tokens=2 * N_TOKENS, seed=3, h_star=None))
    df = _with_delta(b, DELTA * pl.when(pl.col("step") >= 5).then(3.0).otherwise(1.0))
    df = df.with_columns((pl.col("train_version") - (pl.col("step") >= 5).cast(pl.Int64))
                         .alias("policy_version"))
    res = run_forensics(_load(tmp_path, df), checks=["staleness", "drift"])
    assert res.status("staleness").status == "cannot_tell"
    f = res.by_kind("drift")
    assert f is not None and f.severity == "info"
    assert f.evidence["jump_between_steps"] == [4, 5]
    assert f.evidence["lags_before"] == [0] and f.evidence["lags_after"] == [1]
    assert f.evidence["jump_growth"] == pytest.approx(3.0, rel=0.15)
    assert "the data cannot tell them apart" in f.message


def test_engine_change_in_the_steps_without_fresh_tokens_is_found(tmp_path):
    """Lags 0 to 3 in steps 0-7, lags 1 to 3 only in steps 8-9, whose engine mismatch is x2:
    the fresh tokens, absent from the last steps, do not stand for the run; the jump at
    step 8 is found on all tokens (each lag's effect, known within steps, removed)."""
    b = generate(SynthSpec(n_tokens=3 * N_TOKENS, seed=8, h_star=None))
    late = pl.col("step") >= 8
    df = _with_delta(b, DELTA * pl.when(late).then(2.0).otherwise(1.0)).with_columns(
        pl.when(late & (pl.col("train_version") == pl.col("policy_version")))
        .then(pl.col("train_version") - 1).otherwise(pl.col("policy_version"))
        .alias("policy_version"))
    f = run_forensics(_load(tmp_path, df), checks=["drift"]).by_kind("drift")
    assert f is not None and f.severity == "warning"
    assert f.evidence["jump_between_steps"] == [7, 8]
    assert f.title.startswith("Mismatch jumps at step 8")
    assert not f.evidence["tokens_selection"].startswith("staleness 0")


def test_gradual_drift_with_one_lag_per_step_is_no_jump(tmp_path):
    """One lag per step (lag = step // 3) and a mismatch growing by 15% a step: the drift
    held apart by lag centres each lag's steps on their own, so no single step is called
    a jump."""
    b = generate(SynthSpec(n_tokens=2 * N_TOKENS, seed=9, h_star=None))
    df = _with_delta(b, DELTA * (1 + 0.15 * pl.col("step"))).with_columns(
        (pl.col("train_version") - pl.col("step") // 3).alias("policy_version"))
    f = run_forensics(_load(tmp_path, df), checks=["drift"]).by_kind("drift")
    assert f is None or f.evidence.get("jump_between_steps") is None


def test_staleness_growth_is_read_per_unit_of_lag(tmp_path):
    """Versions counted in steps of 1000 (a lag of one version is 1000 apart) give the same
    growth per unit of lag as versions counted by one, and the finding says per how many
    versions (per version, x1.0005 passed for no growth)."""
    df = generate(SynthSpec(n_tokens=N_TOKENS, seed=11, staleness_gain=1.0, h_star=None))
    one = run_forensics(_load(tmp_path, df), checks=["staleness"]).by_kind("staleness")
    big = df.with_columns(pl.col("policy_version", "train_version") * 1000)
    f = run_forensics(_load(tmp_path, big, "big.parquet"),
                      checks=["staleness"]).by_kind("staleness")
    assert f is not None and f.evidence["versions_per_lag_unit"] == 1000
    assert one.evidence["versions_per_lag_unit"] == 1
    assert f.evidence["growth_per_version"] == pytest.approx(
        one.evidence["growth_per_version"], rel=1e-6)
    assert "per 1,000 versions of lag in a log-linear fit" in f.message
    # the headline: the measured ratio at the largest lag
    r = dict(zip(f.evidence["ratio_staleness_values"],
                 f.evidence["ratio_to_freshest_per_staleness"], strict=True))
    assert f"(x{r[3000]:.3g} at lag 3000 against lag 0)" in f.title
    assert f.evidence["growth_lag_min_to_max"] == pytest.approx(r[3000], rel=1e-3)


def test_drift_reads_the_lag_growth_per_unit_of_lag(tmp_path):
    """A real staleness effect (|delta| x sqrt(1 + lag)) in a run whose lag begins at step
    5, with versions counted in steps of 1000: the drift check reads the growth within
    steps per unit of lag too, so the lag's effect is no drift warning (per raw version it
    read x1.0003, 'no growth', and the lag's onset passed for an engine drift)."""
    b = generate(SynthSpec(n_tokens=2 * N_TOKENS, seed=4, h_star=None))
    df = _lag_from_step(b, 5)
    df = _with_delta(df, DELTA * (1 + pl.col("train_version") - pl.col("policy_version")).sqrt())
    for scale, name in ((1, "one.parquet"), (1000, "big.parquet")):
        d = df.with_columns(pl.col("policy_version", "train_version") * scale)
        f = run_forensics(_load(tmp_path, d, name), checks=["drift"]).by_kind("drift")
        assert f is None or f.severity == "info", (scale, f.title)


def test_staleness_with_a_step_column_of_nulls_reads_as_without_steps(tmp_path):
    """A step column holding only nulls compares lags within entropy bins, as a dump
    without the column does (it read 'no cell holds >= 20 tokens')."""
    df = generate(SynthSpec(n_tokens=N_TOKENS, seed=11, staleness_gain=1.0, h_star=None))
    nulls = run_forensics(_load(tmp_path, df.with_columns(pl.lit(None, dtype=pl.Int64)
                                                          .alias("step"))),
                          checks=["staleness"]).by_kind("staleness")
    none = run_forensics(_load(tmp_path, df.drop("step"), "nostep.parquet"),
                         checks=["staleness"]).by_kind("staleness")
    assert nulls is not None and none is not None
    assert nulls.evidence["growth_per_version"] == pytest.approx(
        none.evidence["growth_per_version"], rel=1e-6)


def test_staleness_cannot_tell_without_versions(tmp_path, base):
    """Without version columns the staleness confound cannot be separated, and says so."""
    res = run_forensics(_load(tmp_path, base.drop("policy_version", "train_version")),
                        checks=["staleness"])
    st = res.status("staleness")
    assert st.status == "cannot_tell"
    assert st.reason == ("no policy_version nor train_version: staleness cannot be separated "
                         "from engine mismatch")
    # a policy_version alone: the missing column is the one named
    ds = _load(tmp_path, base.drop("train_version"), "policy_only.parquet")
    st = run_forensics(ds, checks=["staleness"]).status("staleness")
    assert st.reason.startswith("no train_version: ")
    assert ds.capabilities()["staleness"] == "no train_version: staleness analysis unavailable"


# ------------------------------------------------------------------ corrupt rows


def test_corrupt_rows_per_sequence(tmp_path):
    """Non-finite suffixes and placeholder runs are reported per sequence with examples."""
    base = generate(SynthSpec(n_tokens=N_TOKENS, seed=11, masked_share=0.0))
    n_tok = pl.len().over("seq_id")
    suf = (pl.col("seq_id") % 13 == 0) & (pl.col("position") >= n_tok - 5) & (n_tok >= 10)
    run = (pl.col("seq_id") % 17 == 1) & pl.col("position").is_between(3, 8) & (n_tok >= 10)
    df = base.with_columns(
        pl.when(suf).then(float("nan")).when(run).then(-9999.0).otherwise(IL)
        .alias("infer_logprob"))
    n_suf = base.filter(suf)["seq_id"].n_unique()
    n_run = base.filter(run)["seq_id"].n_unique()
    res = run_forensics(_load(tmp_path, df), checks=["corrupt_rows"])
    f = res.by_kind("corrupt_rows")
    assert f is not None and f.severity == "warning"
    ev = f.evidence
    assert ev["sequences_with_nonfinite_suffix"] == n_suf
    assert ev["nonfinite_suffix_tokens"] == 5 * n_suf
    assert ev["nonfinite_suffix_tokens_infer_side"] == 5 * n_suf
    assert ev["nonfinite_suffix_tokens_train_side"] == 0
    assert "trainer side in 0)" in f.message and "On the trainer side" not in f.check
    assert ev["sequences_with_placeholder_run"] == n_run
    assert ev["placeholder_tokens_in_runs"] == 6 * n_run
    assert ev["tokens_in_placeholder_runs"] == 6 * n_run
    assert ev["scattered_bad_tokens"] == 0
    assert all(int(s) % 13 == 0 for s in ev["suffix_examples_seq_id"])
    assert all(int(s) % 17 == 1 for s in ev["placeholder_run_examples_seq_id"])


def test_a_corrupt_run_in_a_handful_of_tokens_is_info(tmp_path):
    """One sequence ending in 4 non-finite engine logprobs among ~20k tokens: listed (the
    sequence named) at info, with its share, not a warning and a caveat beside the verdict
    sending the reader after a mask bug the fit does not feel."""
    base = generate(SynthSpec(n_tokens=N_TOKENS, seed=11, masked_share=0.0))
    first = base["seq_id"].min()
    n_tok = pl.len().over("seq_id")
    suf = (pl.col("seq_id") == first) & (pl.col("position") >= n_tok - 4)
    df = base.with_columns(pl.when(suf).then(float("nan")).otherwise(IL).alias("infer_logprob"))
    f = run_forensics(_load(tmp_path, df), checks=["corrupt_rows"]).by_kind("corrupt_rows")
    assert f is not None and f.severity == "info"
    assert f.evidence["sequences_with_nonfinite_suffix"] == 1
    assert f.evidence["pattern_token_share"] == pytest.approx(4 / base.height, rel=0.01)
    assert "too few to move the fit" in f.message and str(first) in f.message


def test_nonfinite_bursts_inside_sequences_are_described(tmp_path):
    """Runs of 4 -inf engine logprobs in the middle of some sequences (not their end):
    counted apart from suffixes, with examples; scattered single NaNs stay scattered."""
    base = generate(SynthSpec(n_tokens=N_TOKENS, seed=12, masked_share=0.0))
    n_tok = pl.len().over("seq_id")
    burst = (pl.col("seq_id") % 9 == 0) & pl.col("position").is_between(4, 7) & (n_tok >= 20)
    single = (pl.col("seq_id") % 9 == 4) & (pl.col("position") == 5) & (n_tok >= 20)
    df = base.with_columns(pl.when(burst).then(float("-inf")).when(single).then(float("nan"))
                           .otherwise(IL).alias("infer_logprob"))
    n_burst = base.filter(burst)["seq_id"].n_unique()
    f = run_forensics(_load(tmp_path, df), checks=["corrupt_rows"]).by_kind("corrupt_rows")
    assert f is not None
    ev = f.evidence
    assert ev["sequences_with_nonfinite_run"] == n_burst > 0
    assert ev["nonfinite_run_tokens"] == 4 * n_burst
    assert ev["tokens_in_nonfinite_runs"] == 4 * n_burst
    assert ev["sequences_with_nonfinite_suffix"] == 0
    assert ev["scattered_bad_tokens"] == base.filter(single).height
    assert all(int(x) % 9 == 0 for x in ev["nonfinite_run_examples_seq_id"])
    assert f"{n_burst} sequence(s) hold runs of >= 3 non-finite logprobs inside" in f.message


def test_nonfinite_logprobs_scattered_at_random_are_not_called_bursts(tmp_path):
    """30% of the engine logprobs NaN at random: their runs of >= 3 are as many as chance
    makes at that rate, so the finding calls them scattered (a warning, with the share and
    the runs seen against those expected), not bursts pointing at a cut span; a few real
    bursts among 0.5% scattered NaNs are still bursts."""
    base = generate(SynthSpec(n_tokens=N_TOKENS, seed=12, masked_share=0.0))
    rng = np.random.default_rng(0)
    hit = pl.Series(rng.random(base.height) < 0.3)
    df = base.with_columns(pl.when(hit).then(float("nan")).otherwise(IL).alias("infer_logprob"))
    res = run_forensics(_load(tmp_path, df), checks=["corrupt_rows"])
    f = res.by_kind("corrupt_rows")
    assert f is not None and f.severity == "warning", res.status("corrupt_rows")
    ev = f.evidence
    assert re.match(r"Scattered invalid logprobs: (29|30)\.\d% of the loss-masked", f.title)
    assert ev["nonfinite_runs_by_chance"] is True and ev["nonfinite_runs"] > 0
    # (a short sequence may end in >= 3 of them by chance: a suffix, said 'besides')
    assert ev["scattered_bad_tokens"] + ev["nonfinite_suffix_tokens"] == int(hit.sum())
    assert ("Besides: " in f.message) == (ev["sequences_with_nonfinite_suffix"] > 0)
    assert ev["scattered_token_share"] == pytest.approx(hit.mean(), abs=0.01)
    assert "no more often than chance" in f.message and "hold runs of" not in f.message
    from entr_diag.caveats import findings_caveats

    (cav,) = findings_caveats(res.to_dict())
    assert "not a pattern" in cav and "form patterns" not in cav
    # -9999 placeholders at random, 30%: their runs are chance too
    df = base.with_columns(pl.when(hit).then(-9999.0).otherwise(IL).alias("infer_logprob"))
    f = run_forensics(_load(tmp_path, df, "ph.parquet"),
                      checks=["corrupt_rows"]).by_kind("corrupt_rows")
    assert f is not None and f.title.startswith("Scattered invalid logprobs"), f.title
    assert f.evidence["placeholder_runs_by_chance"] is True
    assert "placeholder seen, about" in f.message
    # the same share concentrated in whole sequences (a third of them all -9999): fewer
    # runs than chance makes, but long ones: a pattern, not scattered
    whole = pl.col("seq_id") % 3 == 0
    df = base.with_columns(pl.when(whole).then(-9999.0).otherwise(IL).alias("infer_logprob"))
    f = run_forensics(_load(tmp_path, df, "whole.parquet"),
                      checks=["corrupt_rows"]).by_kind("corrupt_rows")
    assert f is not None and f.evidence["placeholder_runs_by_chance"] is False, f.title
    assert not f.title.startswith("Scattered")
    # real bursts (4 -inf in a row in every 9th sequence) above 0.5% scattered NaNs
    n_tok = pl.len().over("seq_id")
    burst = (pl.col("seq_id") % 9 == 0) & pl.col("position").is_between(4, 7) & (n_tok >= 20)
    few = pl.Series(rng.random(base.height) < 0.005)
    df = base.with_columns(pl.when(burst).then(float("-inf")).when(few).then(float("nan"))
                           .otherwise(IL).alias("infer_logprob"))
    f = run_forensics(_load(tmp_path, df, "bursts.parquet"),
                      checks=["corrupt_rows"]).by_kind("corrupt_rows")
    assert f is not None and f.evidence["nonfinite_runs_by_chance"] is False
    assert "hold runs of >= 3 non-finite logprobs inside" in f.message
    # one burst in one sequence, no other bad token: no chance at all
    one = burst & (pl.col("seq_id") == base.filter(burst)["seq_id"].min())
    df = base.with_columns(pl.when(one).then(float("-inf")).otherwise(IL).alias("infer_logprob"))
    f = run_forensics(_load(tmp_path, df, "one.parquet"),
                      checks=["corrupt_rows"]).by_kind("corrupt_rows")
    assert f is not None and f.evidence["sequences_with_nonfinite_run"] == 1
    assert f.evidence["nonfinite_runs_by_chance"] is False
    assert "1 sequence(s) hold runs of >= 3" in f.message


def test_both_sides_zero_runs_and_scatter_are_named_as_such(tmp_path):
    """Both logprobs exactly 0.0 (at an entropy >= 1e-3, excluded as zero_placeholder) in
    runs inside sequences, as top-p applied on both sides leaves them: the finding's title
    and message name them (zero-filled rows or one-token nuclei, delta 0 measuring no
    mismatch), not 'values no sampler logs (0.0 on one side only ...)', and its caveat
    says they measure no mismatch; scattered at random, the scattered finding says the
    same instead of blaming an overflow; one-sided -9999 runs keep the old wording."""
    from entr_diag.caveats import findings_caveats

    base = generate(SynthSpec(n_tokens=N_TOKENS, seed=11, masked_share=0.0))
    n_tok = pl.len().over("seq_id")
    run = (pl.col("seq_id") % 5 == 1) & pl.col("position").is_between(3, 8) & (n_tok >= 10) \
        & (H >= 1e-3)
    zero = [pl.when(run).then(0.0).otherwise(c).alias(c.meta.output_name()) for c in (IL, TL)]
    res = run_forensics(_load(tmp_path, base.with_columns(zero)), checks=["corrupt_rows"])
    f = res.by_kind("corrupt_rows")
    assert f is not None and f.severity == "warning"
    assert f.title.startswith("Runs of tokens with both logprobs exactly 0.0 inside the loss")
    assert f.evidence["both_zero_only"] is True
    n = f.evidence["placeholder_tokens_in_runs"]
    assert f.evidence["placeholder_run_tokens_both_zero"] == n > 0
    assert "whose logprobs are both exactly 0.0 at an entropy of 0.001 nats or more" in \
        f.message and "0.0 on one side only" not in f.message
    assert "one-token nuclei of top-p / top-k" in f.message and "top-p / top-k" in f.check
    assert "or logprobs computed in bf16 / fp16 on both sides" in f.message
    (cav,) = findings_caveats(res.to_dict())
    assert "measure no mismatch" in cav and "form patterns" not in cav
    # at random, a fifth of the rows: scattered, said to be both-zero
    rng = np.random.default_rng(0)
    hit = pl.Series(rng.random(base.height) < 0.2) & (H >= 1e-3)
    zero = [pl.when(hit).then(0.0).otherwise(c).alias(c.meta.output_name()) for c in (IL, TL)]
    res = run_forensics(_load(tmp_path, base.with_columns(zero), "zf.parquet"),
                        checks=["corrupt_rows"])
    f = res.by_kind("corrupt_rows")
    assert f is not None and f.title.startswith("Scattered invalid logprobs")
    assert "have both logprobs exactly 0.0" in f.message and "overflow" not in f.message
    (cav,) = findings_caveats(res.to_dict())
    assert "measure no mismatch" in cav and "unrelated to delta" not in cav
    # -9999 on the engine side in runs: values no sampler logs, as before
    df = base.with_columns(pl.when(run).then(-9999.0).otherwise(IL).alias("infer_logprob"))
    res = run_forensics(_load(tmp_path, df, "ph.parquet"), checks=["corrupt_rows"])
    f = res.by_kind("corrupt_rows")
    assert f is not None and f.title.startswith("Corrupt rows: whole runs")
    assert "values no sampler logs" in f.message and "both sides" not in f.message
    (cav,) = findings_caveats(res.to_dict())
    assert "form patterns" in cav


def test_trainer_side_suffix_is_described(tmp_path):
    """Null trainer logprobs at the end of some sequences (a trainer that truncated the
    response, or a forward pass that overflowed): the suffix is reported with its side,
    and the check names the trainer's causes."""
    base = generate(SynthSpec(n_tokens=N_TOKENS, seed=11, masked_share=0.0))
    n_tok = pl.len().over("seq_id")
    suf = (pl.col("seq_id") % 11 == 0) & (pl.col("position") >= n_tok - 4) & (n_tok >= 10)
    df = base.with_columns(pl.when(suf).then(None).otherwise(TL).alias("train_logprob"))
    n_suf = base.filter(suf)["seq_id"].n_unique()
    f = run_forensics(_load(tmp_path, df), checks=["corrupt_rows"]).by_kind("corrupt_rows")
    assert f is not None
    ev = f.evidence
    assert ev["sequences_with_nonfinite_suffix"] == n_suf > 0
    assert ev["nonfinite_suffix_tokens"] == ev["nonfinite_suffix_tokens_train_side"] == 4 * n_suf
    assert ev["nonfinite_suffix_tokens_infer_side"] == 0
    assert f"inference side in 0, on the trainer side in {4 * n_suf})" in f.message
    assert "On the trainer side: its maximum sequence length" in f.check


def test_scattered_dirty_rows_are_not_corrupt_runs(tmp_path):
    """Scattered bad tokens (synth dirty rows) are counted, not reported as a finding."""
    df = generate(SynthSpec(n_tokens=N_TOKENS, seed=4, dirty=True, dirty_share=0.02))
    res = run_forensics(_load(tmp_path, df), checks=["corrupt_rows"])
    assert res.findings == ()
    assert res.status("corrupt_rows").status == "clear"
    assert "scattered" in res.status("corrupt_rows").reason


# ------------------------------------------------------------------ implausible logprobs


def test_impossible_engine_logprobs_are_reported_with_their_weight_in_the_fit(tmp_path, base):
    """0.1% of engine logprobs set to -500 (valid to the loader, whose floor is -1000) are
    reported critical: count, share, sequences, share of sum delta^2, the law without them."""
    bad = pl.int_range(pl.len()) % 1000 == 7
    df = base.with_columns(pl.when(bad).then(-500.0).otherwise(IL).alias("infer_logprob"))
    planted = base.with_row_index().filter(pl.col("index") % 1000 == 7, pl.col("loss_mask"))
    ds = _load(tmp_path, df)
    assert not ds.accounting.excluded  # the loader keeps every one of them
    res = run_forensics(ds)
    f = res.findings[0]
    assert f.kind == "implausible_logprobs" and f.severity == "critical"
    ev = f.evidence
    assert ev["tokens_flagged"] == ev["tokens_infer_side"] == planted.height
    assert ev["tokens_train_side"] == 0
    assert ev["token_share_flagged"] == pytest.approx(
        planted.height / ds.accounting.tokens_valid, rel=1e-3)
    assert ev["sequences_flagged"] == planted["seq_id"].n_unique()
    assert set(ev["example_seq_ids"]) <= {str(s) for s in planted["seq_id"].to_list()}
    assert ev["infer_logprob_range_flagged"] == [-500.0, -500.0]
    assert ev["delta2_share_flagged"] > 0.99
    clean = run_forensics(_load(tmp_path, base, "clean.parquet"),
                          checks=["implausible_logprobs"])
    assert clean.status("implausible_logprobs").status == "clear"
    # without them the law is (close to) the clean run's, with them it is not
    k_clean = FX._k_fit(*(lambda b: (b["h"].to_numpy(), b["q"].to_numpy(),
                                     b["n"].to_numpy().astype(float)))(_bins_of(tmp_path, base)))
    assert ev["k_without_flagged"] == pytest.approx(k_clean, rel=0.05)
    assert ev["k_with_flagged"] > 100 * k_clean
    assert "-500" in f.message and "remove these rows" in f.check
    assert res.status("implausible_logprobs").status == "found"


def _bins_of(tmp_path, df):
    plan = FX.forensics_plan(_load(tmp_path, df, "bins.parquet"), checks=["drift"])
    from entr_diag.passes import run_pass

    run_pass(plan.ds.lf, plan.accumulators)
    plan.finish()
    return plan.ctx.bins()


@pytest.mark.parametrize(("share", "severity"),
                         [(1e-4, "info"), (0.1, "warning"), (0.9, "critical")])
def test_implausible_logprob_severity_follows_their_share_of_delta2(tmp_path, base, share,
                                                                   severity):
    """Twenty tokens at -60 nats on both sides, whose delta carries a given share of sum
    delta^2, make an info, a warning or a critical finding; the trainer side is counted."""
    s_clean = float(base.filter(pl.col("loss_mask")).select((DELTA * DELTA).sum()).item())
    n = 20
    d = math.sqrt(s_clean * share / (1 - share) / n)
    bad = pl.int_range(pl.len()) % (base.height // n) == 3
    df = base.with_columns(
        pl.when(bad).then(-60.0).otherwise(IL).alias("infer_logprob"),
        pl.when(bad).then(-60.0 + d).otherwise(TL).alias("train_logprob"))
    res = run_forensics(_load(tmp_path, df), checks=["implausible_logprobs"])
    f = res.by_kind("implausible_logprobs")
    assert f is not None and f.severity == severity
    n_bad = df.filter(bad & pl.col("loss_mask")).height
    assert f.evidence["tokens_flagged"] == f.evidence["tokens_infer_side"] == n_bad
    assert f.evidence["tokens_train_side"] == (n_bad if -60 + d < -50 else 0)
    # the bad tokens replaced a few clean ones: their share is close to the planted one
    assert f.evidence["delta2_share_flagged"] == pytest.approx(share, rel=0.1)


def test_trainer_side_impossible_logprobs_are_counted_apart(tmp_path, base):
    """A trainer logprob of -80 on tokens the engine sampled with ordinary probability is
    flagged on the trainer side, with the range of its values."""
    bad = pl.int_range(pl.len()) % 500 == 11
    df = base.with_columns(pl.when(bad).then(-80.0).otherwise(TL).alias("train_logprob"))
    res = run_forensics(_load(tmp_path, df), checks=["implausible_logprobs"])
    ev = res.by_kind("implausible_logprobs").evidence
    assert ev["tokens_train_side"] == ev["tokens_flagged"] == df.filter(
        bad & pl.col("loss_mask")).height
    assert ev["tokens_infer_side"] == 0
    assert ev["train_logprob_range_flagged"] == [-80.0, -80.0]
    assert ev["infer_logprob_range_flagged"] == []
    assert "trainer side" in res.by_kind("implausible_logprobs").message


def test_impossible_logprobs_without_entropy_name_the_metrics(tmp_path, base):
    """Without an entropy column there is no law: the finding still counts the tokens and
    says the mismatch metrics carry them (k with / without: NaN)."""
    bad = pl.int_range(pl.len()) % 1000 == 7
    df = base.drop("entropy").with_columns(
        pl.when(bad).then(-500.0).otherwise(IL).alias("infer_logprob"))
    f = run_forensics(_load(tmp_path, df), checks=["implausible_logprobs"]).findings[0]
    assert f.severity == "critical" and f.evidence["tokens_infer_side"] > 0
    assert math.isnan(f.evidence["k_with_flagged"])
    assert "the metrics describe these values" in f.message and "law" not in f.message


# ------------------------------------------------------------------ trainer floor


def test_trainer_noise_floor(tmp_path, base):
    """A recompute with 0.3x the mismatch's scale gives a delta^2 / floor^2 ratio near 11."""
    rng = np.random.default_rng(0)
    z = pl.Series(rng.standard_normal(base.height))
    df = base.with_columns((TL + z * 0.3 * (0.02 * H).sqrt()).alias("train_logprob_recompute"))
    res = run_forensics(_load(tmp_path, df), checks=["trainer_noise_floor"])
    f = res.by_kind("trainer_noise_floor")
    assert f is not None and f.severity == "info"
    ev = f.evidence
    assert ev["ratio_delta2_to_floor2"] == pytest.approx(
        ev["mean_delta2"] / ev["mean_floor2"], rel=1e-3)
    assert ev["ratio_delta2_to_floor2"] > 5
    assert res.silent


# ------------------------------------------------------------------ rendering


def _console() -> Console:
    return Console(file=io.StringIO(), width=120, color_system=None)


def _hand_made() -> Findings:
    return Findings(
        findings=(
            Finding("staleness", "info", "Stale", "grows with lag", {"growth_per_version": 1.1},
                    "the lag"),
            Finding("misalignment", "critical", "Shifted by +1", "lag +1 fits",
                    {"likely_shift": 1, "mean_abs_diff_lag0": 2.5, "ids": ["a", "b"]},
                    "slicing"),
        ),
        checks=(
            CheckStatus("misalignment", "found", "lag +1 fits 20x better"),
            CheckStatus("drift", "cannot_tell", "no step column"),
        ),
    )


def test_render_most_severe_first():
    """The rendering lists the critical finding before the info one, with evidence and checks."""
    c = _console()
    render_findings(_hand_made(), c)
    out = c.file.getvalue()
    assert out.index("CRITICAL") < out.index("INFO")
    assert "Shifted by +1" in out and "likely_shift = 1" in out and "ids = [a, b]" in out
    assert "Check: slicing" in out
    assert "cannot_tell" in out and "no step column" in out
    assert "2 finding(s), 1 above info" in out
    # a found check's status names its most severe finding's severity
    assert "found: critical" in out


def test_status_labels_name_the_most_severe_finding_of_a_check():
    """A check that found only info findings reads 'found: info' (the Forensics line calls
    it info only); one with an info and a warning finding 'found: warning'; other
    statuses as they are, in the order of the checks."""
    from entr_diag.report.terminal_findings import status_labels

    d = {"findings": [{"kind": "staleness", "severity": "info"},
                      {"kind": "drift", "severity": "info"},
                      {"kind": "drift", "severity": "warning"}],
         "checks": {"staleness": {"status": "found"}, "drift": {"status": "found"},
                    "misalignment": {"status": "clear"}, "units": {"status": "cannot_tell"},
                    "odd": {"status": "found"}}}
    assert status_labels(d) == {"staleness": "found: info", "drift": "found: warning",
                                "misalignment": "clear", "units": "cannot_tell",
                                "odd": "found"}
    assert list(status_labels(d)) == list(d["checks"])


GOLDEN = """\
Mismatch forensics: 2 finding(s), 1 above info
┏━━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━━━━━━━━┓
┃ severity ┃ finding                       ┃ evidence                 ┃
┡━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━━━━━┩
│ CRITICAL │ Shifted by +1  [misalignment] │ likely_shift = 1         │
│          │ lag +1 fits                   │ mean_abs_diff_lag0 = 2.5 │
│          │ Check: slicing                │ ids = [a, b]             │
├──────────┼───────────────────────────────┼──────────────────────────┤
│ INFO     │ Stale  [staleness]            │ growth_per_version = 1.1 │
│          │ grows with lag                │                          │
│          │ Check: the lag                │                          │
└──────────┴───────────────────────────────┴──────────────────────────┘
                     Forensic checks
 check        ┃ status          ┃ why
━━━━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━━━
 misalignment │ found: critical │ lag +1 fits 20x better
 drift        │ cannot_tell     │ no step column
"""


def test_render_golden():
    """The rendering of a fixed Findings at width 120 matches the golden text (lines
    compared without trailing spaces)."""
    c = _console()
    render_findings(_hand_made(), c)
    assert "\n".join(line.rstrip() for line in c.file.getvalue().split("\n")) == GOLDEN


def test_render_from_dict_equals_object():
    """Rendering the to_dict() gives the same text as rendering the object."""
    a, b = _console(), _console()
    render_findings(_hand_made(), a)
    render_findings(_hand_made().to_dict(), b)
    assert a.file.getvalue() == b.file.getvalue()


def test_render_keeps_brackets():
    """Reasons and messages with brackets (E[delta^2]) are printed verbatim, not as markup."""
    r = Findings(
        findings=(Finding("drift", "warning", "T [x]", "m E[delta^2] [bold]", {"a[b]": "c[d]"},
                          "k [red]"),),
        checks=(CheckStatus("truncated_sampling", "clear", "share 0.1% of E[delta^2]"),),
    )
    c = _console()
    render_findings(r, c)
    out = c.file.getvalue()
    for s in ("T [x]", "m E[delta^2] [bold]", "a[b] = c[d]", "k [red]", "of E[delta^2]"):
        assert s in out, s


def test_render_no_findings():
    """Without findings the renderer says so in one line."""
    c = _console()
    render_findings(Findings(), c)
    assert "no known cause of mismatch found" in c.file.getvalue()


def test_findings_properties():
    """worst, silent and cannot_tell summarise the result."""
    r = _hand_made()
    assert r.worst == "critical" and not r.silent
    assert [c.name for c in r.cannot_tell] == ["drift"]
    assert Findings().worst is None and Findings().silent
    assert math.isnan(FX._r(float("nan")))


# ------------------------------------------------------------------ invariances


def test_row_order_does_not_change_results(tmp_path, base):
    """Shuffling the rows of a run with findings leaves statuses and evidence unchanged."""
    df = _with_delta(base, DELTA * (1 + 0.1 * pl.col("step")))
    a = run_forensics(_load(tmp_path, df, "a.parquet")).to_dict()
    b = run_forensics(_load(tmp_path, df.sample(fraction=1.0, shuffle=True, seed=1),
                            "b.parquet")).to_dict()
    assert {k: v["status"] for k, v in a["checks"].items()} == {
        k: v["status"] for k, v in b["checks"].items()}
    assert [f["kind"] for f in a["findings"]] == [f["kind"] for f in b["findings"]]
    for fa, fb in zip(a["findings"], b["findings"], strict=True):
        for k, v in fa["evidence"].items():
            if isinstance(v, float) and "p" not in k.split("_"):
                assert fb["evidence"][k] == pytest.approx(v, rel=1e-3, abs=1e-9), k



def test_sequence_order_sorts_only_when_needed():
    """The lag checks read rows as they are when each sequence is one run of ascending
    positions, and sort by (seq_key, position) otherwise (a sequence split over two runs,
    positions out of order or repeated)."""
    def frame(keys, pos):
        return pl.DataFrame({"seq_key": keys, "position": pos, "v": list(range(len(keys)))},
                            schema={"seq_key": pl.UInt64, "position": pl.Int64, "v": pl.Int64})

    grouped = frame([5, 5, 5, 2, 2], [0, 1, 3, 0, 1])
    assert FX._by_sequence_order(grouped).collect().equals(grouped)
    for bad in (frame([5, 5, 2, 5], [0, 1, 0, 2]),  # sequence 5 in two runs
                frame([5, 5, 2], [1, 0, 0]),  # descending positions
                frame([5, 5, 2], [0, 0, 0])):  # a repeated position
        out = FX._by_sequence_order(bad).collect()
        assert out.equals(bad.sort("seq_key", "position")), bad


def test_misalignment_same_on_grouped_and_scattered_sample(base):
    """The shift test gives the same evidence on a sample whose sequences are grouped (read
    as is) and on the same rows scattered (sorted first)."""
    df = base.with_columns(pl.col("seq_id").hash().alias("seq_key"))
    shifted = df.with_columns(  # every 7th sequence shifted by one token
        pl.when(pl.col("seq_id") % 7 == 0).then(pl.col("infer_logprob").shift(1).over("seq_id"))
        .otherwise(pl.col("infer_logprob")).alias("infer_logprob")).drop_nulls("infer_logprob")
    for frame in (df, shifted):
        a = FX._misalignment(frame, 1000)
        b = FX._misalignment(frame.sample(fraction=1.0, shuffle=True, seed=3), 1000)
        assert a[0] == b[0]
        ea = a[1].evidence if a[1] is not None else {}
        eb = b[1].evidence if b[1] is not None else {}
        assert ea.keys() == eb.keys()
        for k, v in ea.items():
            if isinstance(v, float):
                assert eb[k] == pytest.approx(v, rel=1e-9, abs=1e-12), k
            elif k != "example_seq_ids":
                assert eb[k] == v, k
    assert FX._misalignment(shifted, 1000)[1] is not None  # (the planted shift is found)

def test_freshest_staleness_is_the_smallest_non_negative_lag():
    """The engine-side checks read the freshest tokens: the smallest lag >= 0, never a
    negative one (swapped version columns); all negative: the smallest; all null: None."""
    assert FX._freshest(pl.Series([-1, 0, 2, None])) == 0
    assert FX._freshest(pl.Series([-1000, 1000, 2000])) == 1000
    assert FX._freshest(pl.Series([-3, -1])) == -3
    assert FX._freshest(pl.Series([None, None], dtype=pl.Int64)) is None

def test_nested_layout_matches_long(tmp_path):
    """The same synthetic run in the nested layout gives the same statuses as the long one."""
    from entr_diag.synth import write_synth

    spec = SynthSpec(n_tokens=N_TOKENS, seed=7)
    pl_, pn = tmp_path / "long.parquet", tmp_path / "nested.parquet"
    write_synth(pl_, spec, layout="long")
    write_synth(pn, spec, layout="nested")
    a = run_forensics(load_dataset([pl_]))
    b = run_forensics(load_dataset([pn]))
    assert a.silent and b.silent
    assert [(c.name, c.status) for c in a.checks] == [(c.name, c.status) for c in b.checks]


def test_without_entropy_cannot_tell(tmp_path, base):
    """Without entropy the entropy-bound checks say so; the others still run."""
    res = run_forensics(_load(tmp_path, base.drop("entropy")))
    st = {c.name: c for c in res.checks}
    assert st["truncated_sampling"].status == "cannot_tell"
    assert st["drift"].status == "cannot_tell" and "entropy" in st["drift"].reason
    assert st["misalignment"].status == "clear"
    assert st["one_sided_temperature"].status == "clear"
    assert res.silent


def test_tiny_input_cannot_tell(tmp_path):
    """Five tokens: every statistical check says it cannot tell, nothing raises."""
    df = pl.DataFrame({
        "seq_id": [1, 1, 1, 2, 2], "position": [0, 1, 2, 0, 1], "step": [3] * 5,
        "train_logprob": [-0.1, -0.2, -0.3, -1.0, -2.0],
        "infer_logprob": [-0.12, -0.19, -0.35, -1.1, -1.9],
        "entropy": [0.5, 0.4, 0.3, 1.2, 2.0], "policy_version": [1, 1, 2, 0, 0],
        "train_version": [2] * 5,
    })
    res = run_forensics(_load(tmp_path, df))
    st = {c.name: c.status for c in res.checks}
    for name in ("misalignment", "one_sided_temperature", "truncated_sampling",
                 "sequence_outliers", "drift", "staleness"):
        assert st[name] == "cannot_tell", name
    assert res.findings == ()


# ------------------------------------------------------------------ bundled sample


def _sample_path() -> Path:
    return Path(FX.__file__).parent / "sample_data" / "sample_run_long.parquet"


@pytest.mark.parametrize("kind", ["misalignment", "one_sided_temperature", "truncated_sampling"])
def test_bundled_sample_with_planted_defect(tmp_path, kind):
    """Real logprobs (bf16 engine, fp32 trainer) with a defect planted are caught too."""
    if not _sample_path().is_file():
        pytest.skip("bundled sample run not generated yet")
    df = pl.read_parquet(_sample_path())
    df = {
        "misalignment": lambda: df.with_columns(IL.shift(1).over("seq_id", order_by="position")),
        "one_sided_temperature": lambda: df.with_columns(IL * 1.15 - 0.02 * H),
        "truncated_sampling": lambda: df.with_columns(
            (IL + pl.min_horizontal(0.05 * H, -IL * 0.99)).alias("infer_logprob")),
    }[kind]()
    res = run_forensics(_load(tmp_path, df))
    assert res.findings[0].kind == kind
    assert res.findings[0].severity in ("warning", "critical")


def test_bundled_sample_run_is_silent():
    """On the bundled real sample run (bf16 engine, fp32 trainer, version lag) nothing is above info."""
    p = _sample_path()
    if not p.is_file():
        pytest.skip("bundled sample run not generated yet")
    res = run_forensics(load_dataset([p]))
    assert res.silent, [(f.kind, f.title) for f in res.findings]
    assert res.status("misalignment").status == "clear"


# ------------------------------------------------------------------ plan (one pass)


def _same(a, b, path=""):
    """Equal up to float summation order (rel 1e-9)."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            _same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and not math.isnan(a):
        assert b == pytest.approx(a, rel=1e-9, abs=1e-12), path
    elif isinstance(a, float):
        assert math.isnan(b), path
    else:
        assert a == b, path


@pytest.mark.parametrize("case", ["outliers", "corrupt", "implausible", "mask_start"])
def test_plan_does_not_depend_on_batch_size(tmp_path, case):
    """The forensics plan gives the same findings whether its token and raw passes cut the
    frames into small batches (sequences split across batches) or read them whole."""
    from entr_diag.passes import run_pass

    if case == "mask_start":
        b = generate(SynthSpec(n_tokens=20_000, seed=3, h_star=None))
        df = _teacher_forced(b, _early_masked(0.15), 0.5)
    elif case == "outliers":
        b = generate(SynthSpec(n_tokens=20_000, seed=3))
        df = _with_delta(b, pl.when(pl.col("seq_id") % 41 == 0).then(DELTA * 6).otherwise(DELTA))
    elif case == "implausible":
        b = generate(SynthSpec(n_tokens=20_000, seed=3))
        i = pl.int_range(pl.len())
        df = b.with_columns(pl.when(i % 301 == 5).then(-300.0 - i % 11).otherwise(IL)
                            .alias("infer_logprob"),
                            pl.when(i % 499 == 9).then(-70.0).otherwise(TL).alias("train_logprob"))
    else:
        b = generate(SynthSpec(n_tokens=6_000, seed=3, masked_share=0.0))
        n_tok = pl.len().over("seq_id")
        df = b.with_columns(
            pl.when((pl.col("seq_id") % 5 == 0) & (pl.col("position") >= n_tok - 4))
            .then(float("nan"))
            .when((pl.col("seq_id") % 3 == 1) & pl.col("position").is_between(2, 6))
            .then(0.0).otherwise(IL).alias("infer_logprob"))
    ds = _load(tmp_path, df)
    out = []
    for chunk in (97, 1_000_000):
        FX._MISALIGN_LAST.clear()
        plan = FX.forensics_plan(ds)
        run_pass(ds.lf, plan.accumulators, chunk_size=chunk)
        run_pass(ds.raw, plan.raw_accumulators, chunk_size=chunk)
        plan.raw_done = True
        out.append(plan.finish().to_dict())
    _same(out[0], out[1])
    FX._MISALIGN_LAST.clear()
    _same(out[0], run_forensics(ds).to_dict())
    ev = {f["kind"]: f["evidence"] for f in out[0]["findings"]}
    if case == "corrupt":
        assert ev["corrupt_rows"]["sequences_with_nonfinite_suffix"] > 0
        assert ev["corrupt_rows"]["sequences_with_placeholder_run"] > 0
    elif case == "mask_start":
        assert ev["mask_start_surprisal"]["cause"] == "prompt_in_mask"
    elif case == "implausible":
        e = ev["implausible_logprobs"]
        assert e["tokens_infer_side"] > 0 and e["tokens_train_side"] > 0
        lo, hi = e["infer_logprob_range_flagged"]
        assert -310 <= lo < hi <= -300
    else:
        assert ev["sequence_outliers"]["sequences_flagged"] > 0
        # no excluded row in the accounting: no raw pass at all
        assert not ds.accounting.excluded and FX.forensics_plan(ds).raw_accumulators == []


def _frames_close(a: pl.DataFrame, b: pl.DataFrame, keys: list[str]) -> None:
    """Two tables with the same rows (sorted by ``keys``; floats up to summation order)."""
    a, b = a.sort(keys), b.sort(keys)
    assert a.columns == b.columns and a.height == b.height
    for c in a.columns:
        if a[c].dtype.is_float():
            np.testing.assert_allclose(a[c].to_numpy(), b[c].to_numpy(), rtol=1e-9, atol=1e-12)
        else:
            assert a[c].to_list() == b[c].to_list(), c


def test_dense_sums_equal_group_by_tables(tmp_path, monkeypatch):
    """The token tables are the same whether the batches are reduced with numpy on the dense
    layout of the accounting, every other batch takes the group-by path (a batch with a
    null or a key the accounting did not list), or all use group-bys (no layout)."""
    import dataclasses

    from entr_diag.passes import run_pass

    b = generate(SynthSpec(n_tokens=20_000, seed=3))
    ds = _load(tmp_path, _with_delta(
        b, pl.when(pl.col("seq_id") % 41 == 0).then(DELTA * 6).otherwise(DELTA)))
    no_layout = dataclasses.replace(
        ds, accounting=dataclasses.replace(ds.accounting, steps=None))

    def tables(d, fallback_every=0):
        FX._MISALIGN_LAST.clear()
        plan = FX.forensics_plan(d)
        assert (plan._dense is None) == (d is no_layout)
        calls = iter(range(10**6))
        if fallback_every:
            real = FX.has_nulls
            monkeypatch.setattr(FX, "has_nulls", lambda batch, cols: (
                next(calls) % fallback_every == 0 or real(batch, cols)))
        run_pass(d.lf, plan.accumulators, chunk_size=997)
        monkeypatch.undo()
        res = plan.finish().to_dict()
        ctx = plan.ctx
        seqbins = ctx.seqbins.group_by("seq_key", "bin", "_stale").agg(
            pl.col("n").cast(pl.Int64).sum(), pl.col("sh", "sd2").sum()).with_columns(
            pl.col("bin").cast(pl.Int32), pl.col("_stale").cast(pl.Int64))
        return res, ctx.cells, ctx.blocks, seqbins, ctx.seqs

    ref = tables(ds)
    assert ref[0]["checks"]["sequence_outliers"]["status"] == "found"
    for other in (tables(ds, fallback_every=2), tables(no_layout)):
        _same(ref[0], other[0])
        for t, o, keys in zip(ref[1:], other[1:], (
                ["bin", "_step", "_stale"], ["bin", "block", "_stale"],
                ["seq_key", "bin", "_stale"], ["seq_key"]), strict=True):
            _frames_close(t, o.select(t.columns), keys)


def test_fit_verdict_carries_a_caveat_when_impossible_logprobs_bias_the_law(tmp_path, base):
    """fit's verdict (terminal and JSON) gets a caveat naming the implausible_logprobs
    finding when it is a warning or critical; none for a clean run or an info finding."""
    from typer.testing import CliRunner

    from entr_diag.caveats import implausible_caveat
    from entr_diag.cli import app

    bad = pl.int_range(pl.len()) % 1000 == 7
    df = base.with_columns(pl.when(bad).then(-500.0).otherwise(IL).alias("infer_logprob"))
    path = tmp_path / "run.parquet"
    df.write_parquet(path)
    out = tmp_path / "fit.json"
    r = CliRunner().invoke(app, ["fit", str(path), "--n-boot", "100", "-q", "--json", str(out)])
    assert r.exit_code == 0, r.output
    caveat = json.loads(out.read_text())["verdict"]["caveat"]
    assert "impossible logprob (at or below -50 nats)" in caveat and "the law describes them" in caveat
    assert "forensics: implausible_logprobs" in r.output
    info = {"findings": [{"kind": "implausible_logprobs", "severity": "info", "title": "t"}]}
    assert implausible_caveat(info) is None and implausible_caveat(None) is None
    warn = {"findings": [{"kind": "implausible_logprobs", "severity": "warning", "title": "t"}]}
    assert implausible_caveat(warn).startswith("caveat: t: the finding gives the law with "
                                               "and without them")


def test_fit_verdict_carries_a_caveat_per_warning_finding(tmp_path, base):
    """A finding at warning level that distorts the law (here engine-side truncation, whose
    bias reads as a steeper law) puts a caveat naming it beside fit's verdict (JSON and
    terminal); info findings and the kinds with caveats of their own do not."""
    from typer.testing import CliRunner

    from entr_diag.caveats import findings_caveats
    from entr_diag.cli import app

    g = pl.min_horizontal(0.08 * H, -IL * 0.99)
    path = tmp_path / "run.parquet"
    base.with_columns((IL + g).alias("infer_logprob")).write_parquet(path)
    out = tmp_path / "fit.json"
    r = CliRunner().invoke(app, ["fit", str(path), "--n-boot", "100", "-q", "--json", str(out)])
    assert r.exit_code == 0, r.output
    caveats = json.loads(out.read_text())["verdict"]["caveats"]
    trunc = [c for c in caveats if "[truncated_sampling]" in c]
    assert len(trunc) == 1 and "the law's k and alpha, and any H* and noise regime" in trunc[0]
    assert "[truncated_sampling]" in r.output
    clean = tmp_path / "clean.parquet"
    base.write_parquet(clean)
    out2 = tmp_path / "clean.json"
    r = CliRunner().invoke(app, ["fit", str(clean), "--n-boot", "100", "-q", "--json", str(out2)])
    assert r.exit_code == 0, r.output
    assert not any("[" in c for c in json.loads(out2.read_text())["verdict"]["caveats"])
    fs = {"findings": [
        {"kind": "drift", "severity": "warning", "title": "Drift x2"},
        {"kind": "staleness", "severity": "info", "title": "Stale"},
        {"kind": "implausible_logprobs", "severity": "critical", "title": "Bad"},
        {"kind": "misalignment", "severity": "critical", "title": "Shift"},
        {"kind": "new_kind", "severity": "critical", "title": "New"}]}
    assert findings_caveats(fs) == [
        "caveat: Drift x2 [drift]: the mismatch changes over the run: the pooled law averages "
        "it (read the strata per step range).",
        "caveat: New [new_kind]: read the finding before the law."]
    assert findings_caveats(None) == []


def _entropy_run(kind: str, n_seq: int = 200, seq_len: int = 100, vocab: int = 128,
                 seed: int = 1) -> pl.DataFrame:
    """Toy softmaxes whose logs are consistent (``clean``), or whose engine sampled at T =
    0.4 but logged the logprobs and entropy of T = 1 (``raw_temperature``), or whose
    entropy sums -p log p over the 5 most likely tokens only (``topk_entropy``)."""
    rng = np.random.default_rng(seed)
    n = n_seq * seq_len
    z = rng.standard_normal((n, vocab)) * np.exp(rng.uniform(np.log(0.3), np.log(8.0), n))[:, None]

    def lsm(x):
        m = x.max(1, keepdims=True)
        return x - m - np.log(np.exp(x - m).sum(1, keepdims=True))

    lp = lsm(z)
    lp_eng = lsm(z + rng.standard_normal(z.shape) * 0.01)
    p_sample = np.exp(lsm(z / 0.4) if kind == "raw_temperature" else lp_eng)
    y = np.minimum((np.cumsum(p_sample, 1) < rng.random(n)[:, None]).sum(1), vocab - 1)
    p = np.exp(lp_eng)
    terms = -(p * lp_eng)
    if kind == "topk_entropy":
        terms = np.where(lp_eng >= np.sort(lp_eng, 1)[:, -5][:, None], terms, 0.0)
    idx = np.arange(n)
    return pl.DataFrame({
        "seq_id": idx // seq_len, "position": idx % seq_len, "step": idx // seq_len % 4,
        "train_logprob": lp[idx, y], "infer_logprob": np.minimum(lp_eng[idx, y], 0.0),
        "entropy": terms.sum(1)})


@pytest.mark.parametrize("kind,side", [("raw_temperature", "less surprising"),
                                       ("topk_entropy", "more surprising"), ("clean", None)])
def test_entropy_not_of_the_sampling_distribution_is_named(tmp_path, kind, side):
    """The sampled tokens' surprisal is their entropy on average (E[-log mu(y)] = H(mu)):
    an engine that sampled at T = 0.4 but logged T = 1 values, or an entropy over the top
    5 tokens only, move the binned ratio beyond a factor 1.18 of 1 with no unit signature, and
    fit names it (JSON units.entropy_mismatch, a warning, a caveat beside the verdict);
    consistent logs do not."""
    from typer.testing import CliRunner

    from entr_diag.cli import app

    path = tmp_path / "run.parquet"
    _entropy_run(kind).write_parquet(path)
    out = tmp_path / "fit.json"
    r = CliRunner().invoke(app, ["fit", str(path), "--n-boot", "100", "-q", "--json", str(out)])
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    u = doc["units"]
    assert u["likely_mistake"] is None and u["other_token"] is None
    assert u["entropy_mismatch"] is (side is not None), u["ratio_binned"]
    named = [c for c in doc["verdict"]["caveats"] if "do not describe one sampling" in c]
    if side is None:
        assert 0.9 < u["ratio_binned"] < 1.1 and not named
    else:
        assert len(named) == 1 and side in named[0]
        assert "warning: entropy and infer_logprob do not describe one sampling" in r.output


def test_temperature_and_truncation_defer_to_a_logprob_unit_mistake(tmp_path, base):
    """infer_logprob in log10 scales like a temperature (slope ln 10) and shifts delta one
    way: with the units check naming it, fit reports those two findings as info pointing at
    it, and no caveat of theirs beside the verdict (the units caveat is there)."""
    from typer.testing import CliRunner

    from entr_diag.cli import app

    path = tmp_path / "run.parquet"
    base.with_columns(IL / math.log(10)).write_parquet(path)
    out = tmp_path / "fit.json"
    r = CliRunner().invoke(app, ["fit", str(path), "--n-boot", "100", "-q", "--json", str(out)])
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    assert doc["units"]["likely_mistake"] == "infer_logprob_log10"
    by = {f["kind"]: f for f in doc["forensics"]["findings"]}
    assert by["one_sided_temperature"]["severity"] == "info"
    assert "the units check finds infer_logprob in log10 values" in by[
        "one_sided_temperature"]["message"]
    for f in by.values():
        assert f["severity"] == "info" or f["kind"] not in ("one_sided_temperature",
                                                            "truncated_sampling")
    caveats = doc["verdict"]["caveats"]
    assert any("log10 values, not nats" in c for c in caveats)
    # delta mixes two units: the verdict says it cannot be read, up front (helper-29 F6)
    assert doc["verdict"]["assessable"] is False
    assert doc["verdict"]["text"].startswith(
        "not assessable (infer_logprob probably holds log10 values, not nats, and the other "
        "logprob column nats: delta mixes two units: see the caveat); as computed: ")
    assert not any("[one_sided_temperature]" in c or "[truncated_sampling]" in c
                   for c in caveats)
    assert "No units check ran here" not in by["one_sided_temperature"]["message"]
    # without the fit (inspect, run_forensics): a warning pointing at fit's units check
    t = run_forensics(load_dataset([path]), checks=["one_sided_temperature"]).by_kind(
        "one_sided_temperature")
    assert t.severity == "warning" and "No units check ran here" in t.message


def test_a_shift_let_through_gets_no_entropy_mismatch_caveat(tmp_path):
    """Logprobs shifted by one token also move the surprisal / entropy ratio: with
    --allow-misaligned the shift's caveat stands alone, without a second story blaming a
    temperature or top-p (nor a warning saying so)."""
    from typer.testing import CliRunner

    from entr_diag.cli import app

    df = _entropy_run("clean").with_columns(
        pl.col("infer_logprob").shift(1).over("seq_id", order_by="position").alias("sh"))
    df = df.with_columns(pl.coalesce("sh", "infer_logprob").alias("infer_logprob")).drop("sh")
    path = tmp_path / "run.parquet"
    df.write_parquet(path)
    out = tmp_path / "fit.json"
    r = CliRunner().invoke(app, ["fit", str(path), "--n-boot", "100", "-q", "--json", str(out),
                                 "--allow-misaligned"])
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    assert doc["units"]["entropy_mismatch"] is True  # the check itself still says so
    assert any("shifted" in c for c in doc["verdict"]["caveats"])
    assert "do not describe one sampling" not in r.output
    assert not any("do not describe one sampling" in c for c in doc["verdict"]["caveats"])


def test_a_logprob_of_exactly_minus_50_is_flagged(tmp_path, base):
    """A clamp at exactly -50 nats is as impossible a sampled-token logprob as one below."""
    bad = pl.int_range(pl.len()) % 500 == 5
    df = base.with_columns(pl.when(bad).then(-50.0).otherwise(IL).alias("infer_logprob"))
    res = run_forensics(_load(tmp_path, df), checks=["implausible_logprobs"])
    ev = res.by_kind("implausible_logprobs").evidence
    assert ev["tokens_infer_side"] == df.filter(bad & pl.col("loss_mask")).height > 0
    assert ev["infer_logprob_range_flagged"] == [-50.0, -50.0]


def test_rounded_logprobs_are_found_by_their_step(base):
    """Logprobs written rounded to a decimal step are named with the step (the coarsest
    grid holding 90% of the values), float32 storage included; full-precision ones, and
    too few values, are not."""
    from entr_diag.forensics import rounded_logprobs

    assert rounded_logprobs(base) is None
    r2 = base.with_columns(TL.round(2), IL.round(2))
    assert rounded_logprobs(r2) == {"train_logprob": 0.01, "infer_logprob": 0.01}
    one = base.with_columns(IL.round(3).cast(pl.Float32))
    assert rounded_logprobs(one) == {"infer_logprob": 0.001}
    assert rounded_logprobs(base.with_columns(TL.round(0))) == {"train_logprob": 1.0}
    assert rounded_logprobs(r2.head(100)) is None


def _to_bf16(x: pl.Expr) -> pl.Expr:
    """float32 values rounded to the nearest bf16 (ties to even), kept as float32."""
    def rnd(s: pl.Series) -> pl.Series:
        u = s.cast(pl.Float32).to_numpy().view(np.uint32).astype(np.uint64)
        r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16).astype(np.uint32)
        return pl.Series(s.name, r.view(np.float32))
    return x.map_batches(rnd, return_dtype=pl.Float32)


def test_storage_precision_names_bf16_and_fp16_columns_and_their_share(base):
    """Logprob columns stored in bf16 or fp16 are named with their format; the rounding's
    estimated share of mean delta^2 by entropy decile is s^2/12 per stored column over the
    decile's mean delta^2 (s the grid's spacing at each value), and ``distorts`` from 20%
    in one decile; float32 / float64 columns, decimal-rounded ones skipped, and too few
    values give None."""
    from entr_diag.forensics import STORAGE_SHARE_MIN, storage_precision

    assert storage_precision(base) is None
    assert storage_precision(base.with_columns(TL.cast(pl.Float32), IL.cast(pl.Float32))) \
        is None
    bf = base.with_columns(_to_bf16(TL).alias("train_logprob"),
                           _to_bf16(IL).alias("infer_logprob"))
    assert (bf["train_logprob"] - base["train_logprob"]).abs().max() > 0
    r = storage_precision(bf)
    assert r["columns"] == {"train_logprob": "bf16", "infer_logprob": "bf16"}
    assert len(r["by_entropy"]) == 10 and sum(b["tokens"] for b in r["by_entropy"]) == bf.height
    # the share by hand, in the highest-entropy decile
    t, i = (bf[c].cast(pl.Float64).to_numpy() for c in ("train_logprob", "infer_logprob"))
    h = bf["entropy"].to_numpy()
    top = np.argsort(h, kind="stable")[-(bf.height - 9 * (bf.height // 10)):]

    def sp(x):
        return np.where(x != 0, 2.0 ** (np.floor(np.log2(np.abs(np.where(x != 0, x, 1.0))))
                                         - 7), 0.0)
    want = np.sum((sp(t[top]) ** 2 + sp(i[top]) ** 2) / 12) / np.sum((t[top] - i[top]) ** 2)
    assert r["by_entropy"][-1]["share"] == pytest.approx(want, rel=1e-3)
    assert r["distorts"] == (r["max_share"] >= STORAGE_SHARE_MIN)
    # a delta 100 times wider: the same rounding is a small share of it
    wide = base.with_columns((IL + 10 * (TL - IL)).clip(upper_bound=-1e-6)
                             .alias("train_logprob"))
    wide = wide.with_columns(_to_bf16(TL).alias("train_logprob"))
    r = storage_precision(wide)
    assert r["columns"] == {"train_logprob": "bf16"} and r["distorts"] is False
    fp = base.with_columns(IL.cast(pl.Float16).cast(pl.Float32)
                           if hasattr(pl, "Float16") else
                           pl.Series("infer_logprob", base["infer_logprob"].to_numpy()
                                     .astype(np.float16).astype(np.float32)))
    assert storage_precision(fp)["columns"] == {"infer_logprob": "fp16"}
    assert storage_precision(bf, skip=("train_logprob", "infer_logprob")) is None
    assert storage_precision(bf.head(100)) is None
    # near-certain tokens (both 0.0, H below the law's range) on a fifth of the rows: no
    # decile of delta = 0 reads as 'rounding is all of it' (it read inf, and warned)
    sure = pl.int_range(pl.len()) % 5 == 0
    quiet = wide.with_columns(
        pl.when(sure).then(0.0).otherwise(c).alias(c) for c in ("train_logprob",
                                                                  "infer_logprob")
    ).with_columns(pl.when(sure).then(1e-7).otherwise(H).alias("entropy"))
    r = storage_precision(quiet)
    assert r["distorts"] is False and math.isfinite(r["max_share"])
    assert all(not math.isinf(b["share"]) for b in r["by_entropy"])
    # float32 logit - logsumexp: near-certain values are small multiples of 2^-19, on the
    # bf16 grid unrounded; the format is judged on |logprob| >= 0.1 only
    rng = np.random.default_rng(5)
    lp = base["train_logprob"].to_numpy().astype(np.float32).copy()
    near = rng.random(lp.size) < 0.95
    lp[near] = -rng.integers(1, 250, near.sum()) * 2.0 ** -19
    fused = base.with_columns(pl.Series("train_logprob", lp))
    assert storage_precision(fused) is None


def test_logprobs_stored_in_bf16_are_warned_about_when_the_rounding_distorts(tmp_path):
    """A run with a small mismatch whose logprobs are stored in bf16 on both sides: a
    warning and a caveat beside the verdict name the columns, the format and the deciles
    where the rounding makes up 20% or more of mean delta^2 (JSON storage_precision); the
    bundled run, whose engine logprobs are bf16 (at most 10% of a decile), gets the JSON
    only."""
    from typer.testing import CliRunner

    from entr_diag.cli import app

    df = generate(SynthSpec(n_tokens=60_000, seed=4, k=1e-4, noise_share=0.0))
    p = tmp_path / "bf16.parquet"
    df.with_columns(_to_bf16(TL).alias("train_logprob"),
                    _to_bf16(IL).alias("infer_logprob")).write_parquet(p)
    js = tmp_path / "f.json"
    r = CliRunner().invoke(app, ["fit", str(p), "-q", "--n-boot", "100", "--json", str(js)])
    assert r.exit_code == 0, r.output
    err = " ".join(r.stderr.split())
    assert ("warning: train_logprob and infer_logprob are stored in bf16 (8 significant "
            "bits, a spacing of 2^-8 to 2^-7 of |logprob|): the rounding alone makes up an "
            "estimated ") in err, err
    doc = json.loads(js.read_text())
    st = doc["storage_precision"]
    assert st["distorts"] is True and st["columns"]["infer_logprob"] == "bf16"
    assert any(c.startswith("caveat: train_logprob and infer_logprob are stored in bf16")
               for c in doc["verdict"]["caveats"])
    big = max(st["by_entropy"], key=lambda b: b["share"])
    assert f"{min(big['share'], 0.99):.0%}" in err
    r = CliRunner().invoke(app, ["fit", "-q", "--n-boot", "100", "--json", str(js)])
    assert r.exit_code == 0 and "bf16" not in r.stderr, r.output
    st = json.loads(js.read_text())["storage_precision"]
    assert st["columns"] == {"infer_logprob": "bf16"} and st["distorts"] is False


@pytest.mark.parametrize("max_values", [400_000, 300])
def test_rounding_by_file_equals_the_check_of_each_file(base, monkeypatch, max_values):
    """The per-file rounding check (all files at once) names what rounded_logprobs says of
    each file's own rows: files rounded to different steps, float32 storage, one file too
    small to judge, full-precision files; with and without the strided subsample; files
    in order of their first row. None when every file is rounded alike."""
    from entr_diag.forensics import _rounded_by_file, rounded_logprobs
    from entr_diag.passes import FILE_INDEX

    monkeypatch.setattr(FX, "ROUNDED_MAX_VALUES", max_values)
    n = base.height
    fi = pl.Series(FILE_INDEX, np.random.default_rng(3).integers(0, 6, n) % 6, dtype=pl.UInt32)
    f = pl.col(FILE_INDEX)
    df = base.with_columns(fi).with_columns(
        pl.when(f == 1).then(TL.round(2)).when(f == 3).then(TL.round(0))
        .otherwise(TL).alias("train_logprob"),
        pl.when(f == 1).then(IL.round(2)).when(f == 4).then(IL.round(3).cast(pl.Float32))
        .otherwise(IL).alias("infer_logprob"))
    df = pl.concat([df.filter(f != 5), df.filter(f == 5).head(50)])  # file 5: too few
    paths = [f"part-{i}.parquet" for i in range(6)]
    want = {}
    for i in df[FILE_INDEX].unique(maintain_order=True).to_list():
        r = rounded_logprobs(df.filter(f == i))
        if r:
            want[paths[i]] = r
    assert sorted(want) == ["part-1.parquet", "part-3.parquet", "part-4.parquet"]
    assert df.filter(f == 0).height > 3 * 300  # (the subsample is taken within files)
    got = _rounded_by_file(df, paths)
    assert got == want and list(got) == list(want)
    alike = base.with_columns(TL.round(2), fi)
    assert _rounded_by_file(alike, paths) is None


def test_rounding_is_judged_on_a_strided_subsample(base, monkeypatch):
    """Past ROUNDED_MAX_VALUES values the share is taken on an even subsample: the same
    verdicts (a rounded column named, a full-precision one not); a column without a
    non-zero value (nothing to subsample) is no finding."""
    from entr_diag.forensics import rounded_logprobs

    monkeypatch.setattr(FX, "ROUNDED_MAX_VALUES", 300)
    assert base.height > 3 * 300
    assert rounded_logprobs(base) is None
    half = base.with_columns(TL.round(1))
    assert rounded_logprobs(half) == {"train_logprob": 0.1}
    assert rounded_logprobs(base.with_columns(TL * 0, IL * 0)) is None


def test_tiny_values_say_nothing_of_a_rounding_grid(base):
    """Probabilities below 1e-4 read as logprobs sit within the tolerance of 0 on every
    grid: they are not taken for logprobs rounded to 1 nat."""
    from entr_diag.forensics import rounded_logprobs

    tiny = base.with_columns(IL.abs().clip(1e-9, 1.0) * -1e-5)
    assert rounded_logprobs(tiny) is None


def test_fit_warns_about_a_logprob_of_another_token(tmp_path):
    """`fit` on engine logprobs gathered at token_id + 1: a warning and the verdict's caveat
    name the column (exit 0: the results are shown, under the caveat)."""
    from typer.testing import CliRunner

    from entr_diag.cli import app

    p = tmp_path / "wrong.parquet"
    _logit_run("wrong_id", n_seq=120).write_parquet(p)
    js = tmp_path / "f.json"
    r = CliRunner().invoke(app, ["fit", str(p), "--n-boot", "100", "-q", "--json", str(js)])
    assert r.exit_code == 0, r.output
    err = " ".join(r.stderr.split())
    assert "warning: infer_logprob does not look like the logprob of the sampled token" in err
    doc = json.loads(js.read_text())
    assert doc["units"]["other_token"] == "infer_logprob"
    assert doc["verdict"]["caveats"][0].startswith(
        "caveat: infer_logprob does not look like the logprob of the sampled token")


@pytest.mark.parametrize("col,value", [("train_logprob", 1e-5), ("infer_logprob", 1e-5),
                                       ("train_logprob", -1e-5)])
def test_fit_warns_about_a_constant_logprob_column(tmp_path, col, value):
    """A logprob column holding one constant near 0 (valid: just above 0 is fp32 rounding,
    kept), a filler rather than the sampled token's logprob, is named like another token's
    logprob: a mean surprisal of 0 or less is no sampled token's, and a constant follows no
    token (it passed silently at +1e-5). The other column stays unnamed."""
    from typer.testing import CliRunner

    from entr_diag.cli import app
    from entr_diag.io.load import bundled_sample_path

    p = tmp_path / "const.parquet"
    pl.read_parquet(bundled_sample_path()).with_columns(pl.lit(value).alias(col)).write_parquet(p)
    js = tmp_path / "f.json"
    r = CliRunner().invoke(app, ["fit", str(p), "--n-boot", "100", "-q", "--json", str(js)])
    assert r.exit_code == 0, r.output
    doc = json.loads(js.read_text())
    assert doc["units"]["other_token"] == col
    assert abs(doc["units"]["within_bin_corr"]) < 0.01
    err = " ".join(r.stderr.split())
    assert f"warning: {col} does not look like the logprob of the sampled token" in err, err
    if value > 0:
        assert "no sampled token's logprob averages 0 or more" in err


def test_one_shard_with_another_tokens_logprob_is_named(tmp_path):
    """One shard of eight (3,000 tokens, below the units check's 20,000 per file) whose
    engine logprobs were gathered at token_id + 1: the pooled columns differ too little to
    tell, that file's own check names it (warning, caveat, JSON units_by_file)."""
    from typer.testing import CliRunner

    from entr_diag.cli import app

    clean, wrong = _logit_run("clean"), _logit_run("wrong_id")
    d = tmp_path / "shards"
    d.mkdir()
    for step in range(8):
        src = wrong if step == 3 else clean
        src.filter(pl.col("step") == step).write_parquet(d / f"step_{step}.parquet")
    js = tmp_path / "f.json"
    r = CliRunner().invoke(app, ["fit", str(d), "--n-boot", "100", "-q", "--json", str(js)])
    assert r.exit_code == 0, r.output
    doc = json.loads(js.read_text())
    assert doc["units"]["other_token"] is None
    (only,) = doc["units_by_file"]
    assert only["file"] == str(d / "step_3.parquet") and only["other_token"] == "infer_logprob"
    err = " ".join(r.stderr.split())
    assert (f"warning: 1 of the 8 input files looks to hold another token's logprob, unlike the "
            f"others: in {d / 'step_3.parquet'} (3,000 tokens), infer_logprob does not look "
            "like the logprob of the sampled token") in err, err
    assert any("another token's logprob" in c for c in doc["verdict"]["caveats"])


def test_shards_with_another_tokens_logprob_are_named_beside_the_pooled_warning(tmp_path):
    """Three shards of eight gathered at token_id + 1: the pooled check names the column,
    and the per-file check the three files (3,000 tokens each: too few for a unit
    signature, whose window token_id + 1 can fall in, enough for the other-token check)."""
    from typer.testing import CliRunner

    from entr_diag.cli import app

    clean, wrong = _logit_run("clean"), _logit_run("wrong_id")
    d = tmp_path / "shards"
    d.mkdir()
    for step in range(8):
        src = wrong if step >= 5 else clean
        src.filter(pl.col("step") == step).write_parquet(d / f"step_{step}.parquet")
    js = tmp_path / "f.json"
    r = CliRunner().invoke(app, ["fit", str(d), "--n-boot", "100", "-q", "--json", str(js)])
    assert r.exit_code == 0, r.output
    doc = json.loads(js.read_text())
    assert doc["units"]["other_token"] == "infer_logprob"
    assert [u["file"] for u in doc["units_by_file"]] == [
        str(d / f"step_{s}.parquet") for s in (5, 6, 7)]
    assert all(u["other_token"] == "infer_logprob" and u["likely_mistake"] is None
               for u in doc["units_by_file"])
    assert "3 of the 8 input files look to hold another token's logprob" in \
        " ".join(r.stderr.split())


def test_p_values_below_the_smallest_double_are_not_printed_as_zero():
    """A p-value computed as 0 (below 1e-300) reads 'p < 1e-300', others 'p = 0.012'."""
    assert FX._pval(0.0) == "p < 1e-300" and FX._pval(0.0123) == "p = 0.012"
    assert FX._pval(3e-12) == "p = 3e-12"


def test_staleness_ratios_read_the_law_regime_given_h_star(tmp_path):
    """Planted drift sqrt(1 + 0.5 s) on the law tokens under a noise regime below H* =
    0.05: over every bin the noise dilutes the ratios; given the fitted H*, the check
    reads the bins above it and recovers 1.22 / 1.41 / 1.58 (and says so)."""
    df = generate(SynthSpec(n_tokens=300_000, seed=3, h_star=0.05, noise_share=0.3,
                            staleness_gain=0.5))
    ds = _load(tmp_path, df)
    every = run_forensics(ds, checks=["staleness"]).by_kind("staleness")
    law = run_forensics(ds, checks=["staleness"], h_star=0.05).by_kind("staleness")
    truth = [math.sqrt(1 + 0.5 * s) for s in (1, 2, 3)]
    assert law.evidence["ratio_staleness_values"] == [0, 1, 2, 3]
    assert law.evidence["ratio_to_freshest_per_staleness"][1:] == pytest.approx(truth, rel=0.03)
    assert every.evidence["ratio_to_freshest_per_staleness"][3] < 0.85 * truth[2]
    assert law.evidence["above_h_star"] == 0.05 and every.evidence["above_h_star"] is None
    assert "(above the law's H* = 0.05 nats" in law.message


def test_truncated_sampling_defers_to_an_argmax_engine_column(tmp_path):
    """Engine logprobs of the argmax token give a one-sided negative delta like an engine's
    top-p; when the units check names the engine column, the truncated-sampling finding
    says so instead of pointing at top_p alone."""
    from typer.testing import CliRunner

    from entr_diag.cli import app

    p = tmp_path / "argmax.parquet"
    _logit_run("argmax").write_parquet(p)
    js = tmp_path / "f.json"
    r = CliRunner().invoke(app, ["fit", str(p), "--n-boot", "100", "-q", "--json", str(js)])
    assert r.exit_code == 0, r.output
    doc = json.loads(js.read_text())
    assert doc["units"]["other_token"] == "infer_logprob"
    trunc = [f for f in doc["forensics"]["findings"] if f["kind"] == "truncated_sampling"]
    assert trunc, [f["kind"] for f in doc["forensics"]["findings"]]
    assert "the units check finds that infer_logprob does not hold" in trunc[0]["message"]
    assert trunc[0]["check"].endswith("(the sampled token's, not the argmax).")


def test_shares_near_one_keep_their_digits():
    """A share of 99.97% is not written 100.0% (nor 0.038% as 0.0%)."""
    from entr_diag.forensics import _share

    assert [_share(x) for x in (0.9997, 0.99999, 1 - 1e-10, 1.0, 0.998, 0.5, 0.00038)] == [
        "99.97%", "99.999%", ">99.9999%", "100.0%", "99.8%", "50.0%", "0.038%"]


def _align_sample(n_seq: int, length: int, seed: int = 0, shift: int = 0) -> pl.DataFrame:
    """Rows of ``n_seq`` sequences whose entropy drifts along each sequence (as real
    entropy does: neighbours correlated) and whose surprisal is H * Exp(1) (E[s | H] = H);
    entropy[t] then holds the entropy of token t + ``shift`` (ends keep their own)."""
    rng = np.random.default_rng(seed)
    n = n_seq * length
    a = rng.normal(0, 1, (n_seq, length + 4))  # a moving average over 5 tokens
    walk = sum(a[:, i:i + length] for i in range(5)) * 0.4 + rng.normal(0, 0.9, (n_seq, length))
    h = np.exp(walk - 1).ravel()
    s = h * rng.standard_exponential(n)
    idx = np.arange(length) + shift
    idx = np.where((idx >= 0) & (idx < length), idx, np.arange(length))
    e = h.reshape(n_seq, length)[:, idx]
    return pl.DataFrame({
        "seq_key": np.repeat(np.arange(n_seq, dtype=np.uint64) * 7919 + 11, length),
        "position": np.tile(np.arange(length), n_seq),
        "infer_logprob": -s, "entropy": e.ravel()})


def test_entropy_alignment_finds_the_shift_and_its_direction():
    """entropy[t] holding the entropy of token t+1 (t-1) makes lag -1 (+1) fit best; an
    aligned sample with correlated neighbours (as real entropy is) says no_shift."""
    ok = FX.entropy_alignment(_align_sample(200, 60))
    assert ok.status == "no_shift" and ok.best_lag is None, ok.reason
    # (its reason: the nearest lag's gap against lag 0 and the margin a shift needs)
    assert re.match(r"no shift: rank correlation 0\.\d+ at lag 0; the nearest lag, [+-]\d, "
                    r"-?0\.\d+, [+-]0\.\d+ against lag 0 on the same tokens \(a shift needs "
                    r"\+0\.15\)$", ok.reason), ok.reason
    assert ok.rank_corr[0] > ok.rank_corr[1] + FX.ENTROPY_ALIGN_GAP
    for shift, lag in ((1, -1), (2, -2)):
        got = FX.entropy_alignment(_align_sample(200, 60, shift=shift))
        assert got.status == "shifted" and got.best_lag == lag, got
        assert got.to_dict()["entropy_offset"] == shift
        assert min(got.gap_halves) >= FX.ENTROPY_ALIGN_GAP
    # the row order does not matter (the sample is put back in sequence order)
    shuffled = _align_sample(200, 60, shift=1).sample(fraction=1.0, shuffle=True, seed=3)
    assert FX.entropy_alignment(shuffled).best_lag == -1


def test_entropy_alignment_names_an_entropy_that_does_not_follow_the_tokens(tmp_path):
    """An entropy column that does not belong to the tokens, one value per sequence repeated
    on its tokens or rows shuffled, ranks with the surprisal at no lag: ``unrelated``
    (helper-42: both read 'no_shift' and a verdict was drawn on them); fit then warns and
    its verdict is not assessable. Aligned samples stay no_shift, a few sequences stay
    silent."""
    from typer.testing import CliRunner

    from entr_diag.cli import app

    ok = _align_sample(200, 60)
    mean = ok.with_columns(pl.col("entropy").mean().over("seq_key"))
    shuffled = ok.with_columns(pl.col("entropy").shuffle(seed=4))
    for bad in (mean, shuffled):
        got = FX.entropy_alignment(bad)
        assert got.status == "unrelated" and got.best_lag is None, got.reason
        assert abs(got.rank_corr[0]) < FX.ENTROPY_ALIGN_UNRELATED_RHO
    assert FX.entropy_alignment(ok).status == "no_shift"
    few = FX.entropy_alignment(_align_sample(10, 300).with_columns(
        pl.col("entropy").shuffle(seed=4)))
    assert few.status != "unrelated", few
    # end to end: a synthetic run's entropy replaced by its sequence's mean
    run = generate(SynthSpec(n_tokens=40_000, seed=3, h_star=None))
    p = tmp_path / "mean.parquet"
    run.with_columns(pl.col("entropy").mean().over("seq_id")).write_parquet(p)
    js = tmp_path / "f.json"
    r = CliRunner().invoke(app, ["fit", str(p), "--json", str(js), "-q", "--n-boot", "200"])
    assert r.exit_code == 0, r.output
    doc = json.loads(js.read_text())
    assert doc["entropy_alignment"]["status"] == "unrelated"
    assert doc["verdict"]["assessable"] is False
    assert "the entropy column does not follow the tokens" in " ".join(r.stderr.split())


def test_entropy_alignment_cannot_tell_on_too_little():
    """Too few consecutive pairs, a missing entropy column, a constant column: cannot_tell,
    with the reason (never a shift read from noise)."""
    small = FX.entropy_alignment(_align_sample(10, 50, shift=1))  # < 490 pairs < 2000
    assert small.status == "cannot_tell" and small.best_lag is None
    assert re.match(r"only 4\d\d tokens have a neighbour at the next position", small.reason)
    assert small.to_dict()["best_lag"] is None
    got = FX.entropy_alignment(_align_sample(100, 60).drop("entropy"))
    assert got.status == "cannot_tell" and "no entropy column" in got.reason
    flat = _align_sample(100, 60).with_columns(pl.lit(0.0).alias("infer_logprob"))
    got = FX.entropy_alignment(flat)
    assert got.status == "cannot_tell" and "constant" in got.reason
    # one long sequence: its half of the sample is empty, nothing to confirm the shift on
    one = FX.entropy_alignment(_align_sample(1, 5000, shift=1))
    assert one.status == "cannot_tell" and "too few sequences" in one.reason


# ------------------------------------------------------------------ unsampled tokens


@pytest.fixture(scope="module")
def sampled() -> pl.DataFrame:
    """A clean run whose every token could have been sampled: no planted noise regime (the
    synthetic noise tokens come at rates no sampler reaches), law tokens with surprisal
    H * Exp(1)."""
    return generate(SynthSpec(n_tokens=N_TOKENS, seed=5, h_star=None))


def _unsampled(df: pl.DataFrame, where: pl.Expr) -> pl.DataFrame:
    """Rows matching ``where`` made tokens no sampler drew from their logged distribution:
    entropy 1e-5 nats with a sampled-token probability of e^-8 (the prompt or tool tokens a
    mask takes in, which were teacher-forced, not sampled)."""
    return df.with_columns(
        pl.when(where).then(pl.lit(1e-5)).otherwise(H).alias("entropy"),
        pl.when(where).then(pl.lit(-8.0)).otherwise(IL).alias("infer_logprob"),
        pl.when(where).then(pl.lit(-8.02)).otherwise(TL).alias("train_logprob"))


def _first_masked() -> pl.Expr:
    lm = pl.col("loss_mask")
    return lm & (pl.col("position") == pl.col("position").filter(lm).min().over("seq_id"))


def test_unsampled_clear_on_a_sampled_run(tmp_path, sampled):
    """A run whose tokens were sampled from their logged distributions is clear (Markov's
    bound holds), and so is the bundled real-model run."""
    res = run_forensics(_load(tmp_path, sampled), checks=["unsampled_tokens"])
    assert res.status("unsampled_tokens").status == "clear", res.status("unsampled_tokens")
    assert res.findings == ()
    real = run_forensics(load_dataset(None), checks=["unsampled_tokens"])
    assert real.status("unsampled_tokens").status == "clear", real.status("unsampled_tokens")


def test_unsampled_first_masked_token_is_a_shifted_mask(tmp_path, sampled):
    """One unsampled token per sequence, its first loss-masked one (the last prompt token of
    a mask shifted by one, helper-34 F3: alpha 1.83 -> 0.21 without a word): a warning
    naming the shift, with the bound, the sequences and the share at the first position."""
    df = _unsampled(sampled, _first_masked())
    res = run_forensics(_load(tmp_path, df))
    f = res.by_kind("unsampled_tokens")
    assert f is not None and f.severity == "warning", res.status("unsampled_tokens")
    ev = f.evidence
    n_seqs = df.filter(pl.col("loss_mask")).select(pl.col("seq_id").n_unique()).item()
    assert ev["tokens_flagged"] == n_seqs and ev["sequences_flagged"] == n_seqs
    assert ev["expected_at_most"] < 1 and ev["first_masked_share"] == 1.0
    assert ev["first_masked_base"] < 0.05 and ev["cause"] == "mask_shifted_by_one"
    assert "shifted by one" in f.title and "first loss-masked token" in f.message
    assert ev["p_value"] < 1e-6 and ev["delta2_share_below_entropy"] > 0.9
    # its caveat sits beside the verdict
    from entr_diag.caveats import findings_caveats

    assert any("[unsampled_tokens]" in c for c in findings_caveats(res.to_dict()))


def test_unsampled_prompt_in_the_mask(tmp_path, sampled):
    """Half the tokens of each sequence's first 15% made unsampled (a mask covering the
    prompt, helper-34 F2: misread as a truncated entropy or step spikes): critical (7% of
    the tokens above the bound), located at the start of the sequences."""
    rng = np.random.default_rng(0)
    df = sampled.with_columns(pl.Series("u", rng.random(sampled.height)))
    early = (pl.col("position") < 0.15 * pl.len().over("seq_id")) & (pl.col("u") < 0.5)
    res = run_forensics(_load(tmp_path, _unsampled(df, early & pl.col("loss_mask")).drop("u")))
    f = res.by_kind("unsampled_tokens")
    assert f is not None and f.severity == "critical", res.status("unsampled_tokens")
    ev = f.evidence
    assert ev["early_share"] > 0.9 and ev["early_base"] < 0.4 and ev["first_masked_share"] < 0.5
    # a prompt of two tokens: half of them start the sequence's mask, yet it is no shifted
    # mask (the others are early too; helper-37: a prompt in one shard read as a shift)
    lm, pos = pl.col("loss_mask"), pl.col("position")
    two = lm & (pos <= pos.filter(lm).min().over("seq_id") + 1)
    res = run_forensics(_load(tmp_path, _unsampled(sampled, two), "two.parquet"))
    f = res.by_kind("unsampled_tokens")
    assert f is not None and "prompt" in f.title, f
    assert 0.45 < f.evidence["first_masked_share"] < 0.55
    assert "prompt" in f.title and f.evidence["excess_token_share"] > 0.01


def test_unsampled_spread_is_info_and_deferred_to_shifts(tmp_path, sampled):
    """Unsampled tokens spread at random over the sequences are info (no mask story); a
    shifted entropy column, or logprob columns of another token, explain them: cannot_tell.
    Below the finding's thresholds (a few tokens), clear."""
    rng = np.random.default_rng(1)
    df = sampled.with_columns(pl.Series("u", rng.random(sampled.height)))
    spread = _unsampled(df, (pl.col("u") < 0.01) & pl.col("loss_mask")).drop("u")
    ds = _load(tmp_path, spread)
    f = run_forensics(ds).by_kind("unsampled_tokens")
    assert f is not None and f.severity == "info" and "spread" in f.title
    assert f.evidence["cause"] == "spread"
    plan = FX.forensics_plan(ds, ["unsampled_tokens"])
    FX.run_pass(ds.lf, plan.accumulators)
    st = plan.finish(entropy_shifted=True).status("unsampled_tokens")
    assert st.status == "cannot_tell" and "entropy column looks shifted" in st.reason
    plan = FX.forensics_plan(ds, ["unsampled_tokens"])
    FX.run_pass(ds.lf, plan.accumulators)
    st = plan.finish(other_token="infer_logprob").status("unsampled_tokens")
    assert st.status == "cannot_tell" and "another token" in st.reason
    few = _unsampled(df, (pl.col("u") < 1.5e-4) & pl.col("loss_mask")).drop("u")
    st = run_forensics(_load(tmp_path, few, "few.parquet"),
                       checks=["unsampled_tokens"]).status("unsampled_tokens")
    assert st.status == "clear" and "at most" in st.reason


def test_delta_findings_defer_to_a_shift():
    """Beside a misalignment finding (a shift let through), the findings read from delta
    are info and say why (helper-34 F8: 10% of the sequences shifted at random read as a
    drift up over training, a warning with its caveat); those read from the values
    (corrupt rows, impossible logprobs) keep their severity; without a shift nothing moves."""
    def f(kind, sev):
        return Finding(kind=kind, severity=sev, title=kind, message="m.", evidence={}, check="c")

    found = [(0, f("misalignment", "critical")), (4, f("drift", "warning")),
             (3, f("sequence_outliers", "critical")), (7, f("implausible_logprobs", "warning")),
             (6, f("staleness", "info"))]
    out = dict(FX._defer_to_misalignment(found))
    assert out[0].severity == "critical" and out[7].severity == "warning"
    assert out[4].severity == out[3].severity == "info"
    assert "look shifted against each other" in out[4].message and out[6].message == "m."
    assert FX._defer_to_misalignment(found[1:]) == found[1:]


def test_pooled_findings_point_at_a_drift_jump():
    """A temperature or truncation finding beside a drift finding that names a jump between
    two steps says that it may hold from that step on only (helper-34 F8); without a jump,
    or beside an info drift, nothing is added."""
    def f(kind, sev, **ev):
        return Finding(kind=kind, severity=sev, title=kind, message="m.", evidence=ev, check="c")

    found = [(1, f("one_sided_temperature", "warning")), (2, f("truncated_sampling", "info")),
             (4, f("drift", "warning", jump_between_steps=[9, 10])), (3, f("staleness", "info"))]
    out = dict(FX._pooled_beside_a_jump(found))
    for i in (1, 2):
        assert out[i].message.startswith("m. It is read over the whole run") and (
            "between steps 9 and 10: it may hold from step 10 on only" in out[i].message)
        assert out[i].severity == found[i - 1][1].severity
    assert out[3].message == out[4].message == "m."
    no_jump = [found[0], (4, f("drift", "warning"))]
    assert FX._pooled_beside_a_jump(no_jump) == no_jump
    info = [found[0], (4, f("drift", "info", jump_between_steps=[9, 10]))]
    assert FX._pooled_beside_a_jump(info) == info


def _span_start() -> pl.Expr:
    """The first token of each loss-masked span (a sequence's, and each after a tool span)."""
    lm = pl.col("loss_mask")
    return lm & ~lm.shift(1).over("seq_id", order_by="position").fill_null(False)


def test_unsampled_localised_on_the_significant_range_and_per_turn(tmp_path, sampled):
    """A shifted mask in a multi-turn run (the first token of every loss-masked span, after
    each tool span too: helper-37 2, read as spread; a fifth of the sequences hold a tool
    span, so most such tokens are still their sequence's first) is named; in a few long
    sequences
    beside tokens the bound allows at higher entropy (helper-37 1: the localisation read
    every flagged token below 0.1 nats, 25% of them first), too."""
    res = run_forensics(_load(tmp_path, _unsampled(sampled, _span_start())))
    f = res.by_kind("unsampled_tokens")
    assert f is not None and "shifted by one" in f.title, res.status("unsampled_tokens")
    turns = sampled.filter(_span_start()).height
    assert f.evidence["tokens_flagged"] == turns > sampled["seq_id"].n_unique()
    rng = np.random.default_rng(2)
    long = generate(SynthSpec(n_tokens=N_TOKENS, seed=6, h_star=None, mean_seq_len=4000))
    long = long.with_columns(pl.Series("u", rng.random(long.height)))
    # (6,130 tokens there, whose sum of H / 6.9 allows 44 with p < 1e-3: about 37)
    allowed = H.is_between(0.02, 0.1) & (pl.col("u") < 0.006) & pl.col("loss_mask")
    long = long.with_columns(pl.when(allowed).then(pl.lit(-7.5)).otherwise(IL).alias(
        "infer_logprob"), pl.when(allowed).then(pl.lit(-7.51)).otherwise(TL).alias(
        "train_logprob"))
    shifted = _unsampled(long, _first_masked()).drop("u")
    res = run_forensics(_load(tmp_path, shifted, "long.parquet"))
    f = res.by_kind("unsampled_tokens")
    n_seqs = shifted["seq_id"].n_unique()
    n_allowed = long.filter(allowed).height
    assert n_allowed > 2 * n_seqs, (n_allowed, n_seqs)
    assert f is not None and f.severity == "warning" and "shifted by one" in f.title, f
    assert f.evidence["tokens_flagged"] == n_seqs and f.evidence["entropy_below"] < 0.05


def test_unsampled_short_sequences_are_first_by_chance(tmp_path, sampled):
    """In runs of 1- and 2-token sequences, a token is its sequence's first by chance: spread
    unsampled tokens are not read as a shifted mask (helper-37 4: critical, 'a mask shifted
    by one?'), nor as the prompt."""
    rng = np.random.default_rng(3)
    short = sampled.with_columns((pl.int_range(pl.len()) // 2).alias("seq_id"),
                                 (pl.int_range(pl.len()) % 2).alias("position"),
                                 pl.lit(True).alias("loss_mask"),
                                 pl.Series("u", rng.random(sampled.height)))
    for name, df in (("two.parquet", short),
                     ("one.parquet", short.with_columns(pl.int_range(pl.len()).alias("seq_id"),
                                                        pl.lit(0).alias("position")))):
        # (every check: the sequence tables, which the start-of-sequence reading needs)
        res = run_forensics(_load(tmp_path, _unsampled(df, pl.col("u") < 0.01).drop("u"), name))
        f = res.by_kind("unsampled_tokens")
        assert f is not None and "spread over the sequences" in f.title, (name, f)
        assert f.severity == "info"


def test_cross_references_read_the_severities_a_shift_leaves():
    """Beside a shift, the drift and truncation findings are info: the temperature finding
    then cites no drift jump, the outlier finding no truncation warning (helper-37: both
    were cited after the shift had made them info)."""
    def f(kind, sev, **ev):
        return Finding(kind=kind, severity=sev, title=kind, message="m.", evidence=ev, check="c")

    found = [(0, f("misalignment", "critical")), (1, f("one_sided_temperature", "warning")),
             (2, f("truncated_sampling", "warning")), (3, f("sequence_outliers", "warning")),
             (4, f("drift", "warning", jump_between_steps=[2, 3]))]
    out = dict(FX._cross_referenced(found))
    assert all(out[i].severity == "info" for i in range(1, 5))
    assert "whole run" not in out[1].message and "whole run" not in out[2].message
    assert "truncated" not in out[3].message.lower()
    alone = dict(FX._cross_referenced(found[1:]))
    assert "from step 3 on only" in alone[1].message


def test_unsampled_found_at_twice_the_bound(tmp_path, sampled):
    """Markov's bound is loose (real clean runs sit at 0.4 to 0.7 times it), so a real fault
    can stay under 3 times it at a tiny p-value (helper-36: prompts the model generated at
    T = 1.5, 2.3 times at p = 7e-16, read clear): 2.5 times the bound is found."""
    lam = sampled.filter(pl.col("loss_mask") & (H < 0.1))["entropy"].sum() / -math.log(1e-3)
    pool = sampled.with_row_index("i").filter(pl.col("loss_mask") & H.is_between(0.05, 0.1))
    k = int(2.5 * lam)
    rng = np.random.default_rng(4)
    pick = rng.choice(pool["i"].to_numpy(), size=k, replace=False)
    df = sampled.with_row_index("i")
    hit = pl.col("i").is_in(pick.tolist())
    df = df.with_columns(pl.when(hit).then(pl.lit(-7.5)).otherwise(IL).alias("infer_logprob"),
                         pl.when(hit).then(pl.lit(-7.52)).otherwise(TL).alias("train_logprob"))
    res = run_forensics(_load(tmp_path, df.drop("i")), checks=["unsampled_tokens"])
    f = res.by_kind("unsampled_tokens")
    assert f is not None, res.status("unsampled_tokens")
    ev = f.evidence
    assert ev["tokens_flagged"] == k and 2 < k / ev["expected_at_most"] < 3, ev


def test_zero_runs_beside_truncation_are_info():
    """Runs of exact 0.0 engine logprobs beside a truncated-sampling warning are one-token
    nuclei, not corrupt rows: info, saying so (helper-36: a clean top-p 0.9 run warned);
    with a non-finite run among them, or without the truncation warning, still a warning."""
    def f(kind, sev, **ev):
        return Finding(kind=kind, severity=sev, title=kind, message="m.", evidence=ev, check="c")

    zero = dict(placeholder_tokens_in_runs=248, placeholder_run_tokens_engine_exact_zero=248,
                nonfinite_run_tokens=0, nonfinite_suffix_tokens=0, scattered_bad_tokens=0)
    found = [(2, f("truncated_sampling", "warning")), (6, f("corrupt_rows", "warning", **zero))]
    out = dict(FX._cross_referenced(found))
    assert out[6].severity == "info" and "one-token nuclei" in out[6].message
    nan = [found[0], (6, f("corrupt_rows", "warning", **{**zero, "nonfinite_run_tokens": 9}))]
    assert dict(FX._cross_referenced(nan))[6].severity == "warning"
    assert dict(FX._cross_referenced(found[1:]))[6].severity == "warning"


def test_unsampled_rows_kept_are_bounded(monkeypatch):
    """The localisation keeps whole sequences by seq_key once the flagged rows pass the cap,
    the same ones whatever the batches; a single sequence (seq_key 0, kept at every stride)
    holding more than the cap is cut to it, never an endless halving."""
    monkeypatch.setattr(FX, "UNSAMPLED_MAX_ROWS", 50)

    def batch(keys):
        n = len(keys)
        return pl.DataFrame({"seq_key": keys, "seq_id": [str(k) for k in keys],
                             "position": list(range(n)), "entropy": [1e-5] * n,
                             "infer_logprob": [-8.0] * n, "delta": [0.01] * n}).with_columns(
            *FX._UnsampledTokens().exprs)  # (the pass adds what the engine computes)

    keys = [k for k in range(40) for _ in range(3)]
    a, b = FX._UnsampledTokens(), FX._UnsampledTokens()
    a.update(batch(keys))
    for i in range(0, len(keys), 7):
        b.update(batch(keys[i:i + 7]))
    assert a.stride == b.stride == 4 and a.rows().height == b.rows().height <= 50
    assert sorted(a.rows()["seq_key"].unique()) == list(range(0, 40, 4))
    one = FX._UnsampledTokens()
    one.update(batch([0] * 120))
    assert one.rows().height == 50 and one.bins[0].sum() == 120


# ------------------------------------------------------------------ mask-start surprisal


def _teacher_forced(df: pl.DataFrame, where: pl.Expr, nats: float) -> pl.DataFrame:
    """Rows matching ``where`` made ``nats`` more surprising on both sides, entropy kept:
    tokens the engine did not sample, which the model finds somewhat less likely than its
    own samples (a prompt of natural text: helper-36's English prompts, +0.29 nats), far
    from the improbable tail the unsampled-tokens check reads."""
    return df.with_columns(pl.when(where).then(IL - nats).otherwise(IL).alias("infer_logprob"),
                           pl.when(where).then(TL - nats).otherwise(TL).alias("train_logprob"))


def _early_masked(share: float) -> pl.Expr:
    lm, pos = pl.col("loss_mask"), pl.col("position")
    lo, hi = pos.filter(lm).min().over("seq_id"), pos.filter(lm).max().over("seq_id")
    return lm & (pos - lo <= share * (hi - lo))


def test_mask_start_clear_on_sampled_runs(tmp_path, sampled):
    """Runs whose tokens were sampled (synthetic, and the bundled real-model run) are clear,
    with the two regions' mean excess in the reason; a temperature the logs leave out,
    which biases surprisal over entropy by entropy, on a run whose first tokens have three
    times the entropy of the rest, is clear too (the bin's mean is taken out; pooled, the
    start of the mask would read 0.2 nats above the rest)."""
    res = run_forensics(_load(tmp_path, sampled), checks=["mask_start_surprisal"])
    st = res.status("mask_start_surprisal")
    assert st.status == "clear" and "the 16 positions after the first loss-masked token: " in (
        st.reason), st
    assert "the first token of each loss-masked span: " in st.reason and res.findings == ()
    real = run_forensics(load_dataset(None), checks=["mask_start_surprisal"])
    assert real.status("mask_start_surprisal").status == "clear"
    # the early tokens at 3x the entropy (their surprisal with it: still sampled), then a
    # logged temperature's bias of +0.3 H on every token
    early = _early_masked(0.25)
    hot = sampled.with_columns(
        pl.when(early).then(H * 3).otherwise(H).alias("entropy"),
        pl.when(early).then(IL * 3).otherwise(IL).alias("infer_logprob"),
        pl.when(early).then(TL * 3).otherwise(TL).alias("train_logprob"))
    hot = hot.with_columns((IL - 0.3 * H).alias("infer_logprob"), (TL - 0.3 * H)
                           .alias("train_logprob"))
    lm = hot.filter(pl.col("loss_mask"))
    e = -lm["infer_logprob"] - lm["entropy"]
    flag = lm.select(early.alias("x"))["x"]
    assert float(e.filter(flag).mean()) - float(e.filter(~flag).mean()) > 0.2
    res = run_forensics(_load(tmp_path, hot, "hot.parquet"), checks=["mask_start_surprisal"])
    assert res.status("mask_start_surprisal").status == "clear", res.status(
        "mask_start_surprisal")


def test_mask_start_prompt_in_the_mask_read_from_every_token(tmp_path, sampled):
    """The first 15% of each sequence's loss-masked tokens 0.5 nats more surprising than
    sampled (a prompt of natural text in the mask, no token improbable enough for the
    unsampled-tokens check): a warning naming the prompt, with the mean excess, t and the
    sequences; the same evidence whatever the row order."""
    df = _teacher_forced(sampled, _early_masked(0.15), 0.5)
    res = run_forensics(_load(tmp_path, df), checks=["unsampled_tokens", "mask_start_surprisal"])
    assert res.status("unsampled_tokens").status == "clear"
    f = res.by_kind("mask_start_surprisal")
    assert f is not None and f.severity == "warning", res.status("mask_start_surprisal")
    ev = f.evidence
    n_seqs = df.filter(pl.col("loss_mask")).select(pl.col("seq_id").n_unique()).item()
    assert ev["cause"] == "prompt_in_mask" and ev["region"] == "early"
    assert 0.3 < ev["mean_excess_nats"] <= 0.5 and ev["p_value"] < 1e-6 and ev["t"] > 5
    # (the prompt tokens after the smallest window lift the bins' means a little)
    assert ev["early_window_positions"] in (4, 16) and ev["logged_bias_nats"] < 0.1
    assert ev["floor_nats"] == FX.MASK_START_MIN_EXCESS
    assert 0.75 * n_seqs <= ev["sequences"] <= n_seqs and ev["seq_key_stride"] == 1
    assert "prompt in the mask" in f.title and "not all of these were sampled" in f.message
    from entr_diag.caveats import findings_caveats

    assert any("[mask_start_surprisal]" in c for c in findings_caveats(res.to_dict()))
    shuffled = run_forensics(_load(tmp_path, df.sample(fraction=1.0, shuffle=True, seed=2),
                                   "s.parquet"), checks=["mask_start_surprisal"])
    g = shuffled.by_kind("mask_start_surprisal")
    assert g is not None and g.evidence["t"] == pytest.approx(ev["t"], rel=1e-6)
    assert g.evidence["example_seq_ids"] == ev["example_seq_ids"]
    # an excess below MASK_START_MIN_EXCESS is no finding, however many sequences
    weak = _teacher_forced(sampled, _early_masked(0.15), 0.02)
    res = run_forensics(_load(tmp_path, weak, "w.parquet"), checks=["mask_start_surprisal"])
    assert res.status("mask_start_surprisal").status == "clear"


def test_surprisal_checks_read_an_entropy_in_bits_in_nats(tmp_path, sampled):
    """When the units check finds the entropy column in bits, the mask-start check reads
    the surprisal against the entropy in nats: a prompt in the mask, found in nats, is
    found in bits too (before, surprisal minus an entropy in bits gave every bin a logged
    bias of 0.44 H, the floor rose to it and a real run's English prompt read clear), and
    the unsampled-tokens check's bound is the bound in nats, its entropies named in the
    column's unit with their value in nats."""
    from entr_diag.passes import run_pass

    df = _teacher_forced(sampled, _early_masked(0.15), 0.5)
    bits = df.with_columns(H / math.log(2))

    def run(frame, name, mistake):
        ds = _load(tmp_path, frame, name)
        plan = FX.forensics_plan(ds, ["unsampled_tokens", "mask_start_surprisal"])
        run_pass(ds.lf, plan.accumulators)
        return plan.finish(unit_mistake=mistake, units_checked=True)

    ref = run(df, "nats.parquet", None).by_kind("mask_start_surprisal")
    res = run(bits, "bits.parquet", "entropy_bits")
    f = res.by_kind("mask_start_surprisal")
    assert ref is not None and f is not None, res.status("mask_start_surprisal")
    assert f.evidence["logged_bias_nats"] < 0.1
    assert f.evidence["floor_nats"] == FX.MASK_START_MIN_EXCESS
    assert f.evidence["t"] == pytest.approx(ref.evidence["t"], rel=0.05)
    assert "in the entropy column's unit (probably bits; 0.0693 nats)" in res.status(
        "unsampled_tokens").reason
    # a few improbable tokens: the reason gives the bound
    few = _unsampled(bits.with_row_index("i"), (pl.col("i") % 4000 == 0) & pl.col("loss_mask")
                     ).drop("i")
    st = run(few, "few.parquet", "entropy_bits").status("unsampled_tokens")
    bound = float(re.search(r"at most ([0-9.e+-]+) such", st.reason).group(1))
    plain = run(few, "few2.parquet", None).status("unsampled_tokens").reason
    assert bound == pytest.approx(
        float(re.search(r"at most ([0-9.e+-]+) such", plain).group(1)) * math.log(2),
        rel=0.01)


def test_mask_start_first_token_is_a_shifted_mask(tmp_path, sampled):
    """Each sequence's first loss-masked token 1.5 nats more surprising (the last prompt
    token of a mask shifted by one): a warning naming the shift, not the prompt; the same
    token as unsampled as it gets (entropy 1e-5 nats, p = e^-8), which alone fills its
    entropy bin: still read (its bin's mean is the rest's, or 0 where the rest has none),
    and info beside the unsampled-tokens check naming the same cause."""
    df = _teacher_forced(sampled, _first_masked(), 1.5)
    res = run_forensics(_load(tmp_path, df), checks=["mask_start_surprisal"])
    f = res.by_kind("mask_start_surprisal")
    assert f is not None and f.severity == "warning", res.status("mask_start_surprisal")
    assert f.evidence["cause"] == "mask_shifted_by_one" and f.evidence["region"] == "first"
    assert f.evidence["mean_excess_nats"] > 1.0 and "shifted by one" in f.title
    assert all(abs(w["mean_excess_nats"]) < FX.MASK_START_MIN_EXCESS
               for w in f.evidence["early_windows"].values())
    alone = sampled.with_columns(  # (no other token in its bin)
        pl.when(_first_masked()).then(H).otherwise(H.clip(lower_bound=1e-3)).alias("entropy"))
    res = run_forensics(_load(tmp_path, _unsampled(alone, _first_masked()), "u.parquet"))
    f, u = res.by_kind("mask_start_surprisal"), res.by_kind("unsampled_tokens")
    assert u is not None and u.severity == "warning" and u.evidence["cause"] == (
        "mask_shifted_by_one")
    assert f is not None and f.evidence["cause"] == "mask_shifted_by_one"
    assert f.evidence["mean_excess_nats"] > 7 and f.severity == "info"
    assert "names the same cause" in f.message


def test_mask_start_reads_each_turn_start(tmp_path, sampled):
    """A multi-turn run (two tool outputs of 10 tokens outside the mask, after positions 30
    and 65) whose mask is shifted by one at the later turns only (the token before each
    turn, which the engine never sampled, 1.5 nats more surprising): the first token of
    each loss-masked span is read, not only the sequence's first, so it is named; rows
    excluded at random (2% NaN) leave gaps of one position, no span starts."""
    pos, lm = pl.col("position"), pl.col("loss_mask")
    tool = pos.is_between(30, 39) | pos.is_between(65, 74)
    turns = sampled.with_columns((lm & ~tool).alias("loss_mask"))
    later = _span_start() & ~_first_masked()
    df = _teacher_forced(turns, later, 1.5)
    rng = np.random.default_rng(4)
    df = df.with_columns(pl.when(pl.Series(rng.random(df.height) < 0.02) & ~_span_start())
                         .then(float("nan")).otherwise(IL).alias("infer_logprob"))
    res = run_forensics(_load(tmp_path, df), checks=["mask_start_surprisal"])
    f = res.by_kind("mask_start_surprisal")
    assert f is not None and f.evidence["cause"] == "mask_shifted_by_one", res.status(
        "mask_start_surprisal")
    n_long = df.filter(lm & IL.is_finite()).group_by("seq_id").len().filter(
        pl.col("len") >= FX.MASK_START_MIN_TOKENS)
    # span starts on the mask (the NaN rows in it): after a gap of more than 4 positions
    masked = df.filter(lm & pl.col("seq_id").is_in(n_long["seq_id"].implode()))
    gap = pos - pos.shift(1).over("seq_id", order_by="position")
    starts = masked.filter(gap.is_null() | (gap > 5)).height
    assert f.evidence["span_starts"] == starts > 1.5 * n_long.height
    assert f"{starts:,} tokens" in f.message


def test_mask_start_cannot_tell_without_entropy_or_sequences(tmp_path, sampled):
    """No entropy column, or no sequence long enough to have a start and a rest: cannot_tell,
    with the reason."""
    res = run_forensics(_load(tmp_path, sampled.drop("entropy")),
                        checks=["mask_start_surprisal"])
    st = res.status("mask_start_surprisal")
    assert st.status == "cannot_tell" and "no entropy column" in st.reason
    short = sampled.filter(pl.col("position") < pl.col("position").min().over("seq_id") + 5)
    res = run_forensics(_load(tmp_path, short, "short.parquet"), checks=["mask_start_surprisal"])
    st = res.status("mask_start_surprisal")
    assert st.status == "cannot_tell" and "too few sequences" in st.reason, st


def test_kept_sequences_are_bounded_whatever_the_batches(monkeypatch):
    """The mask-start test keeps whole sequences by seq_key within its cap, the same ones
    whatever the batches."""
    monkeypatch.setattr(FX, "MASK_START_MAX_ROWS", 50)

    def batch(keys):
        n = len(keys)
        return pl.DataFrame({"seq_key": keys, "position": list(range(n)),
                             "entropy": [0.5] * n, "infer_logprob": [-0.7] * n})

    keys = [k for k in range(40) for _ in range(3)]
    a, b = FX._MaskStartTokens(), FX._MaskStartTokens()
    a.update(batch(keys))
    for i in range(0, len(keys), 7):
        b.update(batch(keys[i:i + 7]))
    assert a.stride == b.stride == 4 and a.rows().height == b.rows().height == 30
    assert sorted(b.rows()["seq_key"].unique()) == list(range(0, 40, 4))
    assert a.rows()["e"].to_list() == pytest.approx([0.2] * 30)


def test_collapsed_sequences_with_a_drifted_first_token_are_not_a_shift(tmp_path, sampled):
    """Sequences of one repeated near-certain token whose first token's logprobs differ by
    6.5 nats (a collapsed, stale policy: helper-39's clean real-model run was refused as
    'shifted by +1 in 4.7% of sequences'): lag -1 pairs leave that first token out, so the
    lag-0 reference is taken on the same tokens, not on all of them; no shift."""
    lm = pl.col("loss_mask")
    collapsed = (pl.col("seq_id") % 10 == 0) & lm
    first = _first_masked()
    df = sampled.with_columns(
        pl.when(collapsed & first).then(-7.6).when(collapsed).then(-0.005).otherwise(TL)
        .alias("train_logprob"),
        pl.when(collapsed & first).then(-1.1).when(collapsed).then(-1e-5).otherwise(IL)
        .alias("infer_logprob"))
    res = run_forensics(_load(tmp_path, df), checks=["misalignment"])
    st = res.status("misalignment")
    assert st.status == "clear", st
    assert res.by_kind("misalignment") is None
