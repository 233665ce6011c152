"""The entropy-ratio scaling law, its low-entropy breakpoint and strata (arXiv:2607.22186).

ENTR (earlier ESTR) rests on the claim that the second moment of the log importance ratio
``delta = train_logprob - infer_logprob`` scales with the entropy ``H`` (nats) of the
sampling distribution: ``E[delta^2 | H] ~= k H``. :func:`fit_scaling_law` checks it on a run:

1. **Bins.** Two passes over the tokens, whose results are small whatever their number:
   (1) a light streaming scan: sums per fine log-grid bin of H (4097 bins,
   :mod:`entr_diag.aggregate`) with the step range; (2) ONE streaming pass
   (:mod:`entr_diag.passes`, :class:`FitPlan`) feeding dense sums per (cell, block of whole
   sequences), per (staleness bucket or step range, coarse bin, block), per (cell,
   z^2 > tau, p bin) and the |delta| histogram per coarse bin, plus one bitmask per sequence
   of the bins it touches (exact sequences per bin). The cells refine both the display bins
   and the breakpoint bins; H* is a cell edge, so the noise regime (H < H*) is a set of
   cells chosen after the fit, without another pass. Coarse bins
   (``bins``, quantile or log edges) are unions of fine bins chosen from the pass-1
   counts: quantile edges are approximate at fine-bin resolution (0.41 % in H). Per bin:
   tokens, sequences (exact: memory O(sequences)), mean H, mean delta, mean delta^2 with a
   95 % interval, mean |delta|, p95 |delta| (from a log-spaced histogram of |delta|, 1024 bins on
   [1e-9, 100] nats, geometric interpolation inside a bin: about 1.2 % resolution), share
   of tokens with sampled-token probability p < 1e-3, and mean z^2 with
   z = delta / sqrt(H + eps).
2. **Uncertainty.** Every interval is a percentile interval of a bootstrap that resamples
   the non-empty sequence blocks with replacement (``n_boot`` replicates, fixed ``seed``):
   sequences are resampled whole, never tokens. Fits are redone on every replicate.
3. **Weights.** Fits weight bin b by ``tokens_b / c`` (log-log) or
   ``tokens_b / (c pred_b^2)`` (linear space, pred = the power-law value), with one common
   scale c = median over bins of (bootstrap variance x tokens). Not by each bin's own
   inverse bootstrap variance: for skewed delta^2 that variance rises with the bin's own
   upward fluctuation, which would bias k downwards.
4. **Breakpoint H\\*.** Searched on finer bins than the display bins (``max(2 bins, 60)``
   bins of the same edge kind, again unions of fine bins, summed from the same pass 2):
   the break is resolved to the width of these bins. In log-log space (x = ln mean H, y = ln mean
   delta^2; bins with H >= 1e-6 and at least 10 tokens in 2 blocks) the single power law
   (2 parameters) is compared with a two-segment model: for a split s the ``s`` lowest
   bins get their own line (a level when s = 1) and the others the power law (2 + min(s, 2)
   parameters plus the break location); the law segment keeps at least
   :data:`MIN_LAW_SHARE` of the bins (and 3), so a law is never extrapolated from a
   handful of top bins. Criterion: BIC = n ln(RSS_w / n) + p ln n. A break is reported only
   when (a) it lowers BIC by more than :data:`BIC_MARGIN`, (b) the low bins lie ABOVE the
   extrapolated power law (the noise regime is an excess of delta^2), by a weighted
   geometric-mean factor of at least :data:`MIN_EXCESS`, (c) the bins above the break
   follow a power law (weighted R^2 >= :data:`R2_MIN`), (d) the excess is significant
   (2.5 % bootstrap quantile of the log excess > 0) and (e) the break is stable: BIC
   favours a break in at least :data:`MIN_SUPPORT` of the bootstrap replicates.
   Otherwise no break is reported (never invented), with the reason.
   H\\* is the lower entropy edge of the first bin of the law regime. Its interval is the
   bootstrap percentile interval of the split, widened by one bin on each side (the break
   is only resolved to the width of a bin): lower end = 2.5 % quantile of the lower edge of
   the bin just below the replicate's break, upper end = 97.5 % quantile of the upper edge
   of the bin just above it.
5. **Laws** on the display bins of the law regime: lower edge >= the upper end of H\\*'s
   interval (a bin straddling the break would be dominated by its few noise tokens), or
   >= H\\* if that leaves fewer than 3 bins, or every bin with H >= 1e-6 without a break;
   the finer breakpoint bins if fewer than 3 display bins qualify: proportional
   ``delta^2 = k H`` (linear space), affine ``k H + c`` (linear space), power
   ``k H^alpha`` (log-log). Goodness of fit: weighted R^2 and chi^2 per
   degree of freedom. Robust companion: Theil-Sen slope of the log-log bin means
   (``scipy.stats.theilslopes``) for the power law and the median of
   ``mean delta^2 / mean H`` for k; a disagreement is flagged when the robust alpha lies
   outside the bootstrap interval and differs by more than 0.05.
6. **Regime** (:mod:`entr_diag.regime`): tokens with H < H\\* and delta^2/(H + eps) > tau.
7. **Strata**: the power law and k per staleness bucket (0, 1, 2-3, 4-7, 8+) and per step
   range (up to 8 equal ranges), on the law-regime bins, with bootstrap intervals.
8. **Verdict** (:data:`ALPHA_EXACT`, :data:`ALPHA_TOL`, :data:`R2_MIN`): the law holds when
   alpha's interval contains 1 or |alpha - 1| <= ALPHA_EXACT (with millions of tokens the
   interval gets narrower than any practical difference), holds approximately when it
   misses 1 but stays within 1 +/- ALPHA_TOL, and does not hold when it lies entirely
   outside 1 +/- ALPHA_TOL or the weighted R^2 of the power law is below R2_MIN.
9. **Units** (:class:`UnitsCheck`): mean(-infer_logprob) / mean(H), which is 1 in nats for
   tokens sampled from the engine's distribution (E[-log mu(y)] = H(mu)), per bin and
   overall, summed in the same pass; a unit mistake's factor (entropy in bits, logprobs
   in log10...) is named.

Results do not depend on row order or sharding except through float summation order.
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import polars as pl

from entr_diag.aggregate import (
    DEFAULT_BINS,
    H_MAX,
    H_MIN,
    N_FINE,
    CoarseBinning,
    FineAggregate,
    _check_blocks,
    _inputs,
    _sums,
    block_expr,
    coarse_binning,
    fine_bin_expr,
    fine_query,
    joint_binning,
    staleness_labels,
    usable,
)
from entr_diag.errors import FitError, ParameterError
from entr_diag.frames import number, token_frame
from entr_diag.io.schema import IMPLAUSIBLE_LOGPROB
from entr_diag.passes import FILE_INDEX, PartialRows, column, run_pass
from entr_diag.regime import (
    P_BINS,
    RegimeResult,
    noise_flag_expr,
    p_bin_expr,
    summarize_regime,
)

__all__ = [
    "ALPHA_EXACT",
    "ALPHA_TOL",
    "BIC_MARGIN",
    "BREAK_BINS",
    "MIN_BIN_TOKENS",
    "MIN_BOOT",
    "MIN_EXCESS",
    "MIN_LAW_SHARE",
    "MIN_SUPPORT",
    "R2_MIN",
    "STALENESS_BUCKETS",
    "AffineLaw",
    "BinStats",
    "Breakpoint",
    "BreakpointSearch",
    "FitResult",
    "Laws",
    "PowerLaw",
    "ProportionalLaw",
    "RobustPower",
    "Strata",
    "StratumFit",
    "UnitsCheck",
    "Verdict",
    "FitPlan",
    "FileUnitsPlan",
    "check_fit_parameters",
    "fit_plan",
    "fit_scaling_law",
]

#: A bin takes part in fits only with at least this many tokens (and 2 non-empty blocks).
MIN_BIN_TOKENS: int = 10
#: the advice ending the refusal when too few bins are filled (the CLI drops it when the
#: exclusions, not the input's size, left too few tokens)
MORE_DATA = "give more tokens or sequences, or fewer bins"
#: A break must lower BIC by more than this.
BIC_MARGIN: float = 2.0
#: The low bins must exceed the extrapolated law by at least this factor (weighted mean).
MIN_EXCESS: float = 1.5
#: The law segment must hold at least this share of the usable bins (and >= 3 bins).
MIN_LAW_SHARE: float = 0.2
#: A break must be favoured (delta BIC > BIC_MARGIN) in at least this share of replicates.
MIN_SUPPORT: float = 0.5
#: Fewest bootstrap replicates accepted.
MIN_BOOT: int = 100
#: Breakpoint: when the BIC-best split's law side fails R2_MIN, up to this many bins just
#: above it (straddling H*: part noise, part law) may move to the low side.
MAX_STRADDLE: int = 2
#: Influence check: a sequence block dominates an entropy bin when it carries at least this
#: share of the bin's sum of delta^2 (one of the 200 blocks holds about 0.5% of it; three
#: extreme tokens in three blocks of one bin hold a third each) ...
DOMINANT_SHARE: float = 0.1
#: ... and this many times its share of the bin's tokens (its tokens' mean delta^2 over the
#: bin's: a bin of few tokens spread over few blocks is no block's)
DOMINANT_EXCESS: float = 10.0
#: ... and adds at least this share of the run's sum of delta^2 (over the breakpoint bins)
#: beyond its tokens' share of those bins' sums ...
DOMINANT_RUN_SHARE: float = 0.01
#: ... and the law is fitted again without the dominating blocks, at most this share of the
#: non-empty blocks (at least one), those adding most first
MAX_DOMINANT_SHARE: float = 0.05
#: Catastrophic tokens: an importance ratio below 1e-4 or above 1e4, |delta| >= ln 1e4 =
#: 9.21 nats (the veto threshold of verl and slime). None on the bundled run, synthetic
#: runs or real bf16 / fp16 runs (largest |delta| 3.6 nats); 0.1% of a run's tokens at
#: delta -13 carry 77% of its sum delta^2 and read as "alpha = -0.14".
CATASTROPHIC_LOG_RATIO: float = math.log(1e4)
#: ... the caveat speaks when they carry this share of the fit's sum delta^2 or more, or
#: when the law fitted without them reads otherwise (:class:`Catastrophic`)
CATASTROPHIC_SHARE: float = 0.2
#: Verdict tolerance on alpha around 1.
ALPHA_TOL: float = 0.2
#: Verdict: alpha within 1 +/- ALPHA_EXACT counts as 1 even when a very narrow interval misses 1.
ALPHA_EXACT: float = 0.05
#: Verdict: weighted R^2 (log-log power law) below this means the law does not hold.
R2_MIN: float = 0.9
#: The law bends (:class:`Curvature`) when the log-log slope of mean delta^2 on H over the
#: highest third of the law's bins differs from that over the lowest third by at least
#: this much, its 95% bootstrap interval excluding 0 (60 planted power laws, alpha 0.5 to
#: 1.5, with and without a break: |change| <= 0.18; real runs: -1.5 to -4.5)
BEND_MIN: float = 0.3
#: Staleness buckets (label, lowest or None, highest or None); staleness = train - policy
#: version. "<0": a policy newer than the one trained on it (swapped version columns: a
#: warning says so), its own stratum as in compare's keep rate by staleness.
STALENESS_BUCKETS: tuple[tuple[str, int | None, int | None], ...] = (
    ("<0", None, -1),
    ("0", 0, 0),
    ("1", 1, 1),
    ("2-3", 2, 3),
    ("4-7", 4, 7),
    ("8+", 8, None),
)
MAX_STEP_RANGES: int = 8
#: The breakpoint is searched on max(2 * bins, BREAK_BINS) bins of the same edge kind.
BREAK_BINS: int = 60

# |delta| histogram for p95
_D_MIN, _D_MAX, _N_D = 1e-9, 100.0, 1024
_D_SCALE = _N_D / (math.log(_D_MAX) - math.log(_D_MIN))

_NAN = float("nan")
_CI_NAN = (_NAN, _NAN)


# ============================================================================ results


def _f(x) -> float:
    return float(x)


def _ci_list(ci: tuple[float, float]) -> list[float]:
    return [float(ci[0]), float(ci[1])]


@dataclass(frozen=True)
class BinStats:
    """One coarse entropy bin. Entropies and deltas in nats, delta^2 in nats^2."""

    index: int
    h_lo: float
    h_hi: float
    tokens: int
    sequences: int
    mean_h: float
    mean_delta: float
    mean_delta2: float
    mean_delta2_ci: tuple[float, float]
    mean_abs_delta: float
    p95_abs_delta: float
    share_p_lt_1e3: float
    mean_z2: float
    in_fit: bool  # used by the law fits (law regime, enough tokens)

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["mean_delta2_ci"] = _ci_list(self.mean_delta2_ci)
        return d


@dataclass(frozen=True)
class ProportionalLaw:
    """``E[delta^2] = k H`` fitted by weighted least squares in linear space."""

    k: float
    k_ci: tuple[float, float]
    k_robust: float  # median over bins of mean delta^2 / mean H
    chi2_dof: float
    r2: float
    n_bins: int

    def to_dict(self) -> dict:
        return {
            "formula": "delta^2 = k*H",
            "k": self.k,
            "k_ci": _ci_list(self.k_ci),
            "robust": {"method": "median of bin ratios mean_delta2/mean_h", "k": self.k_robust},
            "chi2_dof": self.chi2_dof,
            "r2": self.r2,
            "n_bins": self.n_bins,
        }


@dataclass(frozen=True)
class AffineLaw:
    """``E[delta^2] = k H + c`` fitted by weighted least squares in linear space."""

    k: float
    k_ci: tuple[float, float]
    c: float
    c_ci: tuple[float, float]
    chi2_dof: float
    r2: float
    n_bins: int

    def to_dict(self) -> dict:
        return {
            "formula": "delta^2 = k*H + c",
            "k": self.k,
            "k_ci": _ci_list(self.k_ci),
            "c": self.c,
            "c_ci": _ci_list(self.c_ci),
            "chi2_dof": self.chi2_dof,
            "r2": self.r2,
            "n_bins": self.n_bins,
        }


@dataclass(frozen=True)
class RobustPower:
    """Theil-Sen fit of ln mean delta^2 on ln mean H over the law-regime bins."""

    k: float
    alpha: float
    alpha_ci: tuple[float, float]
    disagrees: bool
    note: str

    def to_dict(self) -> dict:
        return {
            "method": "Theil-Sen on log-log bin means",
            "k": self.k,
            "alpha": self.alpha,
            "alpha_ci": _ci_list(self.alpha_ci),
            "disagrees": self.disagrees,
            "note": self.note,
        }


@dataclass(frozen=True)
class Curvature:
    """How far the law-regime bins bend away from a straight line in log-log space.

    The slope of ln mean delta^2 on ln H over the lowest third of the bins the power
    law is fitted on (``slope_low``, bins spanning ``low_range`` nats) and over the highest
    third (``slope_high``, ``high_range``), each a weighted least-squares line with the
    power law's weights (:meth:`_BinData.w_log`); ``change = slope_high - slope_low`` with
    the 95% interval of the same sequence-block bootstrap as the laws. A power law has one
    slope (alpha) everywhere; ``bends`` when the interval excludes 0 and ``|change| >=
    BEND_MIN``: alpha then averages a slope that varies over the range, and alpha and R^2
    depend on where the bins lie (``--bin-edges``, ``--bins``). (The end slopes of one
    quadratic over all the bins, tried first, misstated a curve that rises and then falls:
    +0.45 where the last bins fall at -2.7.) Real runs seen so far bend down: mean delta^2
    rises steeply at low entropy and levels off or falls above 1 to 2.5 nats."""

    low_range: tuple[float, float]
    high_range: tuple[float, float]
    slope_low: float
    slope_high: float
    change: float
    change_ci: tuple[float, float]
    bends: bool

    def to_dict(self) -> dict:
        return {
            "method": "weighted least-squares slopes of ln mean delta^2 on ln H over the "
                      "lowest and the highest third of the law's bins",
            "low_range": list(self.low_range),
            "high_range": list(self.high_range),
            "slope_low": self.slope_low,
            "slope_high": self.slope_high,
            "change": self.change,
            "change_ci": _ci_list(self.change_ci),
            "bends": self.bends,
            "bend_min": BEND_MIN,
        }


@dataclass(frozen=True)
class PowerLaw:
    """``E[delta^2] = k H^alpha`` fitted by weighted least squares in log-log space;
    ``curvature``: how far its bins bend from that line (None with fewer than 6 bins)."""

    k: float
    k_ci: tuple[float, float]
    alpha: float
    alpha_ci: tuple[float, float]
    chi2_dof: float
    r2: float
    n_bins: int
    h_min: float  # lower entropy edge of the fitted range (nats)
    h_max: float
    robust: RobustPower
    curvature: Curvature | None = None

    def to_dict(self) -> dict:
        return {
            "formula": "delta^2 = k*H^alpha",
            "k": self.k,
            "k_ci": _ci_list(self.k_ci),
            "alpha": self.alpha,
            "alpha_ci": _ci_list(self.alpha_ci),
            "chi2_dof": self.chi2_dof,
            "r2": self.r2,
            "n_bins": self.n_bins,
            "h_range": [self.h_min, self.h_max],
            "robust": self.robust.to_dict(),
            "curvature": None if self.curvature is None else self.curvature.to_dict(),
        }


@dataclass(frozen=True)
class Laws:
    proportional: ProportionalLaw
    affine: AffineLaw
    power: PowerLaw
    #: the bins the laws are fitted on: ``"bins"``, the table's (those with ``in_fit``),
    #: or ``"breakpoint"``, the breakpoint search's finer bins (when the law regime above
    #: H* spans fewer than 3 of the table's: ``in_fit`` then marks the table's bins inside
    #: the law regime)
    grid: str = "bins"

    def to_dict(self) -> dict:
        return {
            "proportional": self.proportional.to_dict(),
            "affine": self.affine.to_dict(),
            "power": self.power.to_dict(),
            "grid": self.grid,
        }


@dataclass(frozen=True)
class BreakpointSearch:
    """Diagnostics of the segmented-fit search, whether or not a break is reported."""

    candidates: int  # number of splits compared
    bic_no_break: float
    bic_break: float  # best split
    delta_bic: float  # bic_no_break - bic_break (> 0 favours a break)
    excess_ratio: float  # weighted geometric-mean excess of the low bins over the law
    excess_ratio_ci: tuple[float, float]
    support: float  # share of bootstrap replicates whose BIC favours a break
    found: bool
    reason: str
    #: the best split's entropy: the upper edge of the bins below it (nan before a search)
    split_h: float = _NAN

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["excess_ratio_ci"] = _ci_list(self.excess_ratio_ci)
        return d


@dataclass(frozen=True)
class Breakpoint:
    """The entropy H* (nats) below which the scaling law fails."""

    h_star: float
    h_star_ci: tuple[float, float]
    search_bins_below: int  # breakpoint-search bins below H* (finer than the display bins)
    left_slope: float  # log-log slope of the low segment (nan for a single bin)
    delta_bic: float
    excess_ratio: float
    excess_ratio_ci: tuple[float, float]
    support: float
    method: str

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["h_star_ci"] = _ci_list(self.h_star_ci)
        d["excess_ratio_ci"] = _ci_list(self.excess_ratio_ci)
        return d


@dataclass(frozen=True)
class StratumFit:
    """Power law and proportional k within one stratum (law-regime bins only)."""

    kind: str  # "staleness" or "step"
    label: str
    tokens: int
    n_bins: int
    k: float
    k_ci: tuple[float, float]
    alpha: float
    alpha_ci: tuple[float, float]
    k_proportional: float
    k_proportional_ci: tuple[float, float]
    note: str
    #: the alpha a random sample of the run as large as this stratum reads (whole sequence
    #: blocks drawn without replacement until they hold its tokens, RANDOM_SIZE_DRAWS
    #: times): 2.5 and 97.5 % quantiles. With heavy-tailed bins a smaller sample reads a
    #: higher alpha, beyond the stratum's own interval: a stratum differs from the run only
    #: when its alpha lies outside this range
    alpha_random_ci: tuple[float, float] = (math.nan, math.nan)

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        for key in ("k_ci", "alpha_ci", "k_proportional_ci", "alpha_random_ci"):
            d[key] = _ci_list(d[key])
        return d


@dataclass(frozen=True)
class Strata:
    staleness: tuple[StratumFit, ...]
    step: tuple[StratumFit, ...]
    notices: tuple[str, ...]

    def to_dict(self) -> dict:
        return {
            "staleness": [s.to_dict() for s in self.staleness],
            "step": [s.to_dict() for s in self.step],
            "notices": list(self.notices),
        }


@dataclass(frozen=True)
class Verdict:
    """Plain-words verdict. ``law``: "holds", "holds_approximately" or "does_not_hold"."""

    text: str
    law: str
    noise_regime: bool

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Catastrophic:
    """The fit's tokens with a catastrophic log-ratio, ``|delta| >= CATASTROPHIC_LOG_RATIO``
    (ln 1e4 = 9.21 nats: an importance ratio below 1e-4, which verl's and slime's veto
    reject, or above 1e4, which IcePop and token MIS drop), and the law and break fitted again without them (their sums
    taken out of every bin and sequence block; the bootstrap's blocks stay).

    Fields: ``threshold`` (nats), ``tokens``, ``token_share`` (of the fit's tokens),
    ``delta2_share`` (of its sum delta^2), ``max_abs_delta`` (nats), ``law`` and
    ``noise_regime`` (the law reading and whether a break is found without them; None when
    too few bins are left), ``verdict`` (its text without them, or None), ``changes`` (the
    law reading or the break differs from the verdict's). The caveat
    (:func:`entr_diag.caveats.catastrophic_caveat`) speaks when ``changes`` or when
    ``delta2_share`` >= CATASTROPHIC_SHARE."""

    threshold: float
    tokens: int
    token_share: float
    delta2_share: float
    max_abs_delta: float
    law: str | None
    noise_regime: bool | None
    verdict: str | None
    changes: bool

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Influence:
    """Does the verdict rest on a few tokens? (:func:`_influence`)

    A sequence block (the bootstrap's unit, ``n_blocks`` groups of whole sequences)
    dominates an entropy bin of the breakpoint search when it carries DOMINANT_SHARE or more
    of the bin's sum of delta^2, DOMINANT_EXCESS times its share of the bin's tokens or
    more, and adds DOMINANT_RUN_SHARE of the run's sum of delta^2 or more beyond its
    tokens' share: a few extreme log-ratios (a catastrophic token, a placeholder that
    passed as a logprob) set that bin's mean, and the log-log fits and the breakpoint read
    such a bin as if the law put it there. (The rare rounding events that make a real run's
    low-entropy bins heavy-tailed dominate some bins too, but add little delta^2.) The law
    and the break are fitted again without the dominating blocks (those adding most first,
    at most MAX_DOMINANT_SHARE of the non-empty blocks, at least one).

    Fields: ``blocks_left_out``, ``blocks_nonempty``, ``token_share`` (of the fit's tokens
    in the blocks left out), ``delta2_share`` (of its sum delta^2), ``bins_dominated`` (the
    entropy ranges, nats, of the breakpoint bins they dominate), ``law`` and
    ``noise_regime`` (the verdict's law reading and whether a break is found without them),
    ``verdict`` (its text without them), ``changes`` (the law reading or the break differs
    from the verdict's: the caveat :func:`entr_diag.caveats.influence_caveat` then says so).
    """

    blocks_left_out: int
    blocks_nonempty: int
    token_share: float
    delta2_share: float
    bins_dominated: tuple[tuple[float, float], ...]
    law: str
    noise_regime: bool
    verdict: str
    changes: bool

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["bins_dominated"] = [list(b) for b in self.bins_dominated]
        return d


@dataclass(frozen=True)
class UnitsCheck:
    """Are the logprobs and the entropy in nats? The expected-surprisal check.

    For a token y sampled from the engine's distribution mu, ``E[-log mu(y)] = H(mu)``: the
    entropy is by definition the expected surprisal of a draw, so over tokens sampled by
    the engine mean(-infer_logprob) / mean(H) is about 1 (0.997 on the bundled sample
    run). A unit mistake scales it by a known factor: entropy in bits ``ln 2 = 0.693``,
    logprobs in log10 ``1/ln 10 = 0.434``, logprobs in log2 ``1/ln 2 = 1.443``, entropy in
    log10 ``ln 10 = 2.303`` (:data:`entr_diag.caveats.UNIT_SIGNATURES`; both sides in the
    same wrong base cancel out and go unseen). Sampling with a temperature or top-p that
    the logged logprobs or entropy do not include moves the ratio away from 1 too, but
    unevenly across entropies, where a unit mistake scales every bin alike: a signature is
    named only when the bins agree (``ratio_spread``). ``train_over_infer`` =
    sum(train_logprob) / sum(infer_logprob), about 1 when both sides share a unit, tells
    which logprob column is off (ln 10 when only the engine's is in log10; 1/ln 10 when
    only the trainer's is).

    The identity also holds given H (a function of the context, not of the sampled token),
    so it is read per entropy bin too. ``ratio_binned``, the one the signatures are matched
    against, is the median of the display bins' ratios (sum of -infer_logprob / sum of H
    per bin) weighted by their entropy mass: a low-entropy noise regime (off-mode tokens
    drawn where H is near 0, each with a surprisal of several nats) inflates ``ratio``
    (2.1 on a synthetic run with a 10% noise share below H*) but holds a few percent of the
    entropy mass at most, and leaves it at 1.

    Fields: ``tokens`` (the fit's tokens, over which both sums run: valid, loss-masked,
    finite entropy), ``mean_surprisal`` (mean -infer_logprob), ``mean_entropy``, ``ratio``
    (their ratio), ``ratio_binned``, ``ratio_spread`` (the entropy-weighted ninth over
    first decile of the bins' ratios, each moved toward ``ratio_binned`` by its sampling
    noise first, :func:`_denoised`: 1 for a constant factor; quartiles, which leave out
    half the entropy, had read 1.17 where the bins' ratios fall from 22 to 1.45 across
    the token deciles, and 1.63 by deciles), ``train_over_infer``,
    ``likely_mistake`` (a key of the signatures, or None:
    :func:`entr_diag.caveats.unit_mistake`), ``train_ratio_binned`` (``ratio_binned`` of
    -train_logprob), ``within_bin_corr`` (the two logprob columns' correlation within the
    entropy bins, pooled), ``other_token`` (``"infer_logprob"`` or ``"train_logprob"``: the column
    that does not hold the sampled token's logprob, or None:
    :func:`entr_diag.caveats.other_token`), ``entropy_mismatch`` (no unit mistake and no
    other token's column, but ``ratio_binned`` outside the window a sampled token's logprob
    over the entropy of the distribution that sampled it reads in: the entropy column, or
    the logged logprobs, are not of the distribution the tokens were drawn from;
    :func:`entr_diag.caveats.entropy_mismatch`), ``unrelated`` (no unit mistake and no
    other token's column, yet the two logprob columns barely correlate within the entropy
    bins: they do not hold the same tokens' logprobs, e.g. rows matched on the wrong key;
    :func:`entr_diag.caveats.unrelated_columns`), ``entropy_scale`` (no unit mistake and no
    other token's column, but a ``ratio_binned`` far from 1 and alike in the bins, with
    the two logprob columns in one unit: the factor c of an entropy column holding c x H,
    1 / ``ratio_binned``; None otherwise: :func:`entr_diag.caveats.entropy_scaled`; set,
    it replaces ``entropy_mismatch``).

    The same identity tells a logprob of ANOTHER token apart: gathered at the wrong index
    (a vocabulary or tokenizer offset), or the argmax token's instead of the sampled one's.
    Such a column's mean surprisal is far from the mean entropy (11 times it for a gather
    at ``token_id + 1`` on a toy softmax, half of it for the argmax token) while the other
    column's stays near it, and no unit factor explains the gap between the two.
    """

    tokens: int
    mean_surprisal: float
    mean_entropy: float
    ratio: float
    ratio_binned: float
    ratio_spread: float
    train_over_infer: float
    likely_mistake: str | None
    train_ratio_binned: float = math.nan
    within_bin_corr: float = math.nan
    other_token: str | None = None
    entropy_mismatch: bool = False
    unrelated: bool = False
    entropy_scale: float | None = None

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _denoised(s_lp: np.ndarray, s_lp2: np.ndarray, s_h: np.ndarray, n: np.ndarray,
              centre: float) -> np.ndarray:
    """Per-bin sums of infer_logprob whose ratio to the bin's entropy is moved toward
    ``centre`` by its sampling noise (positive-part shrinkage, as in James-Stein): a bin
    ratio r = mean surprisal / mean H, with standard error se from the bin's variance of
    surprisal, becomes ``centre + (r - centre) * max(0, 1 - se^2 / (r - centre)^2)``. A
    bin a few dozen tokens deep reads its ratio to ~15%: the spread of such bins is noise
    (a 2,000-token run whose engine logprobs are in log10 read 1.31, and its unit mistake
    went unnamed), while a ratio that bends with the entropy by far more than its
    noise (a temperature the logs leave out: 0.13 to 0.92) keeps its spread."""
    ok = (n >= 2) & (s_h > 0)
    nn = np.where(ok, n, 1.0)
    with np.errstate(all="ignore"):  # (subnormal sums of H: inf ratios, weight ~0)
        mean = -s_lp / nn
        var = np.maximum(s_lp2 / nn - mean * mean, 0.0) * nn / np.maximum(nn - 1, 1.0)
        hbar = np.where(ok, s_h / nn, 1.0)
        r = mean / hbar
        se2 = var / nn / (hbar * hbar)
        dev = r - centre
        keep = np.where(dev != 0, np.clip(1 - se2 / (dev * dev), 0.0, 1.0), 0.0)
        shrunk = np.where(ok & np.isfinite(keep), centre + dev * keep, r)
        return np.where(ok, -shrunk * hbar * nn, s_lp)


def _units_check(s_lp: np.ndarray, s_d: np.ndarray, s_h: np.ndarray, n: np.ndarray,
                 s_lp2: np.ndarray | None = None, s_lpd: np.ndarray | None = None,
                 s_d2: np.ndarray | None = None, match_units: bool = True) -> UnitsCheck:
    """:class:`UnitsCheck` from per-bin sums of infer_logprob, of delta, of H and token
    counts (train_logprob = infer_logprob + delta); with the sums of infer_logprob^2,
    infer_logprob * delta and delta^2, the pooled within-bin correlation of the two
    logprob columns (``within_bin_corr``; NaN without them). ``match_units=False``: no unit
    signature is matched (too few tokens for them), only the other-token check runs."""
    from entr_diag.caveats import (
        entropy_mismatch,
        entropy_scaled,
        other_token,
        unit_mistake,
        unrelated_columns,
    )

    tokens, surprisal, entropy = int(n.sum()), float(-s_lp.sum()), float(s_h.sum())
    ok = s_h > 0

    def quantiles(sums: np.ndarray) -> tuple[float, float, float]:
        """Entropy-weighted first decile, median and ninth decile of the bins' surprisal /
        H (NaN without a bin)."""
        if not ok.any():
            return math.nan, math.nan, math.nan
        with np.errstate(over="ignore"):  # (subnormal sums of H: a ratio of inf, weight ~0)
            r, w = -sums[ok] / s_h[ok], s_h[ok]
        order = np.argsort(r)
        cum = np.cumsum(w[order])
        return tuple(float(r[order][np.searchsorted(cum, cum[-1] * q)])  # type: ignore
                     for q in (0.1, 0.5, 0.9))

    d1, binned, d9 = quantiles(s_lp)
    if s_lp2 is not None and math.isfinite(binned):  # the bins' noise taken out of the spread
        d1, _, d9 = quantiles(_denoised(s_lp, s_lp2, s_h, n, binned))
    train_binned = quantiles(s_lp + s_d)[1]
    spread = d9 / d1 if d1 > 0 else math.nan
    # (of either sign: a column averaging a logprob >= 0 has a mean surprisal <= 0)
    t_over_i = (surprisal - float(s_d.sum())) / surprisal if surprisal != 0 else math.nan
    mistake = (unit_mistake(binned, tokens, spread, t_over_i, train_binned) if match_units
               else None)
    corr = math.nan
    if s_lp2 is not None and s_lpd is not None and s_d2 is not None:
        m = n >= 2
        nn = np.where(m, n, 1.0)
        s_t = s_lp + s_d  # train_logprob = infer_logprob + delta
        syy = np.where(m, s_lp2 - s_lp**2 / nn, 0.0).sum()
        sxy = np.where(m, s_lp2 + s_lpd - s_t * s_lp / nn, 0.0).sum()
        sxx = np.where(m, s_lp2 + 2 * s_lpd + s_d2 - s_t**2 / nn, 0.0).sum()
        if sxx > 0 and syy > 0:
            corr = float(sxy / math.sqrt(sxx * syy))
        elif max(sxx, syy) > 0:  # one column constant within every bin: it follows no token
            corr = 0.0
    other = None if mistake else other_token(
        surprisal / entropy if entropy > 0 else math.nan, binned, train_binned, tokens,
        t_over_i, corr)
    scale = (entropy_scaled(binned, tokens, spread, t_over_i)
             if match_units and mistake is None and other is None else None)
    return UnitsCheck(
        tokens=tokens,
        mean_surprisal=surprisal / tokens if tokens else math.nan,
        mean_entropy=entropy / tokens if tokens else math.nan,
        ratio=surprisal / entropy if entropy > 0 else math.nan,
        ratio_binned=binned,
        ratio_spread=spread,
        train_over_infer=t_over_i,
        likely_mistake=mistake,
        train_ratio_binned=train_binned,
        within_bin_corr=corr,
        other_token=other,
        entropy_mismatch=bool(match_units and mistake is None and other is None
                              and scale is None and entropy_mismatch(binned, tokens)),
        entropy_scale=scale,
        unrelated=bool(mistake is None and other is None and unrelated_columns(
            corr, tokens, surprisal / entropy if entropy > 0 else math.nan, t_over_i)),
    )


@dataclass(frozen=True)
class FitResult:
    """Everything :func:`fit_scaling_law` computes; render it, never recompute from it."""

    parameters: dict
    bins: tuple[BinStats, ...]
    laws: Laws
    breakpoint: Breakpoint | None
    breakpoint_search: BreakpointSearch
    regime: RegimeResult
    strata: Strata
    verdict: Verdict
    units: UnitsCheck | None = None
    influence: Influence | None = None
    catastrophic: Catastrophic | None = None

    def to_dict(self) -> dict:
        """Plain Python: keys ``parameters, bins, laws, breakpoint, regime, strata, verdict,
        units`` (:class:`UnitsCheck`, None when not computed), ``influence``
        (:class:`Influence`, None when no few blocks dominate a bin), ``catastrophic``
        (:class:`Catastrophic`, None when no token's |delta| reaches ln 1e4).

        ``breakpoint`` is None when no break was found; the search diagnostics are in
        ``regime["breakpoint_search"]``. ``verdict["caveats"]``: the small-sample and
        interval caveats (:func:`entr_diag.caveats.small_sample_caveat`,
        :func:`~entr_diag.caveats.interval_caveat`), each one ``caveat: ...`` line, and
        ``verdict["caveat"]`` the same lines joined by newlines, or None (the CLI adds the
        token accounting's). Floats may be NaN (the JSON writer maps them to null).
        """
        from entr_diag.caveats import (
            catastrophic_caveat,
            influence_caveat,
            interval_caveat,
            small_sample_caveat,
        )

        regime = self.regime.to_dict()
        regime["breakpoint_search"] = self.breakpoint_search.to_dict()
        out = {
            "parameters": dict(self.parameters),
            "bins": [b.to_dict() for b in self.bins],
            "laws": self.laws.to_dict(),
            "breakpoint": None if self.breakpoint is None else self.breakpoint.to_dict(),
            "regime": regime,
            "strata": self.strata.to_dict(),
            "verdict": self.verdict.to_dict(),
            "units": None if self.units is None else self.units.to_dict(),
            "influence": None if self.influence is None else self.influence.to_dict(),
            "catastrophic": None if self.catastrophic is None else self.catastrophic.to_dict(),
        }
        caveats = [catastrophic_caveat(out), small_sample_caveat(out), interval_caveat(out),
                   influence_caveat(out)]
        out["verdict"]["caveats"] = [c for c in caveats if c]
        out["verdict"]["caveat"] = "\n".join(out["verdict"]["caveats"]) or None
        return out


# ============================================================================ numerics


class _Boot:
    """Block bootstrap: multiplicities ``W`` (n_boot, m) over the m non-empty blocks."""

    def __init__(self, block_tokens: np.ndarray, n_boot: int, seed: int):
        self.blocks = np.nonzero(block_tokens > 0)[0]
        m = len(self.blocks)
        rng = np.random.default_rng(seed)
        if m >= 2 and n_boot > 0:
            self.W = rng.multinomial(m, np.full(m, 1.0 / m), size=n_boot).astype(np.float64)
        else:
            self.W = np.zeros((0, m))

    def totals(self, S: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(nb, B) per-block sums -> point totals (nb,) and replicate totals (nb, R)."""
        Sb = S[:, self.blocks]
        return Sb.sum(axis=1), Sb @ self.W.T


def _div(a, b):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(b > 0, a / np.where(b > 0, b, 1.0), np.nan)


def _ci(reps: np.ndarray) -> tuple[float, float]:
    reps = np.asarray(reps, dtype=np.float64)
    reps = reps[np.isfinite(reps)]
    if reps.size < 10:
        return _CI_NAN
    lo, hi = np.percentile(reps, [2.5, 97.5])
    return float(lo), float(hi)


def _nanvar(R: np.ndarray) -> np.ndarray:
    """Row-wise variance over finite replicate values (nan with fewer than 2)."""
    ok = np.isfinite(R)
    cnt = ok.sum(axis=1)
    Z = np.where(ok, R, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = Z.sum(axis=1) / cnt
        var = (np.where(ok, (R - mean[:, None]) ** 2, 0.0)).sum(axis=1) / (cnt - 1)
    return np.where(cnt >= 2, var, np.nan)


def _median_finite(a: np.ndarray) -> float:
    """Median of the finite positive entries (1.0 when there is none)."""
    a = np.asarray(a, dtype=np.float64)
    a = a[np.isfinite(a) & (a > 0)]
    return float(np.median(a)) if a.size else 1.0


def _wline(X: np.ndarray, Y: np.ndarray, Wt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Weighted LS line per column: X, Y, Wt of shape (n, R); returns slope, intercept (R,).

    Entries with non-finite X or Y get weight 0."""
    ok = np.isfinite(X) & np.isfinite(Y) & (Wt > 0)
    Wt = np.where(ok, Wt, 0.0)
    X = np.where(ok, X, 0.0)
    Y = np.where(ok, Y, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        sw = Wt.sum(axis=0)
        mx = (Wt * X).sum(axis=0) / sw
        my = (Wt * Y).sum(axis=0) / sw
        sxx = (Wt * (X - mx) ** 2).sum(axis=0)
        sxy = (Wt * (X - mx) * (Y - my)).sum(axis=0)
        slope = sxy / sxx
        icpt = my - slope * mx
    bad = (ok.sum(axis=0) < 2) | ~(sxx > 0)
    return np.where(bad, np.nan, slope), np.where(bad, np.nan, icpt)


def _wrss(X, Y, Wt, slope, icpt) -> np.ndarray:
    ok = np.isfinite(X) & np.isfinite(Y) & (Wt > 0)
    r = np.where(ok, Y - (icpt + slope * X), 0.0)
    return (np.where(ok, Wt, 0.0) * r**2).sum(axis=0)


def _quality(y, f, w, n_par) -> tuple[float, float]:
    """Weighted chi^2 per dof and weighted R^2."""
    n = len(y)
    res = w * (y - f) ** 2
    ybar = np.sum(w * y) / np.sum(w)
    ss_tot = np.sum(w * (y - ybar) ** 2)
    chi2_dof = float(res.sum() / (n - n_par)) if n > n_par else _NAN
    r2 = float(1.0 - res.sum() / ss_tot) if ss_tot > 0 else _NAN
    return chi2_dof, r2


@dataclass
class _BinData:
    """Point estimates and bootstrap replicates of per-bin means (law-eligible bins)."""

    idx: np.ndarray  # coarse indices
    n: np.ndarray  # tokens per bin
    lo: np.ndarray  # lower entropy edge of each bin (nats)
    hi: np.ndarray  # upper entropy edge
    h: np.ndarray  # mean H
    d2: np.ndarray  # mean delta^2
    Hr: np.ndarray  # (n, R)
    D2r: np.ndarray  # (n, R)

    @property
    def lx(self):
        return np.log(self.h)

    @property
    def ly(self):
        return np.log(self.d2)

    def log_reps(self):
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.log(self.Hr), np.log(np.where(self.D2r > 0, self.D2r, np.nan))

    def w_log(self) -> np.ndarray:
        """Weights of the log-log fits: tokens / c, c = median over bins of
        (bootstrap variance of ln mean delta^2) x tokens.

        Proportional to tokens rather than to each bin's own inverse bootstrap variance:
        that variance grows with the bin's own fluctuation of mean delta^2 (skewed data), so
        inverse-variance weights would favour bins that fluctuate low and bias k down. The
        common scale c keeps chi^2 per dof interpretable."""
        _, LYr = self.log_reps()
        c = _median_finite(_nanvar(LYr) * self.n)
        return self.n / c

    def w_lin(self, pred: np.ndarray) -> np.ndarray:
        """Weights of the linear-space fits: tokens / (c pred^2), pred the power-law value
        (var of a mean of delta^2 ~ its square / tokens); c as in :meth:`w_log`."""
        pred = np.maximum(pred, 1e-300)
        c = _median_finite(_nanvar(self.D2r) * self.n / pred**2)
        return self.n / (c * pred**2)

    def subset(self, sel) -> _BinData:
        return _BinData(self.idx[sel], self.n[sel], self.lo[sel], self.hi[sel], self.h[sel],
                        self.d2[sel], self.Hr[sel], self.D2r[sel])


def _fit_power(bd: _BinData) -> tuple[float, float, np.ndarray, np.ndarray, float, float]:
    """ln d2 = ln k + alpha ln H. Returns k, alpha, k_reps, alpha_reps, chi2_dof, r2."""
    w = bd.w_log()
    a, c = _wline(bd.lx[:, None], bd.ly[:, None], w[:, None])
    alpha, lnk = float(a[0]), float(c[0])
    LXr, LYr = bd.log_reps()
    ar, cr = _wline(LXr, LYr, np.broadcast_to(w[:, None], LXr.shape))
    chi2, r2 = _quality(bd.ly, lnk + alpha * bd.lx, w, 2)
    return math.exp(lnk), alpha, np.exp(cr), ar, chi2, r2


def _curvature(bd: _BinData) -> Curvature | None:
    """:class:`Curvature` of the power law's bins (None with fewer than 6 of them)."""
    n = bd.idx.size
    if n < 6:
        return None
    third = n // 3
    w = bd.w_log()
    LXr, LYr = bd.log_reps()
    slopes, reps = [], []
    for sel in (slice(0, third), slice(n - third, n)):
        x, y, ws = bd.lx[sel], bd.ly[sel], w[sel]
        slopes.append(float(_wline(x[:, None], y[:, None], ws[:, None])[0][0]))
        reps.append(_wline(LXr[sel], LYr[sel], np.broadcast_to(ws[:, None], LXr[sel].shape))[0])
    change = slopes[1] - slopes[0]
    ci = _ci(reps[1] - reps[0])
    bends = bool(np.isfinite(change) and abs(change) >= BEND_MIN and np.isfinite(ci[0])
                 and not ci[0] <= 0.0 <= ci[1])
    return Curvature((float(bd.lo[0]), float(bd.hi[third - 1])),
                     (float(bd.lo[n - third]), float(bd.hi[-1])), slopes[0], slopes[1],
                     change, ci, bends)


def _fit_proportional(bd: _BinData):
    """delta^2 = k H by weighted least squares over the bins, with the weights of its own
    prediction: tokens / (c (k H)^2) (var of a mean of delta^2 ~ its square / tokens; k
    cancels from the estimate), so k = sum_b n_b (d2_b / H_b) / sum_b n_b, the
    token-weighted mean of the bins' ratios; chi2 / R^2 with the same weights. (Weighted by
    the power law's prediction instead, a law with alpha far from 1 put almost all the
    weight on the lowest-entropy bins and read k from those alone: 300x below the bins'
    ratios at alpha 2.2, a tenfold swing between steps at alpha 1.4 to 1.8.) Returns k,
    k_reps, chi2_dof, r2, robust k (median of the bin ratios)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ws = np.where(bd.h > 0, bd.n / bd.h**2, 0.0)
    k = float(np.sum(ws * bd.h * bd.d2) / np.sum(ws * bd.h**2))
    Wt = np.where(np.isfinite(bd.D2r) & np.isfinite(bd.Hr), ws[:, None], 0.0)
    Hr, Dr = np.nan_to_num(bd.Hr), np.nan_to_num(bd.D2r)
    with np.errstate(divide="ignore", invalid="ignore"):
        kr = (Wt * Hr * Dr).sum(axis=0) / (Wt * Hr**2).sum(axis=0)
    chi2, r2 = _quality(bd.d2, k * bd.h, bd.w_lin(k * bd.h), 1)
    robust = float(np.median(bd.d2 / bd.h))
    return k, kr, chi2, r2, robust


def _fit_affine(bd: _BinData, pred: np.ndarray):
    """delta^2 = k H + c by weighted least squares over the bins, weighted by ``pred``
    (tokens / (c' pred^2)): the proportional law's prediction k H (the power law's, with
    alpha far from 1, put the weight on the lowest-entropy bins alone, see
    :func:`_fit_proportional`). Returns k, c, k_reps, c_reps, chi2_dof, r2."""
    w = bd.w_lin(pred)
    a, c = _wline(bd.h[:, None], bd.d2[:, None], w[:, None])
    k, cc = float(a[0]), float(c[0])
    kr, cr = _wline(bd.Hr, bd.D2r, np.broadcast_to(w[:, None], bd.Hr.shape))
    chi2, r2 = _quality(bd.d2, k * bd.h + cc, w, 2)
    return k, cc, kr, cr, chi2, r2


# ---------------------------------------------------------------------------- breakpoint


def _split_rss(x: np.ndarray, Y: np.ndarray, w: np.ndarray, splits: Sequence[int]
               ) -> tuple[np.ndarray, np.ndarray]:
    """The two-segment weighted least-squares fits of the breakpoint search, for every
    split at once. ``x`` (n,): the design; ``Y`` (n, C): C independent responses (the point
    estimate, or the bootstrap replicates); ``w`` (n,): the weights; an entry whose x or y is
    not finite, or whose weight is not positive, is left out (as :func:`_wline`).

    Returns ``rss`` (len(splits), C): for split s, the weighted residual sum of squares of
    the line fitted to rows [s, n) plus, for s >= 2, that of the line fitted to rows
    [0, s) (one row has no residual); and the slope of the left line of column 0 per split
    (NaN for s < 2). A segment with one usable entry, or whose x do not vary, has a NaN
    residual (no line), one with none a zero residual, as :func:`_wline` and
    :func:`_wrss` give. Computed from running sums of the centred moments (O(n x C) in all,
    rows added to the left segment one split after the other), the same fits as
    :func:`_wline` per segment up to float rounding."""
    n, C = Y.shape
    ok = np.isfinite(Y) & (np.isfinite(x) & (w > 0))[:, None]
    W = np.where(ok, w[:, None], 0.0)
    # centred (a constant shift of x, and of each column of Y, changes no fit)
    fx = np.isfinite(x)
    xc = np.where(fx, x - (x[fx].mean() if fx.any() else 0.0), 0.0)[:, None]
    with np.errstate(invalid="ignore", divide="ignore"):
        ym = np.where(ok, W * Y, 0.0).sum(axis=0) / W.sum(axis=0)
    Yc = np.where(ok, Y - np.where(np.isfinite(ym), ym, 0.0)[None, :], 0.0)
    A = np.stack([W, W * xc, W * Yc, W * xc * xc, W * xc * Yc, W * Yc * Yc,
                  ok.astype(np.float64)])  # (7, n, C)
    total = A.sum(axis=1)  # (7, C)

    def seg(S: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        s0, sx, sy, sxx, sxy, syy, cnt = S
        with np.errstate(invalid="ignore", divide="ignore"):
            cxx = sxx - sx * sx / s0
            cxy = sxy - sx * sy / s0
            cyy = syy - sy * sy / s0
            slope = cxy / cxx
            rss = np.maximum(cyy - cxy * slope, 0.0)
        bad = (cnt < 1.5) | ~(cxx > 0)
        rss = np.where(bad, np.where(cnt < 0.5, 0.0, np.nan), rss)
        return rss, np.where(bad, np.nan, slope)

    out = np.empty((len(splits), C))
    left_slope = np.full(len(splits), np.nan)
    run = np.zeros((7, C))
    k = 0
    for i, s in enumerate(splits):
        while k < s:  # rows [0, s) in the left segment
            run += A[:, k]
            k += 1
        rss, _ = seg(total - run)
        if s >= 2:
            lr, ls = seg(run)
            rss = rss + lr
            left_slope[i] = ls[0]
        out[i] = rss
    return out, left_slope


def _search_break(
    bd: _BinData, h_lo: np.ndarray, h_hi: np.ndarray
) -> tuple[BreakpointSearch, Breakpoint | None, int]:
    """Segmented log-log fit; returns (search diagnostics, breakpoint or None, split s).

    ``h_lo``/``h_hi``: entropy edges of the eligible bins (same order as ``bd``)."""
    n = len(bd.h)
    if n < 3:  # too few breakpoint bins to fit even the single law (tiny runs)
        s = BreakpointSearch(0, _NAN, _NAN, _NAN, _NAN, _CI_NAN, _NAN, False,
                             (f"only {n} of the finer breakpoint bins hold" if n else
                              "none of the finer breakpoint bins holds")
                             + f" >= {MIN_BIN_TOKENS} tokens from >= 2 sequence blocks: a "
                             "breakpoint needs at least 4")
        return s, None, 0
    x, y, w = bd.lx, bd.ly, bd.w_log()
    LXr, LYr = bd.log_reps()
    R = LYr.shape[1]
    # low segment >= 1 bin; law segment >= MIN_LAW_SHARE of the bins and >= 3 bins
    min_law = max(3, math.ceil(MIN_LAW_SHARE * n))
    splits = list(range(1, n - min_law + 1))
    lnn = math.log(n)

    def bic(rss, p):
        return n * np.log(np.maximum(rss, 1e-12 * n) / n) + p * lnn

    a0, c0 = _wline(x[:, None], y[:, None], w[:, None])
    bic0 = float(bic(_wrss(x[:, None], y[:, None], w[:, None], a0, c0), 2)[0])
    if not splits:
        s = BreakpointSearch(0, bic0, _NAN, _NAN, _NAN, _CI_NAN, _NAN, False,
                             f"only {n} usable bins: a breakpoint needs at least 4")
        return s, None, 0

    # replicate weights: fixed per-bin weights, zeroed where a replicate lacks the bin
    Xf = np.broadcast_to(x[:, None], LYr.shape)  # fixed design for the replicates
    Wr = np.broadcast_to(w[:, None], LYr.shape)
    ar0, cr0 = _wline(Xf, LYr, Wr)
    bic0_r = bic(_wrss(Xf, LYr, Wr, ar0, cr0), 2)

    # every split's two segment fits from running sums (O(bins x replicates) in all, not
    # per split: --bins 500 searched 1000 splits in 36 s at 5M tokens)
    rss_all, left = _split_rss(x, y[:, None], w, splits)
    rss_r_all, _ = _split_rss(x, LYr, w, splits)
    left_slopes = left.tolist()
    p_all = 2 + np.minimum(np.asarray(splits), 2) + 1
    bics = [float(bic(rss_all[i], p_all[i])[0]) for i in range(len(splits))]
    bics_r = [bic(rss_r_all[i], p_all[i]) for i in range(len(splits))]
    bics_arr = np.asarray(bics)
    best = int(np.argmin(bics_arr))

    def law_side(s: int) -> tuple[float, float]:
        """(excess in log space of bins [0, s) over the line fitted to bins [s, n),
        weighted R^2 of that line on its own bins)."""
        a_, c_ = _wline(x[s:, None], y[s:, None], w[s:, None])
        ex = float(np.sum(w[:s] * (y[:s] - (c_[0] + a_[0] * x[:s]))) / np.sum(w[:s]))
        return ex, _quality(y[s:], c_[0] + a_[0] * x[s:], w[s:], 2)[1]

    excess, r2_law = law_side(splits[best])
    moved_from = None
    if (bic0 - float(bics_arr[best]) > BIC_MARGIN and excess > 0
            and math.exp(excess) >= MIN_EXCESS and not r2_law >= R2_MIN):
        # The bins just above the BIC-best split may straddle H* (part noise, part law):
        # a flat law (small alpha) cannot absorb such a bin, and it alone can pull the law
        # segment's R^2 below R2_MIN. Try moving up to MAX_STRADDLE bins to the low side,
        # keeping the first split that still beats the single law and whose law side holds.
        for j in range(best + 1, min(best + 1 + MAX_STRADDLE, len(splits))):
            ex_j, r2_j = law_side(splits[j])
            if (bic0 - float(bics_arr[j]) > BIC_MARGIN and ex_j > 0
                    and math.exp(ex_j) >= MIN_EXCESS and r2_j >= R2_MIN):
                moved_from, best, excess, r2_law = splits[best], j, ex_j, r2_j
                break
    s_best = splits[best]
    delta_bic = bic0 - float(bics_arr[best])
    wl = w[:s_best]

    # excess of the low bins over the law fitted to the high bins, per replicate
    rr_a, rr_c = _wline(Xf[s_best:], LYr[s_best:], Wr[s_best:])
    resid = LYr[:s_best] - (rr_c[None, :] + rr_a[None, :] * Xf[:s_best])
    okl = np.isfinite(resid)
    with np.errstate(invalid="ignore", divide="ignore"):
        excess_r = (np.where(okl, wl[:, None] * resid, 0.0).sum(axis=0)
                    / np.where(okl, wl[:, None], 0.0).sum(axis=0))
    ex_ci = _ci(excess_r)

    B_r = np.vstack(bics_r) if R else np.zeros((len(splits), 0))
    support = float(np.mean((bic0_r - B_r.min(axis=0)) > BIC_MARGIN)) if R else _NAN

    reasons = []
    if not delta_bic > BIC_MARGIN:
        reasons.append(
            f"the segmented fit does not beat the single power law (delta BIC = {delta_bic:.1f}"
            f" <= {BIC_MARGIN:g})"
        )
    elif excess <= 0:
        reasons.append(_no_excess_reason(float(h_hi[s_best - 1]), math.exp(excess)))
    elif math.exp(excess) < MIN_EXCESS:
        reasons.append(
            f"the low-entropy excess is only x{math.exp(excess):.2f} (< x{MIN_EXCESS:g})"
        )
    elif not (np.isfinite(r2_law) and r2_law >= R2_MIN):
        reasons.append(
            f"the bins above the candidate break do not follow a power law themselves "
            f"(weighted R^2 = {r2_law:.2f} < {R2_MIN:g}), so an excess below it is not a "
            "low-entropy noise regime"
        )
    elif not (np.isfinite(ex_ci[0]) and ex_ci[0] > 0):
        reasons.append("the low-entropy excess is not significant (bootstrap interval includes 0)")
    elif not (np.isfinite(support) and support >= MIN_SUPPORT):
        reasons.append(
            f"the break is not stable: BIC favours it in only {100 * support:.0f}% of the "
            f"bootstrap replicates (< {100 * MIN_SUPPORT:.0f}%)"
        )
    found = not reasons
    reason = (
        f"break at split {s_best} of {n} bins: delta BIC = {delta_bic:.1f}, "
        f"excess x{math.exp(excess):.2f}"
        + (f" (the BIC-best split {moved_from} left {s_best - moved_from} bin(s) straddling "
           "the break on the law side, whose power law did not hold there: moved to the "
           "low side)" if moved_from is not None else "")
        if found
        else reasons[0]
    )
    search = BreakpointSearch(
        candidates=len(splits),
        bic_no_break=bic0,
        bic_break=float(bics_arr[best]),
        delta_bic=delta_bic,
        excess_ratio=math.exp(excess),
        excess_ratio_ci=(
            (math.exp(ex_ci[0]), math.exp(ex_ci[1])) if np.isfinite(ex_ci[0]) else _CI_NAN
        ),
        support=support,
        found=found,
        reason=reason,
        split_h=float(h_hi[s_best - 1]),
    )
    if not found:
        return search, None, 0
    if R:
        s_r = np.asarray(splits)[np.argmin(B_r, axis=0)]
        lo_r = h_lo[np.maximum(s_r - 1, 0)]
        hi_r = h_hi[np.minimum(s_r, n - 1)]
        h_ci = (float(np.percentile(lo_r, 2.5)), float(np.percentile(hi_r, 97.5)))
    else:
        h_ci = _CI_NAN
    bp = Breakpoint(
        h_star=float(h_lo[s_best]),
        h_star_ci=h_ci,
        search_bins_below=s_best,
        left_slope=left_slopes[best],
        delta_bic=delta_bic,
        excess_ratio=search.excess_ratio,
        excess_ratio_ci=search.excess_ratio_ci,
        support=support,
        method=(
            "two-segment log-log fit vs single power law by BIC; excess over the "
            "extrapolated law required (block bootstrap)"
        ),
    )
    return search, bp, s_best


# ============================================================================ passes


def _collect_each(queries: list[pl.LazyFrame]) -> list[pl.DataFrame]:
    """Collect each aggregation on the streaming engine, one after the other.

    Not ``pl.collect_all``: it shares the common scan between the queries by caching it,
    which was measured to make memory grow with the number of tokens (15 M tokens: ~0.9 GB
    vs ~0.5 GB one query at a time); the price is one scan per query."""
    return [q.collect(engine="streaming") for q in queries]


def _staleness_expr(names: list[str], unit: int = 1) -> pl.Expr | None:
    """The staleness bucket (index of STALENESS_BUCKETS, Int32; null outside every bucket)
    of a token, its staleness counted in lags of ``unit`` versions (floor division); None
    without a staleness column (nor both version columns)."""
    if "staleness" in names:
        s = pl.col("staleness")
    elif "policy_version" in names and "train_version" in names:
        s = pl.col("train_version") - pl.col("policy_version")
    else:
        return None
    if unit != 1:
        s = s // unit
    out = pl.lit(None, dtype=pl.Int32)
    for i in range(len(STALENESS_BUCKETS) - 1, -1, -1):
        _, lo, hi = STALENESS_BUCKETS[i]
        cond = (s <= hi) if lo is None else (s >= lo) if hi is None else (
            (s >= lo) & (s <= hi))
        out = pl.when(cond).then(pl.lit(i, dtype=pl.Int32)).otherwise(out)
    return out


def _abs_delta_bin_expr() -> pl.Expr:
    ad = pl.col("delta").abs()
    # (a non-finite delta gives a null bin: not a cast error)
    idx = ((ad.clip(lower_bound=_D_MIN).log() - math.log(_D_MIN)) * _D_SCALE).floor().cast(
        pl.Int64, strict=False)
    return (
        pl.when(ad < _D_MIN).then(pl.lit(0, dtype=pl.Int64)).otherwise(idx.clip(0, _N_D - 1) + 1)
    ).cast(pl.Int32)


def _p95_from_hist(dbins: np.ndarray, counts: np.ndarray) -> float:
    """95th percentile of |delta| from a log-grid histogram (geometric interpolation)."""
    order = np.argsort(dbins)
    dbins, counts = dbins[order], counts[order].astype(np.float64)
    total = counts.sum()
    if total <= 0:
        return _NAN
    cum = np.cumsum(counts)
    target = 0.95 * total
    i = int(np.searchsorted(cum, target, side="left"))
    b = int(dbins[i])
    if b == 0:
        return 0.0
    prev = cum[i - 1] if i > 0 else 0.0
    frac = (target - prev) / counts[i]
    lo = math.log(_D_MIN) + (b - 1) / _D_SCALE
    return float(math.exp(lo + frac / _D_SCALE))


def _regime_with_hist(
    lf: pl.LazyFrame, coarse: pl.Expr, h_star: float | None, tau: float, eps: float
) -> pl.LazyFrame:
    """Tokens and delta^2 sums per (coarse bin, |delta| bin, below H*, flagged, p bin): the
    regime table (:func:`~entr_diag.regime.regime_query`) and the |delta| histogram per
    coarse bin are both sums of it. Its size is bounded by the bins, not the tokens."""
    below = pl.lit(False) if h_star is None else (pl.col("entropy") < h_star)
    return (
        lf.select(
            coarse.alias("coarse"),
            _abs_delta_bin_expr().alias("dbin"),
            below.alias("below"),
            noise_flag_expr(h_star, tau, eps).alias("flag"),
            p_bin_expr().alias("pbin"),
            (pl.col("delta") ** 2).alias("d2"),
        )
        .group_by(["coarse", "dbin", "below", "flag", "pbin"])
        .agg(pl.len().cast(pl.Int64).alias("n"), pl.col("d2").sum().alias("s_d2"))
    )


#: random samples per stratum size for :attr:`StratumFit.alpha_random_ci`
RANDOM_SIZE_DRAWS = 200


def _random_size_alpha(pooled: Mapping[str, np.ndarray], tokens: int, law_bins: np.ndarray,
                       rng: np.random.Generator) -> tuple[float, float]:
    """The 95 % range of the power law's alpha on random samples of ``tokens`` tokens:
    whole sequence blocks of ``pooled`` (per coarse bin and block sums n, s_h, s_d2, shape
    (nb, B)) drawn in random order until they hold ``tokens``, RANDOM_SIZE_DRAWS times;
    each sample fitted as the stratum is (the law-regime bins with MIN_BIN_TOKENS tokens
    from 2 blocks; weighted least squares of ln mean delta^2 on ln mean H, weights
    proportional to tokens, as :func:`_fit_power`)."""
    n, sh, sd2 = (np.asarray(pooled[c], dtype=np.float64) for c in ("n", "s_h", "s_d2"))
    per_block = n.sum(axis=0)
    blocks = np.flatnonzero(per_block > 0)
    if blocks.size < 2 or tokens <= 0:
        return _CI_NAN
    pick = np.zeros((RANDOM_SIZE_DRAWS, n.shape[1]))
    for r in range(RANDOM_SIZE_DRAWS):
        order = rng.permutation(blocks)
        k = int(np.searchsorted(np.cumsum(per_block[order]), tokens)) + 1
        pick[r, order[:k]] = 1.0
    ns, hs, ds = n @ pick.T, sh @ pick.T, sd2 @ pick.T  # (nb, draws)
    nblk = (n > 0).astype(np.float64) @ pick.T
    ok = np.zeros(n.shape[0], dtype=bool)
    ok[law_bins] = True
    w = np.where(ok[:, None] & (ns >= MIN_BIN_TOKENS) & (nblk >= 2), ns, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        x, y = np.log(_div(hs, ns)), np.log(_div(ds, ns))
    alpha, _ = _wline(x, y, w)
    alpha = alpha[np.isfinite(alpha)]
    if alpha.size < RANDOM_SIZE_DRAWS // 2:
        return _CI_NAN
    return float(np.quantile(alpha, 0.025)), float(np.quantile(alpha, 0.975))


def _stratum_fits(
    sums: dict[str, np.ndarray],
    labels: list[str],
    kind: str,
    law_bins: np.ndarray,
    nb: int,
    boot: _Boot,
    B: int,
    pooled: Mapping[str, np.ndarray] | None = None,
    seed: int = 0,
    run_alpha: float = math.nan,
) -> list[StratumFit]:
    """Per stratum: the power law and k on the law-regime bins. ``sums``: flat dense arrays
    (strata x coarse bins x blocks) of n, s_h, s_d2. With ``pooled`` (the run's per coarse
    bin and block sums), the alpha range of a random sample of each stratum's size
    (:func:`_random_size_alpha`, seeded by ``seed``) and a note when the stratum's alpha
    lies outside it and more than ALPHA_EXACT from the run's (``run_alpha``): with eight
    strata at 95% each, one in three runs of one law had a stratum just outside its range
    (0.9955 against [0.9959, 1.0026]), a difference no reading of the law depends on."""
    rng = np.random.default_rng([seed, 7])
    out = []
    for si, label in enumerate(labels):
        S = {c: sums[c].reshape(-1, nb, B)[si] for c in ("n", "s_h", "s_d2")}
        tokens = int(round(S["n"].sum()))
        if tokens == 0:
            continue
        n0, nr = boot.totals(S["n"])
        h0, hr = boot.totals(S["s_h"])
        d0, dr = boot.totals(S["s_d2"])
        blocks_nonempty = (S["n"][:, boot.blocks] > 0).sum(axis=1)
        sel = np.zeros(nb, dtype=bool)
        sel[law_bins] = True
        sel &= (n0 >= MIN_BIN_TOKENS) & (blocks_nonempty >= 2)
        mh, md2 = _div(h0, n0), _div(d0, n0)
        sel &= (mh > 0) & (md2 > 0)
        idx = np.nonzero(sel)[0]
        if idx.size < 3:
            out.append(StratumFit(kind, label, tokens, int(idx.size), _NAN, _CI_NAN, _NAN,
                                  _CI_NAN, _NAN, _CI_NAN,
                                  "fewer than 3 law-regime bins with enough tokens: not fitted"))
            continue
        bd = _BinData(idx, n0[idx], idx * 0.0, idx * 0.0, mh[idx], md2[idx], _div(hr[idx], nr[idx]),
                      _div(dr[idx], nr[idx]))
        k, alpha, kr, ar, _, _ = _fit_power(bd)
        kp, kpr, _, _, _ = _fit_proportional(bd)
        rand = _CI_NAN if pooled is None else _random_size_alpha(pooled, tokens, law_bins,
                                                                 rng)
        note = ""
        tol = 1e-6 * max(1.0, abs(alpha))  # a stratum that is the whole run: [a, a]
        if (np.isfinite(rand[0]) and np.isfinite(alpha)
                and not rand[0] - tol <= alpha <= rand[1] + tol
                and not abs(alpha - run_alpha) <= ALPHA_EXACT):
            note = "alpha outside the range of a random sample of its size"
        out.append(StratumFit(kind, label, tokens, int(idx.size), k, _ci(kr), alpha, _ci(ar),
                              kp, _ci(kpr), note, rand))
    return out


# ============================================================================ verdict


def _pct(x: float) -> str:
    if not np.isfinite(x):
        return "n/a"
    return f"{100 * x:.2g}%" if x < 0.1 else f"{100 * x:.0f}%"


def _fmt(x: float, digits: int = 3) -> str:
    return "nan" if not np.isfinite(x) else f"{x:.{digits}g}"


def _digits_apart(lo: float, hi: float, digits: int = 2, most: int = 4) -> int:
    """``digits`` significant digits, more (up to ``most``) while an interval's two ends
    would print as one number (H* = 0.03 [0.03, 0.03] at --bins 500)."""
    while digits < most and np.isfinite(lo) and np.isfinite(hi) and lo != hi \
            and _fmt(lo, digits) == _fmt(hi, digits):
        digits += 1
    return digits


def _law_status(power: PowerLaw) -> tuple[str, str]:
    """The verdict's reading of the power law: (``law``: "holds", "holds_approximately" or
    "does_not_hold"; the head of the verdict's text, alpha with its interval and why)."""
    lo, hi = power.alpha_ci
    d = 2  # decimals: more when the interval would print as one number (1.30 [1.30, 1.30])
    while d < 4 and np.isfinite(lo) and f"{lo:.{d}f}" == f"{hi:.{d}f}":
        d += 1
    a_txt = f"alpha = {power.alpha:.{d}f} [{lo:.{d}f}, {hi:.{d}f}]"
    poor = np.isfinite(power.r2) and power.r2 < R2_MIN
    # far from 1 (when the interval excludes 1): the interval beyond 1 +- ALPHA_TOL, or the
    # estimate itself (0.51 [0.43, 0.83] read "holds approximately" for its upper end alone)
    far = np.isfinite(lo) and (hi < 1 - ALPHA_TOL or lo > 1 + ALPHA_TOL
                               or (abs(power.alpha - 1.0) > ALPHA_TOL
                                   and not lo <= 1.0 <= hi))
    if np.isfinite(lo) and (lo <= 1.0 <= hi or abs(power.alpha - 1.0) <= ALPHA_EXACT) and not poor:
        law, head = "holds", f"law holds: {a_txt}"
        if not lo <= 1.0 <= hi:  # (a narrow interval: the tolerance, not the interval, decides)
            head += f" (interval excludes 1, alpha within {ALPHA_EXACT:g} of it)"
    elif far or poor:
        why = []
        if poor:
            r2 = f"{power.r2:.2f}"  # never printed as the threshold it misses (0.8989)
            if float(r2) >= R2_MIN:
                r2 = f"{power.r2:.4f}".rstrip("0")
            why.append(f"poor fit, weighted R^2 = {r2} < {R2_MIN:g}")
        if far:
            why.append("alpha far from 1")
        law, head = "does_not_hold", f"law does not hold: {a_txt} ({'; '.join(why)})"
    elif not np.isfinite(lo):
        law = "holds_approximately"
        head = f"law undetermined: alpha = {power.alpha:.2f} (no interval)"
    else:
        law, head = "holds_approximately", f"law holds approximately: {a_txt} (interval excludes 1)"
    return law, head


def _no_excess_reason(split_h: float, excess_ratio: float,
                      units: Mapping | None = None) -> str:
    """The breakpoint search's reason when the bins below the best split (entropy
    ``split_h``, as the column reads) lie below the law fitted above it (``excess_ratio``
    < 1, quoted from 1e-3 up); with a units check that reads the entropy column as bits (a fit's
    ``to_dict()["units"]``), the entropy is named in the column's unit and in nats."""
    from entr_diag.caveats import entropy_text, entropy_unit

    unit = entropy_unit(units)
    h_txt = entropy_text(f"{split_h:.3g}", "", units,
                         None if unit is None else f"{split_h * unit[1]:.3g}")
    # (a weighted geometric mean of ratios: below 1e-3 its digits say nothing more than
    # that the bins hold next to no mismatch, e.g. x5.86e-23 on logprobs equal on both sides)
    ratio = (f"their mean delta^2 x{excess_ratio:.3g} of its prediction"
             if excess_ratio >= 1e-3 else
             "their mean delta^2 under 1/1000 of its prediction: next to no mismatch there")
    return (f"the bins below the best split (H < {h_txt}) lie below the law fitted to the "
            f"bins above it ({ratio}), not above it (no excess)")


def _make_verdict(power: PowerLaw, bp: Breakpoint | None, search: BreakpointSearch,
                  regime: RegimeResult, units: UnitsCheck | None = None) -> Verdict:
    law, head = _law_status(power)
    head += f", k = {_fmt(power.k)}"
    if power.robust.disagrees and power.curvature is not None and power.curvature.bends:
        head += (f" (robust Theil-Sen alpha = {power.robust.alpha:.2f} differs: the bins do "
                 "not lie on one line, see the caveat)")
    elif power.robust.disagrees:
        head += (f" (robust Theil-Sen alpha = {power.robust.alpha:.2f} disagrees: heavy-tailed "
                 "bins dominate least squares)")
    if bp is not None:
        from entr_diag.caveats import entropy_text, entropy_unit

        # (an entropy column the units check reads as bits: H* as it reads, and in nats)
        unit = entropy_unit(None if units is None else units.to_dict())
        f = 1.0 if unit is None else unit[1]
        d = _digits_apart(*bp.h_star_ci)
        h_txt = entropy_text(
            _fmt(bp.h_star, d), f"[{_fmt(bp.h_star_ci[0], d)}, {_fmt(bp.h_star_ci[1], d)}]",
            None if units is None else units.to_dict(), _fmt(bp.h_star * f, d))
        where = f"noise regime below H* = {h_txt}: "
        if regime.flagged_tokens:
            tail = (where + f"{_pct(regime.share_flagged)} of tokens flagged as noise "
                    f"(delta^2/(H+{regime.eps:g}) > {regime.tau:g} below H*), "
                    f"{_pct(regime.delta2_mass_share_flagged)} of delta^2 mass")
        else:  # a regime found whose tokens all stay within the bound at this tau
            tail = (where + f"{_pct(regime.share_below_h_star)} of tokens below H* "
                    f"({_pct(regime.delta2_mass_share_below_h_star)} of delta^2 mass), none "
                    f"flagged as noise at tau = {regime.tau:g} (a lower tau flags more)")
    else:
        tail = f"no low-entropy break: {search.reason}"
    return Verdict(text=f"{head}; {tail}", law=law, noise_regime=bp is not None)


# ============================================================================ entry point


def _eligible(S: dict, tot: dict, boot: _Boot, binning: CoarseBinning) -> _BinData:
    """Bins usable by the log-log fits: H >= H_MIN, >= MIN_BIN_TOKENS tokens, >= 2 blocks."""
    n0, nr = tot["n"]
    mean_h, mean_d2 = _div(tot["s_h"][0], n0), _div(tot["s_d2"][0], n0)
    blocks_nonempty = (S["n"][:, boot.blocks] > 0).sum(axis=1)
    ok = (n0 >= MIN_BIN_TOKENS) & (blocks_nonempty >= 2) & (mean_d2 > 0) & (mean_h > 0)
    if binning.has_zero_bin:
        ok[0] = False
    idx = np.nonzero(ok)[0]
    return _BinData(idx, n0[idx], binning.h_lo[idx], binning.h_hi[idx], mean_h[idx], mean_d2[idx],
                    _div(tot["s_h"][1][idx], nr[idx]), _div(tot["s_d2"][1][idx], nr[idx]))


def fit_scaling_law(
    lf: pl.LazyFrame,
    *,
    bins: int = DEFAULT_BINS,
    bin_edges: str = "quantile",
    eps: float = 0.01,
    tau: float = 4.0,
    n_boot: int = 1000,
    n_blocks: int = 200,
    seed: int = 0,
    with_strata: bool = True,
    staleness_unit: int = 1,
) -> FitResult:
    """Fit the entropy-ratio scaling law E[delta^2 | H] ~ k H^alpha (arXiv:2607.22186).

    ``lf``: canonical token frame (docs/CONTRACT.md; one row per valid loss-masked token;
    needs seq_key, entropy, delta, infer_logprob; optional step, staleness or
    policy_version + train_version for strata). Never collected whole: :func:`fit_plan`
    (a light scan for the fine grid and step range), then one streaming pass of its
    accumulators (:func:`entr_diag.passes.run_pass`), then :meth:`FitPlan.finish`.
    Tokens without a finite entropy >= 0 are skipped.

    ``bins``/``bin_edges``: number of coarse entropy bins, ``"quantile"`` or ``"log"``.
    ``eps``, ``tau``: the noise-token flag ``H < H*`` and ``delta^2/(H + eps) > tau`` (nats).
    ``n_boot`` bootstrap replicates over ``n_blocks`` sequence blocks, ``seed`` fixed.
    ``staleness_unit``: the staleness strata count lags in this many versions
    (:func:`~entr_diag.aggregate.staleness_unit` of the staleness values, e.g. 1000 for
    versions counted in 1000s; their labels stay in versions: ``"2000-3000"``).
    Returns a :class:`FitResult` (see the module docstring for every rule).

    Raises :class:`FitError` when the frame has no entropy column, no token with a finite
    entropy, all tokens in one sequence block, delta = 0 everywhere, or fewer than 3 entropy
    bins with enough tokens (>= 10 tokens in >= 2 sequence blocks with H >= 1e-6);
    :class:`ParameterError` for invalid parameters (``n_boot < 100``, ``tau <= 0``,
    ``eps < 0``, ``bins < 3``, ``bin_edges`` not "quantile"/"log", ``n_blocks < 2``; ``bins``,
    ``n_boot``, ``n_blocks`` or ``seed`` given NaN, inf or a fraction);
    :class:`TypeError` (naming the parameter) when ``bins``, ``eps``, ``tau``, ``n_boot``,
    ``n_blocks`` or ``seed`` is not a real number (e.g. ``tau="4"``), or ``with_strata`` not
    a bool.
    """
    lf = token_frame(lf, "fit_scaling_law")
    _check_numbers("fit_scaling_law", bins=bins, eps=eps, tau=tau, n_boot=n_boot,
                   n_blocks=n_blocks, seed=seed, with_strata=with_strata)
    plan = fit_plan(lf, bins=bins, bin_edges=bin_edges, eps=eps, tau=tau, n_boot=n_boot,
                    n_blocks=n_blocks, seed=seed, with_strata=with_strata,
                    staleness_unit=staleness_unit)
    run_pass(lf, plan.accumulators)
    return plan.finish()


class _FitSums:
    """The fit's one-pass accumulator: dense sums per (cell, staleness bucket, step range,
    block) (summed afterwards into the per-(cell, block), per-(staleness bucket, coarse bin,
    block) and per-(step range, coarse bin, block) tables), per (cell, z^2 > tau, p bin),
    the |delta| histogram per coarse bin, and per sequence a bitmask of the coarse bins it
    touches (OR-merged by seq_key: the exact number of sequences per bin).

    The per-token keys and weights are polars expressions (:attr:`exprs`) that the streaming
    engine computes during the scan (the fine entropy bin is the same expression as pass 1,
    so a token's cell is the one pass 1 counted it in; cells and coarse bins are lookup
    tables over fine bins, applied by the engine); per batch, numpy only adds weights with
    ``bincount``. The joint key puts the step range outermost: a batch (rows of one chunk,
    one or two step ranges) spans a small part of the table, and ``bincount`` runs over that
    span only. Temporaries of a batch are computed in reused buffers (a fresh array of a
    few MB costs its page faults on every batch)."""

    def __init__(self, names: list[str], binning: CoarseBinning, cells: CoarseBinning,
                 B: int, eps: float, tau: float, stale: pl.Expr | None,
                 step_range: pl.Expr | None, n_ranges: int) -> None:
        # read as numpy arrays shared with the pass's other accumulators (:func:`column`)
        self.columns: list[str] = ["entropy", "delta", "seq_key", "infer_logprob"]
        self.nb, self.nc, self.B = binning.n_bins, cells.n_bins, B
        self.eps, self.tau = eps, tau
        self.nr = n_ranges
        self.n_stale = len(STALENESS_BUCKETS)
        self.words = -(-self.nb // 64)
        NP = len(P_BINS)
        # joint key sizes: index 0 of a stratum axis holds the tokens outside every stratum
        self.S1 = self.n_stale + 1 if stale is not None else 1
        self.R1 = max(self.nr, 1) + 1 if step_range is not None else 1
        self.has_stale, self.has_sr = stale is not None, step_range is not None
        fine = np.arange(N_FINE + 1)
        lut_cell = cells.coarse_of_fine(fine).astype(np.int64)
        lut_coarse = binning.coarse_of_fine(fine).astype(np.int64)
        self.cell_coarse = binning.coarse_of_fine(cells.starts[:-1]).astype(np.int64)
        #: the bit of each coarse bin in its 64-bit word of the sequence masks, (nb,) uint64
        self.bit_of = np.left_shift(np.uint64(1), np.arange(self.nb, dtype=np.uint64) % 64)
        d, h = pl.col("delta"), pl.col("entropy")
        usable = h.is_not_null() & h.is_finite() & (h >= 0) & d.is_finite()
        i64 = pl.Int64
        # stage 1: the fine bin; stage 2: cell (-1: a token the fit does not use, no finite
        # entropy or delta, or outside the binned range: never for tokens pass 1 counted)
        # and coarse bin, looked up once per token
        fine = pl.col("_fit_fine")
        self.stages = [
            [fine_bin_expr().alias("_fit_fine")],
            [pl.when(usable).then(pl.lit(pl.Series(lut_cell)).gather(fine)).otherwise(-1)
             .alias("_fit_cell"),
             pl.lit(pl.Series(lut_coarse)).gather(fine).alias("_fit_coarse")],
        ]
        cell, coarse = pl.col("_fit_cell"), pl.col("_fit_coarse")
        st1 = stale.fill_null(-1).cast(i64) + 1 if stale is not None else pl.lit(0, i64)
        sr1 = step_range.fill_null(-1).cast(i64) + 1 if step_range is not None else pl.lit(0, i64)
        # (step range, cell, staleness, block): the step range outermost (see the class doc)
        joint = ((sr1 * self.nc + cell) * self.S1 + st1) * B + block_expr(B).cast(i64)
        z2 = d * d / (h + eps)
        reg = (cell * 2 + (z2 > tau).cast(i64)) * NP + p_bin_expr().cast(i64)
        # each per-token value computed once by the engine (numpy uses the int64 keys as is)
        ex = {
            "_fit_joint": pl.when(cell >= 0).then(joint).otherwise(-1).cast(i64),
            "_fit_reg": pl.when(cell >= 0).then(reg).otherwise(-1).cast(i64),
            # (null for a token the fit does not use: a NaN or infinite entropy or delta)
            "_fit_hist": (coarse * (_N_D + 1) + _abs_delta_bin_expr().cast(i64)).fill_null(-1)
            .cast(i64),
            "_fit_coarse": coarse.fill_null(-1).cast(i64),
        }
        self.exprs = [e.alias(k) for k, e in ex.items()]
        size = self.R1 * self.nc * self.S1 * B
        #: flat ``(R1 * nc * S1 * B,)`` sums per (step range, cell, staleness, block)
        self.joint = {c: np.zeros(size) for c in ("n", "s_h", "s_d2")}
        self._buf = np.empty((0, 0))  # reused float64 temporaries, (3, rows)
        self._kbuf = np.empty(0, dtype=np.int64)  # reused int64 joint keys, (rows,)
        # s_lp: sum of infer_logprob, for the units check (:class:`UnitsCheck`)
        # s_lp2, s_lpd: of infer_logprob^2 and infer_logprob * delta, for the within-bin
        # correlation of the two logprob columns (:func:`other_token`)
        self.reg = {c: np.zeros(self.nc * 2 * NP)
                    for c in ("n", "s_d", "s_d2", "s_absd", "s_z2", "s_lp", "s_lp2", "s_lpd")}
        self.hist = np.zeros(self.nb * (_N_D + 1))
        #: n, sum infer_logprob, sum delta, sum H, sum infer_logprob^2, sum infer_logprob *
        #: delta, sum delta^2 per coarse bin of the tokens with an impossible logprob (<=
        #: IMPLAUSIBLE_LOGPROB on either side): the units check leaves them out (a few -300
        #: placeholders would read as log2 logprobs)
        self.units_out = np.zeros((7, self.nb))
        #: sums per (cell, block), flat ``(nc * B,)`` as :attr:`cb`, of the tokens with a
        #: catastrophic log-ratio (:data:`CATASTROPHIC_LOG_RATIO`), made at the first one;
        #: their largest |delta|
        self.cat: dict[str, np.ndarray] | None = None
        self.cat_max = 0.0
        self.masks = PartialRows(["seq_key"],
                                 [pl.col(f"m{w}").bitwise_or() for w in range(self.words)])

    @staticmethod
    def _add(acc: np.ndarray, k: np.ndarray, w: np.ndarray | None = None) -> None:
        acc += np.bincount(k, weights=w, minlength=acc.size)

    def update(self, batch: pl.DataFrame) -> None:
        kj = batch["_fit_joint"].to_numpy()
        col = _fit_tokens(batch, kj >= 0, self.columns)
        if col is None:
            return
        kj = col("_fit_joint")
        n = kj.size
        if self._buf.shape[1] < n:
            self._buf = np.empty((3, n))
            self._kbuf = np.empty(n, dtype=np.int64)
        d2, t1, t2 = self._buf[:, :n]
        h, d = col("entropy"), col("delta")
        np.multiply(d, d, out=d2)
        # the joint table over the span of keys of the batch
        lo, hi = int(kj.min()), int(kj.max())
        kj = np.subtract(kj, lo, out=self._kbuf[:n])
        span = slice(lo, hi + 1)
        self._add(self.joint["n"][span], kj)
        self._add(self.joint["s_h"][span], kj, h)
        self._add(self.joint["s_d2"][span], kj, d2)
        k = col("_fit_reg")
        np.abs(d, out=t1)
        top = float(t1.max())
        if top >= CATASTROPHIC_LOG_RATIO:  # (rare: a token at most batches' cost)
            self._catastrophic(t1 >= CATASTROPHIC_LOG_RATIO, kj + lo, h, d2, top)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # (H + eps ~ 0: --eps 0)
            np.divide(d2, np.add(h, self.eps, out=t2), out=t2)
        lp = col("infer_logprob")
        for name, w in (("n", None), ("s_d", d), ("s_d2", d2), ("s_absd", t1),
                        ("s_z2", t2), ("s_lp", lp)):
            self._add(self.reg[name], k, w)
        np.multiply(lp, lp, out=t2)  # (t2 and t1 are free again)
        self._add(self.reg["s_lp2"], k, t2)
        np.multiply(lp, d, out=t2)
        self._add(self.reg["s_lpd"], k, t2)
        self._add(self.hist, col("_fit_hist"))
        coarse = col("_fit_coarse")
        bad = _implausible(lp, d, t1)
        if bad is not None:
            kb = coarse[bad]
            lb, db = lp[bad], d[bad]
            for i, w in enumerate((None, lb, db, h[bad], lb * lb, lb * db, db * db)):
                self.units_out[i] += np.bincount(kb, weights=w, minlength=self.nb)
        # sequences per bin: OR of 2^coarse over runs of one sequence (rows of a sequence
        # are usually contiguous), then merged by seq_key
        sk = col("seq_key")
        change = np.empty(sk.size, dtype=bool)
        change[0] = True
        np.not_equal(sk[1:], sk[:-1], out=change[1:])
        starts = np.flatnonzero(change)
        bit = self.bit_of.take(coarse)
        cols = {"seq_key": sk[starts]}
        word = coarse // 64 if self.words > 1 else None
        for w in range(self.words):
            bits = bit if word is None else np.where(word == w, bit, np.uint64(0))
            cols[f"m{w}"] = np.bitwise_or.reduceat(bits, starts)
        self.masks.add(cols)

    def _catastrophic(self, m: np.ndarray, keys: np.ndarray, h: np.ndarray, d2: np.ndarray,
                      top: float) -> None:
        """Adds the tokens ``m`` of a batch (joint ``keys``: ((step range * nc + cell) * S1 +
        staleness) * B + block) to :attr:`cat`."""
        if self.cat is None:
            self.cat = {c: np.zeros(self.nc * self.B) for c in self.joint}
        k = keys[m]
        k = (k // (self.B * self.S1)) % self.nc * self.B + k % self.B  # (cell, block)
        np.add.at(self.cat["n"], k, 1.0)
        np.add.at(self.cat["s_h"], k, h[m])
        np.add.at(self.cat["s_d2"], k, d2[m])
        self.cat_max = max(self.cat_max, top)

    def _joint(self, name: str) -> np.ndarray:
        """Sums per (cell, staleness, step range, block), ``(nc, S1, R1, B)`` C-contiguous
        (the tables below are reduced from this layout)."""
        J = self.joint[name].reshape(self.R1, self.nc, self.S1, self.B)
        return np.ascontiguousarray(J.transpose(1, 2, 0, 3))

    @property
    def cb(self) -> dict[str, np.ndarray]:
        """Sums per (cell, block), flat ``(nc * B,)``."""
        return {c: self._joint(c).sum(axis=(1, 2)).ravel() for c in self.joint}

    @property
    def cb_catastrophic(self) -> dict[str, np.ndarray] | None:
        """:attr:`cb` of the catastrophic tokens alone; None when there is none."""
        return self.cat

    def _strata(self, axis: int, n: int) -> dict[str, np.ndarray]:
        out = {}
        ok = self.cell_coarse >= 0
        for c in self.joint:
            J = self._joint(c).sum(axis=2 if axis == 1 else 1)[:, 1:n + 1, :]  # (nc, n, B)
            t = np.zeros((self.nb, n, self.B))
            np.add.at(t, self.cell_coarse[ok], J[ok])
            out[c] = t.transpose(1, 0, 2).ravel()
        return out

    @property
    def st(self) -> dict[str, np.ndarray]:
        """Sums per (staleness bucket, coarse bin, block), flat ``(n_stale * nb * B,)``."""
        if not self.has_stale:
            return {c: np.zeros(self.n_stale * self.nb * self.B) for c in self.joint}
        return self._strata(1, self.n_stale)

    @property
    def sr(self) -> dict[str, np.ndarray]:
        """Sums per (step range, coarse bin, block), flat ``(max(nr, 1) * nb * B,)``."""
        if not self.has_sr:
            return {c: np.zeros(max(self.nr, 1) * self.nb * self.B) for c in self.joint}
        return self._strata(2, max(self.nr, 1))

    def sequences_per_bin(self) -> np.ndarray:
        """Exact number of distinct sequences with a token in each coarse bin."""
        out = np.zeros(self.nb, dtype=np.int64)
        t = self.masks.result()
        if not t.height:
            return out
        for w in range(self.words):
            m = t[f"m{w}"].to_numpy().astype(np.uint64)
            for j in range(64 * w, min(64 * (w + 1), self.nb)):
                out[j] = int(((m >> np.uint64(j - 64 * w)) & np.uint64(1)).sum())
        return out


def _implausible(lp: np.ndarray, d: np.ndarray, buf: np.ndarray) -> np.ndarray | None:
    """Which tokens have an impossible logprob (at or below IMPLAUSIBLE_LOGPROB) on either
    side (``lp``: infer_logprob, ``d``: delta, so train_logprob = lp + d; ``buf``: a float
    buffer of their length, overwritten); None when none has (two minima)."""
    t = IMPLAUSIBLE_LOGPROB
    train = np.add(lp, d, out=buf)
    if lp.size == 0 or (float(lp.min()) > t and float(train.min()) > t):
        return None
    return (lp <= t) | (train <= t)


def _fit_tokens(batch: pl.DataFrame, ok: np.ndarray, columns: Sequence[str]
                ) -> Callable[[str], np.ndarray] | None:
    """A reader of a batch's columns restricted to the fit's tokens (``ok``: ``_fit_joint
    >= 0``) as numpy arrays (``columns`` through :func:`column`, shared with the pass's
    other accumulators); None when the batch holds none."""
    if not ok.any():
        return None
    full = bool(ok.all())

    def col(name: str) -> np.ndarray:
        v = column(batch, name) if name in columns else batch[name].to_numpy()
        return v if full else v[ok]

    return col


class _FileUnits:
    """Accumulator of the units check per input file: sums of infer_logprob, delta,
    entropy and the token count per (input file, coarse entropy bin) over the fit's tokens,
    in the fit's pass (it reads the fit's per-token keys ``_fit_joint`` and
    ``_fit_coarse``, and the loader's file index, :data:`~entr_diag.passes.FILE_INDEX`)."""

    columns = ("entropy", "delta", "infer_logprob", FILE_INDEX)

    def __init__(self, nb: int, n_files: int) -> None:
        self.nb, self.n_files = nb, n_files
        #: (7, n_files * nb): n, s_lp, s_d, s_h, s_lp2, s_lpd, s_d2
        self.sums = np.zeros((7, n_files * nb))

    def update(self, batch: pl.DataFrame) -> None:
        col = _fit_tokens(batch, batch["_fit_joint"].to_numpy() >= 0, self.columns)
        if col is None:
            return
        k = col(FILE_INDEX).astype(np.int64) * self.nb + col("_fit_coarse")
        size = self.sums.shape[1]
        w = {name: col(name) for name in ("infer_logprob", "delta", "entropy")}
        bad = _implausible(w["infer_logprob"], w["delta"], np.empty(k.size))
        if bad is not None:  # impossible logprobs left out (see _FitSums.units_out)
            k = k[~bad]
            w = {name: v[~bad] for name, v in w.items()}
        self.sums[0] += np.bincount(k, minlength=size)
        lp, d = w["infer_logprob"], w["delta"]
        for i, v in enumerate((lp, d, w["entropy"], lp * lp, lp * d, d * d), start=1):
            self.sums[i] += np.bincount(k, weights=v, minlength=size)


#: tokens a file needs for its own units check (:class:`FileUnitsPlan`): on a few thousand
#: tokens the bins' ratios scatter by 10%, beyond the signatures' 7% window
MIN_FILE_UNIT_TOKENS = 20_000
#: ... for its own other-token check (a logprob of another token): the two columns' mean
#: surprisals differ by more than 1.3x there, which a few thousand tokens already show
MIN_FILE_OTHER_TOKEN_TOKENS = 2_000
#: a file whose mismatch (mean delta^2 at the same entropy) is at least this many times the
#: other files' is named (:meth:`FileUnitsPlan.scale_outliers`): staleness and drift move a
#: run's mismatch by 2 to 6 times from step to step; one shard sampled at another
#: temperature, or with an engine-only top-k, by 700 to 3000 times
FILE_SCALE_FACTOR = 10.0
#: ... over the entropy bins holding at least this many of its tokens and of the others'
FILE_SCALE_BIN_TOKENS = 20


class FileUnitsPlan:
    """The units check (:class:`UnitsCheck`) per input file, as an accumulator of the fit's
    pass over a loaded dataset's frame: a unit mistake in one shard of several (entropy in
    bits, one logprob column in log10 in the files of one writer) leaves the pooled check
    near 1 but scales that file's ratios by a unit's factor; so does a logprob column of
    another token written by one writer (``other_token``). ``files``: the input files
    (``Dataset.files`` paths, in order). :meth:`finish` (``pooled``: the input's own
    :class:`UnitsCheck`) returns the files whose own check names a mistake or an entropy
    mismatch the pooled check does not (at least MIN_FILE_UNIT_TOKENS tokens) or another
    token's column (at least MIN_FILE_OTHER_TOKEN_TOKENS), ``[(file, UnitsCheck)]``; [] when the pooled check names
    a mistake no file contradicts (it says it for the input), when every checked file names
    the same mistake, or with fewer than two checked files. A pooled mistake that a file
    contradicts with another one (half the shards' infer_logprob in log10, read pooled as
    train_logprob in log2) is the mix's: the files that name one are returned."""

    def __init__(self, fit: FitPlan, files: Sequence[str]) -> None:
        self.files = list(files)
        self.acc = _FileUnits(fit.binning.n_bins, len(self.files))
        self.accumulators = [self.acc]

    def scale_outliers(self) -> list[dict]:
        """The files (with MIN_FILE_OTHER_TOKEN_TOKENS tokens or more) whose mismatch is
        :data:`FILE_SCALE_FACTOR` times or more the other files' at the same entropy:
        ``[{"file", "tokens", "ratio"}]``, ``ratio`` the token-weighted median over the
        entropy bins (those holding FILE_SCALE_BIN_TOKENS of the file's tokens and of the
        others') of the file's mean delta^2 over the other files' pooled one; a median, so
        that a few catastrophic tokens do not name a file. A fault confined to one shard of
        several (a node sampling at another temperature, an engine-only top-k) moves the
        pooled law and no pooled check (the sequence-outlier check reads a quarter of the
        sequences as a broad tail); [] with fewer than two files."""
        if len(self.files) < 2:
            return []
        t = self.acc.sums.reshape(7, len(self.files), self.acc.nb)
        n, d2 = t[0], t[6]
        n_all, d2_all = n.sum(axis=0), d2.sum(axis=0)
        out = []
        for i, f in enumerate(self.files):
            if n[i].sum() < MIN_FILE_OTHER_TOKEN_TOKENS:
                continue
            on, od2 = n_all - n[i], d2_all - d2[i]  # (the other files')
            ok = (n[i] >= FILE_SCALE_BIN_TOKENS) & (on >= FILE_SCALE_BIN_TOKENS) & (od2 > 0)
            if not ok.any():
                continue
            r = (d2[i][ok] / n[i][ok]) / (od2[ok] / on[ok])
            order = np.argsort(r)
            cum = np.cumsum(n[i][ok][order])
            ratio = float(r[order][np.searchsorted(cum, cum[-1] / 2)])
            if ratio >= FILE_SCALE_FACTOR:
                out.append({"file": f, "tokens": int(n[i].sum()), "ratio": ratio})
        return sorted(out, key=lambda d: -d["ratio"])

    def finish(self, pooled: UnitsCheck | None = None) -> list[tuple[str, UnitsCheck]]:
        t = self.acc.sums.reshape(7, len(self.files), self.acc.nb)
        checks = []
        for i, f in enumerate(self.files):
            n = t[0, i].sum()
            if n < MIN_FILE_OTHER_TOKEN_TOKENS:
                continue
            # (fewer than MIN_FILE_UNIT_TOKENS: enough for the other-token check only)
            c = _units_check(*(t[j, i] for j in (1, 2, 3, 0, 4, 5, 6)),
                             match_units=n >= MIN_FILE_UNIT_TOKENS)
            checks.append((f, c))
        if len(checks) < 2:
            return []
        mistakes = {c.likely_mistake for _f, c in checks}
        if pooled is not None and pooled.likely_mistake and mistakes <= {
                pooled.likely_mistake, None}:
            return []  # no file names another mistake: the pooled check says it
        if pooled is not None and pooled.other_token:  # named pooled: which files hold it?
            flagged = [(f, c) for f, c in checks if c.other_token]
        else:  # (an entropy mismatch of some files only: one writer's entropy before the
            # temperature reads 0.58 in its file, 0.9 pooled)
            pooled_em = pooled is not None and bool(pooled.entropy_mismatch
                                                    or pooled.entropy_scale)
            flagged = [(f, c) for f, c in checks if c.likely_mistake or c.other_token
                       or ((c.entropy_mismatch or c.entropy_scale) and not pooled_em)]
        if len(flagged) == len(checks) and len(mistakes) == 1:
            return []
        return flagged


class FitPlan:
    """:func:`fit_scaling_law` in two steps: the accumulators of its one pass over the token
    frame (:func:`entr_diag.passes.run_pass`, possibly together with other analyses'), then
    :meth:`finish`. Built by :func:`fit_plan`, which runs the small pass 1 (fine grid)."""

    def __init__(self, *, n_tokens: int, binning: CoarseBinning, brk: CoarseBinning,
                 cells: CoarseBinning, sums: _FitSums, params: dict, notices: list[str],
                 step_labels: list[str], has_stale: bool) -> None:
        self.n_tokens, self.binning, self.brk, self.cells = n_tokens, binning, brk, cells
        self.sums = sums
        self.accumulators = [sums]
        self.params = params
        self.notices = notices
        self.step_labels = step_labels
        self.has_stale = has_stale

    def finish(self) -> FitResult:
        """The fit from the accumulated sums (after the pass). Raises :class:`FitError` as
        :func:`fit_scaling_law` does."""
        return _finish_fit(self)


def fit_plan(
    lf: pl.LazyFrame,
    *,
    bins: int = DEFAULT_BINS,
    bin_edges: str = "quantile",
    eps: float = 0.01,
    tau: float = 4.0,
    n_boot: int = 1000,
    n_blocks: int = 200,
    seed: int = 0,
    with_strata: bool = True,
    fine_counts: np.ndarray | None = None,
    step_range: tuple[int, int] | None = None,
    staleness_unit: int = 1,
) -> FitPlan:
    """Check the parameters, run pass 1 (tokens per fine entropy bin and the step range; one
    light streaming scan) and choose the bins; returns the :class:`FitPlan` whose
    accumulators do the rest in one pass. Same parameters and errors as
    :func:`fit_scaling_law`.

    ``fine_counts`` (int array of length ``N_FINE + 1``, tokens of ``lf`` per fine bin of
    :func:`~entr_diag.aggregate.fine_bin_expr`, e.g. ``Dataset.entropy_fine_counts``) and
    ``step_range`` (lowest, highest step of ``lf``) skip pass 1 when they are known.
    ``staleness_unit``: as :func:`fit_scaling_law`'s (an integer >= 1)."""
    lf = token_frame(lf, "fit_plan")
    _check_numbers("fit_plan", bins=bins, eps=eps, tau=tau, n_boot=n_boot, n_blocks=n_blocks,
                   seed=seed, with_strata=with_strata)
    check_fit_parameters(eps, tau, n_boot, bins)
    _check_blocks(n_blocks)
    if (isinstance(staleness_unit, bool) or not isinstance(staleness_unit, numbers.Integral)
            or staleness_unit < 1):
        raise ParameterError(f"staleness_unit must be an integer >= 1, got {staleness_unit!r}.")
    staleness_unit = int(staleness_unit)
    if int(seed) != seed or seed < 0:
        raise ParameterError(f"seed must be an integer >= 0, got {seed!r}.")
    lfu = usable(lf)
    names = lf.collect_schema().names()
    B = int(n_blocks)
    has_step = "step" in names
    want_steps = has_step and with_strata
    if fine_counts is None or (want_steps and step_range is None):
        q1 = fine_query(lfu, eps=eps)
        if want_steps:
            q1 = (
                _inputs(lfu, fine_bin_expr().alias("fine"), pl.col("step").alias("_step"))
                .group_by("fine")
                .agg(*_sums(eps), pl.col("_step").min().alias("_lo"),
                     pl.col("_step").max().alias("_hi"))
                .sort("fine")
            )
        t1 = q1.collect(engine="streaming")
        fine_counts = FineAggregate(table=t1.drop("_lo", "_hi", strict=False),
                                    eps=eps).counts_per_fine()
        if want_steps and t1.height and t1["_lo"].min() is not None:
            step_range = (int(t1["_lo"].min()), int(t1["_hi"].max()))
    counts = np.asarray(fine_counts, dtype=np.int64)
    if counts.shape != (N_FINE + 1,):
        raise ParameterError(f"fine_counts must have length {N_FINE + 1}, got {counts.shape}.")
    if counts.sum() == 0:
        raise FitError("No token with a finite entropy: the scaling-law fit has nothing to bin.")
    binning = coarse_binning(counts, bins, bin_edges)
    brk = coarse_binning(counts, max(2 * int(bins), BREAK_BINS), bin_edges)
    cells = joint_binning(binning, brk)

    notices: list[str] = []
    stale_key = _staleness_expr(names, staleness_unit) if with_strata else None
    step_labels: list[str] = []
    step_key = None
    if with_strata:
        if stale_key is None:
            notices.append("staleness strata skipped: no staleness (or policy_version and "
                           "train_version) column")
        elif staleness_unit != 1:
            notices.append(f"staleness strata count lags of {staleness_unit:,} versions (the "
                           "staleness values' greatest common divisor; labels in versions)")
        if want_steps and step_range is not None:
            s_lo, s_hi = step_range
            n_steps = s_hi - s_lo + 1
            n_rng = min(MAX_STEP_RANGES, n_steps)
            width = -(-n_steps // n_rng)
            n_rng = -(-n_steps // width)
            for i in range(n_rng):
                a, b = s_lo + i * width, min(s_hi, s_lo + (i + 1) * width - 1)
                step_labels.append(f"{a}" if a == b else f"{a}-{b}")
            step_key = ((pl.col("step") - s_lo) // width).cast(pl.Int32)
        else:
            notices.append("step strata skipped: no step column")
    else:
        notices.append("strata not computed (with_strata=False)")
    sums = _FitSums(names, binning, cells, B, eps, tau, stale_key, step_key, len(step_labels))
    params = {"bins": bins, "bin_edges": bin_edges, "eps": eps, "tau": tau, "n_boot": n_boot,
              "n_blocks": B, "seed": seed, "with_strata": with_strata,
              "staleness_unit": staleness_unit}
    return FitPlan(n_tokens=int(counts.sum()), binning=binning, brk=brk, cells=cells, sums=sums, params=params,
                   notices=notices, step_labels=step_labels, has_stale=stale_key is not None)


#: Largest ``n_boot * breakpoint bins``: the bootstrap holds (bins x n_boot) float64 matrices,
#: about two dozen at a time at its peak (20M: 160 MB each, about 4 GB in all; measured on
#: the bundled run: 3.9 GB peak RSS at bins 100 and n_boot 100,000).
MAX_BOOT_CELLS: int = 20_000_000


#: the parameters of the fit that count something: integers (a float is accepted when it
#: is integral, e.g. 1e3)
_INTEGER_PARAMS = ("bins", "n_boot", "n_blocks", "seed")


def _integer(name: str, value: object, who: str = "") -> None:
    """ParameterError naming ``name`` when ``value`` (a real number) is not an integer: a
    non-finite or fractional float (``bins=nan`` or ``inf`` would fail in ``int()``)."""
    if isinstance(value, numbers.Integral):
        return
    if not (math.isfinite(value) and int(value) == value):
        raise ParameterError(f"{who + ': ' if who else ''}{name} must be an integer, "
                             f"got {value!r}.")


def _check_numbers(who: str, **params: object) -> None:
    """TypeError (naming ``who`` and the parameter) for a parameter that is not a real
    number, e.g. ``tau="4"``, or for ``with_strata`` that is not a bool; ParameterError for
    an integer parameter (bins, n_boot, n_blocks, seed) given a non-finite or fractional
    float."""
    for name, value in params.items():
        if name == "with_strata":
            if not isinstance(value, bool | np.bool_):
                raise TypeError(f"{who}: expected with_strata as a bool (True or False), "
                                f"got {type(value).__name__} ({value!r}).")
            continue
        number(value, who, name)
        if name in _INTEGER_PARAMS:
            _integer(name, value, who)


def check_fit_parameters(eps: float, tau: float, n_boot: int, bins: int | None = None) -> None:
    """Raise :class:`ParameterError` unless ``eps >= 0``, ``tau > 0`` (both finite),
    ``n_boot`` is an integer >= MIN_BOOT and, with ``bins``, ``bins >= 3`` and ``n_boot`` times the
    breakpoint bins (``max(2 * bins, BREAK_BINS)``) is at most MAX_BOOT_CELLS (the checks
    of :func:`fit_scaling_law`)."""
    if not (eps >= 0 and math.isfinite(eps)):
        raise ParameterError(f"eps must be a finite number >= 0 (nats), got {eps!r}.")
    if not (tau > 0 and math.isfinite(tau)):
        raise ParameterError(f"tau must be a finite number > 0, got {tau!r}.")
    if not (isinstance(n_boot, numbers.Integral) or math.isfinite(n_boot)) or (
            int(n_boot) != n_boot or n_boot < MIN_BOOT):
        raise ParameterError(
            f"n_boot must be an integer >= {MIN_BOOT} (intervals and the breakpoint test are "
            f"bootstrap percentiles), got {n_boot!r}."
        )
    if bins is not None:
        _integer("bins", bins)
        if bins < 3:  # (the CLI's --bins bound too)
            raise ParameterError(f"bins must be at least 3 (a law is fitted on 3 or more "
                                 f"entropy bins), got {bins!r}.")
        fine = max(2 * int(bins), BREAK_BINS)
        if n_boot * fine > MAX_BOOT_CELLS and MAX_BOOT_CELLS // fine < MIN_BOOT:
            # no n_boot would do: the bins are too many (not the resamples)
            most = MAX_BOOT_CELLS // (2 * MIN_BOOT)
            at = MAX_BOOT_CELLS // (2 * int(n_boot))
            raise ParameterError(
                f"bins = {bins} is too large: the bootstrap would hold {fine} breakpoint bins "
                f"x {n_boot} resamples per matrix (about {n_boot * fine * 8 / 1e9:.1f} GB "
                f"each); use at most bins = {most:,} (with the minimum n_boot = {MIN_BOOT})"
                + (f", or {at:,} with n_boot = {n_boot}" if n_boot > MIN_BOOT and at >= 3
                   else "") + ".")
        if n_boot * fine > MAX_BOOT_CELLS:
            raise ParameterError(
                f"n_boot = {n_boot} with bins = {bins} is too much: the bootstrap would hold "
                f"{fine} breakpoint bins x {n_boot} resamples per matrix (about "
                f"{n_boot * fine * 8 / 1e9:.1f} GB each); use at most "
                f"n_boot = {MAX_BOOT_CELLS // fine} at {bins} bins, or fewer bins.")


def _block_sums(acc: np.ndarray, binning: CoarseBinning, cells: CoarseBinning, B: int
                ) -> np.ndarray:
    """(cells x B) flat sums -> (bins x B) sums of ``binning`` (its edges are cell edges)."""
    cell_bin = binning.coarse_of_fine(cells.starts[:-1])
    out = np.zeros((binning.n_bins, B))
    A = acc.reshape(cells.n_bins, B)
    ok = cell_bin >= 0
    np.add.at(out, cell_bin[ok], A[ok])
    return out


@dataclass
class _Core:
    """The fit's per-(bin, block) sums and what the verdict's law and break are read from
    (:func:`_core`); ``search`` is None when fewer than 3 bins are usable."""

    S: dict
    tot: dict
    bd_all: _BinData
    Sb: dict | None = None
    bd_brk: _BinData | None = None
    search: BreakpointSearch | None = None
    bp: Breakpoint | None = None
    bd: _BinData | None = None
    law_bins: np.ndarray | None = None
    grid: str = "bins"


def _block_sums_of(cb: dict, binning: CoarseBinning, cells: CoarseBinning, B: int,
                   keep: np.ndarray | None = None) -> dict:
    """Per (bin, block) sums of n, s_h and s_d2 (:func:`_block_sums`); ``keep`` (B,): 0 for
    the blocks left out (their sums zeroed)."""
    out = {c: _block_sums(cb[c], binning, cells, B) for c in ("n", "s_h", "s_d2")}
    return out if keep is None else {c: v * keep[None, :] for c, v in out.items()}


def _core(cb: dict, binning: CoarseBinning, brk: CoarseBinning, cells: CoarseBinning,
          B: int, boot: _Boot, keep: np.ndarray | None = None, S: dict | None = None
          ) -> _Core:
    """The bins, the breakpoint search and the law regime's bins from the joint (cell x
    block) sums ``cb``; ``keep`` (B,): 0 for the sequence blocks left out (their sums
    zeroed; the bootstrap's multiplicities stay), for :func:`_influence`; ``S``: the
    bins' sums (:func:`_block_sums_of`) when the caller has them."""
    if S is None:
        S = _block_sums_of(cb, binning, cells, B, keep)
    tot = {c: boot.totals(S[c]) for c in S}
    bd_all = _eligible(S, tot, boot, binning)
    if bd_all.idx.size < 3:
        return _Core(S, tot, bd_all)
    # ---- breakpoint on finer bins (same edge kind), then laws on the law regime
    Sb = _block_sums_of(cb, brk, cells, B, keep)
    bd_brk = _eligible(Sb, {c: boot.totals(Sb[c]) for c in ("n", "s_h", "s_d2")}, boot, brk)
    search, bp, _ = _search_break(bd_brk, brk.h_lo[bd_brk.idx], brk.h_hi[bd_brk.idx])
    h_star = None if bp is None else bp.h_star
    grid = "bins"
    if h_star is None:
        bd = bd_all
        law_bins = bd_all.idx
    else:
        # The law regime starts at the upper end of H*'s interval, so that no bin straddling
        # the break (a few noise tokens dominate a mean of delta^2) enters the law fits.
        # Edges are fine-bin edges: compare with a relative tolerance.
        h_law = bp.h_star_ci[1] if np.isfinite(bp.h_star_ci[1]) else h_star
        cut = h_law * (1 - 1e-9)
        above = bd_all.lo >= cut
        if above.sum() < 3:
            cut = h_star * (1 - 1e-9)
            above = bd_all.lo >= cut
        law_bins = bd_all.idx[above]
        if above.sum() >= 3:
            bd = bd_all.subset(above)
        else:  # law regime narrower than 3 display bins: fit on the finer breakpoint bins
            bd = bd_brk.subset(bd_brk.lo >= cut)
            grid = "breakpoint"
    return _Core(S, tot, bd_all, Sb, bd_brk, search, bp, bd, law_bins, grid)


def _refit(alt: _Core) -> tuple[str, Breakpoint | None, str] | None:
    """The law reading, the break and the verdict's text of a fit made again on other sums
    (``alt``: :func:`_core` of them); None when fewer than 3 bins are left."""
    if alt.search is None or alt.bd is None or alt.bd.idx.size < 3:
        return None
    k, alpha, kr, ar, chi2, r2 = _fit_power(alt.bd)
    power = PowerLaw(k, _ci(kr), alpha, _ci(ar), chi2, r2, int(alt.bd.idx.size),
                     float(alt.bd.lo[0]), float(alt.bd.hi[-1]),
                     RobustPower(_NAN, _NAN, _CI_NAN, False, ""))
    law, head = _law_status(power)
    bp = alt.bp
    d = 2 if bp is None else _digits_apart(*bp.h_star_ci)
    text = f"{head}, k = {_fmt(k)}; " + (
        f"noise regime below H* = {_fmt(bp.h_star, d)} [{_fmt(bp.h_star_ci[0], d)}, "
        f"{_fmt(bp.h_star_ci[1], d)}]" if bp is not None
        else f"no low-entropy break: {alt.search.reason}")
    return law, bp, text


def _catastrophic(fs: _FitSums, cb: dict, verdict: Verdict, binning: CoarseBinning,
                  brk: CoarseBinning, cells: CoarseBinning, B: int, boot: _Boot
                  ) -> Catastrophic | None:
    """:class:`Catastrophic` from the fit's sums (``fs.cb_catastrophic`` taken out of
    ``cb``); None when no token's |delta| reaches CATASTROPHIC_LOG_RATIO."""
    cat = fs.cb_catastrophic
    if cat is None:
        return None
    n_all, d2_all = float(cb["n"].sum()), float(cb["s_d2"].sum())
    rest = {c: np.maximum(cb[c] - cat[c], 0.0) for c in cb}  # (rounding: never below 0)
    again = _refit(_core(rest, binning, brk, cells, B, boot))
    law, bp, text = again if again is not None else (None, None, None)
    return Catastrophic(
        threshold=CATASTROPHIC_LOG_RATIO,
        tokens=int(round(cat["n"].sum())),
        token_share=float(cat["n"].sum() / n_all) if n_all else _NAN,
        delta2_share=float(cat["s_d2"].sum() / d2_all) if d2_all > 0 else _NAN,
        max_abs_delta=fs.cat_max,
        law=law,
        noise_regime=None if again is None else bp is not None,
        verdict=text,
        changes=again is not None and (law != verdict.law
                                       or (bp is not None) != verdict.noise_regime),
    )


def _influence(core: _Core, verdict: Verdict, cb: dict, binning: CoarseBinning,
               brk: CoarseBinning, cells: CoarseBinning, B: int, boot: _Boot
               ) -> Influence | None:
    """:class:`Influence`: the law and the break fitted again without the sequence blocks
    that dominate a bin of the breakpoint search (the finer bins, covering every entropy
    the fit reads), when there are few such blocks; None when none dominates, when many do
    (a heavy tail the law's means are made of), or when too few bins are left."""
    if core.Sb is None or core.bd_brk is None:
        return None
    idx = core.bd_brk.idx
    d2 = core.Sb["s_d2"][idx]  # (eligible breakpoint bins, B)
    n = core.Sb["n"][idx]
    d2_bin, n_bin = d2.sum(axis=1, keepdims=True), n.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        share = d2 / d2_bin  # of the bin's sum delta^2
        excess = share / (n / n_bin)  # over the block's token share
        hit = (share >= DOMINANT_SHARE) & (excess >= DOMINANT_EXCESS)
        # what a block adds to the bins it dominates over its tokens' share of their sums
        extra = np.where(hit, d2 - n * (d2_bin / n_bin), 0.0).sum(axis=0)
    # ... when that is a share of the run's sum delta^2: a catastrophic token adds far more
    # than the rare rounding events a real run's low-entropy bins are made of, whose means
    # they set too (a heavy tail, not a few tokens)
    blocks = np.flatnonzero(hit.any(axis=0) & (extra >= DOMINANT_RUN_SHARE * d2.sum()))
    if blocks.size == 0:
        return None
    # the blocks adding most first, at most MAX_DOMINANT_SHARE of the blocks
    blocks = blocks[np.argsort(-extra[blocks], kind="stable")]
    blocks = np.sort(blocks[:max(1, int(MAX_DOMINANT_SHARE * boot.blocks.size))])
    keep = np.ones(B)
    keep[blocks] = 0.0
    again = _refit(_core(cb, binning, brk, cells, B, boot, keep))
    if again is None:
        return None
    law, bp, text = again
    S = core.S
    dom = idx[hit.any(axis=1)]
    return Influence(
        blocks_left_out=int(blocks.size),
        blocks_nonempty=int(boot.blocks.size),
        token_share=float(S["n"][:, blocks].sum() / S["n"].sum()),
        delta2_share=float(S["s_d2"][:, blocks].sum() / S["s_d2"].sum()),
        bins_dominated=tuple((float(brk.h_lo[i]), float(brk.h_hi[i])) for i in dom),
        law=law,
        noise_regime=bp is not None,
        verdict=text,
        changes=law != verdict.law or (bp is not None) != verdict.noise_regime,
    )


def _finish_fit(plan: FitPlan) -> FitResult:
    p = plan.params
    bins, bin_edges, eps, tau = p["bins"], p["bin_edges"], p["eps"], p["tau"]
    n_boot, B, seed, with_strata = p["n_boot"], p["n_blocks"], p["seed"], p["with_strata"]
    binning, brk, cells, fs = plan.binning, plan.brk, plan.cells, plan.sums
    nb = binning.n_bins
    notices = list(plan.notices)
    step_labels = plan.step_labels
    NP = len(P_BINS)
    # per (cell, flag, p bin) -> per coarse bin totals of the sums only needed as points
    cell_bin = binning.coarse_of_fine(cells.starts[:-1])
    reg = {c: v.reshape(cells.n_bins, 2, NP) for c, v in fs.reg.items()}

    def per_bin(v: np.ndarray) -> np.ndarray:
        out = np.zeros(nb)
        ok = cell_bin >= 0
        np.add.at(out, cell_bin[ok], v[ok])
        return out

    cb = fs.cb  # summed from the joint table once
    S = _block_sums_of(cb, binning, cells, B)
    boot = _Boot(S["n"].sum(axis=0), n_boot, seed)
    if boot.W.shape[0] == 0:
        raise FitError(
            "All tokens fall into one sequence block: the sequence bootstrap needs tokens "
            "from at least 2 sequences."
        )
    point = {c: per_bin(reg[c].sum(axis=(1, 2))) for c in ("s_d", "s_absd", "s_z2")}
    point["n_plow"] = per_bin(reg["n"][:, :, :2].sum(axis=(1, 2)))  # p < 1e-3: P_BINS 0, 1
    core = _core(cb, binning, brk, cells, B, boot, S=S)
    tot, bd_all = core.tot, core.bd_all
    n0 = tot["n"][0]
    mean_h, mean_d2 = _div(tot["s_h"][0], n0), _div(tot["s_d2"][0], n0)
    D2r = _div(tot["s_d2"][1], tot["n"][1])
    if core.search is None:  # fewer than 3 usable bins
        zero = binning.has_zero_bin
        n_pos = int(n0[1:].sum() if zero else n0.sum())
        if n_pos == 0:
            raise FitError(
                f"Every token has entropy below {H_MIN:g} nats: the law cannot be fitted on a "
                "log entropy axis; check that the entropy column holds nats, not a mask."
            )
        if not np.nansum(tot["s_d2"][0]) > 0:
            from entr_diag.caveats import ALL_IDENTICAL_CAUSES

            raise FitError(
                "delta = train_logprob - infer_logprob is 0 for every token: train and "
                "inference log-probabilities are identical, so there is no mismatch to fit "
                f"({ALL_IDENTICAL_CAUSES})."
            )
        k = bd_all.idx.size
        raise FitError(
            (f"Only {k} entropy bin(s) hold" if k else "No entropy bin holds")
            + f" enough tokens (need 3 bins with >= {MIN_BIN_TOKENS} tokens from >= 2 "
            f"sequence blocks and H >= {H_MIN:g} nats); {MORE_DATA}."
        )
    S, search, bp, bd, law_bins, grid = (core.S, core.search, core.bp, core.bd,
                                         core.law_bins, core.grid)
    h_star = None if bp is None else bp.h_star
    kpow, alpha, kr, ar, chi2p, r2p = _fit_power(bd)
    alpha_ci = _ci(ar)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from scipy import stats  # imported when used (0.6 s)

        ts = stats.theilslopes(bd.ly, bd.lx, alpha=0.95)
    rob_alpha = float(ts.slope)
    disagrees = bool(
        np.isfinite(alpha_ci[0])
        and not (alpha_ci[0] <= rob_alpha <= alpha_ci[1])
        and abs(rob_alpha - alpha) > 0.05
    )
    curv = _curvature(bd)
    differ = (f"robust (Theil-Sen) alpha = {rob_alpha:.2f} differs from least-squares alpha "
              f"= {alpha:.2f} [{alpha_ci[0]:.2f}, {alpha_ci[1]:.2f}]: ")
    if not disagrees:
        note = "robust (Theil-Sen) and least-squares alpha agree"
    elif curv is not None and curv.bends:  # no line to agree on: each weighs the bins its way
        note = differ + (
            f"the bins do not lie on one line (slope {curv.slope_low:.2f} over the lowest "
            f"third of them, {curv.slope_high:.2f} over the highest), so no one slope "
            "describes them and the median of the pairwise slopes (Theil-Sen) and the "
            "least-squares line summarize the curve differently")
    else:
        note = differ + ("a few bins dominate the least-squares fit; inspect the bins with "
                         "heavy tails")
    robust = RobustPower(float(math.exp(ts.intercept)), rob_alpha,
                         (float(ts.low_slope), float(ts.high_slope)), disagrees, note)
    power = PowerLaw(kpow, _ci(kr), alpha, alpha_ci, chi2p, r2p, int(bd.idx.size),
                     float(bd.lo[0]), float(bd.hi[-1]), robust, curv)
    kp, kpr, chi2k, r2k, kp_rob = _fit_proportional(bd)
    prop = ProportionalLaw(kp, _ci(kpr), kp_rob, chi2k, r2k, int(bd.idx.size))
    ka, ca, kar, car, chi2a, r2a = _fit_affine(bd, kp * bd.h)
    aff = AffineLaw(ka, _ci(kar), ca, _ci(car), chi2a, r2a, int(bd.idx.size))

    # ---- the noise regime (needs H*: a cell edge, so "H < H*" is a set of cells) and the
    # |delta| histogram per coarse bin, both from the pass's sums
    below_cell = (cells.h_hi <= h_star * (1 + 1e-9)) if h_star is not None else (
        np.zeros(cells.n_bins, dtype=bool))
    rows = []
    for below in (False, True):
        sel = below_cell == below
        for z in (0, 1):
            for pb in range(NP):
                n_ = int(round(reg["n"][sel, z, pb].sum()))
                if n_:
                    rows.append({"below": below, "flag": bool(below and z), "pbin": pb,
                                 "n": n_, "s_d2": float(reg["s_d2"][sel, z, pb].sum())})
    regime_t = (
        pl.DataFrame(rows, schema={"below": pl.Boolean, "flag": pl.Boolean, "pbin": pl.Int32,
                                   "n": pl.Int64, "s_d2": pl.Float64})
        .group_by(["below", "flag", "pbin"]).agg(pl.col("n").sum(), pl.col("s_d2").sum())
        .sort(["below", "flag", "pbin"])
    )
    regime = summarize_regime(regime_t, h_star, tau=tau, eps=eps)
    seqs = fs.sequences_per_bin()
    hist = fs.hist.reshape(nb, _N_D + 1)
    p95 = np.full(nb, _NAN)
    dbins = np.arange(_N_D + 1)
    for j in range(nb):
        nz = hist[j] > 0
        if nz.any():
            p95[j] = _p95_from_hist(dbins[nz], hist[j][nz])

    staleness_fits: list[StratumFit] = []
    step_fits: list[StratumFit] = []
    if with_strata:
        if plan.has_stale:
            labels = staleness_labels([b[0] for b in STALENESS_BUCKETS],
                                      int(plan.params.get("staleness_unit", 1)))
            staleness_fits = _stratum_fits(fs.st, list(labels),
                                           "staleness", law_bins, nb, boot, B, S, seed,
                                           alpha)
        if step_labels:
            step_fits = _stratum_fits(fs.sr, step_labels, "step", law_bins, nb, boot, B, S,
                                      seed, alpha)

    # ---- bins
    law_set = set(int(i) for i in law_bins)
    bins_out = []
    for j in range(nb):
        n = n0[j]
        bins_out.append(
            BinStats(
                index=j,
                h_lo=float(binning.h_lo[j]),
                h_hi=float(binning.h_hi[j]),
                tokens=int(n),
                sequences=int(seqs[j]),
                mean_h=_f(mean_h[j]),
                mean_delta=_f(_div(point["s_d"][j], n)),
                mean_delta2=_f(mean_d2[j]),
                mean_delta2_ci=_ci(D2r[j]),
                mean_abs_delta=_f(_div(point["s_absd"][j], n)),
                p95_abs_delta=_f(p95[j]),
                share_p_lt_1e3=_f(_div(point["n_plow"][j], n)),
                mean_z2=_f(_div(point["s_z2"][j], n)),
                in_fit=j in law_set,
            )
        )

    params = {
        "bins": bins,
        "bin_edges": bin_edges,
        "bins_realised": nb,
        "eps": eps,
        "tau": tau,
        "n_boot": n_boot,
        "n_blocks": B,
        "blocks_nonempty": int(boot.blocks.size),
        "seed": seed,
        "with_strata": with_strata,
        "staleness_unit": int(plan.params.get("staleness_unit", 1)),
        "tokens": int(plan.n_tokens),
        "fine_grid": {"bins": N_FINE, "h_min": H_MIN, "h_max": H_MAX},
        "min_bin_tokens": MIN_BIN_TOKENS,
        "bic_margin": BIC_MARGIN,
        "min_excess": MIN_EXCESS,
        "min_law_share": MIN_LAW_SHARE,
        "min_support": MIN_SUPPORT,
        "break_bins": brk.n_bins,
        "alpha_exact": ALPHA_EXACT,
        "alpha_tol": ALPHA_TOL,
        "r2_min": R2_MIN,
        "source": "arXiv:2607.22186 (ENTR / ESTR)",
    }
    units = _fit_units(per_bin, reg, point, S, fs)
    if search.reason.startswith("the bins below the best split") and units is not None:
        # (an entropy column read as bits: the split's entropy in its unit and in nats)
        search = replace(search, reason=_no_excess_reason(search.split_h,
                                                          search.excess_ratio,
                                                          units.to_dict()))
    verdict = _make_verdict(power, bp, search, regime, units)
    return FitResult(
        parameters=params,
        bins=tuple(bins_out),
        laws=Laws(prop, aff, power, grid),
        breakpoint=bp,
        breakpoint_search=search,
        regime=regime,
        strata=Strata(tuple(staleness_fits), tuple(step_fits), tuple(notices)),
        verdict=verdict,
        units=units,
        influence=_influence(core, verdict, cb, binning, brk, cells, B, boot),
        catastrophic=_catastrophic(fs, cb, verdict, binning, brk, cells, B, boot),
    )


def _fit_units(per_bin, reg: dict, point: dict, S: dict, fs) -> UnitsCheck:
    """The fit's :class:`UnitsCheck` from its sums per bin, the tokens with an impossible
    logprob left out (``fs.units_out``)."""
    return _units_check(per_bin(reg["s_lp"].sum(axis=(1, 2))) - fs.units_out[1],
                        point["s_d"] - fs.units_out[2],
                        S["s_h"].sum(axis=1) - fs.units_out[3],
                        S["n"].sum(axis=1) - fs.units_out[0],
                        per_bin(reg["s_lp2"].sum(axis=(1, 2))) - fs.units_out[4],
                        per_bin(reg["s_lpd"].sum(axis=(1, 2))) - fs.units_out[5],
                        per_bin(reg["s_d2"].sum(axis=(1, 2))) - fs.units_out[6])
