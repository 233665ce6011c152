"""Gate simulator: which tokens ENTR and the gates frameworks ship would keep (issue 4).

Input is the canonical token frame (docs/CONTRACT.md): a ``pl.LazyFrame`` with one row per
valid, loss-masked token and at least ``seq_key`` (UInt64), ``delta`` (nats),
``infer_logprob`` (nats) and ``entropy`` (nats); ``step`` and ``staleness`` are used when
present. Nothing here collects the token frame: every pass is a polars ``select`` /
``group_by`` collected with ``engine="streaming"`` into a small table (bins x categories,
one row per sequence for sequence gates, one row per step).

Passes over the data for :func:`compare_gates` (each a streaming ``group_by``/``select``):

1. totals and both sweeps: counts by (number of sweep taus below the ENTR score, number of
   sweep c's below ``|delta|``, category), so every sweep value is read off cumulative
   sums of one small table;
2. a few histogram-refinement passes reading one column each: M2PO's global cut
   (:func:`resolve_m2po_cut`) and the matched fixed band's ``c``
   (:func:`matched_fixed_c`) - exact order statistics found with memory bounded by the
   histogram size (1024 bins) or 65 536 distinct values, whichever comes first;
3. one row per sequence (``group_by("seq_key", "step")``): token count, kept tokens of
   every token gate, the statistics of every sequence gate -> kept / intact sequences and
   per-step keep rates (memory O(sequences));
4. keep counts by (entropy bin, p bin, staleness bucket, category) for every gate, with
   the sequence gates' decisions joined back from the per-sequence table of pass 3.

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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

import numpy as np
import polars as pl
from scipy import stats as _stats

from entr_diag.errors import InputError, ParameterError, SchemaError
from entr_diag.gates import (
    DEFAULT_PANEL,
    M2PO,
    TIS,
    EntrGate,
    FixedBand,
    GateSpec,
    SequenceGate,
    entr_score_expr,
)

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
    "MatchedComparison",
    "SweepResult",
    "CompareResult",
    "compare_gates",
    "decisions_frame",
    "decision_column",
    "resolve_m2po_cut",
    "matched_fixed_c",
    "default_entropy_edges",
]

#: 99% quantile of chi-square with 1 degree of freedom: ``delta^2 <= CHI2_1_99 * k H^alpha``
#: holds for 99% of tokens when delta ~ Normal(0, k H^alpha).
CHI2_1_99: float = float(_stats.chi2.ppf(0.99, 1))

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
    "only_other_keeps", "both_drop"}`` with one entry per bin.
    """

    both_keep: int
    only_entr_keeps: int
    only_other_keeps: int
    both_drop: int
    by_entropy: dict[str, Any]
    by_p: dict[str, Any]

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
    (of all tokens), ``weight_mass_removed`` = ``sum max(r - cap, 0) / sum r``."""

    cap: float
    truncated_tokens: int
    truncated_share: float
    weight_mass_removed: float

    def to_dict(self) -> dict:
        return _plain(self)


@dataclass(frozen=True)
class GateResult:
    """What one gate keeps on the input.

    Counts are tokens unless named ``*_sequences``. ``kept_sequences``: sequences with at
    least one kept token; ``intact_sequences``: sequences with every token kept (equal for
    sequence gates). ``noise_admitted`` / ``exploration_discarded``: shares in [0, 1] or
    None (reason in ``CompareResult.null_reasons``). ``agreement_vs_entr`` is None for the
    ENTR gate itself. ``tis`` is set for TIS only (whose keep rate is 1 by definition).
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
    keep_by_entropy: BinnedKeep
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
            "c": self.c,
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
class CompareResult:
    """Result of :func:`compare_gates`.

    ``gates[0]`` is ENTR, then the panel in the order given. ``n_noise`` / ``n_exploration``
    are the token counts of the two categories (None when undefined); ``null_reasons``
    says why a share is None. ``sweep`` has keys ``"tau"`` (ENTR) and ``"c"`` (fixed band),
    either absent when that sweep was disabled.
    """

    parameters: dict[str, Any]
    n_tokens: int
    n_sequences: int
    n_noise: int | None
    n_exploration: int | None
    entropy_edges: tuple[float, ...]
    p_edges: tuple[float, ...]
    gates: tuple[GateResult, ...]
    matched: MatchedComparison
    sweep: dict[str, SweepResult]
    definitions: dict[str, str]
    null_reasons: dict[str, str]
    #: the gate specs behind ``gates`` (ENTR first) and the matched band; not in to_dict()
    gate_specs: tuple[GateSpec, ...] = field(default=(), repr=False, compare=False)
    matched_spec: FixedBand | None = field(default=None, repr=False, compare=False)

    @property
    def entr(self) -> GateResult:
        return self.gates[0]

    @property
    def entr_spec(self) -> EntrGate:
        """The ENTR gate spec compared (for :func:`decisions_frame`)."""
        return self.gate_specs[0]  # type: ignore[return-value]

    @property
    def panel_specs(self) -> tuple[GateSpec, ...]:
        """The panel's gate specs, in order (for :func:`decisions_frame`)."""
        return self.gate_specs[1:]

    def to_dict(self) -> dict:
        """Plain-Python dict: ``parameters``, ``n_tokens``, ``n_sequences``, ``n_noise``,
        ``n_exploration``, ``entropy_edges``, ``p_edges``, ``gates`` (list of
        :meth:`GateResult.to_dict`), ``matched``, ``sweep`` (``{"tau": {...}, "c": {...}}``),
        ``definitions``, ``null_reasons``. NaN may appear (JSON writers turn it to null)."""
        return {
            "parameters": _plain(self.parameters),
            "n_tokens": self.n_tokens,
            "n_sequences": self.n_sequences,
            "n_noise": self.n_noise,
            "n_exploration": self.n_exploration,
            "entropy_edges": list(self.entropy_edges),
            "p_edges": list(self.p_edges),
            "gates": [g.to_dict() for g in self.gates],
            "matched": self.matched.to_dict(),
            "sweep": {k: v.to_dict() for k, v in self.sweep.items()},
            "definitions": dict(self.definitions),
            "null_reasons": dict(self.null_reasons),
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
    non-NaN values of ``x`` when already known (:func:`_value_totals` in another pass):
    saves the first scan.
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
    lo, hi = float(tot["lo"]), float(tot["hi"])
    n_below, s_below, n_in = 0, 0.0, n_all
    for _ in range(200):  # each pass strictly shrinks [lo, hi]; 200 is a safety stop
        if lo == hi:
            return lo
        cand = src.filter((pl.col("x") >= lo) & (pl.col("x") <= hi))
        if n_in <= small:
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


def _value_totals(x: pl.Expr, prefix: str) -> list[pl.Expr]:
    """Aggregations (any grouping) of count, sum, min and max of the non-null, non-NaN
    values of ``x``, named ``{prefix}n/s/lo/hi``; :func:`_totals_from` adds groups up."""
    v = pl.when(x.is_not_null() & x.is_not_nan()).then(x)
    return [v.count().alias(f"{prefix}n"), v.sum().alias(f"{prefix}s"),
            v.min().alias(f"{prefix}lo"), v.max().alias(f"{prefix}hi")]


def _totals_from(df: pl.DataFrame, prefix: str) -> dict[str, Any]:
    r = df.select(pl.col(f"{prefix}n").sum().alias("n"), pl.col(f"{prefix}s").sum().alias("s"),
                  pl.col(f"{prefix}lo").min().alias("lo"), pl.col(f"{prefix}hi").max().alias("hi"))
    return r.row(0, named=True)


def _m2po_value() -> pl.Expr:
    return pl.col("delta") ** 2


def resolve_m2po_cut(lf: pl.LazyFrame, gate: M2PO, *, tot: Mapping[str, Any] | None = None
                     ) -> float:
    """M2PO's global cut on a token frame: the smallest ``delta^2`` it drops (``inf``: keeps
    every token). Keep iff ``delta^2 < cut``; ties at the cut are dropped together (see
    :class:`~entr_diag.gates.M2PO`). Streaming histogram refinement, memory bounded.
    ``tot``: totals of delta^2 known from another pass (see :func:`_first_value_where`)."""
    thr = gate.max_mean_sq
    u = _first_value_where(lf, _m2po_value(), lambda n, s: s / n > thr, tot=tot)
    return math.inf if u is None else float(u)


def matched_fixed_c(lf: pl.LazyFrame, n_keep: int, *, tot: Mapping[str, Any] | None = None
                    ) -> float:
    """The ``n_keep``-th smallest ``|delta|`` (nats): ``|delta| <= c`` keeps ``n_keep``
    tokens when there is no tie at ``c``, and every tied token otherwise.

    ``n_keep <= 0`` returns the largest float below the smallest ``|delta|`` (keeps none,
    clamped at 0); ``n_keep >= N`` returns the largest ``|delta|``. ``tot``: totals of
    ``|delta|`` known from another pass (see :func:`_first_value_where`).
    """
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


def decision_column(gate: GateSpec) -> str:
    """Name of a gate's keep column in :func:`decisions_frame`: ``"keep[<spec>]"``."""
    return f"keep[{gate.spec()}]"


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


def _seq_stat_aggs(gates: Sequence[GateSpec]) -> tuple[list[pl.Expr], dict[int, pl.Expr]]:
    """Aggregations over one sequence for every sequence gate, and each gate's keep rule on
    the aggregated columns (``{gate index: expr}``, evaluated on the per-sequence table)."""
    aggs: list[pl.Expr] = []
    rules: dict[int, pl.Expr] = {}
    for i, g in enumerate(gates):
        if isinstance(g, SequenceGate):
            stats = {}
            for k, e in g.seq_aggs().items():
                col = f"__seq{i}_{k}"
                aggs.append(e.alias(col))
                stats[k] = pl.col(col)
            rules[i] = g.keep_from(stats)
    return aggs, rules


def _attach_decisions(
    lf: pl.LazyFrame, gates: Sequence[GateSpec], names: Sequence[str], keep_order: bool = False
) -> tuple[pl.LazyFrame, dict[int, float]]:
    """``lf`` with one Boolean column per gate (``names[i]``), plus resolved M2PO cuts.

    Sequence gates: their per-sequence statistics come from ONE ``group_by("seq_key")``,
    collected eagerly (one row per sequence: memory O(sequences), not O(tokens)) and joined
    back on ``seq_key``. M2PO: the cut is resolved eagerly here
    (:func:`resolve_m2po_cut`), then compared per token.
    """
    tok, cuts = _token_keep_exprs(lf, gates)
    aggs, rules = _seq_stat_aggs(gates)
    out = lf
    if rules:
        seq = (
            lf.group_by("seq_key")
            .agg(aggs)
            .select("seq_key", *[r.alias(names[i]) for i, r in rules.items()])
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


def decisions_frame(lf: pl.LazyFrame, gates: Sequence[GateSpec]) -> pl.LazyFrame:
    """Per-token keep/drop of each gate, with the keys to join back (for ``--export``).

    Returns a LazyFrame, one row per input token: ``seq_id``, ``seq_key``, ``position``,
    ``step`` (if present), in input row order, then one Boolean column per gate named
    :func:`decision_column` (``"keep[entr:tau=4,eps=0.01]"``; True = kept), and for TIS
    also ``"weight[<spec>]"`` = ``min(r, cap)``. Duplicate specs get one column. M2PO cuts
    are resolved eagerly (a few streaming passes over ``delta``); everything else stays lazy,
    so the caller can ``sink_parquet`` it.
    """
    schema = lf.collect_schema()
    _check_columns(schema, gates)
    uniq: list[GateSpec] = []
    seen: set[str] = set()
    for g in gates:
        if g.spec() not in seen:
            seen.add(g.spec())
            uniq.append(g)
    names = [decision_column(g) for g in uniq]
    out, _ = _attach_decisions(lf, uniq, names, keep_order=True)
    keys = [c for c in ("seq_id", "seq_key", "position", "step") if c in schema]
    extra = [g.weight_expr().alias(f"weight[{g.spec()}]") for g in uniq if isinstance(g, TIS)]
    return out.select([*keys, *names, *extra])


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


def _bin_index(expr: pl.Expr, edges: Sequence[float]) -> pl.Expr:
    """0-based bin of ``expr`` for bins ``[e_i, e_{i+1})``; below e_0 -> 0, above -> last."""
    inner = list(edges[1:-1])
    if not inner:
        return pl.lit(0, dtype=pl.Int32)
    return pl.sum_horizontal([(expr >= float(e)).cast(pl.Int32) for e in inner]).cast(pl.Int32)


def _count_above(expr: pl.Expr, values: Sequence[float]) -> pl.Expr:
    """Number of sweep values strictly below ``expr`` (so kept at value j iff result <= j)."""
    if len(values) == 0:
        return pl.lit(0, dtype=pl.Int32)
    return pl.sum_horizontal([(expr > float(v)).cast(pl.Int32) for v in values]).cast(pl.Int32)


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
    e = np.asarray(edges, dtype=float).ravel()
    if e.size < 2 or not np.all(np.isfinite(e)) or np.any(np.diff(e) <= 0):
        raise ParameterError(
            f"{what} must be at least two finite, strictly increasing values (got {e.tolist()})."
        )
    return e


def _check_sweep(values: Any, what: str, positive: bool) -> np.ndarray:
    v = np.asarray(values, dtype=float).ravel()
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
) -> CompareResult:
    """Simulate ENTR and a panel of gates on a token frame and compare what they keep.

    Parameters
    ----------
    lf : canonical token frame (one row per valid loss-masked token; docs/CONTRACT.md) with
        ``seq_key``, ``delta``, ``infer_logprob``, ``entropy``; ``step`` / ``staleness``
        optional.
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

    Returns a :class:`CompareResult`. Raises SchemaError (missing column), InputError (no
    token, or null entropy), ParameterError (bad edges, sweeps or law parameters).
    """
    entr = entr if entr is not None else EntrGate()
    if not isinstance(entr, EntrGate):
        raise ParameterError("compare_gates: `entr` must be an EntrGate (entr:tau=...,eps=...).")
    panel = tuple(panel)
    for g in panel:
        if not isinstance(g, GateSpec):
            raise ParameterError(f"compare_gates: panel entry {g!r} is not a gate spec.")
    if h_star is not None and not (math.isfinite(h_star) and h_star > 0):
        raise ParameterError(f"h_star must be a positive entropy in nats or None (got {h_star}).")
    if law_k is not None and not (math.isfinite(law_k) and law_k > 0):
        raise ParameterError(f"law_k must be positive or None (got {law_k}).")
    if not math.isfinite(law_alpha):
        raise ParameterError(f"law_alpha must be finite (got {law_alpha}).")
    if not (math.isfinite(flag_tau) and flag_tau > 0 and math.isfinite(flag_eps) and flag_eps >= 0):
        raise ParameterError("flag_tau must be > 0 and flag_eps >= 0.")
    taus = _check_sweep(DEFAULT_SWEEP_TAU if sweep_tau is None else sweep_tau, "sweep_tau", True)
    cs = _check_sweep(DEFAULT_SWEEP_C if sweep_c is None else sweep_c, "sweep_c", False)
    p_e = _check_edges(p_edges, "p_edges")

    gates: tuple[GateSpec, ...] = (entr, *panel)
    schema = lf.collect_schema()
    _check_columns(schema, (*gates,))
    for c in ("infer_logprob", "entropy"):
        if c not in schema:
            raise SchemaError(
                f"compare needs the {c!r} column of the token frame; map it when loading."
            )
    has_step = "step" in schema
    has_stale = "staleness" in schema
    lf = lf.select(
        [
            c
            for c in ("seq_key", "delta", "infer_logprob", "entropy", "step", "staleness")
            if c in schema
        ]
    )

    # ---- token categories (noise / law-scale / other), known before any pass
    H = pl.col("entropy")
    d2 = pl.col("delta") ** 2
    null_reasons: dict[str, str] = {}
    if h_star is None:
        is_noise = pl.lit(False)
        null_reasons["noise_admitted"] = (
            "no entropy breakpoint H* (the fit found no low-entropy noise regime, or none was "
            "given): there is no noise to admit"
        )
        law_region = pl.lit(True)
    else:
        is_noise = (H < h_star) & (entr_score_expr(flag_eps) > flag_tau)
        law_region = H >= h_star
    if law_k is None:
        is_law = pl.lit(False)
        null_reasons["exploration_discarded"] = (
            "no fitted law (law_k not given): the law's scale is undefined"
        )
    else:
        is_law = law_region & (d2 <= CHI2_1_99 * law_k * H.pow(law_alpha))
    cat = (
        pl.when(is_noise)
        .then(pl.lit(_CAT_NOISE, dtype=pl.Int8))
        .when(is_law)
        .then(pl.lit(_CAT_LAW, dtype=pl.Int8))
        .otherwise(pl.lit(_CAT_OTHER, dtype=pl.Int8))
    )

    # ---- pass 1: totals and both sweeps (histograms of the ENTR score and of |delta| on
    # edges placed at the sweep values, split by category)
    sweept = (
        lf.group_by(
            _count_above(entr_score_expr(entr.eps), taus).alias("__ti"),
            _count_above(pl.col("delta").abs(), cs).alias("__ci"),
            cat.alias("__cat"),
        )
        .agg(
            *_value_totals(_m2po_value(), "__m2po_"),
            *_value_totals(pl.col("delta").abs(), "__absd_"),
            n=pl.len(),
            h_null=H.null_count() + H.is_nan().sum(),
            h_max=H.max(),
            h_min_pos=pl.when(H > 0).then(H).min(),  # not filter(): stays streaming
            entr_kept=entr.keep_expr().sum(),
        )
        .collect(engine="streaming")
    )
    n_tok = int(sweept["n"].sum())
    if n_tok == 0:
        raise InputError("compare: the token frame holds no valid loss-masked token.")
    h_null = int(sweept["h_null"].sum())
    if h_null:
        raise InputError(
            f"compare: {h_null} token(s) have a null/NaN entropy; ENTR needs an entropy "
            "for every token (exclude them when loading)."
        )
    e_edges = (
        default_entropy_edges(sweept["h_min_pos"].min(), sweept["h_max"].max())
        if entropy_edges is None
        else _check_edges(entropy_edges, "entropy_edges")
    )
    entr_dropped = n_tok - int(sweept["entr_kept"].sum())
    taut = sweept.group_by("__ti", "__cat").agg(pl.col("n").sum())
    ct = sweept.group_by("__ci", "__cat").agg(pl.col("n").sum())

    # ---- pass 2: matched c and M2PO cuts (histogram refinement on one column)
    c_match = matched_fixed_c(lf, n_tok - entr_dropped, tot=_totals_from(sweept, "__absd_"))
    matched_gate = FixedBand(c=c_match)
    all_gates = (*gates, matched_gate)
    names = [f"__k{i}" for i in range(len(all_gates))]
    m2po_tot = _totals_from(sweept, "__m2po_")
    tok, _cuts = _token_keep_exprs(lf, all_gates, m2po_tot)
    seq_aggs, seq_rules = _seq_stat_aggs(all_gates)

    # ---- pass 3: one row per sequence: token count, kept tokens of each token gate, the
    # statistics of each sequence gate (memory O(sequences))
    step_key = [pl.col("step")] if has_step else [pl.lit(0, dtype=pl.Int64).alias("step")]
    per_seq = (
        lf.group_by(pl.col("seq_key"), *step_key)
        .agg(
            [pl.len().alias("__n")] + [e.sum().alias(f"__t{i}") for i, e in tok.items()] + seq_aggs
        )
        .collect(engine="streaming")
        .with_columns([r.alias(names[i]) for i, r in seq_rules.items()])
        .with_columns(
            [pl.col(f"__t{i}").alias(f"kept{i}") for i in tok]
            + [
                pl.when(pl.col(names[i])).then(pl.col("__n")).otherwise(0).alias(f"kept{i}")
                for i in seq_rules
            ]
        )
    )
    seq_step = (
        per_seq.group_by("step")
        .agg(
            [pl.len().alias("n_seq"), pl.col("__n").sum().alias("n")]
            + [pl.col(f"kept{i}").sum() for i in range(len(names))]
            + [(pl.col(f"kept{i}") > 0).sum().alias(f"any{i}") for i in range(len(names))]
            + [
                (pl.col(f"kept{i}") == pl.col("__n")).sum().alias(f"all{i}")
                for i in range(len(names))
            ]
        )
        .sort("step", nulls_last=True)
    )
    stept = seq_step if has_step else None
    seqt = seq_step.select(pl.exclude("step").sum())

    # ---- pass 4: keep counts by (entropy bin, p bin, staleness bucket, category); sequence
    # gates' decisions joined back from the per-sequence table
    df = lf
    if seq_rules:
        df = df.join(
            per_seq.select("seq_key", *[names[i] for i in seq_rules]).lazy(),
            on="seq_key",
            how="left",
        )
    df = df.with_columns([e.alias(names[i]) for i, e in tok.items()])
    if has_stale:
        s = pl.col("staleness")
        chain = None
        for j, (_lab, lo_, hi_) in enumerate(STALENESS_BUCKETS):
            cond = (s >= lo_) & (s <= hi_)
            chain = (pl.when(cond) if chain is None else chain.when(cond)).then(
                pl.lit(j, dtype=pl.Int8)
            )
        sb = chain.otherwise(pl.lit(None, dtype=pl.Int8))  # type: ignore[union-attr]
    else:
        sb = pl.lit(None, dtype=pl.Int8)
    k0 = pl.col(names[0])
    gate_aggs: list[pl.Expr] = [pl.len().alias("n")]
    for i, nm in enumerate(names):
        gate_aggs.append(pl.col(nm).sum().alias(f"kept{i}"))
        if i > 0:
            gate_aggs.append((pl.col(nm) & k0).sum().alias(f"both{i}"))
    tis_idx = [i for i, g in enumerate(all_gates) if isinstance(g, TIS)]
    for i in tis_idx:
        g = all_gates[i]
        assert isinstance(g, TIS)
        gate_aggs += [
            g.truncated_expr().sum().alias(f"trunc{i}"),
            g.removed_mass_expr().sum().alias(f"rmass{i}"),
            pl.col("delta").exp().sum().alias(f"rsum{i}"),
        ]
    main = (
        df.group_by(
            _bin_index(H, e_edges).alias("__eb"),
            _bin_index(pl.col("infer_logprob").exp(), p_e).alias("__pb"),
            sb.alias("__sb"),
            cat.alias("__cat"),
        )
        .agg(gate_aggs)
        .collect(engine="streaming")
    )

    # ---- assemble
    n_seq = int(seqt["n_seq"][0])
    n_eb, n_pb = len(e_edges) - 1, len(p_e) - 1

    def by(key: str, col: str, size: int, frame: pl.DataFrame = main) -> np.ndarray:
        g = frame.group_by(key).agg(pl.col(col).sum())
        out = np.zeros(size, dtype=np.int64)
        for k, v in g.iter_rows():
            if k is not None:
                out[int(k)] += int(v)
        return out

    def total(col: str, where: pl.Expr | None = None) -> float:
        f = main if where is None else main.filter(where)
        v = f[col].sum()
        return float(v) if v is not None else 0.0

    n_noise_i = int(total("n", pl.col("__cat") == _CAT_NOISE))
    n_law_i = int(total("n", pl.col("__cat") == _CAT_LAW))
    n_noise = None if h_star is None else n_noise_i
    n_law = None if law_k is None else n_law_i
    if n_noise == 0:
        null_reasons["noise_admitted"] = "no token is in the noise regime (none flagged below H*)"
    if n_law == 0:
        null_reasons["exploration_discarded"] = "no token lies within the fitted law's scale"
    e_labels = _bin_labels(e_edges)
    p_labels = _bin_labels(p_e)
    n_by_e = by("__eb", "n", n_eb)
    n_by_s = by("__sb", "n", len(STALENESS_BUCKETS)) if has_stale else None
    kept0_e = by("__eb", "kept0", n_eb)
    kept0_p = by("__pb", "kept0", n_pb)
    n_by_p = by("__pb", "n", n_pb)
    kept_all = [int(total(f"kept{i}")) for i in range(len(names))]

    def gate_result(i: int) -> GateResult:
        g = all_gates[i]
        kc = f"kept{i}"
        kept_e = by("__eb", kc, n_eb)
        stale = None
        if has_stale:
            assert n_by_s is not None
            ks = by("__sb", kc, len(STALENESS_BUCKETS))
            idx = [j for j in range(len(STALENESS_BUCKETS)) if n_by_s[j] > 0 or j > 0]
            stale = BinnedKeep(
                keys=tuple(STALENESS_BUCKETS[j][0] for j in idx),
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
        noise_kept = noise_adm = None
        if n_noise:
            noise_kept = int(total(kc, pl.col("__cat") == _CAT_NOISE))
            noise_adm = noise_kept / n_noise
        expl_drop = expl_dis = None
        if n_law:
            expl_drop = n_law - int(total(kc, pl.col("__cat") == _CAT_LAW))
            expl_dis = expl_drop / n_law
        agreement = None
        if i > 0:
            bc = f"both{i}"
            both = int(total(bc))

            def four(key: str, size: int, nb: np.ndarray, k0b: np.ndarray) -> dict[str, Any]:
                kb = by(key, kc, size)
                bb = by(key, bc, size)
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
                    **four("__eb", n_eb, n_by_e, kept0_e),
                },
                by_p={
                    "keys": list(p_labels),
                    "edges": p_e.tolist(),
                    **four("__pb", n_pb, n_by_p, kept0_p),
                },
            )
        tis = None
        if isinstance(g, TIS):
            tr = int(total(f"trunc{i}"))
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
            kept_sequences=int(seqt[f"any{i}"][0]),
            intact_sequences=int(seqt[f"all{i}"][0]),
            keep_by_entropy=BinnedKeep(
                keys=e_labels,
                n=tuple(n_by_e.tolist()),
                kept=tuple(kept_e.tolist()),
                edges=tuple(e_edges.tolist()),
            ),
            keep_by_staleness=stale,
            keep_by_step=step_b,
            noise_tokens_kept=noise_kept,
            noise_admitted=noise_adm,
            exploration_tokens_dropped=expl_drop,
            exploration_discarded=expl_dis,
            agreement_vs_entr=agreement,
            tis=tis,
        )

    results = [gate_result(i) for i in range(len(all_gates))]
    matched_res = results[-1]
    matched = MatchedComparison(
        c=c_match,
        entr_dropped=entr_dropped,
        fixed_dropped=matched_res.dropped_tokens,
        fixed=matched_res,
    )

    def sweep(frame: pl.DataFrame, key: str, values: np.ndarray, param: str, gate: str):
        m = len(values)
        cnt = np.zeros((m + 1, 3), dtype=np.int64)
        for j, c_, n_ in frame.iter_rows():
            cnt[int(j), int(c_)] += int(n_)
        cum = np.cumsum(cnt, axis=0)[:m]  # kept at value j: index <= j
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

    sweeps: dict[str, SweepResult] = {}
    if taus.size:
        sweeps["tau"] = sweep(
            taut.select("__ti", "__cat", "n"), "__ti", taus, "tau", f"entr:eps={entr.eps:g}"
        )
    if cs.size:
        sweeps["c"] = sweep(ct.select("__ci", "__cat", "n"), "__ci", cs, "c", "fixed")

    definitions = {
        "noise_token": (
            f"a token below the entropy breakpoint (H < H* = {h_star:.4g} nats) whose log-ratio "
            "breaks "
            f"the entropy-normalized bound: delta^2 / (H + {flag_eps:g}) > {flag_tau:g}"
            if h_star is not None
            else "undefined: no entropy breakpoint H* was given"
        ),
        "noise_admitted": "share of the noise tokens that the gate keeps (lower is better)",
        "law_scale_token": (
            "a token at or above H* (every token when there is no breakpoint) whose log-ratio "
            f"is within the fitted law's 99% range: delta^2 <= {CHI2_1_99:.4g} * k * H^alpha "
            f"(k = {law_k:.4g}, alpha = {law_alpha:.4g}; {CHI2_1_99:.4g} = 99% quantile of chi2 with "
            "1 dof)"
            if law_k is not None
            else "undefined: no fitted law (law_k) was given"
        ),
        "exploration_discarded": (
            "share of the law-scale tokens that the gate drops (lower is better): ordinary "
            "high-entropy exploration that the mismatch law explains"
        ),
        "matched": (
            "the fixed band |delta| <= c with c the (N - D)-th smallest |delta|, D = tokens "
            "ENTR drops: it drops exactly D tokens unless |delta| ties at c (then fewer)"
        ),
        "agreement": (
            "token counts: both keep / only ENTR keeps / only the other gate keeps / both drop"
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
        "panel": [g.spec() for g in panel],
        "h_star": h_star,
        "law_k": law_k,
        "law_alpha": law_alpha,
        "flag_tau": flag_tau,
        "flag_eps": flag_eps,
        "law_scale_quantile": 0.99,
        "law_scale_factor": CHI2_1_99,
        "m2po_cuts": {all_gates[i].spec(): v for i, v in _cuts.items()},
    }
    return CompareResult(
        parameters=parameters,
        n_tokens=n_tok,
        n_sequences=n_seq,
        n_noise=n_noise,
        n_exploration=n_law,
        entropy_edges=tuple(e_edges.tolist()),
        p_edges=tuple(p_e.tolist()),
        gates=tuple(results[:-1]),
        matched=matched,
        sweep=sweeps,
        definitions=definitions,
        null_reasons=null_reasons,
        gate_specs=gates,
        matched_spec=matched_gate,
    )
