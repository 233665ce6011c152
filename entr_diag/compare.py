"""Gate simulator: which tokens ENTR and the gates frameworks ship would keep (issue 4).

Input is the canonical token frame (docs/CONTRACT.md): a ``pl.LazyFrame`` with one row per
valid, loss-masked token and at least ``seq_key`` (UInt64), ``delta`` (nats),
``infer_logprob`` (nats) and ``entropy`` (nats; see below for a frame without it); ``step``
and ``staleness`` are used when present. Nothing here collects the token frame:
:func:`compare_gates` streams it in batches (:func:`entr_diag.passes.run_pass`) into small
mergeable tables (bins x categories x keep patterns, one row per sequence, one row per step,
2^20-bin histograms).

Passes over the data for :func:`compare_gates` (:class:`ComparePlan`; batches in any order
and of any size give the same result):

1. totals, entropy range, both sweeps (counts by number of sweep taus below the ENTR score /
   sweep c's below ``|delta|``, and category: every sweep value is read off cumulative sums),
   histograms of ``|delta|`` and ``delta^2`` on the float64 bit pattern (bins of at most
   0.2% relative width; they bracket the matched band's ``c`` and each M2PO cut in one bin),
   and one row of mergeable partials per ``seq_key`` (which token gates keep some / every
   token, the sequence gates' sums / counts / minima, min and max ``|delta|``);
2. token counts by (entropy bin, p bin, staleness bucket, category, keep pattern of every
   gate) and by (step, keep pattern), the sequence gates' decisions (from the merged
   per-sequence table) joined on ``seq_key``; the tokens of the bracketing bins listed by
   exact value, which makes ``c`` and the cuts exact after the pass.

A second pass is needed because the bin edges (by default from the entropy range), ``c``,
the cuts and the sequence decisions are results of the first. When a bracketing bin holds
more than ``_BOUNDARY_ROWS`` tokens, refinement scans of ``delta`` (as in
:func:`resolve_m2po_cut`) make that threshold exact between the passes instead.
:func:`decisions_frame` (per-token export) still resolves M2PO cuts by refinement scans.

Without an ``entropy`` column the gates that need no entropy are still compared: ENTR is
then listed in ``CompareResult.unavailable`` with the reason, and so are what depends on it
(no matched band, no agreement with ENTR, no tau sweep, no keep rate by entropy bin).

Definitions (also returned in ``CompareResult.definitions``):

- noise token: ``H < h_star`` and ``delta^2 / (H + flag_eps) > flag_tau`` (the token flag of
  METHOD.md's low-entropy regime: below the breakpoint and outside the entropy-normalized
  bound). None when ``h_star`` is None (no breakpoint, no regime).
- law-scale token ("exploration"): ``H >= h_star`` (every token when ``h_star`` is None) and
  ``delta^2 <= q * law_k * H**law_alpha`` with ``q = chi2_1(0.99) = 6.635``: a token whose
  log-ratio is within the 99% range the fitted law predicts for a Gaussian delta at that
  entropy. None when ``law_k`` is None.
- noise admitted (per gate) = kept noise tokens / noise tokens.
- exploration discarded (per gate) = dropped law-scale tokens / law-scale tokens.
- matched fixed band: ``c`` = the ``(N - D)``-th smallest ``|delta|`` where ``D`` is the
  number of tokens ENTR drops at this tau, so ``|delta| <= c`` keeps exactly ``N - D``
  tokens when ``|delta|`` has no tie at ``c``; with ties the band keeps every tied token
  and so drops at most ``D`` (``matched.fixed_dropped`` gives the realised count).
"""

from __future__ import annotations

import math
import numbers
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

import numpy as np
import polars as pl

from entr_diag.aggregate import staleness_labels
from entr_diag.errors import InputError, ParameterError, SchemaError
from entr_diag.frames import given, number, number_array, token_frame
from entr_diag.gates import (
    DEFAULT_PANEL,
    M2PO,
    TIS,
    EntrGate,
    FixedBand,
    GateSpec,
    SeqTIS,
    SequenceGate,
    entr_score_expr,
    scaled_truncation,
)
from entr_diag.passes import GroupAgg, column, frame_of, run_pass, run_starts

__all__ = [
    "CHI2_1_99",
    "DEFAULT_P_EDGES",
    "DEFAULT_SWEEP_TAU",
    "DEFAULT_SWEEP_C",
    "STALENESS_BUCKETS",
    "BinnedKeep",
    "Agreement",
    "TisExtras",
    "GateResult",
    "UnavailableGate",
    "MatchedComparison",
    "SweepResult",
    "CompareResult",
    "compare_gates",
    "compare_plan",
    "ComparePlan",
    "decisions_frame",
    "decision_column",
    "weight_column",
    "export_frame",
    "resolve_m2po_cut",
    "matched_fixed_c",
    "default_entropy_edges",
]

#: 99% quantile of chi-square with 1 degree of freedom: ``delta^2 <= CHI2_1_99 * k H^alpha``
#: holds for 99% of tokens when delta ~ Normal(0, k H^alpha). The value of
#: ``scipy.stats.chi2.ppf(0.99, 1)`` (a test checks it), written out: importing scipy.stats
#: takes 0.6 s.
CHI2_1_99: float = 6.6348966010212145

#: Bins of the sampled-token probability p = exp(infer_logprob): [e_i, e_{i+1}).
DEFAULT_P_EDGES: tuple[float, ...] = (
    0.0,
    1e-4,
    1e-3,
    1e-2,
    0.05,
    0.1,
    0.25,
    0.5,
    0.75,
    0.9,
    0.99,
    1.0,
)
#: tau values swept when ``sweep_tau`` is None: 2^(j/2), 0.5 .. 16 (11 values, exact powers
#: of two at 0.5, 1, 2, 4, 8, 16).
DEFAULT_SWEEP_TAU: np.ndarray = 2.0 ** (np.arange(-2, 9) / 2.0)
#: c values (nats) swept when ``sweep_c`` is None (0.01 .. 2, with log 2).
DEFAULT_SWEEP_C: np.ndarray = np.array(
    [0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, math.log(2.0), 1.0, 1.5, 2.0]
)
#: Staleness buckets (label, lowest, highest) in policy versions; negative lags get "<0".
STALENESS_BUCKETS: tuple[tuple[str, float, float], ...] = (
    ("<0", -math.inf, -1),
    ("0", 0, 0),
    ("1", 1, 1),
    ("2-3", 2, 3),
    ("4-7", 4, 7),
    ("8+", 8, math.inf),
)

_MAX_SWEEP = 512
_HIST_BINS = 1024
_SMALL_DISTINCT = 65_536
#: TIS's weights exp(delta) are summed as exp(delta - shift) with the largest below e^this
#: (a sum of 1e40 of them fits a float; :class:`_SecondPass`)
_WEIGHT_LOG_MAX = 600.0


# ----------------------------------------------------------------------------- results


def _plain(x: Any) -> Any:
    """Recursively turn dataclasses / tuples / numpy scalars into plain Python types."""
    if is_dataclass(x) and not isinstance(x, type):
        return {f.name: _plain(getattr(x, f.name)) for f in fields(x)}
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, np.ndarray):
        return [_plain(v) for v in x.tolist()]
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.floating):
        return float(x)
    if isinstance(x, np.bool_):
        return bool(x)
    return x


def _ratio(a: float, b: float) -> float:
    return float(a) / float(b) if b else math.nan


@dataclass(frozen=True)
class BinnedKeep:
    """Tokens and kept tokens per bin (entropy bin, staleness bucket or step).

    ``keys``: bin labels (entropy / p bins: ``"[lo, hi)"`` strings; staleness: bucket labels;
    steps: the step numbers). ``edges`` (entropy / p bins only): the ``len(keys) + 1`` bin
    edges in nats / probability, bins ``[e_i, e_{i+1})`` with the first and last bin open
    towards -inf / +inf. ``n``, ``kept``: token counts per bin. ``keep_rate = kept / n``
    (NaN for an empty bin).
    """

    keys: tuple[Any, ...]
    n: tuple[int, ...]
    kept: tuple[int, ...]
    edges: tuple[float, ...] | None = None

    @property
    def keep_rate(self) -> tuple[float, ...]:
        return tuple(_ratio(k, n) for k, n in zip(self.kept, self.n, strict=True))

    def to_dict(self) -> dict:
        d = _plain(self)
        d["keep_rate"] = list(self.keep_rate)
        return d


@dataclass(frozen=True)
class Agreement:
    """Agreement of a gate with ENTR on token keep decisions (token counts).

    ``both_keep``, ``only_entr_keeps`` (ENTR keeps, the other gate drops), ``only_other_keeps``,
    ``both_drop``; ``by_entropy`` / ``by_p``: the same four counts per entropy bin / per bin
    of p = exp(infer_logprob), as ``{"keys", "edges", "both_keep", "only_entr_keeps",
    "only_other_keeps", "both_drop"}`` with one entry per bin. ``where_only_entr_keeps`` /
    ``where_only_other_keeps``: the (entropy bin, p bin) labels of the joint cell holding
    the most tokens of that kind (None when there are none): the two marginal modes can
    name a cell that holds none of them.
    """

    both_keep: int
    only_entr_keeps: int
    only_other_keeps: int
    both_drop: int
    by_entropy: dict[str, Any]
    by_p: dict[str, Any]
    where_only_entr_keeps: tuple[str, str] | None = None
    where_only_other_keeps: tuple[str, str] | None = None

    @property
    def disagreements(self) -> int:
        return self.only_entr_keeps + self.only_other_keeps

    def to_dict(self) -> dict:
        d = _plain(self)
        d["disagreements"] = self.disagreements
        return d


@dataclass(frozen=True)
class TisExtras:
    """TIS weight statistics: ``truncated_tokens`` (``r > cap``), ``truncated_share``
    (of all tokens), ``weight_mass_removed`` = ``sum max(r - cap, 0) / sum r``. For
    sequence-level TIS (:class:`~entr_diag.gates.SeqTIS`) ``truncated_sequences`` (those
    with ``exp(sum_t delta_t) > cap``) is set, the tokens are theirs, and each token's
    ``r`` is its sequence's weight ``exp(sum_t delta_t)``."""

    cap: float
    truncated_tokens: int
    truncated_share: float
    weight_mass_removed: float
    truncated_sequences: int | None = None

    def to_dict(self) -> dict:
        return _plain(self)


@dataclass(frozen=True)
class GateResult:
    """What one gate keeps on the input.

    Counts are tokens unless named ``*_sequences``. ``kept_sequences``: sequences with at
    least one kept token; ``intact_sequences``: sequences with every token kept (equal for
    sequence gates). ``noise_admitted`` / ``exploration_discarded``: shares in [0, 1] or
    None (reason in ``CompareResult.null_reasons``). ``agreement_vs_entr`` is None for the
    ENTR gate itself, and for every gate when ENTR is unavailable (no entropy column; then
    ``keep_by_entropy`` is None too). ``tis`` is set for TIS only (whose keep rate is 1 by
    definition).
    """

    name: str
    spec: str
    label: str
    level: str
    params: dict[str, float]
    source: str
    n_tokens: int
    kept_tokens: int
    n_sequences: int
    kept_sequences: int
    intact_sequences: int
    keep_by_entropy: BinnedKeep | None
    keep_by_staleness: BinnedKeep | None
    keep_by_step: BinnedKeep | None
    noise_tokens_kept: int | None
    noise_admitted: float | None
    exploration_tokens_dropped: int | None
    exploration_discarded: float | None
    agreement_vs_entr: Agreement | None
    tis: TisExtras | None = None

    @property
    def kept_share(self) -> float:
        return _ratio(self.kept_tokens, self.n_tokens)

    @property
    def dropped_tokens(self) -> int:
        return self.n_tokens - self.kept_tokens

    @property
    def kept_sequence_share(self) -> float:
        return _ratio(self.kept_sequences, self.n_sequences)

    def to_dict(self) -> dict:
        d: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            d[f.name] = v.to_dict() if hasattr(v, "to_dict") else _plain(v)
        d["kept_share"] = self.kept_share
        d["dropped_tokens"] = self.dropped_tokens
        d["kept_sequence_share"] = self.kept_sequence_share
        return d


@dataclass(frozen=True)
class MatchedComparison:
    """ENTR against the fixed band dropping as many tokens (see module docstring).

    ``c`` (nats); ``entr_dropped`` = D; ``fixed_dropped`` (< D only with ties at c);
    ``fixed``: the full :class:`GateResult` of ``fixed:c=<c>`` including its agreement with
    ENTR, noise admitted and exploration discarded.
    """

    c: float
    entr_dropped: int
    fixed_dropped: int
    fixed: GateResult

    def to_dict(self) -> dict:
        return {
            "c": self.c,  # (a token's |delta|: the JSON keeps it whole, json_report.EXACT_KEYS)
            "entr_dropped": self.entr_dropped,
            "fixed_dropped": self.fixed_dropped,
            "drops_equal": self.entr_dropped == self.fixed_dropped,
            "fixed": self.fixed.to_dict(),
        }


@dataclass(frozen=True)
class SweepResult:
    """A budget swept in one pass: ``values`` (tau, or c in nats) with, at each value, the
    ``keep_rate`` (share of tokens kept), ``noise_admitted`` and ``exploration_discarded``
    (NaN when undefined, see ``CompareResult.null_reasons``)."""

    parameter: str
    gate: str
    values: tuple[float, ...]
    keep_rate: tuple[float, ...]
    noise_admitted: tuple[float, ...]
    exploration_discarded: tuple[float, ...]

    def to_dict(self) -> dict:
        return _plain(self)


@dataclass(frozen=True)
class UnavailableGate:
    """A gate asked for but not simulated, and why: ENTR on a token frame without an
    entropy column. ``name``, ``spec``, ``label`` as in :class:`GateResult`."""

    name: str
    spec: str
    label: str
    reason: str

    def to_dict(self) -> dict:
        return _plain(self)


@dataclass(frozen=True)
class CompareResult:
    """Result of :func:`compare_gates`.

    ``gates[0]`` is ENTR, then the panel in the order given; without an entropy column
    ENTR is not simulated: ``gates`` is the panel, ``unavailable`` holds ENTR and the
    reason, ``matched`` is None, ``sweep`` has no ``"tau"`` and ``entropy_edges`` is empty.
    ``n_noise`` / ``n_exploration`` are the token counts of the two categories (None when
    undefined); ``null_reasons`` says why a share is None. ``sweep`` has keys ``"tau"``
    (ENTR) and ``"c"`` (fixed band), either absent when that sweep was disabled.
    """

    parameters: dict[str, Any]
    n_tokens: int
    n_sequences: int
    n_noise: int | None
    n_exploration: int | None
    entropy_edges: tuple[float, ...]
    p_edges: tuple[float, ...]
    gates: tuple[GateResult, ...]
    matched: MatchedComparison | None
    sweep: dict[str, SweepResult]
    definitions: dict[str, str]
    null_reasons: dict[str, str]
    unavailable: tuple[UnavailableGate, ...] = ()
    #: the gate specs behind ``gates`` (ENTR first when simulated) and the matched band;
    #: not in to_dict()
    gate_specs: tuple[GateSpec, ...] = field(default=(), repr=False, compare=False)
    matched_spec: FixedBand | None = field(default=None, repr=False, compare=False)

    @property
    def entr(self) -> GateResult | None:
        """ENTR's result; None when ENTR is unavailable (see ``unavailable``)."""
        return self.gates[0] if self.entr_spec is not None else None

    @property
    def entr_spec(self) -> EntrGate | None:
        """The ENTR gate spec compared (for :func:`decisions_frame`); None when ENTR is
        unavailable."""
        g = self.gate_specs[0] if self.gate_specs else None
        return g if isinstance(g, EntrGate) and not self.unavailable else None

    @property
    def panel_specs(self) -> tuple[GateSpec, ...]:
        """The panel's gate specs, in order (for :func:`decisions_frame`)."""
        return self.gate_specs[1:] if self.entr_spec is not None else self.gate_specs

    def to_dict(self) -> dict:
        """Plain-Python dict: ``parameters``, ``n_tokens``, ``n_sequences``, ``n_noise``,
        ``n_exploration``, ``entropy_edges``, ``p_edges``, ``gates`` (list of
        :meth:`GateResult.to_dict`), ``matched`` (None without ENTR), ``sweep`` (``{"tau":
        {...}, "c": {...}}``), ``definitions``, ``null_reasons``, ``unavailable`` (list of
        :meth:`UnavailableGate.to_dict`). NaN may appear (JSON writers turn it to null)."""
        return {
            "parameters": _plain(self.parameters),
            "n_tokens": self.n_tokens,
            "n_sequences": self.n_sequences,
            "n_noise": self.n_noise,
            "n_exploration": self.n_exploration,
            "entropy_edges": list(self.entropy_edges),
            "p_edges": list(self.p_edges),
            "gates": [g.to_dict() for g in self.gates],
            "matched": None if self.matched is None else self.matched.to_dict(),
            "sweep": {k: v.to_dict() for k, v in self.sweep.items()},
            "definitions": dict(self.definitions),
            "null_reasons": dict(self.null_reasons),
            "unavailable": [u.to_dict() for u in self.unavailable],
        }


# ------------------------------------------------------------------- exact cut finding


def _first_value_where(
    lf: pl.LazyFrame,
    x: pl.Expr,
    pred: Callable[[int, float], bool],
    *,
    bins: int = _HIST_BINS,
    small: int = _SMALL_DISTINCT,
    tot: Mapping[str, Any] | None = None,
) -> float | None:
    """Smallest distinct value ``u`` of ``x`` with ``pred(n(x <= u), sum(x[x <= u]))`` true.

    ``pred`` must be monotone over growing prefixes (false ... false true ... true). Nulls
    and NaN in ``x`` are ignored. Returns None when ``pred`` fails on the whole column.
    Exact, by histogram refinement: each pass bins the current candidate interval into
    ``bins`` equal-width bins (count, sum, min, max per bin), keeps the bin where ``pred``
    first holds, and narrows to that bin's [min, max]; once the interval holds at most
    ``small`` tokens its distinct values are listed and walked. Memory: O(bins + small).
    ``tot``: the count ``n``, sum ``s``, ``lo`` (min) and ``hi`` (max) of the non-null,
    non-NaN values of ``x`` when already known (e.g. from another pass): saves the first
    scan.
    """
    src = lf.select(x.alias("x")).filter(pl.col("x").is_not_null() & pl.col("x").is_not_nan())
    if tot is None:
        tot = (
            src.select(n=pl.len(), s=pl.col("x").sum(), lo=pl.col("x").min(),
                       hi=pl.col("x").max())
            .collect(engine="streaming")
            .row(0, named=True)
        )
    n_all = int(tot["n"])
    if n_all == 0 or not pred(n_all, float(tot["s"])):
        return None
    return _refine(src, pred, float(tot["lo"]), float(tot["hi"]), 0, 0.0, n_all,
                   bins=bins, small=small)


def _refine(
    src: pl.LazyFrame,
    pred: Callable[[int, float], bool],
    lo: float,
    hi: float,
    n_below: int,
    s_below: float,
    n_in: int,
    *,
    bins: int = _HIST_BINS,
    small: int = _SMALL_DISTINCT,
) -> float:
    """The refinement loop of :func:`_first_value_where` from a known bracket: ``src`` has
    one column ``x`` (non-null, non-NaN); the answer lies in ``[lo, hi]``, which holds
    ``n_in`` values; ``n_below`` / ``s_below``: count and sum of the values below ``lo``."""
    for _ in range(200):  # each pass strictly shrinks [lo, hi]; 200 is a safety stop
        if lo == hi:
            return lo
        cand = src.filter((pl.col("x") >= lo) & (pl.col("x") <= hi))
        # (a bracket narrower than a normal float, e.g. [0, 4e-311] around delta = 0 when the
        # two logprob columns are equal, cannot be cut into bins: its values are listed)
        if n_in <= small or hi - lo < sys.float_info.min * bins:
            t = (
                cand.group_by("x")
                .agg(c=pl.len(), s=pl.col("x").sum())
                .sort("x")
                .collect(engine="streaming")
            )
            cn, cs = n_below, s_below
            for xv, c, sv in t.iter_rows():
                cn += int(c)
                cs += float(sv)
                if pred(cn, cs):
                    return float(xv)
            return hi  # only reachable through float rounding of the sums
        b = ((pl.col("x") - lo) / (hi - lo) * bins).floor().clip(0, bins - 1).cast(pl.Int32)
        h = (
            cand.group_by(b.alias("b"))
            .agg(c=pl.len(), s=pl.col("x").sum(), mn=pl.col("x").min(), mx=pl.col("x").max())
            .sort("b")
            .collect(engine="streaming")
        )
        cn, cs = n_below, s_below
        for _b, c, sv, mn, mx in h.iter_rows():
            if pred(cn + int(c), cs + float(sv)):
                lo, hi, n_below, s_below, n_in = float(mn), float(mx), cn, cs, int(c)
                break
            cn += int(c)
            cs += float(sv)
        else:
            return hi  # only reachable through float rounding of the sums
    return lo  # pragma: no cover


def _m2po_value() -> pl.Expr:
    return pl.col("delta") ** 2


def resolve_m2po_cut(lf: pl.LazyFrame, gate: M2PO, *, tot: Mapping[str, Any] | None = None
                     ) -> float:
    """M2PO's global cut on a token frame: the smallest ``delta^2`` it drops (``inf``: keeps
    every token). Keep iff ``delta^2 < cut``; ties at the cut are dropped together (see
    :class:`~entr_diag.gates.M2PO`). Streaming histogram refinement, memory bounded.
    ``tot``: totals of delta^2 known from another pass (see :func:`_first_value_where`)."""
    lf = token_frame(lf, "resolve_m2po_cut")
    u = _first_value_where(lf, _m2po_value(), gate.drops_prefix, tot=tot)
    return math.inf if u is None else float(u)


def matched_fixed_c(lf: pl.LazyFrame, n_keep: int, *, tot: Mapping[str, Any] | None = None
                    ) -> float:
    """The ``n_keep``-th smallest ``|delta|`` (nats): ``|delta| <= c`` keeps ``n_keep``
    tokens when there is no tie at ``c``, and every tied token otherwise.

    ``n_keep <= 0`` returns the largest float below the smallest ``|delta|`` (keeps none,
    clamped at 0); ``n_keep >= N`` returns the largest ``|delta|``. ``tot``: totals of
    ``|delta|`` known from another pass (see :func:`_first_value_where`).
    """
    lf = token_frame(lf, "matched_fixed_c")
    absd = pl.col("delta").abs()
    if n_keep <= 0:
        mn = lf.select(absd.min()).collect(engine="streaming").item()
        if mn is None:
            return 0.0
        return max(0.0, float(np.nextafter(float(mn), -math.inf)))
    u = _first_value_where(lf, absd, lambda n, s: n >= n_keep, tot=tot)
    if u is None:  # fewer than n_keep tokens
        mx = lf.select(absd.max()).collect(engine="streaming").item()
        return 0.0 if mx is None else float(mx)
    return float(u)


# ---------------------------------------------------------------- per-token decisions


def decision_column(gate: GateSpec | UnavailableGate) -> str:
    """Name of a gate's keep column in :func:`decisions_frame` and :func:`export_frame`:
    ``"keep[<spec>]"``."""
    return f"keep[{gate.spec if isinstance(gate, UnavailableGate) else gate.spec()}]"


def _token_keep_exprs(
    lf: pl.LazyFrame, gates: Sequence[GateSpec], m2po_tot: Mapping[str, Any] | None = None
) -> tuple[dict[int, pl.Expr], dict[int, float]]:
    """Per-token keep expressions of the non-sequence gates (M2PO cuts resolved here;
    ``m2po_tot``: totals of delta^2 if known)."""
    exprs: dict[int, pl.Expr] = {}
    cuts: dict[int, float] = {}
    for i, g in enumerate(gates):
        if isinstance(g, SequenceGate):
            continue
        if isinstance(g, M2PO):
            cuts[i] = resolve_m2po_cut(lf, g, tot=m2po_tot)
            exprs[i] = g.keep_expr_with_cut(cuts[i])
        else:
            exprs[i] = g.keep_expr()
    return exprs, cuts


#: sequence partials that count the analysed tokens a sequence's decision applies to, not
#: the terms of its statistic: tokens outside the analysis do not add to them
_ANALYSED_COUNTS = frozenset({"n_tokens"})


def _seq_stat_aggs(gates: Sequence[GateSpec]
                   ) -> tuple[list[pl.Expr], dict[int, pl.Expr], dict[int, pl.Expr]]:
    """Aggregations over one sequence for every sequence gate, each gate's keep rule on
    the aggregated columns (``{gate index: expr}``, evaluated on the per-sequence table),
    and the sequence weight of the weighting ones (:class:`~entr_diag.gates.SeqTIS`)."""
    aggs: list[pl.Expr] = []
    rules: dict[int, pl.Expr] = {}
    weights: dict[int, pl.Expr] = {}
    for i, g in enumerate(gates):
        if isinstance(g, SequenceGate):
            stats = {}
            for k, e in g.seq_aggs().items():
                col = f"__seq{i}_{k}"
                aggs.append(e.alias(col))
                stats[k] = pl.col(col)
            rules[i] = g.keep_from(stats)
            if isinstance(g, SeqTIS):
                weights[i] = g.weight_from(stats)
    return aggs, rules, weights


def _attach_decisions(
    lf: pl.LazyFrame, gates: Sequence[GateSpec], names: Sequence[str], keep_order: bool = False,
    unscored: pl.LazyFrame | None = None,
) -> tuple[pl.LazyFrame, dict[int, float]]:
    """``lf`` with one Boolean column per gate (``names[i]``), plus resolved M2PO cuts.

    Sequence gates: their per-sequence statistics come from ONE ``group_by("seq_key")``
    (over ``lf``'s log-ratios and ``unscored``'s: see :func:`compare_gates`), collected
    eagerly (one row per sequence: memory O(sequences), not O(tokens)) and joined back on
    ``seq_key``. M2PO: the cut is resolved eagerly here (:func:`resolve_m2po_cut`), then
    compared per token.
    """
    tok, cuts = _token_keep_exprs(lf, gates)
    aggs, rules, weights = _seq_stat_aggs(gates)
    out = lf
    if rules:
        rows = lf.select("seq_key", "delta")
        if unscored is not None:
            rows = pl.concat([rows, unscored.lazy().select(
                "seq_key", pl.col("delta").cast(rows.collect_schema()["delta"]))])
        seq = (
            rows.group_by("seq_key")
            .agg(aggs)
            .select("seq_key", *[r.alias(names[i]) for i, r in rules.items()],
                    *[w.alias(weight_column(gates[i])) for i, w in weights.items()])
            .collect(engine="streaming")
        )
        out = out.join(
            seq.lazy(),
            on="seq_key",
            how="left",
            maintain_order="left" if keep_order else "none",
        )
    out = out.with_columns([e.alias(names[i]) for i, e in tok.items()])
    return out, cuts


def decisions_frame(lf: pl.LazyFrame, gates: Sequence[GateSpec],
                    unscored: pl.LazyFrame | None = None) -> pl.LazyFrame:
    """Per-token keep/drop of each gate, with the keys to join back (for ``--export``).

    Returns a LazyFrame, one row per input token: ``seq_id``, ``seq_key``, ``position``,
    ``step`` and ``file`` (if present: the CLI adds each row's input file when there are
    several, so that rows of sequences whose ids restart in each file join back), in input
    row order, then one Boolean column per gate named
    :func:`decision_column` (``"keep[entr:tau=4,eps=0.01]"``; True = kept), and for TIS
    also ``"weight[<spec>]"`` = ``min(r, cap)`` (for sequence TIS the sequence's weight
    ``min(exp(sum_t delta_t), cap)``). Duplicate specs get one column. ``unscored``: tokens
    left out of ``lf`` whose log-ratios the sequence gates read too (see
    :func:`compare_gates`); no row of theirs is returned. M2PO cuts are resolved eagerly (a few streaming passes over ``delta``); everything else stays lazy,
    so the caller can ``sink_parquet`` it.
    """
    lf = token_frame(lf, "decisions_frame")
    schema = lf.collect_schema()
    _check_columns(schema, gates)
    uniq: list[GateSpec] = []
    seen: set[str] = set()
    for g in gates:
        if g.spec() not in seen:
            seen.add(g.spec())
            uniq.append(g)
    names = [decision_column(g) for g in uniq]
    out, _ = _attach_decisions(lf, uniq, names, keep_order=True, unscored=unscored)
    keys = [c for c in ("seq_id", "seq_key", "position", "step", "file") if c in schema]
    extra = [g.weight_expr().alias(weight_column(g)) if isinstance(g, TIS)
             else pl.col(weight_column(g))  # (joined per sequence)
             for g in uniq if isinstance(g, (TIS, SeqTIS))]
    return out.select([*keys, *names, *extra])


def _seq_tis_extras(gate: SeqTIS, per_seq: pl.DataFrame, n_tok: int) -> TisExtras:
    """Sequence TIS's statistics from the per-sequence partials (``__p_sum_delta``,
    ``__p_n_tokens``): the sequences with ``sum_t delta_t > log(cap)``, their tokens, and
    the weight mass removed ``sum_s n_s max(w_s - cap, 0) / sum_s n_s w_s`` with ``w_s =
    exp(sum_t delta_t)``, summed with every weight scaled by ``exp(-max_s sum_t delta_t)``
    (a long sequence's product of ratios overflows a float)."""
    t = per_seq.select(pl.col("__p_sum_delta").alias("s"), pl.col("__p_n_tokens").alias("n"))
    t = t.filter(pl.col("s").is_finite() & (pl.col("n") > 0))
    s_ = t["s"].to_numpy().astype(np.float64)
    n_ = t["n"].to_numpy().astype(np.float64)
    trunc = s_ > math.log(gate.cap)
    removed = 0.0 if s_.size else float("nan")
    if trunc.any():  # (then the largest sum exceeds log(cap): the cap scaled stays finite)
        w, over = scaled_truncation(s_, gate.cap, float(s_.max()))
        removed = _ratio(float((n_ * over).sum()), float((n_ * w).sum()))
    tr_tok = int(n_[trunc].sum())
    return TisExtras(cap=gate.cap, truncated_tokens=tr_tok,
                     truncated_share=tr_tok / n_tok if n_tok else float("nan"),
                     weight_mass_removed=removed, truncated_sequences=int(trunc.sum()))


def weight_column(gate: GateSpec) -> str:
    """The ``--export`` column of a weighting gate's per-token weight: ``weight[<spec>]``."""
    return f"weight[{gate.spec()}]"


def export_frame(lf: pl.LazyFrame, result: CompareResult,
                 unscored: pl.LazyFrame | None = None) -> pl.LazyFrame:
    """The per-token decisions of a comparison (``compare --export``): :func:`decisions_frame`
    of ``result``'s gates and its matched band, and for each gate it could not simulate
    (``result.unavailable``, e.g. ENTR without an entropy column) a ``keep[<spec>]`` column
    of nulls (no decision), placed before the others. One row per token of ``lf``, lazy.
    ``unscored``: as for :func:`decisions_frame` (give the one the comparison had)."""
    lf = token_frame(lf, "export_frame")
    gates = list(result.gate_specs)
    if result.matched_spec is not None:
        gates.append(result.matched_spec)
    out = decisions_frame(lf, gates, unscored)
    if not result.unavailable:
        return out
    names = out.collect_schema().names()
    keys = [c for c in names if not c.startswith(("keep[", "weight["))]
    nulls = [pl.lit(None, dtype=pl.Boolean).alias(decision_column(u))
             for u in result.unavailable]
    return out.select(*keys, *nulls, *[c for c in names if c not in keys])


def _check_columns(schema: pl.Schema, gates: Sequence[GateSpec]) -> None:
    need = {"delta", "seq_key"}
    for g in gates:
        need.update(g.columns)
    missing = sorted(c for c in need if c not in schema)
    if missing:
        who = [g.name for g in gates if set(g.columns) & set(missing)]
        raise SchemaError(
            f"The token frame lacks column(s) {', '.join(missing)}"
            + (f" needed by gate(s) {', '.join(sorted(set(who)))}" if who else "")
            + "; map them when loading (see docs/CONTRACT.md) or drop those gates."
        )


# ----------------------------------------------------------------------------- helpers


def default_entropy_edges(h_min_pos: float | None, h_max: float | None, n_bins: int = 20):
    """Default entropy bin edges (nats): ``[0]`` then ``n_bins`` log-spaced edges from
    ``max(h_min_pos, h_max * 1e-4)`` to ``h_max`` (``n_bins`` bins; the last is closed).
    Degenerate input (no positive entropy) gives ``[0, 1]``."""
    if h_max is None or not math.isfinite(h_max) or h_max <= 0:
        return np.array([0.0, 1.0])
    lo = max(float(h_min_pos or h_max), h_max * 1e-4)
    if lo >= h_max:
        return np.array([0.0, h_max]) if h_max > 0 else np.array([0.0, 1.0])
    return np.concatenate([[0.0], np.geomspace(lo, h_max, n_bins)])


def _search(values: Sequence[float], expr: pl.Expr, side: str) -> pl.Expr:
    """Per row, the number of ``values`` (sorted) below ``expr`` (``side="left"``: strictly
    below; ``"right"``: at or below), Int32; null rows give 0 and NaN rows ``len(values)``
    (as summing one comparison per value would). The reference of :class:`_Searcher`, which
    the passes use: ``search_sorted`` on a literal is not elementwise, so in a streaming
    query the engine would hold the whole column."""
    if len(values) == 0:
        return pl.lit(0, dtype=pl.Int32)
    v = pl.Series(np.asarray(values, dtype=float), dtype=pl.Float64)
    return pl.lit(v).search_sorted(expr, side=side).fill_null(0).cast(pl.Int32)  # type: ignore[arg-type]


def _bin_index(expr: pl.Expr, edges: Sequence[float]) -> pl.Expr:
    """0-based bin of ``expr`` for bins ``[e_i, e_{i+1})``; below e_0 -> 0, above -> last."""
    return _search(list(edges[1:-1]), expr, "right")


def _bin_labels(edges: Sequence[float]) -> tuple[str, ...]:
    """``"[a,b)"`` per bin; the first bin reads ``"<b"`` unless its lower edge is 0 and the
    last ``">=a"``, because values beyond the outer edges are counted in the end bins."""
    m = len(edges) - 1
    out = []
    for j, (a, b) in enumerate(zip(edges[:-1], edges[1:], strict=True)):
        if j == m - 1 and m > 1:
            out.append(f">={a:.3g}")
        elif j == 0 and a > 0:
            out.append(f"<{b:.3g}")
        else:
            out.append(f"[{a:.3g},{b:.3g})")
    return tuple(out)


def _check_edges(edges: Any, what: str) -> np.ndarray:
    e = number_array(edges, "compare_gates", what)
    if e.size < 2 or not np.all(np.isfinite(e)) or np.any(np.diff(e) <= 0):
        raise ParameterError(
            f"{what} must be at least two finite, strictly increasing values (got {e.tolist()})."
        )
    return e


def _check_sweep(values: Any, what: str, positive: bool) -> np.ndarray:
    v = number_array(values, "compare_gates", what)
    if v.size == 0:
        return v
    bad = ~np.isfinite(v) | ((v <= 0) if positive else (v < 0))
    if bad.any() or v.size > _MAX_SWEEP:
        raise ParameterError(
            f"{what} must hold at most {_MAX_SWEEP} finite "
            f"{'positive' if positive else 'non-negative'} values (got {v.tolist()[:10]})."
        )
    return np.unique(v)


_CAT_OTHER, _CAT_NOISE, _CAT_LAW = 0, 1, 2


# ------------------------------------------------------------------------ compare_gates

#: First-pass histograms of ``|delta|`` and ``delta^2``: the bin of a value is its IEEE-754
#: float64 bit pattern shifted right by this many bits, monotone in the value for values
#: >= 0. Nine mantissa bits are kept, so one bin spans a relative width of at most 2^-9
#: (0.2%); 2^20 bins (8 MB per array).
_HIST_SHIFT = 43
_HIST_SIZE = 1 << (63 - _HIST_SHIFT)
#: The second pass lists the tokens of the histogram bin holding a threshold (the matched
#: band's c, an M2PO cut) by exact value when that bin holds at most this many tokens;
#: above, refinement scans make the threshold exact before the second pass (rare).
_BOUNDARY_ROWS = 262_144
_N_SB = len(STALENESS_BUCKETS) + 1  # staleness buckets, then "no bucket"


def _bin_bounds(b: int) -> tuple[float, float]:
    """Smallest and largest float64 of histogram bin ``b`` (``inf`` for the top bin)."""
    lo, hi = np.array([b << _HIST_SHIFT, ((b + 1) << _HIST_SHIFT) - 1], dtype=np.uint64).view(
        np.float64
    )
    return float(lo), (math.inf if math.isnan(hi) else float(hi))


def _cut_value(kind: str) -> pl.Expr:
    """The per-token value a threshold applies to: ``|delta|`` or ``delta^2``."""
    d = pl.col("delta")
    return d.abs() if kind == "absd" else d * d


@dataclass
class _Cut:
    """A threshold on a per-token value (``kind``: ``"absd"`` = ``|delta|`` for the matched
    band, ``"d2"`` = ``delta^2`` for M2PO) of gate ``gate``: kept iff ``v <= cut``, or
    ``v < cut`` when ``strict``. ``pred(n, s)``: the prefix predicate whose first true value
    is the cut (as in :func:`_first_value_where`).

    After the first pass ``cut`` is either known, or bracketed in one histogram bin
    ``[lo, hi]`` (``n_below`` / ``s_below``: count and sum of the values below ``lo``): the
    second pass counts ``v < lo`` as kept and lists the tokens with ``lo <= v <= hi`` by
    exact value (with their bin keys), and the cut and those tokens' decisions follow
    exactly after the pass.
    """

    gate: int
    kind: str
    strict: bool
    pred: Callable[[Any, Any], Any] | None = None
    cut: float | None = None
    lo: float = math.nan
    hi: float = math.nan
    n_below: int = 0
    s_below: float = 0.0

    def keep(self, v: Any, cut: float) -> Any:
        return v < cut if self.strict else v <= cut

    def sure_keep_expr(self) -> pl.Expr:
        """Tokens kept whatever the exact cut in the bracket (all of them when exact)."""
        v = _cut_value(self.kind)
        return self.keep(v, self.cut) if self.cut is not None else v < self.lo


_WORD = 63  # keep decisions packed per token: 63 bits per UInt64 word


def _pack(bits: Sequence[pl.Expr], prefix: str) -> list[pl.Expr]:
    """Boolean expressions packed into UInt64 words ``{prefix}0, {prefix}1, ...``: bit ``j``
    of the list is bit ``j % 63`` of word ``j // 63``; null counts as False."""
    words = []
    for w0 in range(0, len(bits), _WORD):
        zero = pl.lit(0, dtype=pl.UInt64)
        terms = [
            pl.when(bits[j]).then(pl.lit(1 << (j - w0), dtype=pl.UInt64)).otherwise(zero)
            for j in range(w0, min(w0 + _WORD, len(bits)))
        ]
        words.append(pl.sum_horizontal(terms).cast(pl.UInt64).alias(f"{prefix}{w0 // _WORD}"))
    return words


def _bit(words: np.ndarray, j: int) -> np.ndarray:
    """Bit ``j`` (see :func:`_pack`) of a ``(rows, n_words)`` uint64 array, as bool."""
    w = words[:, j // _WORD]
    return ((w >> np.uint64(j % _WORD)) & np.uint64(1)).astype(bool)


def _words(df: pl.DataFrame, prefix: str) -> np.ndarray:
    cols = sorted((c for c in df.columns if c.startswith(prefix)), key=lambda c: int(c[len(prefix):]))
    if not cols:
        return np.zeros((df.height, 0), dtype=np.uint64)
    return df.select(cols).to_numpy().astype(np.uint64).reshape(df.height, len(cols))


_LUT_SHIFT = 42  # lookup-table bins: float64 bits >> 42 (10 mantissa bits, 0.1% wide)


class _Searcher:
    """``np.searchsorted(values, x, side)`` for float64 arrays, with the rules of
    :func:`_search` for missing values (NaN -> ``len(values)``; nulls are the caller's: see
    :meth:`series`), by a lookup table on the bit pattern of ``x``: one entry per
    ``_LUT_SHIFT`` bin between the smallest and the largest value; an entry whose bin holds
    a value, and negative ``x``, are searched exactly. Same answers, ~4x faster than a
    binary search of every element."""

    def __init__(self, values: Sequence[float], side: str) -> None:
        self.values = np.asarray(values, dtype=np.float64)
        self.side = side
        self.lut: np.ndarray | None = None
        if self.values.size and not np.signbit(self.values[0]):
            f0, f1 = (self.values[[0, -1]].view(np.uint64) >> np.uint64(_LUT_SHIFT)).tolist()
            f = np.arange(f0, f1 + 1, dtype=np.uint64)
            lo = (f << np.uint64(_LUT_SHIFT)).view(np.float64)
            hi = (((f + np.uint64(1)) << np.uint64(_LUT_SHIFT)) - np.uint64(1)).view(np.float64)
            a = np.searchsorted(self.values, lo, side)  # type: ignore[call-overload]
            b = np.searchsorted(self.values, hi, side)  # type: ignore[call-overload]
            # padded: below the first bin nothing is below x, above the last everything
            self.lut = np.concatenate([[0], np.where(a == b, a, -1), [self.values.size]])
            self.f0 = int(f0)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if self.values.size == 0:
            return np.zeros(x.shape, dtype=np.int64)
        if self.lut is None:
            return np.searchsorted(self.values, x, self.side)  # type: ignore[call-overload]
        # (arithmetic shift: negative x give negative f, clipped to 0, then searched exactly)
        f = x.view(np.int64) >> _LUT_SHIFT
        f -= self.f0 - 1
        np.clip(f, 0, self.lut.size - 1, out=f)
        out = self.lut[f]
        redo = (out < 0) | np.signbit(x)
        if redo.any():
            out[redo] = np.searchsorted(self.values, x[redo], self.side)  # type: ignore[call-overload]
        return out

    def series(self, s: pl.Series) -> np.ndarray:
        """The search of a float Series, nulls giving 0 (as :func:`_search`)."""
        x = s.cast(pl.Float64).to_numpy()
        out = self(x)
        if s.null_count():
            out[s.is_null().to_numpy()] = 0
        return out


def null_reason_lines(reasons: Mapping[str, str] | None) -> list[str]:
    """The comparison's ``null_reasons`` (metric -> why it is n/a) as sentences, one per
    cause: metrics whose reasons share their cause (the text before the last ': ', e.g.
    "no scaling law could be fitted (...)") are told together, the cause once (``n/a
    exploration discarded and noise admitted: <cause>: <why one>; <why other>.``)."""
    groups: dict[str, list[tuple[str, str]]] = {}
    for key, text in (reasons or {}).items():
        cause, _, why = str(text).rpartition(": ")
        groups.setdefault(cause, []).append((key.replace("_", " "), why))
    out = []
    for cause, items in groups.items():
        names = " and ".join(k for k, _ in items)
        whys = "; ".join(w for _, w in items)
        out.append(f"n/a {names}: " + (f"{cause}: " if cause else "") + f"{whys}.")
    return out


def noise_by_definition(gate: Mapping[str, Any], parameters: Mapping[str, Any]) -> bool:
    """Whether ``gate`` (a ``GateResult.to_dict()``) is the ENTR rule that defines the noise
    tokens (the same tau and eps as ``parameters``' ``flag_tau`` / ``flag_eps``) and there
    are noise tokens (``noise_admitted`` not None): it keeps none of them by definition,
    so its noise admitted (0) is no finding."""
    p = gate.get("params") or {}
    return (gate.get("name") == "entr" and gate.get("noise_admitted") is not None
            and p.get("tau") == parameters.get("flag_tau")
            and p.get("eps") == parameters.get("flag_eps"))


def _run_starts(keys: np.ndarray) -> np.ndarray:
    """Start index of every run of equal consecutive values of a non-empty array."""
    change = np.empty(keys.size, dtype=bool)
    change[0] = True
    np.not_equal(keys[1:], keys[:-1], out=change[1:])
    return np.flatnonzero(change)


def _bit_bin_expr(x: pl.Expr) -> pl.Expr:
    """Histogram bin (see ``_HIST_SHIFT``) of a non-negative float64 expression, as Int32;
    -1 for null and NaN: the IEEE-754 bit pattern shifted right (monotone for x >= 0)."""
    b = (x.cast(pl.Float64).reinterpret(dtype=pl.Int64) // (1 << _HIST_SHIFT)).cast(pl.Int32)
    return pl.when(x.is_not_nan()).then(b).otherwise(pl.lit(-1, dtype=pl.Int32))


_REDUCE = {"or": np.bitwise_or, "and": np.bitwise_and, "sum": np.add, "min": np.minimum,
           "max": np.maximum}


def _hist_add(counts: np.ndarray, bins: np.ndarray, sums: np.ndarray | None = None,
              weights: np.ndarray | None = None) -> None:
    """Add a batch to a histogram (and a weight sum per bin) over the occupied range only."""
    lo = int(bins.min())
    b = bins - lo
    c = np.bincount(b)
    counts[lo: lo + c.size] += c
    if sums is not None:
        sums[lo: lo + c.size] += np.bincount(b, weights=weights)


def _opt(fn: Callable[[float, float], float], a: float | None, b: Any) -> float | None:
    """``fn(a, b)`` ignoring a None / NaN side."""
    if b is None or (isinstance(b, float) and math.isnan(b)):
        return a
    return float(b) if a is None else fn(a, float(b))


def _sorted_counts(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct values of a sorted, non-empty 1-d array and their counts."""
    starts = _run_starts(s)
    return s[starts], np.diff(np.append(starts, s.size))


#: most cells :func:`_distinct_counts` counts with one ``bincount`` (its table is zeroed per
#: call: 8 MB)
_DENSE_COUNT_MAX: int = 1 << 20


def _distinct_counts(key: np.ndarray, nb: int, kb: int) -> tuple[np.ndarray, np.ndarray]:
    """Distinct values of ``key`` (a non-empty int64 array of values ``top * 2^kb + mid *
    2^nb + pattern``, all >= 0) in ascending order, and their counts: as
    :func:`_sorted_counts` of the sorted keys. The patterns of a batch are few (most tokens
    are kept by every gate) and its steps (``top``) and cells (``mid``) span small ranges:
    the patterns are ranked with a ``bincount`` over ``2^nb`` values, and (top, mid, rank)
    counted with one ``bincount`` over their product of ranges when it is at most
    :data:`_DENSE_COUNT_MAX`, in linear time (sorting a batch's 125k keys took 5.7 ms, half
    of the gate pass's numpy work); else by sorting."""
    if nb <= 20:
        pat = key & ((1 << nb) - 1)
        seen = np.bincount(pat)
        ids = np.flatnonzero(seen)
        m = ids.size
        top = key >> kb
        mid = (key >> nb) & ((1 << (kb - nb)) - 1)
        t0, m0 = int(top.min()), int(mid.min())
        nt, nm = int(top.max()) - t0 + 1, int(mid.max()) - m0 + 1
        if nt * nm * m <= _DENSE_COUNT_MAX:
            rank = np.zeros(seen.size, dtype=np.int64)
            rank[ids] = np.arange(m)
            dense = ((top - t0) * nm + (mid - m0)) * m + rank[pat]
            cnt = np.bincount(dense, minlength=nt * nm * m)
            nz = np.flatnonzero(cnt)
            hi = nz // m
            u = ((hi // nm + t0) << kb) | ((hi % nm + m0) << nb) | ids[nz % m]
            return u, cnt[nz]
    return _sorted_counts(np.sort(key))


def _sum_by(keys: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct ``keys`` (sorted) and the sum of ``n`` per key (small arrays)."""
    order = np.argsort(keys, kind="stable")
    k = keys[order]
    u, c = _sorted_counts(k)
    starts = np.append(0, np.cumsum(c)[:-1])
    return u, np.add.reduceat(n[order], starts)


class _Pending:
    """Pre-aggregated partial tables handed to a :class:`GroupAgg` some batches at a time:
    one group-by per about ``rows`` rows instead of one per batch."""

    def __init__(self, acc: GroupAgg, rows: int = 524_288) -> None:
        self.acc, self.rows = acc, rows
        self._parts: list[pl.DataFrame] = []
        self._n = 0

    def add(self, part: pl.DataFrame | dict[str, np.ndarray | pl.Series]) -> None:
        """``part``: a frame, or its columns (see :func:`entr_diag.passes.frame_of`)."""
        self._parts.append(part)
        self._n += (part.height if isinstance(part, pl.DataFrame)
                    else len(next(iter(part.values()))))
        if self._n >= self.rows:
            self.flush()

    def flush(self) -> None:
        if self._parts:
            frames = [p for p in self._parts if isinstance(p, pl.DataFrame)]
            cols = [p for p in self._parts if not isinstance(p, pl.DataFrame)]
            if cols:
                frames.append(frame_of(cols))
            self.acc.update(pl.concat(frames, how="vertical_relaxed"))
            self._parts, self._n = [], 0

    def result(self, empty_schema: pl.DataFrame | None = None) -> pl.DataFrame:
        self.flush()
        return self.acc.result(empty_schema)


def _count_patterns(step: pl.Series, words: np.ndarray, n_bits: int) -> pl.DataFrame:
    """Rows per (step, pattern words) of a batch: ``step``, ``__w0``..., ``n`` (a polars
    group-by)."""
    df = pl.DataFrame({f"__w{j}": words[:, j] for j in range(words.shape[1])})
    return df.with_columns(step).group_by("step", *df.columns).agg(n=pl.len())


_P1 = "__g1_"  # names of the first pass's expressions (computed by the streaming engine)
_P2 = "__g2_"  # and of the second pass's


class _FirstPass:
    """Pass 1 of :class:`ComparePlan`: totals, entropy range, ENTR's kept count, ``|delta|``
    / ``delta^2`` histograms and per-sequence partials (one row per ``seq_key``). Nothing in
    it depends on the law (categories, entropy bins): it can share the fit's pass.

    The per-token values are :attr:`exprs`, computed by the streaming engine during the scan:
    ENTR's keep bit, ``|delta|``, the histogram bin of ``|delta|`` (and ``delta^2`` with its
    bin), the token gates' keep bits packed in words and the sequence gates' per-token
    partials. Per batch, numpy adds the histogram bins up with ``bincount`` and collapses
    runs of one ``seq_key`` (``ufunc.reduceat``: sums, minima, maxima, OR / AND of the
    words) before the per-sequence group-by; a batch with a null ``seq_key`` or a null / NaN
    value to reduce goes through polars' group-by instead (its null-skipping aggregations)."""

    def __init__(self, plan: ComparePlan) -> None:
        self.plan = plan
        self.n = 0
        self.entr_kept = 0
        self.h_null = 0
        self.h_max: float | None = None
        self.h_min_pos: float | None = None
        self.a_min: float | None = None
        self.a_max: float | None = None
        self.hist_a = np.zeros(_HIST_SIZE, dtype=np.int64)
        self.with_d2 = any(isinstance(g, M2PO) for g in plan.gates)
        self.hist_q = np.zeros(_HIST_SIZE if self.with_d2 else 0, dtype=np.int64)
        self.hist_qs = np.zeros(_HIST_SIZE if self.with_d2 else 0, dtype=np.float64)
        absd = pl.col("delta").abs()
        ex: dict[str, pl.Expr] = {
            "k0": plan.keep_expr(0).fill_null(False).cast(pl.Int64),
            "a": absd,
            "ab": _bit_bin_expr(absd),
        }
        if self.with_d2:
            ex["q"] = absd * absd
            ex["qb"] = _bit_bin_expr(absd * absd)
        # token gates' decisions packed in words: per sequence, OR = some token kept,
        # AND = every token kept
        words = _pack([plan.keep_expr(i) for i in plan.seq_count_idx], _P1 + "w")
        self.n_words = len(words)
        #: per-sequence reductions: (output column, batch column, how)
        self.reduce: list[tuple[str, str, str]] = []
        for w in range(self.n_words):
            self.reduce += [(f"__or{w}", f"{_P1}w{w}", "or"), (f"__and{w}", f"{_P1}w{w}", "and")]
        self.columns = ["seq_key"] + (["entropy"] if plan.has_entropy else [])
        for name, (e, how) in plan.partials.items():
            if e.meta.is_column():  # aggregated straight from the input column
                src = e.meta.output_name()
                if src not in self.columns:
                    self.columns.append(src)
            else:
                src = f"{_P1}p_{name}"
                ex[f"p_{name}"] = e
            self.reduce.append((f"__p_{name}", src, how))
        self.reduce += [("__amin", f"{_P1}a", "min"), ("__amax", f"{_P1}a", "max")]
        self.exprs = [*(e.alias(_P1 + k) for k, e in ex.items()), *words]
        agg = {"or": "bitwise_or", "and": "bitwise_and", "sum": "sum", "count": "count",
               "min": "min", "max": "max"}
        #: the per-batch aggregations of a batch polars groups (nulls, NaN) ...
        self._aggs = [getattr(pl.col(src), agg[how])().alias(out)
                      for out, src, how in self.reduce]
        #: ... and the merge of partial rows (a count merges by sum)
        merge = [getattr(pl.col(out), agg["sum" if how == "count" else how])()
                 for out, _src, how in self.reduce]
        self.seq = _Pending(GroupAgg([], ["seq_key"], merge, merge))
        #: sequences holding tokens with a null / NaN |delta| (never kept by a threshold)
        self.invalid = GroupAgg([], ["seq_key"], [pl.len().alias("__bad")],
                                [pl.col("__bad").sum()])

    def update(self, batch: pl.DataFrame) -> None:
        if self.plan.has_entropy:
            if batch.get_column("entropy").null_count():  # polars: null-skipping
                h = batch.get_column("entropy").cast(pl.Float64)
                self.h_null += h.null_count() + int(h.is_nan().sum() or 0)
                self.h_max = _opt(max, self.h_max, h.max())
                self.h_min_pos = _opt(min, self.h_min_pos, h.filter(h > 0).min())
            else:  # numpy (a polars operation here waits for the engine's thread pool)
                hn = column(batch, "entropy")
                nan = np.isnan(hn)
                n_nan = int(nan.sum())
                self.h_null += n_nan
                if n_nan < hn.size:  # NaN ignored, as by _opt
                    fin = hn[~nan] if n_nan else hn
                    self.h_max = _opt(max, self.h_max, float(fin.max()))
                    pos = fin[fin > 0]
                    if pos.size:
                        self.h_min_pos = _opt(min, self.h_min_pos, float(pos.min()))
        self.n += batch.height
        self.entr_kept += int(column(batch, f"{_P1}k0").sum())
        a = column(batch, f"{_P1}a")
        ab = column(batch, f"{_P1}ab")
        ok = None
        if int(ab.min()) < 0:  # null / NaN |delta|
            ok = ab >= 0
            self.invalid.update(batch.filter(pl.Series(~ok)))
        runs = self._runs(batch) if ok is None else None
        if runs is None:
            runs = batch.group_by("seq_key").agg(self._aggs)
            sel = a if ok is None else a[ok]
            if sel.size:
                self.a_min = _opt(min, self.a_min, float(sel.min()))
                self.a_max = _opt(max, self.a_max, float(sel.max()))
        else:
            self.a_min = _opt(min, self.a_min, float(runs["__amin"].min()))
            self.a_max = _opt(max, self.a_max, float(runs["__amax"].max()))
        self.seq.add(runs)
        if ok is not None:
            ab = ab[ok]
            if not ab.size:
                return
        _hist_add(self.hist_a, ab)
        if self.with_d2:
            qb = column(batch, f"{_P1}qb")
            q = column(batch, f"{_P1}q")
            if ok is not None:
                qb, q = qb[ok], q[ok]
            _hist_add(self.hist_q, qb, self.hist_qs, q)

    def _runs(self, batch: pl.DataFrame) -> dict[str, np.ndarray] | None:
        """The batch's rows collapsed per run of one ``seq_key`` (the per-sequence partials
        of each run, as numpy columns), or None when a value to reduce is null or NaN."""
        sk = batch.get_column("seq_key")
        if sk.null_count() or any(batch.get_column(src).null_count()
                                  for _o, src, _h in self.reduce):
            return None
        starts = run_starts(batch, ["seq_key"])
        out: dict[str, Any] = {"seq_key": column(batch, "seq_key")[starts]}
        lengths = None
        for col, src, how in self.reduce:
            if how == "count":  # no null: the run's length
                if lengths is None:
                    lengths = np.diff(np.append(starts, batch.height))
                out[col] = lengths
                continue
            v = _REDUCE[how].reduceat(column(batch, src), starts)
            if v.dtype.kind == "f" and np.isnan(v).any():
                return None
            out[col] = v
        return out


class _SecondPass:
    """Pass 2 of :class:`ComparePlan`: token counts by (cell, keep pattern) and by (step,
    keep pattern), a cell being (entropy bin, p bin, staleness bucket, category) and the
    pattern every gate's keep bit (then TIS's truncation bits) packed in words; TIS weight
    sums per cell; the tokens of each bracketed threshold's bin by exact value; the sweeps'
    token counts by (sweep index, category).

    The engine computes (:attr:`exprs`) entropy, p, and, when the pattern fits one word, one
    Int64 key ``step * 2^kb + (staleness bucket * 3 + category) * 2^bits + pattern`` (token
    gates' bits; integer steps in ``[0, step_limit)``, else 0). Per batch, numpy adds the
    entropy and p bins (lookup tables, :class:`_Searcher`) to make it ``step * 2^kb + cell *
    2^bits + pattern`` and the sequence gates' bits, looked up once per run of one
    ``seq_key`` (a search in the sorted per-sequence decisions); one sort of the keys then
    counts both tables; TIS's weights are summed per cell with ``bincount``. A batch whose
    steps are not all in the key counts steps with a polars group-by; patterns of more than
    one word go through a polars group-by on (cell, words)."""

    def __init__(self, plan: ComparePlan, e_edges: np.ndarray, cuts: Sequence[_Cut],
                 decisions: pl.DataFrame | None) -> None:
        self.plan = plan
        self.rows = 0
        self.has_step = plan.has_step
        self.columns = ["seq_key"] + (["step"] if plan.has_step else [])
        self.n_eb, self.n_pb = len(e_edges) - 1, len(plan.p_e) - 1
        self.n_cells = self.n_eb * self.n_pb * _N_SB * 3
        gates = plan.all_gates
        cut_of = {c.gate: c for c in cuts}
        self.bracketed = [c for c in cuts if c.cut is None]
        bits: list[pl.Expr] = []
        for i, g in enumerate(gates):
            if i in cut_of:
                bits.append(cut_of[i].sure_keep_expr())
            elif isinstance(g, SequenceGate):
                bits.append(pl.lit(False))  # from the per-sequence decisions
            else:
                bits.append(plan.keep_expr(i))
        self.tis = [i for i, g in enumerate(gates) if isinstance(g, TIS)]
        bits += [gates[i].truncated_expr() for i in self.tis]  # type: ignore[attr-defined]
        self.n_bits = len(bits)
        words = _pack(bits, _P2 + "w")
        self.n_words = len(words)
        #: one Int64 key per token: cell * 2^bits + pattern
        self.packed = self.n_words == 1 and self.n_cells << self.n_bits < 1 << 62
        if plan.has_stale:
            s = pl.col("staleness")
            if plan.staleness_unit != 1:  # (lags counted in units of that many versions)
                s = s // plan.staleness_unit
            chain = None
            for j, (_lab, lo_, hi_) in enumerate(STALENESS_BUCKETS):
                cond = (s >= lo_) & (s <= hi_)
                chain = (pl.when(cond) if chain is None else chain.when(cond)).then(
                    pl.lit(j, dtype=pl.Int64)
                )
            sb = chain.otherwise(pl.lit(_N_SB - 1, dtype=pl.Int64))  # type: ignore[union-attr]
        else:
            sb = pl.lit(_N_SB - 1, dtype=pl.Int64)
        # cell = (entropy bin * n_pb + p bin) * (_N_SB * 3) + staleness bucket * 3 + category:
        # the engine computes the last two, numpy the bins (lookup-table searches)
        sc = sb * 3 + plan.cat.cast(pl.Int64)
        self._eb = _Searcher(e_edges[1:-1], "right")
        self._pb = _Searcher(plan.p_e[1:-1], "right")
        ex: dict[str, pl.Expr] = {
            "h": pl.col("entropy") if plan.has_entropy else pl.lit(0.0, dtype=pl.Float64),
            "p": pl.col("infer_logprob").exp(),
        }
        #: bits of the cell key ``cell * 2^bits + pattern``
        self.k_bits = (self.n_cells << self.n_bits).bit_length()
        #: integer steps in [0, step_limit) are part of the packed key
        self.step_limit = 1 << max(62 - self.k_bits, 0)
        self.step_in_key = (self.packed and plan.has_step
                            and plan.schema["step"].is_integer())
        if self.packed:
            key = sc * (1 << self.n_bits) + words[0].cast(pl.Int64)
            if self.step_in_key:
                st = pl.col("step")
                ok = (st >= 0) & (st < self.step_limit)
                key = key + pl.when(ok).then(st.cast(pl.Int64) * (1 << self.k_bits)).otherwise(
                    pl.lit(0, dtype=pl.Int64))
            ex["K"] = key
            self.exprs = []
        else:
            ex["sc"] = sc
            self.exprs = list(words)
        if self.tis:  # TIS's log weights (a null one weighs nothing: exp(-inf) = 0)
            ex["tisd"] = pl.col("delta").cast(pl.Float64).fill_null(-math.inf)
        #: TIS's weight sums are of exp(delta - tis_shift): raised, and the sums so far
        #: scaled down, when a delta above tis_shift + _WEIGHT_LOG_MAX comes (a placeholder's
        #: +999 made exp(delta) inf, the removed share inf / inf); the share, a ratio of two
        #: sums scaled alike, is unchanged
        self.tis_shift = 0.0
        for j, c in enumerate(self.bracketed):
            ex[f"v{j}"] = _cut_value(c.kind)
        # the sweeps: token counts by (sweep index, category); a token is kept at every
        # value from its index on (ENTR's score; |delta| for the fixed band)
        self.sweep_tau = plan.has_entropy and plan.taus.size > 0
        self.sweep_c = plan.cs.size > 0
        self.tau_counts = np.zeros((plan.taus.size + 1) * 3, dtype=np.int64)
        self.c_counts = np.zeros((plan.cs.size + 1) * 3, dtype=np.int64)
        self._ti = _Searcher(plan.taus, "left")
        self._ci = _Searcher(plan.cs, "left")
        if self.sweep_tau:
            ex["s"] = plan.entr_score
        if self.sweep_c:
            ex["a"] = pl.col("delta").abs()
        self.exprs += [e.alias(_P2 + k) for k, e in ex.items()]
        self.tis_sums = np.zeros((len(self.tis), 2, self.n_cells))
        # the sequence gates' bits (packed at their gates' positions), by sorted seq_key
        self.dec_keys = self.dec_words = None
        if decisions is not None:
            d = decisions.drop_nulls("seq_key").sort("seq_key")
            self.decisions = decisions
            self.dec_keys = d.get_column("seq_key").to_numpy()
            self.dec_words = _words(d, "__sw")
        wcols = [f"__w{j}" for j in range(self.n_words)]
        n_sum = [pl.col("n").sum()]
        self.cells = _Pending(GroupAgg([], ["__K"] if self.packed else ["__code", *wcols],
                                       n_sum, n_sum))
        self.steps = _Pending(GroupAgg([], ["step", *wcols], n_sum, n_sum))
        self.bound: list[list[pl.DataFrame]] = [[] for _ in self.bracketed]

    def _seq_words(self, batch: pl.DataFrame) -> np.ndarray:
        """The sequence gates' decision words of every row, ``(rows, words)`` uint64: one
        search per run of one ``seq_key``; a sequence not in the table gets 0."""
        assert self.dec_keys is not None and self.dec_words is not None
        sk_s = batch.get_column("seq_key")
        n_dec = self.dec_words.shape[1]
        if sk_s.null_count() or not self.dec_keys.size:
            j = sk_s.to_frame().join(self.decisions, on="seq_key", how="left",
                                     maintain_order="left")
            return _words(j.fill_null(0), "__sw").reshape(batch.height, n_dec)
        sk = column(batch, "seq_key")
        starts = run_starts(batch, ["seq_key"])
        rk = sk[starts]
        idx = np.minimum(np.searchsorted(self.dec_keys, rk), self.dec_keys.size - 1)
        w = np.where((self.dec_keys[idx] == rk)[:, None], self.dec_words[idx], np.uint64(0))
        lengths = np.diff(np.append(starts, sk.size))
        if n_dec == 1:  # a 1-d repeat is cheaper
            return np.repeat(w[:, 0], lengths).reshape(-1, 1)
        return np.repeat(w, lengths, axis=0)

    def update(self, batch: pl.DataFrame) -> None:
        self.rows += batch.height
        nb = self.n_bits
        dec = self._seq_words(batch) if self.dec_keys is not None else None
        step = batch.get_column("step") if self.has_step else None
        if not self.packed:
            self._update_words(batch, dec, step)
            return
        # key = step * 2^kb + cell * 2^nb + pattern (from the engine), plus the sequence
        # gates' bits: one sort counts both tables
        kb = self.k_bits
        key = self._cell_hi(batch)
        key <<= nb
        key += batch.get_column(f"{_P2}K").to_numpy()
        if dec is not None:
            key += dec[:, 0].view(np.int64)
        if self.tis or self.bracketed or self.sweep_tau or self.sweep_c:
            code = key >> nb
            code &= (1 << (kb - nb)) - 1
            self._tis_and_bound(batch, code, key, step)
            self._sweeps(batch, code)
        in_key = step is not None and self.step_in_key and not step.null_count() and (
            0 <= step.min() and step.max() < self.step_limit)  # type: ignore[operator]
        if step is not None and not in_key:  # steps not (all) in the key: polars counts
            key &= (1 << kb) - 1
            w = (key & ((1 << nb) - 1)).view(np.uint64).reshape(-1, 1)
            self.steps.add(_count_patterns(step, w, nb))
        u, n = _distinct_counts(key, nb, kb)
        if not in_key:
            self.cells.add({"__K": u, "n": n})
            return
        assert step is not None
        ku, kn = (u, n) if u[0] >> kb == u[-1] >> kb else _sum_by(u & ((1 << kb) - 1), n)
        self.cells.add({"__K": ku & ((1 << kb) - 1), "n": kn})
        su, sn = _sum_by(((u >> kb) << nb) | (u & ((1 << nb) - 1)), n)
        self.steps.add({
            "step": pl.Series(su >> nb).cast(step.dtype),
            "__w0": (su & ((1 << nb) - 1)).view(np.uint64),
            "n": sn,
        })

    def _cell_hi(self, batch: pl.DataFrame) -> np.ndarray:
        """Per token, ``(entropy bin * n_pb + p bin) * (_N_SB * 3)`` (a new int64 array)."""
        c = self._eb.series(batch.get_column(f"{_P2}h"))
        c *= self.n_pb
        c += self._pb.series(batch.get_column(f"{_P2}p"))
        c *= _N_SB * 3
        return c

    def _update_words(self, batch: pl.DataFrame, dec: np.ndarray | None,
                      step: pl.Series | None) -> None:
        """:meth:`update` for patterns of more than one word (a polars group-by)."""
        code = self._cell_hi(batch)
        code += batch.get_column(f"{_P2}sc").to_numpy()
        words = _words(batch, f"{_P2}w")
        if dec is not None:
            words[:, : dec.shape[1]] += dec
        wdf = pl.DataFrame({f"__w{j}": words[:, j] for j in range(self.n_words)})
        self.cells.add(wdf.with_columns(pl.Series("__code", code)).group_by(
            "__code", *wdf.columns).agg(n=pl.len()))
        if step is not None:
            self.steps.add(_count_patterns(step, words, self.n_bits))
        self._tis_and_bound(batch, code, words[:, 0], step)
        self._sweeps(batch, code)

    def _sweeps(self, batch: pl.DataFrame, code: np.ndarray) -> None:
        """The sweeps' counts by (sweep index, category); ``code``: each token's cell (its
        category is the cell modulo 3). The searches are lookup tables in numpy (cheaper
        than one comparison per sweep value in the engine)."""
        if not (self.sweep_tau or self.sweep_c):
            return
        cat = code % 3
        if self.sweep_tau:
            tk = self._ti.series(batch.get_column(f"{_P2}s"))
            tk *= 3
            tk += cat
            self.tau_counts += np.bincount(tk, minlength=self.tau_counts.size)
        if self.sweep_c:
            a_s = batch.get_column(f"{_P2}a")
            ci = (self._ci(a_s.to_numpy()) if a_s.dtype == pl.Float64 and not a_s.null_count()
                  else self._ci.series(a_s))
            ci *= 3
            ci += cat
            self.c_counts += np.bincount(ci, minlength=self.c_counts.size)

    def _tis_and_bound(self, batch: pl.DataFrame, code: np.ndarray, bits: np.ndarray,
                       step: pl.Series | None) -> None:
        """TIS's weight sums per cell; the tokens of the bracketed bins by exact value.
        ``bits``: per token, an integer whose lowest bit is ENTR's keep bit."""
        if self.tis:
            d = batch.get_column(f"{_P2}tisd").to_numpy()
            top = float(np.nanmax(d)) if d.size else -math.inf
            if top - self.tis_shift > _WEIGHT_LOG_MAX:
                new = top - _WEIGHT_LOG_MAX
                self.tis_sums *= math.exp(self.tis_shift - new)
                self.tis_shift = new
            for t, i in enumerate(self.tis):
                g = self.plan.all_gates[i]
                assert isinstance(g, TIS)
                w, removed = scaled_truncation(d, g.cap, self.tis_shift)
                for s_, wt in enumerate((removed, w)):
                    self.tis_sums[t, s_] += np.bincount(code, weights=wt, minlength=self.n_cells)
        for j, c in enumerate(self.bracketed):
            v = batch.get_column(f"{_P2}v{j}").to_numpy()
            inside = (v >= c.lo) & (v <= c.hi)
            if inside.any():  # listed as they come (grouped after the pass: no polars
                # query runs while the streaming engine holds the thread pool)
                m = int(inside.sum())
                self.bound[j].append(pl.DataFrame({
                    "__code": code[inside],
                    "__k0": (bits[inside] & 1).astype(bool),
                    "step": (step.filter(pl.Series(inside)) if step is not None
                             else pl.zeros(m, dtype=pl.Int64, eager=True)),
                    "v": v[inside],
                    "n": np.ones(m, dtype=np.int64),
                }))

    def tables(self) -> tuple[list[str], np.ndarray, pl.DataFrame]:
        """After the pass: the columns ``n``, ``kept{i}``, ``both{i}`` (i > 0) and TIS's
        ``trunc{i}``, ``rmass{i}``, ``rsum{i}`` per cell, as one ``(columns, cells)`` float
        array, and the per-step counts ``step``, ``n``, ``kept{i}`` (no row without a
        ``step`` column)."""
        n_g = len(self.plan.all_gates)
        cols = ["n"] + [f"kept{i}" for i in range(n_g)] + [f"both{i}" for i in range(1, n_g)]
        for i in self.tis:
            cols += [f"trunc{i}", f"rmass{i}", f"rsum{i}"]
        out = np.zeros((len(cols), self.n_cells), dtype=np.float64)
        ix = {c: j for j, c in enumerate(cols)}
        t = self.cells.result()
        n = t.get_column("n").to_numpy().astype(np.float64)
        if self.packed:
            K = t.get_column("__K").to_numpy()
            code = K >> self.n_bits
            words = (K & ((1 << self.n_bits) - 1)).astype(np.uint64).reshape(-1, 1)
        else:
            code = t.get_column("__code").to_numpy().astype(np.int64)
            words = _words(t, "__w")
        size = self.n_cells

        def add(col: str, weights: np.ndarray) -> None:
            out[ix[col]] += np.bincount(code, weights=weights, minlength=size)

        add("n", n)
        k0 = _bit(words, 0)
        for i in range(n_g):
            ki = _bit(words, i)
            add(f"kept{i}", n * ki)
            if i > 0:
                add(f"both{i}", n * (ki & k0))
        for j, i in enumerate(self.tis):
            add(f"trunc{i}", n * _bit(words, n_g + j))
            out[ix[f"rmass{i}"]] = self.tis_sums[j, 0]
            out[ix[f"rsum{i}"]] = self.tis_sums[j, 1]
        st = self.steps.result(pl.DataFrame(schema={"step": pl.Int64, "__w0": pl.UInt64,
                                                    "n": pl.Int64}))
        sw = _words(st, "__w")
        sn = st.get_column("n").to_numpy().astype(np.int64)
        steps = st.select("step").with_columns(
            pl.Series("n", sn),
            *[pl.Series(f"kept{i}", sn * _bit(sw, i)) for i in range(n_g)],
        )
        return cols, out, steps


def _check_law(*, h_star: Any, law_k: Any, law_alpha: Any, flag_tau: Any, flag_eps: Any,
               no_fit: Any) -> None:
    """TypeError / ParameterError for the law parameters of :func:`compare_gates`."""
    if no_fit is not None and not isinstance(no_fit, str):
        raise TypeError("compare_gates: expected no_fit as a str (why no law was fitted) "
                        f"or None, got {given(no_fit)}.")
    for param, value, optional in (("h_star", h_star, True), ("law_k", law_k, True),
                                   ("law_alpha", law_alpha, False),
                                   ("flag_tau", flag_tau, False),
                                   ("flag_eps", flag_eps, False)):
        number(value, "compare_gates", param, optional=optional)
    if h_star is not None and not (math.isfinite(h_star) and h_star > 0):
        raise ParameterError(
            f"h_star must be a positive entropy in nats or None (got {h_star})."
        )
    if law_k is not None and not (math.isfinite(law_k) and law_k > 0):
        raise ParameterError(f"law_k must be positive or None (got {law_k}).")
    if no_fit is not None and (h_star is not None or law_k is not None):
        raise ParameterError(
            "compare_gates: no_fit (why no law was fitted) given with h_star or law_k."
        )
    if not math.isfinite(law_alpha):
        raise ParameterError(f"law_alpha must be finite (got {law_alpha}).")
    if not (math.isfinite(flag_tau) and flag_tau > 0 and math.isfinite(flag_eps)
            and flag_eps >= 0):
        raise ParameterError("flag_tau must be > 0 and flag_eps >= 0.")


class ComparePlan:
    """:func:`compare_gates` as accumulators: two streaming passes over the token frame.

    Pass 1 (:attr:`accumulators`, reads ``seq_key``, ``delta``, ``entropy``):
    token count, entropy range and null count, ENTR's kept count, histograms of ``|delta|``
    and ``delta^2`` on bins of 0.2% relative width, and one row of mergeable partials per
    sequence (which token gates keep some / every token, the sequence gates' partial
    statistics, min / max ``|delta|``; memory O(sequences)). It does not depend on the
    law, the noise flag or the entropy bins (:meth:`set_law`): the CLI runs it in the fit's
    pass and sets the fitted law after.

    Pass 2 (:meth:`followup`; :meth:`finish` runs it when the caller has not): both sweeps
    (token counts by sweep index and category), keep counts of every gate by (entropy
    bin, p bin, staleness bucket, category) and by step, with the
    sequence gates' decisions (from the merged per-sequence table) joined on ``seq_key``,
    and, for the matched band and each M2PO gate, the tokens of the one histogram bin
    holding the threshold, grouped by exact value (at most ``_BOUNDARY_ROWS`` rows).

    Why a second pass: the entropy bin edges (default: from the data's entropy range), the
    matched band's ``c`` (an order statistic of ``|delta|`` at the rank ENTR's drop count
    sets), the M2PO cuts and the sequence gates' decisions are all results of pass 1, and
    the per-bin counts of those gates depend on them token by token; any single-pass
    resolution of them would be approximate. The thresholds themselves are exact: pass 1
    brackets each in one histogram bin and pass 2 lists that bin's values. Only when that
    bin holds more than ``_BOUNDARY_ROWS`` tokens do refinement scans over ``delta`` run
    between the passes.
    """

    def __init__(
        self,
        lf: pl.LazyFrame,
        *,
        entr: EntrGate | None = None,
        panel: Sequence[GateSpec] = DEFAULT_PANEL,
        h_star: float | None = None,
        law_k: float | None = None,
        law_alpha: float = 1.0,
        flag_tau: float = 4.0,
        flag_eps: float = 0.01,
        entropy_edges: np.ndarray | Sequence[float] | None = None,
        p_edges: Sequence[float] = DEFAULT_P_EDGES,
        sweep_tau: np.ndarray | Sequence[float] | None = None,
        sweep_c: np.ndarray | Sequence[float] | None = None,
        no_fit: str | None = None,
        staleness_unit: int = 1,
        no_entropy: str | None = None,
        unscored: pl.LazyFrame | None = None,
    ) -> None:
        entr = entr if entr is not None else EntrGate()
        if unscored is not None and not isinstance(unscored, pl.LazyFrame | pl.DataFrame):
            raise TypeError("compare_gates: expected unscored as a polars LazyFrame (columns "
                            f"seq_key, delta) or None, got {given(unscored)}.")
        #: tokens left out of the analysis whose log-ratio is valid (an invalid entropy):
        #: they enter the sequence gates' statistics only (:meth:`_merge_unscored`)
        self.unscored = None if unscored is None else unscored.lazy()
        #: how many of them did (sequences holding analysed tokens); None: none given
        self.unscored_tokens: int | None = None
        if no_entropy is not None and not isinstance(no_entropy, str):
            raise TypeError("compare_gates: expected no_entropy as a str (why the frame has "
                            f"no entropy column) or None, got {given(no_entropy)}.")
        #: why the frame has no entropy column, in the caller's words (None: it has none)
        self.no_entropy = no_entropy or "the token frame has no entropy column"
        if (isinstance(staleness_unit, bool) or not isinstance(staleness_unit, numbers.Integral)
                or staleness_unit < 1):
            raise ParameterError("compare_gates: staleness_unit must be an integer >= 1, got "
                                 f"{staleness_unit!r}.")
        #: the staleness buckets count lags of this many versions (labels in versions)
        self.staleness_unit = int(staleness_unit)
        if not isinstance(entr, EntrGate):
            raise TypeError("compare_gates: expected entr as an EntrGate (e.g. EntrGate(tau=4) "
                            f"or parse_gate_spec('entr:tau=4')), got {given(entr)}.")
        if (isinstance(panel, str | bytes | GateSpec | Mapping)
                or not hasattr(panel, "__iter__")):
            # (a str would be iterated character by character)
            got = (f"one gate spec, {panel!r}; wrap it in a list: panel=[gate]"
                   if isinstance(panel, GateSpec) else given(panel))
            raise TypeError("compare_gates: expected panel as a sequence of gate specs (e.g. "
                            f"[parse_gate_spec('fixed')] or DEFAULT_PANEL), got {got}.")
        panel = tuple(panel)
        for g in panel:
            if not isinstance(g, GateSpec):
                raise TypeError(f"compare_gates: expected panel entries as gate specs (e.g. "
                                f"parse_gate_spec('fixed')), got {given(g)}.")
        law = {"h_star": h_star, "law_k": law_k, "law_alpha": law_alpha, "flag_tau": flag_tau,
               "flag_eps": flag_eps, "no_fit": no_fit}
        _check_law(**law)
        self.taus = _check_sweep(
            DEFAULT_SWEEP_TAU if sweep_tau is None else sweep_tau, "sweep_tau", True
        )
        self.cs = _check_sweep(DEFAULT_SWEEP_C if sweep_c is None else sweep_c, "sweep_c", False)
        self.p_e = _check_edges(p_edges, "p_edges")
        self.entr, self.panel = entr, panel
        self.gates: tuple[GateSpec, ...] = (entr, *panel)
        schema = lf.collect_schema()
        #: without entropy, ENTR (and what depends on it) is unavailable; the panel is not
        self.has_entropy = "entropy" in schema
        _check_columns(schema, self.gates if self.has_entropy else panel)
        if "infer_logprob" not in schema:
            raise SchemaError(
                "compare needs the 'infer_logprob' column of the token frame; map it when "
                "loading."
            )
        self.unavailable: tuple[UnavailableGate, ...] = ()
        if not self.has_entropy:
            if not panel:
                raise ParameterError(
                    "compare_gates: the token frame has no entropy column, so ENTR cannot be "
                    "simulated, and the panel is empty: no gate to compare."
                )
            self.unavailable = (UnavailableGate(
                name=entr.name, spec=entr.spec(), label=entr.label,
                reason=f"{self.no_entropy}, and ENTR's score "
                "delta^2/(H+eps) needs the entropy H (so do the matched band, the agreement "
                "with ENTR, the tau sweep and the keep rate by entropy bin)",
            ),)
        #: ENTR's keep decision and score (without entropy, stand-ins that keep every token:
        #: the passes run unchanged and ENTR's numbers are left out of the result)
        self.entr_keep = entr.keep_expr() if self.has_entropy else pl.lit(True)
        self.entr_score = (entr_score_expr(entr.eps) if self.has_entropy
                           else pl.lit(0.0, dtype=pl.Float64))
        self.lf, self.schema = lf, schema
        self.has_step = "step" in schema
        self.has_stale = "staleness" in schema
        self.step_expr = (pl.col("step") if self.has_step
                          else pl.lit(0, dtype=pl.Int64)).alias("step")
        # gates: the compared ones, then the matched band (its c is known after pass 1)
        self.all_gates: tuple[GateSpec, ...] = (*self.gates, FixedBand())
        self.matched_idx = len(self.gates)
        #: token gates whose per-sequence kept counts pass 1 sums (ENTR always first)
        self.seq_count_idx = [
            i for i, g in enumerate(self.gates)
            if not isinstance(g, (SequenceGate, M2PO, TIS))
        ]
        self.partials: dict[str, tuple[pl.Expr, str]] = {}
        for g in self.gates:
            if isinstance(g, SequenceGate):
                self.partials.update(g.seq_partials())
        self._first = _FirstPass(self)
        self.accumulators: list[Any] = [self._first]
        self._second: _SecondPass | None = None
        self._cuts: list[_Cut] = []
        self._per_seq: pl.DataFrame | None = None
        self.set_law(**law, entropy_edges=entropy_edges)

    def _merge_unscored(self, per_seq: pl.DataFrame) -> pl.DataFrame:
        """``per_seq`` (pass 1's per-sequence partials) with the sequence gates' partials of
        :attr:`unscored` merged in (sum and count partials added, minima and maxima
        taken), for the sequences that hold analysed tokens: verl's and slime's sequence
        ratios, geometric means, k3 means and veto read every loss-masked token's
        log-ratio, not its entropy. ``n_tokens`` (sequence TIS: the analysed tokens its
        weight applies to) is left as it is; :attr:`unscored_tokens` counts the rows
        merged."""
        aggs = [getattr(e, how)().alias(f"__u_{name}")
                for name, (e, how) in self.partials.items() if name not in _ANALYSED_COUNTS]
        side = (self.unscored.select("seq_key", "delta")  # type: ignore[union-attr]
                .group_by("seq_key").agg(pl.len().alias("__u_n"), *aggs)
                .join(per_seq.lazy().select("seq_key"), on="seq_key", how="semi")
                .collect(engine="streaming"))
        self.unscored_tokens = int(side["__u_n"].sum()) if side.height else 0
        if not side.height:
            return per_seq
        merged = []
        for name, (_e, how) in self.partials.items():
            if name in _ANALYSED_COUNTS:
                continue
            a, u = pl.col(f"__p_{name}"), pl.col(f"__u_{name}")
            merged.append((a + u.fill_null(0) if how in ("sum", "count")
                           else pl.min_horizontal(a, u) if how == "min"
                           else pl.max_horizontal(a, u)).alias(f"__p_{name}"))
        return (per_seq.join(side, on="seq_key", how="left").with_columns(merged)
                .drop(side.columns[1:]))

    def _h(self, h: float) -> str:
        """An entropy with its unit: ``0.034 nats``, or ``0.048 in the entropy column's
        unit (probably bits)`` (:attr:`entropy_unit`)."""
        if self.entropy_unit is None:
            return f"{h:.4g} nats"
        return f"{h:.4g} in the entropy column's unit (probably {self.entropy_unit})"

    def set_law(
        self,
        *,
        h_star: float | None = None,
        law_k: float | None = None,
        law_alpha: float = 1.0,
        flag_tau: float = 4.0,
        flag_eps: float = 0.01,
        entropy_edges: np.ndarray | Sequence[float] | None = None,
        no_fit: str | None = None,
        entropy_unit: str | None = None,
    ) -> None:
        """Set (replace) the scaling law, the noise-token flag and the entropy bin edges:
        the parameters of :func:`compare_gates` that only the second pass uses. The first
        pass (:attr:`accumulators`) depends on none of them, so it can run before the law
        is fitted, e.g. in the same pass as the fit; call this between the passes, before
        :meth:`followup` (ParameterError after it). Same checks and errors as the
        constructor's. ``entropy_unit``: the entropy column's unit when the fit's units
        check reads it as another than nats (``"bits"``, ``"log10 units"``:
        :func:`~entr_diag.caveats.entropy_unit`); the entropies are then as the column
        reads, and the result's ``parameters["entropy_unit"]`` and definitions say so
        (default: nats)."""
        if self._second is not None:
            raise ParameterError("compare_gates: set_law after the second pass was built "
                                 "(followup): its token categories are fixed.")
        _check_law(h_star=h_star, law_k=law_k, law_alpha=law_alpha, flag_tau=flag_tau,
                   flag_eps=flag_eps, no_fit=no_fit)
        e_edges = None if entropy_edges is None else _check_edges(entropy_edges,
                                                                  "entropy_edges")
        if not self.has_entropy:
            named = [n for n, v in (("h_star", h_star), ("law_k", law_k),
                                    ("entropy_edges", entropy_edges)) if v is not None]
            if named:
                raise ParameterError(
                    f"compare_gates: {', '.join(named)} given, but the token frame has no "
                    "entropy column: they are entropies or a law of the entropy."
                )
        if entropy_unit is not None and entropy_unit not in ("bits", "log10 units"):
            raise ParameterError("compare_gates: entropy_unit must be None, 'bits' or "
                                 f"'log10 units', got {entropy_unit!r}.")
        self.entropy_unit = entropy_unit
        self.e_edges = e_edges
        self.h_star, self.law_k, self.law_alpha = h_star, law_k, law_alpha
        self.flag_tau, self.flag_eps = flag_tau, flag_eps

        # token categories (noise / law-scale / other), used by the second pass
        H = pl.col("entropy")
        d2 = pl.col("delta") ** 2
        self.null_reasons: dict[str, str] = {}
        #: why no law was fitted, in the caller's words (None: not given, or no entropy)
        self.no_fit = f"no scaling law could be fitted ({no_fit})" if no_fit else None
        if h_star is None:
            is_noise = pl.lit(False)
            self.null_reasons["noise_admitted"] = (
                f"{self.no_fit}: there is no entropy breakpoint H*, so no noise to admit"
                if self.no_fit and self.has_entropy else
                "no entropy breakpoint H* (the fit found no low-entropy noise regime, or none "
                "was given): there is no noise to admit"
                if self.has_entropy else
                f"{self.no_entropy}: no low-entropy noise regime can be located"
            )
            law_region = pl.lit(True)
        else:
            is_noise = (H < h_star) & (entr_score_expr(flag_eps) > flag_tau)
            law_region = H >= h_star
        if law_k is None:
            is_law = pl.lit(False)
            self.null_reasons["exploration_discarded"] = (
                f"{self.no_fit}: the law's scale is undefined"
                if self.no_fit and self.has_entropy else
                "no fitted law (law_k not given): the law's scale is undefined"
                if self.has_entropy else
                f"{self.no_entropy}: no law of the entropy can be fitted"
            )
        else:
            is_law = law_region & (d2 <= CHI2_1_99 * law_k * H.pow(law_alpha))
        self.cat = (
            pl.when(is_noise)
            .then(pl.lit(_CAT_NOISE, dtype=pl.Int8))
            .when(is_law)
            .then(pl.lit(_CAT_LAW, dtype=pl.Int8))
            .otherwise(pl.lit(_CAT_OTHER, dtype=pl.Int8))
        )

    def keep_expr(self, i: int) -> pl.Expr:
        """The keep decision of token gate ``all_gates[i]`` (ENTR's stand-in without
        entropy)."""
        return self.entr_keep if i == 0 else self.all_gates[i].keep_expr()

    # ---------------------------------------------------------------- between the passes

    def _bracket(self, cut: _Cut, counts: np.ndarray, sums: np.ndarray | None,
                 none_value: float) -> _Cut:
        """Locate ``cut.pred``'s first true prefix in a pass-1 histogram; exact ``cut`` when
        no prefix satisfies it (``none_value``) or after refinement scans of a crowded bin."""
        assert cut.pred is not None
        nz = np.flatnonzero(counts)
        cn = np.cumsum(counts[nz])
        cs = np.cumsum(sums[nz]) if sums is not None else np.zeros(nz.size)
        ok = np.asarray(cut.pred(cn, cs), dtype=bool) if nz.size else np.zeros(0, bool)
        if not ok.any():
            cut.cut = none_value
            return cut
        j = int(np.argmax(ok))
        b = int(nz[j])
        cut.lo, cut.hi = _bin_bounds(b)
        cut.n_below = int(cn[j - 1]) if j else 0
        cut.s_below = float(cs[j - 1]) if j else 0.0
        n_in = int(counts[b])
        if n_in > _BOUNDARY_ROWS:
            x = pl.col("x")
            src = self.lf.select(_cut_value(cut.kind).alias("x")).filter(
                x.is_not_null() & x.is_not_nan()
            )
            cut.cut = _refine(src, cut.pred, cut.lo, cut.hi, cut.n_below, cut.s_below, n_in)
        return cut

    def followup(self) -> list[Any]:
        """The accumulators of the second pass, built from the first pass's results (call
        after the first pass has been fed). Raises InputError when the first pass saw no
        token or a null/NaN entropy."""
        if self._second is not None:
            return [self._second]
        f = self._first
        if f.n == 0:
            raise InputError("compare: the token frame holds no valid loss-masked token.")
        if f.h_null:  # (counted only when the frame has entropy)
            raise InputError(
                f"compare: {f.h_null} token(s) have a null/NaN entropy; ENTR needs an entropy "
                "for every token (exclude them when loading)."
            )
        if self.e_edges is None:
            self.e_edges = default_entropy_edges(f.h_min_pos, f.h_max)
        n_keep = f.entr_kept
        m = _Cut(self.matched_idx, "absd", strict=False)
        if not self.has_entropy:  # no ENTR, no matched band: a cut that keeps every token
            m.cut = math.inf
        elif n_keep <= 0:  # keeps none: the largest float below the smallest |delta|
            m.cut = (0.0 if f.a_min is None
                     else max(0.0, float(np.nextafter(f.a_min, -math.inf))))
        else:
            m.pred = lambda n, s: n >= n_keep
            self._bracket(m, f.hist_a, None, 0.0 if f.a_max is None else f.a_max)
        cuts = [m]
        for i, g in enumerate(self.gates):
            if isinstance(g, M2PO):
                c = _Cut(i, "d2", strict=True, pred=g.drops_prefix)
                cuts.append(self._bracket(c, f.hist_q, f.hist_qs, math.inf))
        self._cuts = cuts
        per_seq = f.seq.result()
        seq_idx = [i for i, g in enumerate(self.gates) if isinstance(g, SequenceGate)]
        decisions = None
        if seq_idx and self.unscored is not None:
            per_seq = self._merge_unscored(per_seq)
        elif self.unscored is not None:
            self.unscored_tokens = 0  # (no sequence gate to count them)
        if seq_idx:
            cols = {k: pl.col(f"__p_{k}") for k in self.partials}
            per_seq = per_seq.with_columns(
                [
                    self.gates[i].keep_from(  # type: ignore[attr-defined]
                        self.gates[i].stats_from_partials(cols)  # type: ignore[attr-defined]
                    ).alias(f"__s{i}")
                    for i in seq_idx
                ]
            )
            n_bits = len(self.all_gates)
            decisions = per_seq.select(
                "seq_key",
                *_pack(
                    [pl.col(f"__s{i}") if i in seq_idx else pl.lit(False)
                     for i in range(n_bits)],
                    "__sw",
                ),
            )
        self._per_seq = per_seq
        self._second = _SecondPass(self, self.e_edges, cuts, decisions)
        return [self._second]

    # ------------------------------------------------------------------------- finish

    def finish(self) -> CompareResult:
        """The :class:`CompareResult`, after the first pass; runs the second pass over the
        plan's frame unless the caller fed :meth:`followup` already."""
        sp = self.followup()[0]
        assert isinstance(sp, _SecondPass)
        if sp.rows == 0:
            run_pass(self.lf, [sp])
        return self._assemble(sp)

    def _assemble(self, sp: _SecondPass) -> CompareResult:
        f = self._first
        per_seq = self._per_seq
        assert per_seq is not None and self.e_edges is not None
        e_edges, p_e = self.e_edges, self.p_e
        h_star, law_k, law_alpha = self.h_star, self.law_k, self.law_alpha
        flag_tau, flag_eps = self.flag_tau, self.flag_eps
        null_reasons = dict(self.null_reasons)
        n_tok = f.n
        entr_dropped = n_tok - f.entr_kept
        cols, cells, steps = sp.tables()
        col_index = {c: j for j, c in enumerate(cols)}
        step_parts = [steps]

        # ---- exact thresholds; the bracketed bins' tokens added to the kept counts
        cut_values: dict[int, float] = {}
        for j, c in enumerate(sp.bracketed):
            t = (
                pl.concat(sp.bound[j]).group_by("__code", "__k0", "step", "v").agg(pl.col("n").sum())
                if sp.bound[j] else None
            )
            if t is None or t.height == 0:
                c.cut = c.hi  # unreachable: the bin held tokens in pass 1
                continue
            vals = t.group_by("v").agg(pl.col("n").sum()).sort("v")
            v = vals.get_column("v").to_numpy()
            nv = vals.get_column("n").to_numpy().astype(np.int64)
            ok = np.asarray(
                c.pred(c.n_below + np.cumsum(nv), c.s_below + np.cumsum(v * nv)),  # type: ignore[misc]
                dtype=bool,
            )
            c.cut = float(v[int(np.argmax(ok))]) if ok.any() else float(v[-1])
            kept = t.filter(c.keep(pl.col("v"), c.cut))
            if kept.height:
                by_code = kept.group_by("__code").agg(
                    pl.col("n").sum(), pl.col("n").filter(pl.col("__k0")).sum().alias("b")
                )
                codes = by_code.get_column("__code").to_numpy()
                cells[col_index[f"kept{c.gate}"], codes] += by_code.get_column("n").to_numpy()
                cells[col_index[f"both{c.gate}"], codes] += by_code.get_column("b").to_numpy()
                step_parts.append(
                    kept.group_by("step").agg(pl.col("n").sum().alias(f"kept{c.gate}"))
                )
        for c in self._cuts:
            assert c.cut is not None
            cut_values[c.gate] = c.cut
        c_match = cut_values[self.matched_idx]
        matched_gate = FixedBand(c=c_match)
        all_gates = (*self.gates, matched_gate)
        n_g = len(all_gates)

        # ---- per step (sum of the partial tables; a key missing from a part counts 0)
        stept = None
        if self.has_step:
            step_cols = ["n"] + [f"kept{i}" for i in range(n_g)]
            stept = (
                pl.concat(step_parts, how="diagonal_relaxed")
                .group_by("step")
                .agg([pl.col(c).fill_null(0).sum() for c in step_cols])
                .sort("step", nulls_last=True)
            )

        # ---- per sequence: kept (any token kept) and intact (all kept) sequences
        n_seq = per_seq.height
        cut_of = {c.gate: c for c in self._cuts}
        bad = f.invalid.result(pl.DataFrame(schema={"seq_key": pl.UInt64, "__bad": pl.UInt32}))
        if bad.height:
            per_seq = per_seq.join(bad, on="seq_key", how="left")
            valid = pl.col("__bad").is_null()
        else:
            valid = pl.lit(True)
        word_of = {i: j for j, i in enumerate(self.seq_count_idx)}
        seq_any: list[pl.Expr] = []
        seq_all: list[pl.Expr] = []
        for i, g in enumerate(all_gates):
            if i in cut_of:
                c = cut_of[i]
                lo_v, hi_v = pl.col("__amin"), pl.col("__amax")
                if c.kind == "d2":
                    lo_v, hi_v = lo_v * lo_v, hi_v * hi_v
                a_ = c.keep(lo_v, cut_values[i])
                l_ = c.keep(hi_v, cut_values[i]) & valid
            elif isinstance(g, SequenceGate):
                a_ = l_ = pl.col(f"__s{i}")
            elif isinstance(g, TIS):
                a_ = l_ = pl.col("seq_key").is_not_null() | pl.col("seq_key").is_null()
            else:
                j = word_of[i]
                m = pl.lit(1 << (j % _WORD), dtype=pl.UInt64)
                a_ = (pl.col(f"__or{j // _WORD}") & m) != 0
                l_ = (pl.col(f"__and{j // _WORD}") & m) != 0
            seq_any.append(a_.fill_null(False).sum().alias(f"any{i}"))
            seq_all.append(l_.fill_null(False).sum().alias(f"all{i}"))
        seqt = per_seq.select(seq_any + seq_all).row(0, named=True)

        # ---- marginals of the cell table
        n_eb, n_pb = sp.n_eb, sp.n_pb
        grid = cells.reshape(len(cols), n_eb, n_pb, _N_SB, 3)

        def marg(col: str, axis: int) -> np.ndarray:
            axes = tuple(a for a in (1, 2, 3, 4) if a != axis)
            return np.rint(grid[col_index[col]].sum(axis=tuple(a - 1 for a in axes)))

        def cnt(col: str, axis: int) -> np.ndarray:
            return marg(col, axis).astype(np.int64)

        def total(col: str) -> float:
            return float(cells[col_index[col]].sum())

        def joint(col: str) -> np.ndarray:
            """Counts per (entropy bin, p bin), ``(n_eb, n_pb)``."""
            return np.rint(grid[col_index[col]].sum(axis=(2, 3)))

        n_by_cat = cnt("n", 4)
        n_noise = None if h_star is None else int(n_by_cat[_CAT_NOISE])
        n_law = None if law_k is None else int(n_by_cat[_CAT_LAW])
        if n_noise == 0:
            null_reasons["noise_admitted"] = (
                "no token is in the noise regime (none flagged below H*)"
            )
        if n_law == 0:
            null_reasons["exploration_discarded"] = "no token lies within the fitted law's scale"
        e_labels = _bin_labels(e_edges)
        p_labels = _bin_labels(p_e)

        def mode(counts: np.ndarray) -> tuple[str, str] | None:
            """The (entropy bin, p bin) labels of the cell holding the most tokens."""
            if not counts.size or counts.max() <= 0:
                return None
            e, p_ = np.unravel_index(int(np.argmax(counts)), counts.shape)
            return e_labels[int(e)], p_labels[int(p_)]
        n_by_e = cnt("n", 1)
        n_by_p = cnt("n", 2)
        n_by_s = cnt("n", 3)[: len(STALENESS_BUCKETS)] if self.has_stale else None
        kept0_e = cnt("kept0", 1)
        kept0_p = cnt("kept0", 2)
        kept_all = [int(cnt(f"kept{i}", 1).sum()) for i in range(n_g)]

        def gate_result(i: int) -> GateResult:
            g = all_gates[i]
            kc = f"kept{i}"
            kept_e = cnt(kc, 1)
            stale = None
            if self.has_stale:
                assert n_by_s is not None
                ks = cnt(kc, 3)
                idx = [j for j in range(len(STALENESS_BUCKETS)) if n_by_s[j] > 0 or j > 0]
                labels = staleness_labels([b[0] for b in STALENESS_BUCKETS],
                                          self.staleness_unit)
                stale = BinnedKeep(
                    keys=tuple(labels[j] for j in idx),
                    n=tuple(int(n_by_s[j]) for j in idx),
                    kept=tuple(int(ks[j]) for j in idx),
                )
            step_b = None
            if stept is not None:
                step_b = BinnedKeep(
                    keys=tuple(int(s) if s is not None else None for s in stept["step"]),
                    n=tuple(int(v) for v in stept["n"]),
                    kept=tuple(int(v) for v in stept[kc]),
                )
            kc_cat = cnt(kc, 4)
            noise_kept = noise_adm = None
            if n_noise:
                noise_kept = int(kc_cat[_CAT_NOISE])
                noise_adm = noise_kept / n_noise
            expl_drop = expl_dis = None
            if n_law:
                expl_drop = n_law - int(kc_cat[_CAT_LAW])
                expl_dis = expl_drop / n_law
            agreement = None
            if i > 0 and self.has_entropy:
                bc = f"both{i}"
                both = int(cnt(bc, 1).sum())

                def four(axis: int, nb: np.ndarray, k0b: np.ndarray) -> dict[str, Any]:
                    kb = cnt(kc, axis)
                    bb = cnt(bc, axis)
                    return {
                        "both_keep": bb.tolist(),
                        "only_entr_keeps": (k0b - bb).tolist(),
                        "only_other_keeps": (kb - bb).tolist(),
                        "both_drop": (nb - k0b - kb + bb).tolist(),
                    }

                agreement = Agreement(
                    both_keep=both,
                    only_entr_keeps=kept_all[0] - both,
                    only_other_keeps=kept_all[i] - both,
                    both_drop=n_tok - kept_all[0] - kept_all[i] + both,
                    by_entropy={
                        "keys": list(e_labels),
                        "edges": e_edges.tolist(),
                        **four(1, n_by_e, kept0_e),
                    },
                    by_p={
                        "keys": list(p_labels),
                        "edges": p_e.tolist(),
                        **four(2, n_by_p, kept0_p),
                    },
                    where_only_entr_keeps=mode(joint("kept0") - joint(bc)),
                    where_only_other_keeps=mode(joint(kc) - joint(bc)),
                )
            tis = None
            if isinstance(g, SeqTIS):
                tis = _seq_tis_extras(g, per_seq, n_tok)
            if isinstance(g, TIS):
                tr = int(round(total(f"trunc{i}")))
                tis = TisExtras(
                    cap=g.cap,
                    truncated_tokens=tr,
                    truncated_share=tr / n_tok,
                    weight_mass_removed=_ratio(total(f"rmass{i}"), total(f"rsum{i}")),
                )
            return GateResult(
                name=g.name,
                spec=g.spec(),
                label=g.label,
                level=g.level,
                params=g.params(),
                source=g.source,
                n_tokens=n_tok,
                kept_tokens=kept_all[i],
                n_sequences=n_seq,
                kept_sequences=int(seqt[f"any{i}"]),
                intact_sequences=int(seqt[f"all{i}"]),
                keep_by_entropy=BinnedKeep(
                    keys=e_labels,
                    n=tuple(n_by_e.tolist()),
                    kept=tuple(kept_e.tolist()),
                    edges=tuple(e_edges.tolist()),
                ) if self.has_entropy else None,
                keep_by_staleness=stale,
                keep_by_step=step_b,
                noise_tokens_kept=noise_kept,
                noise_admitted=noise_adm,
                exploration_tokens_dropped=expl_drop,
                exploration_discarded=expl_dis,
                agreement_vs_entr=agreement,
                tis=tis,
            )

        # without entropy: the panel only (ENTR and the matched band ran as stand-ins)
        results = [gate_result(i) for i in range(0 if self.has_entropy else 1,
                                                 n_g if self.has_entropy else n_g - 1)]
        matched = None
        if self.has_entropy:
            matched_res = results.pop()
            matched = MatchedComparison(
                c=c_match,
                entr_dropped=entr_dropped,
                fixed_dropped=matched_res.dropped_tokens,
                fixed=matched_res,
            )

        def sweep(counts: np.ndarray, values: np.ndarray, param: str, gate: str):
            m = len(values)
            cum = np.cumsum(counts.reshape(m + 1, 3), axis=0)[:m]  # kept at value j: idx <= j
            kept = cum.sum(axis=1)
            na = cum[:, _CAT_NOISE] / n_noise if n_noise else np.full(m, math.nan)
            ed = 1.0 - cum[:, _CAT_LAW] / n_law if n_law else np.full(m, math.nan)
            return SweepResult(
                parameter=param,
                gate=gate,
                values=tuple(values.tolist()),
                keep_rate=tuple((kept / n_tok).tolist()),
                noise_admitted=tuple(np.asarray(na, dtype=float).tolist()),
                exploration_discarded=tuple(np.asarray(ed, dtype=float).tolist()),
            )

        entr = self.entr
        sweeps: dict[str, SweepResult] = {}
        if self.taus.size and self.has_entropy:
            sweeps["tau"] = sweep(sp.tau_counts, self.taus, "tau", f"entr:eps={entr.eps:g}")
        if self.cs.size:
            sweeps["c"] = sweep(sp.c_counts, self.cs, "c", "fixed")

        definitions = {
            "noise_token": (
                f"a token below the entropy breakpoint (H < H* = {self._h(h_star)}) whose "
                "log-ratio breaks "
                f"the entropy-normalized bound: delta^2 / (H + {flag_eps:g}) > {flag_tau:g}"
                if h_star is not None
                else f"undefined: {self.no_fit}" if self.no_fit and self.has_entropy
                else ("undefined: no entropy breakpoint H* (the fit found no low-entropy "
                      "noise regime, or none was given)") if self.has_entropy
                else "undefined: no entropy column"
            ),
            "noise_admitted": (
                "share of the noise tokens that the gate keeps (lower is better); the noise "
                "tokens being those the ENTR rule at this tau and eps drops below H*, ENTR "
                "itself keeps none of them by definition: the column compares the other gates"
            ),
            "kept_sequence_share": (
                "share of the sequences the gate keeps: whole, for a sequence gate; with at "
                "least one token kept, for a token gate (intact_sequences: with every token "
                "kept)"
            ),
            "law_scale_token": (
                "a token at or above H* (every token when there is no breakpoint) whose "
                "log-ratio is within the fitted law's 99% range: delta^2 <= "
                f"{CHI2_1_99:.4g} * k * H^alpha (k = {law_k:.4g}, alpha = {law_alpha:.4g}; "
                f"{CHI2_1_99:.4g} = 99% quantile of chi2 with 1 dof)"
                if law_k is not None
                else f"undefined: {self.no_fit}" if self.no_fit and self.has_entropy
                else "undefined: no fitted law (law_k) was given" if self.has_entropy
                else "undefined: no entropy column"
            ),
            "exploration_discarded": (
                "share of the law-scale tokens that the gate drops (lower is better): ordinary "
                "high-entropy exploration that the mismatch law explains"
            ),
            "matched": (
                "the fixed band |delta| <= c with c the (N - D)-th smallest |delta|, D = "
                "tokens ENTR drops: it drops exactly D tokens unless |delta| ties at c (then "
                "fewer)"
            ),
            "agreement": (
                "token counts: both keep / only ENTR keeps / only the other gate keeps / both "
                "drop"
            ),
            "tis": (
                "TIS keeps every token; truncated share = share with r > cap, weight mass "
                "removed = sum max(r - cap, 0) / sum r"
            ),
        }
        parameters = {
            "entr": entr.spec(),
            "tau": entr.tau,
            "eps": entr.eps,
            "panel": [g.spec() for g in self.panel],
            "h_star": h_star,
            "law_k": law_k,
            "law_alpha": law_alpha,
            "flag_tau": flag_tau,
            "flag_eps": flag_eps,
            "entropy_unit": self.entropy_unit or "nats",
            "staleness_unit": self.staleness_unit,
            "unscored_tokens_in_sequence_gates": self.unscored_tokens,
            "law_scale_quantile": 0.99,
            "law_scale_factor": CHI2_1_99,
            "m2po_cuts": {
                all_gates[i].spec(): v for i, v in cut_values.items() if i != self.matched_idx
            },
        }
        return CompareResult(
            parameters=parameters,
            n_tokens=n_tok,
            n_sequences=n_seq,
            n_noise=n_noise,
            n_exploration=n_law,
            entropy_edges=tuple(e_edges.tolist()) if self.has_entropy else (),
            p_edges=tuple(p_e.tolist()),
            gates=tuple(results),
            matched=matched,
            sweep=sweeps,
            definitions=definitions,
            null_reasons=null_reasons,
            unavailable=self.unavailable,
            gate_specs=self.gates if self.has_entropy else self.panel,
            matched_spec=matched_gate if self.has_entropy else None,
        )


def compare_plan(lf: pl.LazyFrame, **kwargs: Any) -> ComparePlan:
    """The accumulators of :func:`compare_gates`, which takes the same arguments; errors of
    the parameters and of the schema (ParameterError, SchemaError) are raised here, before
    any pass. Usage: ``plan = compare_plan(lf, ...); run_pass(lf, plan.accumulators);
    result = plan.finish()``; ``finish`` runs the second pass (see :class:`ComparePlan`)
    itself unless ``run_pass(lf, plan.followup())`` was called first, e.g. fused with other
    modules' second passes."""
    lf = token_frame(lf, "compare_plan")
    return ComparePlan(lf, **kwargs)


def compare_gates(
    lf: pl.LazyFrame,
    *,
    entr: EntrGate | None = None,
    panel: Sequence[GateSpec] = DEFAULT_PANEL,
    h_star: float | None = None,
    law_k: float | None = None,
    law_alpha: float = 1.0,
    flag_tau: float = 4.0,
    flag_eps: float = 0.01,
    entropy_edges: np.ndarray | Sequence[float] | None = None,
    p_edges: Sequence[float] = DEFAULT_P_EDGES,
    sweep_tau: np.ndarray | Sequence[float] | None = None,
    sweep_c: np.ndarray | Sequence[float] | None = None,
    no_fit: str | None = None,
    staleness_unit: int = 1,
    no_entropy: str | None = None,
    unscored: pl.LazyFrame | None = None,
) -> CompareResult:
    """Simulate ENTR and a panel of gates on a token frame and compare what they keep.

    Parameters
    ----------
    lf : canonical token frame (one row per valid loss-masked token; docs/CONTRACT.md) with
        ``seq_key``, ``delta``, ``infer_logprob``; ``entropy`` (without it ENTR is
        unavailable, see :class:`CompareResult`), ``step`` / ``staleness`` optional.
    entr : the ENTR gate (default ``EntrGate()``: tau 4, eps 0.01).
    panel : gates compared with ENTR (default :data:`~entr_diag.gates.DEFAULT_PANEL`).
    h_star : entropy breakpoint H* of the noise regime (nats), ``FitResult.breakpoint.h_star``;
        None = no noise regime (the fit found no break).
    law_k, law_alpha : fitted law ``E[delta^2 | H] = law_k * H**law_alpha``; ``law_k`` None
        disables "exploration discarded".
    flag_tau, flag_eps : the noise-token flag ``delta^2 / (H + flag_eps) > flag_tau``.
    entropy_edges : entropy bin edges (nats); default :func:`default_entropy_edges`.
    p_edges : bin edges of p = exp(infer_logprob).
    sweep_tau, sweep_c : budgets swept in one pass for ENTR (tau) and the fixed band (c,
        nats). None = :data:`DEFAULT_SWEEP_TAU` / :data:`DEFAULT_SWEEP_C`; an empty array
        disables that sweep.
    no_fit : why no law was fitted (a phrase, e.g. a FitError's message), with ``h_star``
        and ``law_k`` None: ``null_reasons`` and ``definitions`` say it instead of "not
        given".
    staleness_unit : the staleness buckets count lags of this many versions (an integer >=
        1; :func:`~entr_diag.aggregate.staleness_unit` of the staleness values, e.g. 1000
        for versions counted in 1000s); their labels stay in versions (``"2000-3000"``).
    no_entropy : why the frame has no entropy column (a phrase, e.g. "the entropy column
        ('entropy') holds no valid value for any loss-masked token", from
        ``Dataset.entropy_unused``): ENTR's unavailable reason and ``null_reasons`` say it
        instead of "the token frame has no entropy column"; ignored when it has one.
    unscored : tokens left out of ``lf`` whose log-ratio is valid but whose entropy is not
        (columns ``seq_key``, ``delta``: :meth:`entr_diag.io.load.Dataset.unscored`), or
        None. Their log-ratios enter the sequence gates' statistics (the ratio product, the
        geometric mean, the k3 mean, the veto's minimum) of the sequences holding tokens of
        ``lf``, as verl and slime count every loss-masked token; no kept count includes
        them. ``parameters["unscored_tokens_in_sequence_gates"]``: how many did (None when
        not given).

    Returns a :class:`CompareResult`. Raises SchemaError (missing column; a panel gate
    needing the missing entropy), InputError (no token, or null entropy), ParameterError
    (bad edges, sweeps or law parameters; ``h_star``, ``law_k`` or ``entropy_edges``
    without an entropy column), TypeError (``h_star``, ``law_k``, ``law_alpha``,
    ``flag_tau`` or ``flag_eps`` not a real number; an entry of ``sweep_tau``, ``sweep_c``,
    ``entropy_edges`` or ``p_edges`` not a real number, e.g. a str or a nested list;
    ``panel`` a str, a mapping, a single gate spec, not a sequence, or holding anything but
    gate specs; ``entr`` not an EntrGate; ``no_fit`` or ``no_entropy`` not a str). Two
    streaming passes (:class:`ComparePlan`).
    """
    lf = token_frame(lf, "compare_gates")
    plan = compare_plan(
        lf, entr=entr, panel=panel, h_star=h_star, law_k=law_k, law_alpha=law_alpha,
        flag_tau=flag_tau, flag_eps=flag_eps, entropy_edges=entropy_edges, p_edges=p_edges,
        sweep_tau=sweep_tau, sweep_c=sweep_c, no_fit=no_fit, staleness_unit=staleness_unit,
        no_entropy=no_entropy, unscored=unscored,
    )
    run_pass(lf, plan.accumulators)
    return plan.finish()
