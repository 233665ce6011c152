"""Rich terminal rendering of ``entr-diag fit``: built only from the result objects.

:func:`render_fit` prints the verdict first, then the entropy-bin table, the laws, the
breakpoint / noise-regime lines, the strata and the verl/slime mismatch metrics. Nothing is
recomputed here (docs/CONTRACT.md).
"""

from __future__ import annotations

import math

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from entr_diag.caveats import entropy_text, entropy_unit
from entr_diag.fit import Breakpoint, FitResult
from entr_diag.metrics import METRIC_NAMES, MismatchMetrics
from entr_diag.report.tables import print_fitting

__all__ = ["render_fit"]

_MAX_STEP_ROWS = 12
_SHORT = {"share_abs_delta_gt_log2": "|d|>log2", "log_ppl_diff": "log_ppl_diff"}


def _g(x: float | None, digits: int = 3) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    return f"{x:.{digits}g}"


def _ci(ci: tuple[float, float], digits: int = 3) -> str:
    lo, hi = ci
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "-"
    return f"[{_g(lo, digits)}, {_g(hi, digits)}]"


def _table(title: str) -> Table:
    return Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True,
                 title_justify="left")


def _pct(x: float) -> str:
    return "-" if not math.isfinite(x) else f"{100 * x:.3g}%"


def _nats(bp: Breakpoint, unit: tuple[str, float] | None) -> str | None:
    """H* and its interval converted to nats (None when the entropy column is in nats)."""
    if unit is None:
        return None
    f = unit[1]
    lo, hi = bp.h_star_ci
    return f"{_g(bp.h_star * f)} {_ci((lo * f, hi * f))}"


def render_fit(result: FitResult, metrics: MismatchMetrics | None, console: Console, *,
               caveat: str | None = None, verdict: str | None = None,
               metrics_note: str | None = None, forensics: str | None = None) -> None:
    """Print the fit (and the mismatch metrics, when given) to ``console``.

    ``verdict``: the verdict's text as the JSON has it, when it differs from the fit's own
    (e.g. led by "not assessable" when the logprobs are integers), printed in red.
    ``metrics_note``: printed under the metrics table (e.g.
    :func:`~entr_diag.caveats.truncation_metrics_note`). ``forensics``: the one-line summary
    of the mismatch forensics (:func:`~entr_diag.caveats.forensics_summary`), printed under
    the caveats.

    Order: verdict (and ``caveat`` under it, e.g.
    :func:`~entr_diag.caveats.small_sample_caveat`), bins table, laws table,
    breakpoint and regime lines, strata table, metrics table. Entropies and deltas in nats
    (entropies as the column reads, said so, when the units check names its unit bits or
    log10: :func:`~entr_diag.caveats.entropy_unit`).
    """
    units = result.units.to_dict() if result.units is not None else None
    unit = entropy_unit(units)
    h_unit = "nats" if unit is None else f"in the entropy column's unit, probably {unit[0]}"
    v = result.verdict
    style = {"holds": "bold green", "holds_approximately": "bold yellow"}.get(v.law, "bold red")
    if verdict is not None and verdict != v.text:
        style = "bold red"
    console.print(f"Verdict: {verdict or v.text}", style=style, soft_wrap=True, markup=False)
    if caveat:
        console.print(caveat, style="yellow", soft_wrap=True, markup=False)
    if forensics:
        console.print(forensics, style="yellow" if "see the caveats" in forensics else None,
                      soft_wrap=True, markup=False)
    console.print()

    # ---- bins
    t = _table("Entropy bins (H in " + ("nats" if unit is None else
                                        f"the entropy column's unit, probably {unit[0]}, not nats")
               + "; 95% intervals: sequence-block bootstrap)")
    for col in ("H from", "tokens", "seqs", "mean H", "mean d", "mean d^2",
                "95% CI", "mean |d|", "p95 |d|", "p<1e-3", "mean z^2", "fit"):
        t.add_column(col, justify="left" if col == "fit" else "right", no_wrap=True)
    for b in result.bins:
        t.add_row(
            _g(b.h_lo, 2),
            str(b.tokens),
            str(b.sequences),
            _g(b.mean_h),
            _g(b.mean_delta, 2),
            _g(b.mean_delta2),
            _ci(b.mean_delta2_ci, 2),
            _g(b.mean_abs_delta),
            _g(b.p95_abs_delta),
            _pct(b.share_p_lt_1e3),
            _g(b.mean_z2),
            "*" if b.in_fit else "",
        )
    print_fitting(console, t)
    console.print("d = delta = train_logprob - infer_logprob (nats; d^2 in nats^2, k of "
                  "k H^alpha in nats^(2 - alpha)); z = d / sqrt(H + eps) (no unit); "
                  "p<1e-3: share of tokens whose sampled-token probability is below 1e-3; "
                  + ("fit *: bin used by the law fits" if result.laws.grid == "bins" else
                     "fit *: bin inside the law regime (it spans fewer than 3 of these bins, "
                     "so the laws are fitted on the breakpoint search's finer bins)")
                  + "; a bin spans H from its 'H from' to the next "
                  f"bin's (last bin up to {_g(result.bins[-1].h_hi, 2)} {h_unit}).",
                  soft_wrap=True)

    # ---- laws
    laws = result.laws
    lt = _table(f"Laws fitted on {laws.power.n_bins} law-regime bins"
                + (" of the breakpoint search" if laws.grid == "breakpoint" else "")
                + f" (H {_g(laws.power.h_min, 2)}-{_g(laws.power.h_max, 2)} {h_unit})")
    for col in ("law", "k", "k 95% CI", "alpha / c", "95% CI", "weighted R^2", "chi2/dof"):
        lt.add_column(col)
    p = laws.proportional
    lt.add_row("delta^2 = k H", _g(p.k), _ci(p.k_ci), "", "", _g(p.r2, 4), _g(p.chi2_dof))
    a = laws.affine
    lt.add_row("delta^2 = k H + c", _g(a.k), _ci(a.k_ci), f"c = {_g(a.c)}", _ci(a.c_ci),
               _g(a.r2, 4), _g(a.chi2_dof))
    w = laws.power
    lt.add_row("delta^2 = k H^alpha", _g(w.k), _ci(w.k_ci), f"alpha = {_g(w.alpha)}",
               _ci(w.alpha_ci), _g(w.r2, 4), _g(w.chi2_dof))
    r = w.robust
    lt.add_row("  robust (Theil-Sen)", _g(r.k), "", f"alpha = {_g(r.alpha)}", _ci(r.alpha_ci),
               "", "")
    print_fitting(console, lt)
    console.print(f"Robust check: {r.note}.", style="yellow" if r.disagrees else None,
                  soft_wrap=True, markup=False)
    console.print(f"Robust k of delta^2 = k H (median of the bins' mean delta^2 / mean H): "
                  f"{_g(p.k_robust)}. R^2 and chi2/dof: of delta^2 in linear space for the "
                  "first two laws, of ln delta^2 in log-log space for k H^alpha (its fit's "
                  "space): not comparable across the rows.", soft_wrap=True)

    # ---- breakpoint and regime
    bp = result.breakpoint
    s = result.breakpoint_search
    if bp is None:
        console.print(f"Breakpoint: none ({s.reason}).", soft_wrap=True, markup=False)
    else:
        console.print(
            f"Breakpoint: H* = "
            f"{entropy_text(_g(bp.h_star), _ci(bp.h_star_ci), units, _nats(bp, unit))}; "
            f"delta BIC = {bp.delta_bic:.1f}; low-entropy excess x{_g(bp.excess_ratio)} "
            f"{_ci(bp.excess_ratio_ci)}; bootstrap support {_pct(bp.support)}.",
            soft_wrap=True,
        )
    g = result.regime
    if g.h_star is not None:
        console.print(
            f"Noise regime ({g.rule}): {g.flagged_tokens} tokens flagged = "
            f"{_pct(g.share_flagged)} of tokens, {_pct(g.delta2_mass_share_flagged)} of "
            f"delta^2 mass; below H*: {_pct(g.share_below_h_star)} of tokens, "
            f"{_pct(g.delta2_mass_share_below_h_star)} of delta^2 mass.",
            soft_wrap=True,
        )
        pt = _table("Flagged tokens by sampled-token probability p = exp(infer_logprob)")
        for col in ("p bin", "tokens", "share of flagged", "share of all delta^2 mass"):
            pt.add_column(col)
        for pb in g.by_p:
            pt.add_row(pb.label, str(pb.tokens), _pct(pb.share_of_flagged),
                       _pct(pb.share_of_delta2_mass))
        print_fitting(console, pt)
    else:
        console.print(f"Noise regime: {g.rule}.", soft_wrap=True, markup=False)

    # ---- strata
    st = result.strata
    rows = list(st.staleness) + list(st.step)
    if rows:
        tt = _table("Power law per stratum (law-regime bins)")
        for col in ("stratum", "tokens", "bins", "alpha", "alpha 95% CI", "random size",
                    "k", "k 95% CI", "k (k H)", "note"):
            tt.add_column(col)
        for x in rows:
            tt.add_row(Text(f"{x.kind} {x.label}"), str(x.tokens), str(x.n_bins), _g(x.alpha),
                       _ci(x.alpha_ci), _ci(x.alpha_random_ci), _g(x.k), _ci(x.k_ci),
                       _g(x.k_proportional), Text(x.note or ""))
        print_fitting(console, tt)
        console.print("Strata: 'random size' is the 95% range of alpha on random samples of "
                      "the run as large as the stratum (whole sequences): a smaller sample "
                      "reads another alpha on heavy-tailed bins, beyond the stratum's own "
                      "interval, so a stratum differs from the run only outside that range. k "
                      "growing over steps is a changing mismatch; growing with staleness it is "
                      "policy drift only if the forensic staleness check (at fixed step) "
                      "agrees.", soft_wrap=True, markup=False)
    for n in st.notices:
        console.print(f"Note: {n}.", soft_wrap=True, markup=False)

    # ---- metrics
    if metrics is not None:
        mt = _table("Mismatch metrics (verl / slime names)")
        mt.add_column("step", no_wrap=True)
        mt.add_column("tokens", justify="right", no_wrap=True)
        for name in METRIC_NAMES:
            mt.add_column(_SHORT.get(name, name), justify="right")
        sets = [("all", metrics.overall)]
        ps = list(metrics.per_step)
        if len(ps) > _MAX_STEP_ROWS:
            stride = math.ceil(len(ps) / _MAX_STEP_ROWS)
            ps = ps[::stride]
        sets += [(str(m.step), m) for m in ps]
        for label, m in sets:
            mt.add_row(label, str(m.tokens), *[_g(getattr(m, n), 4) for n in METRIC_NAMES])
        print_fitting(console, mt, keys=2)
        console.print("|d|>log2 = share_abs_delta_gt_log2; ess = 1/mean((w/mean w)^2), w = r "
                      "per token; chi2 and ess clamp log-ratios to +/-20 before exp (verl), "
                      "k3_kl does not (a huge k3_kl: look for placeholder logprobs).",
                      soft_wrap=True)
        if len(metrics.per_step) > _MAX_STEP_ROWS:
            console.print(f"(per-step rows subsampled: {len(metrics.per_step)} steps in total; "
                          "all of them are in the JSON)", soft_wrap=True)
        if metrics.tokens_without_step:
            console.print(f"{metrics.tokens_without_step:,} token(s) have a null step: counted "
                          "in 'all', in no step row.", soft_wrap=True)
        clamp = _clamp_note(metrics.overall)
        if clamp:
            console.print(clamp, soft_wrap=True)
        if metrics_note:
            console.print(metrics_note, style="yellow", soft_wrap=True, markup=False)


def _clamp_note(m) -> str | None:
    from entr_diag.metrics import clamp_note_of

    return clamp_note_of(m.tokens_clamped, m.sequences_clamped, m.k3_kl)
