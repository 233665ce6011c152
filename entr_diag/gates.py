"""Trust-region gates: which loss-masked tokens a rule keeps (issue 4, METHOD.md "Gates").

Every gate is a small frozen dataclass with documented defaults and the source whose
definition it matches. A gate exposes :meth:`keep_expr`, a polars expression evaluating to
one Boolean per token row of the canonical token frame (docs/CONTRACT.md: one row per valid,
loss-masked token; ``delta = train_logprob - infer_logprob`` in nats, ``entropy`` in nats,
``seq_key`` the sequence key). ``True`` = the token stays in the loss, ``False`` = masked.

Notation (per token t): log-ratio ``delta_t`` (nats), importance ratio ``r_t = exp(delta_t)``,
entropy ``H_t`` (nats).

=================  ===============  ==========================================================
gate (aliases)     level            keep rule (defaults)
=================  ===============  ==========================================================
``entr`` (estr)    token            ``delta^2 / (H + eps) <= tau`` (tau = 4, eps = 0.01)
``fixed``          token            ``|delta| <= c`` (c = log 2)
``icepop``         token            ``low <= r <= high`` (0.5, 5.0)
``mis``            token            ``low <= r <= high`` (0.5, 2.0)
``areal``          token            ``floor <= r <= cap`` (cap 5.0, floor 0: none)
``tis``            token (weight)   keeps every token; weight ``min(r, cap)`` (cap = 2)
``seq-is``         sequence         ``lower <= exp(sum_t delta_t) <= upper`` (upper 2, lower 1/2)
``seq-tis``        sequence (wt.)   keeps every token; weight ``min(exp(sum_t delta_t), cap)`` (2)
``geo-rs``         sequence         ``low <= exp(mean_t delta_t) <= high`` (0.999, 1.001)
``k3``             sequence         ``mean_t (r_t - 1 - delta_t) <= threshold`` (0.01)
``veto``           sequence         every token has ``r_t >= min_ratio`` (1e-4)
``m2po``           batch (global)   drop largest ``delta^2`` first until mean of rest < 0.04
=================  ===============  ==========================================================

Sequence gates compare in log space (``sum_t delta_t`` against ``log(upper)``), which equals
the ratio-space rule of the frameworks without overflowing ``exp`` on long sequences.
``keep_expr()`` of a sequence gate uses window expressions ``.over("seq_key")``; the
streaming code path (:mod:`entr_diag.compare`) instead accumulates mergeable per-sequence
partials batch by batch (:meth:`SequenceGate.seq_partials`: sums, counts, minima keyed by
``seq_key``), derives the statistics from the merged table
(:meth:`SequenceGate.stats_from_partials`) and applies :meth:`SequenceGate.keep_from`,
which is the same rule.

Parse a command-line spec with :func:`parse_gate_spec` (``"fixed:c=0.5"``,
``"icepop:low=0.5,high=5"``, ``"entr:tau=4,eps=0.01"``, ``"estr:tau=4"``); every spec prints
back with :meth:`GateSpec.spec` in the same syntax.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import numpy as np
import polars as pl

from entr_diag.errors import ParameterError
from entr_diag.frames import number

__all__ = [
    "GateSpec",
    "TokenGate",
    "SequenceGate",
    "EntrGate",
    "FixedBand",
    "IcePop",
    "TokenMIS",
    "AReaLCap",
    "TIS",
    "SeqIS",
    "SeqTIS",
    "GeoRS",
    "K3SeqRS",
    "CatastrophicVeto",
    "M2PO",
    "GATE_TYPES",
    "DEFAULT_PANEL",
    "parse_gate_spec",
    "gate_help",
    "entr_score_expr",
    "scaled_truncation",
]

_DELTA = pl.col("delta")
_ENTROPY = pl.col("entropy")


def _fmt(x: float) -> str:
    """Shortest round-tripping text of a parameter value (``4`` not ``4.0``)."""
    x = float(x)
    if x.is_integer() and abs(x) < 1e15:
        return str(int(x))
    return repr(x)


def entr_score_expr(eps: float = 0.01) -> pl.Expr:
    """ENTR score ``delta^2 / (H + eps)`` per token (dimensionless; arXiv:2607.22186).

    With ``H + eps == 0`` (only possible with ``eps = 0``) the score is 0 for ``delta == 0``
    and ``+inf`` otherwise, so ``score <= tau`` stays the paper's rule ``|delta| <=
    sqrt(tau (H + eps))``.
    """
    d2 = _DELTA * _DELTA
    den = _ENTROPY + eps
    return (
        pl.when(den > 0).then(d2 / den).when(d2 == 0).then(pl.lit(0.0)).otherwise(pl.lit(math.inf))
    )


@dataclass(frozen=True)
class GateSpec:
    """Base class of all gate specs (frozen; parameters are the dataclass fields).

    Class attributes: ``name`` (canonical, as in specs), ``aliases``, ``level`` (``"token"``,
    ``"sequence"`` or ``"batch"``), ``source`` (whose definition it matches), ``columns``
    (canonical columns the rule reads), ``weights_only`` (TIS: keeps all tokens).

    Constructing a gate raises :class:`TypeError` (naming the gate and the parameter) when a
    parameter is not a real number, e.g. ``EntrGate(tau="4")``, and
    :class:`~entr_diag.errors.ParameterError` when its value is out of range.
    """

    name: ClassVar[str] = ""
    aliases: ClassVar[tuple[str, ...]] = ()
    level: ClassVar[str] = "token"
    source: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    columns: ClassVar[tuple[str, ...]] = ("delta",)
    weights_only: ClassVar[bool] = False

    def params(self) -> dict[str, float]:
        """Parameters as a plain ``{name: float}`` dict, in declaration order."""
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            out[f.name] = float(v) if v is not None else math.nan
        return out

    def spec(self) -> str:
        """The spec string :func:`parse_gate_spec` reads back, e.g. ``"fixed:c=0.5"``."""
        ps = ",".join(f"{k}={_fmt(v)}" for k, v in self.params().items())
        return f"{self.name}:{ps}" if ps else self.name

    @property
    def label(self) -> str:
        """Human label for tables, e.g. ``"fixed c=0.5"``."""
        ps = " ".join(f"{k}={v:.4g}" for k, v in self.params().items())
        return f"{self.name} {ps}".strip()

    def keep_expr(self) -> pl.Expr:  # pragma: no cover - abstract
        """Boolean keep decision per token row (True = kept in the loss)."""
        raise NotImplementedError

    def __post_init__(self) -> None:
        """Every parameter is a real number (None where its type allows it), then
        :meth:`_validate` checks the values."""
        for f in fields(self):
            number(getattr(self, f.name), type(self).__name__, f.name,
                   optional="None" in str(f.type))
        self._validate()

    def _validate(self) -> None:
        """Raise :class:`ParameterError` (via :meth:`_check`) for a value out of range."""

    def _check(self, cond: bool, msg: str) -> None:
        if not cond:
            raise ParameterError(f"gate {self.name!r}: {msg} (got {self.spec()!r}).")


# --------------------------------------------------------------------------- token gates


@dataclass(frozen=True)
class TokenGate(GateSpec):
    """A gate deciding each token from that token's own columns."""


@dataclass(frozen=True)
class EntrGate(TokenGate):
    """ENTR (ESTR): keep iff ``delta^2 / (H + eps) <= tau``.

    Source: arXiv:2607.22186 (entropy-normalized trust region; "ESTR" in earlier versions).
    ``tau`` (dimensionless budget, default 4; the paper sweeps 1..16), ``eps`` (nats,
    default 0.01 as in the paper). Needs the ``entropy`` column. Equivalent to
    ``|delta| <= sqrt(tau (H + eps))``: a fixed band when ``H`` is constant.
    """

    tau: float = 4.0
    eps: float = 0.01

    name: ClassVar[str] = "entr"
    aliases: ClassVar[tuple[str, ...]] = ("estr",)
    source: ClassVar[str] = (
        "arXiv:2607.22186 (ENTR, earlier ESTR): delta^2/(H+eps) <= tau, eps = 0.01 nats"
    )
    summary: ClassVar[str] = "keep iff delta^2/(H+eps) <= tau"
    columns: ClassVar[tuple[str, ...]] = ("delta", "entropy")

    def _validate(self) -> None:
        self._check(math.isfinite(self.tau) and self.tau > 0, "tau must be a positive number")
        self._check(math.isfinite(self.eps) and self.eps >= 0, "eps must be >= 0 (nats)")

    def score_expr(self) -> pl.Expr:
        """Per-token ENTR score ``delta^2 / (H + eps)`` (see :func:`entr_score_expr`)."""
        return entr_score_expr(self.eps)

    def keep_expr(self) -> pl.Expr:
        return self.score_expr() <= self.tau


@dataclass(frozen=True)
class FixedBand(TokenGate):
    """Fixed log-ratio band: keep iff ``|delta| <= c`` (ratio in ``[e^-c, e^c]``).

    ``c`` in nats, default ``log 2`` (ratio in [0.5, 2]): the ``|delta| > log 2`` share is the
    mismatch metric verl and slime log. ENTR with a constant entropy is this band with
    ``c = sqrt(tau (H + eps))``.
    """

    c: float = math.log(2.0)

    name: ClassVar[str] = "fixed"
    aliases: ClassVar[tuple[str, ...]] = ("band", "fixed-band")
    source: ClassVar[str] = (
        "fixed symmetric log-ratio band |delta| <= c; c = log 2 as in the |delta| > log 2 "
        "share logged by verl/slime"
    )
    summary: ClassVar[str] = "keep iff |delta| <= c"

    def _validate(self) -> None:
        self._check(not math.isnan(self.c) and self.c >= 0, "c must be a number >= 0 (nats)")

    def keep_expr(self) -> pl.Expr:
        return _DELTA.abs() <= self.c


@dataclass(frozen=True)
class _RatioBand(TokenGate):
    low: float = 0.5
    high: float = 2.0

    summary: ClassVar[str] = "keep iff low <= r <= high"

    def _validate(self) -> None:
        self._check(
            math.isfinite(self.low) and not math.isnan(self.high) and 0 <= self.low <= self.high
            and self.high > 0,
            "need 0 <= low <= high, high > 0 (importance-ratio bounds; low 0 or high inf: "
            "none)",
        )

    def keep_expr(self) -> pl.Expr:
        r = _DELTA.exp()
        return (r >= self.low) & (r <= self.high)


@dataclass(frozen=True)
class IcePop(_RatioBand):
    """IcePop: keep iff ``low <= r <= high`` (Ring-1T's alpha = 0.5, beta = 5.0).

    Source: Ring-1T technical report (inclusionAI, 2025), IcePop token masking: tokens whose
    train/inference probability ratio leaves ``[alpha, beta]`` are masked from the gradient;
    verl's ``decoupled_token_icepop`` preset uses the same bounds. slime's IcePop reads its
    bounds from ``--tis-clip-low`` / ``--tis-clip`` (0 and 2 unless set): ``icepop:low=0,high=2``.
    """

    low: float = 0.5
    high: float = 5.0

    name: ClassVar[str] = "icepop"
    aliases: ClassVar[tuple[str, ...]] = ("ice-pop",)
    source: ClassVar[str] = "Ring-1T IcePop: mask tokens with ratio outside [0.5, 5.0]"


@dataclass(frozen=True)
class TokenMIS(_RatioBand):
    """Token-level masked importance sampling: keep iff ``low <= r <= high`` (0.5, 2.0).

    Source: verl rollout correction, token level, mask mode (upper threshold 2.0, lower
    threshold defaulting to 1/upper); slime's token MIS uses the same band.
    """

    low: float = 0.5
    high: float = 2.0

    name: ClassVar[str] = "mis"
    aliases: ClassVar[tuple[str, ...]] = ("token-mis", "tmis")
    source: ClassVar[str] = "verl/slime token-level masked IS: mask tokens with r outside [0.5, 2]"


@dataclass(frozen=True)
class AReaLCap(TokenGate):
    """AReaL's behaviour importance-weight cap: keep iff ``floor <= r <= cap`` (cap 5, no
    floor).

    Source: AReaL decoupled PPO (``ppo_actor_loss_fn``, ``areal/utils/functional.py``): the
    behaviour weight ``exp(proximal_logprob - behaviour_logprob)`` (trainer over engine,
    ``r`` here) masks the tokens above ``behav_imp_weight_cap`` (upper bound only, inclusive;
    off by default, 5.0 in AReaL's example configs) and, where set, below
    ``behav_imp_weight_floor`` (newer versions; off by default). Kept tokens keep their
    untruncated weight ``r``. ``floor = 0`` is no lower bound.
    """

    cap: float = 5.0
    floor: float = 0.0

    name: ClassVar[str] = "areal"
    aliases: ClassVar[tuple[str, ...]] = ("behav-cap", "behav-imp-weight-cap")
    source: ClassVar[str] = (
        "AReaL decoupled PPO: mask tokens with behaviour weight r > behav_imp_weight_cap "
        "(5.0 in its examples) or below behav_imp_weight_floor (off)"
    )
    summary: ClassVar[str] = "keep iff floor <= r <= cap"

    def _validate(self) -> None:
        self._check(not math.isnan(self.cap) and self.cap > 0,
                    "cap must be a positive ratio (inf: none)")
        self._check(math.isfinite(self.floor) and 0 <= self.floor <= self.cap,
                    "need 0 <= floor <= cap (importance-ratio bounds; floor 0: none)")

    def keep_expr(self) -> pl.Expr:
        r = _DELTA.exp()
        keep = r <= self.cap
        return keep & (r >= self.floor) if self.floor > 0 else keep


@dataclass(frozen=True)
class TIS(TokenGate):
    """Truncated importance sampling: keeps every token, weight ``min(r, cap)`` (cap = 2).

    Source: truncated IS of the "off-policy RL in efficient RL frameworks" fix (Yao et al.,
    2025; cap 2), verl's token-level ``tis_imp_ratio_cap`` (off by default), slime
    ``--use-tis`` (``--tis-clip`` 2). Token level only: verl's rollout correction also
    weights whole sequences (``min(exp(sum_t delta_t), cap)``), not simulated here. Not a
    mask: reports report
    the share of tokens truncated (``r > cap``) and the share of weight mass removed
    ``sum(max(r - cap, 0)) / sum(r)`` instead of a keep rate.
    """

    cap: float = 2.0

    name: ClassVar[str] = "tis"
    aliases: ClassVar[tuple[str, ...]] = ("truncated-is",)
    source: ClassVar[str] = "token-level truncated IS, cap 2 (verl tis_imp_ratio_cap, slime --use-tis)"
    summary: ClassVar[str] = "keeps all; weight min(r, cap)"
    weights_only: ClassVar[bool] = True

    def _validate(self) -> None:
        self._check(not math.isnan(self.cap) and self.cap > 0,
                    "cap must be a positive ratio (inf: no truncation)")

    def keep_expr(self) -> pl.Expr:
        return _DELTA.is_not_null() | _DELTA.is_null()  # all True, same length as the frame

    def weight_expr(self) -> pl.Expr:
        """Per-token truncated weight ``min(exp(delta), cap)``."""
        return pl.min_horizontal(_DELTA.exp(), pl.lit(self.cap))

    def truncated_expr(self) -> pl.Expr:
        """True where the weight is truncated (``r > cap``)."""
        return _DELTA.exp() > self.cap

    def removed_mass_expr(self) -> pl.Expr:
        """Per-token weight removed by truncation ``max(r - cap, 0)``."""
        return (_DELTA.exp() - self.cap).clip(lower_bound=0.0)


def scaled_truncation(log_w: np.ndarray, cap: float, shift: float
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Weights ``w = exp(log_w)`` and the weight truncation at ``cap`` removes,
    ``max(w - cap, 0)``, both times ``exp(-shift)`` (float64 arrays shaped as ``log_w``).

    A ratio of sums of them (TIS's share of weight mass removed) is unchanged by the
    scaling, which keeps a weight beyond a float finite (``log_w`` of 999 with ``shift`` =
    399). ``cap`` may be ``inf`` (nothing removed)."""
    w = np.exp(log_w - shift)
    return w, np.maximum(w - math.exp(math.log(cap) - shift), 0.0)


# ------------------------------------------------------------------------ sequence gates


@dataclass(frozen=True)
class SequenceGate(GateSpec):
    """A gate keeping or dropping whole sequences (grouped by ``seq_key``).

    Subclasses give per-sequence aggregations (:meth:`seq_aggs`, expressions over the token
    rows of one sequence) and the rule on them (:meth:`keep_from`). :meth:`keep_expr`
    evaluates the aggregations as windows ``.over("seq_key")``.
    """

    level: ClassVar[str] = "sequence"

    def seq_aggs(self) -> dict[str, pl.Expr]:  # pragma: no cover - abstract
        """``{stat_name: aggregation expression}`` over the tokens of one sequence."""
        raise NotImplementedError

    def keep_from(self, stats: Mapping[str, pl.Expr]) -> pl.Expr:  # pragma: no cover
        """Keep rule given one expression per statistic of :meth:`seq_aggs`."""
        raise NotImplementedError

    def keep_expr(self) -> pl.Expr:
        return self.keep_from({k: e.over("seq_key") for k, e in self.seq_aggs().items()})

    def seq_partials(self) -> dict[str, tuple[pl.Expr, str]]:  # pragma: no cover - abstract
        """Mergeable partial aggregates of :meth:`seq_aggs`: ``{name: (per-token expression,
        how)}`` with ``how`` one of ``"sum"``, ``"count"`` (non-null values), ``"min"``,
        ``"max"``: the aggregation over any subset of one sequence's tokens, whose partials
        merge by sum (sum, count), min or max. A name means the same partial in every gate
        (``"sum_delta"`` is ``sum_t delta_t`` everywhere), so gates may share it."""
        raise NotImplementedError

    def stats_from_partials(self, partials: Mapping[str, pl.Expr]) -> dict[str, pl.Expr]:
        """The statistics of :meth:`seq_aggs` from the merged partials (one expression per
        name of :meth:`seq_partials`); feed the result to :meth:`keep_from`."""
        raise NotImplementedError  # pragma: no cover - abstract


def _log_bound(ratio: float) -> float:
    """log of a ratio bound in [0, inf]: -inf for 0 and inf for inf (no bound on that
    side), where ``math.log(0)`` raises."""
    return -math.inf if ratio == 0 else math.log(ratio)


@dataclass(frozen=True)
class SeqIS(SequenceGate):
    """Sequence IS rejection: drop the sequence if ``exp(sum_t delta_t)`` leaves
    ``[lower, upper]`` (upper = 2.0, lower = 1/upper).

    Source: verl rollout correction, sequence level, mask/rejection mode. Compared in log
    space: ``log(lower) <= sum_t delta_t <= log(upper)``.
    """

    upper: float = 2.0
    lower: float | None = None

    name: ClassVar[str] = "seq-is"
    aliases: ClassVar[tuple[str, ...]] = ("seqis", "seq_is", "sequence-is")
    source: ClassVar[str] = (
        "verl sequence-level IS rejection: drop sequence if prod_t r_t outside [1/2, 2]"
    )
    summary: ClassVar[str] = "drop seq if exp(sum delta) outside [lower, upper]"

    def _validate(self) -> None:
        if self.lower is None and not math.isnan(self.upper) and self.upper > 0:
            object.__setattr__(self, "lower", 1.0 / self.upper)  # (upper inf: 0, no bound)
        lo = self.lower if self.lower is not None else float("nan")
        self._check(
            not math.isnan(self.upper) and math.isfinite(lo) and 0 <= lo <= self.upper
            and self.upper > 0,
            "need 0 <= lower <= upper, upper > 0 (sequence ratio bounds; upper may be inf "
            "and lower 0: no bound on that side; lower defaults to 1/upper)",
        )

    def seq_aggs(self) -> dict[str, pl.Expr]:
        return {"sum_delta": _DELTA.sum()}

    def seq_partials(self) -> dict[str, tuple[pl.Expr, str]]:
        return {"sum_delta": (_DELTA, "sum")}

    def stats_from_partials(self, partials: Mapping[str, pl.Expr]) -> dict[str, pl.Expr]:
        return {"sum_delta": partials["sum_delta"]}

    def keep_from(self, stats: Mapping[str, pl.Expr]) -> pl.Expr:
        s = stats["sum_delta"]
        return (s >= _log_bound(self.lower)) & (s <= _log_bound(self.upper))  # type: ignore[arg-type]


@dataclass(frozen=True)
class SeqTIS(SequenceGate):
    """Sequence-level truncated IS: keeps every token; every token of a sequence gets the
    weight ``min(exp(sum_t delta_t), cap)`` (cap = 2).

    Source: verl rollout correction, sequence level (``rollout_is="sequence"``, threshold
    2): the product of the sequence's importance ratios, truncated from above, weights all
    its tokens. Not a mask: reports report the sequences truncated (``sum_t delta_t >
    log(cap)``), the share of tokens in them and the share of weight mass removed
    ``sum_s n_s max(w_s - cap, 0) / sum_s n_s w_s`` (``w_s = exp(sum_t delta_t)``, ``n_s``
    the sequence's tokens) instead of a keep rate.
    """

    cap: float = 2.0

    name: ClassVar[str] = "seq-tis"
    aliases: ClassVar[tuple[str, ...]] = ("seqtis", "seq_tis", "sequence-tis")
    source: ClassVar[str] = (
        "verl sequence-level truncated IS (rollout_is='sequence'): weight min(prod_t r_t, 2)"
    )
    summary: ClassVar[str] = "keeps all; weight min(exp(sum delta), cap) per sequence"
    weights_only: ClassVar[bool] = True

    def _validate(self) -> None:
        self._check(not math.isnan(self.cap) and self.cap > 0,
                    "cap must be a positive ratio (inf: no truncation)")

    def seq_aggs(self) -> dict[str, pl.Expr]:
        return {"sum_delta": _DELTA.sum(), "n_tokens": _DELTA.count()}

    def seq_partials(self) -> dict[str, tuple[pl.Expr, str]]:
        return {"sum_delta": (_DELTA, "sum"), "n_tokens": (_DELTA, "count")}

    def stats_from_partials(self, partials: Mapping[str, pl.Expr]) -> dict[str, pl.Expr]:
        return {"sum_delta": partials["sum_delta"], "n_tokens": partials["n_tokens"]}

    def keep_from(self, stats: Mapping[str, pl.Expr]) -> pl.Expr:
        s = stats["sum_delta"]
        return s.is_null() | s.is_not_null()  # every sequence kept

    def weight_from(self, stats: Mapping[str, pl.Expr]) -> pl.Expr:
        """The sequence's weight ``min(exp(sum_t delta_t), cap)`` (every token's)."""
        return pl.min_horizontal(stats["sum_delta"].exp(), pl.lit(self.cap))

    def weight_expr(self) -> pl.Expr:
        """Per-token weight, a window over ``seq_key``."""
        return self.weight_from({"sum_delta": _DELTA.sum().over("seq_key")})


@dataclass(frozen=True)
class GeoRS(SequenceGate):
    """Geometric-mean sequence rejection: drop the sequence if ``exp(mean_t delta_t)``
    leaves ``[low, high]`` (0.999, 1.001).

    Source: verl rollout correction, geometric level (rejection sampling on the per-token
    geometric mean ratio). Compared in log space.
    """

    low: float = 0.999
    high: float = 1.001

    name: ClassVar[str] = "geo-rs"
    aliases: ClassVar[tuple[str, ...]] = ("geors", "geo_rs", "geometric")
    source: ClassVar[str] = (
        "verl geometric-mean sequence rejection: drop if exp(mean delta) outside [0.999, 1.001]"
    )
    summary: ClassVar[str] = "drop seq if exp(mean delta) outside [low, high]"

    def _validate(self) -> None:
        self._check(
            math.isfinite(self.low) and not math.isnan(self.high) and 0 <= self.low <= self.high
            and self.high > 0,
            "need 0 <= low <= high, high > 0 (geometric-mean ratio bounds; high may be inf "
            "and low 0: no bound on that side)",
        )

    def seq_aggs(self) -> dict[str, pl.Expr]:
        return {"mean_delta": _DELTA.mean()}

    def seq_partials(self) -> dict[str, tuple[pl.Expr, str]]:
        return {"sum_delta": (_DELTA, "sum"), "n_delta": (_DELTA, "count")}

    def stats_from_partials(self, partials: Mapping[str, pl.Expr]) -> dict[str, pl.Expr]:
        n = partials["n_delta"]
        return {"mean_delta": pl.when(n > 0).then(partials["sum_delta"] / n)}

    def keep_from(self, stats: Mapping[str, pl.Expr]) -> pl.Expr:
        m = stats["mean_delta"]
        return (m >= _log_bound(self.low)) & (m <= _log_bound(self.high))


@dataclass(frozen=True)
class K3SeqRS(SequenceGate):
    """K3 sequence rejection: drop the sequence if ``mean_t (r_t - 1 - delta_t) > threshold``.

    ``r - 1 - log r`` is the k3 estimator of KL(mu || pi) (verl's ``k3_kl``); threshold 0.01.
    Source: verl rollout correction, sequence rejection on the mean k3 divergence.
    """

    threshold: float = 0.01

    name: ClassVar[str] = "k3"
    aliases: ClassVar[tuple[str, ...]] = ("k3-rs", "k3rs", "k3_rs", "k3-seq")
    source: ClassVar[str] = "verl K3 sequence rejection: drop if mean_t(r - 1 - delta) > 0.01"
    summary: ClassVar[str] = "drop seq if mean(r - 1 - delta) > threshold"

    def _validate(self) -> None:
        self._check(math.isfinite(self.threshold) and self.threshold >= 0, "threshold must be >= 0")

    def seq_aggs(self) -> dict[str, pl.Expr]:
        return {"mean_k3": (_DELTA.exp() - 1.0 - _DELTA).mean()}

    def seq_partials(self) -> dict[str, tuple[pl.Expr, str]]:
        k3 = _DELTA.exp() - 1.0 - _DELTA  # null exactly where delta is: count = n_delta
        return {"sum_k3": (k3, "sum"), "n_delta": (_DELTA, "count")}

    def stats_from_partials(self, partials: Mapping[str, pl.Expr]) -> dict[str, pl.Expr]:
        n = partials["n_delta"]
        return {"mean_k3": pl.when(n > 0).then(partials["sum_k3"] / n)}

    def keep_from(self, stats: Mapping[str, pl.Expr]) -> pl.Expr:
        return stats["mean_k3"] <= self.threshold


@dataclass(frozen=True)
class CatastrophicVeto(SequenceGate):
    """Catastrophic-token veto: drop the sequence if any token has ``r < min_ratio`` (1e-4).

    Source: verl rollout correction's ``rollout_is_veto_threshold`` (off by default; 1e-4 in
    its documented examples) and slime's ``mis_veto_threshold`` (1e-4 in its mismatch-helper
    example). Compared in log space: ``min_t delta_t >= log(min_ratio)``.
    """

    min_ratio: float = 1e-4

    name: ClassVar[str] = "veto"
    aliases: ClassVar[tuple[str, ...]] = ("catastrophic", "catastrophic-veto")
    source: ClassVar[str] = "verl/slime catastrophic-token veto: drop seq if any r < 1e-4"
    summary: ClassVar[str] = "drop seq if any r < min_ratio"

    def _validate(self) -> None:
        self._check(math.isfinite(self.min_ratio) and self.min_ratio > 0, "min_ratio must be > 0")

    def seq_aggs(self) -> dict[str, pl.Expr]:
        return {"min_delta": _DELTA.min()}

    def seq_partials(self) -> dict[str, tuple[pl.Expr, str]]:
        return {"min_delta": (_DELTA, "min")}

    def stats_from_partials(self, partials: Mapping[str, pl.Expr]) -> dict[str, pl.Expr]:
        return {"min_delta": partials["min_delta"]}

    def keep_from(self, stats: Mapping[str, pl.Expr]) -> pl.Expr:
        return stats["min_delta"] >= math.log(self.min_ratio)


# --------------------------------------------------------------------------- batch gates


@dataclass(frozen=True)
class M2PO(GateSpec):
    """M2PO second-moment trust region: drop tokens with the largest ``delta^2`` first until
    the mean ``delta^2`` of the kept tokens is below ``max_mean_sq`` (0.04).

    Source: M2PO (Zheng et al., 2025, "Prosperity before Collapse"), which masks per training
    batch; here the batch is the whole input (global over the frame). AReaL's implementation
    (``_get_m2po_loss_mask``) masks per micro-batch, stops at the first point where the mean
    of the rest is strictly below the threshold (as here), splits tied values by their sort
    position and keeps one token when no point satisfies the bound.

    Ties: tokens with equal ``delta^2`` are dropped together, so the kept set depends on the
    values only, never on row order. Exactly: a token with value ``v = delta^2`` is kept iff
    ``mean{delta^2 : delta^2 <= v} < max_mean_sq``; the left side grows with ``v`` (adding
    values at least as large as all previous ones never lowers a mean), so this is "drop the
    largest first, tie groups whole, stop at the first point the rest satisfies the bound".
    If even the smallest value reaches ``max_mean_sq`` nothing is kept.

    :meth:`keep_expr` is a whole-frame window expression (rank + sorted cumulative sum): fine
    in memory. :func:`entr_diag.compare.resolve_m2po_cut` finds the same cut on a
    ``LazyFrame`` with bounded memory (histogram refinement), after which
    :meth:`keep_expr_with_cut` is a plain per-token comparison.
    """

    max_mean_sq: float = 0.04

    name: ClassVar[str] = "m2po"
    aliases: ClassVar[tuple[str, ...]] = ("m2",)
    level: ClassVar[str] = "batch"
    source: ClassVar[str] = (
        "M2PO (Zheng et al. 2025): mask largest delta^2 until mean delta^2 < 0.04"
    )
    summary: ClassVar[str] = "drop largest delta^2 until mean(delta^2) < max"

    def _validate(self) -> None:
        self._check(
            math.isfinite(self.max_mean_sq) and self.max_mean_sq > 0, "max_mean_sq must be > 0"
        )

    def keep_expr(self) -> pl.Expr:
        d2 = _DELTA * _DELTA
        n_le = d2.rank(method="max").cast(pl.Int64)
        s_le = d2.sort().cum_sum().gather(n_le - 1)
        return (s_le / n_le) < self.max_mean_sq

    def drops_prefix(self, n: int, s: float) -> bool:
        """True when ``n`` tokens, the smallest ``delta^2`` values up to some ``v`` (their
        sum ``s``), break the bound: their mean is not below ``max_mean_sq``, so tokens with
        ``delta^2 = v`` are dropped (the predicate of
        :func:`entr_diag.compare.resolve_m2po_cut`)."""
        return s / n >= self.max_mean_sq

    def keep_expr_with_cut(self, cut: float) -> pl.Expr:
        """Keep iff ``delta^2 < cut`` where ``cut`` is the smallest dropped value (``inf``:
        keep all), as returned by :func:`entr_diag.compare.resolve_m2po_cut`."""
        return (_DELTA * _DELTA) < cut


# ------------------------------------------------------------------------------ parsing

GATE_TYPES: dict[str, type[GateSpec]] = {
    cls.name: cls
    for cls in (
        EntrGate,
        FixedBand,
        IcePop,
        TokenMIS,
        AReaLCap,
        TIS,
        SeqIS,
        SeqTIS,
        GeoRS,
        K3SeqRS,
        CatastrophicVeto,
        M2PO,
    )
}
_ALIASES: dict[str, str] = {a: cls.name for cls in GATE_TYPES.values() for a in cls.aliases}

#: The panel ENTR is compared against by default: one of each gate at its documented
#: default (fixed band at c = log 2, i.e. ratio in [0.5, 2]).
DEFAULT_PANEL: tuple[GateSpec, ...] = (
    FixedBand(),
    IcePop(),
    TokenMIS(),
    AReaLCap(),
    TIS(),
    SeqIS(),
    SeqTIS(),
    GeoRS(),
    K3SeqRS(),
    CatastrophicVeto(),
    M2PO(),
)


def _param_names(cls: type[GateSpec]) -> list[str]:
    return [f.name for f in fields(cls)]


def gate_help() -> str:
    """One line per gate: ``name(aliases): params with defaults - rule``."""
    lines = []
    for cls in GATE_TYPES.values():
        d = cls()
        ps = ",".join(f"{k}={_fmt(v)}" for k, v in d.params().items())
        al = f" (alias {', '.join(cls.aliases)})" if cls.aliases else ""
        lines.append(f"{cls.name}{al}: {ps} - {cls.summary}")
    return "\n".join(lines)


def _bad(msg: str, cls: type | None = None) -> ParameterError:
    """One line: ``msg`` and the syntax of gate ``cls`` (its parameters with defaults), or,
    for no known gate, the gate names (:func:`gate_help` lists them all in full)."""
    if cls is not None:
        d = cls()
        ps = ",".join(f"{k}={_fmt(v)}" for k, v in d.params().items())
        return ParameterError(f"{msg} Usage: {cls.name}:{ps} ({cls.summary}).")
    names = ", ".join(GATE_TYPES)
    return ParameterError(f"{msg} Gates: {names}; write name or name:param=value,... "
                          "(the gate table in README.md lists their parameters).")


_CONSTANTS: dict[str, Callable[[], float]] = {
    "log2": lambda: math.log(2.0),
    "ln2": lambda: math.log(2.0),
    "inf": lambda: math.inf,
}


def _parse_value(text: str, gate: str, key: str, cls: type | None = None) -> float:
    t = text.strip().lower()
    if t in _CONSTANTS:
        return _CONSTANTS[t]()
    try:
        v = float(t)
    except ValueError:
        raise _bad(f"gate spec {gate!r}: value {text!r} of {key!r} is not a number.",
                   cls) from None
    if math.isinf(v) and t.lstrip("+-") not in ("inf", "infinity"):  # (1e400: write inf)
        raise _bad(f"gate spec {gate!r}: value {text!r} of {key!r} is too large for a float "
                   "(it would read as infinity; write inf for no bound).", cls)
    return v


def parse_gate_spec(spec: str, defaults: Mapping[str, float] | None = None) -> GateSpec:
    """Parse ``"name"`` or ``"name:param=value,param=value"`` into a gate spec.

    Names are case-insensitive and accept aliases (``estr`` for ``entr``, ``seqis`` for
    ``seq-is``...). Values are floats (``log2``/``ln2`` accepted). Unspecified parameters
    take ``defaults``' value for them when the gate has such a parameter (the CLI gives
    its ``--tau`` / ``--eps`` for ``entr``), else the gate's defaults. Examples: ``"fixed:c=0.5"``, ``"icepop:low=0.5,high=5"``,
    ``"entr:tau=4,eps=0.01"``, ``"estr:tau=4"``.

    Raises :class:`~entr_diag.errors.ParameterError` naming the problem, with the gate's
    parameters and defaults (or, for an unknown gate, the gate names), on one line;
    :class:`TypeError` when ``spec`` is not a str.
    """
    if not isinstance(spec, str):
        raise TypeError(f"parse_gate_spec: expected the spec as a str (e.g. 'fixed:c=0.5'), "
                        f"got {type(spec).__qualname__}.")
    if not spec.strip():
        raise _bad("empty gate spec.")
    name, sep, rest = spec.strip().partition(":")
    key = name.strip().lower().replace("_", "-")
    key = _ALIASES.get(key, _ALIASES.get(name.strip().lower(), key))
    cls = GATE_TYPES.get(key)
    if cls is None:
        raise _bad(f"unknown gate {name.strip()!r} in spec {spec!r}.")
    allowed = _param_names(cls)
    kwargs: dict[str, Any] = {}
    if sep and not rest.strip():  # ('fixed:' is a spec cut short, not the defaults)
        raise _bad(f"gate spec {spec!r}: nothing after ':'; give param=value, or the name "
                   "alone for the defaults.", cls)
    if sep:
        for item in rest.split(","):
            k, eq, v = item.partition("=")
            k = k.strip().lower()
            if not eq or not k or not v.strip():
                raise _bad(f"gate spec {spec!r}: expected param=value, got {item.strip()!r}.",
                           cls)
            if k not in allowed:
                raise _bad(f"gate spec {spec!r}: {cls.name!r} has no parameter {k!r}.", cls)
            if k in kwargs:
                raise _bad(f"gate spec {spec!r}: parameter {k!r} given twice.", cls)
            kwargs[k] = _parse_value(v, spec, k, cls)
    kwargs = {**{k: v for k, v in (defaults or {}).items() if k in allowed}, **kwargs}
    try:
        return cls(**kwargs)
    except ParameterError as e:
        # name the spec as typed, not the gate's parameters with the defaults filled in
        # (a tau=nan refusal echoed an eps never typed)
        msg = re.sub(r" \(got '[^']*'\)\.$", f" (in gate spec {spec.strip()!r}).", str(e))
        raise _bad(msg, cls) from None
