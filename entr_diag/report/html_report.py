"""Self-contained HTML post-mortem report of a run (issue 5).

:func:`build_report_html` turns the ``to_dict()`` of the analysis results (the same dicts
the ``--json`` report is written from) into one HTML file: plotly.js embedded once, every
figure drawn from aggregates, no network fetch, all text escaped. The renderer never
recomputes a statistic: it only lays out numbers it is given (evaluating a fitted law on a
grid of H to draw its line is the only arithmetic, besides unit formatting).

Sections: findings (when any), 1 summary, 2 scaling law + (H, |delta|) density,
3 mismatch by sampled-token probability, 4 gates, 5 over training, 6 version switches,
7 worst offenders. A figure whose inputs are missing shows ``unavailable: <reason>``.
"""

from __future__ import annotations

import datetime as _dt
import html
import json
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio
import plotly.offline
from plotly.subplots import make_subplots

from entr_diag.caveats import entropy_text, entropy_unit, truncation_metrics_note
from entr_diag.compare import noise_by_definition, null_reason_lines
from entr_diag.metrics import clamp_note_of

__all__ = ["build_report_html", "write_report", "ReportUnavailable"]

PAPER = "arXiv:2607.22186"

# ----------------------------------------------------------------------------- style

_PALETTE = [  # (ENTR's blue, then 11 hues far apart: helper-43 found mis and k3 both
    # orange, areal and m2po both purple, icepop and veto both green)
    "#2563eb",  # blue (ENTR)
    "#dc2626",  # red
    "#15803d",  # dark green
    "#ea580c",  # orange
    "#7c3aed",  # violet
    "#0891b2",  # cyan
    "#c026d3",  # magenta
    "#84cc16",  # lime
    "#4b5563",  # grey
    "#92400e",  # brown
    "#1e3a8a",  # navy
    "#eab308",  # yellow
]
_ENTR_COLOR = "#2563eb"
_NOISE_FILL = "rgba(220, 38, 38, 0.08)"

_TEMPLATE = go.layout.Template(
    layout=go.Layout(
        font=dict(
            family="system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif",
            size=13,
            color="#1f2937",
        ),
        paper_bgcolor="white",
        plot_bgcolor="white",
        colorway=_PALETTE,
        margin=dict(l=70, r=30, t=50, b=60),
        hoverlabel=dict(font=dict(size=12)),
        legend=dict(bgcolor="rgba(255,255,255,0.8)", borderwidth=0),
        xaxis=dict(
            showgrid=True,
            gridcolor="#e5e7eb",
            zeroline=False,
            linecolor="#9ca3af",
            ticks="outside",
            showline=True,
            mirror=False,
        ),
        yaxis=dict(
            showgrid=True,
            gridcolor="#e5e7eb",
            zeroline=False,
            linecolor="#9ca3af",
            ticks="outside",
            showline=True,
            mirror=False,
        ),
    )
)

_CSS = """
:root { --fg:#1f2937; --muted:#6b7280; --line:#e5e7eb; --bg:#f8fafc; --card:#ffffff;
        --accent:#2563eb; --warn:#b45309; --bad:#b91c1c; --ok:#047857; }
* { box-sizing: border-box; }
body { margin:0; background:var(--bg); color:var(--fg);
       font:14px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif; }
header.top { background:#0f172a; color:#f8fafc; padding:20px 32px; }
header.top h1 { margin:0 0 4px; font-size:22px; font-weight:600; }
header.top .sub { color:#cbd5e1; font-size:13px; }
nav.toc { background:#fff; border-bottom:1px solid var(--line); padding:8px 32px;
          position:sticky; top:0; z-index:10; font-size:13px; }
nav.toc a { color:var(--accent); text-decoration:none; margin-right:16px; white-space:nowrap; }
main { max-width:1280px; margin:0 auto; padding:16px 24px 48px; }
section.card { background:var(--card); border:1px solid var(--line); border-radius:8px;
               padding:16px 22px 18px; margin:18px 0; }
section.card > h2 { margin:0 0 10px; font-size:18px; font-weight:600; }
h3 { font-size:15px; margin:16px 0 6px; font-weight:600; }
.verdict p { margin:4px 0; font-size:15px; }
.verdict p b { color:#111827; }
.verdict p.caveat { color:#92400e; font-size:14px; }
p.how { color:var(--muted); font-size:12.5px; margin:2px 0 10px; }
p.how b { color:#374151; }
.unavailable { color:var(--muted); font-style:italic; background:#f3f4f6;
               border:1px dashed #d1d5db; border-radius:6px; padding:10px 14px; margin:8px 0; }
.grid2 { display:grid; grid-template-columns:minmax(0,1fr) minmax(0,1fr); gap:18px; }
.grid3 { display:grid; grid-template-columns:minmax(0,1.3fr) minmax(0,1fr) minmax(0,1fr);
         gap:18px; }
@media (max-width: 1000px) { .grid2, .grid3 { grid-template-columns:1fr; } }
.fig { width:100%; min-height:200px; }
table { border-collapse:collapse; font-size:12.5px; margin:6px 0 10px; }
th, td { border-bottom:1px solid var(--line); padding:4px 10px; text-align:left;
         vertical-align:top; }
th { background:#f1f5f9; font-weight:600; }
td.num, th.num { text-align:right; font-variant-numeric:tabular-nums; }
td.num { white-space:nowrap; }
.grid2.offenders { grid-template-columns:minmax(0,3fr) minmax(0,2fr); }
.offenders th, .offenders td { padding:4px 7px; }
table.kv { width:100%; table-layout:fixed; }
table.kv th { width:42%; background:none; color:var(--muted); font-weight:500; }
table.kv td { overflow-wrap:anywhere; }
.scroll { overflow-x:auto; }
code { font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace; font-size:12px;
       background:#f1f5f9; padding:1px 4px; border-radius:3px; }
ul.findings { list-style:none; padding:0; margin:0; }
ul.findings li { border-left:4px solid var(--line); padding:6px 12px; margin:6px 0;
                 background:#fafafa; }
ul.findings li.sev-error, ul.findings li.sev-critical, ul.findings li.sev-high
  { border-color:var(--bad); }
ul.findings li.sev-warning, ul.findings li.sev-medium { border-color:var(--warn); }
ul.findings li.sev-info, ul.findings li.sev-low { border-color:var(--accent); }
.badge { display:inline-block; font-size:11px; font-weight:600; text-transform:uppercase;
         padding:1px 6px; border-radius:4px; background:#e5e7eb; margin-right:6px; }
.evidence { color:var(--muted); font-size:12px; }
details { margin:8px 0 0; }
details > summary { cursor:pointer; color:var(--muted); font-size:13px; }
footer { color:var(--muted); font-size:12px; text-align:center; padding:12px; }
"""

# ----------------------------------------------------------------------------- helpers


class ReportUnavailable(Exception):
    """Raised by a figure builder when the results cannot support the figure; the message
    is shown in the report as ``unavailable: <message>``."""


def _e(x: Any) -> str:
    return html.escape("" if x is None else str(x), quote=True)


def _is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _f(x: Any, digits: int = 3) -> str:
    """Format a number for prose/tables (None/NaN -> 'n/a')."""
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        if not math.isfinite(x):
            return "n/a"
        if x == 0:
            return "0"
        ax = abs(x)
        if ax >= 1e5 or ax < 1e-3:
            return f"{x:.{digits - 1}e}"
        return f"{x:.{digits}g}"
    if x is None:
        return "n/a"
    return str(x)


def _pct(x: Any) -> str:
    """A share as a percentage, 3 significant digits; a share short of 1 (or above 0) never
    reads 100% (or 0%): 47 tokens dropped of 700,000 read 100% kept."""
    if not _is_num(x):
        return "n/a"
    out = f"{100 * x:.3g}%"
    if out == "100%" and x < 1:
        return f"{100 * x:.{_digits_below(1 - x)}f}%"
    if out == "0%" and x > 0:
        return f"{100 * x:.2g}%"
    return out


def _digits_below(gap: float) -> int:
    """Decimals of a percentage that show a gap ``gap`` (a share) from 100%."""
    return min(12, max(2, 1 - int(math.floor(math.log10(100 * gap)))))


def _get(d: Any, *path: str | int, default: Any = None) -> Any:
    """``d[path0][path1]...`` or ``default`` when any step is missing/None."""
    cur = d
    for p in path:
        if isinstance(cur, Mapping) and p in cur:
            cur = cur[p]
        elif isinstance(cur, Sequence) and isinstance(p, int) and -len(cur) <= p < len(cur):
            cur = cur[p]
        else:
            return default
        if cur is None:
            return default
    return cur


def _pick(d: Any, *names: str, default: Any = None) -> Any:
    """First present, non-None key among ``names`` (result dicts are read defensively)."""
    if not isinstance(d, Mapping):
        return default
    for n in names:
        v = d.get(n)
        if v is not None:
            return v
    return default


def _need(d: Any, *path: str | int, what: str) -> Any:
    v = _get(d, *path)
    if v is None:
        raise ReportUnavailable(f"{what} (missing key {'.'.join(map(str, path))!r})")
    return v


def _nums(xs: Iterable[Any]) -> list[float | None]:
    return [float(x) if _is_num(x) else None for x in xs]


def _rows(x: Any) -> list[dict]:
    """A list of row dicts from a list of dicts or a column dict ``{name: [...]}``."""
    if isinstance(x, Mapping):
        keys = [k for k, v in x.items() if isinstance(v, list)]
        if not keys:
            return []
        n = len(x[keys[0]])
        return [{k: x[k][i] for k in keys if i < len(x[k])} for i in range(n)]
    if isinstance(x, list):
        return [r for r in x if isinstance(r, Mapping)]
    return []


def _interval(d: Mapping[str, Any], base: str) -> tuple[Any, Any]:
    """Read a 95% interval of ``base`` in the shapes results use:
    ``{base}_ci: [lo, hi]``, ``{base}_lo/{base}_hi``, ``{base}_low/{base}_high``,
    ``ci: [lo, hi]`` or ``ci_low/ci_high``."""
    ci = d.get(f"{base}_ci")
    if isinstance(ci, Sequence) and not isinstance(ci, str) and len(ci) == 2:
        return ci[0], ci[1]
    if isinstance(ci, Mapping):
        return _pick(ci, "lo", "low", "lower"), _pick(ci, "hi", "high", "upper")
    for lo, hi in (
        ("_lo", "_hi"),
        ("_low", "_high"),
        ("_ci_lo", "_ci_hi"),
        ("_ci_low", "_ci_high"),
        ("_lower", "_upper"),
    ):
        if f"{base}{lo}" in d or f"{base}{hi}" in d:
            return d.get(f"{base}{lo}"), d.get(f"{base}{hi}")
    return None, None


def _fig_base(title: str | None = None, height: int = 420, **layout: Any) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(template=_TEMPLATE, height=height, **layout)
    if title:
        fig.update_layout(title=dict(text=_e(title), x=0.01, xanchor="left", font=dict(size=14)))
    return fig


class _Doc:
    """Accumulates HTML parts and numbers figure divs."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.n_figs = 0

    def add(self, s: str) -> None:
        self.parts.append(s)

    def figure_html(self, fig: go.Figure) -> str:
        self.n_figs += 1
        div_id = f"fig-{self.n_figs}"
        body = pio.to_json(fig, validate=False, pretty=False)
        body = body.replace("</", "<\\/")
        return (
            f'<div class="fig" id="{div_id}" data-entr-figure="1"></div>\n'
            f"<script>(function(){{var f={body};"
            f'Plotly.newPlot("{div_id}",f.data,f.layout,'
            '{"responsive":true,"displaylogo":false,'
            '"modeBarButtonsToRemove":["select2d","lasso2d"]});})();</script>'
        )

    def figure_block(self, build: Callable[[], go.Figure], how: str, title: str = "") -> str:
        """A figure with its "how to read this" line, or an unavailable note."""
        head = f"<h3>{_e(title)}</h3>" if title else ""
        try:
            fig = build()
        except ReportUnavailable as exc:
            return f'{head}<div class="unavailable">unavailable: {_e(exc)}</div>'
        except _SHAPE_ERRORS as exc:
            return f'{head}<div class="unavailable">unavailable: {_e(_shape_reason(exc))}</div>'
        return f'{head}<p class="how"><b>How to read this:</b> {_e(how)}</p>' + self.figure_html(
            fig
        )


#: Errors that mean "a result dict does not have the shape this renderer expects" (a key
#: missing, a null where a number was expected). One figure or table then says so instead
#: of the whole report failing; the tests assert no such note on real results.
_SHAPE_ERRORS = (KeyError, TypeError, ValueError, IndexError, ZeroDivisionError, AttributeError)


def _shape_reason(exc: BaseException) -> str:
    what = f"missing key {exc}" if isinstance(exc, KeyError) else f"{type(exc).__name__}: {exc}"
    return f"the results do not have the expected shape ({what})"


def _safe(render: Callable[[], str]) -> str:
    """Run an HTML-producing renderer; a shape error becomes an unavailable note."""
    try:
        return render()
    except _SHAPE_ERRORS as exc:
        return _unavail(_shape_reason(exc))


def _unavail(reason: str) -> str:
    return f'<div class="unavailable">unavailable: {_e(reason)}</div>'


def _table(
    headers: Sequence[str], rows: Iterable[Sequence[Any]], num_cols: set[int] | None = None
) -> str:
    num_cols = num_cols or set()
    th = "".join(
        f'<th class="num">{_e(h)}</th>' if i in num_cols else f"<th>{_e(h)}</th>"
        for i, h in enumerate(headers)
    )
    body = []
    for r in rows:
        tds = "".join(
            f'<td class="num">{_e(_f(v))}</td>' if i in num_cols else f"<td>{_e(_f(v))}</td>"
            for i, v in enumerate(r)
        )
        body.append(f"<tr>{tds}</tr>")
    return f'<div class="scroll"><table><thead><tr>{th}</tr></thead><tbody>{"".join(body)}</tbody></table></div>'


class _Id(str):
    """A key (seq_id, position, step, token_id) shown verbatim, without number formatting."""


def _idv(x: Any) -> Any:
    return None if x is None else _Id(x)


def _kv_table(items: Iterable[tuple[str, Any]]) -> str:
    rows = []
    for k, v in items:
        if isinstance(v, (Mapping, list, tuple)):
            v_html = f"<code>{_e(json.dumps(v, default=str, sort_keys=True))}</code>"
        else:
            v_html = _e(_f(v))
        rows.append(f"<tr><th>{_e(k)}</th><td>{v_html}</td></tr>")
    return f'<table class="kv"><tbody>{"".join(rows)}</tbody></table>'


def _log_centers(edges: Sequence[float]) -> list[float]:
    """Geometric bin centers; the floor bin [0, lo) is drawn one bin-width below lo."""
    cs = []
    for i in range(len(edges) - 1):
        lo, hi = edges[i], edges[i + 1]
        if lo > 0:
            cs.append(math.sqrt(lo * hi))
        else:
            ratio = edges[i + 2] / edges[i + 1] if i + 2 < len(edges) else 10.0
            cs.append(hi / math.sqrt(ratio))
    return cs


# ----------------------------------------------------------------------------- findings


def _evidence_html(ev: Any) -> str:
    if ev in (None, "", {}, []):
        return ""
    if isinstance(ev, Mapping):
        items = ", ".join(
            f"{k} = {v if isinstance(v, str) else _f(v) if not isinstance(v, (list, dict)) else json.dumps(v, default=str)}"
            for k, v in ev.items()
        )
    else:
        items = ev if isinstance(ev, str) else json.dumps(ev, default=str, sort_keys=True)
    return f'<div class="evidence">evidence: {_e(items)}</div>'


def _findings_section(findings: Any, warnings: Sequence[str] = ()) -> str:
    """Findings of the forensics (``Findings.to_dict()``: {findings: [...], checks: {...}}, or
    a plain list of {kind, severity, title?, message, evidence, check?}), after the
    ``warnings`` the command printed about the input (the JSON's ``warnings``: entropy in
    bits, a temperature or truncation left out of the logs, copied shards...), which are
    also beside the verdict: a reader who reads only this card sees them too."""
    checks: Mapping[str, Any] = {}
    if isinstance(findings, Mapping):
        checks = findings.get("checks") or {}
        findings = findings.get("findings") or []
    findings = list(findings or [])
    warnings = [str(w) for w in warnings or () if w]
    if not findings and not checks and not warnings:
        return ""
    items = [f'<li class="sev-warning"><span class="badge">warning</span><code>input</code> '
             f"{_e(w)}</li>" for w in warnings]
    for f in findings:
        if not isinstance(f, Mapping):
            f = {"message": f}
        sev = str(f.get("severity") or "info").lower()
        sev_cls = "".join(ch for ch in sev if ch.isalnum())
        kind = f.get("kind")
        kind_html = f"<code>{_e(kind)}</code> " if kind else ""
        title = f.get("title")
        title_html = f"<b>{_e(title)}</b><br>" if title else ""
        check = f.get("check")
        check_html = f'<div class="evidence">what to check: {_e(check)}</div>' if check else ""
        items.append(
            f'<li class="sev-{_e(sev_cls)}"><span class="badge">{_e(sev)}</span>{kind_html}'
            f"{title_html}{_e(f.get('message', ''))}{_evidence_html(f.get('evidence'))}"
            f"{check_html}</li>"
        )
    body = (
        f'<ul class="findings">{"".join(items)}</ul>'
        if items
        else "<p>No cause of mismatch was found by the forensics checks.</p>"
    )
    if warnings and not findings and checks:
        body += "<p>No cause of mismatch was found by the forensics checks.</p>"
    if checks:
        from entr_diag.report.terminal_findings import status_labels

        labels = status_labels({"findings": [f for f in findings if isinstance(f, Mapping)],
                                "checks": checks})
        rows = [
            (name, labels.get(name) or _get(st, "status") or "", _get(st, "reason") or "")
            for name, st in checks.items()
        ]
        counts: dict[str, int] = {}
        for _, st, _ in rows:
            counts[st] = counts.get(st, 0) + 1
        tally = ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in sorted(counts.items()))
        body += (
            f"<details><summary>{len(rows)} checks: {_e(tally)}</summary>"
            + _table(["check", "status", "why"], rows)
            + "</details>"
        )
    return f'<section class="card" id="findings"><h2>Findings</h2>{body}</section>'


# ----------------------------------------------------------------------------- 1 summary


def _fit_sentence(fit: dict | None, unavailable: str | None = None) -> str:
    """The verdict's sentence on the law; without a fit, ``unavailable`` (the reason the
    command gives, e.g. no entropy column, too few sequences) when known."""
    if not fit:
        if unavailable:
            return f"Scaling law: not fitted: {unavailable}"
        return "Scaling law: not fitted (no fit result)."
    v = _pick(fit, "verdict", "summary")
    if isinstance(v, Mapping):
        v = _pick(v, "text", "message", "verdict")
    if v:
        return f"Scaling law: {v}"
    alpha = _get(fit, "laws", "power", "alpha")
    k = _get(fit, "laws", "proportional", "k")
    if alpha is not None or k is not None:
        return f"Scaling law: k = {_f(k)} nats, power-law alpha = {_f(alpha)}."
    return "Scaling law: the fit result carries no verdict."


def _h_unit(fit: Mapping) -> str:
    """The unit of the fit's entropies: nats, or the entropy column's as its units check
    names it (:func:`~entr_diag.caveats.entropy_unit`: ``probably bits``)."""
    unit = entropy_unit(fit.get("units"))
    return "nats" if unit is None else f"probably {unit[0]}, as the column reads"


def _staleness_unit_of(fit: Mapping | None) -> int:
    """The fit's unit of lag of the staleness strata (``parameters["staleness_unit"]``, 1
    when absent or malformed)."""
    u = _get(fit, "parameters", "staleness_unit") if isinstance(fit, Mapping) else None
    return u if isinstance(u, int) and not isinstance(u, bool) and u > 1 else 1


def _compare_h_unit(compare: Mapping | None) -> str:
    """The unit of the comparison's entropies (``parameters["entropy_unit"]``): ``nats``,
    or ``probably bits, as the column reads``."""
    unit = _get(compare, "parameters", "entropy_unit") if isinstance(compare, Mapping) else None
    if not isinstance(unit, str) or unit == "nats":
        return "nats"
    return f"probably {unit}, as the column reads"


def _h_text(fit: Mapping, h: Any, lo: Any, hi: Any) -> str:
    """An entropy with its interval and unit (``0.034 nats [0.029, 0.041]``), with its
    value in nats beside it when the units check names the entropy column's unit bits or
    log10 (:func:`~entr_diag.caveats.entropy_text`)."""
    units = fit.get("units")
    unit = entropy_unit(units)
    nats = None
    if unit is not None and _is_num(h):
        f = unit[1]
        nats = f"{_f(h * f)}" + (f" [{_f(lo * f)}, {_f(hi * f)}]"
                                 if _is_num(lo) and _is_num(hi) else "")
    return entropy_text(_f(h), f"[{_f(lo)}, {_f(hi)}]", units, nats)


def _regime_sentence(fit: dict | None) -> str:
    if not fit:
        return "Noise regime: not assessed (no fit result)."
    bp = fit.get("breakpoint")
    reg = fit.get("regime") if isinstance(fit.get("regime"), Mapping) else {}
    if not isinstance(bp, Mapping) or not _is_num(bp.get("h_star")):
        reason = _get(reg, "breakpoint_search", "reason")
        reason = str(reason).rstrip(".") if reason else ""
        return "Noise regime: no low-entropy break detected" + (f": {reason}." if reason else ".")
    lo, hi = _interval(bp, "h_star")
    s = f"Noise regime: below H* = {_h_text(fit, bp['h_star'], lo, hi)}"
    if _is_num(reg.get("share_below_h_star")):
        s += (
            f", {_pct(reg['share_below_h_star'])} of tokens carry "
            f"{_pct(reg.get('delta2_mass_share_below_h_star'))} of the δ² mass"
        )
    if reg.get("flagged_tokens") is not None:
        s += (
            f"; {_f(reg['flagged_tokens'])} tokens ({_pct(reg.get('share_flagged'))}) are "
            f"flagged as noise ({reg.get('rule', 'H < H* and score > tau')}), carrying "
            f"{_pct(reg.get('delta2_mass_share_flagged'))} of the δ² mass"
        )
    return s + "."


def _gate_sentence(compare: dict | None) -> str:
    if not compare:
        return "Gates: not compared (no compare result)."
    gates = compare.get("gates") or []
    if not gates:
        return "Gates: the comparison holds no gate."
    entr = gates[0]
    s = f"Gates: {_gate_name(entr)} keeps {_pct(entr.get('kept_share'))} of tokens"
    extra = []
    if _is_num(entr.get("noise_admitted")) and noise_by_definition(
            entr, compare.get("parameters") or {}):
        extra.append("admits none of the noise tokens, by definition: they are the tokens "
                     "it drops below H*")
    elif _is_num(entr.get("noise_admitted")):
        extra.append(f"admits {_pct(entr['noise_admitted'])} of the noise tokens")
    if _is_num(entr.get("exploration_discarded")):
        extra.append(f"discards {_pct(entr['exploration_discarded'])} of in-law exploration")
    if extra:
        s += " (" + ", ".join(extra) + ")"
    m = compare.get("matched")
    fx = _get(m, "fixed")
    if isinstance(fx, Mapping):
        parts = []
        if _is_num(fx.get("noise_admitted")):
            parts.append(f"admits {_pct(fx['noise_admitted'])} of the noise")
        if _is_num(fx.get("exploration_discarded")):
            parts.append(f"discards {_pct(fx['exploration_discarded'])} of exploration")
        s += f"; the fixed band dropping as many tokens (c = {_f(_get(m, 'c'))} nats)"
        s += " " + " and ".join(parts) if parts else f" keeps {_pct(fx.get('kept_share'))}"
    return s + "."


def _forensics_line(fit: dict | None, findings: Any) -> str | None:
    """The Forensics line under the verdict: the fit's (``verdict.forensics``), or without
    a fit (a law not fitted on a tiny or entropy-less input) the same line made from the
    findings, so the summary still says what the checks found."""
    line = _get(fit, "verdict", "forensics") if fit else None
    if isinstance(line, str) or fit:
        return line if isinstance(line, str) else None
    if isinstance(findings, Mapping) and isinstance(findings.get("checks"), Mapping):
        from entr_diag.caveats import forensics_summary

        return forensics_summary(findings)
    return None


def _summary_section(summary: dict, fit: dict | None, compare: dict | None,
                     findings: Any = None) -> str:
    inputs = summary.get("inputs") or {}
    files = inputs.get("files") or []
    if isinstance(files, str):
        files = [files]
    caveat = _get(fit, "verdict", "caveat") if fit else None
    warned = summary.get("warnings") or []
    verdict = (
        '<div class="verdict">'
        f"<p>{_e(_fit_sentence(fit, summary.get('unavailable')))}</p>"
        + "".join(f'<p class="caveat">{_e(c)}</p>' for c in (caveat or "").splitlines())
        + "".join(f'<p class="caveat">warning: {_e(w)}</p>' for w in warned
                  if not caveat or w not in caveat)
        + "".join(f"<p>{_e(s)}</p>" for s in [_forensics_line(fit, findings)]
                  if isinstance(s, str))
        + f"<p>{_e(_regime_sentence(fit))}</p>"
        f"<p>{_e(_gate_sentence(compare))}</p></div>"
    )
    shown_files = [str(x) for x in files[:50]]
    more = f" (+{len(files) - 50} more)" if len(files) > 50 else ""
    inp = _kv_table(
        kv
        for kv in [
            ("files", ", ".join(shown_files) + more if files else None),
            ("bundled sample run", True if inputs.get("bundled_sample") else None),
            ("layout", inputs.get("layout")),
            ("tokens (total rows)", inputs.get("tokens_total")),
            ("tokens (valid, loss-masked)", inputs.get("tokens_valid")),
            ("sequences", inputs.get("sequences")),
            ("entropy source", summary.get("entropy_source")),
            ("tool version", summary.get("tool_version")),
            ("report created", summary.get("created_at")),
        ]
        if kv[0] != "bundled sample run" or kv[1]
    )
    excl = summary.get("exclusions") or {}
    excl_html = (
        _table(["reason", "tokens excluded"], sorted(excl.items()), {1})
        if excl
        else "<p class='how'>No token was excluded.</p>"
    )
    mapping = summary.get("mapping") or {}
    map_html = (
        _table(
            ["canonical column", "source column"], sorted((k, str(v)) for k, v in mapping.items())
        )
        if mapping
        else "<p class='how'>No column mapping recorded.</p>"
    )
    params = summary.get("parameters") or {}
    params_html = _kv_table(sorted(params.items())) if params else "<p class='how'>none</p>"
    return (
        '<section class="card" id="summary"><h2>1. Summary</h2>'
        f"{verdict}"
        '<div class="grid3"><div><h3>Inputs</h3>'
        f"{inp}<h3>Exclusions by reason</h3>{excl_html}</div>"
        f"<div><h3>Column mapping</h3>{map_html}</div>"
        f"<div><h3>Parameters</h3>{params_html}</div></div>"
        "</section>"
    )


# ----------------------------------------------------------------------------- 2 scaling law


def _fit_bins(fit: dict) -> list[dict]:
    bins = fit.get("bins")
    if isinstance(bins, Mapping):  # column-oriented {name: [..]}
        keys = list(bins)
        n = len(bins[keys[0]]) if keys else 0
        bins = [{k: bins[k][i] for k in keys} for i in range(n)]
    if not bins:
        raise ReportUnavailable("the fit result has no entropy bins")
    return list(bins)


def _law_params(fit: dict) -> dict[str, dict]:
    laws = fit.get("laws") or {}
    if isinstance(laws, Sequence):
        laws = {str(_pick(x, "name", "kind", default=i)): x for i, x in enumerate(laws)}
    return {str(k): v for k, v in laws.items() if isinstance(v, Mapping)}


def _law_curve(name: str, law: Mapping[str, Any], xs: list[float]) -> list[float] | None:
    k = law.get("k")
    if not _is_num(k):
        return None
    n = name.lower()
    if "power" in n:
        a = law.get("alpha")
        if not _is_num(a):
            return None
        return [k * x**a for x in xs]
    if "affine" in n:
        c = law.get("c")
        if not _is_num(c):
            return None
        return [k * x + c for x in xs]
    return [k * x for x in xs]


def _law_label(name: str, law: Mapping[str, Any]) -> str:
    n = name.lower()
    k_lo, k_hi = _interval(law, "k")
    k_s = f"k = {_f(law.get('k'))}"
    if _is_num(k_lo) and _is_num(k_hi):
        k_s += f" [{_f(k_lo)}, {_f(k_hi)}]"
    if "power" in n:
        a_lo, a_hi = _interval(law, "alpha")
        a_s = f"α = {_f(law.get('alpha'))}"
        if _is_num(a_lo) and _is_num(a_hi):
            a_s += f" [{_f(a_lo)}, {_f(a_hi)}]"
        robust = law.get("robust")
        if isinstance(robust, Mapping) and _is_num(robust.get("alpha")):
            a_s += f"\nTheil-Sen α = {_f(robust['alpha'])}"
            if robust.get("disagrees"):
                a_s += " (disagrees)"
        return f"k·H^α: {k_s}, {a_s}"
    if "affine" in n:
        return f"k·H + c: {k_s}, c = {_f(law.get('c'))}"
    return f"k·H: {k_s}"


def _no_fit(why: str | None) -> ReportUnavailable:
    """The caption of a figure that needs the fit when there is none (``why``: the reason
    the command gave, when known)."""
    return ReportUnavailable(f"no fit result: {why}" if why else
                             "no fit result (the data carry no entropy column, or too few "
                             "tokens to fit)")


def _not_fitted(fit: dict, b: dict) -> tuple[str, str] | None:
    """Why bin ``b`` (a fit result's bin dict) is not among the bins the laws are fitted
    on, as (legend phrase, hover sentence), or None when it is (``in_fit``, absent: True).
    The law fits use the bins of the law regime (above H*'s interval when a break was
    found) holding MIN_BIN_TOKENS tokens from 2 sequence blocks or more
    (:func:`entr_diag.fit._eligible`)."""
    from entr_diag.fit import MIN_BIN_TOKENS

    if b.get("in_fit", True):
        return None
    bp = fit.get("breakpoint") or {}
    ci = bp.get("h_star_ci") or [None, None]
    cut = ci[1] if len(ci) == 2 and _is_num(ci[1]) else bp.get("h_star")
    if _is_num(cut) and _is_num(b.get("h_lo")) and b["h_lo"] < cut * (1 - 1e-9):
        return "noise regime", f"below the law regime (H < {_f(cut)}, the top of H*'s interval)"
    if _is_num(b.get("tokens")) and b["tokens"] < MIN_BIN_TOKENS:
        return (f"under {MIN_BIN_TOKENS} tokens",
                f"{_f(b['tokens'])} tokens, under the {MIN_BIN_TOKENS} a fitted bin needs")
    return ("tokens of under 2 sequence blocks",
            "its tokens come from fewer than 2 of the bootstrap's sequence blocks, which a "
            "fitted bin needs (no interval without them)")


def _scaling_fig(fit: dict | None, why: str | None = None) -> go.Figure:
    if not fit:
        raise _no_fit(why)
    bins = _fit_bins(fit)
    pts: list[tuple[float, float, float | None, float | None, str, bool]] = []
    reasons: dict[str, None] = {}  # (why the hollow bins are not fitted, in order met)
    for b in bins:
        x = _pick(b, "mean_h", "mean_entropy")
        y = _pick(b, "mean_delta2", "mean_delta_sq")
        if not (_is_num(x) and _is_num(y)) or x <= 0 or y <= 0:
            continue
        lo, hi = _interval(b, "mean_delta2")
        if lo is None and hi is None:
            lo, hi = _interval(b, "mean_delta_sq")
        why = _not_fitted(fit, b)
        text = (
            f"H ∈ [{_f(b.get('h_lo'))}, {_f(b.get('h_hi'))})"
            f"<br>tokens {_f(b.get('tokens'))}, sequences {_f(b.get('sequences'))}"
            f"<br>95% CI [{_f(lo)}, {_f(hi)}]"
            + (f"<br>not fitted: {why[1]}" if why else "")
        )
        if why:
            reasons.setdefault(why[0], None)
        pts.append(
            (
                x,
                y,
                max(y - lo, 0.0) if _is_num(lo) else None,
                max(hi - y, 0.0) if _is_num(hi) else None,
                text,
                bool(b.get("in_fit", True)),
            )
        )
    if not pts:
        raise ReportUnavailable("no entropy bin has a positive mean H and mean δ²")
    xs = [p[0] for p in pts]
    fig = _fig_base(height=590)
    finer = ((fit.get("laws") or {}).get("grid") == "breakpoint")  # fitted on finer bins
    for in_fit, label, sym in (
        (True, "mean δ² per bin, in the law regime" if finer
         else "mean δ² per bin, used in the fit", "circle"),
        (False, "mean δ² per bin, outside the law regime" if finer
         else "mean δ² per bin, not fitted" + (f" ({', '.join(reasons)})" if reasons else ""),
         "circle-open"),
    ):
        sel = [p for p in pts if p[5] is in_fit]
        if not sel:
            continue
        fig.add_trace(
            go.Scatter(
                x=[p[0] for p in sel],
                y=[p[1] for p in sel],
                mode="markers",
                name=label,
                marker=dict(size=7, color="#111827", symbol=sym, line=dict(width=1.5)),
                error_y=dict(
                    type="data",
                    symmetric=False,
                    array=[p[3] or 0 for p in sel],
                    arrayminus=[p[2] or 0 for p in sel],
                    thickness=1.2,
                    width=3,
                    color="#6b7280",
                ),
                text=[p[4] for p in sel],
                hovertemplate="mean H %{x:.3g}<br>mean δ² %{y:.3g}<br>%{text}<extra></extra>",
            )
        )
    lx = [math.log10(x) for x in xs]
    # laws are drawn over the fitted entropy range (laws.power.h_range, else all bins); the
    # power law is also extended, thin and dotted, over the bins outside it for reference
    h_range = _get(fit, "laws", "power", "h_range")
    f_lo, f_hi = min(lx), max(lx)
    if (
        isinstance(h_range, Sequence)
        and len(h_range) == 2
        and all(_is_num(v) and v > 0 for v in h_range)
    ):
        f_lo = max(f_lo, math.log10(h_range[0]))
        f_hi = min(f_hi, math.log10(h_range[1]))
        if f_hi <= f_lo:
            f_lo, f_hi = min(lx), max(lx)
    grid = [10 ** (f_lo + (f_hi - f_lo) * i / 80) for i in range(81)]
    styles = {
        "power": ("solid", "#2563eb"),
        "proportional": ("dash", "#059669"),
        "affine": ("dot", "#d97706"),
    }
    laws = _law_params(fit)
    if "power" in laws and (f_lo > min(lx) + 1e-9 or f_hi < max(lx) - 1e-9):
        full = [10 ** (min(lx) + (max(lx) - min(lx)) * i / 80) for i in range(81)]
        ys_full = _law_curve("power", laws["power"], full)
        if ys_full is not None:
            fig.add_trace(
                go.Scatter(
                    x=full,
                    y=ys_full,
                    mode="lines",
                    name="power law beyond its fitted range",
                    hoverinfo="skip",
                    line=dict(width=1, dash="dot", color="#93c5fd"),
                )
            )
    for name, law in laws.items():
        ys_law = _law_curve(name, law, grid)
        if ys_law is None:
            continue
        seg = [(x, y) for x, y in zip(grid, ys_law, strict=False) if y > 0]
        if not seg:
            continue
        dash, color = styles.get(name, ("dashdot", "#7c3aed"))
        fig.add_trace(
            go.Scatter(
                x=[p[0] for p in seg],
                y=[p[1] for p in seg],
                mode="lines",
                name="<br>".join(_e(p) for p in _law_label(name, law).split("\n")),
                hoverinfo="skip",
                line=dict(width=2, dash=dash, color=color),
            )
        )
    bp = fit.get("breakpoint")
    h_star = _get(bp, "h_star")
    if _is_num(h_star) and h_star > 0:
        lo, hi = _interval(bp, "h_star")
        fig.add_vrect(x0=min(xs) / 3, x1=h_star, fillcolor=_NOISE_FILL, line_width=0, layer="below")
        if _is_num(lo) and _is_num(hi) and 0 < lo < hi:
            fig.add_vrect(
                x0=lo, x1=hi, fillcolor="rgba(185,28,28,0.14)", line_width=0, layer="below"
            )
        fig.add_vline(x=h_star, line=dict(color="#b91c1c", width=1.5, dash="dash"))
        fig.add_annotation(
            x=math.log10(h_star),
            y=1,
            yref="paper",
            xanchor="left",
            yanchor="bottom",
            showarrow=False,
            text=f" H* = {_h_text(fit, h_star, lo, hi)}",
            font=dict(color="#b91c1c", size=12),
        )
        fig.add_annotation(
            x=math.log10(min(xs)),
            y=1,
            yref="paper",
            xanchor="left",
            yanchor="top",
            showarrow=False,
            text="noise regime",
            font=dict(color="#b91c1c", size=11),
        )
    fig.update_xaxes(
        type="log",
        title_text=f"entropy H ({_h_unit(fit)}, bin mean)",
        exponentformat="power",
        dtick=1,
        range=[min(lx) - 0.3, max(lx) + 0.2],
    )
    fig.update_yaxes(type="log", title_text="mean δ² (nats²)", exponentformat="power", dtick=1)
    fig.update_layout(  # below the axes: inside them it hid the lowest-entropy bins
        legend=dict(x=0, xanchor="left", y=-0.2, yanchor="top", font=dict(size=11)),
        margin=dict(t=40, b=180),
    )
    return fig


def _decade_ticks(
    lo_log: float, hi_log: float, floor_pos: float | None
) -> tuple[list[float], list[str]]:
    """Tick values/labels (10^k) on a log10-valued axis, plus a "0" tick for the floor bin."""
    vals: list[float] = []
    texts: list[str] = []
    if floor_pos is not None:
        vals.append(floor_pos)
        texts.append("0")
    for k in range(math.ceil(lo_log), math.floor(hi_log) + 1):
        if floor_pos is not None and abs(k - floor_pos) < 0.45:
            continue
        vals.append(k)
        texts.append({0: "1", 1: "10"}.get(k, f"10<sup>{k}</sup>"))
    return vals, texts


def _density_fig(prof: dict, params: Mapping[str, Any], h_star: Any = None,
                 h_unit: str = "nats") -> go.Figure:
    d = _pick(prof, "density_2d", "density")
    if not d:
        raise ReportUnavailable("no density profile was computed")
    if not d.get("available", True):
        raise ReportUnavailable(str(d.get("reason") or "no data"))
    he, de, counts = d["h_edges"], d["abs_delta_edges"], d["counts"]

    # axes in log10 space; the floor bin [0, lo) drawn one bin wide below log10(lo)
    def log_edges_axis(edges: Sequence[float]) -> list[float]:
        logs = [math.log10(e) for e in edges[1:]]
        w = logs[1] - logs[0] if len(logs) > 1 else 1.0
        return [logs[0] - w, *logs]

    hx, dy = log_edges_axis(he), log_edges_axis(de)
    # trim empty margins so the populated area fills the plot
    nz_i = [i for i, r in enumerate(counts) if any(r)]
    nz_j = [j for j in range(len(counts[0])) if any(r[j] for r in counts)]
    if not nz_i:
        raise ReportUnavailable("no token in the histogram")
    i0, i1 = nz_i[0], nz_i[-1]
    j0, j1 = nz_j[0], nz_j[-1]
    z = [
        [math.log10(counts[i][j]) if counts[i][j] > 0 else None for i in range(i0, i1 + 1)]
        for j in range(j0, j1 + 1)
    ]
    raw = [[counts[i][j] for i in range(i0, i1 + 1)] for j in range(j0, j1 + 1)]
    xe, ye = hx[i0 : i1 + 2], dy[j0 : j1 + 2]
    zmax = max((v for row in z for v in row if v is not None), default=1.0)
    cb_vals = list(range(0, int(math.floor(zmax)) + 1))
    fig = _fig_base(height=460)
    fig.add_trace(
        go.Heatmap(
            x=xe,
            y=ye,
            z=z,
            customdata=raw,
            colorscale="Viridis",
            zmin=0,
            zmax=max(zmax, 1),
            colorbar=dict(
                title=dict(text="tokens", side="right"),
                tickvals=cb_vals,
                ticktext=[f"{10**v:,}" if v < 4 else f"1e{v}" for v in cb_vals],
                thickness=14,
            ),
            hovertemplate="log10 H %{x:.2f}<br>log10 |δ| %{y:.2f}<br>tokens %{customdata:,}"
            "<extra></extra>",
            hoverongaps=False,
        )
    )
    tau, eps = params.get("tau"), params.get("eps")
    if _is_num(tau) and _is_num(eps) and tau > 0:
        # the ENTR boundary |delta| = sqrt(tau (H + eps)) (arXiv:2607.22186)
        xs = [xe[0] + (xe[-1] - xe[0]) * i / 80 for i in range(81)]
        ys = [math.log10(math.sqrt(tau * (10**x + eps))) for x in xs]
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=ys,
                mode="lines",
                name=_e(f"ENTR bound τ={_f(tau)}"),
                line=dict(color="#f97316", width=2, dash="dash"),
            )
        )
    if _is_num(h_star) and h_star > 0 and xe[0] <= math.log10(h_star) <= xe[-1]:
        fig.add_vline(x=math.log10(h_star), line=dict(color="#b91c1c", width=1.5, dash="dash"))
        fig.add_annotation(
            x=math.log10(h_star),
            y=1,
            yref="paper",
            xanchor="left",
            yanchor="bottom",
            showarrow=False,
            text=f" H* = {_f(h_star)}" + ("" if h_unit == "nats" else f" ({h_unit})"),
            font=dict(color="#b91c1c", size=12),
        )
    xt = _decade_ticks(
        xe[1] if i0 == 0 else xe[0], xe[-1], (xe[0] + xe[1]) / 2 if i0 == 0 else None
    )
    yt = _decade_ticks(
        ye[1] if j0 == 0 else ye[0], ye[-1], (ye[0] + ye[1]) / 2 if j0 == 0 else None
    )
    fig.update_xaxes(
        # (two lines: in a half-width column an entropy in bits clipped one line at both ends)
        title_text=f"entropy H ({h_unit}, log scale)<br>'0' = below {_f(he[1])}",
        tickvals=xt[0],
        ticktext=xt[1],
        range=[xe[0], xe[-1]],
        showgrid=False,
    )
    fig.update_yaxes(
        title_text="|δ| (nats, log scale)",
        tickvals=yt[0],
        ticktext=yt[1],
        range=[ye[0], ye[-1]],
        showgrid=False,
    )
    fig.update_layout(
        showlegend=bool(_is_num(tau)),
        legend=dict(orientation="h", x=0, y=1.02, xanchor="left", yanchor="bottom"),
        margin=dict(t=40, b=90),
    )
    return fig


# ----------------------------------------------------------------------------- 3 by p


def _prob_fig(prof: dict) -> go.Figure:
    d = _pick(prof, "mismatch_by_prob", "by_prob")
    if not d:
        raise ReportUnavailable("no profile by sampled-token probability was computed")
    if not d.get("available", True):
        raise ReportUnavailable(str(d.get("reason") or "no data"))
    bins = [b for b in d["bins"] if b.get("tokens")]
    if not bins:
        raise ReportUnavailable("no tokens")
    centers = _log_centers(d["edges"])
    by_lo = {b["p_lo"]: i for i, b in enumerate(d["bins"])}
    xs = [centers[by_lo[b["p_lo"]]] for b in bins]
    n_total = d.get("n_tokens") or sum(b["tokens"] for b in bins)
    label = [
        (f"p < {_f(b['p_hi'])}" if b["p_lo"] == 0 else f"p ∈ [{_f(b['p_lo'])}, {_f(b['p_hi'])})")
        + f"<br>tokens {b['tokens']:,}"
        for b in bins
    ]
    fig = make_subplots(
        rows=1,
        cols=3,
        horizontal_spacing=0.08,
        subplot_titles=(
            "mean |δ| and mean δ² (log scale)",
            "signed mean δ",
            "share of tokens and of δ² mass",
        ),
    )
    fig.update_layout(template=_TEMPLATE, height=400, margin=dict(t=50, b=100))
    series = (
        (1, "mean_abs_delta", "mean |δ| (nats)", "#2563eb"),
        (1, "mean_delta_sq", "mean δ² (nats²)", "#7c3aed"),
        (2, "mean_delta", "mean δ, signed (nats)", "#dc2626"),
    )
    for col, key, name, color in series:
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=_nums(b.get(key) for b in bins),
                name=name,
                mode="lines+markers",
                marker=dict(size=5, color=color),
                line=dict(color=color),
                text=label,
                hovertemplate="%{text}<br>" + name + " %{y:.3g}<extra></extra>",
            ),
            row=1,
            col=col,
        )
    fig.add_trace(
        go.Scatter(
            x=xs,
            y=[b["tokens"] / n_total if n_total else None for b in bins],
            name="share of tokens",
            mode="lines+markers",
            marker=dict(size=5, color="#6b7280"),
            line=dict(color="#6b7280", dash="dot"),
            text=label,
            hovertemplate="%{text}<br>share of tokens %{y:.2%}<extra></extra>",
        ),
        row=1,
        col=3,
    )
    fig.add_trace(
        go.Scatter(
            x=xs,
            y=_nums(b.get("delta_sq_share") for b in bins),
            name="share of δ² mass",
            mode="lines+markers",
            marker=dict(size=5, color="#d97706"),
            line=dict(color="#d97706"),
            fill="tozeroy",
            fillcolor="rgba(217,119,6,0.12)",
            text=label,
            hovertemplate="%{text}<br>share of δ² mass %{y:.2%}<extra></extra>",
        ),
        row=1,
        col=3,
    )
    fig.update_xaxes(
        type="log", title_text="p = exp(infer_logprob)", exponentformat="power", dtick=1
    )
    fig.update_yaxes(type="log", exponentformat="power", dtick=1, row=1, col=1)
    fig.update_yaxes(zeroline=True, zerolinecolor="#9ca3af", row=1, col=2)
    fig.update_yaxes(tickformat=".0%", rangemode="tozero", row=1, col=3)
    fig.update_layout(legend=dict(orientation="h", y=-0.3, x=0))
    return fig


# ----------------------------------------------------------------------------- 4 gates


def _gate_name(g: Mapping[str, Any]) -> str:
    return str(_pick(g, "label", "spec", "name", default="gate"))


def _gate_color(i: int, g: Mapping[str, Any]) -> str:
    """Colour of the gate at index ``i`` of ``compare["gates"]`` (ENTR always blue); the
    same in every gate figure."""
    if _is_entr(g):
        return _ENTR_COLOR
    return _PALETTE[1 + (i - 1) % (len(_PALETTE) - 1)]


_MATCHED_COLOR = "#111827"


def _gate_legend(n: int) -> dict[str, Any]:
    """Legend below a gate figure, sized for ``n`` entries in two columns."""
    return dict(
        orientation="h",
        x=0,
        y=-0.2,
        yanchor="top",
        entrywidth=0.5,
        entrywidthmode="fraction",
        font=dict(size=11),
    )


def _is_entr(g: Mapping[str, Any]) -> bool:
    n = str(_pick(g, "name", "spec", "label", default="")).lower()
    return n.startswith("entr") or n.startswith("estr")


def _gates(compare: dict | None) -> list[dict]:
    if not compare:
        raise ReportUnavailable(
            "no gate comparison (the data carry no entropy, or compare was not run)"
        )
    gates = compare.get("gates")
    if not gates:
        raise ReportUnavailable("the comparison holds no gate")
    return [g for g in gates if isinstance(g, Mapping)]


def _centers_open(edges: Sequence[Any]) -> list[float | None]:
    """x positions (geometric centers) for bins ``[e_i, e_{i+1})`` of a log axis; a bin whose
    lower edge is <= 0 is drawn half a decade below its upper edge."""
    out: list[float | None] = []
    for lo, hi in zip(edges[:-1], edges[1:], strict=False):
        if _is_num(lo) and _is_num(hi) and lo > 0 and hi > 0:
            out.append(math.sqrt(lo * hi))
        elif _is_num(hi) and hi > 0:
            out.append(hi / math.sqrt(10))
        else:
            out.append(None)
    return out


def _keep_vs_entropy_fig(compare: dict | None) -> go.Figure:
    gates = _gates(compare)
    fig = _fig_base(height=430)
    drawn = 0
    for i, g in enumerate(gates):
        b = g.get("keep_by_entropy")
        if not isinstance(b, Mapping) or not b.get("edges") or not b.get("keep_rate"):
            continue
        xs = _centers_open(b["edges"])
        pts = [
            (x, y, k, n)
            for x, y, k, n in zip(
                xs, b["keep_rate"], b.get("keys", xs), b.get("n", [None] * len(xs)), strict=False
            )
            if x is not None and _is_num(y) and (n is None or n > 0)
        ]
        if not pts:
            continue
        drawn += 1
        entr = _is_entr(g)
        fig.add_trace(
            go.Scatter(
                x=[p[0] for p in pts],
                y=[p[1] for p in pts],
                mode="lines+markers",
                name=_e(_gate_name(g)),
                customdata=[[str(p[2]), p[3]] for p in pts],
                line=dict(
                    width=3.5 if entr else 1.6,
                    color=_gate_color(i, g),
                ),
                marker=dict(size=6 if entr else 4),
                hovertemplate="H bin %{customdata[0]}<br>tokens %{customdata[1]:,}"
                "<br>keep rate %{y:.3%}<extra>" + _e(_gate_name(g)) + "</extra>",
            )
        )
    if not drawn:
        raise ReportUnavailable(_entr_missing(compare) or "the gates carry no keep rate per "
                                "entropy bin")
    fig.update_xaxes(type="log", title_text=f"entropy H ({_compare_h_unit(compare)})",
                     exponentformat="power", dtick=1)
    fig.update_yaxes(title_text="keep rate (share of tokens kept)", tickformat=".1~%",
                     range=_flat_range(y for t in fig.data for y in t.y))
    fig.update_layout(legend=_gate_legend(len(fig.data)), margin=dict(b=200, t=20), height=560)
    return fig


def _entr_missing(compare: dict | None) -> str | None:
    """Why ENTR is not in ``compare`` (e.g. no entropy column), None when it is."""
    for u in (compare or {}).get("unavailable") or ():
        if isinstance(u, Mapping) and u.get("name") == "entr":
            return f"ENTR is unavailable: {u.get('reason') or 'not simulated'}"
    return None


def _matched_budget(compare: Mapping) -> str:
    """How the matched band's drops compare with ENTR's: equal, or (tied |delta| values at
    c, e.g. bf16 logprobs, are kept or dropped together) both counts."""
    m = compare.get("matched") or {}
    fd, ed = m.get("fixed_dropped"), m.get("entr_dropped")
    if not isinstance(fd, int) or not isinstance(ed, int) or fd == ed:
        return "drops as many tokens as ENTR"
    return (f"drops {fd:,} tokens against ENTR's {ed:,}: the tightest band keeping as many, "
            "tied |delta| values kept together")


def _agreement_html(compare: dict | None) -> str:
    if why := _entr_missing(compare):
        return _unavail(why)
    try:
        gates = _gates(compare)
    except ReportUnavailable as exc:
        return _unavail(str(exc))
    rows = []
    for g in gates[1:]:
        a = g.get("agreement_vs_entr")
        if isinstance(a, Mapping):
            rows.append(
                (
                    _gate_name(g),
                    a.get("both_keep"),
                    a.get("only_entr_keeps"),
                    a.get("only_other_keeps"),
                    a.get("both_drop"),
                )
            )
    m = _get(compare, "matched", "fixed")
    if isinstance(m, Mapping) and isinstance(m.get("agreement_vs_entr"), Mapping):
        a = m["agreement_vs_entr"]
        rows.append(
            (
                f"{_gate_name(m)} (matched: {_matched_budget(compare)})",
                a.get("both_keep"),
                a.get("only_entr_keeps"),
                a.get("only_other_keeps"),
                a.get("both_drop"),
            )
        )
    if not rows:
        return _unavail("no gate besides ENTR to compare with")
    return (
        '<p class="how"><b>How to read this:</b> token counts of each gate against ENTR; the '
        'two "only" columns are the tokens the rules disagree on (where they sit in entropy: '
        "the figure below).</p>"
        + _table(
            ["gate", "both keep", "only ENTR keeps", "only this gate keeps", "both drop"],
            rows,
            {1, 2, 3, 4},
        )
    )


def _disagreement_fig(compare: dict | None) -> go.Figure:
    """Disagreements of ENTR with the keep-rate-matched fixed band, per entropy bin."""
    if why := _entr_missing(compare):
        raise ReportUnavailable(why)
    m = _get(compare, "matched") if compare else None
    a = _get(m, "fixed", "agreement_vs_entr")
    be = _get(a, "by_entropy")
    if not isinstance(be, Mapping) or not be.get("edges"):
        raise ReportUnavailable("no matched fixed band in the comparison")
    xs = _centers_open(be["edges"])
    keys = be.get("keys") or [""] * len(xs)
    if not any(
        _is_num(v) and v > 0
        for k in ("only_entr_keeps", "only_other_keeps")
        for v in be.get(k) or []
    ):
        raise ReportUnavailable(
            f"ENTR and the matched fixed band (c = {_f(_get(m, 'c'))} nats) keep exactly the "
            "same tokens: no disagreement to show"
        )
    fig = _fig_base(height=380)
    for key, label, color in (
        ("only_entr_keeps", "only ENTR keeps", _ENTR_COLOR),
        ("only_other_keeps", f"only the fixed band keeps (c = {_f(_get(m, 'c'))})", "#dc2626"),
    ):
        ys = be.get(key) or []
        pts = [
            (x, y, str(k))
            for x, y, k in zip(xs, ys, keys, strict=False)
            if x is not None and _is_num(y)
        ]
        fig.add_trace(
            go.Scatter(
                x=[p[0] for p in pts],
                y=[p[1] for p in pts],
                customdata=[p[2] for p in pts],
                name=_e(label),
                mode="lines+markers",
                line=dict(color=color, shape="hvh"),
                marker=dict(size=5, color=color),
                fill="tozeroy",
                hovertemplate="H bin %{customdata}<br>%{y:,} tokens<extra>"
                + _e(label)
                + "</extra>",
            )
        )
    fig.update_layout(
        legend=dict(orientation="h", y=1.02, yanchor="bottom", x=0), margin=dict(t=40)
    )
    fig.update_xaxes(
        title_text=f"entropy H ({_compare_h_unit(compare)}, bin centre)", type="log",
        exponentformat="power", dtick=1
    )
    fig.update_yaxes(title_text="tokens", rangemode="tozero")
    return fig


def _gate_summary_html(compare: dict | None) -> str:
    try:
        gates = _gates(compare)
    except ReportUnavailable as exc:
        return _unavail(str(exc))
    allg = list(gates)
    m = _get(compare, "matched", "fixed")
    if isinstance(m, Mapping):
        allg.append(dict(m, label=f"{_gate_name(m)} (matched)"))
    rows = []
    for g in allg:
        tis = g.get("tis")
        note = ""
        if isinstance(tis, Mapping):
            seqs = tis.get("truncated_sequences")
            note = (
                f"weights truncated at C={_f(tis.get('cap'))}: "
                + (f"{seqs:,} sequences ({_pct(tis.get('truncated_share'))} of tokens), "
                   if isinstance(seqs, int) else f"{_pct(tis.get('truncated_share'))} of tokens, ")
                + f"{_pct(tis.get('weight_mass_removed'))} of weight mass removed"
            )
        rows.append(
            (
                _gate_name(g),
                g.get("level") or "",
                _pct(g.get("kept_share")),
                _f(g.get("dropped_tokens")),
                _pct(g.get("kept_sequence_share")),
                _pct(g.get("noise_admitted"))
                + (" (by definition)" if noise_by_definition(
                    g, (compare or {}).get("parameters") or {}) else ""),
                _pct(g.get("exploration_discarded")),
                note,
            )
        )
    reasons = compare.get("null_reasons") if compare else None
    foot = ""
    if isinstance(reasons, Mapping) and reasons:
        foot = "<p class='how'>" + " ".join(_e(x) for x in null_reason_lines(reasons)) + "</p>"
    return (
        _table(
            [
                "gate",
                "level",
                "tokens kept",
                "tokens dropped",
                "sequences kept",
                "noise admitted",
                "exploration discarded",
                "note",
            ],
            rows,
            {2, 3, 4, 5, 6},
        )
        + foot
    )


def _noise_vs_expl_fig(compare: dict | None) -> go.Figure:
    gates = _gates(compare)
    pts = []
    allg = list(gates)
    m = _get(compare, "matched", "fixed")
    if isinstance(m, Mapping):
        allg.append(dict(m, label=f"{_gate_name(m)} (matched)"))
    for i, g in enumerate(allg):
        na, ed = g.get("noise_admitted"), g.get("exploration_discarded")
        if _is_num(na) and _is_num(ed):
            matched = i == len(gates)
            color = _MATCHED_COLOR if matched else _gate_color(i, g)
            symbol = "star" if _is_entr(g) else ("diamond" if matched else "circle")
            pts.append((_gate_name(g), ed, na, _is_entr(g), color, symbol))
    if not pts:
        expl = [
            (_gate_name(g), g["exploration_discarded"], i)
            for i, g in enumerate(gates)
            if _is_num(g.get("exploration_discarded"))
        ]
        if expl:
            # no noise regime: only the exploration side of the trade-off exists
            fig = _fig_base(height=max(300, 90 + 28 * len(expl)))
            fig.add_trace(
                go.Bar(
                    y=[_e(n) for n, _, _ in expl],
                    x=[v for _, v, _ in expl],
                    orientation="h",
                    marker_color=[_gate_color(i, gates[i]) for _, _, i in expl],
                    hovertemplate="%{y}<br>exploration discarded %{x:.3%}<extra></extra>",
                )
            )
            fig.update_xaxes(
                title_text="exploration discarded", tickformat=".2~%", rangemode="tozero"
            )
            fig.update_yaxes(autorange="reversed", automargin=True, showgrid=False)
            fig.update_layout(
                showlegend=False,
                margin=dict(t=40, l=10),
                title=dict(
                    text="no noise regime: exploration discarded only",
                    font=dict(size=12, color="#6b7280"),
                    x=0.01,
                ),
            )
            return fig
        reasons = (compare or {}).get("null_reasons") or {}
        why = "; ".join(str(v) for v in reasons.values())
        raise ReportUnavailable(
            why or "the gates carry no noise-admitted / exploration-discarded shares"
        )
    fig = _fig_base(height=430)
    # gates on one point (e.g. every gate keeping everything at (0%, 100%)) hide each
    # other: each one's hover names the others there
    at: dict[tuple[float, float], list[str]] = {}
    for name, ed, na, *_ in pts:
        at.setdefault((ed, na), []).append(name)
    for name, ed, na, entr, color, symbol in pts:
        others = [o for o in at[(ed, na)] if o != name]
        also = ("<br>at the same point: " + _e(", ".join(others))) if others else ""
        fig.add_trace(
            go.Scatter(
                x=[ed],
                y=[na],
                mode="markers",
                name=_e(name),
                marker=dict(
                    size=16 if entr else 11,
                    symbol=symbol,
                    color=color,
                    line=dict(width=1, color="white"),
                ),
                hovertemplate=_e(name) + "<br>exploration discarded %{x:.3%}"
                "<br>noise admitted %{y:.3%}" + also + "<extra></extra>",
            )
        )
    # pad both axes so markers at 0 (ENTR often sits at the origin) are not cut by the axes
    x_max = max(max(p[1] for p in pts), 1e-4)
    y_max = max(max(p[2] for p in pts), 1e-4)
    fig.update_traces(cliponaxis=False)
    fig.update_xaxes(
        title_text="exploration discarded (share of in-law tokens dropped)",
        tickformat=".2~%",
        range=[-0.05 * x_max, 1.08 * x_max],
    )
    fig.update_yaxes(
        title_text="noise admitted (share of noise tokens kept)",
        tickformat=".1~%",
        range=[-0.05 * y_max, 1.08 * y_max],
    )
    fig.update_layout(legend=_gate_legend(len(fig.data)), margin=dict(b=200, t=20), height=560)
    return fig


def _decimal_log_ticks(lo: float, hi: float) -> list[float]:
    """1-2-5 tick values spanning [lo, hi] (plain decimals on a log axis)."""
    ticks = [
        m * 10.0**e for e in range(-6, 7) for m in (1, 2, 5) if lo <= m * 10.0**e <= hi * 1.0001
    ]
    return ticks if len(ticks) >= 2 else [lo, hi]


def _sweep_fig(compare: dict | None) -> go.Figure:
    if not compare:
        raise ReportUnavailable("no gate comparison (compare was not run)")
    sweep = compare.get("sweep")
    if not isinstance(sweep, Mapping) or not sweep:
        raise ReportUnavailable("no budget sweep in the comparison")
    series = [(k, v) for k, v in sweep.items() if isinstance(v, Mapping) and v.get("values")]
    if not series:
        raise ReportUnavailable("the sweep holds no points")
    titles = []
    for k, v in series:
        unit = " (nats)" if k == "c" else ""
        titles.append(_e(f"{v.get('gate', k)}: sweep of {v.get('parameter', k)}{unit}"))
    fig = make_subplots(
        rows=1, cols=len(series), shared_yaxes=True, subplot_titles=titles, horizontal_spacing=0.06
    )
    fig.update_layout(template=_TEMPLATE, height=400, margin=dict(t=50, b=90))
    metrics_ = (
        ("keep_rate", "keep rate", "#2563eb"),
        ("noise_admitted", "noise admitted", "#dc2626"),
        ("exploration_discarded", "exploration discarded", "#059669"),
    )
    params = compare.get("parameters") or {}
    for c, (k, v) in enumerate(series, start=1):
        xs = _nums(v["values"])
        for key, label, color in metrics_:
            ys = v.get(key) or []
            if not any(_is_num(y) for y in ys):
                continue
            fig.add_trace(
                go.Scatter(
                    x=xs,
                    y=_nums(ys),
                    mode="lines+markers",
                    name=label,
                    line=dict(color=color),
                    marker=dict(size=4),
                    legendgroup=key,
                    showlegend=c == 1,
                    hovertemplate=_e(v.get("parameter", k))
                    + " %{x:.3g}<br>"
                    + label
                    + " %{y:.3%}<extra></extra>",
                ),
                row=1,
                col=c,
            )
        finite = [x for x in xs if _is_num(x) and x > 0]
        ticks = _decimal_log_ticks(min(finite), max(finite)) if finite else []
        fig.update_xaxes(
            title_text=_e(str(v.get("parameter", k))) + (" (nats)" if k == "c" else ""),
            type="log",
            tickvals=ticks,
            ticktext=[f"{t:g}" for t in ticks],
            range=(
                [math.log10(min(finite)) - 0.05, math.log10(max(finite)) + 0.05] if finite else None
            ),
            row=1,
            col=c,
        )
        # shapes on a log axis take data values, annotations log10 of them (add_vline's
        # own annotation would put "tau = 4" at 10^4)
        c_m = _get(compare, "matched", "c")
        mark = (params.get("tau"), "tau = {:g}") if k == "tau" else (
            (c_m, "matched c = {:.3g}") if k == "c" else (None, ""))
        if _is_num(mark[0]) and mark[0] > 0:
            fig.add_vline(x=mark[0], line=dict(color="#6b7280", dash="dot"), row=1, col=c)
            # inside the plot, mid-height (above it the subplot title sits), on the side of
            # the line with more room
            lx = math.log10(mark[0])
            lo_x, hi_x = ((math.log10(min(finite)), math.log10(max(finite))) if finite
                          else (lx - 1, lx + 1))
            right = lx > (lo_x + hi_x) / 2
            fig.add_annotation(x=lx, y=0.5, yref="y domain", row=1, col=c,
                               text=" " + mark[1].format(mark[0]) + " ", showarrow=False,
                               xanchor="right" if right else "left", yanchor="middle",
                               bgcolor="rgba(255,255,255,0.85)", font=dict(size=11))
    fig.update_yaxes(tickformat=".0%", row=1, col=1, title_text="share", range=[0, 1.02])
    fig.update_layout(legend=dict(orientation="h", y=-0.25, x=0))
    return fig


# ----------------------------------------------------------------------------- 5 training


def _flat_range(ys: Iterable[Any]) -> list[float] | None:
    """A y range for values that are all one number ``v`` (one step, every gate keeping
    everything), which plotly would centre on a span of its own choosing (0 to 200% for a
    keep rate of 100%, -1 to 1 around a KL of 4e-4, where it reads as 0): from 0 to twice
    ``v`` (0 to 1 for 0); None when the values differ or none is a number."""
    vals = {float(y) for y in ys if _is_num(y)}
    if len(vals) != 1:
        return None
    v = vals.pop()
    return [0.0, 1.0] if v == 0 else sorted([0.0, 1.05 * v]) if abs(v) >= 0.5 else \
        sorted([0.0, 2.0 * v])


def _metrics_fig(metrics: dict | None) -> go.Figure:
    if not metrics:
        raise ReportUnavailable("no mismatch metrics")
    rows = _rows(metrics.get("per_step"))
    rows = [r for r in rows if _is_num(r.get("step"))]
    if not rows:
        raise ReportUnavailable("no per-step metrics (the data carry no step column)")
    rows.sort(key=lambda r: r["step"])
    panels = (
        ("kl", "k1 KL = mean(−δ)"),
        ("k3_kl", "k3 KL"),
        ("chi2_token", "χ² (token)"),
        ("ess", "ESS (normalized)"),
    )
    fig = make_subplots(
        rows=2,
        cols=2,
        shared_xaxes=True,
        vertical_spacing=0.14,
        horizontal_spacing=0.09,
        subplot_titles=[
            t
            + (
                f" · overall {_f(_get(metrics, 'overall', k))}"
                if _is_num(_get(metrics, "overall", k))
                else ""
            )
            for k, t in panels
        ],
    )
    fig.update_layout(template=_TEMPLATE, height=520, showlegend=False, margin=dict(t=50))
    steps = [r["step"] for r in rows]
    any_drawn = False
    for idx, (key, title) in enumerate(panels):
        cands = (
            (key, "ess_token", "ess_ratio", "effective_sample_size")
            if key == "ess"
            else ((key, "k1", "k1_kl") if key == "kl" else (key,))
        )
        ys = [_pick(r, *cands) for r in rows]
        rr, cc = idx // 2 + 1, idx % 2 + 1
        if any(_is_num(y) for y in ys):
            any_drawn = True
            fig.add_trace(
                go.Scatter(
                    x=steps,
                    y=_nums(ys),
                    mode="lines+markers",
                    name=title,
                    marker=dict(size=4),
                    line=dict(color=_PALETTE[idx]),
                ),
                row=rr,
                col=cc,
            )
            flat = _flat_range(ys)
            if flat is not None:
                fig.update_yaxes(range=flat, row=rr, col=cc)
        else:
            fig.add_annotation(
                text="unavailable",
                showarrow=False,
                row=rr,
                col=cc,
                xref="x domain",
                yref="y domain",
                x=0.5,
                y=0.5,
            )
        if rr == 2:
            fig.update_xaxes(title_text="trainer step", row=rr, col=cc)
    if not any_drawn:
        raise ReportUnavailable("the per-step metrics carry none of kl, k3_kl, chi2_token, ess")
    fig.update_yaxes(tickformat="~g")  # plain decimals, not SI prefixes (600µ)
    return fig


def _keep_by_staleness_html(compare: dict | None) -> str:
    """The keep rate of every token gate per staleness bucket (``keep_by_staleness`` of
    the gates, as ``compare`` prints it), with the bucket's tokens: whether a gate drops the
    stale tokens more than the fresh ones. '' when the comparison has none (no version
    columns)."""
    try:
        gates = [g for g in _gates(compare) if isinstance(g.get("keep_by_staleness"), Mapping)
                 and not g.get("tis")]
    except ReportUnavailable:  # (the gates' section says why)
        return ""
    if not gates:
        return ""
    kb = gates[0]["keep_by_staleness"]
    keys, ns = list(kb.get("keys") or []), list(kb.get("n") or [])
    names = [str(g.get("name")) for g in gates]
    cols = [_gate_name(g) if names.count(str(g.get("name"))) > 1 else str(g.get("name"))
            for g in gates]
    rows = []
    for j, key in enumerate(keys):
        if j >= len(ns) or not ns[j]:
            continue
        rates = [(g["keep_by_staleness"].get("keep_rate") or [None] * len(keys)) for g in gates]
        rows.append([str(key), ns[j], *[_pct(r[j]) if j < len(r) and _is_num(r[j]) else "-"
                                         for r in rates]])
    if not rows:
        return ""
    unit = _get(compare, "parameters", "staleness_unit")
    head = "staleness" + (f" (lags of {unit:,})" if isinstance(unit, int) and unit > 1 else "")
    return ('<h3>Keep rate by staleness</h3><p class="how"><b>How to read this:</b> the share '
            "of each staleness bucket's tokens (train_version − policy_version, in policy "
            "versions) every token gate keeps; a gate that drops stale tokens far more than "
            "fresh ones is reacting to policy drift, not to numeric noise.</p>"
            + _table([head, "tokens", *cols], rows, {1, *range(2, 2 + len(cols))}))


def _masked_share_fig(compare: dict | None) -> go.Figure:
    gates = _gates(compare)
    fig = _fig_base(height=420)
    drawn = 0
    for i, g in enumerate(gates):
        b = g.get("keep_by_step")
        if not isinstance(b, Mapping):
            continue
        pts = sorted(
            (s, 1.0 - kr)
            for s, kr, n in zip(
                b.get("keys") or [], b.get("keep_rate") or [], b.get("n") or [], strict=False
            )
            if _is_num(s) and _is_num(kr) and n
        )
        if not pts:
            continue
        drawn += 1
        entr = _is_entr(g)
        fig.add_trace(
            go.Scatter(
                x=[p[0] for p in pts],
                y=[p[1] for p in pts],
                mode="lines+markers",
                name=_e(_gate_name(g)),
                marker=dict(size=4),
                line=dict(
                    width=3.5 if entr else 1.6,
                    color=_gate_color(i, g),
                ),
                hovertemplate="step %{x}<br>masked %{y:.3%}<extra>"
                + _e(_gate_name(g))
                + "</extra>",
            )
        )
    if not drawn:
        raise ReportUnavailable(
            "the gates carry no per-step keep rates (the data carry no step column)"
        )
    fig.update_xaxes(title_text="trainer step")
    fig.update_yaxes(
        title_text="masked share (tokens dropped)", tickformat=".2~%", rangemode="tozero"
    )
    fig.update_layout(legend=_gate_legend(len(fig.data)), margin=dict(b=200, t=20), height=560)
    return fig


def _strata_fig(fit: dict | None, why: str | None = None) -> go.Figure:
    if not fit:
        raise _no_fit(why)
    strata = fit.get("strata")
    if not isinstance(strata, Mapping):
        raise ReportUnavailable("the fit has no strata")
    notices = "; ".join(str(n) for n in strata.get("notices") or [])
    panels = [
        (kind, title, [r for r in strata.get(kind) or [] if isinstance(r, Mapping)])
        for kind, title in (
            ("staleness", "staleness buckets"),
            ("step", "step ranges"),
        )
    ]
    panels = [p for p in panels if any(_is_num(_pick(r, "k_proportional", "k")) for r in p[2])]
    if not panels:
        raise ReportUnavailable(notices or "no stratum has enough tokens for a fit")
    fig = make_subplots(
        rows=2, cols=len(panels), subplot_titles=[p[1] for p in panels],
        horizontal_spacing=0.12, vertical_spacing=0.14, shared_xaxes=True,
    )
    fig.update_layout(template=_TEMPLATE, height=640, showlegend=False, margin=dict(t=50))
    for c, (kind, _title, rows) in enumerate(panels, start=1):
        _strata_alpha_traces(fig, rows, c)
        names, ks, lo_e, hi_e, hover = [], [], [], [], []
        for r in rows:
            base = "k_proportional" if "k_proportional" in r else "k"
            k = r.get(base)
            lo, hi = _interval(r, base)
            names.append(_e(str(_pick(r, "label", "bucket", default="?"))))
            ks.append(k if _is_num(k) else None)
            lo_e.append(max(k - lo, 0) if _is_num(k) and _is_num(lo) else 0)
            hi_e.append(max(hi - k, 0) if _is_num(k) and _is_num(hi) else 0)
            hover.append(
                _e(
                    f"tokens {_f(r.get('tokens'))}; power law k = {_f(r.get('k'))}, "
                    f"α = {_f(r.get('alpha'))}" + (f"; {r['note']}" if r.get("note") else "")
                )
            )
        fig.add_trace(
            go.Scatter(
                x=names,
                y=ks,
                mode="markers",
                marker=dict(size=10, color="#7c3aed"),
                text=hover,
                error_y=dict(
                    type="data",
                    symmetric=False,
                    array=hi_e,
                    arrayminus=lo_e,
                    thickness=1.4,
                    width=5,
                ),
                hovertemplate="%{x}<br>k %{y:.3g}<br>%{text}<extra></extra>",
            ),
            row=1,
            col=c,
        )
        # both rows categorical (plotly would read "2-3" as a number or "0-1" as a date
        # and drop or misplace strata), each with its labels (the rows share the axis)
        fig.update_xaxes(type="category", showticklabels=True, row=1, col=c)
        fig.update_xaxes(
            type="category",
            showticklabels=True,
            row=2,
            col=c,
            title_text=(("staleness bucket" + (f" (versions; lags of {unit:,})"
                                               if (unit := _staleness_unit_of(fit)) > 1
                                               else ""))
                        if kind == "staleness" else "steps"),
        )
        fig.update_yaxes(
            rangemode="tozero",
            tickformat="~g",
            row=1,
            col=c,
            title_text="fitted k (δ² = k·H)" if c == 1 else None,
        )
    return fig


def _strata_alpha_traces(fig: go.Figure, rows: list, c: int) -> None:
    """Row 2 of the strata figure, column ``c``: each stratum's alpha with its 95% interval
    (purple), beside the 95% range of alpha on random samples of the run as large as the
    stratum (grey, ``alpha_random_ci``): a stratum differs from the run only outside it."""
    names = [_e(str(_pick(r, "label", "bucket", default="?"))) for r in rows]
    for key, ci_key, color, width, label in (
            (None, "alpha_random_ci", "#9ca3af", 10, "random sample of its size"),
            ("alpha", "alpha_ci", "#7c3aed", 5, "α (95% interval)")):
        ys, lo_e, hi_e = [], [], []
        for r in rows:
            ci = r.get(ci_key) if isinstance(r.get(ci_key), list | tuple) else [None, None]
            lo, hi = (ci + [None, None])[:2]
            y = r.get(key) if key else (lo + hi) / 2 if _is_num(lo) and _is_num(hi) else None
            ys.append(y if _is_num(y) else None)
            lo_e.append(max(y - lo, 0) if _is_num(y) and _is_num(lo) else 0)
            hi_e.append(max(hi - y, 0) if _is_num(y) and _is_num(hi) else 0)
        fig.add_trace(
            go.Scatter(
                x=names, y=ys, mode="markers",
                marker=dict(size=9 if key else 1, color=color),
                error_y=dict(type="data", symmetric=False, array=hi_e, arrayminus=lo_e,
                             thickness=1.4 if key else 6, width=width, color=color),
                hovertemplate="%{x}<br>" + _e(label) + " %{y:.3g}<extra></extra>",
            ),
            row=2, col=c,
        )
    fig.update_yaxes(tickformat="~g", row=2, col=c,
                     title_text="α; grey: random sample of its size" if c == 1 else None)


# ----------------------------------------------------------------------------- 6 switches


def _switch_fig(prof: dict, h_unit: str = "nats") -> go.Figure:
    d = _pick(prof, "version_switch", "version_switch_profile")
    if not d:
        raise ReportUnavailable("no version-switch profile was computed")
    if not d.get("available", True):
        raise ReportUnavailable(str(d.get("reason") or "no version switches"))
    off = d["offsets"]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.update_layout(template=_TEMPLATE, height=400)
    hover = [f"offset {o}<br>tokens {t:,}" for o, t in zip(off, d["tokens"], strict=False)]
    fig.add_trace(
        go.Scatter(
            x=off,
            y=_nums(d["mean_abs_delta"]),
            name="mean |δ| (left)",
            mode="lines+markers",
            line=dict(color="#dc2626"),
            text=hover,
            hovertemplate="%{text}<br>mean |δ| %{y:.3g}<extra></extra>",
        ),
        secondary_y=False,
    )
    if any(v is not None for v in d.get("mean_entropy") or []):
        fig.add_trace(
            go.Scatter(
                x=off,
                y=_nums(d["mean_entropy"]),
                name="mean H (right)",
                mode="lines+markers",
                line=dict(color="#2563eb"),
                text=hover,
                hovertemplate="%{text}<br>mean H %{y:.3g}<extra></extra>",
            ),
            secondary_y=True,
        )
    fig.add_vline(x=-0.5, line=dict(color="#6b7280", dash="dash"))
    fig.add_annotation(
        x=-0.5,
        y=1,
        yref="paper",
        text=" new weights →",
        showarrow=False,
        xanchor="left",
        yanchor="bottom",
        font=dict(size=11, color="#374151"),
    )
    fig.update_xaxes(
        title_text="token offset from the version switch (0 = first token of the new version)"
    )
    fig.update_yaxes(title_text="mean |δ| (nats)", secondary_y=False, rangemode="tozero")
    fig.update_yaxes(
        title_text=f"mean entropy H ({h_unit})",
        secondary_y=True,
        showgrid=False,
        rangemode="tozero",
        tickmode="auto",
        nticks=6,
    )
    fig.update_layout(legend=dict(orientation="h", y=-0.22), margin=dict(b=80))
    return fig


def _switch_caption(prof: dict) -> str:
    d = _pick(prof, "version_switch", "version_switch_profile")
    if not d or not d.get("available", True):
        return ""
    s = (
        f"{_f(d.get('n_switches'))} switches in {_f(d.get('n_sequences_with_switch'))} of "
        f"{_f(d.get('n_sequences'))} sequences."
    )
    if d.get("non_contiguous_sequences"):
        s += (
            f" {_f(d['non_contiguous_sequences'])} sequences have interleaved versions; "
            "their switch positions are approximate."
        )
    return f'<p class="how">{_e(s)}</p>'


# ----------------------------------------------------------------------------- 7 offenders


def _offenders_html(prof: dict, h_unit: str = "nats") -> str:
    d = _pick(prof, "offenders")
    if not d:
        return _unavail("no offender tables were computed")
    if not d.get("available", True):
        return _unavail(str(d.get("reason") or "no tokens"))
    kind = d.get("score_kind", "delta^2/(H+eps)")
    tok_rows = [
        (
            i + 1,
            _idv(r.get("seq_id")),
            _idv(r.get("position")),
            _idv(r.get("step")),
            _idv(r.get("token_id")),
            r.get("entropy"),
            r.get("p"),
            r.get("delta"),
            r.get("score"),
        )
        for i, r in enumerate(d.get("tokens") or [])
    ]
    seq_rows = [
        (
            i + 1,
            _idv(r.get("seq_id")),
            _idv(r.get("step")),
            r.get("tokens"),
            r.get("mean_abs_delta"),
            r.get("max_abs_delta"),
        )
        for i, r in enumerate(d.get("sequences") or [])
    ]
    return (
        '<div class="grid2 offenders"><div>'
        f"<h3>Top tokens by score = {_e(kind)}"
        + (f" (eps = {_e(_f(d.get('eps')))})" if "H" in kind else "") + "</h3>"
        + ('<p class="how"><b>How to read this:</b> the tokens ENTR would reject first; '
           "small p with small H is the low-entropy noise signature. Keys join back to the "
           "input.</p>" if "H" in kind else
           '<p class="how"><b>How to read this:</b> without an entropy column the tokens '
           "are ranked by their squared log-ratio alone (ENTR's score needs H); small p marks "
           "off-mode samples. Keys join back to the input.</p>")
        + _table(
            ["#", "seq_id", "position", "step", "token_id",
             f"H ({h_unit})", "p", "δ (nats)", "score"],
            tok_rows,
            {0, 2, 3, 4, 5, 6, 7, 8},
        )
        + "</div><div><h3>Top sequences by mean |δ|</h3>"
        '<p class="how"><b>How to read this:</b> whole trajectories with the largest '
        "typical mismatch; a high max with a low mean points to a single bad token.</p>"
        + _table(
            ["#", "seq_id", "step", "tokens", "mean |δ| (nats)", "max |δ| (nats)"],
            seq_rows,
            {0, 2, 3, 4, 5},
        )
        + "</div></div>"
    )


# ----------------------------------------------------------------------------- assembly


_SECTIONS = (
    ("summary", "Summary"),
    ("scaling", "Scaling law"),
    ("prob", "By probability"),
    ("gates", "Gates"),
    ("training", "Over training"),
    ("switches", "Version switches"),
    ("offenders", "Worst offenders"),
)


def build_report_html(
    *,
    summary: dict,
    fit: dict | None,
    metrics: dict | None,
    compare: dict | None,
    profiles: dict,
    findings: list | dict | None = None,
) -> str:
    """Render the post-mortem report as one self-contained HTML document.

    Inputs are the ``to_dict()`` of the result objects, i.e. exactly what the JSON report
    holds: ``summary`` (assembled by the CLI: ``tool_version``, ``created_at``, ``inputs``
    {files, layout, tokens_total, tokens_valid, sequences}, ``mapping``, ``exclusions``
    {reason: count}, ``entropy_source``, ``parameters``, and ``unavailable``: why there is
    no fit, when there is none), ``fit`` (``FitResult``), ``metrics``
    (``MismatchMetrics``), ``compare`` (``CompareResult``), ``profiles``
    (:class:`entr_diag.profiles.Profiles`) and ``findings`` (``Findings.to_dict()`` of
    :mod:`entr_diag.forensics`, i.e. {findings: [{kind, severity, title, message, evidence,
    check}], checks: {name: {status, reason}}}, or just the list of findings). Any of fit/metrics/compare may be None: the sections that need it
    say "unavailable: <reason>". Returns a str (UTF-8 HTML, plotly.js embedded once, about
    5 MB of which the figures are a few hundred kB whatever the token count).
    """
    summary = summary or {}
    profiles = profiles or {}
    params = dict(summary.get("parameters") or {})
    for src in (compare, fit):
        for key in ("tau", "eps"):
            if key not in params and isinstance(src, Mapping):
                v = _get(src, "parameters", key)
                if v is not None:
                    params[key] = v
    # the unit of the entropies shown: nats, or the column's as the units check reads it
    hu = _h_unit(fit) if isinstance(fit, Mapping) else "nats"
    doc = _Doc()
    created = summary.get("created_at") or _dt.datetime.now(_dt.timezone.utc).isoformat(
        timespec="seconds"
    )
    nfiles = len((summary.get("inputs") or {}).get("files") or [])
    toc = "".join(f'<a href="#{k}">{i}. {_e(t)}</a>' for i, (k, t) in enumerate(_SECTIONS, 1))
    warned = summary.get("warnings")
    findings_html = _safe(lambda: _findings_section(
        findings, warned if isinstance(warned, list | tuple) else ()))
    if findings_html:
        toc = '<a href="#findings">Findings</a>' + toc
    doc.add(
        '<header class="top"><h1>entr-diag post-mortem: train-inference log-ratio mismatch</h1>'
        f'<div class="sub">{_e(_f((summary.get("inputs") or {}).get("tokens_valid")))} valid tokens '
        f"from {_e(nfiles)} file(s) · entr-diag {_e(summary.get('tool_version', '?'))} · "
        f"{_e(created)} · method: {PAPER} (ENTR)</div></header>"
        f'<nav class="toc">{toc}</nav><main>'
    )
    doc.add(findings_html)
    doc.add(_safe(lambda: _summary_section(summary, fit, compare, findings)))

    # 2 scaling law
    doc.add(
        '<section class="card" id="scaling"><h2>2. The entropy-ratio scaling law</h2>'
        '<div class="grid2"><div>'
    )
    doc.add(
        doc.figure_block(
            lambda: _scaling_fig(fit, summary.get("unavailable")),
            "mean δ² per entropy bin (dots, 95% sequence-bootstrap interval) against the fitted "
            "laws (lines); if the law holds the dots follow a slope-1 line, the shaded red band "
            "below H* is the low-entropy noise regime where they lift off it.",
            "Mean δ² by entropy",
        )
    )
    doc.add("</div><div>")
    doc.add(
        doc.figure_block(
            lambda: _density_fig(profiles, params, _get(fit, "breakpoint", "h_star"),
                                 h_unit=hu),
            "token counts (color, log scale) of entropy H against |δ|; the bulk should rise "
            "with H; a cloud of large |δ| at tiny H is the noise regime. The dashed line is the "
            "ENTR bound |δ| = √(τ(H+ε)), the red line H*.",
            "Token density of (H, |δ|)",
        )
    )
    doc.add("</div></div></section>")

    # 3 by p
    doc.add('<section class="card" id="prob"><h2>3. Mismatch by sampled-token probability</h2>')
    doc.add(
        doc.figure_block(
            lambda: _prob_fig(profiles),
            "bins of p = exp(infer_logprob); numeric noise on rarely sampled tokens shows as "
            "δ² far above the rest at small p (left); a signed mean far from 0 is a systematic "
            "bias (middle); small-p bins holding a much larger share of the δ² mass than of the "
            "tokens carry the noise (right).",
        )
    )
    doc.add("</section>")

    # 4 gates
    doc.add('<section class="card" id="gates"><h2>4. Trust-region gates</h2>')
    doc.add("<h3>Overview</h3>" + _safe(lambda: _gate_summary_html(compare)))
    doc.add('<div class="grid2"><div>')
    doc.add(
        doc.figure_block(
            lambda: _keep_vs_entropy_fig(compare),
            "share of tokens each gate keeps per entropy bin; a fixed band drops high-entropy "
            "(exploration) tokens, ENTR widens its band with H.",
            "Keep rate against entropy",
        )
    )
    doc.add("</div><div>")
    doc.add(
        doc.figure_block(
            lambda: _noise_vs_expl_fig(compare),
            "one point per gate: lower-left is better (admits little low-entropy noise, "
            "discards little in-law exploration). The noise tokens are those the ENTR rule "
            "at this tau drops below H*: ENTR sits at 0 noise admitted by definition, so "
            "the vertical axis compares the other gates.",
            "Noise admitted vs exploration discarded",
        )
    )
    doc.add("</div></div><h3>Agreement with ENTR</h3>")
    doc.add(_safe(lambda: _agreement_html(compare)))
    doc.add(
        doc.figure_block(
            lambda: _disagreement_fig(compare),
            "tokens on which ENTR and the fixed band with (as near as ties allow) the same "
            "number of drops disagree, per "
            "entropy bin: ENTR should keep the high-entropy tokens the band drops, and drop the "
            "low-entropy noise the band keeps.",
            "Where ENTR and the matched fixed band disagree",
        )
    )
    doc.add(
        doc.figure_block(
            lambda: _sweep_fig(compare),
            "keep rate, noise admitted and exploration discarded along the budget sweep; "
            "pick the budget where noise admitted falls before exploration discarded rises.",
            "Budget sweep",
        )
    )
    doc.add("</section>")

    # 5 over training
    doc.add('<section class="card" id="training"><h2>5. Over training</h2>')
    doc.add(
        doc.figure_block(
            lambda: _metrics_fig(metrics),
            "per trainer step, the mismatch metrics verl and slime log (k1 and k3 KL estimates "
            "of KL(infer‖train), token χ², IS effective sample size); spikes mark the steps to "
            "inspect."
            + (f" {metrics['tokens_without_step']:,} token(s) with a null step are in no step."
               if (metrics or {}).get("tokens_without_step") else "")
            + (" " + note if (note := clamp_note_of(
                int(_get(metrics, "overall", "tokens_clamped") or 0),
                int(_get(metrics, "overall", "sequences_clamped") or 0),
                _get(metrics, "overall", "k3_kl"))) else "")
            + (" " + trunc if (trunc := truncation_metrics_note(findings)) else ""),
            "Mismatch metrics per step",
        )
    )
    doc.add('<div class="grid2"><div>')
    doc.add(
        doc.figure_block(
            lambda: _masked_share_fig(compare),
            "share of tokens each gate would mask at each step; a gate whose masked share climbs "
            "with training is reacting to drift, not numeric noise.",
            "Masked share per step",
        )
    )
    doc.add("</div><div>")
    doc.add(
        doc.figure_block(
            lambda: _strata_fig(fit, summary.get("unavailable")),
            "the slope k of δ² = k·H (95% interval) per staleness bucket "
            "(train_version − policy_version) and per step range; k drifting over steps means "
            "the mismatch changed during training; k growing with staleness is policy drift "
            "only if it also grows at a fixed step (early steps cannot be stale: see the "
            "staleness check in the forensics). A stratum rests on fewer tokens than the "
            "pooled fit: with heavy-tailed low-entropy bins a smaller stratum mostly reads a "
            "higher alpha and a scattered k, beyond its interval; the JSON's "
            "alpha_random_ci (and the terminal's 'random size') gives the alpha range of a "
            "random sample of each stratum's size (below: grey, beside each alpha): only "
            "outside it does a stratum differ.",
            "Fitted k per stratum",
        )
    )
    doc.add("</div></div>")
    doc.add(_safe(lambda: _keep_by_staleness_html(compare)))
    doc.add("</section>")

    # 6 switches
    doc.add('<section class="card" id="switches"><h2>6. In-flight version switches</h2>')
    doc.add(
        doc.figure_block(
            lambda: _switch_fig(profiles, h_unit=hu),
            "mean |δ| and mean entropy by token offset from a policy-version switch inside a "
            f"sequence ({PAPER}, fig. 3); a jump at offset 0 means tokens after the weight push "
            "mismatch more.",
        )
    )
    doc.add(_safe(lambda: _switch_caption(profiles)))
    doc.add("</section>")

    # 7 offenders
    doc.add('<section class="card" id="offenders"><h2>7. Worst offenders</h2>')
    doc.add(_safe(lambda: _offenders_html(profiles, h_unit=hu)))
    doc.add("</section>")
    doc.add(
        f"</main><footer>entr-diag {_e(summary.get('tool_version', '?'))} · "
        f"{_e(created)} · figures built from aggregates only · {PAPER}</footer>"
    )

    title = f"entr-diag report · {created}"
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<meta name="generator" content="entr-diag {_e(summary.get("tool_version", ""))}">'
        f"<title>{_e(title)}</title><style>{_CSS}</style>"
        f"<script>{plotly.offline.get_plotlyjs()}</script></head><body>"
        + "".join(doc.parts)
        + "</body></html>\n"
    )


def write_report(path: str | os.PathLike[str], html_text: str) -> Path:
    """Write ``html_text`` (UTF-8) to ``path`` atomically: a temporary file in the same
    directory, then ``os.replace``, so a reader never sees a half-written report.
    Returns the path. Raises :class:`entr_diag.errors.InputError` when the directory does
    not exist or is not writable."""
    from entr_diag.atomic import write_text

    return write_text(Path(path), html_text)
