"""verl / slime mismatch metrics (entr_diag.metrics): every metric against a hand computation."""

from __future__ import annotations

import math

import polars as pl
import pytest

from entr_diag.errors import FitError
from entr_diag.metrics import METRIC_NAMES, SAFETY_BOUND, compute_metrics


def _frame(rows: list[tuple[str, int, float, float]], with_step: bool = True) -> pl.LazyFrame:
    """rows: (seq_id, step, train_logprob, infer_logprob), in order within each sequence."""
    df = pl.DataFrame(
        {
            "seq_id": [r[0] for r in rows],
            "step": [r[1] for r in rows],
            "train_logprob": [r[2] for r in rows],
            "infer_logprob": [r[3] for r in rows],
        },
        schema={"seq_id": pl.String, "step": pl.Int64, "train_logprob": pl.Float64,
                "infer_logprob": pl.Float64},
    ).with_columns(
        pl.int_range(pl.len()).over("seq_id").alias("position"),
        pl.concat_str([pl.col("step").cast(pl.String), pl.col("seq_id")], separator="\x1f")
        .hash(seed=0).alias("seq_key"),
        (pl.col("train_logprob") - pl.col("infer_logprob")).alias("delta"),
    )
    if not with_step:
        df = df.drop("step")
    return df.lazy()


# Sequence "a" (step 0): two tokens; sequence "b" (step 1): one token; "c" (step 1): two tokens.
ROWS = [
    ("a", 0, -1.0, -1.2),  # delta = +0.2
    ("a", 0, -0.5, -0.4),  # delta = -0.1
    ("b", 1, -2.0, -1.7),  # delta = -0.3
    ("c", 1, -0.1, -0.1),  # delta = 0
    ("c", 1, -3.0, -2.0),  # delta = -1.0  (|delta| > log 2)
]
DELTAS = [0.2, -0.1, -0.3, 0.0, -1.0]


def _expected(rows):
    """Hand formulas of METHOD.md applied with plain Python (no polars)."""
    d = [t - i for _, _, t, i in rows]
    n = len(d)
    seqs: dict[str, list[tuple[float, float]]] = {}
    for sid, _, t, i in rows:
        seqs.setdefault(sid, []).append((t, i))
    r = [math.exp(x) for x in d]
    mean_w = sum(r) / n
    out = {
        "kl": sum(-x for x in d) / n,
        "k3_kl": sum(math.exp(x) - 1 - x for x in d) / n,
        "chi2_token": sum(x * x for x in r) / n - 1,
        "chi2_seq": sum(math.exp(2 * sum(t - i for t, i in s)) for s in seqs.values()) / len(seqs)
        - 1,
        "training_ppl": sum(math.exp(-sum(t for t, _ in s) / len(s)) for s in seqs.values())
        / len(seqs),
        "rollout_ppl": sum(math.exp(-sum(i for _, i in s) / len(s)) for s in seqs.values())
        / len(seqs),
        "log_ppl_diff": sum(sum(i for _, i in s) / len(s) - sum(t for t, _ in s) / len(s)
                            for s in seqs.values()) / len(seqs),
        "ess": 1.0 / (sum((w / mean_w) ** 2 for w in r) / n),
        "share_abs_delta_gt_log2": sum(abs(x) > math.log(2) for x in d) / n,
    }
    return out, n, len(seqs)


def test_overall_metrics_match_hand_computation():
    """Every overall metric equals the METHOD.md formula computed by hand."""
    m = compute_metrics(_frame(ROWS))
    exp, n, ns = _expected(ROWS)
    assert m.overall.tokens == n == 5
    assert m.overall.sequences == ns == 3
    for name in METRIC_NAMES:
        assert getattr(m.overall, name) == pytest.approx(exp[name], rel=1e-12, abs=1e-15), name


def test_hand_values_written_out():
    """A few metrics written out as numbers, to pin the definitions themselves."""
    m = compute_metrics(_frame(ROWS)).overall
    assert m.kl == pytest.approx((-0.2 + 0.1 + 0.3 + 0.0 + 1.0) / 5)  # mean(-delta)
    assert m.share_abs_delta_gt_log2 == pytest.approx(1 / 5)
    # chi2_seq: sequences a (sum 0.1), b (-0.3), c (-1.0)
    assert m.chi2_seq == pytest.approx((math.exp(0.2) + math.exp(-0.6) + math.exp(-2.0)) / 3 - 1)
    # log_ppl_diff: a: mean infer -0.8, mean train -0.75 -> -0.05; b: 0.3; c: -1.05 + 1.55 = 0.5
    assert m.log_ppl_diff == pytest.approx((-0.05 + 0.3 + 0.5) / 3)
    # training_ppl: exp(0.75), exp(2.0), exp(1.55)
    assert m.training_ppl == pytest.approx((math.exp(0.75) + math.exp(2.0) + math.exp(1.55)) / 3)


def test_per_step_metrics_match_hand_computation():
    """Per-step metrics equal the hand formulas on each step's tokens and sequences."""
    m = compute_metrics(_frame(ROWS))
    assert [s.step for s in m.per_step] == [0, 1]
    for s in m.per_step:
        rows = [r for r in ROWS if r[1] == s.step]
        exp, n, ns = _expected(rows)
        assert (s.tokens, s.sequences) == (n, ns)
        for name in METRIC_NAMES:
            assert getattr(s, name) == pytest.approx(exp[name], rel=1e-12, abs=1e-15), name


def test_no_step_column_gives_overall_only():
    """Without a step column the per-step list is empty and overall is unchanged."""
    with_step = compute_metrics(_frame(ROWS)).overall
    m = compute_metrics(_frame(ROWS, with_step=False))
    assert m.per_step == ()
    assert m.overall.kl == pytest.approx(with_step.kl)
    assert m.overall.chi2_seq == pytest.approx(with_step.chi2_seq)


def test_null_step_tokens_are_counted_overall_and_reported():
    """Tokens whose step is null are in ``overall``, in no step row, and counted as such."""
    rows = [(sid, None if step == 0 else step, t, i) for sid, step, t, i in ROWS]
    m = compute_metrics(_frame(rows))
    assert [s.step for s in m.per_step] == [1]
    assert m.tokens_without_step == 2
    assert m.overall.tokens == len(ROWS)
    assert compute_metrics(_frame(ROWS)).tokens_without_step == 0
    assert m.to_dict()["tokens_without_step"] == 2


def test_identical_policies_give_zero_mismatch():
    """train == infer: kl = k3 = chi2 = 0, ess = 1, ppl equal, log_ppl_diff = 0."""
    rows = [("a", 0, -0.5, -0.5), ("a", 0, -1.5, -1.5), ("b", 0, -0.2, -0.2)]
    m = compute_metrics(_frame(rows)).overall
    assert m.kl == 0 and m.k3_kl == 0 and m.chi2_token == 0 and m.chi2_seq == 0
    assert m.ess == pytest.approx(1.0)
    assert m.training_ppl == pytest.approx(m.rollout_ppl)
    assert m.log_ppl_diff == 0


def test_safety_bound_clamps_chi2_like_verl():
    """A log-ratio beyond +/-20 is clamped before exp in chi2_token and chi2_seq (verl)."""
    rows = [("a", 0, -0.0, -50.0)]  # delta = 50
    m = compute_metrics(_frame(rows)).overall
    assert m.chi2_token == pytest.approx(math.exp(2 * SAFETY_BOUND) - 1)
    assert m.chi2_seq == pytest.approx(math.exp(2 * SAFETY_BOUND) - 1)
    assert m.ess == pytest.approx(1.0)
    # k3_kl is not clamped (a placeholder logprob shows as a huge k3), as the table says
    assert m.k3_kl == pytest.approx(math.exp(50.0) - 1 - 50.0)


def test_clamped_tokens_and_sequences_are_counted():
    """Where the clamp bites, the metrics say how often: tokens with |delta| > 20 and
    sequences with |sum delta| > 20 (a long sequence of small log-ratios reaches it too:
    40 tokens at delta 0.6 sum to 24), overall and per step; the terminal says so."""
    from entr_diag.metrics import clamp_note_of

    rows = ([("a", 0, -0.0, -50.0)] + [("b", 0, -0.4, -1.0)] * 40
            + [("c", 1, -1.0, -1.1)] * 3 + [("d", 1, -30.0, -1.0)])
    m = compute_metrics(_frame(rows))
    assert (m.overall.tokens_clamped, m.overall.sequences_clamped) == (2, 3)
    by = {s.step: (s.tokens_clamped, s.sequences_clamped) for s in m.per_step}
    assert by == {0: (1, 2), 1: (1, 1)}
    assert m.to_dict()["overall"]["sequences_clamped"] == 3
    note = clamp_note_of(2, 3)
    assert "3 sequence(s) have |sum delta| > 20" in note and "2 token(s)" in note
    assert clamp_note_of(0, 0) is None


def test_an_infinite_k3_kl_is_explained():
    """A placeholder engine logprob of -999 (delta ~ 998 > 709.8): exp overflows, k3_kl is
    infinite (not clamped); the clamp note says so (the table shows '-', JSON null);
    a finite k3_kl adds nothing."""
    from entr_diag.metrics import clamp_note_of

    m = compute_metrics(_frame([("a", 0, -1.0, -999.0), ("a", 0, -0.5, -0.6)])).overall
    assert m.k3_kl == math.inf and m.tokens_clamped == 1
    note = clamp_note_of(m.tokens_clamped, m.sequences_clamped, m.k3_kl)
    assert note.startswith("Saturated: ") and "k3_kl is infinite" in note
    assert "k3_kl is infinite" in clamp_note_of(1, 1, None)  # (null, read back from JSON)
    assert "k3_kl" not in clamp_note_of(1, 1, 3.5e20)
    assert clamp_note_of(0, 0, math.nan) is None  # (no token: nothing clamped)


def test_row_order_does_not_change_metrics():
    """Shuffling the token rows gives the same metrics."""
    a = compute_metrics(_frame(ROWS)).to_dict()
    b = compute_metrics(_frame(ROWS).collect().sample(fraction=1.0, shuffle=True, seed=3).lazy())
    b = b.to_dict()
    for k in METRIC_NAMES:
        assert b["overall"][k] == pytest.approx(a["overall"][k], rel=1e-12, abs=1e-15)


def test_to_dict_layout():
    """to_dict has overall and per_step with the verl/slime names."""
    d = compute_metrics(_frame(ROWS)).to_dict()
    assert set(METRIC_NAMES) <= set(d["overall"])
    assert "step" not in d["overall"]
    assert d["per_step"][0]["step"] == 0


def test_empty_frame_raises():
    """An empty token frame raises FitError with a sentence."""
    lf = _frame(ROWS).filter(pl.lit(False))
    with pytest.raises(FitError, match="empty"):
        compute_metrics(lf)


def test_plan_does_not_depend_on_batch_size():
    """The plan's metrics are the same whether the pass cuts the frame into batches of 2 or
    one batch (sequences split across batches are merged)."""
    from entr_diag.metrics import metrics_plan
    from entr_diag.passes import run_pass

    rows = ROWS + [("d", 1, -0.3 * i, -0.25 * i - 0.01) for i in range(7)]
    lf = _frame(rows)
    out = []
    for chunk in (2, 1_000):
        plan = metrics_plan(lf)
        run_pass(lf, plan.accumulators, chunk_size=chunk)
        out.append(plan.finish().to_dict())
    small, big = out
    for k in METRIC_NAMES:
        assert small["overall"][k] == pytest.approx(big["overall"][k], rel=1e-12, abs=1e-15), k
    assert [s["step"] for s in small["per_step"]] == [s["step"] for s in big["per_step"]]
    for a, b in zip(small["per_step"], big["per_step"], strict=True):
        assert (a["tokens"], a["sequences"]) == (b["tokens"], b["sequences"])
        for k in METRIC_NAMES:
            assert a[k] == pytest.approx(b[k], rel=1e-12, abs=1e-15), k


def test_numpy_runs_equal_the_group_by(monkeypatch):
    """The per-sequence sums reduced with numpy over runs of a sequence (clipped
    log-ratios beyond +-20 included) equal those of the polars group-by that batches with a
    null take, with and without a step column."""
    import numpy as np

    import entr_diag.metrics as M
    from entr_diag.passes import run_pass

    rng = np.random.default_rng(5)
    rows = [(f"s{i % 37}", i % 3, float(-rng.exponential()), float(-rng.exponential()))
            for i in range(600)]
    rows[5] = (rows[5][0], rows[5][1], -30.0, -0.5)  # delta < -20: clamped before exp
    rows[9] = (rows[9][0], rows[9][1], -0.1, -25.0)  # delta > 20
    for with_step in (True, False):
        lf = _frame(rows, with_step=with_step)
        out = []
        for force in (False, True):
            if force:
                monkeypatch.setattr(M, "has_nulls", lambda batch, cols: True)
            plan = M.metrics_plan(lf)
            run_pass(lf, plan.accumulators, chunk_size=53)
            monkeypatch.undo()
            out.append(plan.finish().to_dict())
        fast, grouped = out
        for a, b in zip([fast["overall"], *fast["per_step"]],
                        [grouped["overall"], *grouped["per_step"]], strict=True):
            assert (a["tokens"], a["sequences"]) == (b["tokens"], b["sequences"])
            for k in METRIC_NAMES:
                assert a[k] == pytest.approx(b[k], rel=1e-9, abs=1e-15), k
            assert (a["tokens_clamped"], a["sequences_clamped"]) == (
                b["tokens_clamped"], b["sequences_clamped"])
