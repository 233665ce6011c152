"""Terminal (rich) rendering of ``entr-diag compare`` (issue 4).

Built only from :class:`entr_diag.compare.CompareResult` (or its ``to_dict()``, e.g. read
back from the JSON report): nothing is recomputed from tokens here. Numeric cells are never
truncated: at narrow widths the text columns (gate names, bin labels) wrap instead.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from entr_diag.compare import noise_by_definition
from entr_diag.report.tables import print_fitting, split_table

__all__ = ["render_compare", "READING_NOTES"]

READING_NOTES = (
    "How to read this: a good gate keeps the high-entropy tokens whose log-ratio is within "
    "the fitted law's scale (low 'exploration discarded') and drops the low-entropy noise "
    "tokens (low 'noise admitted'). The matched row is the fixed band dropping exactly as "
    "many tokens as ENTR: at an equal budget, the disagreement tables show which tokens each "
    "rule spends it on. Sequence gates (seq-is, geo-rs, k3, veto) drop whole sequences; TIS "
    "keeps every token and only truncates weights."
)


def _pct(x: Any, nd: int = 1) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{100.0 * float(x):.{nd}f}%"


def _int(x: Any) -> str:
    return "n/a" if x is None else f"{int(x):,}"


def _table(
    title: str, header: Sequence[str], rows: Sequence[Sequence[str]], text_cols: int = 1
) -> Table:
    """A table whose first ``text_cols`` columns are wrappable text and whose other columns
    are right-aligned numbers that never wrap nor truncate (min width = widest cell)."""
    t = Table(title=title, title_justify="left")
    for j, h in enumerate(header):
        words = max([len(x) for x in h.split()] or [0])
        if j < text_cols:
            # wide enough for its longest word ('max_mean_sq=0.04'), up to 24: a gate label
            # wraps at its spaces, never inside a number ('threshold=0' / '.01')
            longest = max([words, *(len(x) for r in rows for x in str(r[j]).split())])
            t.add_column(Text(h), justify="left", overflow="fold", min_width=min(24, longest))
        else:
            w = max([len(r[j]) for r in rows] + [words])
            t.add_column(Text(h), justify="right", min_width=w)
    for r in rows:  # Text: gate labels and bin keys are printed as is, never read as markup
        t.add_row(*map(Text, r))
    return t


def _panel(d: dict[str, Any]) -> list[dict[str, Any]]:
    """The gates compared, then the matched band (none without ENTR)."""
    m = d.get("matched")
    return [*d["gates"], *([{**m["fixed"], "_matched": True}] if m else [])]


def _name(g: dict[str, Any]) -> str:
    return str(g["label"]) + (" (matched)" if g.get("_matched") else "")


def _gate_table(d: dict[str, Any]) -> Table:
    p = d["parameters"]
    # a gate that could not be simulated (ENTR without entropy): its row says so
    rows = [[f"{u['label']} (unavailable)", *["n/a"] * 5] for u in d.get("unavailable") or []]
    rows += [
        [
            _name(g),
            _int(g["kept_tokens"]),
            _pct(g["kept_share"], 2),
            _pct(g["kept_sequence_share"]),
            _pct(g["noise_admitted"]) + (" (def.)" if noise_by_definition(g, p) else ""),
            _pct(g["exploration_discarded"], 2),
        ]
        for g in _panel(d)
    ]
    entr = "ENTR unavailable" if d.get("unavailable") else \
        f"ENTR tau={p['tau']:g}, eps={p['eps']:g}"
    return _table(
        f"Gates on {d['n_tokens']:,} token{'s' if d['n_tokens'] != 1 else ''} / "
        f"{d['n_sequences']:,} sequence{'s' if d['n_sequences'] != 1 else ''} ({entr})",
        [
            "gate",
            "kept tokens",
            "kept",
            "seqs kept",
            "noise admitted",
            "exploration discarded",
        ],
        rows,
    )


def _gate_notes(d: dict[str, Any]) -> list[str]:
    notes = [f"{u['label']}: unavailable: {u['reason']}." for u in d.get("unavailable") or []]
    for g in d["gates"]:
        if g.get("tis"):
            x = g["tis"]
            what = (f"{x['truncated_sequences']:,} sequences ({_pct(x['truncated_share'], 2)} "
                    "of tokens) truncated" if x.get("truncated_sequences") is not None
                    else f"{_pct(x['truncated_share'], 2)} of tokens truncated")
            notes.append(
                f"{g['label']}: keeps every token (weights only); {what}, "
                f"{_pct(x['weight_mass_removed'], 2)} of the weight mass removed."
            )
        elif g["name"] == "m2po":
            cut = d["parameters"].get("m2po_cuts", {}).get(g["spec"])
            if cut is not None and math.isfinite(cut):
                notes.append(
                    f"{g['label']}: one cut over the whole input, drops every token with "
                    f"delta^2 >= {cut:.4g}."
                )
    m = d.get("matched")
    if m:
        fd, ed = m["fixed_dropped"], m["entr_dropped"]
        notes.append(
            f"(matched): the fixed band |delta| <= c = {m['c']:.4g} nats, the tightest band "
            f"keeping as many tokens as ENTR (drops {fd:,}; ENTR drops {ed:,})"
            + (": the tokens sharing |delta| = c are kept together (quantised logprobs, "
               f"e.g. bf16), so the band drops {ed - fd:,} fewer: the budgets differ by that."
               if ed != fd else ".")
        )
    p = d["parameters"]
    if (p.get("staleness_unit") or 1) > 1:
        notes.append(f"staleness: the buckets count lags of {p['staleness_unit']:,} versions "
                     "(the staleness values' greatest common divisor; labels in versions).")
    if any(noise_by_definition(g, p) for g in d["gates"]) and p.get("h_star") is not None:
        notes.append(
            f"noise admitted: the share of the noise tokens (H < H* = {p['h_star']:.4g} "
            + ("nats " if _h_unit(d) == "nats"
               else f"in the entropy column's unit, {_h_unit(d)}, ")
            + f"and delta^2/(H+{p['flag_eps']:g}) > {p['flag_tau']:g}: those ENTR drops below "
            "H*) that each gate keeps; ENTR keeps none of them by definition (def.), so the "
            "column compares the other gates. seqs kept: for a token gate, the sequences "
            "with at least one token kept."
        )
    from entr_diag.compare import null_reason_lines

    notes += null_reason_lines(d.get("null_reasons"))
    return notes


def _agreement_tables(d: dict[str, Any]) -> list[Table]:
    counts, where_rows = [], []
    for g in _panel(d):
        a = g["agreement_vs_entr"]
        if a is None:
            continue
        def where(key: str, n: int, a=a) -> str:
            cell = a.get(f"where_{key}")
            if not n or not cell:
                return "-"
            return f"H {cell[0]}, p {cell[1]}"

        counts.append(
            [
                _name(g),
                _int(a["both_keep"]),
                _int(a["only_entr_keeps"]),
                _int(a["only_other_keeps"]),
                _int(a["both_drop"]),
            ]
        )
        where_rows.append(
            [
                _name(g),
                where("only_entr_keeps", a["only_entr_keeps"]),
                where("only_other_keeps", a["only_other_keeps"]),
            ]
        )
    return [
        _table(
            "Agreement with ENTR (tokens)",
            ["gate", "both keep", "only ENTR keeps", "only gate keeps", "both drop"],
            counts,
        ),
        _table(
            f"Where they disagree: the cell of entropy bin H ({_h_unit(d)}) and p bin holding "
            "most of the tokens",
            ["gate", "only ENTR keeps", "only the gate keeps"],
            where_rows,
            text_cols=3,
        ),
    ] if counts else []  # no gate compared with ENTR (unavailable without entropy)


def _matched_tables(d: dict[str, Any]) -> list[Table]:
    m = d.get("matched")
    if not m:  # no ENTR, no matched band
        return []
    e, f = d["gates"][0], m["fixed"]
    fixed_name = f"fixed c={m['c']:.4g}"
    summary = _table(
        f"Matched budget: ENTR vs the fixed band c = {m['c']:.4g} nats "
        f"(ENTR drops {m['entr_dropped']:,}, the band {m['fixed_dropped']:,})",
        ["", e["label"], fixed_name],
        [
            ["kept share", _pct(e["kept_share"], 2), _pct(f["kept_share"], 2)],
            ["noise admitted", _pct(e["noise_admitted"])
             + (" (def.)" if noise_by_definition(e, d["parameters"]) else ""),
             _pct(f["noise_admitted"])],
            [
                "exploration discarded",
                _pct(e["exploration_discarded"], 2),
                _pct(f["exploration_discarded"], 2),
            ],
            ["noise tokens kept", _int(e["noise_tokens_kept"]), _int(f["noise_tokens_kept"])],
            [
                "law-scale tokens dropped",
                _int(e["exploration_tokens_dropped"]),
                _int(f["exploration_tokens_dropped"]),
            ],
        ],
    )
    a = f["agreement_vs_entr"]
    be, bp = a["by_entropy"], a["by_p"]
    n_by = e["keep_by_entropy"]["n"]
    by_h = _table(
        "Where the matched pair disagrees, by entropy",
        [f"entropy ({_h_unit(d)})", "tokens", "only ENTR keeps", "only fixed keeps"],
        [
            [key, _int(n_by[j]), _int(be["only_entr_keeps"][j]), _int(be["only_other_keeps"][j])]
            for j, key in enumerate(be["keys"])
            if n_by[j] and (be["only_entr_keeps"][j] or be["only_other_keeps"][j])
        ],
    )
    by_p = _table(
        "Where the matched pair disagrees, by sampled-token probability p",
        ["p = exp(infer_logprob)", "only ENTR keeps", "only fixed keeps"],
        [
            [key, _int(bp["only_entr_keeps"][j]), _int(bp["only_other_keeps"][j])]
            for j, key in enumerate(bp["keys"])
            if bp["only_entr_keeps"][j] or bp["only_other_keeps"][j]
        ],
    )
    # bins where the pair agrees say nothing: only the disagreement tables with rows are shown
    return [summary, *(t for t in (by_h, by_p) if t.row_count)]


def _keep_by_tables(d: dict[str, Any], field: str, title: str, first: str,
                    width: int) -> list[Table]:
    """The keep rate per bin of every token gate (and the matched band by entropy), as one
    table, or as several with the gates split between them where one would be wider than
    ``width`` (:func:`~entr_diag.report.tables.split_table`). A gate's column is headed by
    its name, or by its label with its parameters where two gates share a name (``--gate
    areal --gate areal:cap=2``)."""
    if not d["gates"] or d["gates"][0].get(field) is None:
        return []
    gates = [g for g in d["gates"] if not g.get("tis")]
    names = [g["name"] for g in gates]
    matched = field == "keep_by_entropy"
    cols = [g["label"] if names.count(g["name"]) > 1 else g["name"] for g in gates]
    if matched:
        gates.append(d["matched"]["fixed"])
        cols.append("matched")
    kb = d["gates"][0][field]
    rows = [
        [str(key), _int(kb["n"][j]), *[_pct(g[field]["keep_rate"][j], 0) for g in gates]]
        for j, key in enumerate(kb["keys"])
        if kb["n"][j]
    ]
    return split_table(_table(title, [first, "tokens", *cols], rows), width, keys=2)


def _sweep_table(s: dict[str, Any]) -> Table:
    sym = "tau" if s["parameter"] == "tau" else "c (nats)"
    who = "ENTR" if s["parameter"] == "tau" else "fixed band"
    rows = [
        [f"{v:.4g}", _pct(k, 2), _pct(na), _pct(ed, 2)]
        for v, k, na, ed in zip(
            s["values"],
            s["keep_rate"],
            s["noise_admitted"],
            s["exploration_discarded"],
            strict=True,
        )
    ]
    return _table(
        f"Sweep of {sym} ({who}, one pass)",
        [sym, "kept", "noise admitted", "exploration discarded"],
        rows,
    )


def _h_unit(d: dict[str, Any]) -> str:
    """The unit of the comparison's entropies: ``nats``, or the entropy column's as the
    fit's units check reads it (``parameters["entropy_unit"]``: ``probably bits``)."""
    unit = (d.get("parameters") or {}).get("entropy_unit") or "nats"
    return "nats" if unit == "nats" else f"probably {unit}"


def render_compare(result: Any, console: Console) -> None:
    """Print the comparison: panel summary (with notes), agreement with ENTR, the
    matched-budget comparison, keep rate by entropy / staleness, the sweeps, the
    definitions used and how to read it. A gate that could not be simulated (ENTR without
    an entropy column) has a row saying so and a note with the reason; what depends on
    ENTR (agreement, matched budget, tau sweep, keep rate by entropy) is left out.

    ``result``: a :class:`~entr_diag.compare.CompareResult` or its ``to_dict()``.
    """
    d = result.to_dict() if hasattr(result, "to_dict") else result
    print_fitting(console, _gate_table(d))
    for line in _gate_notes(d):
        console.print(Text(line, style="dim"))
    for t in (*_agreement_tables(d), *_matched_tables(d)):
        print_fitting(console, t)
    for field, title, first in (
        ("keep_by_entropy", "Keep rate by entropy bin", f"entropy ({_h_unit(d)})"),
        ("keep_by_staleness", "Keep rate by staleness (policy versions)", "staleness"),
    ):
        for t in _keep_by_tables(d, field, title, first, console.width):
            console.print(t)
    for key in ("tau", "c"):
        if key in d.get("sweep", {}):
            print_fitting(console, _sweep_table(d["sweep"][key]))
    defs = d.get("definitions", {})
    for key in ("noise_token", "law_scale_token"):
        if key in defs:
            console.print(Text(f"{key.replace('_', ' ')}: {defs[key]}.", style="dim"))
    console.print(READING_NOTES)
