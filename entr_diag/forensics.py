"""Mismatch forensics: recognise the known ways a train-inference mismatch goes wrong.

A mean log-ratio looks alike whatever its cause; per-token logs do not. Public reports of
people running verl, slime, TRL, NeMo-RL, SkyRL, AReaL and OpenRLHF keep naming a handful of
recurring causes (logprob arrays shifted by one token, sampling temperature or top-p applied
on the engine side only, MoE routing that differs between engine and trainer, slowly
degrading mismatch, stale policies mixed in, truncated logprob arrays, placeholder logprobs
such as -500 that no sampler produces, a loss mask over tokens the engine never sampled).
Each check below looks for the signature one cause leaves in the per-token columns of
``docs/CONTRACT.md`` and returns a :class:`Finding` with
the numbers behind it and what to check in the training stack, or says why the data cannot
tell (``cannot_tell``).

Entry points (pure: nothing is printed, nothing is raised for a positive finding):

- :func:`run_forensics` runs the checks and returns :class:`Findings` (``to_dict()`` gives
  ``{"findings": [...], "checks": {name: {"status", "reason"}}}``).
- :func:`detect_misalignment` runs the off-by-one check alone; the CLI stops (exit 2) when it
  returns a finding, unless the user passes ``--allow-misaligned``.
- :func:`forensics_plan` / :func:`misalignment_plan`: the same work as accumulators of a
  streaming pass (:mod:`entr_diag.passes`), to be fused with other analyses' passes.

Passes and memory: all the work on the token frame is done in ONE pass of mergeable
accumulators (:class:`ForensicsPlan`): sums per (entropy bin x step x staleness) cell and per
(entropy bin x sequence block) cell, partial sums per (sequence x entropy bin x staleness)
for the sequence-level checks, and the rows of a hash-sampled subset of sequences (at most
:data:`MISALIGN_MAX_TOKENS` tokens) for the lag join. The checks that read excluded rows
(corrupt rows, exact-zero engine logprobs) share one pass over the raw frame. Memory is
bounded by bins x steps x staleness, sequences x bins and the lag sample; the token frame is
never collected.

Entropy bins are fixed, log-spaced (:data:`H_BIN_LO`, :data:`BIN_DECADES`,
:data:`N_BINS`); "within entropy bins" means the comparison is made at equal entropy, so a
policy that sharpens or flattens over training cannot pass for a mismatch effect (the
entropy-ratio law of arXiv:2607.22186: E[delta^2 | H] ~= k H, METHOD.md).
"""

from __future__ import annotations

import dataclasses
import math
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from entr_diag.aggregate import H_MIN, staleness_step
from entr_diag.errors import ParameterError
from entr_diag.frames import dataset
from entr_diag.io import schema as S
from entr_diag.passes import (
    FILE_INDEX,
    Accumulator,
    GroupAgg,
    PartialRows,
    add_counts,
    column,
    has_nulls,
    run_pass,
    run_rows,
    run_starts,
)

__all__ = [
    "CHECKS",
    "SEVERITIES",
    "CheckStatus",
    "EntropyAlignment",
    "Finding",
    "Findings",
    "ForensicsPlan",
    "ImplausiblePlan",
    "MisalignmentPlan",
    "detect_misalignment",
    "entropy_alignment",
    "forensics_plan",
    "misalignment_plan",
    "run_forensics",
]

# --------------------------------------------------------------------------- constants

#: severities, least to most severe
SEVERITIES: tuple[str, ...] = ("info", "warning", "critical")
_SEV_RANK = {s: i for i, s in enumerate(SEVERITIES)}

#: entropy bins: log10-spaced from H_BIN_LO (nats), BIN_DECADES wide; H below H_BIN_LO falls
#: in the first bin, H above the last edge in the last bin
H_BIN_LO = 1e-4
BIN_DECADES = 0.25
N_BINS = 21  # 1e-4 .. 10^1.25 nats
#: a bin (or cell) takes part in a comparison only with at least this many tokens
MIN_BIN_TOKENS = 100
#: sequence blocks for jackknife uncertainty (block = seq_key % N_BLOCKS, CONTRACT.md)
N_BLOCKS = 100
#: at most this many rows in the joint (bin, step, staleness, block) table of the shared
#: forensics aggregates (one scan instead of two); larger runs take two scans
_JOINT_MAX_ROWS = 400_000
#: normal quantile used for "clearly" (two-sided ~99.7 %)
Z_CLEAR = 3.0

#: off-by-one: a lag of +-1 must make mean |train_logprob[t] - infer_logprob[t+lag]| smaller
#: than MISALIGN_RATIO times its lag-0 value (clean logs: lag +-1 is several times WORSE)
MISALIGN_RATIO = 0.5
#: off-by-one: fewest interior token pairs for a verdict
MISALIGN_MIN_PAIRS = 200
#: shifted alignment: the lags tried, +- each
MISALIGN_LAGS = (1, 2, 3)
#: partial shift: a sequence is tested with at least this many token pairs at a lag
MISALIGN_SEQ_MIN_PAIRS = 8
#: partial shift: fewest shifted sequences, and their smallest share of the tested ones ...
MISALIGN_PARTIAL_MIN_SEQS = 5
MISALIGN_PARTIAL_SHARE = 0.01
#: ... unless they fit their lag this well (their pooled mean |difference| below this
#: fraction of lag 0's; real shifts give ~0.01-0.05, aligned sequences stay above 1.4)
MISALIGN_PARTIAL_STRONG = 0.1
#: ... and fewer than MISALIGN_PARTIAL_MIN_SEQS shifted sequences count when they fit their
#: lag that well over at least this many token pairs together (3 shifted sequences of 973
#: flipped the fitted law unnoticed)
MISALIGN_FEW_MIN_PAIRS = 50
#: off-by-one: tokens of the hash-sampled subset of sequences used for the lag join
MISALIGN_MAX_TOKENS = 2_000_000
#: the pass's pairs of consecutive rows must be at least this share of the pairs the sorted
#: sample finds in the same sequences for the partial test at lags +-1 to read every
#: sequence (rows in position order give 1); below it the sample decides (rows not in
#: position order within their sequences)
MISALIGN_PASS_PAIRED = 0.5
#: lag 0 must fit at least this much better than lags +-1 (pooled ratio of mean |diff|)
#: for the check to say "clear": aligned runs give 40 to 120 (the bundled run 120); two
#: columns of unrelated tokens give about 1 at every lag
MISALIGN_CLEAR_MIN = 1.25

#: entropy alignment: the lags tried, +- each (the surprisal -infer_logprob[t] against
#: entropy[t + lag] within sequences, at consecutive positions)
ENTROPY_ALIGN_LAGS = (1, 2, 3)
#: entropy alignment: fewest tokens with a partner at a lag for that lag to be judged
#: (pooled, and in each input file for the per-file test); each half of the sample (by
#: sequence hash) needs a quarter of it
ENTROPY_ALIGN_MIN_PAIRS = 2000
#: entropy alignment: a lag is the entropy column's shift when its rank correlation with
#: the surprisal exceeds lag 0's by at least this much, pooled and in both halves of the
#: sample. Aligned runs: lag 0 leads by 0.41 to 0.51 (the bundled run and five real
#: tiny-model runs, whose entropy drifts along a sequence) and 0.43 to 0.80 (synthetic
#: runs, top-k engines among them); runs shifted by one token: the shift leads by 0.41
#: (real) and 0.76 (synthetic), by 2 and 3 tokens 0.55 and 0.60 (real)
ENTROPY_ALIGN_GAP = 0.15
#: ... and its own rank correlation is at least this (0.43 to 0.93 at lag 0 on aligned runs;
#: a guard against a gap between two near-zero correlations)
ENTROPY_ALIGN_MIN_RHO = 0.2
#: entropy alignment: the entropy column does not belong to the tokens (``unrelated``) when
#: the surprisal's rank correlation with it stays below this at every lag tried, over at
#: least ENTROPY_ALIGN_MIN_PAIRS tokens and ENTROPY_ALIGN_MIN_SEQS sequences (aligned runs:
#: 0.65 to 0.99 real, 0.43 synthetic; helper-42: a per-sequence mean entropy repeated on
#: every token 0.04, an entropy column shuffled across rows -0.002)
ENTROPY_ALIGN_UNRELATED_RHO = 0.2
#: ... read on at least this many sequences (a few sequences' ranks say little)
ENTROPY_ALIGN_MIN_SEQS = 20
#: entropy alignment: at most about this many of the shift test's sampled tokens are read
#: (whole sequences, by hash): the rank correlations are then known to about 0.005
ENTROPY_ALIGN_MAX_TOKENS = 200_000

#: temperature: the pooled within-entropy-bin slope of infer_logprob on train_logprob must
#: be outside [1 - SLOPE_TOL, 1 + SLOPE_TOL] by Z_CLEAR standard errors (both OLS directions)
SLOPE_TOL = 0.05
#: temperature: below this within-bin correlation of the two columns the slope means nothing
#: (misaligned or unrelated columns), the check cannot tell
TEMP_MIN_CORR = 0.5
#: temperature / drift / trainer floor: engine-side effects are measured on the freshest
#: tokens (smallest staleness; policy change between versions adds to delta: a sharpening
#: policy tilts the slope like a temperature, a changing learning rate moves |delta| over
#: steps) when they number at least this many, else on all tokens
FRESH_MIN_TOKENS = 1000
#: ... in at least this share of the steps (the drift check reads them alone: fresh tokens
#: of the first steps only, e.g. a synchronous warm-up, say nothing of the later ones, and
#: an engine change in the last fifth of the steps went unseen at 0.8)
FRESH_STEP_SHARE = 1.0

#: truncated sampling: entropy (nats) above which the one-sided bias is measured
TRUNC_H_MIN = 0.3
#: truncated sampling: entropy (nats) above which the bias must grow with entropy (below it,
#: log pi <= 0 alone makes delta negative at near-deterministic positions)
TRUNC_TREND_H_MIN = 0.01
#: truncated sampling: share of E[delta^2] carried by the squared mean (mean^2 / E[delta^2])
#: above TRUNC_H_MIN; an unbiased numeric mismatch has mean ~ -KL ~ -E[delta^2]/2, so the share
#: is ~E[delta^2]/4, far below this
TRUNC_BIAS_SHARE = 0.2
#: truncated sampling: the law (k, alpha) on raw and de-biased delta is fitted on bins above
#: this entropy (nats), away from the low-entropy noise regime
TRUNC_LAW_H_MIN = 0.1
#: truncated sampling: Kendall tau p-value of (entropy, -mean delta) across bins
TRUNC_TREND_P = 0.01
#: truncated sampling: the bias share is also read on the upper tail, the highest-entropy
#: bins holding this share of the tokens above TRUNC_H_MIN: a top-k with a large k, or a
#: model sure of itself at most positions, truncates only its flattest distributions
#: (helper-43: a real top-k 20 run, 80% of its tokens below 1.9 nats, pooled share 19%,
#: upper tail 66%; real clean, stale, temperature and untruncated-log runs 0.0 to 2.6%)
TRUNC_TAIL_SHARE = 0.1
#: truncated sampling: the upper tail's mean delta this many standard errors below the
#: lower bins' (above TRUNC_H_MIN) is a bias growing with entropy, as the Kendall trend is
TRUNC_TAIL_Z = 4.0
#: truncated sampling: a bias share this large is one-sided enough without the entropy trend
#: (top-p saturates: -mean delta tends to -log(top_p) at high entropy and is not monotone)
TRUNC_STRONG_SHARE = 0.5

#: sequence outliers: sequences shorter than this are not scored
OUTLIER_MIN_TOKENS = 16
#: sequence outliers: robust z (median / MAD over sequences) of log(mean |delta| / expected)
OUTLIER_Z = 6.0
#: sequence outliers: flagged sequences carrying at least this share of sum delta^2 make a
#: warning (below: info)
OUTLIER_SHARE_WARN = 0.05
#: sequence outliers: at most this share of scored sequences may be flagged (more is not an
#: outlier population but a broad tail, left to the fit)
OUTLIER_MAX_SEQ_SHARE = 0.05
#: sequence outliers: flagged sequences carrying less than this share of sum delta^2 are
#: reported in the status reason only (heavy-tailed clean runs always have a few)
OUTLIER_MIN_SHARE = 0.01
#: sequence outliers: number of seq_ids listed
OUTLIER_LIST = 10

#: drift: fewest distinct steps
DRIFT_MIN_STEPS = 4
#: drift / staleness: a (entropy bin, step, staleness) cell takes part with this many tokens
MIN_CELL_TOKENS = 20
#: drift: p-value of the within-bin trend and growth of mean |delta| over the run (factor)
DRIFT_P = 1e-3
DRIFT_MIN_GROWTH = 1.25
#: staleness: p-value and growth of mean |delta| per version of lag (factor, info)
STALENESS_P = 1e-3
STALENESS_MIN_GROWTH = 1.05
#: staleness is a warning (a caveat beside the verdict) when policy drift carries at least
#: this share of the law bins' sum delta^2 (the pooled law then describes the drift more
#: than the engine mismatch: its k at least 4x the freshest tokens')
STALENESS_WARN_SHARE = 0.75

#: corrupt rows: a sequence is reported when its loss-masked tokens end in at least this many
#: non-finite logprobs, or hold a run of at least this many consecutive placeholder values
CORRUPT_MIN_RUN = 3
#: corrupt-row patterns holding fewer than this share of the loss-masked tokens are info
CORRUPT_INFO_SHARE = 1e-3
#: scattered bad tokens (no suffix, burst or placeholder run) holding at least this share of
#: the loss-masked tokens are a warning of the corrupt-rows check
CORRUPT_SCATTERED_SHARE = 0.05
#: runs of non-finite logprobs whose number has at least this Poisson upper-tail
#: probability under scattered bad tokens are chance, not bursts
CORRUPT_CHANCE_P = 1e-3
#: exclusion reasons that are placeholder values (io.schema.EXCLUSION_REASONS)
PLACEHOLDER_REASONS: tuple[str, ...] = ("zero_placeholder", "sentinel_logprob", "positive_logprob")
_NOT_MASKED = ("unmasked", "padding", "empty_row", "null_loss_mask", "invalid_loss_mask")

#: implausible logprobs (defined with the loader's value bounds, :mod:`entr_diag.io.schema`)
IMPLAUSIBLE_LOGPROB = S.IMPLAUSIBLE_LOGPROB
#: implausible logprobs: carrying at least this share of sum delta^2 makes a warning (they
#: move the law's k by about as much; below: info), at least this share critical (the law
#: then describes them, not the mismatch)
IMPLAUSIBLE_SHARE_WARN = 0.01
IMPLAUSIBLE_SHARE_CRITICAL = 0.5

#: trainer noise floor: mismatch below this multiple of the floor is "at the floor"
FLOOR_RATIO_AT_FLOOR = 2.0

#: unsampled tokens: a sampled-token probability below this (a surprisal of -ln 1e-3 =
#: 6.9 nats or more) at low entropy
UNSAMPLED_P = 1e-3
#: ... read on the tokens whose entropy is below this (nats): forensic bins 0..11, whose
#: upper edges run from 1.8e-4 to 0.1 nats; Markov's bound there is at most 1.4%
UNSAMPLED_H_MAX = 0.1
#: a finding needs a Bonferroni-corrected Poisson upper tail below this, ...
UNSAMPLED_PVALUE = 1e-6
#: ... this many times the bound (real clean runs sit at 0.4 to 0.7 times it, at most 1.9
#: on a few tokens), ...
UNSAMPLED_MIN_RATIO = 2.0
#: ... and this many tokens above it
UNSAMPLED_MIN_EXCESS = 10
#: a warning (not info) when this share of the flagged tokens is its sequence's first
#: loss-masked token (a mask shifted by one: all of them in single-turn rollouts, one per
#: turn in multi-turn ones) and this factor times the share tokens spread at random would
#: put there (1 / the sequence's tokens), ...
UNSAMPLED_FIRST_SHARE = 0.3
UNSAMPLED_BASE_FACTOR = 5.0
#: ... or when this share lies in the first UNSAMPLED_EARLY of its sequence's loss-masked
#: positions (the prompt in the mask), and twice the share tokens spread at random would
#: put there (about 25% on long sequences, all of them on 1-token ones)
UNSAMPLED_EARLY = 0.25
UNSAMPLED_EARLY_SHARE = 0.6
#: critical (a located mask fault) from this share of the valid tokens above the bound
UNSAMPLED_CRITICAL_SHARE = 0.01
#: spread over the sequences: a warning (not info) from this share (the planted noise of
#: entr-diag synth's defaults reads about 11%; the units check names the global causes,
#: a temperature or a truncated entropy, on its own)
UNSAMPLED_SPREAD_WARN_SHARE = 0.25
#: the flagged rows kept for the localisation (about 20 bytes each), whole sequences (2M
#: had taken fit to 1.06 GB peak at 50M synthetic tokens, 10% of them flagged; 1M: 0.95)
UNSAMPLED_MAX_ROWS = 1_000_000

#: mask-start surprisal: the start of the mask is each window of this many positions
#: after a sequence's first loss-masked token (span starts aside), read against the
#: tokens after it (a window of fixed size: a prompt of 16 to 32 tokens in a mask of 580
#: read +0.056 nats over its first 25%, +0.29 over its first 16 tokens; helper-39); ...
MASK_START_WINDOWS = (4, 16, 64)
#: ... on the sequences with at least this many valid tokens after the window, ...
MASK_START_MIN_TOKENS = 8
#: ... a finding needs at least this many of them, ...
MASK_START_MIN_SEQS = 20
#: ... a one-sided p-value (t-test over the sequences, Bonferroni over the windows and the
#: span starts) below this, ...
MASK_START_PVALUE = 1e-6
#: ... and a mean excess of surprisal over entropy of this many nats or more in a window,
#: or the logged bias if larger (:func:`_check_mask_start`) (helper-36's real tiny-model runs: 15 clean or mis-logged ones, sampled at T 0.7
#: to 1.3, top-k, top-p, stale, tool outputs in the mask, T = 0.7 logged at T = 1: -0.018
#: to +0.014, the last at t = 3.1; English or held-out prompts in the mask: +0.29,
#: prompts the model sampled at T = 1.5: +0.7) ...
MASK_START_MIN_EXCESS = 0.1
#: ... and on the span starts, one per turn, so noisier (the same clean runs: -0.065 to
#: +0.073 at |t| <= 2.7; a mask shifted onto English text: +0.33, onto text the model
#: sampled at T = 1.5: +1.5; helper-39: clean runs sampled with top-p and logged
#: untruncated, +0.06 to +0.1 at t up to 20, their logged bias 0.22 to 0.46)
MASK_START_MIN_EXCESS_FIRST = 0.2
#: a loss-masked span starts after a gap of more than this many positions (a tool output or
#: a user turn outside the mask; a few excluded rows leave smaller gaps, whose next token,
#: sampled, would dilute the span starts)
MASK_START_SPAN_GAP = 4
#: the valid tokens kept for the test (about 24 bytes each), whole sequences (1M: 10,000
#: sequences of 100 tokens, 120 of 8,000; helper-36's faults gave t = 7 to 85 on 1,152)
MASK_START_MAX_ROWS = 1_000_000

#: check names, in run order
CHECKS: tuple[str, ...] = (
    "misalignment",
    "one_sided_temperature",
    "truncated_sampling",
    "sequence_outliers",
    "drift",
    "staleness",
    "corrupt_rows",
    "implausible_logprobs",
    "unsampled_tokens",
    "mask_start_surprisal",
    "trainer_noise_floor",
)

# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class Finding:
    """One recognised cause of mismatch.

    Attributes:
        kind: the check that found it (one of :data:`CHECKS`).
        severity: ``"info"``, ``"warning"`` or ``"critical"``.
        title: one line.
        message: what the numbers say, in a few sentences.
        evidence: the numbers behind it (floats, ints, strings, lists of them).
        check: what to check in the training stack.
    """

    kind: str
    severity: str
    title: str
    message: str
    evidence: Mapping[str, Any]
    check: str

    def to_dict(self) -> dict:
        return {
            "kind": self.kind,
            "severity": self.severity,
            "title": self.title,
            "message": self.message,
            "evidence": {k: _plain(v) for k, v in self.evidence.items()},
            "check": self.check,
        }


@dataclass(frozen=True)
class CheckStatus:
    """Outcome of one check: ``status`` is ``"found"``, ``"clear"`` or ``"cannot_tell"``."""

    name: str
    status: str
    reason: str

    def to_dict(self) -> dict:
        return {"status": self.status, "reason": self.reason}


@dataclass(frozen=True)
class Findings:
    """Result of :func:`run_forensics`: findings (most severe first) and every check's status."""

    findings: tuple[Finding, ...] = ()
    checks: tuple[CheckStatus, ...] = field(default_factory=tuple)

    @property
    def silent(self) -> bool:
        """True when no finding is above ``info``."""
        return all(f.severity == "info" for f in self.findings)

    @property
    def worst(self) -> str | None:
        """The highest severity among the findings, ``None`` without findings."""
        if not self.findings:
            return None
        return max((f.severity for f in self.findings), key=_SEV_RANK.__getitem__)

    @property
    def cannot_tell(self) -> tuple[CheckStatus, ...]:
        return tuple(c for c in self.checks if c.status == "cannot_tell")

    def by_kind(self, kind: str) -> Finding | None:
        for f in self.findings:
            if f.kind == kind:
                return f
        return None

    def status(self, name: str) -> CheckStatus | None:
        for c in self.checks:
            if c.name == name:
                return c
        return None

    def to_dict(self) -> dict:
        return {
            "findings": [f.to_dict() for f in self.findings],
            "checks": {c.name: c.to_dict() for c in self.checks},
        }


def _lf_schema(ds: Any) -> pl.Schema:
    """The schema of ``ds.lf`` (a loaded dataset's, resolved once: ``Dataset.lf_schema``)."""
    got = getattr(ds, "lf_schema", None)
    return got if isinstance(got, pl.Schema) else ds.lf.collect_schema()


def _raw_schema(ds: Any) -> pl.Schema:
    """The schema of ``ds.raw`` (``Dataset.raw_schema``, resolved once)."""
    got = getattr(ds, "raw_schema", None)
    return got if isinstance(got, pl.Schema) else ds.raw.collect_schema()


def _plain(v: Any) -> Any:
    if isinstance(v, (np.floating,)):
        return float(v)
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, np.ndarray):
        return [_plain(x) for x in v.tolist()]
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


def _r(x: float, nd: int = 4) -> float:
    """Round to ``nd`` significant digits (evidence numbers); NaN/inf pass through."""
    x = float(x)
    if not math.isfinite(x) or x == 0:
        return x
    return float(f"{x:.{nd}g}")


# --------------------------------------------------------------------------- shared work


def _bin_expr() -> pl.Expr:
    h = pl.col("entropy").clip(lower_bound=H_BIN_LO)
    b = ((h.log10() - math.log10(H_BIN_LO)) / BIN_DECADES).floor()
    return b.clip(0, N_BINS - 1).cast(pl.Int32).alias("bin")


def _merged(acc: GroupAgg, empty: pl.DataFrame) -> pl.DataFrame:
    """The merged table of ``acc``; typed and empty when the pass saw no row (the
    aggregation run on ``empty``, a typed empty batch of the pass)."""
    lf = empty.lazy() if acc.prepare is None else acc.prepare(empty.lazy())
    return acc.result(empty_schema=lf.group_by(acc.keys).agg(acc.aggs).collect())


#: prefix of the per-token key the streaming engine computes for :class:`_TokenTables`
_FX = "_fx_"
#: at most this many slots in each dense table of :class:`_TokenTables`: (bin, step,
#: staleness) cells and (bin, staleness, block) blocks; above, polars group-bys
_DENSE_MAX_SLOTS = 400_000


def _slot_expr(col: str, values: Sequence[int]) -> pl.Expr:
    """Int64 index of ``col`` in ``values`` (sorted, distinct), -1 for a null or a value not
    listed."""
    c, n = pl.col(col), len(values)
    if n and list(values) == list(range(values[0], values[0] + n)):
        i = c - values[0]
        return pl.when((i >= 0) & (i < n)).then(i).otherwise(-1).fill_null(-1)
    return c.replace_strict(list(values), list(range(n)), default=-1, return_dtype=pl.Int64)


def _small_int(values: Sequence[int]) -> pl.DataType:
    """The smallest signed integer dtype holding ``values``."""
    lo, hi = min(values, default=0), max(values, default=0)
    for dt, bits in ((pl.Int8, 8), (pl.Int16, 16), (pl.Int32, 32)):
        if -(1 << (bits - 1)) <= lo and hi < (1 << (bits - 1)):
            return dt
    return pl.Int64


@dataclass(frozen=True)
class _Slots:
    """Dense layout of the token-pass keys, from the accounting: the step values and the
    staleness values (a single 0 for an absent column, as the derived ``_step`` /
    ``_stale`` constants). A token whose step or staleness is null or not listed, or whose
    bin is null, has no slot (its batch takes the group-by path)."""

    steps: tuple[int, ...]
    stales: tuple[int, ...]

    @property
    def ns(self) -> int:
        return len(self.steps)

    @property
    def nt(self) -> int:
        return len(self.stales)

    def sub(self, names: set[str]) -> pl.Expr:
        """Int32 (bin, staleness) slot ``bin * nt + staleness index`` of a token, -1 for
        none."""
        b = (_bin_expr() if "entropy" in names else pl.lit(0, dtype=pl.Int32)).cast(pl.Int64)
        ti = (_slot_expr("staleness", self.stales) if "staleness" in names
              else pl.lit(0, dtype=pl.Int64))
        return (pl.when(ti >= 0).then(b * self.nt + ti).otherwise(-1).fill_null(-1)
                .cast(pl.Int32))


def _dense_slots(ctx: Any) -> _Slots | None:
    """The dense layout when the accounting lists the steps and staleness values and the
    tables stay within :data:`_DENSE_MAX_SLOTS`; else None (group-bys)."""
    acc = getattr(ctx.ds, "accounting", None)
    if acc is None:
        return None
    steps, stales = (0,), (0,)
    if ctx.has("step"):
        if acc.steps is None:
            return None
        steps = tuple(sorted(set(acc.steps)))
    if ctx.has("staleness"):
        if acc.staleness is None:
            return None
        stales = tuple(sorted(acc.staleness))
    s = _Slots(steps, stales)
    if not s.ns or not s.nt or max(N_BINS * s.ns * s.nt,
                                   N_BINS * s.nt * N_BLOCKS) > _DENSE_MAX_SLOTS:
        return None
    return s


class _SeqTables:
    """The tables of the sequence-level checks:

    - ``bins``: n, sum H, sum delta^2 per (seq_key, bin, _stale), kept as partial rows (a
      key may repeat across batches; readers only sum them over coarser keys), merged when
      they exceed ``compact_rows`` (32M, about 1 GB) and twice the last merged table;
      memory O(sequences x bins), about 30 bytes a row from :class:`_TokenTables` (small
      integer dtypes for bin and staleness). The tokens of a sequence are normally
      contiguous in a dump, so the keys barely repeat and merging would not shrink the
      table: it only protects against shuffled inputs (measured at 200M tokens, merging
      from 8M rows raised the peak from 2.5 to 5.3 GB);
    - ``seqs``: per sequence seq_id, n, sums of |delta|, delta^2, H and the count of H,
      merged by addition, the last valid position ``pos_max`` (corrupt rows), merged by
      max, and the first ``pos_min`` (unsampled tokens), merged by min.

    As an accumulator (the group-by path, inside :class:`_Derived`): one polars group-by
    per (sequence, entropy bin, staleness) and batch. With a dense layout,
    :class:`_TokenTables` adds the rows it reduced with numpy.
    """

    _KEYS = ("seq_key", "bin", "_stale")
    columns = ("seq_key", "seq_id", "entropy", "staleness", "delta", "position")
    #: seq_id may come as read (an integer): kept as String (passes.NATIVE_SEQ_ID)
    native_seq_id = True

    def __init__(self, compact_rows: int = 32_000_000) -> None:
        self._bins = PartialRows(list(self._KEYS), [pl.col("n", "sh", "sd2").sum()],
                                 compact_rows)
        d = pl.col("delta")
        self._aggs = [
            pl.col("seq_id").first().cast(pl.String),
            pl.len().cast(pl.Int32).alias("n"),
            pl.col("_h").count().cast(pl.Int32).alias("nh"),
            pl.col("_h").sum().alias("sh"),
            (d * d).sum().alias("sd2"),
            d.abs().sum().alias("sad"),
            pl.col("position").max().alias("pos_max"),
            pl.col("position").min().alias("pos_min"),
        ]
        self.seqs = PartialRows(
            ["seq_key"], [pl.col("seq_id").first(), *_sums(("n", "nh", "sh", "sd2", "sad")),
                          pl.col("pos_max").max(), pl.col("pos_min").min()],
            cast={"seq_id": pl.String})

    def update(self, batch: pl.DataFrame) -> None:
        """A batch with the :class:`_Derived` columns, by a polars group-by."""
        p = batch.group_by(self._KEYS).agg(self._aggs)
        self.seqs.add(p.group_by("seq_key").agg(
            pl.col("seq_id").first().cast(pl.String),
            *[pl.col(c).cast(pl.Int64).sum() for c in ("n", "nh")],
            *_sums(("sh", "sd2", "sad")), pl.col("pos_max").max(), pl.col("pos_min").min()))
        self.add_bins(p.select(*self._KEYS, "n", "sh", "sd2"))

    def add_bins(self, p: pl.DataFrame | dict) -> None:
        """Partial (seq_key, bin, _stale) rows n, sh, sd2."""
        self._bins.add(p)

    def tables(self, empty: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
        """(bins, seqs); ``empty``: a typed empty batch (with the derived columns) for a pass
        that saw no row."""
        bins = self._bins.rows()
        if bins is None:
            self.update(empty)
            bins = self._bins.rows()
        return bins, self.seqs.result()


def _derive(names: set[str]) -> list[pl.Expr]:
    """The columns the forensics group by (entropy bin, step, staleness, entropy, sequence
    block), constants for an absent column."""
    return [
        _bin_expr() if "entropy" in names else pl.lit(0, dtype=pl.Int32).alias("bin"),
        (pl.col("step") if "step" in names else pl.lit(0, dtype=pl.Int64)).alias("_step"),
        (pl.col("staleness") if "staleness" in names
         else pl.lit(0, dtype=pl.Int64)).alias("_stale"),
        (pl.col("entropy") if "entropy" in names else pl.lit(0.0)).alias("_h"),
        (pl.col("seq_key") % N_BLOCKS).cast(pl.Int32).alias("block"),
    ]


class _Derived:
    """Adds the columns the forensics group by (:func:`_derive`) to each batch once, then
    feeds it to the inner accumulators (the group-by path)."""

    def __init__(self, names: set[str], inner: Sequence[Accumulator]) -> None:
        self.inner = list(inner)
        self.columns = list(dict.fromkeys(c for a in self.inner for c in a.columns))
        self.derive = _derive(names)
        self.native_seq_id = all(getattr(a, "native_seq_id", False) for a in self.inner
                                 if "seq_id" in a.columns)

    def update(self, batch: pl.DataFrame) -> None:
        b = batch.with_columns(self.derive)
        for acc in self.inner:
            acc.update(b)


class _TokenTables:
    """Token-pass accumulator of the forensics tables on a dense layout (:class:`_Slots`):
    the (bin, step, staleness) cell sums, the (bin, staleness, block) block sums and the
    sequence tables (:class:`_SeqTables`), each when given.

    The (bin, staleness) slot of each token is computed by the streaming engine
    (:attr:`exprs`). Per batch, numpy reduces the tokens to (run, bin, staleness) slots with
    ``bincount`` (a run: consecutive tokens of one sequence, so one step and one block; the
    tokens of a sequence are usually contiguous, a batch holds a few thousand runs); the
    cells, blocks and sequence rows are sums of those few slots. A batch with a null, a
    step or staleness the accounting did not list (never on a validated frame) takes the
    group-by path: ``cells_fb`` / ``blocks_fb`` and the group-by of ``seq``, on the
    :class:`_Derived` columns; :meth:`cells` / :meth:`blocks` merge their tables.
    """

    def __init__(self, names: set[str], slots: _Slots, floor: bool,
                 cells_fb: GroupAgg | None, blocks_fb: GroupAgg | None,
                 seq: _SeqTables | None) -> None:
        self.slots, self.floor = slots, floor
        self.has_step = "step" in names
        self.cells_fb, self.blocks_fb, self.seq = cells_fb, blocks_fb, seq
        self.columns = ["seq_key", "entropy", "step", "staleness", "delta"]
        if blocks_fb is not None or floor:
            self.columns.append("train_logprob")
        if blocks_fb is not None:
            self.columns.append("infer_logprob")
        if floor:
            self.columns.append("train_logprob_recompute")
        if seq is not None:
            self.columns += ["seq_id", "position"]
        #: seq_id may come as read (an integer): kept as String (passes.NATIVE_SEQ_ID)
        self.native_seq_id = seq is None or seq.native_seq_id
        self._nulls = [c for c in self.columns if c != "train_logprob_recompute"]
        self.derive = _derive(names)
        self.exprs = [slots.sub(names).alias(_FX + "sub")]
        self._steps = np.array(slots.steps, dtype=np.int64)
        self._stale_of = pl.Series("_stale", slots.stales,
                                   dtype=_small_int(slots.stales)).to_numpy()
        #: the weights summed per slot
        self._w = ["sh", "sd2"]
        if cells_fb is not None:
            self._w += ["sd", "sad", "nneg", *(_FLOOR_COLS if floor else ())]
        if blocks_fb is not None:
            self._w += list(_BLOCK_COLS)
        if seq is not None:
            self._w.append("sad")
        self._w = list(dict.fromkeys(self._w))
        self._cells = ({c: np.zeros(N_BINS * slots.ns * slots.nt)
                        for c in ("n", *_CELL_COLS, *(_FLOOR_COLS if floor else ()))}
                       if cells_fb is not None else None)
        self._blocks = ({c: np.zeros(N_BINS * slots.nt * N_BLOCKS) for c in ("n", *_BLOCK_COLS)}
                        if blocks_fb is not None else None)
        self._fallback = False
        self._buf = np.empty(0)
        self._k = np.empty((3, 0), dtype=np.int64)

    def _grouped(self, batch: pl.DataFrame) -> None:
        b = batch.with_columns(self.derive)
        for acc in (self.cells_fb, self.blocks_fb, self.seq):
            if acc is not None:
                acc.update(b)
        self._fallback = True

    def _terms(self, batch: pl.DataFrame) -> Iterator[tuple[str, np.ndarray]]:
        """(name, per-token weight) for each slot sum; a weight is valid until the next one
        is drawn (computed in one reused buffer)."""
        d = column(batch, "delta")
        x = column(batch, "train_logprob") if "train_logprob" in self.columns else None
        y = column(batch, "infer_logprob") if "infer_logprob" in self.columns else None
        if self._buf.size < d.size:
            self._buf = np.empty(d.size)
        buf = self._buf[:d.size]
        ok = e = None
        if self.floor:
            assert x is not None
            rc = column(batch, "train_logprob_recompute")
            ok = np.isfinite(rc)
            e = np.where(ok, x - rc, 0.0)
        fns: dict[str, Callable[[], np.ndarray]] = {
            "sh": lambda: (column(batch, "entropy") if "entropy" in batch.columns
                           else np.zeros(d.size)),
            "sd": lambda: d, "sd2": lambda: np.multiply(d, d, out=buf),
            "sad": lambda: np.abs(d, out=buf), "nneg": lambda: np.less(d, 0.0, out=buf),
            "f_n": lambda: ok.astype(np.float64), "f_e2": lambda: e * e,
            "f_d2": lambda: np.where(ok, d * d, 0.0), "f_ae": lambda: np.abs(e),
            "f_ad": lambda: np.where(ok, np.abs(d), 0.0),
            "sx": lambda: x, "sy": lambda: y, "sxx": lambda: np.multiply(x, x, out=buf),
            "syy": lambda: np.multiply(y, y, out=buf), "sxy": lambda: np.multiply(x, y, out=buf),
        }
        for name in self._w:
            yield name, fns[name]()

    def update(self, batch: pl.DataFrame) -> None:
        sub = column(batch, _FX + "sub")
        if has_nulls(batch, self._nulls) or int(sub.min()) < 0:
            self._grouped(batch)
            return
        s = self.slots
        starts = run_starts(batch, ["seq_key", "step"] if self.has_step else ["seq_key"])
        si = np.zeros(starts.size, dtype=np.int64)  # step index of each run
        if self.has_step:
            sv = column(batch, "step")[starts]
            si = np.minimum(np.searchsorted(self._steps, sv), s.ns - 1)
            if not np.array_equal(self._steps[si], sv):  # a step the accounting did not list
                self._grouped(batch)
                return
        # slot of a token: run * m + rank of its (bin, staleness) among those of the batch
        nsub = N_BINS * s.nt
        if self._k.shape[1] < sub.size:  # reused int64 buffers (no page faults)
            self._k = np.empty((3, sub.size), dtype=np.int64)
        # the Int32 slots as int64 once (bincount and take would each cast them)
        k, r, sub64 = self._k[:, :sub.size]
        np.copyto(sub64, sub)
        ids = np.flatnonzero(np.bincount(sub64, minlength=nsub))
        m = ids.size
        rank = np.zeros(nsub, dtype=np.int64)
        rank[ids] = np.arange(m)
        k.fill(0)
        k[starts[1:]] = m
        np.cumsum(k, out=k)
        k += np.take(rank, sub64, out=r)
        size = starts.size * m
        cnt = np.bincount(k, minlength=size)
        nz = np.flatnonzero(cnt)
        sums = {"n": cnt[nz].astype(np.float64)}
        for name, w in self._terms(batch):
            sums[name] = np.bincount(k, weights=w, minlength=size)[nz]
        run, sb = nz // m, ids[nz % m]  # run and (bin, staleness) of each slot
        bin_, ti = sb // s.nt, sb % s.nt
        sk = column(batch, "seq_key")[starts]
        if self._cells is not None:
            self._add(self._cells, ((bin_ * s.ns + si[run]) * s.nt + ti), sums)
        if self._blocks is not None:
            self._add(self._blocks, sb * N_BLOCKS + (sk % N_BLOCKS).astype(np.int64)[run], sums)
        if self.seq is not None:
            self._add_seq(batch, starts, sk, run, bin_, ti, sums)

    @staticmethod
    def _add(table: dict[str, np.ndarray], key: np.ndarray, sums: dict[str, np.ndarray]
             ) -> None:
        for c, acc in table.items():
            acc += np.bincount(key, weights=sums[c], minlength=acc.size)

    def _add_seq(self, batch: pl.DataFrame, starts: np.ndarray, sk: np.ndarray,
                 run: np.ndarray, bin_: np.ndarray, ti: np.ndarray,
                 sums: dict[str, np.ndarray]) -> None:
        assert self.seq is not None
        self.seq.add_bins({
            "seq_key": sk[run], "bin": bin_.astype(np.int8),
            "_stale": self._stale_of[ti], "n": sums["n"].astype(np.int32),
            "sh": sums["sh"], "sd2": sums["sd2"]})
        first = np.flatnonzero(np.diff(run, prepend=-1))  # first slot of each run
        length = np.diff(np.append(starts, batch.height)).astype(np.int64)
        sid = batch.get_column("seq_id")
        self.seq.seqs.add({
            "seq_key": sk,
            # an integer seq_id as numpy (made a String per frame of many batches)
            "seq_id": (column(batch, "seq_id")[starts]
                       if sid.dtype.is_integer() and not sid.null_count()
                       else sid.gather(pl.Series(starts)).cast(pl.String)),
            "n": length, "nh": length,
            **{c: np.add.reduceat(sums[c], first) for c in ("sh", "sd2", "sad")},
            "pos_max": np.maximum.reduceat(column(batch, "position"), starts),
            "pos_min": np.minimum.reduceat(column(batch, "position"), starts)})

    def _table(self, sums: dict[str, np.ndarray], keys: dict[str, Callable[[np.ndarray], Any]],
               ints: Sequence[str], fb: GroupAgg, empty: pl.DataFrame) -> pl.DataFrame:
        nz = np.flatnonzero(sums["n"])
        cols: dict[str, Any] = {k: f(nz) for k, f in keys.items()}
        for c, v in sums.items():
            cols[c] = pl.Series(c, np.rint(v[nz]).astype(np.int64) if c in ints else v[nz])
        out = pl.DataFrame(cols)
        if self._fallback:  # batches that took the group-by path: merged with their table
            out = (pl.concat([out, _merged(fb, empty)], how="vertical_relaxed")
                   .group_by(list(keys)).agg(_sums(sums)))
        return out

    def cells(self, empty: pl.DataFrame) -> pl.DataFrame:
        """Rows per (bin, _step, _stale) with a token, as the group-by of the cells."""
        assert self._cells is not None and self.cells_fb is not None
        s = self.slots
        steps = pl.Series("_step", s.steps, dtype=pl.Int64)
        stales = pl.Series("_stale", s.stales, dtype=pl.Int64)
        keys = {"bin": lambda i: pl.Series("bin", i // (s.ns * s.nt), dtype=pl.Int32),
                "_step": lambda i: steps.gather(i // s.nt % s.ns),
                "_stale": lambda i: stales.gather(i % s.nt)}
        return self._table(self._cells, keys, ("n", "nneg", "f_n"), self.cells_fb, empty)

    def blocks(self, empty: pl.DataFrame) -> pl.DataFrame:
        """Rows per (bin, block, _stale) with a token, as the group-by of the blocks."""
        assert self._blocks is not None and self.blocks_fb is not None
        s = self.slots
        stales = pl.Series("_stale", s.stales, dtype=pl.Int64)
        keys = {"bin": lambda i: pl.Series("bin", i // (s.nt * N_BLOCKS), dtype=pl.Int32),
                "block": lambda i: pl.Series("block", i % N_BLOCKS, dtype=pl.Int32),
                "_stale": lambda i: stales.gather(i // N_BLOCKS % s.nt)}
        return self._table(self._blocks, keys, ("n",), self.blocks_fb, empty)


class _Ctx:
    """The dataset plus the small tables shared by several checks.

    The tables are filled by :class:`ForensicsPlan` after its pass (token frame) and its raw
    pass (raw frame); the checks read only them, never the input.
    """

    def __init__(self, ds: Any) -> None:
        self.ds = ds
        self.lf: pl.LazyFrame = ds.lf
        self.names = set(_lf_schema(ds).names())
        self._cells: pl.DataFrame | None = None
        self._blocks: pl.DataFrame | None = None
        self._trend: _Trend | None = None
        #: the fitted law's H* (the staleness check reads the bins above it only: the noise
        #: regime's delta is no policy drift), set by ForensicsPlan.finish(h_star=...)
        self.law_h_star: float | None = None
        #: the logprob column the fit's units check found holding another token's logprob
        #: (None: none), set by ForensicsPlan.finish(other_token=...)
        self.other_token: str | None = None
        #: the unit mistake the fit's units check names (None: none), set by
        #: ForensicsPlan.finish(unit_mistake=...); whether that check ran (units_checked)
        self.unit_mistake: str | None = None
        self.units_checked = False
        #: sequence outliers: per (seq_key, bin, _stale) partial rows (a key may repeat: sum
        #: over them) n, sh, sd2; per seq_key: seq_id, n, nh, sh, sd2, sad
        self.seqbins: pl.DataFrame | None = None
        self.seqs: pl.DataFrame | None = None
        #: the misalignment result of this pass (None: not run)
        self.misalign: _Result | None = None
        #: raw frame: bad masked rows per sequence, last finite masked position per sequence,
        #: (zero placeholders, masked rows) when there is no accounting
        self._bad: pl.DataFrame | None = None
        self.last_ok: pl.DataFrame | None = None
        self.zero_counts: tuple[int, int] | None = None
        #: token frame: the tokens with an implausible logprob (None: not run)
        self.implausible: _ImplausibleTokens | None = None
        #: token frame: the low-entropy tokens with a small sampled-token probability (None:
        #: not run)
        self.unsampled: _UnsampledTokens | None = None
        #: token frame: the valid tokens of whole sequences, for the mask-start surprisal
        #: check (None: not run)
        self.mask_start: _MaskStartTokens | None = None
        #: the entropy column looks shifted against the logprobs (the CLI's entropy
        #: alignment), set by ForensicsPlan.finish(entropy_shifted=...)
        self.entropy_shifted = False
        #: the share of the loss-masked tokens with an entropy out of range when it voids
        #: the verdict (else 0), set by ForensicsPlan.finish(entropy_out_of_range=...)
        self.entropy_out_of_range = 0.0

    def has(self, col: str) -> bool:
        return col in self.names

    def _joint_rows_bound(self) -> float:
        """Upper bound on the rows of the joint (bin, step, staleness, block) table, from the
        accounting (inf when unknown)."""
        acc = getattr(self.ds, "accounting", None)
        if acc is None:
            return math.inf
        n_steps = 1
        if self.has("step"):
            if acc.steps is None:
                return math.inf
            n_steps = len(acc.steps) + 1  # + a null step
        n_stale = 1
        if self.has("staleness"):
            if acc.staleness is None:
                return math.inf
            n_stale = len(acc.staleness) + 1  # + a null staleness
        return float(N_BINS * n_steps * n_stale * N_BLOCKS)

    @property
    def cells(self) -> pl.DataFrame:
        """Rows per (bin, _step, _stale): n, sh (sum H), sd, sd2, sad, nneg; with
        train_logprob_recompute also the trainer-floor sums (f_n, f_e2, f_d2, f_ae, f_ad)."""
        if self._cells is None:
            raise RuntimeError("forensics cells read before the pass (ForensicsPlan.finish)")
        return self._cells

    @property
    def blocks(self) -> pl.DataFrame:
        """Rows per (bin, block, _stale): n, sums of x=train_logprob, y=infer_logprob and
        their products."""
        if self._blocks is None:
            raise RuntimeError("forensics blocks read before the pass (ForensicsPlan.finish)")
        return self._blocks

    def bins(self) -> pl.DataFrame:
        """Per entropy bin: n, mean H, mean delta, mean delta^2, mean |delta| (sorted by bin)."""
        return _bins_of(self.cells)


def units_from_tables(ctx: _Ctx) -> Any:
    """The fit's units check (:class:`entr_diag.fit.UnitsCheck`: entropy in bits or log10,
    logprobs in log10 or log2, an entropy column scaled by a constant) read on the
    forensic entropy bins, for ``inspect``, which fits no law: per bin, n and the sums of
    H and delta from the cells, of infer_logprob (y), its square and products from the
    blocks (delta = x - y). None without an entropy column or before the pass. A unit
    mistake scales every bin alike, so the bins' kind matters little; the fit's own
    reading (on the law's bins) is the one its verdict uses."""
    from entr_diag.fit import _units_check

    if not ctx.has("entropy") or ctx._cells is None or ctx._blocks is None:
        return None
    c = ctx.cells.group_by("bin").agg(pl.col("n", "sh", "sd").sum())
    b = ctx.blocks.group_by("bin").agg(pl.col("sx", "sy", "sxx", "syy", "sxy").sum())
    t = c.join(b, on="bin", how="inner").sort("bin")
    if not t.height:
        return None

    def a(name: str) -> np.ndarray:
        return t.get_column(name).cast(pl.Float64).to_numpy()

    y, sxy, syy = a("sy"), a("sxy"), a("syy")
    return _units_check(y, a("sd"), a("sh"), a("n"), syy, sxy - syy,
                        a("sxx") - 2 * sxy + syy)


def _bins_of(cells: pl.DataFrame) -> pl.DataFrame:
    """Per entropy bin of the forensic ``cells`` (rows per bin, step and staleness, or any
    selection of them): n, mean H, mean delta, mean delta^2, mean |delta| (sorted by
    bin)."""
    return (
        cells.group_by("bin")
        .agg(pl.col("n", "sh", "sd", "sd2", "sad", "nneg").sum())
        .with_columns(
            (pl.col("sh") / pl.col("n")).alias("h"),
            (pl.col("sd") / pl.col("n")).alias("m"),
            (pl.col("sd2") / pl.col("n")).alias("q"),
            (pl.col("sad") / pl.col("n")).alias("a"),
        )
        .sort("bin")
    )


def _k_fit(h: np.ndarray, q: np.ndarray, w: np.ndarray) -> float:
    """Binned weighted least squares of q = k H through the origin (METHOD.md law)."""
    den = float(np.sum(w * h * h))
    return float(np.sum(w * h * q) / den) if den > 0 else float("nan")


def _alpha_fit(h: np.ndarray, q: np.ndarray) -> float:
    """Unweighted least-squares slope of log q on log H over bins (power-law exponent)."""
    ok = (h > 0) & (q > 0)
    if ok.sum() < 3:
        return float("nan")
    return float(np.polyfit(np.log(h[ok]), np.log(q[ok]), 1)[0])


def _fe_ols(
    group: np.ndarray, X: np.ndarray, y: np.ndarray, w: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Weighted least squares of y on the columns of X with one intercept per group.

    Rows are aggregate cells, weights their token counts (rescaled to mean 1, so the residual
    variance is per average cell). Returns (coefficients, standard errors, two-sided
    p-values from Student t, residual degrees of freedom); NaNs when X is degenerate.
    """
    X = np.asarray(X, dtype=float).reshape(len(y), -1)
    p = X.shape[1]
    nan = np.full(p, np.nan)
    w = w / w.mean()
    Xd = np.empty_like(X)
    yd = np.empty_like(y, dtype=float)
    groups = np.unique(group)
    for g in groups:
        s = group == g
        ws = w[s].sum()
        Xd[s] = X[s] - (w[s, None] * X[s]).sum(axis=0) / ws
        yd[s] = y[s] - np.sum(w[s] * y[s]) / ws
    df = len(y) - len(groups) - p
    A = Xd.T @ (w[:, None] * Xd)
    if df < 1 or np.linalg.matrix_rank(A) < p:
        return nan, nan, nan, max(df, 0)
    beta = np.linalg.solve(A, Xd.T @ (w * yd))
    resid = yd - Xd @ beta
    sigma2 = float(np.sum(w * resid * resid) / df)
    se = np.sqrt(np.clip(np.diag(np.linalg.inv(A)) * sigma2, 0.0, None))
    with np.errstate(divide="ignore", invalid="ignore"):
        tval = np.where(se > 0, np.abs(beta) / se, np.where(beta != 0, np.inf, 0.0))
    from scipy import stats  # imported when used (0.6 s)

    pval = 2 * stats.t.sf(tval, df)
    return beta, se, pval, df


# --------------------------------------------------------------------------- checks
# each returns (CheckStatus, Finding | None)

_Result = tuple[CheckStatus, "Finding | None"]


def _clear(name: str, reason: str) -> _Result:
    return CheckStatus(name, "clear", reason), None


def _cannot(name: str, reason: str) -> _Result:
    return CheckStatus(name, "cannot_tell", reason), None


def _found(f: Finding, reason: str) -> _Result:
    return CheckStatus(f.kind, "found", reason), f


#: the last dataset's misalignment result: ``detect_misalignment`` (the CLI's alignment
#: gate) and ``run_forensics`` on the same Dataset object then compute it once, not twice
_MISALIGN_LAST: list[tuple[weakref.ref, _Result]] = []


def _misalign_cached(ds: Any) -> _Result | None:
    for ref, res in _MISALIGN_LAST:
        if ref() is ds:
            return res
    return None


def _misalign_store(ds: Any, res: _Result) -> None:
    try:
        _MISALIGN_LAST[:] = [(weakref.ref(ds), res)]
    except TypeError:  # an object without weak references: no caching
        _MISALIGN_LAST.clear()


def _check_misalignment(ctx: _Ctx) -> _Result:
    """Off-by-one alignment (:func:`_misalignment`), computed once per Dataset object."""
    assert ctx.misalign is not None
    return ctx.misalign


_SAMPLE_COLS: tuple[str, ...] = ("seq_key", "position", "train_logprob", "infer_logprob")


class _LagSample:
    """Pass accumulator keeping the rows of a hash-sampled subset of sequences (whole
    sequences: ``seq_key % 1000 < keep``), at most ~MISALIGN_MAX_TOKENS rows of 40 bytes;
    the lags are taken after the pass, on the sequences put back together."""

    #: seq_id may come as read (an integer; passes.NATIVE_SEQ_ID): named as text
    native_seq_id = True

    def __init__(self, keep: int, with_step: bool = False, with_file: bool = False,
                 with_entropy: bool = False) -> None:
        self.keep = keep
        self.cols = (*_SAMPLE_COLS, "seq_id", *(("step",) if with_step else ()),
                     *((FILE_INDEX,) if with_file else ()),
                     *(("entropy",) if with_entropy else ()))
        self.columns = list(self.cols)
        self.parts: list[pl.DataFrame] = []

    def update(self, batch: pl.DataFrame) -> None:
        if self.keep >= 1000:
            self.parts.append(batch.select(self.cols))
            return
        # the sampled runs (a sequence's runs are all in or all out), gathered by numpy:
        # a polars gather here waits for the thread pool the engine is reading the next
        # chunk with
        starts = run_starts(batch, ["seq_key"])
        runs = np.flatnonzero(column(batch, "seq_key")[starts] % 1000 < self.keep)
        if not runs.size:
            return
        idx = run_rows(starts, batch.height, runs)
        self.parts.append(pl.DataFrame(
            {c: (batch.get_column(c).gather(pl.Series(idx)) if batch.get_column(c).null_count()
                 else pl.Series(c, column(batch, c)[idx], dtype=batch.schema[c]))
             for c in self.cols}))

    def frame(self, schema: Mapping[str, pl.DataType]) -> pl.DataFrame:
        if not self.parts:
            return pl.DataFrame(schema={c: schema[c] for c in self.cols})
        out = pl.concat(self.parts, how="vertical_relaxed")
        self.parts = [out]  # (read several times after the pass: concatenated once)
        return out


class _LagSums:
    """Pass accumulator of the shift test on EVERY sequence, for lags +-1 (the sample of
    :class:`_LagSample` may hold none of a handful of shifted sequences in a large run,
    and a handful already flips the fitted law): per (seq_key, step), the sums of
    |train_logprob[t] - infer_logprob[t +- 1]| over the pairs of consecutive rows of one
    sequence at consecutive positions within a batch, their counts, and the sums of
    |delta[t]| over the same tokens t (the lag-0 reference on the tokens each lag reads: a
    sequence's first or last token, which one lag has no pair for, can hold most of its
    |delta|, e.g. a collapsed policy's first token after a few versions' drift, and had
    read as a shift; helper-39). numpy reduces the runs of one sequence of each batch with
    ``reduceat`` (the step is constant within a sequence key); partial rows of a sequence
    split across batches are summed."""

    COLS = ("_a-1", "_z-1", "_n-1", "_a1", "_z1", "_n1")
    #: seq_id may come as read (an integer; passes.NATIVE_SEQ_ID): kept per sequence as
    #: String, to name the shifted sequences
    native_seq_id = True

    def __init__(self, with_step: bool, with_file: bool = False) -> None:
        self.keys = ["seq_key", "step"] if with_step else ["seq_key"]
        self.columns = [*self.keys, "seq_id", "position", "train_logprob", "infer_logprob",
                        "delta"]
        #: each sequence's input file (FILE_INDEX, the lowest if it spans several): the
        #: files holding shifted sequences are named
        self.with_file = with_file
        if with_file:
            self.columns.append(FILE_INDEX)
        self.rows = PartialRows(self.keys, [pl.col(c).sum() for c in self.COLS]
                                + [pl.col("seq_id").first()]
                                + ([pl.col(FILE_INDEX).min()] if with_file else []),
                                2_000_000, cast={"seq_id": pl.String})

    def update(self, batch: pl.DataFrame) -> None:
        sk, pos = column(batch, "seq_key"), column(batch, "position")
        tl, il = column(batch, "train_logprob"), column(batch, "infer_logprob")
        starts = run_starts(batch, ["seq_key"])
        n = batch.height
        # pair i = rows (i, i + 1) of one sequence at consecutive positions; a run's pairs
        # are i in [start, next start - 1), and the pair at next start - 1 crosses runs (0),
        # so both lags sum over [start, next start) with ``reduceat`` (index n - 1: no pair)
        pair = np.zeros(n, dtype=bool)
        np.logical_and(sk[1:] == sk[:-1], pos[1:] == pos[:-1] + 1, out=pair[:-1])
        out: dict[str, Any] = {"seq_key": sk[starts]}
        sid = batch.get_column("seq_id")  # (an integer one as numpy: made a String per frame)
        out["seq_id"] = (column(batch, "seq_id")[starts]
                         if sid.dtype.is_integer() and not sid.null_count()
                         else sid.gather(pl.Series(starts)).cast(pl.String))
        if "step" in self.keys:
            step = batch.get_column("step")  # numpy: a polars gather here waits for the engine
            out["step"] = (step.gather(pl.Series(starts)) if step.null_count()
                           else pl.Series("step", column(batch, "step")[starts]))
        # a token with an impossible logprob (a placeholder; implausible_logprobs reports
        # them) is left out, with its pairs: a placeholder at every k-th token would
        # otherwise favour the lag that misses it near a sequence's start
        # ... and so is a token with a logprob of exactly 0.0 on either side (prompt or
        # padding rows written as zeros under the mask: zero_prefixes reports them; next to
        # a sequence's few response tokens they favour a lag; a side not computed for a
        # step, written as 0.0, leaves only its near-certain tokens valid, which then favour
        # a lag too; a near-certain token says little of alignment)
        ok = None
        zero = (tl == 0) | (il == 0)
        if zero.any() or min(float(tl.min()), float(il.min())) <= IMPLAUSIBLE_LOGPROB:
            ok = (tl > IMPLAUSIBLE_LOGPROB) & (il > IMPLAUSIBLE_LOGPROB) & ~zero
            pair[:-1] &= ok[:-1] & ok[1:]
        n_pairs = np.add.reduceat(pair.astype(np.int64), starts)
        w = np.zeros(n)
        # lag -1 at token t = i + 1: |train[t] - infer[t - 1]|; lag +1 at t = i: |train[t] -
        # infer[t + 1]|
        ad = np.abs(column(batch, "delta"))
        for lag, a, b, z in ((-1, tl[1:], il[:-1], ad[1:]), (1, tl[:-1], il[1:], ad[:-1])):
            np.subtract(a, b, out=w[:-1])
            np.abs(w, out=w)
            w *= pair
            out[f"_a{lag}"] = np.add.reduceat(w, starts)
            np.multiply(z, pair[:-1], out=w[:-1])  # (w[-1] is 0: no pair)
            out[f"_z{lag}"] = np.add.reduceat(w, starts)
            out[f"_n{lag}"] = n_pairs
        if self.with_file:
            out[FILE_INDEX] = column(batch, FILE_INDEX)[starts]
        self.rows.add(out)

    def table(self) -> pl.DataFrame | None:
        """One row per sequence (None when no token was seen)."""
        t = self.rows.result()
        return t if t.height else None


def _misalign_keep(ds: Any) -> int:
    """Sampled sequences per 1000 (by seq_key hash), so that about MISALIGN_MAX_TOKENS
    tokens are kept."""
    n_valid = ds.accounting.tokens_valid if hasattr(ds, "accounting") else None
    keep = 1000
    if n_valid and n_valid > MISALIGN_MAX_TOKENS:
        keep = max(1, int(1000 * MISALIGN_MAX_TOKENS / n_valid))
    return keep


def _pval(p: float) -> str:
    """``p = 0.012``; a p-value below the smallest double (computed as 0) as
    ``p < 1e-300``, never ``p = 0``."""
    return "p < 1e-300" if p < 1e-300 else f"p = {p:.2g}"


def _share(x: float) -> str:
    """A share as a percentage, two significant digits below 1% (0.038% is not 0.0%), and
    as many as it takes above 99.9% (99.97% is not 100.0%)."""
    if x >= 0.999 and x < 1.0:
        txt = f"{100 * x:.{min(4, 2 + int(-math.log10(1.0 - x)))}f}"
        return ">99.9999%" if txt.startswith("100") else txt.rstrip("0").rstrip(".") + "%"
    return f"{x:.1%}" if x >= 0.01 else f"{100 * x:.2g}%"


def _lag_name(lag: int) -> str:
    """``-2`` -> ``minus2``, ``1`` -> ``plus1`` (evidence keys)."""
    return f"{'minus' if lag < 0 else 'plus'}{abs(lag)}"


def _by_sequence_order(sample: pl.DataFrame) -> pl.LazyFrame:
    """``sample`` (rows of whole sequences: ``seq_key``, ``position``) as a lazy frame in an
    order where each sequence's rows are consecutive by ascending position, which the lag
    and prefix checks read with ``shift`` / ``cum_min``: the rows as they are when they are
    so already (each sequence one run of rows, positions strictly increasing within it:
    what every writer seen does), else sorted by (seq_key, position). The sort of 2M
    sampled rows cost 0.35 s of every command; the check costs about 15 ms."""
    lf = sample.lazy()
    if sample.height < 2:
        return lf
    sk_s, pos_s = sample.get_column("seq_key"), sample.get_column("position")
    if not (sk_s.null_count() or pos_s.null_count()):
        sk, pos = sk_s.to_numpy(), pos_s.to_numpy()
        same = sk[1:] == sk[:-1]
        if bool(np.all(pos[1:][same] > pos[:-1][same])):
            firsts = sk[np.concatenate(([0], np.flatnonzero(~same) + 1))]
            if np.unique(firsts).size == firsts.size:
                return lf
    return lf.sort("seq_key", "position")


def _misalignment(sample: pl.DataFrame, keep: int,
                  every: pl.DataFrame | None = None, files: Sequence[str] = ()) -> _Result:
    """Shifted alignment between the two logprob columns (by 1 to 3 tokens, in every
    sequence or in some).

    Signature: inside sequences (ordered by position), train_logprob[t] agrees with
    infer_logprob[t + L] (L in +-1..+-3) much better than with infer_logprob[t]. Correctly
    aligned logs show the opposite: neighbouring tokens have unrelated surprisals, so the
    lag-0 gap (the real mismatch) is several times smaller than the gap at any other lag. A
    shift by one is the classic bug of slicing response logprobs with a prompt-length or BOS
    offset, or of dropping the first/last entry of one array (reported repeatedly by verl /
    TRL users whose importance ratios exploded after a tokenizer or packing change); a
    shift by two, a doubled offset. Every downstream number is meaningless then, so the CLI
    stops.

    Two verdicts, both ``critical``:

    - whole: over all sampled tokens, mean |train_logprob[t] - infer_logprob[t + L]| is below
      MISALIGN_RATIO times mean |train_logprob[t] - infer_logprob[t]| on the same tokens;
    - partial: some sequences (at least MISALIGN_PARTIAL_MIN_SEQS of those with
      MISALIGN_SEQ_MIN_PAIRS pairs, and MISALIGN_PARTIAL_SHARE of them unless they fit
      their lag below MISALIGN_PARTIAL_STRONG; fewer when they fit it that well over
      MISALIGN_FEW_MIN_PAIRS pairs together) pass that test on their own tokens, e.g.
      the steps written after a resume with a different slicing: a handful of shifted
      sequences among 25k already flips the fitted law. Clean sequences of 8+ pairs stay
      above 1.4 on the bundled run and synthetic runs (threshold 0.5).

    The partial test at lags +-1 runs on every sequence when ``every`` is given (the
    per-sequence sums of :class:`_LagSums`; the ratio there compares with the sequence's
    mean |delta| over all its tokens), at lags +-2 and +-3 on the sample.

    Evidence: mean |differences| and Pearson correlations at lags -1, 0, +1 on the interior
    tokens (both neighbours present), the ratio at every lag, and for a partial shift the
    sequences and steps concerned; from a hash-sampled subset of sequences (``sample``:
    their rows, gathered by :class:`_LagSample` during the pass; sorted by (seq_key,
    position) in memory, so the order of the rows does not matter; a partner must be the
    token at position t + L of the same sequence). Tokens with a logprob at or below
    IMPLAUSIBLE_LOGPROB (placeholders: implausible_logprobs reports them), and those with a
    logprob of exactly 0.0 on either side (prompt or padding rows under the mask:
    zero_prefixes reports them; a side written as 0.0 where it was not computed, whose
    near-certain tokens stay valid; a near-certain token says little of alignment), are
    left out, with the pairs they are in, here and in :class:`_LagSums`.

    ``files``: the input files (by FILE_INDEX): with several, a partial shift names those
    holding the shifted sequences (evidence ``files``, ``input_files``; the tables need
    a FILE_INDEX column).
    """
    name = "misalignment"
    has_step = "step" in sample.columns
    tl, il = pl.col("train_logprob"), pl.col("infer_logprob")
    # tokens with an impossible logprob (placeholders, reported by implausible_logprobs)
    # are left out with their pairs: at every k-th token they favour the lag that misses
    # them at the start of short sequences
    sample = sample.filter((tl > IMPLAUSIBLE_LOGPROB) & (il > IMPLAUSIBLE_LOGPROB)
                           & (tl != 0) & (il != 0))  # (and exact zeros on either side)
    pos, sk = pl.col("position"), pl.col("seq_key")
    lags = [L for a in MISALIGN_LAGS for L in (-a, a)]
    d0 = (tl - il).abs()
    ex = []
    for L in lags:
        ok = (pos.shift(-L) == pos + L) & (sk.shift(-L) == sk)
        ex += [pl.when(ok).then((tl - il.shift(-L)).abs()).alias(f"_a{L}"),
               pl.when(ok).then(d0).alias(f"_z{L}")]
    s = _by_sequence_order(sample).with_columns(ex).with_columns(
        il.shift(1).alias("_il_m1"), il.shift(-1).alias("_il_p1"))
    interior = s.filter(pl.col("_a-1").is_not_null() & pl.col("_a1").is_not_null())
    sums = [e for L in lags for e in (pl.col(f"_a{L}").sum(), pl.col(f"_z{L}").sum(),
                                      pl.col(f"_a{L}").count().alias(f"_n{L}"))]
    per_seq_q = s.group_by(["seq_key", "step"] if has_step else ["seq_key"]).agg(
        *sums, *([pl.col(FILE_INDEX).min()] if FILE_INDEX in sample.columns else []),
        *([pl.col("seq_id").first().cast(pl.String)] if "seq_id" in sample.columns else []))
    res_q = interior.select(
        pl.len().alias("n"),
        pl.col("_a-1").mean().alias("mad_m1"), d0.mean().alias("mad_0"),
        pl.col("_a1").mean().alias("mad_p1"),
        pl.corr(tl, pl.col("_il_m1")).alias("corr_m1"),
        pl.corr(tl, il).alias("corr_0"),
        pl.corr(tl, pl.col("_il_p1")).alias("corr_p1"),
    )
    res_df, per_seq = pl.collect_all([res_q, per_seq_q])
    res = res_df.row(0, named=True)
    n = int(res["n"])
    if n < MISALIGN_MIN_PAIRS:
        return _cannot(
            name,
            f"only {n} tokens have both neighbours in their sequence "
            f"(need {MISALIGN_MIN_PAIRS}): alignment cannot be checked",
        )
    mad = {-1: res["mad_m1"], 0: res["mad_0"], 1: res["mad_p1"]}
    cor = {-1: res["corr_m1"], 0: res["corr_0"], 1: res["corr_p1"]}
    tot = per_seq.select(pl.col(f"_{c}{L}").sum() for L in lags for c in "azn").row(0, named=True)

    def ratio(a: float, z: float) -> float:
        return a / z if z > 0 else (1.0 if a == 0 else math.inf)

    pooled = {L: ratio(tot[f"_a{L}"], tot[f"_z{L}"]) for L in lags}
    ev: dict[str, Any] = {
        "tokens_compared": n,
        "sampled_share": _r(keep / 1000),
        "mean_abs_diff_lag_minus1": _r(mad[-1]),
        "mean_abs_diff_lag0": _r(mad[0]),
        "mean_abs_diff_lag_plus1": _r(mad[1]),
        "corr_lag_minus1": _r(cor[-1] if cor[-1] is not None else float("nan")),
        "corr_lag0": _r(cor[0] if cor[0] is not None else float("nan")),
        "corr_lag_plus1": _r(cor[1] if cor[1] is not None else float("nan")),
        **{f"ratio_lag_{_lag_name(L)}": _r(pooled[L]) for L in lags},
    }
    for L in lags:  # +-1: on the interior tokens above; further lags on their own pairs
        if abs(L) > 1 and tot[f"_n{L}"]:
            ev[f"mean_abs_diff_lag_{_lag_name(L)}"] = _r(tot[f"_a{L}"] / tot[f"_n{L}"])
    best = min(lags, key=lambda L: (pooled[L], abs(L)))
    check = ("how response logprobs are sliced on each side (prompt length, BOS/EOS, "
             "the logits[:-1] / labels[1:] shift), padding side, and sequence packing "
             "offsets; re-dump with both arrays indexed by the same generated token.")
    if pooled[best] < MISALIGN_RATIO:
        # lag L: train_logprob[t] matches infer_logprob[t + L]
        k = abs(best)
        where = (
            f"infer_logprob[t+{k}] (the inference array lags {k} token(s) behind: it has "
            f"extra leading entries, e.g. a prompt/BOS logprob, or the trainer's array lacks "
            f"its first)"
            if best > 0
            else f"infer_logprob[t-{k}] (the inference array runs {k} token(s) ahead: it "
            "lacks its first entries, or the trainer's array has extra leading ones, e.g. "
            "logits not shifted against labels)"
        )
        ev["likely_shift"] = best
        mad_l = tot[f"_a{best}"] / max(tot[f"_n{best}"], 1)
        mad_z = tot[f"_z{best}"] / max(tot[f"_n{best}"], 1)
        corr = (f" (correlation {ev['corr_lag_' + _lag_name(best)]} vs {ev['corr_lag0']})"
                if abs(best) == 1 else "")
        f = Finding(
            kind=name,
            severity="critical",
            title=f"Logprob columns look shifted by {best:+d} token{'s' if k > 1 else ''}",
            message=(
                f"train_logprob[t] agrees with {where}: mean |difference| "
                f"{mad_l:.3g} at lag {best:+d} vs {mad_z:.3g} at lag 0 on the same tokens"
                f"{corr}. Every ratio computed from these columns is wrong."
            ),
            evidence=ev,
            check=check,
        )
        better = (f"{1 / pooled[best]:.1f}x better than lag 0" if pooled[best] > 0
                  else "exactly (mean |difference| 0), lag 0 does not")
        return _found(f, f"lag {best:+d} fits {better}")
    if every is not None and per_seq.height:
        # the pass pairs rows that follow each other at consecutive positions: rows not in
        # position order within their sequence (shuffled, descending) leave it few of the
        # pairs the sorted sample finds in the same sequences; the sample then decides the
        # lags +-1 too (a partial shift of 20% of the sequences went unseen)
        keys = ["seq_key", "step"] if has_step and "step" in every.columns else ["seq_key"]
        both = per_seq.select(*keys, pl.col("_n1").alias("_ns")).join(
            every.select(*keys, pl.col("_n1").alias("_ne")), on=keys, how="inner",
            nulls_equal=True)
        n_s, n_e = int(both["_ns"].sum() or 0), int(both["_ne"].sum() or 0)
        if n_s and n_e < MISALIGN_PASS_PAIRED * n_s:
            every = None
            ev["pass_pair_share"] = _r(n_e / n_s)
    # partial: sequences that are shifted on their own (lags +-1 on every sequence when
    # the pass summed them, with the lag-0 reference on the tokens of each lag's pairs)
    shifted: dict[int, pl.DataFrame] = {}
    tested_at: dict[int, pl.DataFrame] = {}
    tested = 0
    for L in lags:
        if every is not None and abs(L) == 1:
            t = every.filter(pl.col(f"_n{L}") >= MISALIGN_SEQ_MIN_PAIRS)
        else:
            t = per_seq.filter(pl.col(f"_n{L}") >= MISALIGN_SEQ_MIN_PAIRS)
        tested, tested_at[L] = max(tested, t.height), t
        shifted[L] = t.filter(pl.col(f"_a{L}") < MISALIGN_RATIO * pl.col(f"_z{L}"))
    lag = max(lags, key=lambda L: (shifted[L].height, -abs(L)))
    hit = shifted[lag]
    hit_ratio = ratio(hit[f"_a{lag}"].sum(), hit[f"_z{lag}"].sum()) if hit.height else math.inf
    strong = hit_ratio < MISALIGN_PARTIAL_STRONG
    if (hit.height >= MISALIGN_PARTIAL_MIN_SEQS and (
            hit.height >= MISALIGN_PARTIAL_SHARE * tested_at[lag].height or strong)) or (
            hit.height and strong and hit[f"_n{lag}"].sum() >= MISALIGN_FEW_MIN_PAIRS):
        share = hit.height / max(tested_at[lag].height, 1)
        ev.update(likely_shift=lag, partial=True, shifted_sequences=hit.height,
                  sequences_tested=tested_at[lag].height, shifted_share=_r(share),
                  ratio_in_shifted_sequences=_r(hit_ratio))
        steps = ""
        if has_step:
            by = (hit.group_by("step").len().sort(["len", "step"], descending=[True, False]))
            all_by = tested_at[lag].group_by("step").len().rename({"len": "of"})
            by = by.join(all_by, on="step", how="left", nulls_equal=True)
            ev["shifted_steps"] = {str(r["step"]): f"{r['len']}/{r['of']}"
                                  for r in by.head(20).iter_rows(named=True)}
            top = ", ".join(f"{st} ({v})" for st, v in list(ev["shifted_steps"].items())[:6])
            steps = f"; by step (shifted/tested): {top}" + (" ..." if by.height > 6 else "")
        where = ""
        if FILE_INDEX in hit.columns:  # which input files hold them
            listed = _files_evidence(ev, hit.group_by(FILE_INDEX).len().iter_rows(), files)
            where = f" They are {listed}." if listed else ""
        if "seq_id" in hit.columns:  # the best-fitting ones first
            ids = (hit.with_columns((pl.col(f"_a{lag}") / pl.col(f"_z{lag}")).alias("_r"))
                   .sort("_r", "seq_id", nulls_last=True)["seq_id"].head(10).to_list())
            ev["example_seq_ids"] = [str(x) for x in ids if x is not None]
            if ev["example_seq_ids"]:
                where += f" E.g. seq_id {', '.join(ev['example_seq_ids'][:5])}."
        f = Finding(
            kind=name,
            severity="critical",
            title=f"Logprob columns look shifted by {lag:+d} token{'s' if abs(lag) > 1 else ''} "
                  f"in {_share(share)} of sequences",
            message=(
                f"{hit.height:,} of {tested_at[lag].height:,} "
                f"{'' if (every is not None and abs(lag) == 1) or keep >= 1000 else 'sampled '}"
                "sequences "
                f"match train_logprob[t] with "
                f"infer_logprob[t{lag:+d}]: their mean |difference| at lag {lag:+d} is "
                f"{ev['ratio_in_shifted_sequences']:.2g} times that at lag 0 (aligned sequences "
                f"stay above 1.4 times){steps}.{where} Over all tokens lag 0 still fits best, "
                "which hides it: those sequences' ratios are wrong and pollute every statistic."
            ),
            evidence=ev,
            check=check + " A shift in some steps only points at a change between them "
                          "(resume, upgrade, a second dump writer).",
        )
        return _found(f, f"lag {lag:+d} fits {hit.height:,} of {tested_at[lag].height:,} "
                         f"sequences ({_share(share)})")
    if min(pooled[-1], pooled[1]) < MISALIGN_CLEAR_MIN:  # no lag fits: unrelated columns?
        return _cannot(
            name,
            f"no lag fits clearly better than another (mean |diff| {mad[0]:.3g} at lag 0 vs "
            f"{mad[-1]:.3g} / {mad[1]:.3g} at -1 / +1; aligned logprobs of one token differ "
            f"far less at lag 0): the two columns may not describe the same token at any "
            "lag (fit's units check names the column that is not the sampled token's)")
    return _clear(
        name,
        f"lag 0 fits best (mean |diff| {mad[0]:.3g} vs {mad[-1]:.3g} / {mad[1]:.3g} at -1 / +1;"
        f" no sequence fits a lag of +-1..3 better)" if not any(v.height for v in shifted.values())
        else f"lag 0 fits best (mean |diff| {mad[0]:.3g} vs {mad[-1]:.3g} / {mad[1]:.3g} at -1 /"
        f" +1; {max(v.height for v in shifted.values())} of {tested:,} sequences fit another "
        "lag: too few to call)",
    )


def _pooled_slopes(blk: pl.DataFrame) -> tuple[float, float, float, float, int]:
    """Pooled within-bin OLS slopes and their jackknife standard errors over blocks.

    Returns (b_yx, se_b_yx, rb_xy, se_rb_xy, n_blocks): b_yx the slope of infer on train,
    rb_xy the reciprocal of the slope of train on infer. Without errors in either column both
    equal the true slope; noise on either side brackets it (regression dilution).
    """
    bins = np.sort(blk["bin"].unique().to_numpy())
    blocks = np.sort(blk["block"].unique().to_numpy())
    bi = {b: i for i, b in enumerate(bins)}
    ki = {b: i for i, b in enumerate(blocks)}
    shape = (len(bins), len(blocks))
    arr = {c: np.zeros(shape) for c in ("n", "sx", "sy", "sxx", "syy", "sxy")}
    rows_b = np.array([bi[b] for b in blk["bin"].to_list()], dtype=int)
    rows_k = np.array([ki[b] for b in blk["block"].to_list()], dtype=int)
    for c in arr:
        np.add.at(arr[c], (rows_b, rows_k), blk[c].to_numpy().astype(float))

    def slopes(t: dict[str, np.ndarray]) -> tuple[float, float]:
        n = t["n"]
        ok = n >= 2
        nn = np.where(ok, n, 1.0)
        cxx = np.where(ok, t["sxx"] - t["sx"] ** 2 / nn, 0.0).sum()
        cyy = np.where(ok, t["syy"] - t["sy"] ** 2 / nn, 0.0).sum()
        cxy = np.where(ok, t["sxy"] - t["sx"] * t["sy"] / nn, 0.0).sum()
        b = cxy / cxx if cxx > 0 else float("nan")
        rb = cyy / cxy if cxy != 0 else float("nan")
        return b, rb

    tot = {c: v.sum(axis=1) for c, v in arr.items()}
    b, rb = slopes(tot)
    nk = len(blocks)
    if nk < 3:
        return b, float("nan"), rb, float("nan"), nk
    jb, jr = np.empty(nk), np.empty(nk)
    for k in range(nk):
        jb[k], jr[k] = slopes({c: tot[c] - arr[c][:, k] for c in arr})
    se_b = math.sqrt((nk - 1) / nk * np.sum((jb - jb.mean()) ** 2))
    se_r = math.sqrt((nk - 1) / nk * np.sum((jr - jr.mean()) ** 2))
    return b, se_b, rb, se_r, nk


def _bias_trend(bins: pl.DataFrame) -> tuple[float, float, float]:
    """Weighted LS slope of mean delta on log10 H across populated bins; (slope, m_lo, m_hi)."""
    b = bins.filter(pl.col("n") >= MIN_BIN_TOKENS)
    if b.height < 2:
        return float("nan"), float("nan"), float("nan")
    x = np.log10(np.clip(b["h"].to_numpy(), H_BIN_LO, None))
    y = b["m"].to_numpy()
    w = b["n"].to_numpy().astype(float)
    xm = np.sum(w * x) / w.sum()
    ym = np.sum(w * y) / w.sum()
    sxx = np.sum(w * (x - xm) ** 2)
    slope = float(np.sum(w * (x - xm) * (y - ym)) / sxx) if sxx > 0 else float("nan")
    return slope, float(y[0]), float(y[-1])


#: a one-sided temperature finding whose slope lies within this factor of 1, beside a
#: truncated-sampling warning, is info: the renormalisation of a top-k / top-p support tilts
#: the slope too (a top-k 50 engine alone read as a temperature of 1.09)
TEMPERATURE_DEFER_FACTOR = 1.15


def _defer_temperature_to_truncation(found: list[tuple[int, Finding]]
                                     ) -> list[tuple[int, Finding]]:
    """``found`` with a one-sided temperature warning made info, and saying why, when the
    truncated-sampling check warns too and the slope lies within TEMPERATURE_DEFER_FACTOR
    of 1: one cause, not two (a real temperature beside truncation, e.g. 0.7, stays a
    warning)."""
    kinds = {f.kind: f for _, f in found}
    t, tr = kinds.get("one_sided_temperature"), kinds.get("truncated_sampling")
    if t is None or tr is None or t.severity != "warning" or tr.severity != "warning":
        return found
    slope = t.evidence.get("slope_geometric_mean")
    if not isinstance(slope, (int, float)) or not (
            1 / TEMPERATURE_DEFER_FACTOR <= slope <= TEMPERATURE_DEFER_FACTOR):
        return found
    note = (" But the truncated-sampling check warns too, and the renormalisation of a "
            "top-k / top-p support on the engine side tilts this slope as much: it may be "
            "that, not a temperature (info only).")
    return _made_info(found, lambda f: f is t, note)


#: the findings read from delta itself: beside logprob columns shifted against each other
#: (the misalignment finding, let through by --allow-misaligned) their signatures are the
#: shift's as much as their own cause's
DELTA_FINDINGS: tuple[str, ...] = ("one_sided_temperature", "truncated_sampling",
                                   "sequence_outliers", "drift", "staleness",
                                   "trainer_noise_floor")


def _defer_to_misalignment(found: list[tuple[int, Finding]]) -> list[tuple[int, Finding]]:
    """``found`` with each finding of :data:`DELTA_FINDINGS` above info made info, saying
    why, when the misalignment check found a shift: a shifted sequence's delta compares
    neighbouring tokens, |delta| of nats, and a few such sequences set a step's mean (a
    drift "up over training" when they fall in later steps by chance: helper-34 F8, 10%
    of the sequences shifted at random read x2.18), an outlier, a slope. Rerun on aligned
    columns for those checks' own reading."""
    mis = next((f for _, f in found if f.kind == "misalignment"), None)
    if mis is None:
        return found
    note = (" But the logprob columns look shifted against each other (the misalignment "
            "finding): the shifted sequences' delta compares neighbouring tokens and can "
            "make this signature on its own; realign them and rerun for this check's own "
            "reading (info only).")
    return _made_info(found, lambda f: f.kind in DELTA_FINDINGS and f.severity != "info",
                      note)


def _pooled_beside_a_jump(found: list[tuple[int, Finding]]) -> list[tuple[int, Finding]]:
    """``found`` with the temperature and truncated-sampling findings (read pooled over the
    run) saying so when the drift finding, at warning or above, names a jump between two
    steps: their signature may belong to the steps from the jump on alone (helper-34 F8: a
    temperature applied from step 10 on read as a run-wide slope of 0.913, while the drift
    finding named the jump at step 10)."""
    drift = next((f for _, f in found if f.kind == "drift"
                  and f.severity in ("warning", "critical")), None)
    jump = None if drift is None else drift.evidence.get("jump_between_steps")
    if not (isinstance(jump, (list, tuple)) and len(jump) == 2):
        return found
    note = (f" It is read over the whole run, while the drift finding has the mismatch jump "
            f"between steps {jump[0]} and {jump[1]}: it may hold from step {jump[1]} on only "
            "(the pooled reading averages those steps with the earlier ones); compare the "
            "per-step strata.")
    return [(i, dataclasses.replace(f, message=f.message + note)
             if f.kind in ("one_sided_temperature", "truncated_sampling") else f)
            for i, f in found]


def _made_info(found: list[tuple[int, Finding]], which: Callable[[Finding], bool],
               note: str) -> list[tuple[int, Finding]]:
    """``found`` with the findings ``which`` selects made info, ``note`` (why: another
    finding explains them) appended to their message."""
    return [(i, dataclasses.replace(f, severity="info", message=f.message + note)
             if which(f) else f) for i, f in found]


def _cross_referenced(found: list[tuple[int, Finding]]) -> list[tuple[int, Finding]]:
    """The findings as one cause's signature in another's check reads them: a shift first
    (:func:`_defer_to_misalignment`), so that the cross-references after it read the
    severities it leaves (helper-37: an outlier finding said that the truncated-sampling
    check warns, after the shift had made that finding info)."""
    return _mask_start_beside_unsampled(_zero_runs_beside_truncation(_pooled_beside_a_jump(
        _outliers_beside_truncation(_defer_temperature_to_truncation(
            _defer_to_misalignment(found))))))


def _mask_start_beside_unsampled(found: list[tuple[int, Finding]]
                                 ) -> list[tuple[int, Finding]]:
    """``found`` with the mask-start surprisal finding made info, saying so, when the
    unsampled-tokens check names the same cause (evidence ``cause``) at warning or
    critical: one fault, told once above info."""
    kinds = {f.kind: f for _, f in found}
    ms, un = kinds.get("mask_start_surprisal"), kinds.get("unsampled_tokens")
    if (ms is None or un is None or ms.severity != "warning"
            or un.severity not in ("warning", "critical")
            or un.evidence.get("cause") != ms.evidence.get("cause")):
        return found
    note = (" The unsampled-tokens check names the same cause from the improbable tokens "
            "(info only here).")
    return _made_info(found, lambda f: f is ms, note)


def _zero_runs_beside_truncation(found: list[tuple[int, Finding]]
                                 ) -> list[tuple[int, Finding]]:
    """``found`` with a corrupt-rows warning made info, saying why, when the truncated-sampling
    check warns too and every bad token of the corrupt rows is an engine logprob of exactly
    0.0 in a run (no non-finite value, nothing scattered): runs of one-token nuclei, which a
    top-p / top-k engine renormalises to probability 1 while the trainer's logprob is near
    0 too (helper-36: a clean top-p 0.9 run of a real model warned of corrupt rows in 8
    sequences)."""
    kinds = {f.kind: f for _, f in found}
    cr, tr = kinds.get("corrupt_rows"), kinds.get("truncated_sampling")
    if cr is None or tr is None or cr.severity != "warning" or tr.severity not in (
            "warning", "critical"):
        return found
    ev = cr.evidence
    zeros = int(ev.get("placeholder_run_tokens_engine_exact_zero") or 0)
    if not (zeros and zeros == int(ev.get("placeholder_tokens_in_runs") or 0)
            and not ev.get("nonfinite_run_tokens") and not ev.get("nonfinite_suffix_tokens")
            and not ev.get("scattered_bad_tokens")):
        return found
    note = (" But the truncated-sampling check warns too, and every such token is an engine "
            "logprob of exactly 0.0: runs of one-token nuclei, which the engine's top-p / "
            "top-k renormalises to probability 1, likely (info only).")
    return _made_info(found, lambda f: f is cr, note)


def _outliers_beside_truncation(found: list[tuple[int, Finding]]
                                ) -> list[tuple[int, Finding]]:
    """``found`` with the sequence-outlier finding pointing at engine-side truncated
    sampling first when that check warns too: a sequence whose tokens the truncation cut
    most (a long flat tail at a given entropy, runs of one-token nuclei) carries more of its
    one-sided bias and reads as an outlier, so MoE routing or the KV cache are not the first thing to
    check (a top-p 0.9 run flagged 21 such sequences, pointed at routing)."""
    kinds = {f.kind: f for _, f in found}
    o, tr = kinds.get("sequence_outliers"), kinds.get("truncated_sampling")
    if o is None or tr is None or tr.severity not in ("warning", "critical"):
        return found
    note = (" The truncated-sampling check warns too: the mass the engine's truncation "
            "cuts varies at equal entropy (a long flat tail loses more than a few strong "
            "alternatives), so a sequence of such tokens, or of many one-token nuclei, "
            "carries more of its one-sided bias and reads as an outlier: these may be that, "
            "not a sequence-level fault.")
    check = ("first the engine-side truncation (see truncated_sampling): compare these "
             "sequences' mean delta with the others' at the same entropy once it is fixed; "
             "then ")
    return [(i, dataclasses.replace(f, message=f.message + note,
                                    check=check + f.check)
             if f is o else f) for i, f in found]


def _logprob_unit_note(ctx: _Ctx, how: str) -> str:
    """When the fit's units check names a unit mistake of a logprob column
    (``ctx.unit_mistake``), the sentence that defers a finding to it (``how``: how the
    mistake makes this finding's signature; it begins ' But': the finding is then info);
    when no units check ran (``ctx.units_checked`` false), a pointer to ``fit``; else ''."""
    from entr_diag.caveats import UNIT_SIGNATURES

    if not ctx.units_checked:
        return (" (No units check ran here: `entr-diag fit` tells this apart from a logprob "
                "column in log10 or log2, which gives the same signature.)")
    sig = UNIT_SIGNATURES.get(ctx.unit_mistake or "")
    if sig is None or not any("logprob" in c for c in sig[0]):
        return ""
    cols, unit = " and ".join(sig[0]), sig[1]
    return (f" But the units check finds {cols} in {unit}, not nats: {how}; see that warning "
            "first (info only until the units are fixed).")


def _check_temperature(ctx: _Ctx) -> _Result:
    """Sampling temperature applied on one side only.

    Signature: log softmax(z / T)[y] = log softmax(z)[y] / T + c(context), so at equal
    entropy infer_logprob is an affine function of train_logprob with slope 1/T, far from 1,
    and the offset c depends on the entropy. A pure numeric mismatch keeps the slope at 1 (up
    to regression dilution, which the two OLS directions bracket). A common bug: the engine
    samples and reports logprobs at temperature T while the trainer recomputes at T = 1 (or
    the reverse), reported by verl and OpenRLHF users as a KL / ratio that never goes to
    zero even on-policy.

    The test pools the centred sums within entropy bins (so the spread of entropy across the
    batch cannot tilt the slope), takes the slope of infer on train and the reciprocal slope of
    train on infer, and fires when both lie on the same side of [1 - SLOPE_TOL, 1 + SLOPE_TOL]
    by Z_CLEAR jackknife standard errors (blocks of whole sequences). Only the freshest tokens
    (smallest staleness) are used when there are FRESH_MIN_TOKENS: RL sharpens the policy
    between versions, which tilts the slope of stale tokens exactly like a temperature would;
    when stale tokens had to be included, a finding is info only.
    """
    name = "one_sided_temperature"
    blk = ctx.blocks
    used = "all tokens"
    stale_mixed = False  # stale tokens in the fit: policy sharpening also tilts the slope
    if ctx.has("staleness") and blk["_stale"].drop_nulls().len():
        s_min = _freshest(blk["_stale"])
        fresh = blk.filter(pl.col("_stale") == s_min)
        if int(fresh["n"].sum()) >= FRESH_MIN_TOKENS:
            blk, used = fresh, f"staleness {s_min} tokens"
        else:
            stale_mixed = blk["_stale"].drop_nulls().n_unique() > 1
            used = f"all tokens (only {int(fresh['n'].sum())} at staleness {s_min})"
    blk = blk.group_by("bin", "block").agg(pl.col("n", "sx", "sy", "sxx", "syy", "sxy").sum())
    n_used = int(blk["n"].sum())
    if n_used < MISALIGN_MIN_PAIRS:
        return _cannot(name, f"fewer than {MISALIGN_MIN_PAIRS} valid tokens")
    b, se_b, rb, se_r, nk = _pooled_slopes(blk)
    if not (math.isfinite(b) and math.isfinite(rb)):
        return _cannot(name, "train_logprob does not vary within entropy bins: no slope")
    corr = math.copysign(math.sqrt(b / rb), b) if b * rb > 0 else 0.0
    if corr < TEMP_MIN_CORR:
        return _cannot(
            name,
            f"train_logprob and infer_logprob barely correlate within entropy bins (r = "
            f"{corr:.2f}): no meaningful slope (misaligned or unrelated columns?)",
        )
    lo, se_lo, hi, se_hi = (b, se_b, rb, se_r) if b <= rb else (rb, se_r, b, se_b)
    se_lo = se_lo if math.isfinite(se_lo) else 0.0
    se_hi = se_hi if math.isfinite(se_hi) else 0.0
    mid = math.copysign(math.sqrt(abs(b * rb)), b)
    slope_trend, m_lo, m_hi = _bias_trend(ctx.bins()) if ctx.has("entropy") else (
        float("nan"), float("nan"), float("nan"))
    ev = {
        "slope_infer_on_train": _r(b),
        "slope_infer_on_train_se": _r(se_b),
        "slope_reciprocal_train_on_infer": _r(rb),
        "slope_reciprocal_se": _r(se_r),
        "slope_geometric_mean": _r(mid),
        "within_bin_correlation": _r(corr),
        "implied_temperature": _r(1.0 / mid) if mid else float("nan"),
        "mean_delta_slope_per_decade_entropy": _r(slope_trend),
        "mean_delta_lowest_entropy_bin": _r(m_lo),
        "mean_delta_highest_entropy_bin": _r(m_hi),
        "sequence_blocks": nk,
        "within_entropy_bins": bool(ctx.has("entropy")),
        "tokens_used": n_used,
        "tokens_selection": used,
        "stale_tokens_in_fit": stale_mixed,
    }
    above = lo - Z_CLEAR * se_lo > 1 + SLOPE_TOL
    below = hi + Z_CLEAR * se_hi < 1 - SLOPE_TOL
    if above or below:
        unit = _logprob_unit_note(ctx, "a unit factor between the two columns is a slope "
                                       "like a temperature's")
        f = Finding(
            kind=name,
            severity="info" if stale_mixed or unit.startswith(" But") else "warning",
            title=f"infer_logprob scales with train_logprob at slope {mid:.3g}, not 1",
            message=(
                f"Within entropy bins, infer_logprob ~= {mid:.3g} x train_logprob + c(H) "
                f"(slope bracket {lo:.3g}..{hi:.3g}, both {'above' if above else 'below'} 1 "
                f"by more than {SLOPE_TOL:g}); mean delta moves by {slope_trend:.3g} nats per "
                "decade of entropy. That is what a sampling temperature applied on one side "
                f"only looks like: T ~ {1.0 / mid:.3g} if the engine's logprobs are "
                f"tempered and the trainer's not, or T ~ {mid:.3g} if the trainer's are "
                "(its logits divided by a temperature the engine's logged logprobs leave "
                "out); the units check's surprisal / entropy ratio of each column tells "
                "which side matches the entropy."
                + (
                    " Stale tokens are in the fit (too few fresh ones), and a policy that "
                    "sharpens between versions tilts the slope the same way: info only."
                    if stale_mixed else ""
                )
                + unit
            ),
            evidence=ev,
            check=(
                "that the trainer divides logits by the rollout temperature before log_softmax "
                "(or that the engine returns logprobs of the unscaled distribution), and that "
                "both sides read the same generation config."
            ),
        )
        return _found(f, f"slope {mid:.4g} (bracket {lo:.4g}..{hi:.4g}) on {used}")
    if not ctx.has("entropy"):
        return _clear(
            name,
            f"slope {mid:.4g} (bracket {lo:.4g}..{hi:.4g}) on {used} consistent with 1; pooled "
            "(no entropy column, so the entropy-dependent offset is not checked)",
        )
    return _clear(
        name, f"slope {mid:.4g} (bracket {lo:.4g}..{hi:.4g}) on {used} consistent with 1")


def _check_truncation(ctx: _Ctx) -> _Result:
    """Truncated sampling support (top-p / top-k / min-p renormalised on the engine only).

    Signature: the engine samples from the renormalised nucleus, so its logprob of the sampled
    token is log p - log Z_kept >= log p: delta = train - infer is systematically NEGATIVE, by
    log Z_kept, which grows with the entropy (a flat distribution loses more mass outside the
    nucleus). A numeric mismatch is nearly centred (mean delta ~ -KL ~ -E[delta^2]/2), so the
    squared mean is a tiny share of E[delta^2]. This bias can pass for a "high-entropy mismatch
    regime" (steeper law, alpha > 1), so the law is also fitted on de-biased delta (delta minus
    its per-entropy-bin mean); TRL and verl users met it as a rollout-vs-trainer KL that scales
    with top_p.

    Fires when, above TRUNC_H_MIN nats, mean delta < 0 and mean^2 / E[delta^2] >=
    TRUNC_BIAS_SHARE, and either -mean delta rises with entropy across bins above
    TRUNC_TREND_H_MIN (Kendall tau, p < TRUNC_TREND_P) or the bias share reaches
    TRUNC_STRONG_SHARE (top-p saturates near -log(top_p) at high entropy, so the trend need
    not be monotone). Evidence also counts engine logprobs of exactly 0.0 where the trainer's
    is clearly negative: a one-token nucleus renormalised to probability 1, which the loader
    excludes as ``zero_placeholder``.
    """
    name = "truncated_sampling"
    if not ctx.has("entropy"):
        return _cannot(name, "no entropy column: a bias growing with entropy cannot be seen")
    void = _entropy_void(ctx, name)
    if void is not None:
        return void
    # the freshest tokens when there are enough: a stale token's delta holds the policy's
    # change too, whose mean is -KL, negative and larger at high entropy (helper-45:
    # untruncated stale runs read a 20% share, a top-k 20 run with lags up to 4 read 5.7%
    # against 41% on its lag-0 tokens)
    cells, used = _freshest_rows(ctx.cells, ctx)
    bins = _bins_of(cells).filter(pl.col("n") >= MIN_BIN_TOKENS)
    hi = bins.filter(pl.col("h") >= TRUNC_H_MIN)
    if hi.height == 0:
        return _cannot(
            name, f"fewer than {MIN_BIN_TOKENS} tokens per bin above {TRUNC_H_MIN:g} nats"
        )
    n_hi = float(hi["n"].sum())
    m_hi = float(hi["sd"].sum()) / n_hi
    q_hi = float(hi["sd2"].sum()) / n_hi
    share = m_hi * m_hi / q_hi if q_hi > 0 else 0.0
    # the upper tail: the highest-entropy bins holding TRUNC_TAIL_SHARE of those tokens
    desc = hi.sort("h", descending=True)
    reach = desc["n"].cast(pl.Float64).cum_sum().to_numpy()
    tail = desc.head(int(np.searchsorted(reach, TRUNC_TAIL_SHARE * n_hi)) + 1)
    n_t = float(tail["n"].sum())
    m_t, q_t = float(tail["sd"].sum()) / n_t, float(tail["sd2"].sum()) / n_t
    share_t = m_t * m_t / q_t if q_t > 0 and m_t < 0 else 0.0
    h_t = float(tail["h"].min())  # (the tail's lowest bin's mean entropy)
    # the tail's mean delta below that of the bins above TRUNC_H_MIN under it, by
    # TRUNC_TAIL_Z standard errors: the bias grows with entropy where a truncation takes
    # its mass, whatever the low bins do (helper-45: bf16 rounding made mean delta negative
    # at 0.01 to 0.05 nats and a real top-k 30 run's Kendall trend missed, p = 0.026)
    mid = hi.filter(~pl.col("bin").is_in(tail["bin"].implode()))
    n_m = float(mid["n"].sum())
    z_t = math.nan
    if n_m > 0:
        m_m, q_m = float(mid["sd"].sum()) / n_m, float(mid["sd2"].sum()) / n_m
        se = math.sqrt(max(q_t - m_t * m_t, 0.0) / n_t + max(q_m - m_m * m_m, 0.0) / n_m)
        z_t = (m_m - m_t) / se if se > 0 else math.nan
    tr = bins.filter(pl.col("h") >= TRUNC_TREND_H_MIN)
    if tr.height >= 3:
        from scipy import stats

        tau, p = stats.kendalltau(tr["h"].to_numpy(), -tr["m"].to_numpy())
        tau, p = float(tau), float(p)
    else:
        tau, p = float("nan"), float("nan")
    law = bins.filter(pl.col("h") >= TRUNC_LAW_H_MIN)
    h = law["h"].to_numpy()
    q = law["q"].to_numpy()
    m = law["m"].to_numpy()
    w = law["n"].to_numpy().astype(float)
    v = np.clip(q - m * m, 0.0, None)  # de-biased: E[(delta - mean_bin)^2]
    neg_share = float(hi["nneg"].sum()) / n_hi
    ev = {
        "mean_delta_above_h_min": _r(m_hi),
        "mean_delta2_above_h_min": _r(q_hi),
        "bias_share_above_h_min": _r(share),
        "upper_tail_mean_entropy_from": _r(h_t, 4),
        "upper_tail_token_share": _r(n_t / n_hi),
        "mean_delta_upper_tail": _r(m_t),
        "bias_share_upper_tail": _r(share_t),
        "upper_tail_z_vs_lower_bins": _r(z_t),
        "share_delta_negative_above_h_min": _r(neg_share),
        "kendall_tau_entropy_vs_neg_mean_delta": _r(tau),
        "kendall_p": _r(p),
        "k_raw": _r(_k_fit(h, q, w)),
        "k_debiased": _r(_k_fit(h, v, w)),
        "alpha_raw": _r(_alpha_fit(h, q)),
        "alpha_debiased": _r(_alpha_fit(h, v)),
        "law_h_min_nats": TRUNC_LAW_H_MIN,
        "entropy_per_bin": [_r(x, 3) for x in bins["h"].to_list()],
        "mean_delta_per_bin": [_r(x, 3) for x in bins["m"].to_list()],
        "h_min_nats": TRUNC_H_MIN,
        "tokens_selection": used,
    }
    ev.update(_engine_zero_share(ctx))
    trend = (math.isfinite(p) and tau > 0 and p < TRUNC_TREND_P) or (
        math.isfinite(z_t) and z_t >= TRUNC_TAIL_Z)
    pooled = m_hi < 0 and share >= TRUNC_BIAS_SHARE
    if (pooled or share_t >= TRUNC_BIAS_SHARE) and (
            trend or max(share, share_t) >= TRUNC_STRONG_SHARE):
        n_zero, kept = (ev.get("engine_logprob_exactly_zero_tokens") or 0,
                        ev.get("engine_logprob_zero_kept_as_nuclei") or 0)
        zero_note = (
            f" {n_zero:,} loss-masked tokens have an engine logprob of exactly 0.0 where the "
            f"trainer's is below {S.ZERO_PLACEHOLDER_OTHER_MAX:g} nats (a one-token nucleus), "
            + ("kept as valid tokens (their trainer logprobs all read as a nucleus's)"
               if kept == n_zero else f"{kept:,} kept as valid tokens, the others excluded as "
               "zero placeholders" if kept else "excluded as zero placeholders") + "."
            if n_zero else ""
        )
        kendall = math.isfinite(p) and tau > 0 and p < TRUNC_TREND_P
        trend_txt = (
            f"-mean delta rises with entropy (Kendall tau {tau:.2f}, {_pval(p)})"
            if kendall else
            f"-mean delta in the flattest bins is {z_t:.1f} standard errors above the lower "
            f"bins' (Kendall tau {tau:.2f}, {_pval(p)}, over all bins)"
            if trend else f"the bias dominates the spread (Kendall tau {tau:.2f}, {_pval(p)})"
        )
        unit = _logprob_unit_note(ctx, "a unit factor on one logprob column shifts delta "
                                       "one way, more where the logprobs are larger")
        f = Finding(
            kind=name,
            severity="info" if unit.startswith(" But") else "warning",
            title="One-sided negative delta at high entropy: truncated sampling on the engine side?",
            message=(
                f"On {used}, above {TRUNC_H_MIN:g} nats, mean delta is {m_hi:.3g} nats and carries "
                f"{share:.0%} of E[delta^2] ({neg_share:.0%} of deltas negative)"
                + ("" if pooled else
                   f"; in the flattest {_share(n_t / n_hi)} of them (mean entropy "
                   f"{h_t:.3g} nats and above), {m_t:.3g} nats and {share_t:.0%}: the "
                   "engine truncates its flattest distributions most (a top-k with a large "
                   "k, a model sure of itself at most positions)")
                + f"; {trend_txt}. "
                "That is the renormalisation of a top-p / top-k / "
                f"min-p support by the engine only. Law over this check's entropy bins "
                f"above {TRUNC_LAW_H_MIN:g} nats (not the fit's bins and law regime), on raw "
                f"delta: k = {ev['k_raw']}, alpha = {ev['alpha_raw']}; on de-biased delta: "
                f"k = {ev['k_debiased']}, alpha = {ev['alpha_debiased']}. The mismatch "
                "metrics measure this support difference, not engine noise: the trainer puts "
                "a mass Z < 1 on the engine's support and exp(delta) is about Z on it, so kl "
                "(k1) is about -ln Z, chi2_token about Z^2 - 1 (negative), chi2_seq near -1 "
                f"on long sequences, and ESS about 1.{zero_note}"
                + (" But the units check finds that infer_logprob does not hold the sampled "
                   "token's logprob: the argmax (most likely) token's logprob gives the same "
                   "one-sided delta; see that warning first." if ctx.other_token ==
                   "infer_logprob" else "")
                + unit
            ),
            evidence=ev,
            check=(
                "top_p / top_k / min_p in the rollout sampling params: either log the "
                "logprobs of the untruncated distribution (e.g. vLLM logprobs_mode "
                "'raw_logprobs') or apply the same truncation in the trainer's log_softmax."
                + (" First: which token's logprob the engine column holds (the sampled "
                   "token's, not the argmax)." if ctx.other_token == "infer_logprob" else "")
            ),
        )
        return _found(f, f"mean delta {m_hi:.3g} above {TRUNC_H_MIN:g} nats, bias share {share:.0%}"
                         + ("" if pooled else f"; {m_t:.3g} and {share_t:.0%} in the flattest "
                            f"{_share(n_t / n_hi)}"))
    return _clear(
        name,
        f"mean delta above {TRUNC_H_MIN:g} nats on {used} is {m_hi:.3g} (bias share {share:.1%} of "
        f"E[delta^2]; {share_t:.1%} in the flattest {_share(n_t / n_hi)})",
    )


def _engine_zero_share(ctx: _Ctx) -> dict[str, Any]:
    """Loss-masked tokens whose engine logprob is exactly 0.0 while the trainer's is clearly
    negative (the loader's ``zero_placeholder`` on the inference side, or the zeros it read
    as one-token nuclei and kept, ``Dataset.nucleus_zeros``, also given apart as
    ``engine_logprob_zero_kept_as_nuclei``): with truncated sampling this is a nucleus of
    one token, renormalised to probability 1."""
    if getattr(ctx.ds, "raw", None) is None:
        return {}
    acc = getattr(ctx.ds, "accounting", None)
    if acc is not None:
        # zero-placeholder rows are bad masked rows (per-sequence table, shared with the
        # corrupt-rows check); masked rows = accounting's loss-masked tokens minus those
        # with a null or invalid mask
        bad = ctx._bad
        assert bad is not None
        z_n = int(bad["n_ph_zero"].sum()) if bad.height else 0
        r = (z_n, int(acc.tokens_masked) - int(acc.excluded.get("null_loss_mask", 0))
             - int(acc.excluded.get("invalid_loss_mask", 0)))
    else:
        assert ctx.zero_counts is not None
        r = ctx.zero_counts
    kept = int(getattr(ctx.ds, "nucleus_zeros", 0) or 0)
    z = int(r[0] or 0) + kept
    return {
        "engine_logprob_exactly_zero_tokens": z,
        "engine_logprob_exactly_zero_share": _r(z / r[1]) if r[1] else 0.0,
        "engine_logprob_zero_kept_as_nuclei": kept,
    }


def _without_flagged(seqbins: pl.DataFrame, seqs: pl.DataFrame, cells: pl.DataFrame,
                     flagged: pl.DataFrame) -> tuple[pl.LazyFrame, pl.DataFrame, pl.DataFrame]:
    """The sequence-outlier tables less the tokens with an impossible logprob (``flagged``:
    their per (seq_key, bin, _stale) n, sh, sad, sd2, from :class:`_ImplausibleTokens`).

    Returns the per (sequence, bin, staleness) rows as a lazy frame of signed rows (the
    table's rows, then the flagged ones with their n, sh, sd2 negated: every use of the table
    is a sum, so the flagged tokens cancel without a copy of the table, which holds a row per
    (sequence, bin) and is the largest the forensics keep), the per-sequence sums and the
    per (bin, staleness) sums, less the flagged tokens."""
    keys = ["seq_key", "bin", "_stale"]
    cols = ["n", "sh", "sd2"]
    own = seqbins.lazy().select(*keys, pl.col("n").cast(pl.Int64), "sh", "sd2")
    neg = flagged.lazy().select(
        *(pl.col(k).cast(seqbins.schema[k]) for k in keys),
        *(-pl.col(c).cast(pl.Int64 if c == "n" else pl.Float64) for c in cols))
    rows = pl.concat([own, neg], how="vertical")
    fs = flagged.group_by("seq_key").agg(pl.col("n", "sh", "sad", "sd2").sum().name.prefix("_f"))
    sub = {c: pl.col(c) - pl.col(f"_f{c}").fill_null(0) for c in ("sh", "sad", "sd2")}
    seqs = (seqs.join(fs, on="seq_key", how="left")
            .with_columns(*(e.alias(c) for c, e in sub.items()),
                          *((pl.col(c).cast(pl.Int64) - pl.col("_fn").fill_null(0))
                            .cast(seqs.schema[c]).alias(c) for c in ("n", "nh")))
            .drop("_fn", "_fsh", "_fsad", "_fsd2"))
    fc = flagged.group_by("bin", "_stale").agg(pl.col("n", "sh", "sad", "sd2").sum()
                                               .name.prefix("_f"))
    cells = (cells.join(fc, on=["bin", "_stale"], how="left", nulls_equal=True)
             .with_columns((pl.col(c) - pl.col(f"_f{c}").fill_null(0)).alias(c)
                           for c in ("n", "sh", "sad", "sd2"))
             .drop("_fn", "_fsh", "_fsad", "_fsd2").filter(pl.col("n") > 0))
    return rows, seqs, cells


#: a flagged sequence whose |delta| fewer tokens than this carry (participation ratio) is
#: carried by one or two tokens: a catastrophic token, not a whole-sequence shift
FEW_CARRIERS = 3.0
#: ... and so is one whose participation ratio is below this share of its tokens (a few
#: spikes in a long sequence; a whole-sequence shift gives about 0.4 to 0.64 of them: iid
#: Student-t3 to Gaussian |delta|)
FEW_CARRIERS_SHARE = 0.05


def _check_outliers(ctx: _Ctx) -> _Result:
    """Sequence-level outliers (e.g. MoE routing differences between engine and trainer).

    Signature: whole sequences whose |delta| is large whatever the entropy of their tokens.
    A routing difference in a mixture-of-experts layer (a different expert chosen on one side
    for the tokens of a prompt) or a corrupted KV cache shifts every token of the sequence;
    a numeric mismatch scatters across tokens. Reported by users of MoE models (Qwen3-MoE,
    DeepSeek) under verl and slime, where "routing replay" was introduced for this reason.

    Score: per sequence, log(mean |delta| / mean expected |delta|), the expectation being the
    mean |delta| of each token's (entropy bin, staleness) cell, so neither low-entropy noise
    tokens nor stale sequences pass for outliers; robust z over sequences with at least
    OUTLIER_MIN_TOKENS tokens (median and 1.4826 MAD). Sequences above OUTLIER_Z are listed,
    with the share of sum delta^2 they carry and the law (k) with and without them.
    """
    name = "sequence_outliers"
    has_h = ctx.has("entropy")
    assert ctx.seqbins is not None and ctx.seqs is not None
    seqbins, seqs = ctx.seqbins.lazy(), ctx.seqs
    # tokens with an impossible logprob (placeholders: implausible_logprobs reports them)
    # are left out of every sum here: a sequence is scored on its other tokens, and they
    # neither fill the outlier list nor raise the cells' expectations
    flagged = (ctx.implausible.slots.result() if ctx.implausible is not None
               else pl.DataFrame())
    cells = ctx.cells.group_by("bin", "_stale").agg(pl.col("n", "sh", "sad", "sd2").sum())
    if flagged.height:
        seqbins, seqs, cells = _without_flagged(ctx.seqbins, seqs, cells, flagged)
    # expected |delta| per (entropy bin, staleness): a stale sequence is not an outlier
    expect = cells.select("bin", "_stale", (pl.col("sad") / pl.col("n")).alias("_ea"))
    # per sequence, from the merged per-sequence sums; the expectation of a sequence is the
    # sum over its tokens of their cell's mean |delta| (per (sequence, bin, staleness) counts)
    sea = (
        seqbins
        .join(expect.lazy(), on=["bin", "_stale"], how="left", nulls_equal=True)
        .group_by("seq_key")
        .agg((pl.col("n") * pl.col("_ea")).sum().alias("sea"))
    )
    per = (
        seqs.lazy()
        .join(sea, on="seq_key", how="left")
        .select("seq_key", "seq_id", "n", "sad", "sea", "sd2",
                pl.when(pl.col("nh") > 0).then(pl.col("sh") / pl.col("nh")).alias("mean_h"))
        .filter(pl.col("n") >= OUTLIER_MIN_TOKENS, pl.col("sea") > 0)
        .with_columns((pl.col("sad").clip(lower_bound=1e-300) / pl.col("sea")).log().alias("x"))
    )
    med = pl.col("x").median()
    mad = (pl.col("x") - med).abs().median() * 1.4826
    # one row per sequence: collected once, the rest is on this small frame
    scored = per.collect().lazy().with_columns(
        ((pl.col("x") - med) / mad).alias("z"))
    summary = scored.select(
        pl.len().alias("n_seq"),
        pl.col("sd2").sum().alias("sd2_all"),
        (pl.col("z") > OUTLIER_Z).sum().alias("n_out"),
        pl.col("sd2").filter(pl.col("z") > OUTLIER_Z).sum().alias("sd2_out"),
        pl.col("n").filter(pl.col("z") > OUTLIER_Z).sum().alias("tok_out"),
        mad.alias("mad"),
    )
    top = (
        scored.filter(pl.col("z") > OUTLIER_Z)
        .sort("z", "seq_key", descending=[True, False])  # (ties: identical sequences)
        .select("seq_key", "seq_id", "n", "z", (pl.col("sad") / pl.col("n")).alias("mean_abs"),
                "mean_h",
                # tokens that carry the sequence's |delta| (participation ratio (sum |d|)^2 /
                # sum d^2: 1 when one token holds it all, n when all hold the same)
                (pl.col("sad") ** 2 / pl.col("sd2")).alias("carriers"), "sd2")
        .with_columns((pl.col("carriers") < pl.max_horizontal(
            pl.lit(FEW_CARRIERS), FEW_CARRIERS_SHARE * pl.col("n"))).alias("few"))
    )
    s_df, top_df = pl.collect_all([summary, top])
    s = s_df.row(0, named=True)
    n_seq = int(s["n_seq"])
    if n_seq < 20:
        return _cannot(
            name, f"only {n_seq} sequences with >= {OUTLIER_MIN_TOKENS} tokens (need 20)"
        )
    if not s["mad"] or not math.isfinite(s["mad"]):
        return _cannot(name, "per-sequence |delta| does not vary: no robust scale")
    n_out = int(s["n_out"])
    if n_out == 0:
        return _clear(name, f"no sequence above robust z {OUTLIER_Z:g} among {n_seq} scored")
    share_d2 = float(s["sd2_out"]) / float(s["sd2_all"]) if s["sd2_all"] else 0.0
    seq_share = n_out / n_seq
    # law with and without the flagged sequences
    k_with = k_without = float("nan")
    if has_h:
        # per-bin sums of all tokens come from ctx.cells; those of the flagged sequences from
        # their rows of the (sequence, bin, staleness) table; "without" = all - flagged
        out_keys = top_df["seq_key"]
        sums = [pl.col("n").sum(), pl.col("sh").sum(), pl.col("sd2").sum()]
        s_all = cells.group_by("bin").agg(sums)
        s_out = (
            seqbins.filter(pl.col("seq_key").is_in(out_keys.implode()))
            .group_by("bin")
            .agg(pl.col("n").cast(pl.Int64).sum().alias("n_o"), pl.col("sh").sum().alias("sh_o"),
                 pl.col("sd2").sum().alias("sd2_o"))
            .collect()
        )
        ba = s_all.select("bin", "n", (pl.col("sh") / pl.col("n")).alias("h"),
                          (pl.col("sd2") / pl.col("n")).alias("q")).sort("bin")
        bw = (
            s_all.join(s_out, on="bin", how="left")
            .with_columns(pl.col("n_o", "sh_o", "sd2_o").fill_null(0))
            .select("bin", (pl.col("n") - pl.col("n_o")).alias("n"),
                    ((pl.col("sh") - pl.col("sh_o")) / (pl.col("n") - pl.col("n_o"))).alias("h"),
                    ((pl.col("sd2") - pl.col("sd2_o")) / (pl.col("n") - pl.col("n_o"))).alias("q"))
            .filter(pl.col("n") > 0)
            .sort("bin")
        )
        k_with = _k_fit(ba["h"].to_numpy(), ba["q"].to_numpy(), ba["n"].to_numpy().astype(float))
        k_without = _k_fit(bw["h"].to_numpy(), bw["q"].to_numpy(), bw["n"].to_numpy().astype(float))
    head = top_df.head(OUTLIER_LIST)
    ev = {
        "sequences_scored": n_seq,
        "sequences_flagged": n_out,
        "sequence_share_flagged": _r(seq_share),
        "tokens_flagged": int(s["tok_out"]),
        "delta2_share_flagged": _r(share_d2),
        "robust_z_threshold": OUTLIER_Z,
        "top_seq_ids": [str(x) for x in head["seq_id"].to_list()],
        "top_robust_z": [_r(x, 3) for x in head["z"].to_list()],
        "top_mean_abs_delta": [_r(x, 3) for x in head["mean_abs"].to_list()],
        "top_mean_entropy": [_r(x, 3) for x in head["mean_h"].to_list()],
        "k_with_flagged": _r(k_with),
        "k_without_flagged": _r(k_without),
        "top_tokens_carrying_abs_delta": [_r(x, 3) for x in head["carriers"].to_list()],
    }
    # sequences whose |delta| a few tokens carry: catastrophic tokens, not a shift of the
    # whole sequence (routing, cache) the finding otherwise points at
    n_single = int(top_df["few"].sum())
    ev["flagged_carried_by_few_tokens"] = n_single
    share_whole = (float(top_df.filter(~pl.col("few"))["sd2"].sum()) / float(s["sd2_all"])
                   if s["sd2_all"] else 0.0)
    ev["delta2_share_flagged_whole_sequence"] = _r(share_whole)
    if seq_share > OUTLIER_MAX_SEQ_SHARE:
        return _clear(
            name,
            f"{n_out} of {n_seq} sequences ({seq_share:.1%}) above robust z {OUTLIER_Z:g}: a "
            "broad tail rather than a few outlier sequences",
        )
    if share_d2 < OUTLIER_MIN_SHARE:
        return _clear(
            name,
            f"{n_out} of {n_seq} sequences above robust z {OUTLIER_Z:g} but they carry only "
            f"{share_d2:.2%} of sum delta^2 (e.g. seq_id {', '.join(ev['top_seq_ids'][:3])})",
        )
    # a warning rests on whole-sequence outliers: sequences flagged for a few spiking tokens
    # are heavy tails of the token mismatch (iid Student-t3 noise makes them), which the fit's
    # catastrophic-token caveat weighs for the law
    sev = "warning" if share_whole >= OUTLIER_SHARE_WARN else "info"
    # flagged sequences that also hold impossible logprobs (scored without them)
    n_impl = (int(top_df["seq_key"].is_in(flagged["seq_key"].implode()).sum())
              if flagged.height else 0)
    if n_impl:
        ev["flagged_with_impossible_logprobs"] = n_impl
    f = Finding(
        kind=name,
        severity=sev,
        title=(f"{n_out} sequence(s) whose large |delta| a few tokens carry"
               if n_single == n_out else
               f"{n_out} sequence(s) with large |delta| whatever their entropy"),
        message=(
            f"{n_out} of {n_seq} sequences ({seq_share:.2%}) have a mean |delta| more than "
            f"{OUTLIER_Z:g} robust standard deviations above what their tokens' entropies "
            f"predict; they carry {share_d2:.1%} of sum delta^2."
            + (f" k of delta^2 = k H (fitted through the origin over every entropy bin, not "
               f"the verdict's law-regime fit) = {k_with:.3g} with them, {k_without:.3g} "
               "without." if math.isfinite(k_with) else "")
            + f" Worst: {', '.join(ev['top_seq_ids'][:5])}."
            + (f" {'All' if n_impl == n_out else n_impl} of them also hold impossible "
               f"logprobs (at or below {IMPLAUSIBLE_LOGPROB:g} nats, see "
               "implausible_logprobs), left out of their scores: they are outliers on their "
               "other tokens." if n_impl else "")
            + (f" In {'all' if n_single == n_out else n_single} of them one or two tokens "
               f"(or a few in a long sequence) carry the sequence's |delta| (fewer than "
               f"{FEW_CARRIERS:g} tokens, or {FEW_CARRIERS_SHARE:.0%} of its tokens, by the "
               "participation ratio (sum |delta|)^2 / sum delta^2): catastrophic tokens, "
               "not a mismatch of the whole sequence"
               + (" (heavy tails of the token mismatch: info only)" if n_single == n_out
                  else f"; the others carry {share_whole:.1%} of sum delta^2")
               + "." if n_single else "")
        ),
        evidence=ev,
        check=(
            ("the tokens that carry those sequences (their sampled-token probability on "
             "each side, the kernel or numeric path that gave them; a veto or token mask "
             "drops them)" + ("." if n_single == n_out else "; for the other sequences, ")
             if n_single else "")
            + ("" if n_single == n_out else
               "MoE routing consistency between engine and trainer (routing replay / same "
               "router precision), KV-cache reuse across weight updates, and per-request "
               "engine settings (LoRA adapter, sampling params) for the listed sequences.")
        ),
    )
    return _found(f, f"{n_out} sequences flagged, {share_d2:.1%} of delta^2")


@dataclass(frozen=True)
class _Trend:
    """Joint fixed-effects model of log mean |delta| per (bin, step, staleness) cell."""

    ok: bool
    why: str
    cells: int = 0
    step_span: tuple[int, int] = (0, 0)
    beta_step: float = float("nan")  # log growth over the whole run (step scaled to 0..1)
    se_step: float = float("nan")
    p_step: float = float("nan")
    beta_stale: float = float("nan")  # log growth per version of lag
    se_stale: float = float("nan")
    p_stale: float = float("nan")
    steps: tuple[int, ...] = ()
    step_level: tuple[float, ...] = ()  # per-step level adjusted for entropy and staleness
    #: the per-step levels compare across steps (one intercept per entropy bin); with one
    #: per (bin, staleness), a lag present in some steps only is centred on its own steps
    levels_comparable: bool = True


def _law_cells(ctx: _Ctx) -> pl.DataFrame:
    """``ctx.cells`` without the forensic entropy bins that reach below the fitted law's H*
    (``ctx.law_h_star``; every cell without one): the low-entropy noise regime's delta is
    pure noise, no policy drift, and would dilute the staleness ratios."""
    if ctx.law_h_star is None or not math.isfinite(ctx.law_h_star):
        return ctx.cells
    lo = H_BIN_LO * 10 ** (pl.col("bin").cast(pl.Float64) * BIN_DECADES)
    return ctx.cells.filter(lo >= ctx.law_h_star * (1 - 1e-9))


def _steps_known(ctx: _Ctx) -> bool:
    """Whether the tokens have steps (a step column holding only nulls has none)."""
    return ctx.has("step") and ctx.cells["_step"].drop_nulls().len() > 0


def _trend_cells(cells: pl.DataFrame, need_step: bool = True) -> pl.DataFrame:
    """The cells a trend model reads: known staleness (and step, with ``need_step``), at
    least MIN_CELL_TOKENS tokens, some |delta|; ``y`` = ln mean |delta|."""
    return (cells.drop_nulls(["_step", "_stale"] if need_step else ["_stale"])
            .with_columns(pl.col("_step").fill_null(0))
            .filter(pl.col("n") >= MIN_CELL_TOKENS, pl.col("sad") > 0)
            .with_columns((pl.col("sad") / pl.col("n")).log().alias("y")))


def _within_step(c: pl.DataFrame, with_step: bool) -> tuple[pl.DataFrame, np.ndarray]:
    """The cells of ``c`` (:func:`_trend_cells`) whose (entropy bin, step) holds two
    staleness values or more, and their group keys: only they say how |delta| depends on
    the lag at fixed entropy and step (a step whose tokens all have one lag, e.g. a
    synchronous warm-up, says nothing of it)."""
    # one id per (bin, step) pair (a dense rank: no arithmetic key can collide)
    key = (pl.struct("bin", "_step") if with_step else pl.struct("bin")).rank("dense")
    c = c.with_columns(key.cast(pl.Int64).alias("_g"))
    c = c.filter(pl.col("_stale").n_unique().over("_g") >= 2)
    return c, c["_g"].to_numpy()


def _joint_trend(ctx: _Ctx) -> _Trend:
    """ln mean |delta| per (bin, step, staleness) cell = a_(bin, step) + b_stale *
    staleness, on the cells of the (bin, step) pairs that hold two staleness values or
    more (used by the staleness check).

    One intercept per entropy bin and step: a lag is compared with another only at equal
    entropy (the law moves |delta| with H) and within one step, so a change of the engine
    or of the policy over steps cannot pass for a staleness effect, whatever its shape
    (async runs start with no lag: fitting the step as a linear trend let a jump at the
    step the lag begins pass for staleness). Without a step column: one intercept per bin.
    """
    if ctx._trend is not None:
        return ctx._trend
    with_step = _steps_known(ctx)
    c = _trend_cells(_law_cells(ctx), with_step)
    if c.height == 0:
        ctx._trend = _Trend(False, f"no cell holds >= {MIN_CELL_TOKENS} tokens")
        return ctx._trend
    st = c["_step"].to_numpy().astype(float)
    s0, s1 = float(st.min()), float(st.max())
    if c["_stale"].n_unique() < 2:
        ctx._trend = _Trend(False, "staleness does not vary")
        return ctx._trend
    fit = _stale_slope(c, with_step)
    if isinstance(fit, str):
        ctx._trend = _Trend(False, fit)
        return ctx._trend
    cells, beta, se, p = fit
    ctx._trend = _Trend(True, "", cells=cells, step_span=(int(s0), int(s1)),
                        beta_stale=beta, se_stale=se, p_stale=p)
    return ctx._trend


def _stale_slope(c: pl.DataFrame, with_step: bool) -> tuple[int, float, float, float] | str:
    """ln mean |delta| = a_(bin, step) + b * staleness on the cells of ``c``
    (:func:`_trend_cells`) whose (bin, step) holds two staleness values or more: (cells
    used, b, its standard error, its p-value), or why it cannot be estimated."""
    w_c, grp = _within_step(c, with_step)
    if w_c.height == 0:
        return ("staleness never varies within a step at fixed entropy: it cannot be "
                "separated from changes over steps" if with_step
                else "staleness does not vary within entropy bins")
    beta, se, pv, _ = _fe_ols(grp, w_c["_stale"].to_numpy().astype(float)[:, None],
                              w_c["y"].to_numpy(), w_c["n"].to_numpy().astype(float))
    if not np.all(np.isfinite(beta)):
        return "too few cells where staleness varies within a step"
    return int(w_c.height), float(beta[0]), float(se[0]), float(pv[0])


def _stale_effects(c: pl.DataFrame, with_step: bool) -> tuple[dict[int, float], bool]:
    """ln of mean |delta| per staleness value relative to a reference value, at equal
    entropy bin and step (``c``: :func:`_trend_cells`): one fixed-effects fit with an
    intercept per (bin, step) and a dummy per staleness value, on the (bin, step) pairs
    holding two values or more. A value is compared with another only through steps where
    both occur (or chains of them): the values that never share a step with the others
    form another group, and only the group of values holding the most tokens is fitted,
    relative to its smallest value. Returns ({value: effect, the reference 0.0}, whether
    every staleness value of ``c`` is in it); ({}, False) when nothing is comparable."""
    w_c, grp = _within_step(c, with_step)
    if w_c.height == 0:
        return {}, False
    st = w_c["_stale"].to_numpy().astype(np.int64)
    # the values compared through shared (bin, step) pairs: connected components
    parent = {int(v): int(v) for v in np.unique(st)}

    def root(v: int) -> int:
        while parent[v] != v:
            parent[v] = parent[parent[v]]
            v = parent[v]
        return v

    order = np.argsort(grp, kind="stable")
    g_s, s_s = grp[order], st[order]
    first = np.flatnonzero(np.r_[True, g_s[1:] != g_s[:-1]])
    for a, b in zip(first, np.r_[first[1:], g_s.size], strict=True):
        r0 = root(int(s_s[a]))
        for v in s_s[a + 1:b]:
            r = root(int(v))
            if r != r0:
                parent[r] = r0
    comp = np.array([root(int(v)) for v in st])
    n = w_c["n"].to_numpy().astype(float)
    roots = np.unique(comp)
    best = roots[np.argmax([n[comp == r].sum() for r in roots])]
    keep = comp == best
    vals = sorted(int(v) for v in np.unique(st[keep]))
    ref = vals[0]
    X = np.column_stack([(st[keep] == v).astype(float) for v in vals[1:]])
    beta, _, _, _ = _fe_ols(grp[keep], X, w_c["y"].to_numpy()[keep], n[keep])
    if not np.all(np.isfinite(beta)):
        return {}, False
    out = {ref: 0.0, **{v: float(b) for v, b in zip(vals[1:], beta, strict=True)}}
    every = set(out) == {int(v) for v in c["_stale"].unique().to_list()}
    return out, every


def _drift_trend(ctx: _Ctx, lag_free: bool = False) -> tuple[_Trend, str]:
    """log(mean |delta|) per (bin, step, staleness) cell = a_g + b * step / span.

    On the freshest tokens (engine mismatch proper, g = (bin, staleness)) when they number
    FRESH_MIN_TOKENS and are in FRESH_STEP_SHARE of the steps (at least DRIFT_MIN_STEPS);
    else on all tokens: with one intercept per bin after removing each staleness value's
    effect at fixed entropy and step (:func:`_stale_effects`) when every value's is known;
    with one intercept per bin when |delta| does not grow with the lag within steps (a run
    whose lag begins at some step, where the engine changed too, would otherwise hide that
    change); else with one per (bin, staleness). ``lag_free``: on all tokens with one
    intercept per bin, the lag not held fixed (:func:`_lag_onset_jump`). Returns the trend
    (``beta_step`` etc.; ``step_level`` the per-step adjusted level) and a description of
    the tokens used.
    """
    c = _trend_cells(ctx.cells)
    used = "all tokens at fixed staleness"
    by_bin = False
    if lag_free:
        used, by_bin = "all tokens, the lag not held fixed", True
    elif ctx.has("staleness") and c.height:
        s_min = _freshest(c["_stale"])
        fresh = c.filter(pl.col("_stale") == s_min)
        n_steps = c["_step"].n_unique()
        if (int(fresh["n"].sum()) >= FRESH_MIN_TOKENS and fresh["_step"].n_unique()
                >= max(DRIFT_MIN_STEPS, math.ceil(FRESH_STEP_SHARE * n_steps))):
            c, used = fresh, f"staleness {int(s_min)} tokens"  # type: ignore[arg-type]
        elif c["_stale"].n_unique() > 1:
            eff, every = _stale_effects(c, ctx.has("step"))
            if every:
                off = c["_stale"].replace_strict(eff, return_dtype=pl.Float64)
                c = c.with_columns(pl.col("y") - off)
                used, by_bin = ("all tokens, each staleness value's effect at fixed entropy "
                                "and step removed"), True
            else:
                slope = _stale_slope(c, ctx.has("step"))
                unit = _lag_unit(c["_stale"])
                if not isinstance(slope, str) and (
                        slope[3] >= STALENESS_P
                        or math.exp(slope[1] * unit) < STALENESS_MIN_GROWTH):
                    used, by_bin = ("all tokens: |delta| does not grow with the lag within "
                                    "steps"), True
    elif not ctx.has("staleness"):
        used = "all tokens"
    if c.height == 0:
        return _Trend(False, f"no cell holds >= {MIN_CELL_TOKENS} tokens"), used
    st = c["_step"].to_numpy().astype(float)
    s0, s1 = float(st.min()), float(st.max())
    if s1 <= s0:
        return _Trend(False, "a single step"), used
    x = (st - s0) / (s1 - s0)
    y = c["y"].to_numpy()
    w = c["n"].to_numpy().astype(float)
    grp = c.select((pl.struct("bin") if by_bin else pl.struct("bin", "_stale"))
                   .rank("dense").cast(pl.Int64)).to_series().to_numpy()
    beta, se, pv, _ = _fe_ols(grp, x[:, None], y, w)
    if not np.isfinite(beta[0]):
        return _Trend(False, "no entropy bin is populated at several steps"), used
    comparable = by_bin or c["_stale"].n_unique() <= 1
    adj = y.copy()
    for g in np.unique(grp):
        m = grp == g
        adj[m] = adj[m] - np.sum(w[m] * adj[m]) / w[m].sum()
    ust = np.unique(st)
    level = tuple(float(np.sum(w[st == u] * adj[st == u]) / w[st == u].sum()) for u in ust)
    return _Trend(
        True, "", cells=int(c.height), step_span=(int(s0), int(s1)),
        beta_step=float(beta[0]), se_step=float(se[0]), p_step=float(pv[0]),
        steps=tuple(int(u) for u in ust), step_level=level, levels_comparable=comparable,
    ), used


#: drift: a rise between two consecutive steps of the per-step level is called a jump when it
#: holds at least this share of the rise from the lowest level to the highest after it
DRIFT_JUMP_SHARE = 0.6


def _step_jump(steps: np.ndarray, level: np.ndarray) -> tuple[int, int, float] | None:
    """(step before, step after, factor) of the largest rise of mean |delta| between two
    consecutive steps of the per-step adjusted log level, when it holds DRIFT_JUMP_SHARE of
    the largest rise over the run (from a level to the highest level after it) and is at
    least DRIFT_MIN_GROWTH; else None (a gradual drift, or none)."""
    if len(level) < 3:
        return None
    lv = np.asarray(level, dtype=float)
    rise = float(np.max(lv - np.minimum.accumulate(lv)))
    d = np.diff(lv)
    i = int(np.argmax(d))
    if rise <= 0 or d[i] < DRIFT_JUMP_SHARE * rise or math.exp(d[i]) < DRIFT_MIN_GROWTH:
        return None
    return int(steps[i]), int(steps[i + 1]), float(math.exp(d[i]))


#: a step spikes when its adjusted level is at least this factor above the median step's...
SPIKE_MIN_RATIO = 2.0
#: ... and this many robust standard deviations (1.4826 MAD of the other steps) above it
SPIKE_Z = 5.0


def _step_spikes(steps: np.ndarray, level: np.ndarray) -> list[tuple[int, float]]:
    """(step, factor over the median step) of the steps whose per-step adjusted log level
    stands SPIKE_MIN_RATIO above the median of all steps and SPIKE_Z robust standard
    deviations of the other steps above it, when at most a quarter of the steps (at least
    one) do: a short-lived rise (a failed or half-applied weight sync, an engine restart),
    which a trend over the run or a lasting jump does not describe. [] otherwise."""
    lv = np.asarray(level, dtype=float)
    if lv.size < DRIFT_MIN_STEPS or not np.isfinite(lv).all():
        return []
    med = float(np.median(lv))
    high = np.flatnonzero(lv - med >= math.log(SPIKE_MIN_RATIO))
    if not high.size or high.size > max(1, lv.size // 4):
        return []
    rest = np.delete(lv, high)
    scale = 1.4826 * float(np.median(np.abs(rest - np.median(rest))))
    out = [(int(steps[i]), float(math.exp(lv[i] - med))) for i in high
           if lv[i] - med >= SPIKE_Z * scale]
    return out if len(out) == high.size else []


def _spike_finding(spikes: list[tuple[int, float]], ev: dict, used: str) -> _Result:
    """The warning for one-step spikes of the adjusted level (:func:`_step_spikes`)."""
    at = ", ".join(f"step {s} (x{r:.2f})" for s, r in spikes)
    ev = {**ev, "spike_steps": [s for s, _ in spikes],
          "spike_factor_over_median_step": [_r(r) for _, r in spikes]}
    f = Finding(
        kind="drift",
        severity="warning",
        title=(f"Mismatch spikes at {'step' if len(spikes) == 1 else 'steps'} "
               f"{', '.join(str(s) for s, _ in spikes)}: mean |delta| "
               f"x{max(r for _, r in spikes):.2f} the other steps' at fixed entropy"),
        message=(
            f"At fixed entropy ({used}), mean |delta| at {at} stands above the median step "
            f"by at least x{SPIKE_MIN_RATIO:g} and {SPIKE_Z:g} robust standard deviations of "
            "the other steps, which do not drift: a short-lived mismatch, not a trend over "
            "training. The per-step metrics (kl, ess) of those steps show it too."
        ),
        evidence=ev,
        check=("what happened at those steps: a weight sync that failed or was half applied, "
               "an engine restart or fallback (another dtype, kernel or quantisation), a "
               "resume from another checkpoint; their tokens weigh in every pooled number."),
    )
    return _found(f, f"spike {at}")


def _check_drift(ctx: _Ctx) -> _Result:
    """:func:`_drift_check` and, when it leaves out steps on which delta is exactly 0 on
    every token (:func:`_identical_steps`: train_logprob copied from infer_logprob there),
    those steps named in its reason and the finding's message, and in the evidence
    (``steps_left_out_identical``)."""
    status, f = _drift_check(ctx)
    left, n_steps = _identical_steps(ctx) if ctx.has("step") and ctx.has("entropy") else ([], 0)
    if not left or len(left) == n_steps:  # (identical throughout: a bitwise on-policy run)
        return status, f
    from entr_diag.caveats import step_ranges

    what = (f"step{'s' if len(left) > 1 else ''} {step_ranges(left)} left out: delta is "
            "exactly 0 on every token there: train_logprob a copy of infer_logprob, not "
            "recomputed?")
    status = dataclasses.replace(status, reason=f"{status.reason} ({what})")
    if f is not None:
        f = dataclasses.replace(
            f, message=f"{f.message} ({what}.)",
            evidence={**f.evidence, "steps_left_out_identical": list(left)})
    return status, f


def _identical_steps(ctx: _Ctx) -> tuple[list[int], int]:
    """(the steps whose tokens all have delta == 0 exactly (sum |delta| of their cells is
    0), the number of steps): the drift trend (:func:`_trend_cells`, ln mean |delta|)
    cannot read those steps."""
    c = ctx.cells
    if not c.height or "_step" not in c.columns:
        return [], 0
    per = c.drop_nulls("_step").group_by("_step").agg(pl.col("n", "sad").sum())
    zero = per.filter((pl.col("n") > 0) & (pl.col("sad") == 0)).sort("_step")
    return [int(x) for x in zero["_step"].to_list()], per.height


def _drift_check(ctx: _Ctx) -> _Result:
    """Mismatch drift over training.

    Signature: at fixed entropy (and fixed staleness), mean |delta| trends up across steps. A
    mismatch that grows while the entropy distribution does not is the slow divergence of
    the engine's weights from the trainer's (weight-sync precision loss, a stale LoRA merge,
    fp8 scales not refreshed), reported by slime and verl users as training that collapses
    after a few hundred steps with ever-growing rollout-vs-train KL. Entropy changes alone
    (a sharpening policy) move mean |delta| through the scaling law, not within a bin.

    Test: :func:`_drift_trend` (log growth of mean |delta| over the run at fixed entropy bin,
    on the freshest tokens, else at fixed staleness), and a Kendall tau across steps of the
    per-step adjusted level. Fires when p < DRIFT_P, the growth over the run is at least
    DRIFT_MIN_GROWTH and the Kendall tau is not negative (the per-step levels rise overall;
    its p-value is evidence only: with few steps a rank test cannot reach small p-values).
    """
    name = "drift"
    if not ctx.has("step"):
        return _cannot(name, "no step column: no series over training")
    if not ctx.has("entropy"):
        return _cannot(
            name, "no entropy column: a drift of |delta| cannot be separated from entropy changes"
        )
    n_steps = ctx.cells["_step"].drop_nulls().n_unique()
    if n_steps < DRIFT_MIN_STEPS:
        return _cannot(name, f"{n_steps} step(s) (need {DRIFT_MIN_STEPS})")
    t, used = _drift_trend(ctx)
    if not t.ok or not math.isfinite(t.beta_step):
        return _cannot(name, t.why or "the step does not vary within entropy bins")
    ust, level = np.array(t.steps), np.array(t.step_level)
    tau, ptau = _kendall(ust, level)
    per_step = ctx.cells.group_by("_step").agg(pl.col("n", "sh").sum()).sort("_step").drop_nulls()
    hs = (per_step["sh"] / per_step["n"]).to_numpy()
    psx = per_step["_step"].to_numpy().astype(float)
    h_trend = float(np.polyfit(psx, hs, 1)[0]) if len(hs) >= 2 else float("nan")
    growth = math.exp(t.beta_step)
    s0, s1 = t.step_span
    ev = {
        "steps": int(len(ust)),
        "step_range": [s0, s1],
        "growth_over_run": _r(growth),
        "log_slope_per_run": _r(t.beta_step),
        "log_slope_se": _r(t.se_step),
        "p_value": _r(t.p_step),
        "kendall_tau_adjusted_level": _r(tau),
        "kendall_p": _r(ptau),
        "adjusted_log_level_per_step": [_r(x, 3) for x in level],
        "cells": t.cells,
        "tokens_selection": used,
        "mean_entropy_first_step": _r(hs[0]) if len(hs) else float("nan"),
        "mean_entropy_last_step": _r(hs[-1]) if len(hs) else float("nan"),
        "mean_entropy_slope_per_step": _r(h_trend),
    }
    p = t.p_step
    jump = _step_jump(ust, level) if t.levels_comparable else None
    if jump is not None:
        ev["jump_between_steps"] = [jump[0], jump[1]]
        ev["jump_growth"] = _r(jump[2])
    if t.beta_step > 0 and p < DRIFT_P and growth >= DRIFT_MIN_GROWTH and not (tau <= 0):
        f = Finding(
            kind=name,
            severity="warning",
            title=(f"Mismatch jumps at step {jump[1]}: mean |delta| x{jump[2]:.2f} at fixed "
                   "entropy" if jump is not None else
                   f"Mismatch drifts up over training: mean |delta| x{growth:.2f} at fixed "
                   "entropy"),
            message=(
                f"At fixed entropy ({used}), mean |delta| grows by a factor {growth:.2f} "
                f"from step {s0} to {s1} ({_pval(p)}; Kendall tau of the per-step "
                f"adjusted level {tau:.2f}, {_pval(ptau)})"
                + (f", most of it at once between step {jump[0]} and {jump[1]} "
                   f"(x{jump[2]:.3g}): a change at that step (engine, weight push, dtype) "
                   "rather than a slow drift" if jump is not None else "")
                + f". Mean entropy went from "
                f"{hs[0]:.3g} to {hs[-1]:.3g} nats, which the binning already accounts for."
            ),
            evidence=ev,
            check=(
                "weight synchronisation to the engine (dtype of the pushed weights, fp8 "
                "scales refreshed, LoRA merged at the current version), engine version / "
                "kernel changes during the run, and whether the trainer's optimizer state "
                "drifts into ranges where bf16 rounding grows."
            ),
        )
        return _found(f, f"growth x{growth:.2f} over the run, {_pval(p)}")
    free: list[tuple[_Trend, str]] = []  # the trend with the lag not held fixed, read once

    def lag_free() -> tuple[_Trend, str]:
        if not free:
            free.append(_drift_trend(ctx, lag_free=True))
        return free[0]

    if not t.levels_comparable:  # a jump where the lag changes, between the lag groups
        onset = _lag_onset_jump(ctx, lag_free())
        if onset is not None:
            return onset
    spikes = _step_spikes(ust, level) if t.levels_comparable else []
    if spikes:
        return _spike_finding(spikes, ev, used)
    if used == "all tokens at fixed staleness":  # (one intercept per bin and lag)
        span = (ctx.cells.drop_nulls(["_stale", "_step"]).group_by("_stale")
                .agg(pl.col("_step").n_unique().alias("k"))["k"].max())
        if span is not None and (int(span) < DRIFT_MIN_STEPS or int(span) < 0.5 * n_steps):
            # each lag covers a few steps: the trend within them says little of the run
            # (a lag rising with the step hides a 5x rise of the mismatch as "x1.02")
            confounded = _confounded_rise(ctx, lag_free(), int(span), n_steps, growth, p)
            if confounded is not None:
                return confounded
            return _cannot(
                name,
                f"the version lag changes with the step (each lag value is in at most "
                f"{int(span)} of the {n_steps} steps): a drift over the run and the lag's "
                f"policy drift cannot be told apart (x{growth:.3g} within lags, {_pval(p)}); "
                "read the per-step and per-staleness strata")
    return _clear(
        name,
        f"mean |delta| at fixed entropy changes by x{growth:.3g} over {len(ust)} steps "
        f"({_pval(p)}, {used}), with no steady rise",
    )


def _kendall(steps: np.ndarray, level: np.ndarray) -> tuple[float, float]:
    """Kendall's tau of the per-step level across steps and its p-value (NaN for fewer
    than 3 steps)."""
    if len(steps) < 3:
        return float("nan"), float("nan")
    from scipy import stats

    kt = stats.kendalltau(steps, level)
    return float(kt[0]), float(kt[1])


def _confounded_rise(ctx: _Ctx, lag_free: tuple[_Trend, str], span: int, n_steps: int,
                     within: float, p_within: float) -> _Result | None:
    """The drift check when the version lag changes with the step (each lag value in a few
    steps: held fixed, the trend within lags says little of the run): mean |delta| read
    on all tokens with the lag not held fixed. A rise over the run (p < DRIFT_P, at least
    DRIFT_MIN_GROWTH, Kendall tau of the per-step level not negative) is a warning: the
    pooled law averages a mismatch that changes over the run, whether it is the engine's
    drift or the policy drift of the growing lag (the data cannot tell them apart). None
    otherwise (the check then cannot tell). ``lag_free``: :func:`_drift_trend` with
    ``lag_free``."""
    t, used = lag_free
    if not t.ok or not math.isfinite(t.beta_step) or not t.p_step < DRIFT_P:
        return None
    growth = math.exp(t.beta_step)
    ust, level = np.array(t.steps), np.array(t.step_level)
    tau = _kendall(ust, level)[0]
    if not (t.beta_step > 0 and growth >= DRIFT_MIN_GROWTH and not tau <= 0):
        return None
    lags = (ctx.cells.drop_nulls(["_step", "_stale"]).filter(pl.col("n") > 0)
            .group_by("_step").agg(pl.col("_stale").mean()).sort("_step"))
    lag_first, lag_last = float(lags["_stale"][0]), float(lags["_stale"][-1])
    s0, s1 = t.step_span
    ev = {"steps": int(len(ust)), "step_range": [s0, s1], "growth_over_run": _r(growth),
          "p_value": _r(t.p_step), "kendall_tau_adjusted_level": _r(tau),
          "growth_within_lags": _r(within), "p_value_within_lags": _r(p_within),
          "steps_per_lag_value_max": span, "mean_lag_first_step": _r(lag_first),
          "mean_lag_last_step": _r(lag_last),
          "adjusted_log_level_per_step": [_r(x, 3) for x in level],
          "tokens_selection": used}
    f = Finding(
        kind="drift",
        severity="warning",
        title=(f"Mismatch rises over training with the version lag: mean |delta| "
               f"x{growth:.2f} at fixed entropy"),
        message=(
            f"At fixed entropy ({used}), mean |delta| grows by a factor {growth:.2f} from "
            f"step {s0} to {s1} ({_pval(t.p_step)}), while the version lag changes with the "
            f"step (mean lag {lag_first:.3g} at the first step, {lag_last:.3g} at the last; "
            f"each lag value is in at most {span} of the {n_steps} steps). A drift of the "
            "engine over the run and the policy drift of a growing lag read alike here: "
            f"held at fixed lag, mean |delta| changes by x{within:.3g} ({_pval(p_within)}), "
            "over too few steps per lag to tell. Either way the pooled law averages a "
            "mismatch that changes over the run."
        ),
        evidence=ev,
        check=("the per-step and per-staleness strata; whether the lag grows because the "
               "rollout queue backs up (then the policy drift is expected) or the weights "
               "pushed to the engine drift (dtype, fp8 scales, LoRA merge); a run mixing "
               "lags within steps separates the two."),
    )
    return _found(f, f"growth x{growth:.2f} over the run with the lag (x{within:.3g} within "
                     "lags): drift and policy drift cannot be told apart")


def _lag_onset_jump(ctx: _Ctx, lag_free: tuple[_Trend, str]) -> _Result | None:
    """The drift check when it held each staleness value apart (one intercept per (bin,
    staleness)) and found nothing: a jump of mean |delta| between two steps whose version
    lags differ entirely (e.g. lag 0 before step 5, lags 1 and 2 from it on) falls between
    those groups and is unseen. Read on all tokens with the lag not held fixed, such a jump
    (DRIFT_JUMP_SHARE of the rise, at least DRIFT_MIN_GROWTH, the trend at p < DRIFT_P) is
    an info finding: an engine change at that step and the policy drift of the new lag read
    alike, and no step holds both lags to tell them apart. None otherwise. ``lag_free``:
    :func:`_drift_trend` with ``lag_free``."""
    t, used = lag_free
    if not t.ok or not math.isfinite(t.beta_step) or not t.p_step < DRIFT_P:
        return None
    jump = _step_jump(np.array(t.steps), np.array(t.step_level))
    if jump is None:
        return None
    lags = (ctx.cells.drop_nulls(["_step", "_stale"]).filter(pl.col("n") > 0)
            .group_by("_step").agg(pl.col("_stale").unique().sort()))
    by_step = {int(r[0]): [int(v) for v in r[1]] for r in lags.iter_rows()}
    before, after = by_step.get(jump[0], []), by_step.get(jump[1], [])
    if not before or not after or set(before) & set(after):
        return None
    ev = {"jump_between_steps": [jump[0], jump[1]], "jump_growth": _r(jump[2]),
          "lags_before": before, "lags_after": after, "p_value": _r(t.p_step),
          "tokens_selection": used}
    f = Finding(
        kind="drift",
        severity="info",
        title=f"Mismatch jumps at step {jump[1]}, where the version lag changes",
        message=(
            f"At fixed entropy, mean |delta| jumps by a factor {jump[2]:.3g} between step "
            f"{jump[0]} (lag {', '.join(map(str, before))}) and step {jump[1]} (lag "
            f"{', '.join(map(str, after))}) ({_pval(t.p_step)} for the trend over the run, "
            "the lag not held fixed). No step holds both lags, so a change of the engine at "
            f"step {jump[1]} and the policy drift of the new lag read alike: the data cannot "
            "tell them apart (held apart by lag, the mismatch does not drift)."
        ),
        evidence=ev,
        check=(f"what changed at step {jump[1]} besides the lag (engine or weight-push "
               "settings, dtype, a resume); with one lag per step only a run mixing lags "
               "within steps separates staleness from the engine."),
    )
    return _found(f, f"jump x{jump[2]:.3g} at step {jump[1]}, where the lag changes "
                     f"({', '.join(map(str, before))} -> {', '.join(map(str, after))})")


def _check_staleness(ctx: _Ctx) -> _Result:
    """Staleness confound.

    Signature: at fixed entropy (and step), mean |delta| grows with staleness = train_version -
    policy_version. Then part of the measured "mismatch" is genuine policy change between the
    sampling weights and the trained ones (off-policyness), not engine numerics; both are
    mixed in delta (METHOD.md, "The setting"). Asynchronous trainers (AReaL, PipelineRL,
    slime async, verl one-step-off) all show it; it is expected of an off-policy run, not a
    bug, so it is reported as info: read the law per staleness bucket or on fresh tokens;
    unless policy drift carries STALENESS_WARN_SHARE of the law bins' sum delta^2 (a lag
    whose mean |delta| is r times the freshest's at equal bin and step counts 1 - 1/r^2 of
    its delta^2 as drift): then the pooled law describes the drift, a warning (with a
    caveat beside the verdict) pointing at the freshest stratum's law.

    Test: the staleness coefficient of :func:`_joint_trend` (log growth per version of lag,
    at fixed entropy bin and step: one intercept per (bin, step), so only lags that share a
    step are compared) gives the p-value; the evidence also gives, per staleness value, the
    ratio of mean |delta| to the freshest value's it shares steps with, at equal entropy bin
    and step (one fixed-effects fit with a dummy per staleness value, :func:`_stale_effects`:
    the growth is rarely log-linear, policy drift dominates from the first version of lag
    on). A value that never shares a step with the others is listed apart
    (``staleness_values_not_compared``).
    """
    name = "staleness"
    if not ctx.has("staleness"):
        return _cannot(
            name,
            f"{S.missing_versions(ctx.has)}: staleness cannot be separated from engine mismatch",
        )
    vals = ctx.cells["_stale"].drop_nulls().unique().sort()
    if vals.len() < 2:
        v = vals.to_list()
        return _clear(
            name, f"every token has staleness {v[0] if v else '?'}: no version lag to confound"
        )
    # most tokens with a policy newer than the one trained on them: the version columns
    # are swapped (the loader warns), and a lag read backwards would pass for no growth
    by_sign = ctx.cells.filter(pl.col("_stale").is_not_null()).select(
        pl.col("n").filter(pl.col("_stale") < 0).sum().alias("neg"), pl.col("n").sum())
    neg, tot = int(by_sign["neg"][0] or 0), int(by_sign["n"][0] or 0)
    if tot and neg > tot / 2:
        return _cannot(
            name,
            f"{neg / tot:.0%} of the tokens have policy_version > train_version (negative "
            "staleness): the two version columns look swapped, so the lag would be read "
            "backwards; swap them (--column policy_version=... / train_version=...)")
    t = _joint_trend(ctx)
    if not t.ok or not math.isfinite(t.beta_stale):
        return _cannot(name, t.why or "staleness does not vary within entropy bins")
    smin, smax = int(vals.min()), int(vals.max())
    unit = _lag_unit(vals)
    per_v = math.exp(t.beta_stale * unit)
    total = math.exp(t.beta_stale * (smax - smin))
    per_txt = "per version of lag" if unit == 1 else f"per {unit:,} versions of lag"
    by_s = (_law_cells(ctx).group_by("_stale").agg(pl.col("n", "sad", "sd2").sum())
            .sort("_stale").drop_nulls())
    p = t.p_stale
    ev = {
        "staleness_values": [int(v) for v in by_s["_stale"].to_list()],
        "tokens_per_staleness": [int(v) for v in by_s["n"].to_list()],
        "mean_abs_delta_per_staleness": [
            _r(a / n) for a, n in zip(by_s["sad"].to_list(), by_s["n"].to_list(), strict=True)
        ],
        "growth_per_version": _r(per_v),
        "versions_per_lag_unit": unit,
        # (the log-linear model's; the measured ratio replaces it below when known)
        "growth_lag_min_to_max": _r(total),
        "growth_lag_min_to_max_loglinear": _r(total),
        "log_slope": _r(t.beta_stale),
        "log_slope_se": _r(t.se_stale),
        "p_value": _r(p),
        "within_entropy_bins": bool(ctx.has("entropy")),
        #: the bins read: those above the fitted law's H* (None: every bin)
        "above_h_star": (None if ctx.law_h_star is None else _r(ctx.law_h_star)),
    }
    ratios = _staleness_ratios(ctx)
    ev["ratio_to_freshest_per_staleness"] = [_r(x, 3) for x in ratios.values()]
    ev["ratio_staleness_values"] = list(ratios)
    ref = min(ratios) if ratios else smin
    # the headline: the measured ratio at the largest lag (the log-linear model's growth
    # per version misstates a growth that is not geometric: x2.4 per version, x13.8 at lag
    # 3, where the measured ratios were x4.35, x6.74, x9.11)
    far = max(ratios) if ratios else None
    measured = (ratios[far] if far is not None and far != ref and math.isfinite(ratios[far])
                and ratios[far] > 0 else None)
    # the same lags pooled over entropy and steps: stale tokens sit at later steps (the
    # first ones cannot be stale) and other entropies, which the ratios hold fixed
    mad = {int(v): a / n for v, a, n in zip(by_s["_stale"].to_list(), by_s["sad"].to_list(),
                                            by_s["n"].to_list(), strict=True) if n}
    pooled = (mad[far] / mad[ref] if far is not None and far in mad and ref in mad
              and mad[ref] > 0 else None)
    ev["pooled_ratio_lag_min_to_max"] = None if pooled is None else _r(pooled)
    if measured is not None:
        ev["growth_lag_min_to_max"] = _r(measured)
        growth_txt = f"x{measured:.3g} at lag {far} against lag {ref}"
    else:
        growth_txt = f"x{per_v:.3g} {per_txt}"
    # the values never compared with the others within a step (e.g. lag 0 only in a
    # synchronous warm-up): left out of the ratios
    apart = [int(v) for v in vals.to_list() if ratios and int(v) not in ratios]
    if apart:
        ev["staleness_values_not_compared"] = apart
    # the share of sum delta^2 that is policy drift: a lag whose |delta| is r times the
    # freshest's at equal entropy and step holds (1 - 1/r^2) of its delta^2 as drift
    sd2 = dict(zip(by_s["_stale"].to_list(), by_s["sd2"].to_list(), strict=True))
    total_d2 = float(sum(sd2.values()))
    drift = sum(float(sd2.get(v, 0.0)) * max(0.0, 1.0 - 1.0 / (r * r))
                for v, r in ratios.items() if r > 0)
    drift_share = drift / total_d2 if total_d2 > 0 else 0.0
    stale_share = (sum(float(x) for v, x in sd2.items() if v != ref) / total_d2
                   if total_d2 > 0 else 0.0)
    ev["delta2_share_stale_tokens"] = _r(stale_share)
    ev["delta2_share_policy_drift"] = _r(drift_share)
    if t.beta_stale > 0 and p < STALENESS_P and per_v >= STALENESS_MIN_GROWTH:
        dominant = drift_share >= STALENESS_WARN_SHARE
        rtxt = ", ".join(f"x{v:.3g} at lag {k}" for k, v in ratios.items() if k != ref)
        f = Finding(
            kind=name,
            severity="warning" if dominant else "info",
            title=(("Policy drift carries most of delta: " if dominant else "")
                   + f"|delta| grows with staleness ({growth_txt})"),
            message=(
                "At fixed entropy and step"
                + (f" (above the law's H* = {ctx.law_h_star:.3g} nats: the noise regime "
                   "below it is no policy drift)" if ctx.law_h_star is not None else "")
                + ", mean |delta| grows with the version lag "
                + (f"({_pval(p)}): {rtxt} relative to lag {ref}" if rtxt
                   else f"({_pval(p)})")
                + f" (x{per_v:.3g} {per_txt} in a log-linear fit"
                + ("" if measured is None or not total > 0
                   or abs(math.log(measured / total)) <= math.log(1.25)
                   else ", which misstates this growth: it is not geometric") + ")"
                + (f" (lag {', '.join(map(str, apart))} never shares a step with the others: "
                   "not compared)" if apart else "")
                + (f". Pooled over entropies and steps, mean |delta| reads x{pooled:.3g} at "
                   f"lag {far} against lag {ref}: the ratios above hold the entropy bin and "
                   "the step fixed and average over the bins (policy drift moves |delta| "
                   "more at some entropies than at others), the pooled one holds neither, so "
                   "the two can differ by far and neither alone is the drift at a given "
                   "entropy"
                   if pooled is not None and measured is not None and measured > 0
                   and abs(math.log(pooled / measured)) > math.log(2) else "")
                + ". Part of "
                "delta is policy change between sampling and training, not engine mismatch: "
                "read the law and the gates per staleness bucket, or on the freshest tokens."
                + (f" Here policy drift carries about {_share(drift_share)} of sum delta^2 "
                   f"(the tokens with a lag other than {ref} hold {_share(stale_share)} of "
                   "it): the pooled law describes the drift more than the engine mismatch; "
                   f"the engine's is the law of the staleness-{ref} stratum." if dominant
                   else "")
            ),
            evidence=ev,
            check=(
                "the off-policy lag (max staleness / async depth) of the rollout buffer, and "
                "whether the importance correction is meant to cover policy drift as well as "
                "engine mismatch."
            ),
        )
        return _found(f, f"{growth_txt}, {_pval(p)}")
    return _clear(name, f"mean |delta| changes by x{per_v:.3g} {per_txt} at fixed "
                        f"entropy and step ({_pval(p)})"
                  + (f"; lag {', '.join(map(str, apart))} never shares a step with the others"
                     if apart else ""))


def _freshest_rows(rows: pl.DataFrame, ctx: _Ctx) -> tuple[pl.DataFrame, str]:
    """The ``rows`` (forensic cells: ``_stale``, ``n``) of the freshest staleness value
    (:func:`_freshest`) when the input has staleness and they hold FRESH_MIN_TOKENS tokens,
    with what was read (``"staleness 0 tokens"``); else all of them (``"all tokens"``)."""
    if ctx.has("staleness"):
        s_min = _freshest(rows["_stale"])
        if s_min is not None:
            fresh = rows.filter(pl.col("_stale") == s_min)
            if int(fresh["n"].sum()) >= FRESH_MIN_TOKENS:
                return fresh, f"staleness {int(s_min)} tokens"
    return rows, "all tokens"


def _freshest(stale: pl.Series) -> int | None:
    """The freshest staleness value: the smallest non-negative one (a negative staleness, a
    policy newer than the one trained on it, is swapped version columns, not fresher
    tokens: the loader warns of them), else the smallest; None when all are null."""
    v = stale.drop_nulls()
    if not v.len():
        return None
    ok = v.filter(v >= 0)
    return int((ok if ok.len() else v).min())


def _lag_unit(stale: pl.Series) -> int:
    """The unit of lag of the staleness values: their greatest common difference (versions
    counted in steps of 1000, a version per sample or per token, make a lag of one
    "version" 1000 apart); growth per version of lag is read per unit; 1 when unknown."""
    return staleness_step(stale.drop_nulls().unique().to_numpy().astype(np.int64))


def _staleness_ratios(ctx: _Ctx) -> dict[int, float]:
    """Mean |delta| per staleness value relative to the freshest value it can be compared
    with, at equal entropy bin and step (:func:`_stale_effects` on the law cells); {} when
    no two values share a step."""
    with_step = _steps_known(ctx)
    eff, _ = _stale_effects(_trend_cells(_law_cells(ctx), with_step), with_step)
    return {v: math.exp(b) for v, b in sorted(eff.items())}


def _raw_masks() -> tuple[pl.Expr, pl.Expr, pl.Expr]:
    """(masked, non-finite, placeholder) row conditions of the raw frame, from ``reason``."""
    reason = pl.col("reason")
    masked = ~reason.is_in(list(_NOT_MASKED)).fill_null(False)
    nf = (reason == "non_finite_logprob").fill_null(False)
    ph = reason.is_in(list(PLACEHOLDER_REASONS)).fill_null(False)
    return masked, nf, ph


def _paths(ds: Any) -> list[str]:
    """The input files of a loaded dataset, by FILE_INDEX ([] without them)."""
    return [str(f.path) for f in getattr(ds, "files", ())]


def _files_evidence(ev: dict[str, Any], by_index: Sequence[tuple[Any, int]],
                    files: Sequence[str]) -> str:
    """With several input ``files``: put ``files`` (path -> count, from ``by_index``,
    (FILE_INDEX, count) pairs) and ``input_files`` into the evidence ``ev`` and return
    where they are as a phrase (:func:`entr_diag.caveats.files_listed`); '' otherwise."""
    if len(files) < 2:
        return ""
    from entr_diag.caveats import files_listed

    ev["files"] = {files[int(i)]: int(n) for i, n in sorted(by_index, key=lambda x: x[0])
                   if i is not None and 0 <= int(i) < len(files)}
    ev["input_files"] = len(files)
    return files_listed(ev["files"], len(files)) if ev["files"] else ""


def _bad_rows_acc(with_file: bool = False) -> GroupAgg:
    """Raw-frame accumulator: one row per sequence with bad masked rows (non-finite or
    placeholder logprobs): counts, first non-finite position, and the positions of its
    placeholder rows (merged by concatenation; runs are found after the pass, so a run
    split across batches counts); with ``with_file``, its input file (FILE_INDEX, the
    lowest). Few rows (the corrupt-rows check and the engine zero share both read it)."""
    masked, nf, ph = _raw_masks()
    reason = pl.col("reason")
    il, tl = pl.col("infer_logprob"), pl.col("train_logprob")
    il_nf = (il.is_null() | ~il.is_finite().fill_null(False)) & nf
    tl_nf = (tl.is_null() | ~tl.is_finite().fill_null(False)) & nf
    ph_zero = ph & (reason == "zero_placeholder") & (il == 0.0).fill_null(False)
    # (both sides 0.0: zero-filled rows, or one-token nuclei of truncation on both sides)
    ph_both = ph_zero & (tl == 0.0).fill_null(False)
    pos = pl.col("position")
    file = [pl.col(FILE_INDEX).min().alias("file")] if with_file else []
    return GroupAgg(
        columns=["seq_key", "seq_id", "position", "infer_logprob", "train_logprob", "reason",
                 *([FILE_INDEX] if with_file else [])],
        keys=["seq_key"],
        aggs=[
            *file,
            pl.col("seq_id").first(),
            nf.sum().cast(pl.Int64).alias("n_nf"),
            il_nf.sum().cast(pl.Int64).alias("n_nf_infer"),
            tl_nf.sum().cast(pl.Int64).alias("n_nf_train"),
            pl.when(nf).then(pos).min().alias("first_nf"),
            ph.sum().cast(pl.Int64).alias("n_ph"),
            ph_zero.sum().cast(pl.Int64).alias("n_ph_zero"),
            ph_both.sum().cast(pl.Int64).alias("n_ph_both"),
            pos.filter(ph).alias("ph_pos"),
            pos.filter(nf).alias("nf_pos"),
        ],
        merge=[
            *([pl.col("file").min()] if with_file else []),
            pl.col("seq_id").first(),
            pl.col("n_nf", "n_nf_infer", "n_nf_train").sum(),
            pl.col("first_nf").min(),
            pl.col("n_ph", "n_ph_zero", "n_ph_both").sum(),
            pl.col("ph_pos").list.explode(keep_nulls=False, empty_as_null=False),
            pl.col("nf_pos").list.explode(keep_nulls=False, empty_as_null=False),
        ],
        prepare=lambda lf: lf.filter(masked & (nf | ph)),
    )


def _bad_rows_table(acc: GroupAgg, empty: pl.DataFrame) -> pl.DataFrame:
    """The merged bad-rows table with, per kind (``ph`` placeholder, ``nf`` non-finite),
    ``{k}_run`` (a run of CORRUPT_MIN_RUN or more consecutive such positions), ``{k}_runs``
    (how many such runs) and ``{k}_run_tok`` (the positions in them)."""
    e = pl.element()
    first = ((e - e.shift(1)) != 1).fill_null(True)  # a run's first position
    last = ((e.shift(-1) - e) != 1).fill_null(True)
    length = e.filter(last) - e.filter(first) + 1  # of each maximal run
    long = {k: pl.col(f"{k}_pos").list.unique().list.sort()
            .list.eval(length.filter(length >= CORRUPT_MIN_RUN)) for k in ("ph", "nf")}
    return _merged(acc, empty).with_columns(
        [c.alias(f"_{k}_long") for k, c in long.items()]
    ).with_columns(
        *(pl.col(f"_{k}_long").list.len().cast(pl.Int64).alias(f"{k}_runs") for k in long),
        *(pl.col(f"_{k}_long").list.sum().cast(pl.Int64).alias(f"{k}_run_tok") for k in long),
        *((pl.col(f"_{k}_long").list.len() > 0).alias(f"{k}_run") for k in long),
    ).drop("ph_pos", "nf_pos", "_ph_long", "_nf_long")


def _last_ok_acc(excluded_only: bool) -> GroupAgg:
    """Raw-frame accumulator: the last position of a finite masked row, per sequence (a
    merged max). ``excluded_only``: only the excluded finite masked rows (placeholders and
    other exclusions: few), the valid tokens' last position coming from the token pass."""
    masked, nf, _ = _raw_masks()
    rows = masked & ~nf
    if excluded_only:
        rows = rows & pl.col("reason").is_not_null()
    return GroupAgg(
        columns=["seq_key", "position", "reason"],
        keys=["seq_key"],
        aggs=[pl.col("position").max().alias("last_ok")],
        merge=[pl.col("last_ok").max()],
        prepare=lambda lf: lf.filter(rows),
    )


class _ZeroCounts:
    """Raw-frame accumulator (no accounting): loss-masked rows and those with an engine
    logprob of exactly 0.0 excluded as zero placeholders."""

    columns = ("reason", "infer_logprob")

    def __init__(self) -> None:
        self.z = 0
        self.m = 0

    def update(self, batch: pl.DataFrame) -> None:
        masked, _, _ = _raw_masks()
        reason = pl.col("reason")
        z = ((reason == "zero_placeholder") & (pl.col("infer_logprob") == 0.0)).fill_null(False)
        r = batch.select(z.sum().alias("z"), masked.sum().alias("m")).row(0)
        self.z += int(r[0] or 0)
        self.m += int(r[1] or 0)


class _ImplausibleTokens:
    """Token-pass accumulator of the implausible-logprobs check: the valid tokens with a
    logprob at or below :data:`IMPLAUSIBLE_LOGPROB` on either side. A batch without one costs a
    minimum per side; the flagged tokens (few) are reduced per sequence (seq_id, count per
    side, sum delta^2, first position) and per entropy bin (n, sum H, sum delta^2), with the
    range of the flagged values per side (a single value: a placeholder)."""

    columns = ("seq_key", "seq_id", "position", "entropy", "train_logprob", "infer_logprob",
               "delta", "staleness", FILE_INDEX)  # (those the frame has)
    #: seq_id may come as read (an integer): kept as String (passes.NATIVE_SEQ_ID)
    native_seq_id = True

    def __init__(self) -> None:
        t = IMPLAUSIBLE_LOGPROB
        self._sides = {"infer": pl.col("infer_logprob") <= t, "train": pl.col("train_logprob") <= t}
        #: the lowest value per side over all valid tokens, the highest flagged one
        self.lowest = {"infer": math.inf, "train": math.inf}
        self.highest_flagged = {"infer": -math.inf, "train": -math.inf}
        d = pl.col("delta")
        self._aggs = [
            pl.col("seq_id").first().cast(pl.String),
            pl.len().cast(pl.Int64).alias("n"),
            *[c.sum().cast(pl.Int64).alias(f"n_{side}") for side, c in self._sides.items()],
            (d * d).sum().alias("sd2"),
            pl.col("position").min().alias("first_pos"),
        ]
        self.seqs = PartialRows(["seq_key"], [
            pl.col("seq_id").first(), *_sums(("n", "n_infer", "n_train", "sd2")),
            pl.col("first_pos").min()])
        #: per entropy bin: n, sum H, sum delta^2 of the flagged tokens
        self.bins = np.zeros((3, N_BINS))
        #: flagged tokens per input file (its index in Dataset.files)
        self.files: dict[int, int] = {}
        #: per (seq_key, bin, _stale) of the forensic tables: n, sum H, sum |delta|, sum
        #: delta^2 of the flagged tokens (the sequence-outlier scores leave them out)
        self.slots = PartialRows(["seq_key", "bin", "_stale"], [
            pl.col("n", "sh", "sad", "sd2").sum()])

    def update(self, batch: pl.DataFrame) -> None:
        if not batch.height:
            return
        lows = {side: float(column(batch, f"{side}_logprob").min()) for side in self.lowest}
        for side, lo in lows.items():
            self.lowest[side] = min(self.lowest[side], lo)
        if all(lo > IMPLAUSIBLE_LOGPROB for lo in lows.values()):
            return
        f = batch.filter(self._sides["infer"] | self._sides["train"])
        if not f.height:  # (a NaN minimum)
            return
        for side, c in self._sides.items():
            hi = f.select(pl.col(f"{side}_logprob").filter(c).max()).item()
            if hi is not None:
                self.highest_flagged[side] = max(self.highest_flagged[side], float(hi))
        self.seqs.add(f.group_by("seq_key").agg(self._aggs))
        if FILE_INDEX in f.columns:
            add_counts(self.files, f[FILE_INDEX].to_numpy())
        d, h = pl.col("delta").cast(pl.Float64), pl.col("entropy").cast(pl.Float64)
        has_h = "entropy" in f.columns
        self.slots.add(f.group_by(
            "seq_key", (_bin_expr() if has_h else pl.lit(0, dtype=pl.Int32)).alias("bin"),
            (pl.col("staleness").cast(pl.Int64) if "staleness" in f.columns
             else pl.lit(0, dtype=pl.Int64)).alias("_stale")).agg(
            pl.len().cast(pl.Int64).alias("n"), (h.sum() if has_h else pl.lit(0.0)).alias("sh"),
            d.abs().sum().alias("sad"), (d * d).sum().alias("sd2")))
        # (the filtered rows' arrays directly: column() caches the batch being processed)
        d2 = f["delta"].cast(pl.Float64).to_numpy() ** 2
        if "entropy" in f.columns:
            b = f.select(_bin_expr()).to_series().to_numpy()
            for i, w in enumerate((None, f["entropy"].cast(pl.Float64).to_numpy(), d2)):
                self.bins[i] += np.bincount(b, weights=w, minlength=N_BINS)


class _UnsampledTokens:
    """Token-pass accumulator of the unsampled-tokens check: the valid tokens whose entropy
    is below :data:`UNSAMPLED_H_MAX` and whose sampled-token probability
    ``exp(infer_logprob)`` is below :data:`UNSAMPLED_P` (above IMPLAUSIBLE_LOGPROB: those
    placeholders are the implausible-logprobs check's). A batch costs one mask over its
    entropy and engine logprob; the flagged tokens (few on a consistent run; 10% of the
    tokens of a synthetic run: their columns gathered, never the seq_id strings) are reduced
    per forensic entropy bin (n, sum delta^2), per seq_key (the lowest bin: one row per
    flagged sequence, not per (sequence, bin), whose merging had taken 300 MB more at 50M
    tokens), per (file, bin) and per (step, bin), and kept as rows (seq_key, position,
    bin) for the localisation: every one while at most :data:`UNSAMPLED_MAX_ROWS`, else
    those of the sequences whose seq_key is a multiple of the smallest power of two that
    keeps at most that many (whatever the row order; seq_key 0 alone holding more: its
    first ones)."""

    columns = ("seq_key", "position", "entropy", "infer_logprob", "delta", "step",
               FILE_INDEX)  # (those the frame has)

    def __init__(self) -> None:
        #: per flagged sequence, the lowest bin of its flagged tokens (a sequence is
        #: flagged in the range up to bin j when that is j or lower)
        self.seqs = PartialRows(["seq_key"], [pl.col("bin").min()])
        #: per forensic entropy bin: n and sum delta^2 of the flagged tokens
        self.bins = np.zeros((2, N_BINS))
        #: flagged tokens per (input file index, bin) and per (step, bin)
        self.files: dict[tuple[int, int], int] = {}
        self.steps: dict[tuple[int, int], int] = {}
        self._kept = _KeptSequences(UNSAMPLED_MAX_ROWS)
        #: the forensic entropy bin of every token, computed by the engine
        self.exprs = [_bin_expr().fill_null(-1).alias(_FX + "ubin")]

    def update(self, batch: pl.DataFrame) -> None:
        if batch.height < 1 or "entropy" not in batch.columns:
            return
        h, y = column(batch, "entropy"), column(batch, "infer_logprob")
        with np.errstate(invalid="ignore"):
            flag = ((h < UNSAMPLED_H_MAX) & (y < math.log(UNSAMPLED_P))
                    & (y > IMPLAUSIBLE_LOGPROB))
        idx = np.flatnonzero(flag)
        if not idx.size:
            return
        # numpy only: a polars group-by here waits for the thread pool the engine reads
        # the next chunk with (2.6 s of a 5M-token synthetic run's fit, 10% of its tokens
        # flagged). The bin is the engine's (_bin_expr, exprs); a flagged token's entropy
        # is finite, so it has one.
        b = column(batch, _FX + "ubin")[idx].astype(np.int64)
        d = column(batch, "delta")[idx].astype(np.float64)
        self.bins[0] += np.bincount(b, minlength=N_BINS)
        self.bins[1] += np.bincount(b, weights=d * d, minlength=N_BINS)
        sk = column(batch, "seq_key")[idx]
        order = np.lexsort((b, sk))  # by seq_key, then bin: each key's first is its lowest
        sk_o = sk[order]
        first = np.ones(sk_o.size, dtype=bool)
        first[1:] = sk_o[1:] != sk_o[:-1]
        self.seqs.add({"seq_key": sk_o[first], "bin": b[order][first].astype(np.int32)})
        for name, store in ((FILE_INDEX, self.files), ("step", self.steps)):
            if name not in batch.columns:
                continue
            k = column(batch, name)[idx]
            if k.dtype.kind == "f":  # (a column with nulls reads as floats with NaN)
                if np.isnan(k).any():
                    continue
            codes, counts = np.unique(k.astype(np.int64) * N_BINS + b, return_counts=True)
            for code, n in zip(codes.tolist(), counts.tolist(), strict=True):
                kb = divmod(code, N_BINS)
                store[kb] = store.get(kb, 0) + n
        keep = self._kept.keep(sk)
        pick = idx if keep is None else idx[keep]
        if pick.size:
            self._kept.add(pl.DataFrame({
                "seq_key": sk if keep is None else sk[keep],
                "position": column(batch, "position")[pick],
                "bin": (b if keep is None else b[keep]).astype(np.int32)},
                schema_overrides={"position": pl.Int64}))

    @property
    def stride(self) -> int:
        """The rows kept are those of sequences whose seq_key is a multiple of this."""
        return self._kept.stride

    def rows(self) -> pl.DataFrame:
        """The kept flagged rows: seq_key, position, bin."""
        return self._kept.frame({"seq_key": pl.Int64, "position": pl.Int64, "bin": pl.Int32})


class _KeptSequences:
    """Rows kept whole per sequence, order-independently, within ``max_rows``: every row
    while at most that many, else those of the sequences whose seq_key is a multiple of
    the smallest power of two (``stride``) that keeps at most that many, whatever the row
    order (seq_key 0 alone holding more: its first ones)."""

    def __init__(self, max_rows: int) -> None:
        self.max_rows = max_rows
        self.stride = 1
        self._rows: list[pl.DataFrame] = []
        self._n_rows = 0

    def keep(self, keys: np.ndarray) -> np.ndarray | None:
        """The indices of ``keys`` (seq_keys, integers) the stride keeps; None: all."""
        if self.stride == 1:
            return None
        return np.flatnonzero((keys & keys.dtype.type(self.stride - 1)) == 0)

    def add(self, rows: pl.DataFrame) -> None:
        """Rows with a seq_key column (those the stride drops are dropped here)."""
        if self.stride > 1:
            rows = rows.filter(pl.col("seq_key") % self.stride == 0)
        self._rows.append(rows)
        self._n_rows += rows.height
        while self._n_rows > self.max_rows and self.stride < 2**40:
            self.stride *= 2
            self._rows = [pl.concat(self._rows).filter(pl.col("seq_key") % self.stride == 0)]
            self._n_rows = self._rows[0].height
        if self._n_rows > self.max_rows:  # (one sequence holds them all: seq_key 0)
            self._rows = [pl.concat(self._rows).head(self.max_rows)]
            self._n_rows = self.max_rows

    def frame(self, schema: Mapping[str, Any]) -> pl.DataFrame:
        """The kept rows (empty with ``schema`` when none)."""
        return pl.concat(self._rows) if self._rows else pl.DataFrame(schema=schema)


class _MaskStartTokens:
    """Token-pass accumulator of the mask-start surprisal check: per valid token of whole
    sequences (:class:`_KeptSequences`, at most :data:`MASK_START_MAX_ROWS`), seq_key,
    position, entropy (float32) and the surprisal's excess over the entropy,
    ``e = -infer_logprob - entropy`` (nats, float32; logprobs at or below
    IMPLAUSIBLE_LOGPROB are the implausible-logprobs check's, left out). A batch costs a
    mask over its seq_keys (once the stride is above 1) and a few numpy gathers."""

    columns = ("seq_key", "position", "entropy", "infer_logprob")
    _SCHEMA = {"seq_key": pl.UInt64, "position": pl.Int64, "entropy": pl.Float32,
               "e": pl.Float32}

    def __init__(self) -> None:
        self._kept = _KeptSequences(MASK_START_MAX_ROWS)

    @property
    def stride(self) -> int:
        return self._kept.stride

    def update(self, batch: pl.DataFrame) -> None:
        if batch.height < 1 or "entropy" not in batch.columns:
            return
        key = column(batch, "seq_key")
        y, h = column(batch, "infer_logprob"), column(batch, "entropy")
        with np.errstate(invalid="ignore"):
            ok = y > IMPLAUSIBLE_LOGPROB
        idx = self._kept.keep(key)
        if idx is not None:
            idx = idx[ok[idx]]
        else:
            idx = None if ok.all() else np.flatnonzero(ok)
        if idx is not None and not idx.size:
            return
        pick = (lambda a: a) if idx is None else (lambda a: a[idx])
        h_k = pick(h)
        self._kept.add(pl.DataFrame({
            "seq_key": pick(key), "position": pick(column(batch, "position")),
            "entropy": h_k.astype(np.float32), "e": (-pick(y) - h_k).astype(np.float32)},
            schema_overrides={"position": pl.Int64}))

    def rows(self) -> pl.DataFrame:
        """The kept rows: seq_key, position, entropy, e."""
        return self._kept.frame(self._SCHEMA)


def _check_corrupt(ctx: _Ctx) -> _Result:
    """Corrupt rows reported per sequence.

    Signature: within the loss mask of one sequence, (a) every token from some position on has
    a non-finite logprob (a suffix: the engine stopped returning logprobs, an array was cut at
    max_tokens, or a shorter array was padded with NaN), (b) a run of at least
    CORRUPT_MIN_RUN consecutive placeholder values (exact 0.0, +1.0, -9999 floors) inside the
    mask (padding written where the mask says "train on this"), or (c) a run of at least
    CORRUPT_MIN_RUN consecutive non-finite values inside the sequence, not at its end (a
    burst: -inf from a kernel or an overflow). These are bugs of the dump or
    of the mask, not random bad tokens; the loader excludes the rows either way, this check
    says which sequences. Scattered single bad tokens (no suffix, no run) are counted only.

    Runs (c) that scattered bad tokens produce by chance are no burst: with a share q of
    the loss-masked tokens (outside suffixes) non-finite at random, about
    ``M (1 - q) q^CORRUPT_MIN_RUN`` runs start among M tokens (a good token, then
    CORRUPT_MIN_RUN bad ones); when at least as many runs as observed are that likely and
    they hold no more tokens than chance puts in them (:func:`_runs_by_chance`; the same
    for placeholder runs), the bad tokens are reported as scattered: a
    warning when they are at least :data:`CORRUPT_SCATTERED_SHARE` of the masked tokens
    (e.g. 30% NaN at random: a broken column or kernel, not a cut span).
    """
    name = "corrupt_rows"
    if getattr(ctx.ds, "raw", None) is None:
        return _cannot(name, "the dataset has no raw rows")
    bad, last_ok = ctx._bad, ctx.last_ok
    assert bad is not None and last_ok is not None
    per = (
        bad.lazy().join(last_ok.lazy(), on="seq_key", how="left")
        .with_columns(
            pl.when(
                (pl.col("n_nf") >= CORRUPT_MIN_RUN)
                & (pl.col("last_ok").is_null() | (pl.col("last_ok") < pl.col("first_nf")))
            )
            .then(pl.col("n_nf")).otherwise(0).alias("suffix_len"),
            pl.col("ph_run").fill_null(False),
            pl.col("nf_run").fill_null(False),
        )
        # a run of non-finite values inside the sequence, not its end (a burst)
        .with_columns((pl.col("nf_run") & (pl.col("suffix_len") == 0)).alias("nf_burst"))
    )
    # one row per sequence that has bad masked rows: small, collected once
    per = per.collect().lazy()
    summary = per.select(
        (pl.col("suffix_len") > 0).sum().alias("n_suffix"),
        pl.col("suffix_len").sum().alias("tok_suffix"),
        pl.col("n_nf_infer").filter(pl.col("suffix_len") > 0).sum().alias("tok_suffix_infer"),
        pl.col("n_nf_train").filter(pl.col("suffix_len") > 0).sum().alias("tok_suffix_train"),
        pl.col("suffix_len").filter(pl.col("suffix_len") > 0).median().alias("suffix_median"),
        pl.col("ph_run").sum().alias("n_run"),
        pl.col("n_ph").filter(pl.col("ph_run")).sum().alias("tok_run"),
        pl.col("n_ph_zero").filter(pl.col("ph_run")).sum().alias("tok_run_zero"),
        pl.col("n_ph_both").filter(pl.col("ph_run")).sum().alias("tok_run_both"),
        pl.col("n_ph_both").sum().alias("tok_ph_both"),
        pl.col("nf_burst").sum().alias("n_burst"),
        pl.col("nf_runs").filter(pl.col("nf_burst")).sum().alias("runs_burst"),
        pl.col("ph_runs").filter(pl.col("ph_run")).sum().alias("runs_ph"),
        pl.col("nf_run_tok").filter(pl.col("nf_burst")).sum().alias("tok_in_bursts"),
        pl.col("ph_run_tok").filter(pl.col("ph_run")).sum().alias("tok_in_ph_runs"),
        pl.col("n_nf").filter(pl.col("nf_burst")).sum().alias("tok_burst"),
        pl.col("n_nf").sum().alias("tok_nf"),
        pl.col("n_ph").sum().alias("tok_ph"),
        pl.len().alias("n_bad_seq"),
    )
    ex_suffix = (
        per.filter(pl.col("suffix_len") > 0)
        .sort("suffix_len", "seq_key", descending=[True, False])
        .select("seq_id", "suffix_len", "first_nf").head(OUTLIER_LIST)
    )
    ex_run = (
        per.filter(pl.col("ph_run")).sort("n_ph", "seq_key", descending=[True, False])
        .select("seq_id", "n_ph").head(OUTLIER_LIST)
    )
    ex_burst = (
        per.filter(pl.col("nf_burst")).sort("n_nf", "seq_key", descending=[True, False])
        .select("seq_id").head(OUTLIER_LIST)
    )
    s_df, es, er, eb = (q.collect() for q in (summary, ex_suffix, ex_run, ex_burst))
    s = {k: (0 if v is None else v) for k, v in s_df.row(0, named=True).items()}
    n_suffix, n_run, n_burst = int(s["n_suffix"]), int(s["n_run"]), int(s["n_burst"])
    acc = getattr(ctx.ds, "accounting", None)
    masked = int(acc.tokens_masked) if acc is not None else 0
    # runs of non-finite values as many as scattered ones make by chance (see docstring)
    rest = masked - int(s["tok_suffix"])
    q = (int(s["tok_nf"]) - int(s["tok_suffix"])) / rest if rest > 0 else 0.0
    runs_expected = rest * (1.0 - q) * q ** CORRUPT_MIN_RUN if rest > 0 else 0.0
    q_ph = int(s["tok_ph"]) / masked if masked > 0 else 0.0
    ph_expected = masked * (1.0 - q_ph) * q_ph ** CORRUPT_MIN_RUN
    nf_bad = int(s["tok_nf"]) - int(s["tok_suffix"])
    runs_by_chance = bool(n_burst and rest > 0) and _runs_by_chance(
        int(s["runs_burst"]), runs_expected, int(s["tok_in_bursts"]), nf_bad, q)
    ph_by_chance = bool(n_run and masked > 0) and _runs_by_chance(
        int(s["runs_ph"]), ph_expected, int(s["tok_in_ph_runs"]), int(s["tok_ph"]), q_ph)
    tok_burst = 0 if runs_by_chance else int(s["tok_burst"])
    tok_run = 0 if ph_by_chance else int(s["tok_run"])
    scattered = (int(s["tok_nf"]) - int(s["tok_suffix"]) - tok_burst
                 + int(s["tok_ph"]) - tok_run)
    ev = {
        "sequences_in_input": int(acc.sequences_total) if acc is not None else -1,
        "sequences_with_bad_masked_rows": int(s["n_bad_seq"]),
        "sequences_with_nonfinite_suffix": n_suffix,
        "nonfinite_suffix_tokens": int(s["tok_suffix"]),
        "nonfinite_suffix_tokens_infer_side": int(s["tok_suffix_infer"]),
        "nonfinite_suffix_tokens_train_side": int(s["tok_suffix_train"]),
        "median_suffix_length": _r(float(s["suffix_median"] or 0)),
        "suffix_examples_seq_id": [str(x) for x in es["seq_id"].to_list()],
        "suffix_examples_start_position": [int(x) for x in es["first_nf"].to_list()],
        "sequences_with_placeholder_run": n_run,
        "placeholder_tokens_in_runs": int(s["tok_run"]),
        "placeholder_run_tokens_engine_exact_zero": int(s["tok_run_zero"]),
        #: of those, both logprobs exactly 0.0 (zero_placeholder at an entropy >= 1e-3)
        "placeholder_run_tokens_both_zero": int(s["tok_run_both"]),
        "placeholder_tokens_both_zero": int(s["tok_ph_both"]),
        "placeholder_run_examples_seq_id": [str(x) for x in er["seq_id"].to_list()],
        "sequences_with_nonfinite_run": n_burst,
        "nonfinite_run_tokens": int(s["tok_burst"]),
        "nonfinite_run_examples_seq_id": [str(x) for x in eb["seq_id"].to_list()],
        "nonfinite_runs": int(s["runs_burst"]),
        "nonfinite_runs_expected_if_scattered": _r(runs_expected),
        "nonfinite_runs_by_chance": runs_by_chance,
        "placeholder_runs": int(s["runs_ph"]),
        #: the tokens in the runs themselves (those above count every bad token of the
        #: sequences holding a run)
        "tokens_in_nonfinite_runs": int(s["tok_in_bursts"]),
        "tokens_in_placeholder_runs": int(s["tok_in_ph_runs"]),
        "placeholder_runs_expected_if_scattered": _r(ph_expected),
        "placeholder_runs_by_chance": ph_by_chance,
        "scattered_bad_tokens": scattered,
        "min_run": CORRUPT_MIN_RUN,
    }
    if runs_by_chance:
        n_burst = 0
    if ph_by_chance:
        n_run = 0
    many_scattered = masked > 0 and scattered >= CORRUPT_SCATTERED_SHARE * masked
    if n_suffix == 0 and n_run == 0 and n_burst == 0 and not many_scattered:
        return _clear(
            name,
            f"no non-finite suffix or run, or placeholder run, of >= {CORRUPT_MIN_RUN} tokens "
            f"({scattered} scattered bad tokens, excluded by the loader)",
        )
    parts = []
    if n_suffix:
        parts.append(
            f"{n_suffix} sequence(s) end in a run of non-finite logprobs "
            f"({int(s['tok_suffix'])} tokens, median length {ev['median_suffix_length']}; "
            f"non-finite on the inference side in {int(s['tok_suffix_infer'])}, on the "
            f"trainer side in {int(s['tok_suffix_train'])}), e.g. seq_id "
            f"{', '.join(ev['suffix_examples_seq_id'][:3])}"
        )
    if n_burst:
        parts.append(
            f"{n_burst} sequence(s) hold runs of >= {CORRUPT_MIN_RUN} non-finite logprobs "
            f"inside, not at their end ({int(s['tok_burst'])} non-finite tokens in those "
            f"sequences), e.g. seq_id {', '.join(ev['nonfinite_run_examples_seq_id'][:3])}"
        )
    both_zero = int(s["tok_run_both"])
    one_zero = int(s["tok_run_zero"]) - both_zero
    if n_run and both_zero == int(s["tok_run"]):  # every one both 0.0: maybe nuclei
        parts.append(
            f"{n_run} sequence(s) hold runs of >= {CORRUPT_MIN_RUN} tokens whose logprobs "
            f"are both exactly 0.0 at an entropy of {S.ZERO_BOTH_H_MIN:g} nats or more, "
            f"inside the loss mask ({both_zero} tokens), e.g. seq_id "
            f"{', '.join(ev['placeholder_run_examples_seq_id'][:3])}: rows zero-filled on "
            "both sides, one-token nuclei of top-p / top-k sampling applied on both sides "
            "(the trainer renormalised over the engine's nucleus), or logprobs computed in "
            "bf16 / fp16 on both sides (a bf16 log-softmax gives exactly 0.0 for p above "
            "~0.996); either way their delta of 0 measures no mismatch"
        )
    elif n_run:
        parts.append(
            f"{n_run} sequence(s) hold runs of >= {CORRUPT_MIN_RUN} values no sampler logs "
            "(0.0 on one side only, or on both at an entropy where no log-softmax gives it, "
            "<= -1000, or above 0: placeholders, or probabilities) "
            f"inside the loss mask ({int(s['tok_run'])} tokens), e.g. "
            f"seq_id {', '.join(ev['placeholder_run_examples_seq_id'][:3])}"
            + (
                f" ({one_zero} of them exact 0.0 engine logprobs: the loader "
                "keeps such zeros only when, 50 or more, their trainer logprobs read as "
                "one-token top-p / top-k nuclei)"
                if one_zero else ""
            )
            + (f" ({both_zero} of them 0.0 on both sides)" if both_zero else "")
        )
    title = "Corrupt rows: whole runs of invalid logprobs inside the loss mask"
    if (n_run and both_zero == int(s["tok_run"]) and not n_suffix and not n_burst):
        title = ("Runs of tokens with both logprobs exactly 0.0 inside the loss mask "
                 "(zero-filled rows, one-token nuclei, or a bf16 log-softmax on both sides)")
        ev["both_zero_only"] = True
    lead = ""
    if acc is not None:  # most tokens invalid: the columns, not a few rows, are the problem
        from entr_diag.caveats import exclusion_hint, hinted_reason

        mapping = getattr(ctx.ds, "mapping", None)
        hint = exclusion_hint(acc.excluded, acc.tokens_masked, mapping,
                              getattr(acc, "excluded_where", None))
        reason = hinted_reason(acc.excluded, acc.tokens_masked, mapping)
        if hint and reason:
            n = acc.excluded[reason]
            many = ("Most loss-masked tokens are" if n > acc.tokens_masked / 2
                    else f"{n / acc.tokens_masked:.1%} of the loss-masked tokens are")
            title = f"{many} invalid ({reason}), not a few corrupt rows"
            lead = f"{hint} "
    if many_scattered and not (lead and parts):
        return _scattered_finding(ev, scattered, masked, int(s["n_bad_seq"]), parts, lead)
    where = ""
    if "file" in bad.columns:  # the input files of those sequences
        hit = (per.filter((pl.col("suffix_len") > 0) | pl.col("ph_run") | pl.col("nf_burst"))
               .group_by("file").len().collect())
        listed = _files_evidence(ev, hit.iter_rows(), _paths(ctx.ds))
        where = f" Those sequences are {listed}." if listed else ""
    # a pattern in a handful of tokens (one truncated response among thousands) is listed
    # at info: a warning and a caveat beside the verdict would send the reader hunting for
    # a mask bug the fit does not feel
    n_pattern = int(s["tok_suffix"]) + tok_burst + tok_run
    minor = not lead and masked > 0 and n_pattern < CORRUPT_INFO_SHARE * masked
    if minor:
        ev["pattern_token_share"] = _r(n_pattern / masked)
    f = Finding(
        kind=name,
        severity="info" if minor else "warning",
        title=title,
        message=lead + "; ".join(parts)
        + (". These tokens are excluded (the loader's warning counts them all)."
           if ev.get("both_zero_only") else
           ". These tokens are excluded; the pattern points at the dump or the mask, not noise.")
        + (f" They are {_share(n_pattern / masked)} of the loss-masked tokens: listed, too few "
           "to move the fit." if minor else "")
        + where,
        evidence=ev,
        check=(
            "whether the engine samples with top-p / top-k and the trainer's logprobs are "
            "computed over the same nucleus (then these are one-token nuclei, left out "
            "rightly), or the dump writes 0.0 where it has no logprob."
            if ev.get("both_zero_only") else
            "that the engine returns one logprob per generated token (max_tokens / stop "
            "handling, logprobs requested for every token), how arrays of unequal length are "
            "padded, and that the loss mask excludes tool / padding spans."
            + (" On the trainer side: its maximum sequence length (a response truncated "
               "before the forward pass), and NaN or inf from the forward pass itself "
               "(bf16 / fp16 overflow, a loss-scale skip)." if int(s["tok_suffix_train"])
               else "")
        ),
    )
    return _found(f, f"{n_suffix} suffix, {n_burst} non-finite-run, {n_run} placeholder-run "
                     "sequences")


def _runs_by_chance(runs: int, expected: float, tok: int, n_bad: int, q: float) -> bool:
    """Whether ``runs`` runs of CORRUPT_MIN_RUN (3) or more bad tokens, holding ``tok``
    tokens, are what ``n_bad`` bad tokens scattered at random at rate ``q`` make: at least
    as many runs are that likely (Poisson upper tail at ``expected`` runs >=
    CORRUPT_CHANCE_P) and they hold no more tokens than chance puts in them (1.3x + 5; a
    bad token's run is 1 long with prob. (1-q)^2, 2 long with 2q(1-q)^2). Concentrated bad
    tokens (a shard of probabilities) make fewer runs than chance, but long ones."""
    from scipy import stats

    tok_expected = n_bad * (1.0 - (1.0 - q) ** 2 * (1.0 + 2.0 * q))
    return bool(stats.poisson.sf(runs - 1, expected) >= CORRUPT_CHANCE_P
                and tok <= 1.3 * tok_expected + 5)


def _scattered_finding(ev: dict[str, Any], scattered: int, masked: int, n_seqs: int,
                       parts: Sequence[str] = (), lead: str = "") -> _Result:
    """The corrupt-rows finding for bad tokens scattered at random (a warning: they are at
    least CORRUPT_SCATTERED_SHARE of the masked tokens); ``parts``: the patterns found
    besides (suffixes, bursts, placeholder runs: at this rate short sequences end in a few
    bad tokens by chance too), said after them; ``lead``: the hint of a reason excluding
    many tokens, said first."""
    ev["scattered_token_share"] = _r(scattered / masked)
    seen = [f"{ev[f'{k}_runs']:,} {what} seen, about "
            f"{ev[f'{k}_runs_expected_if_scattered']:,.0f} expected"
            for k, what in (("nonfinite", "non-finite"), ("placeholder", "placeholder"))
            if ev[f"{k}_runs_by_chance"]]
    runs = (f" Runs of >= {CORRUPT_MIN_RUN} occur no more often than chance at that rate "
            f"({'; '.join(seen)}), so no span of the dump is cut." if seen else "")
    both = int(ev.get("placeholder_tokens_both_zero") or 0)
    if 2 * both >= scattered > 0:  # mostly both sides 0.0: zero-filled rows or nuclei
        tail = (f" {both:,} of them have both logprobs exactly 0.0 at an entropy of "
                f"{S.ZERO_BOTH_H_MIN:g} nats or more: rows zero-filled on both sides, "
                "one-token nuclei of top-p / top-k sampling applied on both sides, or "
                "logprobs computed in bf16 / fp16 on both sides; either way their delta of 0 "
                "measures no mismatch, and they are excluded.")
    else:
        tail = (" These tokens are excluded; a share this large points at a column "
                "or a kernel (NaN from an overflow, a dtype cast), not at a few bad rows, "
                "and any selection by the failure (e.g. overflow at extreme logits) biases "
                "the tokens left.")
    f = Finding(
        kind="corrupt_rows",
        severity="warning",
        title=f"Scattered invalid logprobs: {_share(scattered / masked)} of the loss-masked "
              "tokens",
        message=f"{lead}{scattered:,} loss-masked tokens in {n_seqs:,} sequence(s) have a "
                "non-finite or placeholder logprob, spread through the sequences at random."
                + runs + (f" Besides: {'; '.join(parts)}." if parts else "") + tail,
        evidence=ev,
        check="how the logprob columns are computed and written: overflow in bf16 / fp16 "
              "(NaN or inf), a cast or join that fills missing values, logprobs requested "
              "for every token.",
    )
    return _found(f, f"{scattered} scattered bad tokens ({ev['scattered_token_share']} of "
                     "the masked tokens)")


def _lp(x: float) -> str:
    """A logprob for a message (nats)."""
    return f"{x:.4g}"


def _mass(x: float) -> str:
    """A share of sum delta^2 as a percentage; never 100.00% (nor 0.00%) unless exact."""
    s = f"{x:.2%}"
    if s == "100.00%" and x < 1:
        return ">99.99%"
    if s == "0.00%" and x > 0:
        return "<0.01%"
    return s


def _per_bin(cells: pl.DataFrame) -> np.ndarray:
    """Every valid token's count, sum of H and sum of delta^2 per forensic entropy bin,
    ``(3, N_BINS)``, from ``cells`` (rows n, sh, sd2 keyed by ``bin``, which may repeat;
    a null bin, a token without entropy, is left out)."""
    b = (cells.group_by("bin").agg(pl.col("n", "sh", "sd2").sum())
         .filter(pl.col("bin").is_not_null()))
    cols = np.zeros((3, N_BINS))
    idx = b["bin"].to_numpy().astype(np.int64)
    for i, c in enumerate(("n", "sh", "sd2")):
        cols[i, idx] = b[c].to_numpy().astype(np.float64)
    return cols


def _check_implausible(ctx: _Ctx) -> _Result:
    """Sampled tokens with an impossible logprob (placeholders the loader keeps).

    Signature: valid tokens whose logprob is at or below IMPLAUSIBLE_LOGPROB (-50 nats, p <= 2e-22;
    a clamp at exactly -50 is a placeholder too)
    on either side. The engine sampled the token, so its inference-side probability cannot
    be that small: the expected number of sampled tokens with p < e^x is at most N V e^x
    for N tokens and a vocabulary of V (2e-4 for N = 1e12, V = 1e6, x = -50). A value there
    is a placeholder or corrupt value (an engine writing -500 where it has no logprob, a
    clamp, logprobs gathered at the wrong token id); on the trainer side, a token the
    trainer's vocabulary masks or a placeholder. The loader keeps them (its sentinel floor
    is -1000 nats), so they enter the fit, where a few carry most of sum delta^2. Reported
    with their count, share, sequences and share of sum delta^2, and the law's k (on the
    forensic entropy bins, as the sequence outliers report it) with and without them (no
    alpha: over every bin, a noise regime at low entropy would set it, not these tokens); the severity follows that share
    (IMPLAUSIBLE_SHARE_WARN, IMPLAUSIBLE_SHARE_CRITICAL).
    """
    assert ctx.implausible is not None
    return _implausible(ctx.implausible, ctx.cells, ctx.has("entropy"),
                        _paths(ctx.ds))


def _implausible(acc: _ImplausibleTokens, cells: pl.DataFrame, has_entropy: bool,
                 files: Sequence[str]) -> _Result:
    """:func:`_check_implausible` on its tables: ``acc`` (the flagged tokens), ``cells``
    (every valid token's count ``n`` and sums ``sh`` / ``sd2`` by forensic entropy ``bin``,
    rows may repeat a bin), ``files`` the input files (by FILE_INDEX)."""
    from entr_diag.io.schema import SENTINEL_FLOOR

    name = "implausible_logprobs"
    t = IMPLAUSIBLE_LOGPROB
    seqs = acc.seqs.result()
    lowest = ", ".join(f"{side} {_lp(v)}" for side, v in acc.lowest.items()
                       if math.isfinite(v))
    if not seqs.height:
        return _clear(name, f"no valid token has a logprob at or below {t:g} nats"
                            + (f" (lowest: {lowest})" if lowest else ""))
    tot = cells.select(pl.col("n").sum(), pl.col("sd2").sum()).row(0)
    n_all, sd2_all = int(tot[0] or 0), float(tot[1] or 0.0)
    n_flag = int(seqs["n"].sum())
    by_side = {side: int(seqs[f"n_{side}"].sum()) for side in ("infer", "train")}
    sd2_flag = float(seqs["sd2"].sum())
    share_d2 = sd2_flag / sd2_all if sd2_all > 0 else 0.0
    tok_share = n_flag / n_all if n_all else float("nan")
    # the law's k on the forensic entropy bins, with and without the flagged tokens
    k_with = k_without = float("nan")
    if has_entropy:
        cols = _per_bin(cells)
        for which, (n, sh, sd2) in (("with", cols), ("without", cols - acc.bins)):
            ok = n > 0
            k = _k_fit(sh[ok] / n[ok], sd2[ok] / n[ok], n[ok])
            if which == "with":
                k_with = k
            else:
                k_without = k
    top = seqs.sort("n", "sd2", "seq_key", descending=[True, True, False]).head(OUTLIER_LIST)
    ranges = {side: [_r(acc.lowest[side]), _r(acc.highest_flagged[side])]
              for side in by_side if by_side[side]}
    ev = {
        "tokens_flagged": n_flag,
        "token_share_flagged": _r(tok_share),
        "delta2_share_flagged": _r(share_d2, 6),
        "k_with_flagged": _r(k_with),
        "k_without_flagged": _r(k_without),
        "tokens_infer_side": by_side["infer"],
        "tokens_train_side": by_side["train"],
        "example_seq_ids": [str(x) for x in top["seq_id"].to_list()],
        "sequences_flagged": seqs.height,
        "example_first_positions": [int(x) for x in top["first_pos"].to_list()],
        "infer_logprob_range_flagged": ranges.get("infer", []),
        "train_logprob_range_flagged": ranges.get("train", []),
        "threshold_logprob": t,
    }
    if acc.files and len(files) > 1:  # which input files hold them
        ev["files"] = {files[i]: n for i, n in sorted(acc.files.items())}
        ev["input_files"] = len(files)

    def values(side: str) -> str:
        lo, hi = acc.lowest[side], acc.highest_flagged[side]
        return f"all {_lp(lo)}" if lo == hi else f"{_lp(lo)} to {_lp(hi)}"

    sides = "; ".join(f"{by_side[side]:,} on the {what} side ({values(side)})"
                      for side, what in (("infer", "inference"), ("train", "trainer"))
                      if by_side[side])
    law = ""
    if math.isfinite(k_with) and math.isfinite(k_without):
        law = (f" The law's k is {k_with:.3g} with them and {k_without:.3g} without on the "
               "forensic entropy bins.")
    # (without entropy there is no law: the mismatch metrics are what they distort)
    enter, effects = (("fit", ("the fitted law describes these values, not the mismatch",
                               "they bias the fitted law", "the fit barely moves"))
                      if has_entropy else
                      ("mismatch metrics", ("the metrics describe these values, not the "
                                            "mismatch", "they bias the metrics",
                                            "the metrics barely move")))
    if share_d2 >= IMPLAUSIBLE_SHARE_CRITICAL:
        sev, effect = "critical", effects[0]
    elif share_d2 >= IMPLAUSIBLE_SHARE_WARN:
        sev, effect = "warning", effects[1]
    else:
        sev, effect = "info", effects[2]
    why = []
    if by_side["infer"]:
        why.append("no sampler picks a token that unlikely (over N tokens and a vocabulary of "
                   f"V, at most N*V*e^{t:g} are expected: 2e-4 for 1e12 tokens and V = 1e6), "
                   "so the engine-side values are placeholders or corrupt")
    if by_side["train"]:
        why.append("the trainer-side values, for tokens the engine sampled, are placeholders, "
                   "tokens the trainer's vocabulary masks, or not log-probabilities at all (a "
                   "scaled or summed column)")
    why_s = "; ".join(why)
    msg = (
        f"{n_flag:,} of {n_all:,} valid tokens ({_share(tok_share)}), in {seqs.height:,} "
        f"sequence(s), have a logprob at or below {t:g} nats (p <= {math.exp(t):.1e}): {sides}. "
        + why_s[:1].upper() + why_s[1:]
        + f". The loader keeps them (its sentinel floor is {SENTINEL_FLOOR:g} nats) and they "
        f"enter the {enter}: they carry {_mass(share_d2)} of sum delta^2, so {effect}.{law} E.g. "
        f"seq_id {', '.join(ev['example_seq_ids'][:5])}."
    )
    if "files" in ev:
        from entr_diag.caveats import files_listed

        msg += f" They are {files_listed(ev['files'], ev['input_files'])}."
    f = Finding(
        kind=name,
        severity=sev,
        title=(f"{n_flag:,} token(s) with an impossible logprob (at or below {t:g} nats) carry "
               f"{_mass(share_d2)} of sum delta^2"),
        message=msg,
        evidence=ev,
        check=(
            f"remove these rows before the analysis (keep the rows whose columns mapped to "
            f"infer_logprob and train_logprob are above {t:g}, or set their loss mask to "
            "false) and rerun; then find what writes them: a placeholder or clamp value "
            "where the engine returned no logprob, logprobs gathered at the wrong token id, "
            "a vocabulary or tokenizer mismatch between engine and trainer."
        ),
    )
    return _found(f, f"{n_flag:,} tokens at or below {t:g} nats, {_mass(share_d2)} of delta^2")


def _check_unsampled(ctx: _Ctx) -> _Result:
    """Loss-masked tokens the engine cannot have sampled from the distribution whose entropy
    the log holds.

    A token drawn from a distribution mu has the entropy as its mean surprisal,
    E[-log mu(y)] = H(mu), and the surprisal is never negative, so by Markov's inequality
    P(-log mu(y) >= s) <= H / s whatever mu is. Over the tokens of the forensic entropy bins
    below :data:`UNSAMPLED_H_MAX`, at most sum(H) / s of them can have a sampled-token
    probability below :data:`UNSAMPLED_P` (s = -ln 1e-3 = 6.9 nats): 1.4e-4 of the tokens at
    H = 1e-3 nats. The count is a sum of independent Bernoulli draws with mean at most that
    bound, so its Poisson upper tail is the test, on the tokens below each bin's upper edge
    in turn (Bonferroni-corrected over those edges). A range is found when its p-value is
    below :data:`UNSAMPLED_PVALUE`, its count is :data:`UNSAMPLED_MIN_RATIO` times the bound
    or more and at least :data:`UNSAMPLED_MIN_EXCESS` above it; the finding reads the range
    with the largest excess among those (else the check reads the widest range, clear).
    Such tokens were not sampled by the engine from that distribution: prompt tokens inside
    the loss mask, the last prompt token of a mask shifted by one (or of each turn), tool or
    environment outputs, tokens sampled at a higher temperature than the logged logprobs and
    entropy, or an entropy that understates H (over a truncated list; of another policy than
    the one that sampled). The real low-entropy noise regime (METHOD.md: off-mode tokens the
    engine does sample, at a rate below the bound) never reaches it.

    Where they sit names the cause, each against its base rate (a 1-token sequence's token
    is first by chance): a warning when :data:`UNSAMPLED_EARLY_SHARE` or more lie in the
    first :data:`UNSAMPLED_EARLY` of their sequence's loss-masked positions and twice the
    share that tokens spread at random would put there, those that are not their
    sequence's first as well (the prompt in the mask); else when :data:`UNSAMPLED_FIRST_SHARE` or more
    of them are their sequence's first loss-masked token and :data:`UNSAMPLED_BASE_FACTOR`
    times the share tokens spread at random would put there (a mask shifted by one; in a
    multi-turn rollout the first token of each later turn is not told from its
    neighbours: row order is not read); critical when the
    excess is :data:`UNSAMPLED_CRITICAL_SHARE` of the valid tokens or more. Spread over the
    sequences: info (e.g. the planted noise tokens of ``entr-diag synth``, at rates no
    sampler reaches), a warning from :data:`UNSAMPLED_SPREAD_WARN_SHARE`. Deferred
    (``cannot_tell``) when the logprob columns look shifted, one holds another token's
    logprob or the entropy column is shifted: those checks explain them.
    """
    from scipy import stats

    name = "unsampled_tokens"
    deferred = _surprisal_deferred(ctx, name, "the bound reads the entropy")
    if deferred is not None:
        return deferred
    acc = ctx.unsampled
    assert acc is not None
    s = -math.log(UNSAMPLED_P)
    cols = _per_bin(ctx.cells)
    top = int(round((math.log10(UNSAMPLED_H_MAX) - math.log10(H_BIN_LO)) / BIN_DECADES))
    edges = [H_BIN_LO * 10 ** (BIN_DECADES * (j + 1)) for j in range(top)]
    o_c = np.cumsum(acc.bins[0, :top])
    # (the bound in nats: an entropy column in bits or log10 units is converted)
    lam_c = np.cumsum(cols[1, :top]) * _entropy_to_nats(ctx)[0] / s
    n_c = np.cumsum(cols[0, :top])
    tests = [j for j in range(top) if n_c[j] > 0]
    if not tests or o_c[-1] == 0:
        return _clear(name, f"no valid token below {_h_text(UNSAMPLED_H_MAX, ctx)} has a "
                            f"sampled-token probability below {UNSAMPLED_P:g}")
    pv = {j: min(1.0, len(tests) * (float(stats.poisson.sf(o_c[j] - 1, lam_c[j]))
                                    if o_c[j] else 1.0)) for j in tests}
    found = [j for j in tests if pv[j] < UNSAMPLED_PVALUE
             and o_c[j] >= UNSAMPLED_MIN_RATIO * lam_c[j]
             and o_c[j] - lam_c[j] >= UNSAMPLED_MIN_EXCESS]
    # the found range with the most tokens above the bound; none: the widest
    j = max(found, key=lambda i: (o_c[i] - lam_c[i], -i)) if found else tests[-1]
    o, lam, n_low, p = int(o_c[j]), float(lam_c[j]), int(n_c[j]), pv[j]
    edge = edges[j]
    why = (f"{o:,} of the {n_low:,} tokens at entropy below {_h_text(edge, ctx)} have a "
           f"sampled-token probability p < {UNSAMPLED_P:g}, where tokens sampled from "
           f"distributions of those entropies have at most {lam:.3g} such (Markov: "
           "P(-log p >= s) <= H / s)")
    if not found:
        if o <= lam:
            return _clear(name, f"{why}: within the bound")
        return _clear(name, f"{why}: {o / lam:.3g} times it ({_pval(p)}), under a finding's "
                            f"margins ({UNSAMPLED_MIN_RATIO:g} times the bound, "
                            f"{UNSAMPLED_MIN_EXCESS} tokens above it, p < {UNSAMPLED_PVALUE:g})"
                      if lam > 0 else f"{why} ({_pval(p)}), under a finding's margins "
                      f"({UNSAMPLED_MIN_EXCESS} tokens above the bound, p < "
                      f"{UNSAMPLED_PVALUE:g})")
    n_all = int(cols[0].sum())
    excess = o - lam
    d2_low = float(cols[2, :j + 1].sum())
    d2_share = float(acc.bins[1, :j + 1].sum()) / d2_low if d2_low > 0 else 0.0
    # where they sit: the kept rows of the range, against base rates
    rows = acc.rows().filter(pl.col("bin") <= j)
    first_share = first_base = early_share = early_base = None
    early_rest = False
    if ctx.seqs is not None and "pos_min" in ctx.seqs.columns and rows.height:
        span = (pl.col("pos_max") - pl.col("pos_min")).cast(pl.Float64)
        e = (rows.join(ctx.seqs.select("seq_key", "pos_min", "pos_max", "n"), on="seq_key",
                       how="inner")
             .with_columns((pl.col("position") == pl.col("pos_min")).alias("first"),
                           (1.0 / pl.col("n")).alias("first_base"),
                           (((pl.col("position") - pl.col("pos_min")) / span.clip(lower_bound=1))
                            <= UNSAMPLED_EARLY).alias("early"),
                           ((span * UNSAMPLED_EARLY).floor() + 1).truediv(pl.col("n"))
                           .clip(upper_bound=1.0).alias("base")))
        r = e.select(pl.col("first", "first_base", "early", "base").mean()).row(0)
        if r[0] is not None:
            first_share, first_base, early_share, early_base = map(float, r)
        rest = e.filter(~pl.col("first"))  # (a shifted mask's tokens are first ones)
        if rest.height >= UNSAMPLED_MIN_EXCESS:
            q = rest.select(pl.col("early", "base").mean()).row(0)
            early_rest = float(q[0]) >= max(UNSAMPLED_EARLY_SHARE, 2 * float(q[1]))
    # the prompt in the mask: early beyond the base rate, the tokens that are not their
    # sequence's first too (a prompt of a few tokens puts one of them first); else a mask
    # shifted by one: first tokens beyond their base rate
    prompt = (early_share is not None and early_base is not None and early_rest
              and early_share >= UNSAMPLED_EARLY_SHARE and early_share >= 2 * early_base)
    shifted_mask = (not prompt and first_share is not None and first_base is not None
                    and first_share >= UNSAMPLED_FIRST_SHARE
                    and first_share >= UNSAMPLED_BASE_FACTOR * first_base)
    n_seqs = acc.seqs.result().filter(pl.col("bin") <= j).height
    # examples: the kept sequences (all, or those of the stride) with most such tokens
    ex = _with_seq_ids(rows.group_by("seq_key").agg(pl.len().alias("n"), pl.col(
        "position").min().alias("first_pos")), ctx).sort(
        "n", "seq_id", descending=[True, False]).head(OUTLIER_LIST)
    ev: dict[str, Any] = {
        "tokens_flagged": o,
        "tokens_below_entropy": n_low,
        "entropy_below": _r(edge, 6),
        "expected_at_most": _r(lam, 6),
        "excess_tokens": _r(excess, 6),
        "excess_token_share": _r(excess / n_all if n_all else float("nan"), 6),
        "p_value": float(p),
        "delta2_share_below_entropy": _r(d2_share, 6),
        "sequences_flagged": n_seqs,
        "first_masked_share": None if first_share is None else _r(first_share),
        "first_masked_base": None if first_base is None else _r(first_base),
        "early_share": None if early_share is None else _r(early_share),
        "early_base": None if early_base is None else _r(early_base),
        "localised_on_tokens": rows.height,
        "example_seq_ids": [str(x) for x in ex["seq_id"].to_list()],
        "example_first_positions": [int(x) for x in ex["first_pos"].to_list()],
        "threshold_p": UNSAMPLED_P,
    }
    files = _paths(ctx.ds)
    by_file: dict[str, int] = {}
    for (i, bn), n in sorted(acc.files.items()):
        if bn <= j:
            by_file[files[i]] = by_file.get(files[i], 0) + n
    if by_file and len(files) > 1:
        ev["files"], ev["input_files"] = by_file, len(files)
    steps: dict[int, int] = {}
    for (st, bn), n in sorted(acc.steps.items()):
        if bn <= j:
            steps[st] = steps.get(st, 0) + n
    if steps:
        ev["steps"] = steps
    share = excess / n_all if n_all else 0.0
    ev["cause"] = ("mask_shifted_by_one" if shifted_mask else "prompt_in_mask" if prompt
                   else "spread")
    if shifted_mask:
        sev = "warning"
        where = (f"{_share(first_share)} of them are their sequence's first loss-masked "
                 f"token, where tokens spread at random would put {_share(first_base)} there: "
                 "the loss mask looks shifted by one, taking in the last prompt token (a BOS "
                 "or separator; in a multi-turn rollout, likely the token before each turn "
                 "too) that the engine never sampled")
        title_where = ("many of them their sequence's first loss-masked token (a mask "
                       "shifted by one?)")
    elif prompt:
        sev = "warning"
        where = (f"{_share(early_share)} of them lie in the first {UNSAMPLED_EARLY:.0%} of "
                 f"their sequence's loss-masked positions, where tokens spread at random would "
                 f"put {_share(early_base)}: the loss mask looks to cover the prompt, or "
                 "another teacher-forced prefix")
        title_where = "at the start of their sequences (the prompt in the loss mask?)"
    else:
        sev = "warning" if share >= UNSAMPLED_SPREAD_WARN_SHARE else "info"
        where = ("they are spread over the sequences, not concentrated at their start nor "
                 "on their sequence's first loss-masked token beyond the base rates (which "
                 "does not rule out a prompt or a shifted mask whose tokens the model finds "
                 "likely: only improbable ones show here). Causes: tool or environment outputs inside "
                 "the mask, an entropy that understates H (computed over a truncated list, or "
                 "of another policy than the one that sampled), sampling at a higher "
                 "temperature than the logged logprobs and entropy, or a synthetic run "
                 "(entr-diag synth plants its noise tokens at rates no sampler reaches)")
        title_where = "spread over the sequences"
    if sev == "warning" and share >= UNSAMPLED_CRITICAL_SHARE and (shifted_mask or prompt):
        sev = "critical"
    effect = (f"They carry {_mass(d2_share)} of sum delta^2 below {_h_text(edge, ctx)}, where "
              "they set the bins' mean delta^2 (and with them the law's lowest bins, H* and "
              "any noise regime, where the law reads those bins)")
    if sev != "info" and (shifted_mask or prompt):
        effect += ", and the trainer learns from tokens it should not"
    sampled = (f" (where they sit: read on {rows.height:,} of them, the sequences whose "
               f"seq_key is a multiple of {acc.stride})" if acc.stride > 1 else "")
    msg = (f"{why}: {excess:,.0f} above the bound ({_share(share)} of the {n_all:,} valid "
           f"tokens, {_pval(p)}), so they were not drawn from that distribution. "
           f"{where[:1].upper()}{where[1:]}{sampled}. {effect}. E.g. seq_id "
           f"{', '.join(ev['example_seq_ids'][:5])} (first such position "
           f"{', '.join(map(str, ev['example_first_positions'][:5]))}).")
    if "files" in ev:
        from entr_diag.caveats import files_listed

        msg += f" They are {files_listed(ev['files'], ev['input_files'])}."
    f = Finding(
        kind=name,
        severity=sev,
        title=(f"{o:,} low-entropy token(s) not drawn from the logged distribution (p < "
               f"{UNSAMPLED_P:g} at entropy below {_h_text(edge, ctx, short=True)}, where at "
               f"most {lam:.3g} are possible), {title_where}"),
        message=msg,
        evidence=ev,
        check=(
            "print the loss mask beside the token ids of an example sequence: it should "
            "start at the first response token and cover only tokens the engine sampled "
            "(not the prompt, not the last prompt token of a mask built for the inputs and "
            "applied to the labels or the reverse, not tool or environment outputs, not "
            "padding); if the mask is right, check that the logged logprobs and entropy are "
            "those of the distribution that sampled (temperature, truncation) and of the same "
            "policy version."
        ),
    )
    return _found(f, f"{o:,} tokens with p < {UNSAMPLED_P:g} below "
                     f"{_h_text(edge, ctx, short=True)}, at most {lam:.3g} possible "
                     f"({_pval(p)})")


def _with_seq_ids(rows: pl.DataFrame, ctx: _Ctx) -> pl.DataFrame:
    """``rows`` (with seq_key) with each sequence's seq_id (String) from the sequence table
    of the pass (``ctx.seqs``), in their order (ties are broken by it: the seq_key of an
    integer seq_id read natively is not that of its String)."""
    assert ctx.seqs is not None
    return rows.join(ctx.seqs.select("seq_key", pl.col("seq_id").cast(pl.String)),
                     on="seq_key", how="left", maintain_order="left")


def _entropy_to_nats(ctx: _Ctx) -> tuple[float, str | None]:
    """(factor, unit): the factor that turns the entropy column's values into nats and the
    column's unit, when the fit's units check names it (``ctx.unit_mistake``
    ``entropy_bits``: ``(ln 2, "bits")``; ``entropy_log10``: ``(ln 10, "log10 units")``,
    :data:`entr_diag.caveats.ENTROPY_UNITS`); else ``(1.0, None)``: nats."""
    from entr_diag.caveats import ENTROPY_UNITS

    unit = ENTROPY_UNITS.get(ctx.unit_mistake or "")
    return (1.0, None) if unit is None else (unit[1], unit[0])


def _h_text(h: float, ctx: _Ctx, short: bool = False) -> str:
    """An entropy ``h`` as the entropy column reads it, with its unit: ``"0.1 nats"``, or
    when the units check names another unit (:func:`_entropy_to_nats`) ``"0.1 in the
    entropy column's unit (probably bits; 0.0693 nats)"`` (``short``: ``"0.1 bits
    (0.0693 nats)"``)."""
    from entr_diag.caveats import entropy_text

    f, unit = _entropy_to_nats(ctx)
    if short and unit is not None:
        return f"{h:.3g} {unit} ({h * f:.3g} nats)"
    return entropy_text(f"{h:.3g}", "", {"likely_mistake": ctx.unit_mistake}, f"{h * f:.3g}")


def _surprisal_deferred(ctx: _Ctx, name: str, why_entropy: str) -> _Result | None:
    """The cannot_tell result of a check that reads the engine's surprisal against the
    entropy (unsampled tokens, mask-start surprisal) when it cannot: no entropy column
    (``why_entropy`` says why it is needed), logprob columns shifted against each other, a
    logprob column holding another token's logprob, an entropy column shifted against the
    logprobs (those checks explain what it would see); else None."""
    if not ctx.has("entropy"):
        return _cannot(name, f"no entropy column ({why_entropy})")
    if ctx.misalign is not None and ctx.misalign[1] is not None:
        return _cannot(name, "the logprob columns look shifted against each other (see "
                             "misalignment): a shifted column pairs tokens with neighbours' "
                             "probabilities")
    if ctx.other_token is not None:
        return _cannot(name, f"{ctx.other_token} holds another token's logprob (the units "
                             "check): its probabilities are not the sampled token's")
    if ctx.entropy_shifted:
        return _cannot(name, "the entropy column looks shifted against the logprobs, or not "
                             "to follow the tokens at all (see the entropy alignment "
                             "warning): each token is read against another token's entropy")
    return _entropy_void(ctx, name)


def _entropy_void(ctx: _Ctx, name: str) -> _Result | None:
    """The cannot_tell result of a check that reads how delta or the surprisal changes along
    the entropy axis when most entropies are out of range (``ctx.entropy_out_of_range``,
    the CLI's void verdict): the bins then hold only the tokens the fault left in range
    (an entropy x1000: true entropies below 0.02 nats, where bf16 rounding biases delta
    negative, had read as truncated sampling); else None."""
    if ctx.entropy_out_of_range <= 0:
        return None
    return _cannot(name, f"{ctx.entropy_out_of_range:.1%} of the loss-masked tokens have an "
                         "entropy out of range: the entropy bins hold only the few the fault "
                         "left in range")


def _mask_start_excess(rows: pl.DataFrame) -> tuple[pl.DataFrame, float]:
    """Per sequence of ``rows`` (:meth:`_MaskStartTokens.rows`), the mean residual ``r`` of
    the first token of each of its loss-masked spans (its first token, and each one after a
    gap of more than MASK_START_SPAN_GAP positions, the start of a later turn of a
    multi-turn rollout), ``first``, and of the tokens after them, ``rest``; for each window
    W of MASK_START_WINDOWS, the mean residual of the tokens within W positions after its
    first token (span starts aside), ``w{W}``, and of those after them, ``r{W}`` (null
    with fewer than MASK_START_MIN_TOKENS there); ``n`` and the span starts ``starts``.
    The residual is ``r = e - mean(e | forensic entropy bin)``, the bin's mean over the
    baseline, the tokens after the smallest window that start no span (a temperature or
    truncation the logs leave out biases e by entropy; a bin the baseline does not hold:
    0, sampled tokens' mean). Also the logged bias: the baseline's mean of |mean(e | bin)|
    weighted by its tokens (nats; about 0.01 where the logged distribution is the sampled
    one, 0.1 to 1 where a temperature or a truncation is left out of the logs)."""
    pos = pl.col("position")
    lo = pos.min().over("seq_key")
    prev = pos.shift(1).over("seq_key")  # (on rows sorted by seq_key, position)
    first = prev.is_null() | (pos - prev > MASK_START_SPAN_GAP + 1)
    e = pl.col("e").cast(pl.Float64)
    base = ~pl.col("_first") & (pl.col("_off") > MASK_START_WINDOWS[0])
    t = (rows.lazy().sort("seq_key", "position")
         .with_columns(first.alias("_first"), (pos - lo).alias("_off"), _bin_expr())
         .with_columns(e.filter(base).mean().over("bin").alias("_m"), base.alias("_base"))
         .with_columns((e - pl.col("_m").fill_null(0.0)).alias("r")).collect())
    bias = t.filter("_base").select(pl.col("_m").abs().mean()).item()
    rest = ~pl.col("_first")
    aggs = [pl.len().alias("n"), pl.col("_first").sum().alias("starts"),
            pl.col("r").filter(pl.col("_first")).mean().alias("first"),
            pl.col("r").filter(rest).mean().alias("rest")]
    for w in MASK_START_WINDOWS:
        after = rest & (pl.col("_off") > w)
        aggs += [pl.col("r").filter(rest & (pl.col("_off") <= w)).mean().alias(f"w{w}"),
                 pl.when(after.sum() >= MASK_START_MIN_TOKENS)
                 .then(pl.col("r").filter(after).mean()).alias(f"r{w}")]
    per = t.group_by("seq_key").agg(aggs)
    return per, float(bias) if bias is not None else 0.0


def _check_mask_start(ctx: _Ctx) -> _Result:
    """Teacher-forced tokens at the start of the loss mask, read from their surprisal.

    A token the engine sampled from a distribution mu has, on average, a surprisal
    ``-log mu(y)`` equal to the entropy H(mu), wherever it sits in its sequence:
    E[-log mu(y) - H(mu) | context] = 0. Tokens the engine did not sample (teacher-forced:
    the prompt inside the loss mask, the last prompt token of a mask shifted by one) have
    a surprisal above their entropy on average unless the model predicts them exactly as
    well as it samples (its own training text). With ``e = -infer_logprob - entropy`` per
    valid token less the mean e of its forensic entropy bin (:func:`_mask_start_excess`),
    each sequence gives, for each window of MASK_START_WINDOWS positions after its first
    loss-masked token (span starts aside), the difference between the window's mean
    residual and that of the tokens after it, and the same for the first tokens of its
    loss-masked spans (its first token, and each one after a gap of more than
    MASK_START_SPAN_GAP positions: each later turn's in a multi-turn rollout) against its
    other tokens. A one-sided one-sample t-test over the sequences
    (scipy.stats.ttest_1samp; right-skewed residuals make it conservative) finds a region
    when its p-value, Bonferroni-corrected over the regions, is below MASK_START_PVALUE,
    MASK_START_MIN_SEQS sequences or more are read and its mean excess is
    MASK_START_MIN_EXCESS nats or more (MASK_START_MIN_EXCESS_FIRST on the span starts, one
    per turn: noisier), or the logged bias if larger: where the logged distribution is not
    the one that sampled (a temperature, a top-p / top-k truncation left out of the logs),
    its bias depends on the distribution's shape, not only on its entropy, and differs by
    position (helper-39: the span starts of clean top-p runs logged untruncated read +0.06
    to +0.1 at t up to 20, beside a logged bias of 0.22 to 0.46 nats). The windows first
    (the one with the largest t; a prompt in the mask lifts the first token too): the
    prompt in the loss mask; else the span starts: a mask shifted by one. A warning; info
    when the unsampled-tokens check names the same cause (:func:`_cross_referenced`). Read
    on whole sequences, at most MASK_START_MAX_ROWS tokens (:class:`_KeptSequences`).
    Where the unsampled-tokens check sees the improbable tokens only, this reads every
    token of the region (helper-36's real tiny model: English or held-out prompts in the
    mask, a mask shifted onto English text: found; clean runs clear). Deferred as
    :func:`_surprisal_deferred` says.
    """
    name = "mask_start_surprisal"
    deferred = _surprisal_deferred(ctx, name, "the test reads surprisal against entropy")
    if deferred is not None:
        return deferred
    assert ctx.mask_start is not None
    acc, rows = ctx.mask_start, ctx.mask_start.rows()
    f = _entropy_to_nats(ctx)[0]
    if f != 1.0:  # e = surprisal - entropy in nats: an entropy in bits or log10 converted
        rows = rows.with_columns((pl.col("e") + pl.col("entropy") * (1.0 - f))
                                 .cast(pl.Float32))
    per, bias = _mask_start_excess(rows)
    from scipy import stats

    names = [f"w{w}" for w in MASK_START_WINDOWS] + ["first"]
    regions: dict[str, dict[str, Any]] = {}
    for region in names:
        rest = "rest" if region == "first" else "r" + region[1:]
        q = per.filter(pl.col("n") >= MASK_START_MIN_TOKENS) if region == "first" else per
        x = (q.select((pl.col(region) - pl.col(rest)).alias("x"), "seq_key")
             .drop_nulls().drop_nans())
        v = np.sort(x["x"].to_numpy())  # (sorted: sums in one order, whatever the keys)
        floor = MASK_START_MIN_EXCESS_FIRST if region == "first" else MASK_START_MIN_EXCESS
        out: dict[str, Any] = {"sequences": int(v.size), "floor": max(floor, bias)}
        if v.size >= 2 and float(np.std(v)) > 0:
            t = stats.ttest_1samp(v, 0.0, alternative="greater")
            out.update(mean=float(v.mean()), t=float(t.statistic),
                       p=min(1.0, len(names) * float(t.pvalue)), x=x)
        regions[region] = out
    if not any("p" in o for o in regions.values()):
        return _cannot(name, f"too few sequences with {MASK_START_MIN_TOKENS} valid tokens or "
                             f"more after the start of their mask "
                             f"({regions['first']['sequences']:,})")

    def is_found(o: dict[str, Any]) -> bool:
        return ("p" in o and o["p"] < MASK_START_PVALUE and o["mean"] >= o["floor"]
                and o["sequences"] >= MASK_START_MIN_SEQS)

    def where_of(region: str) -> str:
        return ("the first token of each loss-masked span" if region == "first" else
                f"the {region[1:]} positions after the first loss-masked token")

    def said(region: str) -> str:
        o = regions[region]
        if "p" not in o:
            return f"{where_of(region)}: too few sequences ({o['sequences']:,})"
        return (f"{where_of(region)}: {o['mean']:+.3g} nats (t = {o['t']:.1f}, "
                f"{o['sequences']:,} sequences, {_pval(o['p'])})")

    windows = [r for r in names[:-1] if is_found(regions[r])]
    found = (max(windows, key=lambda r: regions[r]["t"]) if windows
             else "first" if is_found(regions["first"]) else None)
    sampled = (f", read on the sequences whose seq_key is a multiple of {acc.stride}"
               if acc.stride > 1 else "")
    raised = (f"; the floor raised to the logged bias, {bias:.3g} nats: the tokens' surprisal "
              "departs from their entropy by that much on average in their entropy bins, so "
              "the logged distribution is not the one that sampled (a temperature or a "
              "truncation left out of the logs), whose bias may differ by position"
              if bias > MASK_START_MIN_EXCESS else "")
    if found is None:
        return _clear(name, "surprisal over entropy, against the tokens after: "
                            + "; ".join(said(r) for r in names) + sampled
                            + f" (a finding needs {MASK_START_MIN_EXCESS:g} nats, "
                            f"{MASK_START_MIN_EXCESS_FIRST:g} on the span starts, and p < "
                            f"{MASK_START_PVALUE:g}{raised}; a prompt the model predicts as "
                            "well as it samples, e.g. its training text, does not show)")
    o = regions[found]
    x = _with_seq_ids(o["x"], ctx).sort(["x", "seq_id"], descending=[True, False]).head(
        OUTLIER_LIST)
    ids = [str(k) for k in x["seq_id"].to_list()]
    positive = float((o["x"]["x"] > 0).mean())
    n_starts = int(per.filter(pl.col("n") >= MASK_START_MIN_TOKENS)["starts"].sum())
    ev: dict[str, Any] = {
        "cause": "mask_shifted_by_one" if found == "first" else "prompt_in_mask",
        "region": "first" if found == "first" else "early",
        "early_window_positions": None if found == "first" else int(found[1:]),
        "sequences": o["sequences"],
        "mean_excess_nats": _r(o["mean"], 6),
        "t": _r(o["t"], 3),
        "p_value": float(o["p"]),
        "floor_nats": _r(o["floor"], 6),
        "logged_bias_nats": _r(bias, 6),
        "sequences_positive_share": _r(positive),
        "early_windows": {r[1:]: {"mean_excess_nats": _r(regions[r].get("mean", math.nan), 6),
                                  "t": _r(regions[r].get("t", math.nan), 3),
                                  "sequences": regions[r]["sequences"]} for r in names[:-1]},
        "first_mean_excess_nats": _r(regions["first"].get("mean", math.nan), 6),
        "span_starts": n_starts,
        "tokens_read": rows.height,
        "seq_key_stride": acc.stride,
        "example_seq_ids": ids,
    }
    if found == "first":
        subject = ("The first token of each loss-masked span (the sequence's first, and each "
                   f"one after a gap of more than {MASK_START_SPAN_GAP} positions: "
                   f"{n_starts:,} tokens) is")
        against = "the other tokens of its sequence"
        cause = ("the loss mask looks shifted by one, taking in the last prompt token (a BOS "
                 "or separator; in a multi-turn rollout, the token before each turn too), "
                 "which the engine never sampled")
        title_where = "on the first loss-masked token (a mask shifted by one?)"
    else:
        subject = (f"The tokens within {found[1:]} positions after each sequence's first "
                   "loss-masked token (span starts aside) are")
        against = "the tokens after them"
        cause = ("the loss mask looks to cover the prompt, or another teacher-forced prefix "
                 "(a system message, a few-shot example, a forced reasoning prefix)")
        title_where = "at the start of the loss mask (the prompt in the mask?)"
    msg = (f"{subject} more surprising to the engine than the entropy says: the surprisal "
           f"(-infer_logprob) exceeds the entropy by {o['mean']:+.3g} nats more on average "
           f"than on {against} at the same entropy ({o['sequences']:,} sequences, "
           f"{_share(positive)} of them above, t = {o['t']:.1f}, {_pval(o['p'])}{sampled}; "
           f"floor {o['floor']:.3g} nats). Tokens the engine sampled have a surprisal equal "
           f"to their entropy on average wherever they sit, so not all of these were "
           f"sampled: {cause}. The trainer learns from tokens it should not, and their delta "
           f"is no engine mismatch. E.g. seq_id {', '.join(ids[:5])} (the largest excess).")
    f = Finding(
        kind=name,
        severity="warning",
        title=f"surprisal above entropy by {o['mean']:+.3g} nats {title_where}",
        message=msg,
        evidence=ev,
        check=("print the loss mask beside the token ids of an example sequence: it should "
               "start at the first response token and cover only tokens the engine sampled "
               "(not the prompt, not the last prompt token of a mask built for the inputs "
               "and applied to the labels or the reverse)."),
    )
    return _found(f, said(found))


def _check_floor(ctx: _Ctx) -> _Result:
    """Trainer self-noise floor.

    Signature: two trainer-side recomputations of the same policy (other batch layout,
    kernels, padding) differ by the trainer's own nondeterminism; engine-vs-trainer delta can
    only be fixed down to that floor. The ratio mean delta^2 / mean floor^2 says how much of
    the mismatch is engine-specific (verl exposes both ``old_log_probs`` and ``log_probs`` on
    the first on-policy mini-batch for this comparison). Measured on the freshest tokens when
    there are enough (policy drift between versions is in delta but not in the floor).
    Always info.
    """
    name = "trainer_noise_floor"
    if not ctx.has("train_logprob_recompute"):
        return _cannot(
            name, "no train_logprob_recompute: trainer self-noise floor unavailable"
        )
    # engine mismatch proper: the freshest tokens (policy drift adds to delta, not floor)
    fl, used = _freshest_rows(ctx.cells.select("_stale", "n", *_FLOOR_COLS), ctx)
    # means over the tokens with a finite recompute, from the cells' sums
    t = fl.select(pl.col(*_FLOOR_COLS).sum()).row(0, named=True)
    r: dict[str, Any] = {"n": int(t["f_n"] or 0)}
    if r["n"]:
        r.update(floor2=t["f_e2"] / r["n"], delta2=t["f_d2"] / r["n"],
                 floor_abs=t["f_ae"] / r["n"], delta_abs=t["f_ad"] / r["n"])
    n = int(r["n"] or 0)
    if n == 0:
        return _cannot(name, "train_logprob_recompute has no finite value on valid tokens")
    f2, d2 = float(r["floor2"]), float(r["delta2"])
    ratio = d2 / f2 if f2 > 0 else float("inf")
    ev = {
        "tokens": n,
        "tokens_selection": used,
        "mean_floor2": _r(f2),
        "mean_delta2": _r(d2),
        "ratio_delta2_to_floor2": _r(ratio),
        "mean_abs_floor": _r(float(r["floor_abs"])),
        "mean_abs_delta": _r(float(r["delta_abs"])),
    }
    if f2 == 0:
        title = "The trainer's recomputation is bit-identical: no self-noise floor"
        msg = (
            f"train_logprob and train_logprob_recompute are identical on {n} tokens ({used}): "
            f"all of the engine-vs-trainer mean delta^2 ({d2:.3g}) is engine-specific (or the "
            "recompute column is a copy)."
        )
    elif ratio < FLOOR_RATIO_AT_FLOOR:
        title = f"Mismatch is at the trainer's self-noise floor ({ratio:.3g}x)"
        msg = (
            f"engine-vs-trainer mean delta^2 ({d2:.3g}, {used}) is only {ratio:.3g}x the "
            f"trainer's own recompute noise ({f2:.3g}): a gate at this scale removes noise the "
            "trainer itself has."
        )
    else:
        title = f"Mismatch is {ratio:.3g}x the trainer's self-noise floor"
        msg = (
            f"engine-vs-trainer mean delta^2 ({d2:.3g}, {used}) is {ratio:.3g}x the trainer's "
            f"own recompute noise ({f2:.3g}): most of the mismatch is engine-specific."
        )
    f = Finding(
        kind=name,
        severity="info",
        title=title,
        message=msg,
        evidence=ev,
        check=(
            "for a ratio near 1: trainer determinism (batch-invariant kernels) before the "
            "engine; for a large ratio: engine precision / kernels vs the trainer's."
        ),
    )
    return _found(f, f"ratio {ratio:.3g} on {used}")


_CHECK_FUNCS: dict[str, Callable[[_Ctx], _Result]] = {
    "misalignment": _check_misalignment,
    "one_sided_temperature": _check_temperature,
    "truncated_sampling": _check_truncation,
    "sequence_outliers": _check_outliers,
    "drift": _check_drift,
    "staleness": _check_staleness,
    "corrupt_rows": _check_corrupt,
    "implausible_logprobs": _check_implausible,
    "unsampled_tokens": _check_unsampled,
    "mask_start_surprisal": _check_mask_start,
    "trainer_noise_floor": _check_floor,
}

# --------------------------------------------------------------------------- plans

_FLOOR_COLS: tuple[str, ...] = ("f_n", "f_e2", "f_d2", "f_ae", "f_ad")
_CELL_COLS: tuple[str, ...] = ("sh", "sd", "sd2", "sad", "nneg")
_BLOCK_COLS: tuple[str, ...] = ("sx", "sy", "sxx", "syy", "sxy")

#: which tables of the token pass each check reads
_NEEDS: dict[str, tuple[str, ...]] = {
    "misalignment": ("lag_sample",),
    "one_sided_temperature": ("cells", "blocks"),
    "truncated_sampling": ("cells", "raw_zero"),
    "sequence_outliers": ("cells", "seqbins", "implausible"),
    "drift": ("cells",),
    "staleness": ("cells",),
    "corrupt_rows": ("raw_bad",),
    "implausible_logprobs": ("cells", "implausible"),
    "unsampled_tokens": ("cells", "unsampled", "seqbins"),
    "mask_start_surprisal": ("mask_start", "seqbins"),
    "trainer_noise_floor": ("cells", "floor"),
}


def _cell_aggs(floor: bool) -> list[pl.Expr]:
    """Sums per (bin, step, staleness) cell (on a batch with the :class:`_Derived` columns);
    with ``floor`` the trainer-floor sums over tokens with a finite recompute."""
    d = pl.col("delta")
    out = [
        pl.col("_h").sum().alias("sh"),
        d.sum().alias("sd"),
        (d * d).sum().alias("sd2"),
        d.abs().sum().alias("sad"),
        (d < 0).sum().cast(pl.Int64).alias("nneg"),
    ]
    if floor:
        e = pl.col("train_logprob") - pl.col("train_logprob_recompute")
        ok = pl.col("train_logprob_recompute").is_finite().fill_null(False)
        out += [
            ok.sum().cast(pl.Int64).alias("f_n"),
            # when/then (null elsewhere, skipped by sum), as the mean over ok tokens
            pl.when(ok).then(e * e).sum().alias("f_e2"),
            pl.when(ok).then(d**2).sum().alias("f_d2"),
            pl.when(ok).then(e.abs()).sum().alias("f_ae"),
            pl.when(ok).then(d.abs()).sum().alias("f_ad"),
        ]
    return out


def _block_aggs() -> list[pl.Expr]:
    x, y = pl.col("train_logprob"), pl.col("infer_logprob")
    return [
        x.sum().alias("sx"),
        y.sum().alias("sy"),
        (x * x).sum().alias("sxx"),
        (y * y).sum().alias("syy"),
        (x * y).sum().alias("sxy"),
    ]


def _sums(cols: Sequence[str]) -> list[pl.Expr]:
    return [pl.col(c).sum() for c in cols]


class MisalignmentPlan:
    """The off-by-one check as accumulators of a token pass (:mod:`entr_diag.passes`).

    ``accumulators``: one :class:`_LagSample` (rows of a hash-sampled subset of sequences,
    at most ~MISALIGN_MAX_TOKENS), or none when this Dataset object's result is already
    known (the CLI's alignment gate, then :func:`run_forensics`). :meth:`finish` joins the
    sample with itself by (seq_key, position +- 1) in memory and returns the finding
    (``critical``) or ``None``, as :func:`detect_misalignment`.
    """

    def __init__(self, ds: Any) -> None:
        self.ds = ds
        self._res = _misalign_cached(ds)
        names = _lf_schema(ds).names()
        with_step = "step" in names
        self._sample = None if self._res is not None else _LagSample(
            _misalign_keep(ds), with_step=with_step, with_file=FILE_INDEX in names,
            with_entropy="entropy" in names)
        self._sums = None if self._res is not None else _LagSums(
            with_step, with_file=FILE_INDEX in names)
        self.accumulators: list[Accumulator] = (
            [] if self._sample is None else [self._sample, self._sums])  # type: ignore[list-item]

    def result(self) -> _Result:
        """(status, finding) after the pass; cached for the Dataset object."""
        if self._res is None:
            assert self._sample is not None
            sample = self._sample.frame(_lf_schema(self.ds))
            self._res = _misalignment(
                sample, self._sample.keep, None if self._sums is None else self._sums.table(),
                _paths(self.ds))
            _misalign_store(self.ds, self._res)
        return self._res

    def finish(self) -> Finding | None:
        return self.result()[1]

    def rounding(self) -> dict[str, float] | None:
        """:func:`rounded_logprobs` of the sampled tokens (after the pass; None when no
        sample was taken, the result being cached)."""
        if self._sample is None:
            return None
        return rounded_logprobs(self._sample.frame(_lf_schema(self.ds)))

    def storage(self, skip: Sequence[str] = ()) -> dict[str, Any] | None:
        """:func:`storage_precision` of the sampled tokens (after the pass; None when no
        sample was taken); ``skip``: columns not judged (rounded to a decimal step)."""
        if self._sample is None:
            return None
        return storage_precision(self._sample.frame(_lf_schema(self.ds)), skip)

    def zero_prefix(self) -> dict[str, Any] | None:
        """:func:`zero_prefixes` of the sampled sequences, naming the input files (after
        the pass; None when no sample was taken)."""
        if self._sample is None:
            return None
        return zero_prefixes(self._sample.frame(_lf_schema(self.ds)),
                             _paths(self.ds))

    def entropy_alignment(self) -> EntropyAlignment | None:
        """:func:`entropy_alignment` of the sampled sequences (after the pass). None when no
        sample was taken (the result being cached), the input has no entropy column, or the
        logprob columns are shifted against each other (the off-by-one finding reports
        that; the entropy is not judged against a shifted surprisal)."""
        if self._sample is None or "entropy" not in self._sample.cols:
            return None
        if self.result()[1] is not None:
            return None
        return entropy_alignment(self._sample.frame(_lf_schema(self.ds)), _paths(self.ds))

    def rounding_by_file(self) -> dict[str, dict[str, float]] | None:
        """The input files whose sampled tokens hold rounded logprobs when the others'
        do not, ``{file: {column: step}}`` (:func:`rounded_logprobs` per file, at least
        ROUNDED_MIN_VALUES values each), else None (one file, every file rounded alike,
        none, or no sample)."""
        files = getattr(self.ds, "files", ())
        if self._sample is None or len(files) < 2:
            return None
        sample = self._sample.frame(_lf_schema(self.ds))
        if FILE_INDEX not in sample.columns:
            return None
        return _rounded_by_file(sample, [str(f.path) for f in files])


def _rounded_by_file(sample: pl.DataFrame, paths: Sequence[str]
                     ) -> dict[str, dict[str, float]] | None:
    """:meth:`MisalignmentPlan.rounding_by_file` on the sample (``FILE_INDEX`` indexes
    ``paths``): :func:`rounded_logprobs` of each file's rows, for all files at once (one
    ``bincount`` per column and step: a loop over 2000 files' parts took 3 s); the files in
    order of their first sampled row."""
    fi = sample.get_column(FILE_INDEX).to_numpy().astype(np.int64)
    n_f = int(fi.max()) + 1 if fi.size else 0
    _, first = np.unique(fi, return_index=True)
    order = [int(fi[j]) for j in np.sort(first)]  # files by first appearance
    checked = np.zeros(n_f, dtype=bool)
    steps: dict[str, np.ndarray] = {}
    for col in ("train_logprob", "infer_logprob"):
        if col not in sample.columns:
            continue
        xs = sample.get_column(col).cast(pl.Float64)
        keep = (xs.is_finite() & (xs != 0) & (xs > IMPLAUSIBLE_LOGPROB)).fill_null(False)
        keep = keep.to_numpy()
        x, f = xs.to_numpy()[keep], fi[keep]
        # a file's values as rounded_logprobs takes them: its own, in order, an evenly
        # strided subsample of at most ROUNDED_MAX_VALUES
        n_val = np.bincount(f, minlength=n_f)
        checked |= np.bincount(f, weights=np.abs(x) >= 0.5, minlength=n_f) >= ROUNDED_MIN_VALUES
        o = np.argsort(f, kind="stable")
        rank = np.empty(f.size, dtype=np.int64)
        rank[o] = np.arange(f.size) - np.repeat(np.cumsum(n_val) - n_val, n_val)
        stride = np.maximum(1, -(-n_val // ROUNDED_MAX_VALUES))
        sub = rank % stride[f] == 0
        x, f = x[sub], f[sub]
        step_of = np.full(n_f, np.nan)
        for step in ROUNDING_STEPS:
            y = x / step
            big = np.abs(y) >= 0.5
            on = np.abs(y - np.round(y)) <= 1e-3 + np.abs(y) * 2.5e-7
            n_big = np.bincount(f, weights=big, minlength=n_f)
            n_on = np.bincount(f, weights=big & on, minlength=n_f)
            with np.errstate(invalid="ignore", divide="ignore"):
                hit = (n_big >= ROUNDED_MIN_VALUES) & (n_on / n_big >= ROUNDED_SHARE)
            step_of = np.where(np.isnan(step_of) & hit, step, step_of)
        steps[col] = step_of
    found: dict[str, dict[str, float]] = {}
    for i in order:
        r = {c: float(v[i]) for c, v in steps.items() if np.isfinite(v[i])}
        if r:
            found[paths[i]] = r
    return found if found and len(found) < int(checked.sum()) else None


#: decimal steps a logprob column may have been rounded to, coarsest first (nats)
ROUNDING_STEPS: tuple[float, ...] = (1.0, 0.1, 0.01, 0.001)
#: a column counts as rounded to a step when this share of its non-zero values lies on it
ROUNDED_SHARE = 0.9
#: ... of at least this many non-zero values
ROUNDED_MIN_VALUES = 200
#: ... judged on an evenly strided subsample of at most this many values
ROUNDED_MAX_VALUES = 400_000


def _even_subsample(x: np.ndarray) -> np.ndarray:
    """An evenly strided subsample of ``x`` of at most ROUNDED_MAX_VALUES values."""
    return x[::max(1, -(-x.size // ROUNDED_MAX_VALUES))]


def _nonzero_logprobs(sample: pl.DataFrame, col: str) -> np.ndarray:
    """The finite non-zero values of a logprob column of ``sample`` (none without it),
    without impossible ones (at or below IMPLAUSIBLE_LOGPROB: placeholders such as -300.0,
    which implausible_logprobs reports, are whole numbers but say nothing of rounding)."""
    if col not in sample.columns:
        return np.zeros(0)
    x = sample.get_column(col).cast(pl.Float64)
    return x.filter(x.is_finite() & (x != 0) & (x > IMPLAUSIBLE_LOGPROB)).to_numpy()


@dataclass(frozen=True)
class EntropyAlignment:
    """Result of :func:`entropy_alignment`: is the entropy column shifted against the
    logprob columns?

    ``status``: ``"shifted"`` (``best_lag`` fits clearly better than lag 0), ``"no_shift"``
    (no lag does), ``"unrelated"`` (the surprisal ranks with the entropy at no lag: a
    per-sequence value repeated on its tokens, rows from other tokens), ``"surprisal"``
    (the column is the surprisal itself) or ``"cannot_tell"`` (``reason`` says why); ``reason``: one sentence with
    the numbers. ``rank_corr``: lag -> correlation of the ranks of the surprisal
    -infer_logprob[t] and entropy[t + lag] over the tokens with a partner at that lag (lag 0:
    all tokens read); ``gap``: lag -> rank_corr[lag] minus the lag-0 correlation on the same
    tokens; ``pairs``: lag -> tokens with a partner at that lag. ``best_lag`` L (None
    unless shifted) means entropy[t] holds the entropy of token t - L; ``gap_halves``: the
    gap at ``best_lag`` in each half of the sampled sequences (by hash). ``files``: for a
    shift found in some input files only, path -> lag (None otherwise). ``tokens``,
    ``sequences``: what was read.
    """

    status: str
    reason: str
    rank_corr: dict[int, float] = field(default_factory=dict)
    gap: dict[int, float] = field(default_factory=dict)
    pairs: dict[int, int] = field(default_factory=dict)
    best_lag: int | None = None
    gap_halves: tuple[float, float] | None = None
    files: dict[str, int] | None = None
    input_files: int = 1
    tokens: int = 0
    sequences: int = 0
    #: status "surprisal": the logprob column whose surprisal the entropy column equals,
    #: and on which share of the sampled tokens (:func:`_entropy_is_surprisal`)
    surprisal_column: str | None = None
    surprisal_share: float | None = None
    #: a shift found in these steps only (:func:`_entropy_shift_in_steps`), else None
    steps: tuple[int, ...] | None = None

    @property
    def shifted(self) -> bool:
        return self.status == "shifted"

    def to_dict(self) -> dict:
        return {
            "status": self.status, "reason": self.reason,
            "lags_tested": sorted(self.rank_corr),
            "rank_corr": {str(k): _r(v) for k, v in sorted(self.rank_corr.items())},
            "gap_vs_lag0": {str(k): _r(v) for k, v in sorted(self.gap.items())},
            "pairs": {str(k): v for k, v in sorted(self.pairs.items())},
            "best_lag": self.best_lag,
            # entropy[t] holds the entropy of token t + entropy_offset
            "entropy_offset": None if self.best_lag is None else -self.best_lag,
            "gap_halves": None if self.gap_halves is None else [_r(g) for g in self.gap_halves],
            "files": self.files, "input_files": self.input_files,
            "tokens": self.tokens, "sequences": self.sequences,
            "steps": None if self.steps is None else list(self.steps),
            "surprisal_column": self.surprisal_column,
            "surprisal_share": None if self.surprisal_share is None
            else _r(self.surprisal_share),
        }


def _corr_from_sums(n, sx, sy, sxx, syy, sxy) -> float:
    """Pearson correlation from its sums (NaN when a side is constant or n < 3)."""
    if n < 3:
        return math.nan
    vx, vy = sxx - sx * sx / n, syy - sy * sy / n
    if vx <= 1e-15 * n or vy <= 1e-15 * n:
        return math.nan
    return float((sxy - sx * sy / n) / math.sqrt(vx * vy))


#: the entropy column holds the sampled token's surprisal when it equals -infer_logprob or
#: -train_logprob (to 1e-6 relative) on this share of the sampled tokens whose surprisal is
#: above 1e-3 nats or more (an entropy equals its token's surprisal only by chance)
SURPRISAL_SHARE = 0.5


def _entropy_is_surprisal(sample: pl.DataFrame) -> EntropyAlignment | None:
    """``status "surprisal"`` when the entropy column equals the sampled token's surprisal
    (-infer_logprob or -train_logprob, nats) on SURPRISAL_SHARE of the sampled tokens whose
    surprisal is above 1e-3 nats (100 of them at least), else None: the column then holds
    -logprob of the sampled token, not the entropy of the distribution it was sampled from,
    and the law would regress delta^2 on a function of the logprobs themselves."""
    H = pl.col("entropy").cast(pl.Float64)
    best = None
    for c in ("infer_logprob", "train_logprob"):
        if c not in sample.columns:
            continue
        s = -pl.col(c).cast(pl.Float64)
        d = sample.select(((H - s).abs() <= 1e-6 * (1 + s)).alias("eq"), s.alias("s")).filter(
            pl.col("s").is_finite() & (pl.col("s") > 1e-3) & pl.col("eq").is_not_null())
        if d.height >= 100:
            share = float(d["eq"].mean())
            if share >= SURPRISAL_SHARE and (best is None or share > best[1]):
                best = (c, share, d.height)
    if best is None:
        return None
    c, share, n = best
    return EntropyAlignment(
        "surprisal", f"the entropy column equals the sampled token's surprisal -{c} on "
        f"{share:.1%} of {n:,} sampled tokens (surprisal above 1e-3 nats)", tokens=n,
        surprisal_column=c, surprisal_share=share)


#: entropy alignment: with no shift found pooled or per file, the sampled steps are cut into
#: at most this many contiguous blocks, each tested on its own (a dump slip from some step
#: on, e.g. after a resume with other code); the blocks shifted alike are then tested together
ENTROPY_ALIGN_STEP_BLOCKS = 8


def _at_most_entropy_tokens(df: pl.DataFrame) -> pl.DataFrame:
    """``df`` cut to about ENTROPY_ALIGN_MAX_TOKENS rows of whole sequences, by a hash of
    seq_key other than the sampling's; as it is when no larger."""
    if df.height <= ENTROPY_ALIGN_MAX_TOKENS:
        return df
    keep = max(1, int(1000 * ENTROPY_ALIGN_MAX_TOKENS / df.height))
    return df.filter((pl.col("seq_key") // 1000) % 1000 < keep)


def _entropy_shift_in_steps(sample: pl.DataFrame) -> EntropyAlignment | None:
    """:func:`entropy_alignment` per block of consecutive steps (ENTROPY_ALIGN_STEP_BLOCKS
    at most, on at most ENTROPY_ALIGN_MAX_TOKENS tokens of whole sequences in all): when
    some blocks read shifted, the same lag for most of them, those blocks are tested
    together, and the result, shifted at that lag, is returned with their ``steps``; None
    otherwise (one step, no step column, or no block shifted)."""
    if "step" not in sample.columns:
        return None
    sample = _at_most_entropy_tokens(sample)  # (the pooled test's sequences)
    steps = np.sort(sample.get_column("step").drop_nulls().unique().to_numpy())
    if steps.size < 2:
        return None
    blocks = [b.tolist() for b in np.array_split(steps, min(ENTROPY_ALIGN_STEP_BLOCKS,
                                                             steps.size))]
    hit = [(b, r.best_lag) for b in blocks
           if (r := entropy_alignment(sample.filter(pl.col("step").is_in(b)), (),
                                      _by_steps=False)).shifted]
    if not hit:
        return None
    lags = [L for _, L in hit]
    lag = max(set(lags), key=lambda L: (lags.count(L), -abs(L or 0)))
    shifted = sorted(int(s) for b, L in hit if L == lag for s in b)
    r = entropy_alignment(sample.filter(pl.col("step").is_in(shifted)), (), _by_steps=False)
    if not r.shifted or r.best_lag != lag:
        return None
    return dataclasses.replace(r, steps=tuple(shifted))


def entropy_alignment(sample: pl.DataFrame, files: Sequence[str] = (),
                      _by_steps: bool = True) -> EntropyAlignment:
    """Is the entropy column shifted by 1 to 3 tokens against the logprob columns?

    ``sample``: rows of whole sequences (the shift test's sample, :class:`_LagSample`, with
    ``seq_key``, ``position``, ``infer_logprob`` in nats, ``entropy`` in nats, and
    FILE_INDEX for the per-file test; any row order); ``files``: the input files by
    FILE_INDEX. At most about ENTROPY_ALIGN_MAX_TOKENS tokens are read (whole sequences by
    hash). Raises nothing: a column missing gives ``cannot_tell``.

    Signature: the entropy of the distribution a token is sampled from is its expected
    surprisal, E[-infer_logprob[t] | H[t]] = H[t] (METHOD.md; exact for the engine's own
    entropy, monotone under a temperature or a top-k / top-p cut), so the surprisal ranks
    with the entropy at its own position far better than with its neighbours' (which
    share only the slow drift of entropy along a sequence). With entropy[t] holding the
    entropy of token t - L (``entropys[:, 1:]`` against ``[:, :-1]``, logits not shifted
    against labels, a prompt/BOS offset), entropy[t + L] fits best. The measure is the
    correlation of ranks (Spearman's rho: ranks over all the tokens read, average ranks for
    ties, the Pearson correlation of the ranks over each lag's pairs, from sums per half and
    file), robust to the scale of either column. Pairs are consecutive positions of one
    sequence; tokens with a non-finite or implausible (<= IMPLAUSIBLE_LOGPROB) logprob, or
    a non-finite or negative entropy, are left out.

    ``shifted`` when a lag L != 0 with ENTROPY_ALIGN_MIN_PAIRS pairs beats lag 0 on the
    same tokens by ENTROPY_ALIGN_GAP, has a rank correlation of ENTROPY_ALIGN_MIN_RHO, and
    does both in each half of the sampled sequences (a quarter of the pairs each), pooled,
    else in some input files on their own tokens (``files``). ``cannot_tell`` with fewer
    pairs, with a half too small, or with a constant column.
    """
    need = ("seq_key", "position", "infer_logprob", "entropy")
    missing = [c for c in need if c not in sample.columns]
    if missing:
        return EntropyAlignment("cannot_tell", f"no {', '.join(missing)} column in the sample")
    il, H = pl.col("infer_logprob").cast(pl.Float64), pl.col("entropy").cast(pl.Float64)
    surprisal = _entropy_is_surprisal(sample)
    if surprisal is not None:
        return surprisal
    by_file = len(files) > 1 and FILE_INDEX in sample.columns
    cols = [*need, *([FILE_INDEX] if by_file else [])]
    d = sample.select(cols).filter(il.is_finite() & (il > IMPLAUSIBLE_LOGPROB)
                                   & H.is_finite() & (H >= 0))
    d = _by_sequence_order(_at_most_entropy_tokens(d)).collect()
    n = d.height
    lags = [L for a in ENTROPY_ALIGN_LAGS for L in (-a, a)]
    if n < 3:
        return EntropyAlignment("cannot_tell", f"only {n} token(s) with a valid infer_logprob "
                                f"and entropy were sampled (need {ENTROPY_ALIGN_MIN_PAIRS} "
                                "with a neighbour)", tokens=n)
    sk = column(d, "seq_key")
    pos = column(d, "position").astype(np.int64)
    x = (-d.get_column("infer_logprob").cast(pl.Float64)).rank("average").to_numpy()
    y = d.get_column("entropy").cast(pl.Float64).rank("average").to_numpy()
    x = (x - (n + 1) / 2) / n  # ranks centred and scaled: sums of squares stay small
    y = (y - (n + 1) / 2) / n
    half = ((sk // 1000) % 2).astype(np.int64)
    fidx = column(d, FILE_INDEX).astype(np.int64) if by_file else np.zeros(n, dtype=np.int64)
    n_files = int(fidx.max()) + 1
    g = fidx * 2 + half
    n_groups = 2 * n_files
    sequences = int(1 + np.count_nonzero(sk[1:] != sk[:-1]))

    # per-group sums by np.add.reduceat over the rows ordered by group (a few groups:
    # 2 per input file; boolean gathers and bincounts cost 4x more)
    order = np.argsort(g, kind="stable")
    present, starts = np.unique(g[order], return_index=True)
    xo, yo = x[order], y[order]

    def sums(m: np.ndarray, yl: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """((groups, 6), (groups, 6)): n, sx, sy, sxx, syy, sxy of (x, ``yl``) and of
        (x, y) over the rows in ``m``, per group (0 for a group without rows)."""
        mo, ylo = m[order].astype(np.float64), yl[order]
        xm = xo * mo
        rows = np.stack([mo, xm, ylo * mo, xm * xo, ylo * ylo * mo, xm * ylo,
                         yo * mo, yo * yo * mo, xm * yo])
        red = np.add.reduceat(rows, starts, axis=1)
        out = np.zeros((9, n_groups))
        out[:, present] = red
        return out[:6].T, out[[0, 1, 6, 3, 7, 8]].T

    # per lag: sums of (x, y shifted) and of (x, y) on the same tokens (lag 0 there)
    table: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    s0 = sums(np.ones(n, dtype=bool), y)[0]
    for L in lags:
        k = abs(L)
        m = np.zeros(n, dtype=bool)
        yl = np.zeros(n)
        if L > 0:  # token t pairs with entropy[t + k]
            m[:-k] = (sk[k:] == sk[:-k]) & (pos[k:] == pos[:-k] + k)
            yl[:-k] = y[k:]
        else:
            m[k:] = (sk[k:] == sk[:-k]) & (pos[k:] == pos[:-k] + k)
            yl[k:] = y[:-k]
        table[L] = sums(m, yl)

    def corr(rows: np.ndarray) -> float:
        return _corr_from_sums(*rows)

    def judge(sel: np.ndarray) -> tuple[int | None, dict, dict, dict, tuple | None, str]:
        """The test on the groups ``sel`` (bool, per group): (best lag or None, rho, gap,
        pairs, gap per half at the best lag, why not)."""
        rho: dict[int, float] = {0: corr(s0[sel].sum(0))}
        gap: dict[int, float] = {}
        pairs: dict[int, int] = {}
        for L in lags:
            sl, s0l = table[L][0][sel].sum(0), table[L][1][sel].sum(0)
            pairs[L] = int(sl[0])
            rho[L] = corr(sl)
            gap[L] = rho[L] - corr(s0l)
        judged = [L for L in lags if pairs[L] >= ENTROPY_ALIGN_MIN_PAIRS
                  and math.isfinite(gap[L])]
        if not judged:
            why = ("a column is constant on the sampled tokens"
                   if max(pairs.values()) >= ENTROPY_ALIGN_MIN_PAIRS else
                   f"only {max(pairs.values()):,} tokens have a neighbour at the next position "
                   f"in their sequence (need {ENTROPY_ALIGN_MIN_PAIRS:,})")
            return None, rho, gap, pairs, None, why
        best = max(judged, key=lambda L: (gap[L], -abs(L)))
        if gap[best] < ENTROPY_ALIGN_GAP or rho[best] < ENTROPY_ALIGN_MIN_RHO:
            return None, rho, gap, pairs, None, ""
        halves = []
        for h in (0, 1):
            hs = sel & (np.arange(n_groups) % 2 == h)
            sl, s0l = table[best][0][hs].sum(0), table[best][1][hs].sum(0)
            if sl[0] < ENTROPY_ALIGN_MIN_PAIRS / 4:
                return None, rho, gap, pairs, None, (
                    f"lag {best:+d} fits better (rank correlation {rho[best]:.3f} against "
                    f"{rho[best] - gap[best]:.3f} at lag 0) but half of the sampled sequences "
                    f"hold only {int(sl[0]):,} of its pairs (need "
                    f"{ENTROPY_ALIGN_MIN_PAIRS // 4:,}): too few sequences to confirm it")
            halves.append(corr(sl) - corr(s0l))
        if not all(math.isfinite(v) and v >= ENTROPY_ALIGN_GAP for v in halves):
            return None, rho, gap, pairs, (halves[0], halves[1]), ""
        return best, rho, gap, pairs, (halves[0], halves[1]), ""

    every = np.ones(n_groups, dtype=bool)
    best, rho, gap, pairs, halves, why = judge(every)
    common = {"input_files": len(files) if by_file else 1, "tokens": n,
              "sequences": sequences}
    if best is not None:
        return EntropyAlignment(
            "shifted", f"the surprisal ranks with entropy[t{best:+d}] (rank correlation "
            f"{rho[best]:.3f}) better than with entropy[t] ({rho[best] - gap[best]:.3f})",
            rho, gap, pairs, best, halves, **common)
    if why:
        return EntropyAlignment("cannot_tell", why, rho, gap, pairs, **common)
    top = max(abs(v) for v in rho.values() if math.isfinite(v)) if any(
        math.isfinite(v) for v in rho.values()) else math.nan
    if (math.isfinite(top) and top < ENTROPY_ALIGN_UNRELATED_RHO
            and n >= ENTROPY_ALIGN_MIN_PAIRS and sequences >= ENTROPY_ALIGN_MIN_SEQS):
        return EntropyAlignment(
            "unrelated", f"the surprisal does not rank with the entropy column at any lag "
            f"(rank correlation {rho[0]:.3f} at lag 0, at most {top:.3f} in absolute value at "
            f"lags 0 to +-{max(ENTROPY_ALIGN_LAGS)}, where a token's own entropy gives 0.4 "
            "to 0.99)", rho, gap, pairs, **common)
    if by_file:  # some input files only (e.g. the steps dumped by another version)
        found: dict[int, int] = {}
        for f in range(n_files):
            sel = np.arange(n_groups) // 2 == f
            b = judge(sel)[0]
            if b is not None:
                found[f] = b
        if found:
            lag = max(set(found.values()), key=lambda L: (list(found.values()).count(L), -abs(L)))
            sel = np.isin(np.arange(n_groups) // 2, [f for f, b in found.items() if b == lag])
            _, rf, gf, pf, hf, _ = judge(sel)
            return EntropyAlignment(
                "shifted", f"in {len(found)} of {len(files)} input files, the surprisal ranks "
                f"with entropy[t{lag:+d}] (rank correlation {rf[lag]:.3f}) better than with "
                f"entropy[t] ({rf[lag] - gf[lag]:.3f})",
                rf, gf, pf, lag, hf,
                files={files[f]: b for f, b in sorted(found.items()) if f < len(files)},
                **common)
    in_steps = _entropy_shift_in_steps(sample) if _by_steps else None
    if in_steps is not None:  # some steps only (the numbers, tokens and sequences of those)
        return dataclasses.replace(
            in_steps, reason=f"in {len(in_steps.steps or ()):,} of the sampled steps, "
            + in_steps.reason, input_files=common["input_files"])
    near = max((L for L in lags if pairs[L] >= ENTROPY_ALIGN_MIN_PAIRS),
               key=lambda L: (gap[L], -abs(L)))
    return EntropyAlignment(
        "no_shift", f"no shift: rank correlation {rho[0]:.3f} at lag 0; the nearest lag, "
        f"{near:+d}, {rho[near]:.3f}, {gap[near]:+.3f} against lag 0 on the same tokens "
        f"(a shift needs +{ENTROPY_ALIGN_GAP:g})", rho, gap, pairs, **common)


def rounded_logprobs(sample: pl.DataFrame) -> dict[str, float] | None:
    """Logprob columns stored rounded to a decimal step: ``{column: step}`` for each of
    ``train_logprob`` / ``infer_logprob`` whose non-zero finite values lie on a grid of
    ROUNDING_STEPS (the coarsest that holds ROUNDED_SHARE of them, of at least
    ROUNDED_MIN_VALUES values; judged on an evenly strided subsample of at most
    ROUNDED_MAX_VALUES), else None. Input: tokens of the canonical frame (the
    misalignment check's sample). A value lies on the grid of step s when x / s is within
    1e-3 plus float32's rounding error of an integer: an unrounded column has a few tenths
    of a percent of its values there. Rounded logprobs (floats written with round(x, 2),
    or a text dump) lose every log-ratio below the step: the low-entropy regime's
    |delta| of 1e-3 becomes 0 or the step, whatever the fit says."""
    out: dict[str, float] = {}
    for col in ("train_logprob", "infer_logprob"):
        x = _nonzero_logprobs(sample, col)
        x = _even_subsample(x)  # an even subsample decides
        for step in ROUNDING_STEPS:
            # a value rounded to the step and not 0 is at least the step away from 0: the
            # values closer than half a step (e.g. probabilities below 1e-4 taken for
            # logprobs) say nothing of the grid
            y = x / step
            y = y[np.abs(y) >= 0.5]
            if y.size < ROUNDED_MIN_VALUES:
                continue
            tol = 1e-3 + np.abs(y) * 2.5e-7  # float32 keeps 24 bits: ~1.2e-7 relative
            if np.mean(np.abs(y - np.round(y)) <= tol) >= ROUNDED_SHARE:
                out[col] = step
                break
    return out or None


#: binary storage formats a logprob column may hold its values in (every value exactly
#: representable), finest last: name -> explicit mantissa bits (the spacing of the grid
#: near x is 2^(floor(log2 |x|) - bits): |x| * 2^-8 to 2^-7 in bf16)
STORAGE_FORMATS: dict[str, int] = {"bf16": 7, "fp16": 10}
#: the rounding to a storage format is said to distort the law when its estimated share of
#: mean delta^2 reaches this in one of the entropy deciles (logprobs of a real bf16 run
#: stored in bf16 on both sides: 38% in the lowest decile, 22% in the highest, the law's
#: verdict turned from "does not hold" (alpha 1.12) to "holds" (0.96); stored in fp16, or
#: the engine's side alone in bf16 as vLLM returns them on the bundled run: at most 12%)
STORAGE_SHARE_MIN = 0.2
#: the storage format is judged on the values of |logprob| at or above this (nats): near 0
#: a float32 log-softmax (logit - logsumexp) holds few significant bits unrounded
STORAGE_LP_MIN = 0.1


def _on_storage_grid(x: np.ndarray, fmt: str) -> np.ndarray:
    """Whether each value of ``x`` (float64) is exactly representable in ``fmt``
    (:data:`STORAGE_FORMATS`): a float32 whose low 16 bits are 0 for bf16; a value that
    survives a round trip through float16 for fp16."""
    if fmt == "bf16":
        f32 = x.astype(np.float32)
        return (f32.astype(np.float64) == x) & ((f32.view(np.uint32) & 0xFFFF) == 0)
    with np.errstate(over="ignore", invalid="ignore"):
        return x.astype(np.float16).astype(np.float64) == x


def _grid_spacing(x: np.ndarray, bits: int) -> np.ndarray:
    """The spacing of a binary grid of ``bits`` explicit mantissa bits at each value of
    ``x``: 2^(floor(log2 |x|) - bits); 0 at x = 0."""
    ax = np.abs(x)
    with np.errstate(divide="ignore"):
        e = np.floor(np.log2(np.where(ax > 0, ax, 1.0)))
    return np.where(ax > 0, np.exp2(e - bits), 0.0)


def storage_precision(sample: pl.DataFrame, skip: Sequence[str] = ()) -> dict[str, Any] | None:
    """Logprob columns stored in a binary format coarser than float32 (bf16 or fp16), and
    how much of mean delta^2 the rounding to it makes up, else None.

    A column counts as stored in a format (:data:`STORAGE_FORMATS`, the coarsest first)
    when ROUNDED_SHARE of its non-zero finite values (at least ROUNDED_MIN_VALUES, on an
    evenly strided subsample of at most ROUNDED_MAX_VALUES) are exactly representable in it
    (an unrounded float32 column: 1 value in 65,536 for bf16, 1 in 8,192 for fp16).
    Rounding to a grid of spacing s adds an error uniform on [-s/2, s/2] of variance
    s^2/12 to the column (for a log-ratio wider than s; narrower ones read as 0 or +-s,
    their mean square s |delta|). Per token, the rounding's share of delta^2 is estimated
    as the sum over the stored columns of s^2/12 over the sample's mean delta^2, by
    entropy decile (by entropy as the column reads) when the sample has entropy: s grows
    with |logprob|, so the high-entropy tokens, and the low-entropy ones whose delta is
    tiny, take most. From STORAGE_SHARE_MIN in one decile, ``distorts`` is True.

    Args:
        sample: tokens of the canonical frame (the misalignment check's sample) with
            ``train_logprob``, ``infer_logprob`` and optionally ``entropy``.
        skip: columns not judged (e.g. those rounded to a decimal step).

    Returns: ``{"columns": {column: format}, "share_pooled": float, "by_entropy":
    [{"h_lo", "h_hi", "tokens", "share"}], "max_share": float, "distorts": bool}``
    (``by_entropy`` empty without an entropy column; ``max_share`` then the pooled one).
    """
    cols: dict[str, str] = {}
    for col in ("train_logprob", "infer_logprob"):
        if col in skip:
            continue
        x = _nonzero_logprobs(sample, col)
        # (near 0 a float32 logit - logsumexp holds few significant bits: a multiple of
        # ulp(lse), 2^-19 for lse in [16, 32), below 5e-4 is on the bf16 grid unrounded)
        x = _even_subsample(x[np.abs(x) >= STORAGE_LP_MIN])
        if x.size < ROUNDED_MIN_VALUES:
            continue
        for fmt in STORAGE_FORMATS:
            if np.mean(_on_storage_grid(x, fmt)) >= ROUNDED_SHARE:
                cols[col] = fmt
                break
    if not cols or not {"train_logprob", "infer_logprob"} <= set(sample.columns):
        return None
    lp = {c: sample.get_column(c).cast(pl.Float64).to_numpy() for c in
          ("train_logprob", "infer_logprob")}
    d2 = (lp["train_logprob"] - lp["infer_logprob"]) ** 2
    ex = sum(_grid_spacing(lp[c], STORAGE_FORMATS[f]) ** 2 / 12.0 for c, f in cols.items())
    ok = np.isfinite(d2) & np.isfinite(ex)
    h = (sample.get_column("entropy").cast(pl.Float64).to_numpy()
         if "entropy" in sample.columns else None)
    if h is not None:  # (below the law's range, H < H_MIN, no law to distort)
        ok &= np.isfinite(h) & (h >= H_MIN)
        h = h[ok]
    d2, ex = d2[ok], ex[ok]
    if d2.size == 0:
        return None

    def share(m: np.ndarray | slice) -> float:
        # (no mismatch at all: NaN, no share to tell; counted in no maximum)
        den = float(d2[m].sum())
        return float(ex[m].sum()) / den if den > 0 else math.nan

    by_h: list[dict[str, Any]] = []
    if h is not None and h.size >= 10 * ROUNDED_MIN_VALUES:
        order = np.argsort(h, kind="stable")
        for part in np.array_split(order, 10):
            by_h.append({"h_lo": _r(h[part[0]]), "h_hi": _r(h[part[-1]]),
                         "tokens": int(part.size), "share": _r(share(part))})
    pooled = share(slice(None))
    top = max([b["share"] for b in by_h if math.isfinite(b["share"])]
              or [pooled if math.isfinite(pooled) else 0.0])
    return {"columns": cols, "share_pooled": _r(pooled), "by_entropy": by_h,
            "max_share": _r(top), "distorts": bool(top >= STORAGE_SHARE_MIN)}


class _BinTotals:
    """Every valid token's count and sums of H and delta^2 by forensic entropy bin
    (:func:`_bin_expr`, computed by the engine), by ``bincount``: the ``cells`` of
    :func:`_implausible` for a command that runs no forensics."""

    columns = ("entropy", "delta")

    def __init__(self, has_entropy: bool) -> None:
        self.has_entropy = has_entropy
        self.exprs = ([_bin_expr().fill_null(-1).alias(_FX + "itot_bin")] if has_entropy
                      else [])
        self.sums = np.zeros((3, N_BINS))
        self.no_bin = np.zeros(2)  # n, sum delta^2 of tokens without an entropy bin

    def update(self, batch: pl.DataFrame) -> None:
        d = column(batch, "delta").astype(np.float64)
        d2 = d * d
        if not self.has_entropy:
            self.no_bin += (d.size, d2.sum())
            return
        b = column(batch, _FX + "itot_bin").astype(np.int64)
        ok = b >= 0
        if not ok.all():
            self.no_bin += (int((~ok).sum()), d2[~ok].sum())
            b, d2 = b[ok], d2[ok]
            h = column(batch, "entropy")[ok]
        else:
            h = column(batch, "entropy")
        for i, w in enumerate((None, h.astype(np.float64), d2)):
            self.sums[i] += np.bincount(b, weights=w, minlength=N_BINS)

    def table(self) -> pl.DataFrame:
        bins = np.flatnonzero(self.sums[0])
        t = pl.DataFrame({"bin": bins.astype(np.int32), "n": self.sums[0, bins],
                          "sh": self.sums[1, bins], "sd2": self.sums[2, bins]})
        if self.no_bin[0]:
            t = pl.concat([t, pl.DataFrame({"bin": [None], "n": [self.no_bin[0]],
                                            "sh": [0.0], "sd2": [self.no_bin[1]]},
                                           schema=t.schema)])
        return t


class ImplausiblePlan:
    """The implausible-logprobs check alone, for a command that runs no forensics
    (``compare``): ``accumulators`` join the fit's pass (they look for tokens at or below
    IMPLAUSIBLE_LOGPROB: a minimum per side per batch); only when some were found,
    :meth:`followup` returns the per-bin totals the finding compares them with, for a
    later pass (the gate comparison's second); then :meth:`finish` returns the
    ``implausible_logprobs`` finding (None when no token was flagged), as the forensics
    report it (:func:`_check_implausible`)."""

    def __init__(self, ds: Any) -> None:
        names = _lf_schema(ds).names()
        self.has_entropy = "entropy" in names
        self.files = _paths(ds)
        self.tokens = _ImplausibleTokens()
        self.accumulators: list[Accumulator] = [self.tokens]  # type: ignore[list-item]
        self._totals: _BinTotals | None = None

    def flagged(self) -> bool:
        """Whether the pass found a token at or below IMPLAUSIBLE_LOGPROB."""
        return bool(self.tokens.seqs.result().height)

    def followup(self) -> list[Accumulator]:
        if self._totals is None and self.flagged():
            self._totals = _BinTotals(self.has_entropy)
            return [self._totals]  # type: ignore[list-item]
        return []

    def finish(self) -> Finding | None:
        if self._totals is None:
            return None
        return _implausible(self.tokens, self._totals.table(), self.has_entropy,
                            self.files)[1]


#: a sequence "begins with zeros" when at least this many of its first tokens have
#: train_logprob, infer_logprob and entropy all exactly 0.0 (:func:`zero_prefixes`)
ZERO_PREFIX_MIN: int = 2
#: ... and an input file is flagged when at least this share of its sampled sequences do
ZERO_PREFIX_SHARE: float = 0.2
#: ... and at least this many
ZERO_PREFIX_MIN_SEQS: int = 5


def zero_prefixes(sample: pl.DataFrame, files: Sequence[str] = ()) -> dict[str, Any] | None:
    """Sequences that begin with tokens whose logprobs (and entropy, when the sample has
    it) are all exactly 0.0: a loss mask that covers the prompt or padding written as
    zeros (a near-certain token may have an exact 0.0 on one side, seldom on both with
    an entropy of exactly 0, and not at the start of many sequences). Such tokens are
    valid to the loader (no exclusion reason: both sides agree) and enter the fit at
    H = 0 with delta = 0, where they hide the low-entropy regime.

    ``sample``: whole sequences (the shift test's hash-sampled ones: ``seq_key``,
    ``position``, both logprobs, optionally ``entropy`` and FILE_INDEX); ``files`` the
    input files by FILE_INDEX. A sequence counts when its first ZERO_PREFIX_MIN or more
    tokens (by position) are such zeros; an input file is flagged when ZERO_PREFIX_MIN_SEQS
    and ZERO_PREFIX_SHARE of its sampled sequences count. Returns None when no file is
    flagged, else ``{"sequences", "sequences_sampled", "tokens", "tokens_sampled",
    "median_length", "whole_sequences", "columns", "files" (path -> flagged sequences,
    with several input files), "input_files"}`` over the flagged files' sampled
    sequences (``whole_sequences``: those that are zeros throughout)."""
    cols = [c for c in ("train_logprob", "infer_logprob", "entropy") if c in sample.columns]
    if len(cols) < 2 or not sample.height:
        return None
    z = pl.all_horizontal([pl.col(c) == 0 for c in cols]).fill_null(False)
    # cheap first: too few exact zeros for ZERO_PREFIX_MIN_SEQS sequences
    if int(sample.select(z.sum()).item()) < ZERO_PREFIX_MIN * ZERO_PREFIX_MIN_SEQS:
        return None
    fcol = FILE_INDEX if FILE_INDEX in sample.columns else None
    per = (_by_sequence_order(sample)
           .with_columns(z.cast(pl.Int32).cum_min().over("seq_key").alias("_lead"))
           .group_by("seq_key")
           .agg(pl.col("_lead").sum().alias("lead"), pl.len().alias("n"),
                *([pl.col(fcol).min().alias("file")] if fcol else [pl.lit(0).alias("file")]))
           .with_columns((pl.col("lead") >= ZERO_PREFIX_MIN).alias("hit"))
           .collect())
    by_file = per.group_by("file").agg(pl.col("hit").sum().alias("hits"),
                                       pl.len().alias("seqs"))
    flagged = by_file.filter((pl.col("hits") >= ZERO_PREFIX_MIN_SEQS)
                             & (pl.col("hits") >= ZERO_PREFIX_SHARE * pl.col("seqs")))
    if not flagged.height:
        return None
    mine = per.filter(pl.col("file").is_in(flagged["file"].implode()))
    hit = mine.filter(pl.col("hit"))
    out: dict[str, Any] = {
        "sequences": hit.height, "sequences_sampled": mine.height,
        "tokens": int(hit["lead"].sum()), "tokens_sampled": int(mine["n"].sum()),
        "median_length": float(hit["lead"].median()),
        "whole_sequences": int((hit["lead"] == hit["n"]).sum()), "columns": cols,
    }
    if len(files) > 1 and fcol:
        out["files"] = {files[int(i)]: int(n) for i, n in
                        flagged.sort("file").select("file", "hits").iter_rows()
                        if i is not None and 0 <= int(i) < len(files)}
        out["input_files"] = len(files)
    return out


def misalignment_plan(ds: Any) -> MisalignmentPlan:
    """The plan of :func:`detect_misalignment`: run ``plan.accumulators`` in a pass over
    ``ds.lf`` (alone or fused), then ``plan.finish()``."""
    ds = dataset(ds, "misalignment_plan")
    return MisalignmentPlan(ds)


class ForensicsPlan:
    """The mismatch forensics as accumulators of ONE pass over the token frame ``ds.lf``,
    plus one pass over the raw frame ``ds.raw`` for the checks that read excluded rows.

    Token pass (``accumulators``; only the tables the chosen checks read):

    - per (entropy bin, step, staleness) cell: n, sums of H, delta, delta^2, |delta|,
      negatives, and with train_logprob_recompute the trainer-floor sums (drift, staleness,
      truncation, trainer floor, expected |delta| of the outliers);
    - per (entropy bin, sequence block, staleness): sums of both logprobs and products
      (temperature slope and its jackknife);
    - per (sequence, entropy bin, staleness): n, sums of H and delta^2; per sequence:
      seq_id, n, sums of |delta|, delta^2, H, the last valid position (:class:`_SeqTables`;
      sequence outliers: the expected |delta| of each sequence, the robust z with its
      median / MAD over sequences and the law without the flagged sequences are computed
      after the pass from these tables; memory O(sequences x bins));
    - the tokens with a logprob at or below IMPLAUSIBLE_LOGPROB, per sequence and entropy bin
      (:class:`_ImplausibleTokens`; a batch without one costs a minimum per side);
    - the tokens below UNSAMPLED_H_MAX nats with p < UNSAMPLED_P, per entropy bin, sequence,
      step and file (:class:`_UnsampledTokens`; one filter per batch).

    When the accounting lists the steps and staleness values (the loader's always does),
    the three come from one numpy accumulator on a dense layout (:class:`_TokenTables`:
    ``bincount`` over (run of a sequence, bin, staleness) slots, a few per sequence and
    batch); else from polars group-bys (with few steps x staleness values, the first two
    from one joint (bin, step, staleness, block) table). The token pass also keeps the rows
    of a hash-sampled subset of sequences for the lag check (:class:`MisalignmentPlan`, in
    ``misalign``; ``None`` when cached or not asked).

    Raw pass (``raw_accumulators``, over ``ds.raw``; empty when no chosen check reads it, or
    when the accounting counted no non-finite or placeholder row): bad masked rows per
    sequence (non-finite / placeholder logprobs, placeholder positions), the last position
    of the excluded finite masked rows per sequence (that of the valid tokens comes from the
    token pass), and without accounting the exact-zero engine logprob counts.
    :meth:`finish` runs this pass itself (:meth:`run_raw`) unless the caller fed
    ``raw_accumulators`` in a raw pass of its own and set ``raw_done = True``.
    """

    def __init__(self, ds: Any, checks: Sequence[str] | None = None) -> None:
        names = list(CHECKS) if checks is None else list(checks)
        unknown = [c for c in names if c not in _CHECK_FUNCS]
        if unknown:
            raise ParameterError(
                f"unknown forensics check(s) {', '.join(unknown)}; known: {', '.join(CHECKS)}."
            )
        self.checks = names
        self.ds = ds
        self.ctx = ctx = _Ctx(ds)
        self._schema = _lf_schema(ds)
        need = {t for c in names for t in _NEEDS[c]}
        raw = getattr(ds, "raw", None)
        acc = getattr(ds, "accounting", None)

        self.misalign = misalignment_plan(ds) if "lag_sample" in need else None
        floor = "floor" in need and ctx.has("train_logprob_recompute")
        base_cols = ["seq_key", "entropy", "step", "staleness", "delta"]
        cell_cols = base_cols + (["train_logprob", "train_logprob_recompute"] if floor else [])
        block_cols = base_cols + ["train_logprob", "infer_logprob"]
        n = pl.len().cast(pl.Int64).alias("n")
        cells_aggs = [n, *_cell_aggs(floor)]
        cell_vals = [*_CELL_COLS, *(_FLOOR_COLS if floor else ())]
        self._joint = self._cells = self._blocks = None
        self._dense: _TokenTables | None = None
        self._cell_vals = cell_vals
        cells_acc = GroupAgg(cell_cols, ["bin", "_step", "_stale"], cells_aggs,
                             _sums(["n", *cell_vals]))
        blocks_acc = GroupAgg(block_cols, ["bin", "block", "_stale"], [n, *_block_aggs()],
                              _sums(["n", *_BLOCK_COLS]))
        slots = _dense_slots(ctx) if need & {"cells", "blocks", "seqbins"} else None
        self.accumulators: list[Accumulator] = []
        inner: list[Accumulator] = []
        self._seq: _SeqTables | None = _SeqTables() if "seqbins" in need else None
        if slots is not None:
            # dense sums by numpy; the group-by accumulators take the batches outside the
            # layout (none on a validated frame)
            self._dense = _TokenTables(ctx.names, slots, floor,
                                       cells_acc if "cells" in need else None,
                                       blocks_acc if "blocks" in need else None, self._seq)
            self.accumulators.append(self._dense)
        elif "cells" in need and "blocks" in need and ctx._joint_rows_bound() <= _JOINT_MAX_ROWS:
            # sums per (bin, step, staleness, block): both tables are sums of it
            self._joint = GroupAgg(
                list(dict.fromkeys(cell_cols + block_cols)), ["bin", "_step", "_stale", "block"],
                [*cells_aggs, *_block_aggs()], _sums(["n", *cell_vals, *_BLOCK_COLS]))
            inner.append(self._joint)
        else:
            if "cells" in need:
                self._cells = cells_acc
                inner.append(self._cells)
            if "blocks" in need:
                self._blocks = blocks_acc
                inner.append(self._blocks)
        if self._seq is not None and slots is None:
            inner.append(self._seq)
        if inner:
            self.accumulators.append(_Derived(ctx.names, inner))
        if self.misalign is not None:
            self.accumulators += self.misalign.accumulators
        if "implausible" in need:
            ctx.implausible = _ImplausibleTokens()
            self.accumulators.append(ctx.implausible)
        if "unsampled" in need and ctx.has("entropy"):
            ctx.unsampled = _UnsampledTokens()
            self.accumulators.append(ctx.unsampled)
        if "mask_start" in need and ctx.has("entropy"):
            ctx.mask_start = _MaskStartTokens()
            self.accumulators.append(ctx.mask_start)

        self._bad = self._last_ok = self._last_valid = None
        self._last_tokens = False
        self._zero: _ZeroCounts | None = None
        self.raw_accumulators: list[Accumulator] = []
        # bad masked rows exist only if the accounting counted some (non-finite or
        # placeholder exclusions are always loss-masked rows): else no raw pass, the bad-row
        # tables are empty
        bad_rows = acc is None or any(
            acc.excluded.get(r, 0) for r in ("non_finite_logprob", *PLACEHOLDER_REASONS))
        if raw is not None:
            if "raw_bad" in need or ("raw_zero" in need and acc is not None and ctx.has("entropy")):
                self._bad = _bad_rows_acc(FILE_INDEX in raw.collect_schema().names())
                if bad_rows:
                    self.raw_accumulators.append(self._bad)
            if "raw_bad" in need:
                # last finite masked position per sequence (read only for sequences with bad
                # rows): of the valid tokens from the token pass when there is one anyway (a
                # per-sequence max), of the few excluded rows from the raw pass; without a
                # token pass, all from the raw pass
                if self.accumulators and bad_rows:
                    if self._seq is None:
                        self._last_valid = GroupAgg(
                            ["seq_key", "position"], ["seq_key"],
                            [pl.col("position").max().alias("pos_max")],
                            [pl.col("pos_max").max()])
                        self.accumulators.append(self._last_valid)
                    self._last_tokens = True
                self._last_ok = _last_ok_acc(excluded_only=self._last_tokens)
                if bad_rows:
                    self.raw_accumulators.append(self._last_ok)
            if "raw_zero" in need and acc is None and ctx.has("entropy"):
                self._zero = _ZeroCounts()
                self.raw_accumulators.append(self._zero)
        #: True once the raw accumulators have seen the raw frame (set it after feeding
        #: them in a raw pass of your own)
        self.raw_done = not self.raw_accumulators

    def run_raw(self) -> None:
        """The one pass over ``ds.raw`` feeding ``raw_accumulators`` (once)."""
        if not self.raw_done:
            run_pass(self.ds.raw, self.raw_accumulators)
            self.raw_done = True

    def _tables(self) -> None:
        ctx = self.ctx
        # a typed empty batch with the derived columns, for tables of a pass that saw no row
        empty = pl.DataFrame(schema=self._schema).with_columns(_derive(ctx.names))
        if self._dense is not None:
            if self._dense.cells_fb is not None:
                ctx._cells = self._dense.cells(empty)
            if self._dense.blocks_fb is not None:
                ctx._blocks = self._dense.blocks(empty)
        if self._joint is not None:
            joint = _merged(self._joint, empty)
            ctx._cells = joint.group_by("bin", "_step", "_stale").agg(
                _sums(["n", *self._cell_vals]))
            ctx._blocks = joint.group_by("bin", "block", "_stale").agg(
                _sums(["n", *_BLOCK_COLS]))
        if self._cells is not None:
            ctx._cells = _merged(self._cells, empty)
        if self._blocks is not None:
            ctx._blocks = _merged(self._blocks, empty)
        if self._seq is not None:
            ctx.seqbins, ctx.seqs = self._seq.tables(empty)
        if self.misalign is not None:
            ctx.misalign = self.misalign.result()
        elif "misalignment" in self.checks:  # pragma: no cover - always planned
            ctx.misalign = _misalign_cached(self.ds)
        if self._bad is not None or self._last_ok is not None or self._zero is not None:
            raw_empty = pl.DataFrame(schema=_raw_schema(self.ds))
            if self._bad is not None:
                ctx._bad = _bad_rows_table(self._bad, raw_empty)
            if self._last_ok is not None:
                ctx.last_ok = _merged(self._last_ok, raw_empty)
                if self._last_tokens:
                    tok = (ctx.seqs if self._last_valid is None
                           else _merged(self._last_valid, empty))
                    ctx.last_ok = (
                        pl.concat([tok.select("seq_key", pl.col("pos_max").alias("last_ok")),
                                   ctx.last_ok], how="vertical_relaxed")
                        .group_by("seq_key").agg(pl.col("last_ok").max())
                    )
            if self._zero is not None:
                ctx.zero_counts = (self._zero.z, self._zero.m)

    def finish(self, h_star: float | None = None, other_token: str | None = None,
               unit_mistake: str | None = None, units_checked: bool = False,
               entropy_shifted: bool = False, entropy_out_of_range: float = 0.0
               ) -> Findings:
        """Run the raw pass if needed, then the checks on the merged tables. ``h_star``: the
        fitted law's breakpoint, when known (the staleness check then reads the entropy
        bins above it only). ``other_token``: the column the fit's units check found
        holding another token's logprob (the truncated-sampling finding then says that an
        argmax token's logprob gives its signature too). ``unit_mistake``: the unit mistake
        the fit's units check names (a key of
        :data:`entr_diag.caveats.UNIT_SIGNATURES`): one about a logprob column makes the
        temperature and truncated-sampling findings info, pointing at it (a column in
        log10 scales like a temperature and shifts delta one way). ``units_checked``: the
        fit's units check ran (without it, e.g. in ``inspect``, those two findings say that
        ``fit`` tells them apart from a unit mistake). ``entropy_shifted``: the entropy
        column looks shifted against the logprobs (the unsampled-tokens check then cannot
        tell: each token is read against a neighbour's entropy). ``entropy_out_of_range``:
        the share of the loss-masked tokens with an entropy out of range when it voids the
        verdict, else 0 (the truncated-sampling, unsampled-tokens and mask-start checks
        then cannot tell: the entropy bins hold only the tokens the fault left in range)."""
        self.ctx.law_h_star = h_star
        self.ctx.other_token = other_token
        self.ctx.unit_mistake = unit_mistake
        self.ctx.units_checked = units_checked
        self.ctx.entropy_shifted = entropy_shifted
        self.ctx.entropy_out_of_range = entropy_out_of_range
        self.run_raw()
        self._tables()
        statuses: list[CheckStatus] = []
        found: list[tuple[int, Finding]] = []
        for i, n in enumerate(self.checks):
            try:
                with np.errstate(all="ignore"):
                    st, f = _CHECK_FUNCS[n](self.ctx)
            except (np.linalg.LinAlgError, ValueError, FloatingPointError, OverflowError,
                    ZeroDivisionError) as e:
                # extreme values (garbage that passed validation) break a fit: that check
                # cannot tell, the others still run
                st, f = _cannot(n, f"its statistics could not be computed on these values "
                                   f"({type(e).__name__}: {str(e)[:120]})")
            statuses.append(st)
            if f is not None:
                found.append((i, f))
        found = _cross_referenced(found)
        found.sort(key=lambda t: (-_SEV_RANK[t[1].severity], t[0]))
        return Findings(findings=tuple(f for _, f in found), checks=tuple(statuses))


def forensics_plan(ds: Any, checks: Sequence[str] | None = None) -> ForensicsPlan:
    """The plan of :func:`run_forensics`: run ``plan.accumulators`` in one pass over
    ``ds.lf`` (alone or fused with other plans), then ``plan.finish()`` (which makes the
    raw-frame pass itself unless ``plan.raw_done``). Raises :class:`ParameterError` for an
    unknown check name."""
    ds = dataset(ds, "forensics_plan")
    return ForensicsPlan(ds, checks)


# --------------------------------------------------------------------------- entry points


def run_forensics(ds: Any, *, checks: Sequence[str] | None = None,
                  h_star: float | None = None) -> Findings:
    """Run the mismatch forensics on a loaded dataset.

    Args:
        ds: a :class:`entr_diag.io.load.Dataset` (uses ``ds.lf``; ``ds.raw`` for corrupt
            rows; ``ds.accounting.tokens_valid`` to size the lag sample).
        checks: names from :data:`CHECKS` (default: all, in that order).
        h_star: the fitted law's breakpoint (nats), when known: the staleness check reads
            the entropy bins above it only (the noise regime below is no policy drift).

    Returns:
        :class:`Findings`: findings sorted most severe first (then in check order), and one
        :class:`CheckStatus` per check run.

    Raises:
        ParameterError: an unknown check name.

    One pass over ``ds.lf`` and at most one over ``ds.raw`` (:func:`forensics_plan`).
    """
    ds = dataset(ds, "run_forensics")
    plan = forensics_plan(ds, checks)
    if plan.accumulators:
        run_pass(ds.lf, plan.accumulators)
    return plan.finish(h_star=h_star)


def detect_misalignment(ds: Any) -> Finding | None:
    """Off-by-one check alone: the finding (severity ``critical``) or ``None``.

    ``finding.evidence["likely_shift"] == L`` means train_logprob[t] pairs with
    infer_logprob[t + L] (L = +1: the inference array has an extra leading entry; L = -1: it
    lacks its first entry); realigning means reading infer_logprob shifted by -L within each
    sequence. Raises nothing for a misaligned input: the caller decides (the CLI stops with
    exit code 2 naming the shift unless ``--allow-misaligned``). One pass over ``ds.lf``
    (:func:`misalignment_plan`), none when this Dataset object was checked before.
    """
    ds = dataset(ds, "detect_misalignment")
    plan = misalignment_plan(ds)
    if plan._sample is not None:  # every sequence: lags +-1 are tested on all of them
        run_pass(ds.lf, plan.accumulators)
    return plan.finish()
