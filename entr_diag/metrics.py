"""Train-inference mismatch metrics under the names verl and slime log (shared/METHOD.md).

All metrics use the valid loss-masked tokens of the canonical frame (docs/CONTRACT.md),
``delta = lr = train_logprob - infer_logprob`` (nats), ``r = exp(delta)``:

=======================  =====================================================  ==========
name                     definition                                             level
=======================  =====================================================  ==========
``kl``                   mean(-delta): k1 estimate of KL(infer || train)        token
``k3_kl``                mean(exp(delta) - 1 - delta)                           token
``chi2_token``           mean(r^2) - 1                                          token
``chi2_seq``             mean over sequences of exp(2 sum_t delta) - 1          sequence
``training_ppl``         mean over sequences of exp(-mean_t train_logprob)      sequence
``rollout_ppl``          mean over sequences of exp(-mean_t infer_logprob)      sequence
``log_ppl_diff``         mean over sequences of (mean_t infer_logprob -         sequence
                         mean_t train_logprob)
``ess``                  1 / mean((w / mean w)^2), w = r per token              token
``share_abs_delta_gt_log2``  share of tokens with |delta| > log 2               token
=======================  =====================================================  ==========

Matching the frameworks: token means are over all tokens of the batch (verl ``masked_mean``
over the batch); sequence metrics average one value per sequence (verl / slime compute them
per sequence and average). As in verl's ``rollout_corr`` / slime's ppl metrics, the
log-ratio is clamped to [-20, 20] before exponentiating in ``chi2_token``, the sum in
``chi2_seq`` is clamped to [-20, 20] (``SAFETY_BOUND = 20``), and the weights of ``ess`` are
``r = exp(clamp(delta, -20, 20))``; ``ess`` is normalised to (0, 1] (verl's
``rollout_is_eff_sample_size``), computed on untruncated token-level weights.

Sequences are the groups of ``seq_key`` (the contract's hash of (step, seq_id)). One
streaming pass (:class:`MetricsPlan`, an accumulator of :func:`entr_diag.passes.run_pass`)
keeps per-sequence partial sums, merged across batches (memory O(sequences)); the sequence
quantities and the overall and per-step values come from that small table. Never collects
the token frame.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import polars as pl

from entr_diag.errors import FitError
from entr_diag.frames import token_frame
from entr_diag.passes import Accumulator, PartialRows, column, has_nulls, run_pass, run_starts

__all__ = [
    "METRIC_NAMES",
    "SAFETY_BOUND",
    "clamp_note_of",
    "MetricSet",
    "MetricsPlan",
    "MismatchMetrics",
    "compute_metrics",
    "metrics_plan",
]

#: Clamp of log-ratios before exp, as verl / slime (``SAFETY_BOUND = 20.0``).
SAFETY_BOUND: float = 20.0

METRIC_NAMES: tuple[str, ...] = (
    "kl",
    "k3_kl",
    "chi2_token",
    "chi2_seq",
    "training_ppl",
    "rollout_ppl",
    "log_ppl_diff",
    "ess",
    "share_abs_delta_gt_log2",
)


@dataclass(frozen=True)
class MetricSet:
    """The metrics over one set of tokens (all of them, or one step). Units: nats for kl,
    k3_kl and log_ppl_diff; the others are dimensionless."""

    tokens: int
    sequences: int
    kl: float
    k3_kl: float
    chi2_token: float
    chi2_seq: float
    training_ppl: float
    rollout_ppl: float
    log_ppl_diff: float
    ess: float
    share_abs_delta_gt_log2: float
    #: tokens with |delta| > SAFETY_BOUND (chi2_token and ess read them at the bound) and
    #: sequences with |sum_t delta| > SAFETY_BOUND (chi2_seq reads them at the bound): where
    #: there are any, those metrics are saturated (a lower bound when the excess is upward)
    tokens_clamped: int = 0
    sequences_clamped: int = 0
    step: int | None = None

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        if self.step is None:
            d.pop("step")
        return d


@dataclass(frozen=True)
class MismatchMetrics:
    """``overall`` metrics and ``per_step`` (one :class:`MetricSet` per step, sorted; empty
    without a step column). ``tokens_without_step``: tokens whose step is null, counted in
    ``overall`` only (no per-step row)."""

    overall: MetricSet
    per_step: tuple[MetricSet, ...]
    tokens_without_step: int = 0

    def to_dict(self) -> dict:
        return {
            "overall": self.overall.to_dict(),
            "per_step": [m.to_dict() for m in self.per_step],
            "tokens_without_step": self.tokens_without_step,
            "definitions": "verl/slime names; see entr_diag.metrics (clamp +/-20 before exp)",
        }


def _token_aggs() -> list[pl.Expr]:
    d = pl.col("delta")
    dc = d.clip(-SAFETY_BOUND, SAFETY_BOUND)
    return [
        pl.len().cast(pl.Int64).alias("n"),
        (-d).sum().alias("s_k1"),
        (d.exp() - 1.0 - d).sum().alias("s_k3"),
        (2.0 * dc).exp().sum().alias("s_r2"),
        dc.exp().sum().alias("s_r"),
        (d.abs() > math.log(2.0)).sum().cast(pl.Int64).alias("n_gt_log2"),
        (d.abs() > SAFETY_BOUND).sum().cast(pl.Int64).alias("n_clamped"),
    ]


def _seq_aggs() -> list[pl.Expr]:
    sd = pl.col("s_d")
    return [
        pl.len().cast(pl.Int64).alias("n_seq"),
        ((2.0 * sd.clip(-SAFETY_BOUND, SAFETY_BOUND)).exp()).sum().alias("s_rho2"),
        (-pl.col("m_train")).exp().sum().alias("s_tppl"),
        (-pl.col("m_infer")).exp().sum().alias("s_rppl"),
        (pl.col("m_infer") - pl.col("m_train")).sum().alias("s_lpd"),
        (sd.abs() > SAFETY_BOUND).sum().cast(pl.Int64).alias("n_seq_clamped"),
    ]


def _per_seq_exprs() -> list[pl.Expr]:
    """Per-sequence partial sums (they add up when a sequence is split across batches)."""
    return [
        pl.col("delta").sum().alias("s_d"),
        pl.col("train_logprob").sum().alias("s_train"),
        pl.col("train_logprob").count().cast(pl.Int64).alias("n_train"),
        pl.col("infer_logprob").sum().alias("s_infer"),
        pl.col("infer_logprob").count().cast(pl.Int64).alias("n_infer"),
    ]


#: the per-token expression of :class:`_SeqSums` computed by the streaming engine
_EXP = "_mx_exp_delta"
_LOG2 = math.log(2.0)


_SUM_COLS: tuple[str, ...] = (
    "n", "s_k1", "s_k3", "s_r2", "s_r", "n_gt_log2", "n_clamped",
    "s_d", "s_train", "n_train", "s_infer", "n_infer",
)


def _seq_means() -> list[pl.Expr]:
    """Per-sequence means of the two logprobs from the merged partial sums (null without a
    non-null value, as ``mean`` of an all-null group)."""
    return [
        pl.when(pl.col("n_train") > 0).then(pl.col("s_train") / pl.col("n_train"))
        .alias("m_train"),
        pl.when(pl.col("n_infer") > 0).then(pl.col("s_infer") / pl.col("n_infer"))
        .alias("m_infer"),
    ]


def _make(tok: dict, seq: dict, step: int | None = None) -> MetricSet:
    n = int(tok["n"] or 0)
    ns = int(seq.get("n_seq") or 0)

    def t(key: str) -> float:
        return float(tok[key]) / n if n else float("nan")

    def s(key: str) -> float:
        return float(seq[key]) / ns if ns else float("nan")

    s_r, s_r2 = float(tok["s_r"] or 0.0), float(tok["s_r2"] or 0.0)
    ess = (s_r * s_r) / (n * s_r2) if n and s_r2 > 0 else float("nan")
    return MetricSet(
        tokens=n,
        sequences=ns,
        kl=t("s_k1"),
        k3_kl=t("s_k3"),
        chi2_token=t("s_r2") - 1.0,
        chi2_seq=s("s_rho2") - 1.0,
        training_ppl=s("s_tppl"),
        rollout_ppl=s("s_rppl"),
        log_ppl_diff=s("s_lpd"),
        ess=ess,
        share_abs_delta_gt_log2=t("n_gt_log2"),
        tokens_clamped=int(tok.get("n_clamped") or 0),
        sequences_clamped=int(seq.get("n_seq_clamped") or 0),
        step=step,
    )


class _SeqSums:
    """Per-sequence partial sums of the token pass (keys ``(step, seq_key)``, or ``seq_key``
    without a step column): the token count ``n``, the token sums of the token metrics, the
    sum of delta and the sums and counts of both logprobs.

    ``exp(delta)`` is computed by the streaming engine during the scan (:attr:`exprs`); per
    batch, numpy sums the per-token terms over runs of consecutive rows of one sequence
    (tokens of a sequence are usually contiguous: a batch collapses to about one row per
    sequence, ``reduceat``), and the rows are merged by key after the pass
    (:class:`PartialRows`). A batch with a null in a key or a value column takes the polars
    group-by (null-skipping sums and counts). Memory O(sequences)."""

    def __init__(self, names: list[str]) -> None:
        self.has_step = "step" in names
        self.keys = ["step", "seq_key"] if self.has_step else ["seq_key"]
        self.columns = [*self.keys, "train_logprob", "infer_logprob", "delta"]
        self.exprs = [pl.col("delta").exp().alias(_EXP)]
        self.table = PartialRows(self.keys, [pl.col(c).sum() for c in _SUM_COLS])

    def update(self, batch: pl.DataFrame) -> None:
        if has_nulls(batch, self.columns):
            self.table.add(batch.group_by(self.keys).agg(*_token_aggs(), *_per_seq_exprs()))
            return
        starts = run_starts(batch, self.keys)
        d = column(batch, "delta")
        e = column(batch, _EXP)
        r = e  # exp(clip(delta, -20, 20)): exp(delta) unless some |delta| > 20
        n = np.diff(np.append(starts, d.size)).astype(np.int64)
        clamped = np.zeros(starts.size, dtype=np.int64)
        if np.abs(d).max() > SAFETY_BOUND:
            r = np.exp(np.clip(d, -SAFETY_BOUND, SAFETY_BOUND))
            clamped = np.add.reduceat((np.abs(d) > SAFETY_BOUND).astype(np.int64), starts)
        s_d = np.add.reduceat(d, starts)

        def red(v: np.ndarray) -> np.ndarray:
            return np.add.reduceat(v, starts)

        self.table.add({
            **{k: column(batch, k)[starts] for k in self.keys},
            "n": n,
            "s_k1": -s_d,
            "s_k3": red(e - 1.0 - d),
            "s_r2": red(r * r),
            "s_r": red(r),
            "n_gt_log2": red((np.abs(d) > _LOG2).astype(np.int64)),
            "n_clamped": clamped,
            "s_d": s_d,
            "s_train": red(column(batch, "train_logprob")),
            "n_train": n,
            "s_infer": red(column(batch, "infer_logprob")),
            "n_infer": n,
        })


class MetricsPlan:
    """The mismatch metrics as one accumulator of a streaming pass (:mod:`entr_diag.passes`).

    One table keyed by sequence (``(step, seq_key)``, or ``seq_key`` without a step column,
    :class:`_SeqSums`) holds per-sequence partial sums (token sums of the
    token metrics, sum of delta, sums and counts of both logprobs), merged by addition, so a
    sequence split across batches adds up. :meth:`finish` derives the per-sequence quantities
    (sum delta, mean logprobs) from the merged table and sums them overall and per step.
    Memory O(sequences).
    """

    def __init__(self, lf: pl.LazyFrame) -> None:
        self._per_seq = _SeqSums(lf.collect_schema().names())
        self.has_step = self._per_seq.has_step
        self.accumulators: list[Accumulator] = [self._per_seq]

    def finish(self) -> MismatchMetrics:
        """The metrics from the merged per-sequence table; :class:`FitError` when the pass
        saw no token."""
        # in a fixed order: the merge's group-by returns rows in any order, and float sums in
        # another order differ in the last digit between runs of the same input
        per_seq = self._per_seq.table.result()
        if "seq_key" in per_seq.columns:
            per_seq = per_seq.sort("seq_key")
        if per_seq.height == 0:
            raise FitError("No token to compute mismatch metrics on: the token frame is empty.")
        per_seq = per_seq.with_columns(_seq_means())
        tok_cols = ["n", "s_k1", "s_k3", "s_r2", "s_r", "n_gt_log2", "n_clamped"]
        tok_sums = [pl.col(c).sum() for c in tok_cols]
        tok = per_seq.select(tok_sums).row(0, named=True)
        if not tok["n"]:
            raise FitError("No token to compute mismatch metrics on: the token frame is empty.")
        overall = _make(tok, per_seq.select(_seq_aggs()).row(0, named=True))
        per_step: list[MetricSet] = []
        no_step = 0
        if self.has_step:
            no_step = int(per_seq.filter(pl.col("step").is_null())["n"].sum())
            by_step = (
                per_seq.filter(pl.col("step").is_not_null())
                .group_by("step").agg(*tok_sums, *_seq_aggs()).sort("step")
            )
            for r in by_step.iter_rows(named=True):
                per_step.append(_make(r, r, step=int(r["step"])))
        return MismatchMetrics(overall=overall, per_step=tuple(per_step),
                               tokens_without_step=no_step)


def clamp_note_of(tokens: int, sequences: int, k3_kl: float | None = 0.0) -> str | None:
    """The note saying chi2 / ess are saturated at the +-20 clamp, and that ``k3_kl`` (not
    clamped) is infinite when a delta above ~709.8 nats overflowed exp in float64 (shown
    as '-', null in the JSON), or None (nothing to say). ``tokens``: tokens with
    |delta| > 20; ``sequences``: with |sum delta| > 20; ``k3_kl``: its value (None or NaN
    as read back from JSON: infinite when tokens were clamped, since a finite mean of
    finite terms is never null)."""
    parts = []
    k3_inf = (k3_kl is None or not math.isfinite(k3_kl)) and tokens > 0
    if sequences:
        parts.append(f"{sequences:,} sequence(s) have |sum delta| > 20, so chi2_seq reads "
                     "them at the bound")
    if tokens:
        parts.append(f"{tokens:,} token(s) have |delta| > 20, so chi2_token and ess read "
                     "them at the bound")
    k3 = (" k3_kl is infinite (shown as '-', null in the JSON): it does not clamp, and "
          "exp(delta) overflows float64 above delta = 709.8 nats (placeholder logprobs?)."
          if k3_inf else "")
    if not parts:
        return k3.strip() or None
    return ("Saturated: " + "; ".join(parts) + " (verl's clamp; the unclamped value is "
            "larger for an upward excess)." + k3)



def metrics_plan(lf: pl.LazyFrame) -> MetricsPlan:
    """The plan of :func:`compute_metrics` on ``lf``: run ``plan.accumulators`` in a pass
    over ``lf`` (alone or fused with other plans), then ``plan.finish()``."""
    lf = token_frame(lf, "metrics_plan")
    return MetricsPlan(lf)


def compute_metrics(lf: pl.LazyFrame) -> MismatchMetrics:
    """verl / slime mismatch metrics, overall and per step (see the module docstring).

    ``lf``: canonical token frame (one row per valid loss-masked token; needs seq_key,
    train_logprob, infer_logprob, delta; ``step`` optional). One streaming pass
    (:func:`entr_diag.passes.run_pass` of :func:`metrics_plan`), memory O(sequences).
    ``ess = 1 / mean((w / mean w)^2) = (sum w)^2 / (n sum w^2)`` with token weights
    ``w = r``. Raises :class:`FitError` when the frame holds no token.
    """
    lf = token_frame(lf, "compute_metrics")
    plan = metrics_plan(lf)
    run_pass(lf, plan.accumulators)
    return plan.finish()
