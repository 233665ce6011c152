"""Tests of the synthetic rollout-log generator and its planted ground truth."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from entr_diag.errors import ParameterError
from entr_diag.synth import (
    DIRTY_KIND_REASON,
    DIRTY_KINDS,
    LONG_COLUMNS,
    NESTED_LIST_COLUMNS,
    SynthSpec,
    generate,
    iter_chunks,
    planted_delta2,
    summarize,
    write_synth,
)

SMALL = SynthSpec(n_tokens=30_000, seed=7, mean_seq_len=50, dirty=True)


def _valid(df: pl.DataFrame) -> pl.DataFrame:
    """Loss-masked rows with finite, in-range values (what a loader keeps)."""
    return df.filter(
        pl.col("loss_mask"),
        pl.col("train_logprob").is_finite(),
        pl.col("infer_logprob").is_finite(),
        pl.col("train_logprob") <= 0,
        pl.col("infer_logprob") <= 0,
        pl.col("train_logprob") > -9000,
        pl.col("infer_logprob") > -9000,
        ~((pl.col("train_logprob") == 0) | (pl.col("infer_logprob") == 0)),
        pl.col("entropy") >= 0,
        pl.col("policy_version") >= 0,
    )


@pytest.fixture(scope="module")
def big() -> tuple[SynthSpec, pl.DataFrame]:
    spec = SynthSpec(n_tokens=400_000, seed=3)
    return spec, generate(spec)


def test_schema_and_exact_size():
    """generate() returns exactly n_tokens rows in the canonical long columns and dtypes."""
    df = generate(SMALL)
    assert df.height == SMALL.n_tokens
    assert tuple(df.columns) == LONG_COLUMNS
    assert df.schema["seq_id"] == pl.Int64 and df.schema["loss_mask"] == pl.Boolean
    assert df.schema["train_logprob"] == pl.Float64 and df.schema["is_noise"] == pl.Boolean
    pos = df.group_by("seq_id").agg(
        ok=(pl.col("position") == pl.int_range(pl.len())).all(), n=pl.len()
    )
    assert pos["ok"].all()


def test_determinism():
    """The same spec gives identical data; another seed gives different data."""
    a, b = generate(SMALL), generate(SMALL)
    assert a.equals(b)
    c = generate(SynthSpec(**{**SMALL.to_dict(), "seed": 8}))
    assert not a.equals(c)


@pytest.mark.parametrize("chunk_tokens", [1, 997, 4_096, 1_000_000])
def test_chunking_invariance(chunk_tokens):
    """Concatenated chunks equal the in-memory frame, and chunks never split a sequence."""
    whole = generate(SMALL)
    chunks = list(iter_chunks(SMALL, chunk_tokens))
    assert pl.concat(chunks).equals(whole)
    ids = [set(c["seq_id"].unique()) for c in chunks]
    assert sum(len(s) for s in ids) == len(set().union(*ids))
    if chunk_tokens > SMALL.mean_seq_len * 20:
        assert all(c.height <= chunk_tokens for c in chunks)


def test_write_long_and_nested_hold_same_tokens(tmp_path):
    """The long and the nested file hold the same tokens, and match generate()."""
    whole = generate(SMALL)
    s_long = write_synth(
        tmp_path / "long.parquet", SMALL, layout="long", chunk_tokens=5_000, row_group_size=4_000
    )
    s_nest = write_synth(tmp_path / "nested.parquet", SMALL, layout="nested", chunk_tokens=7_000)
    long = pl.read_parquet(tmp_path / "long.parquet")
    assert long.equals(whole)
    nested = pl.read_parquet(tmp_path / "nested.parquet")
    assert nested.height == s_nest["sequences"] == s_long["sequences"]
    assert s_long["rows"] == SMALL.n_tokens and s_nest["rows"] == s_nest["sequences"]
    lens = nested.select(pl.col(c).list.len() for c in NESTED_LIST_COLUMNS)
    assert all((lens[c] == lens[NESTED_LIST_COLUMNS[0]]).all() for c in NESTED_LIST_COLUMNS)
    exploded = (
        nested.explode(list(NESTED_LIST_COLUMNS))
        .with_columns(position=pl.int_range(pl.len()).over("seq_id").cast(pl.Int64))
        .select(LONG_COLUMNS)
    )
    assert exploded.equals(whole)
    for key in ("tokens", "noise_tokens", "dirty", "valid_tokens", "masked_tokens"):
        assert s_long[key] == s_nest[key]


def test_planted_law_holds(big):
    """Binned mean delta^2 / (k H^alpha) is 1 within sampling error for law tokens."""
    spec, df = big
    v = _valid(df).filter(~pl.col("is_noise"))
    h = v["entropy"].to_numpy()
    d2 = (v["train_logprob"] - v["infer_logprob"]).to_numpy() ** 2
    ratio = d2 / (spec.k * h**spec.alpha)
    edges = np.geomspace(spec.h_min, spec.h_max, 9)
    idx = np.digitize(h, edges[1:-1])
    for b in range(8):
        r = ratio[idx == b]
        assert r.size > 1000
        # ratio ~ chi^2_1: mean 1, sd sqrt(2); tolerance 5 standard errors
        assert abs(r.mean() - 1.0) < 5 * math.sqrt(2.0 / r.size)


def test_noise_regime_matches_planted_moment(big):
    """Below h_star the binned mean delta^2 matches planted_delta2; noise only below h_star."""
    spec, df = big
    v = _valid(df)
    assert v.filter(pl.col("is_noise"))["entropy"].max() < spec.h_star
    below = v.filter(pl.col("entropy") < spec.h_star)
    share = below["is_noise"].mean()
    assert abs(share - spec.noise_share) < 5 * math.sqrt(0.25 / below.height)
    h = below["entropy"].to_numpy()
    d2 = (below["train_logprob"] - below["infer_logprob"]).to_numpy() ** 2
    expected = planted_delta2(h, spec)
    assert abs(d2.mean() / expected.mean() - 1) < 0.05
    p = np.exp(v.filter(pl.col("is_noise"))["infer_logprob"].to_numpy())
    assert p.min() >= 1e-5 * (1 - 1e-9) and p.max() <= 1e-2 * (1 + 1e-9)


def test_no_noise_when_h_star_none():
    """h_star=None plants no noise token and the law holds at every entropy."""
    spec = SynthSpec(n_tokens=50_000, h_star=None)
    df = generate(spec)
    assert not df["is_noise"].any()
    assert summarize(spec)["noise_tokens"] == 0
    h = np.array([1e-4, 1e-2, 1.0])
    np.testing.assert_allclose(planted_delta2(h, spec), spec.k * h)


def test_staleness_gain_scales_law():
    """With staleness_gain, E[delta^2 | H, staleness] = k (1 + gain * staleness) H^alpha."""
    spec = SynthSpec(n_tokens=200_000, h_star=None, staleness_gain=1.0, alpha=0.8, seed=1)
    v = _valid(generate(spec)).with_columns(
        st=pl.col("train_version") - pl.col("policy_version"),
        r=(pl.col("train_logprob") - pl.col("infer_logprob")) ** 2
        / (spec.k * pl.col("entropy") ** spec.alpha),
    )
    per = v.group_by("st").agg(m=pl.col("r").mean(), n=pl.len()).sort("st")
    for st, m, n in per.iter_rows():
        assert abs(m / (1 + st) - 1) < 5 * math.sqrt(2.0 / n)


def test_valid_logprobs_nonpositive(big):
    """Every loss-masked clean row has train_logprob <= 0 and infer_logprob <= 0."""
    _, df = big
    m = df.filter(pl.col("loss_mask"))
    assert (m["train_logprob"] <= 0).all() and (m["infer_logprob"] <= 0).all()
    assert m["train_logprob"].is_finite().all()


def test_versions_and_switches(big):
    """Staleness is within 0..max_staleness(+0) and switches raise the version by one, once."""
    spec, df = big
    m = df.filter(pl.col("loss_mask"))
    st = m["train_version"] - m["policy_version"]
    assert st.min() >= 0 and st.max() <= spec.max_staleness
    assert (df["train_version"] == df["step"]).all()
    per = m.group_by("seq_id").agg(
        span=pl.col("policy_version").max() - pl.col("policy_version").min()
    )
    assert per["span"].max() == 1
    s = summarize(spec)
    share = s["switched_sequences"] / s["sequences"]
    assert 0.5 * spec.switch_share < share <= spec.switch_share + 0.05
    assert sum(s["tokens_per_step"]) == spec.n_tokens
    assert len(s["tokens_per_step"]) == spec.n_steps


def test_dirty_counts_match_summary(tmp_path):
    """Each kind of invalid loss-masked row appears as often as the summary says."""
    spec = SynthSpec(n_tokens=100_000, dirty=True, dirty_share=0.04, seed=5)
    df = generate(spec)
    s = summarize(spec, chunk_tokens=9_999)
    m = df.filter(pl.col("loss_mask"))
    tl, il = pl.col("train_logprob"), pl.col("infer_logprob")
    either = lambda e: e(tl) | e(il)  # noqa: E731
    got = {
        "nan": m.filter(either(lambda c: c.is_nan())).height,
        "null": m.filter(either(lambda c: c.is_null())).height,
        "plus_one": m.filter(either(lambda c: c == 1.0)).height,
        "floor": m.filter(either(lambda c: c == -9999.0)).height,
        "neg_inf": m.filter(either(lambda c: c == -math.inf)).height,
        "zero": m.filter(either(lambda c: c == 0.0)).height,
        "neg_entropy": m.filter(pl.col("entropy") < 0).height,
        "neg_version": m.filter(pl.col("policy_version") < 0).height,
    }
    assert set(s["dirty"]) == set(DIRTY_KINDS)
    assert got == s["dirty"]
    assert all(n > 0 for n in got.values())
    assert s["dirty_tokens"] == sum(got.values())
    assert _valid(df).height == s["valid_tokens"] == s["law_tokens"] + s["noise_tokens"]
    assert df["is_noise"].sum() == s["noise_tokens"]
    assert (~df["loss_mask"]).sum() == s["masked_tokens"]
    # zero placeholders sit next to a clearly negative other side
    z = m.filter(either(lambda c: c == 0.0))
    assert (z["train_logprob"] + z["infer_logprob"] <= -2.0).all()


def test_masked_rows_carry_placeholders():
    """A few % of rows are masked; they carry 0.0 / -9999.0 and version -1 and are not noise."""
    spec = SynthSpec(n_tokens=100_000)
    df = generate(spec)
    masked = df.filter(~pl.col("loss_mask"))
    assert 0.01 < masked.height / df.height < 0.06
    assert masked["infer_logprob"].is_in([0.0, -9999.0]).all()
    assert (masked["policy_version"] == -1).all()
    assert not masked["is_noise"].any()
    assert summarize(spec)["dirty_tokens"] == 0


def test_atomic_write_leaves_no_temp(tmp_path):
    """write_synth leaves only the target file, also after a failure mid-write."""
    out = tmp_path / "x.parquet"
    s = write_synth(out, SMALL, chunk_tokens=3_000)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.parquet"]
    assert s["bytes"] == out.stat().st_size and s["path"] == str(out)
    assert pl.read_parquet_schema(out)["seq_id"] == pl.Int64
    with pytest.raises(ParameterError):
        write_synth(tmp_path / "y.parquet", SMALL, layout="wide")
    with pytest.raises(ParameterError):
        write_synth(tmp_path / "y.parquet", SMALL, chunk_tokens=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.parquet"]


def test_summary_is_plain_and_consistent(tmp_path):
    """The summary holds the spec and realised counts as plain Python values."""
    import json

    s = write_synth(tmp_path / "s.parquet", SMALL)
    json.dumps(s)
    assert s["spec"] == SMALL.to_dict()
    assert s == {
        **summarize(SMALL),
        "path": s["path"],
        "layout": "long",
        "rows": s["rows"],
        "bytes": s["bytes"],
    }
    assert s["tokens"] == s["masked_tokens"] + s["dirty_tokens"] + s["valid_tokens"]


@pytest.mark.parametrize(
    "bad",
    [
        {"n_tokens": 0},
        {"seed": -1},
        {"k": 0.0},
        {"h_min": 0.0},
        {"h_min": 5.0},
        {"h_star": -1.0},
        {"h_star": 10.0},  # above h_max: no token would follow the law
        {"alpha": 100.0},
        {"alpha": 0.0},
        {"noise_share": 1.5},
        {"mean_seq_len": 0},
        {"n_steps": 0},
        {"max_staleness": -1},
        # log-ratios of sd 2000 nats (helper-32: written, then read as -1000-nat placeholders)
        {"k": 1e6},
        {"k": 1.0, "staleness_gain": 100.0},  # sd 60 nats for the stalest tokens
        {"noise_sigma": 50.0},
    ],
)
def test_bad_spec_raises(bad):
    """Invalid parameters raise ParameterError with a plain sentence."""
    with pytest.raises(ParameterError, match="SynthSpec"):
        SynthSpec(**bad)


def test_the_largest_planted_law_is_accepted():
    """k up to 100 / h_max^alpha (a log-ratio sd of 10 nats at h_max) is accepted."""
    SynthSpec(k=25.0, h_max=4.0, alpha=1.0)
    with pytest.raises(ParameterError, match=r"give k <= 25"):
        SynthSpec(k=26.0, h_max=4.0, alpha=1.0)


@pytest.mark.parametrize("layout", ["long", "nested"])
def test_loader_accounting_matches_ground_truth(tmp_path, layout):
    """load_dataset excludes exactly the planted dirty rows, by reason, in both layouts."""
    from entr_diag.io.load import load_dataset
    from entr_diag.io.schema import EXCLUSION_REASONS

    assert set(DIRTY_KIND_REASON) == set(DIRTY_KINDS)
    assert set(DIRTY_KIND_REASON.values()) <= set(EXCLUSION_REASONS)
    spec = SynthSpec(n_tokens=60_000, dirty=True, dirty_share=0.03, seed=11)
    path = tmp_path / f"{layout}.parquet"
    s = write_synth(path, spec, layout=layout, chunk_tokens=20_000)
    acc = load_dataset([path]).accounting.to_dict()
    expected: dict[str, int] = {}
    for kind, n in s["dirty"].items():
        reason = DIRTY_KIND_REASON[kind]
        expected[reason] = expected.get(reason, 0) + n
    assert acc["exclusions"] == {r: n for r, n in expected.items() if n}
    assert acc["tokens_total"] == s["tokens"]
    assert acc["tokens_unmasked"] == s["masked_tokens"]
    assert acc["tokens_valid"] == s["valid_tokens"]
    assert acc["sequences_with_version_switch"] == s["switched_sequences_visible"]


try:
    from hypothesis import given, settings
    from hypothesis import strategies as st
except ImportError:  # pragma: no cover - hypothesis is a dev dependency
    given = None

if given is not None:

    @settings(max_examples=25, deadline=None)
    @given(
        n_tokens=st.integers(1, 3_000),
        seed=st.integers(0, 2**32),
        mean_seq_len=st.integers(1, 300),
        max_staleness=st.integers(0, 4),
        chunk_tokens=st.integers(1, 5_000),
        dirty=st.booleans(),
        alpha=st.floats(0.3, 2.0),
    )
    def test_properties_small_specs(
        n_tokens, seed, mean_seq_len, max_staleness, chunk_tokens, dirty, alpha
    ):
        """Any small spec: exact size, chunk-invariant, clean logprobs <= 0, staleness in range."""
        spec = SynthSpec(
            n_tokens=n_tokens,
            seed=seed,
            mean_seq_len=mean_seq_len,
            max_staleness=max_staleness,
            dirty=dirty,
            alpha=alpha,
        )
        whole = generate(spec)
        assert whole.height == n_tokens
        assert pl.concat(list(iter_chunks(spec, chunk_tokens))).equals(whole)
        v = _valid(whole)
        assert (v["train_logprob"] <= 0).all()
        st_ = v["train_version"] - v["policy_version"]
        assert v.is_empty() or (st_.min() >= 0 and st_.max() <= max_staleness)
        s = summarize(spec, chunk_tokens)
        assert s["tokens"] == n_tokens and s["sequences"] == whole["seq_id"].n_unique()
