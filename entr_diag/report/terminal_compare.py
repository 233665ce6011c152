"""Terminal (rich) rendering of ``entr-diag compare`` (issue 4).

Built only from :class:`entr_diag.compare.CompareResult` (or its ``to_dict()``, e.g. read
back from the JSON report): nothing is recomputed from tokens here.
"""

from __future__ import annotations

import math
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

__all__ = ["render_compare", "READING_NOTES"]

READING_NOTES = (
    "How to read this: a good gate keeps high-entropy tokens whose log-ratio is within the "
    "fitted law's scale (low 'exploration discarded') and drops the low-entropy noise tokens "
    "(low 'noise admitted'). The matched row compares ENTR with the fixed band that drops "
    "exactly as many tokens: at an equal budget, the disagreement table shows which tokens "
    "each spends it on. Sequence gates (seq-is, geo-rs, k3, veto) drop whole sequences, and "
    "TIS keeps every token but truncates weights (see its truncated share)."
)


_LEVEL = {"token": "token", "sequence": "seq", "batch": "batch"}


def _pct(x: Any, nd: int = 1) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{100.0 * float(x):.{nd}f}%"


def _int(x: Any) -> str:
    return "n/a" if x is None else f"{int(x):,}"


def _short(g: dict[str, Any]) -> str:
    return str(g["label"])


def _argmax_label(keys: list[str], counts: list[int]) -> str:
    if not counts or max(counts) <= 0:
        return "-"
    j = max(range(len(counts)), key=lambda i: counts[i])
    return keys[j]


def _gate_table(d: dict[str, Any]) -> Table:
    p = d["parameters"]
    t = Table(
        title=(
            f"Gates on {d['n_tokens']:,} tokens / {d['n_sequences']:,} sequences "
            f"(ENTR tau={p['tau']:g}, eps={p['eps']:g})"
        ),
        title_justify="left",
    )
    t.add_column("gate", justify="left", no_wrap=True)
    for col in ("level", "kept tokens", "kept", "seqs kept", "noise admitted", "explor. discarded"):
        t.add_column(col, justify="left" if col == "level" else "right")
    rows = [*d["gates"], {**d["matched"]["fixed"], "_matched": True}]
    for g in rows:
        name = _short(g) + (" (matched)" if g.get("_matched") else "")
        t.add_row(
            name,
            _LEVEL.get(g["level"], g["level"]),
            _int(g["kept_tokens"]),
            _pct(g["kept_share"], 2),
            _pct(g["kept_sequence_share"]),
            _pct(g["noise_admitted"]),
            _pct(g["exploration_discarded"], 2),
        )
    return t


def _gate_notes(d: dict[str, Any]) -> list[str]:
    notes = []
    for g in d["gates"]:
        if g.get("tis"):
            x = g["tis"]
            notes.append(
                f"{g['label']}: keeps every token (weights only); {_pct(x['truncated_share'], 2)}"
                f" of tokens truncated, {_pct(x['weight_mass_removed'], 2)} of weight mass removed."
            )
        elif g["name"] == "m2po":
            cut = d["parameters"].get("m2po_cuts", {}).get(g["spec"])
            if cut is not None and math.isfinite(cut):
                notes.append(
                    f"{g['label']}: global cut, drops every token with delta^2 >= {cut:.4g}."
                )
    m = d["matched"]
    notes.append(
        f"(matched): the fixed band c = {m['c']:.4g} nats that drops as many tokens as ENTR "
        f"({m['fixed_dropped']:,} vs {m['entr_dropped']:,})."
    )
    return notes


def _agreement_table(d: dict[str, Any]) -> Table:
    t = Table(
        title="Agreement with ENTR (token counts; 'at': the entropy bin H and p bin holding "
        "most of those tokens)",
        title_justify="left",
    )
    for col in ("gate", "both keep", "only ENTR", "only gate", "both drop"):
        t.add_column(col, justify="left" if col == "gate" else "right", no_wrap=col == "gate")
    t.add_column("only ENTR at", justify="left", no_wrap=True)
    t.add_column("only gate at", justify="left", no_wrap=True)
    rows = [*d["gates"][1:], {**d["matched"]["fixed"], "_matched": True}]
    for g in rows:
        a = g["agreement_vs_entr"]
        if a is None:
            continue
        be, bp = a["by_entropy"], a["by_p"]
        where_e = (
            f"H {_argmax_label(be['keys'], be['only_entr_keeps'])}\n"
            f"p {_argmax_label(bp['keys'], bp['only_entr_keeps'])}"
            if a["only_entr_keeps"]
            else "-"
        )
        where_o = (
            f"H {_argmax_label(be['keys'], be['only_other_keeps'])}\n"
            f"p {_argmax_label(bp['keys'], bp['only_other_keeps'])}"
            if a["only_other_keeps"]
            else "-"
        )
        t.add_row(
            _short(g) + (" (matched)" if g.get("_matched") else ""),
            _int(a["both_keep"]),
            _int(a["only_entr_keeps"]),
            _int(a["only_other_keeps"]),
            _int(a["both_drop"]),
            where_e,
            where_o,
        )
    return t


def _matched_tables(d: dict[str, Any]) -> list[Table]:
    m = d["matched"]
    e, f = d["gates"][0], m["fixed"]
    t = Table(
        title=(
            f"Matched budget: ENTR vs fixed band c = {m['c']:.4g} nats "
            f"(ENTR drops {m['entr_dropped']:,}, fixed drops {m['fixed_dropped']:,})"
        ),
        title_justify="left",
    )
    t.add_column("", justify="left")
    t.add_column(_short(e), justify="right")
    t.add_column(f"fixed c={m['c']:.4g}", justify="right")
    t.add_row("kept share", _pct(e["kept_share"], 2), _pct(f["kept_share"], 2))
    t.add_row("noise admitted", _pct(e["noise_admitted"]), _pct(f["noise_admitted"]))
    t.add_row(
        "exploration discarded",
        _pct(e["exploration_discarded"], 2),
        _pct(f["exploration_discarded"], 2),
    )
    t.add_row("noise tokens kept", _int(e["noise_tokens_kept"]), _int(f["noise_tokens_kept"]))
    t.add_row(
        "law-scale tokens dropped",
        _int(e["exploration_tokens_dropped"]),
        _int(f["exploration_tokens_dropped"]),
    )
    a = f["agreement_vs_entr"]
    w = Table(title="Where the matched pair disagrees, by entropy (tokens)", title_justify="left")
    w.add_column("entropy bin (nats)", justify="left")
    for col in ("tokens", "only ENTR keeps", "only fixed keeps"):
        w.add_column(col, justify="right")
    be = a["by_entropy"]
    n_by = e["keep_by_entropy"]["n"]
    for j, key in enumerate(be["keys"]):
        if n_by[j] == 0:
            continue
        w.add_row(
            key, _int(n_by[j]), _int(be["only_entr_keeps"][j]), _int(be["only_other_keeps"][j])
        )
    wp = Table(
        title="Where the matched pair disagrees, by sampled probability p (tokens)",
        title_justify="left",
    )
    wp.add_column("p bin", justify="left")
    for col in ("only ENTR keeps", "only fixed keeps"):
        wp.add_column(col, justify="right")
    bp = a["by_p"]
    for j, key in enumerate(bp["keys"]):
        if bp["only_entr_keeps"][j] == 0 and bp["only_other_keeps"][j] == 0:
            continue
        wp.add_row(key, _int(bp["only_entr_keeps"][j]), _int(bp["only_other_keeps"][j]))
    return [t, w, wp]


def _entropy_keep_table(d: dict[str, Any]) -> Table:
    t = Table(title="Keep rate by entropy bin", title_justify="left")
    t.add_column("entropy (nats)", justify="left")
    t.add_column("tokens", justify="right")
    gates = [g for g in d["gates"] if not g.get("tis")]
    gates.append({**d["matched"]["fixed"], "label": f"matched c={d['matched']['c']:.3g}"})
    for g in gates:
        t.add_column(
            g["name"] if g["name"] != "fixed" else g["label"].replace("fixed ", ""), justify="right"
        )
    ke = d["gates"][0]["keep_by_entropy"]
    for j, key in enumerate(ke["keys"]):
        if ke["n"][j] == 0:
            continue
        t.add_row(
            key, _int(ke["n"][j]), *[_pct(g["keep_by_entropy"]["keep_rate"][j], 0) for g in gates]
        )
    return t


def _staleness_table(d: dict[str, Any]) -> Table | None:
    if d["gates"][0].get("keep_by_staleness") is None:
        return None
    t = Table(title="Keep rate by staleness (policy versions)", title_justify="left")
    t.add_column("staleness", justify="left")
    t.add_column("tokens", justify="right")
    gates = [g for g in d["gates"] if not g.get("tis")]
    for g in gates:
        t.add_column(g["name"], justify="right")
    ks = d["gates"][0]["keep_by_staleness"]
    for j, key in enumerate(ks["keys"]):
        if ks["n"][j] == 0:
            continue
        t.add_row(
            key, _int(ks["n"][j]), *[_pct(g["keep_by_staleness"]["keep_rate"][j], 1) for g in gates]
        )
    return t


def _sweep_table(s: dict[str, Any]) -> Table:
    sym = "tau" if s["parameter"] == "tau" else "c (nats)"
    who = "ENTR" if s["parameter"] == "tau" else "fixed band"
    t = Table(title=f"Sweep of {sym} ({who}, one pass)", title_justify="left")
    for col in (sym, "kept", "noise admitted", "explor. discarded"):
        t.add_column(col, justify="right")
    for v, k, na, ed in zip(
        s["values"],
        s["keep_rate"],
        s["noise_admitted"],
        s["exploration_discarded"],
        strict=True,
    ):
        t.add_row(f"{v:.4g}", _pct(k, 2), _pct(na), _pct(ed, 2))
    return t


def render_compare(result: Any, console: Console) -> None:
    """Print the comparison: panel summary, agreement with ENTR, matched-budget comparison,
    keep rate by entropy (and staleness), sweeps, then how to read it.

    ``result``: a :class:`~entr_diag.compare.CompareResult` or its ``to_dict()``.
    """
    d = result.to_dict() if hasattr(result, "to_dict") else result
    console.print(_gate_table(d))
    for line in _gate_notes(d):
        console.print(Text(line, style="dim"))
    reasons = d.get("null_reasons") or {}
    for k, v in reasons.items():
        console.print(Text(f"n/a {k.replace('_', ' ')}: {v}.", style="dim"))
    console.print(_agreement_table(d))
    for t in _matched_tables(d):
        console.print(t)
    console.print(_entropy_keep_table(d))
    st = _staleness_table(d)
    if st is not None:
        console.print(st)
    for key in ("tau", "c"):
        if key in d.get("sweep", {}):
            console.print(_sweep_table(d["sweep"][key]))
    defs = d.get("definitions", {})
    for key in ("noise_token", "law_scale_token"):
        if key in defs:
            console.print(Text(f"{key.replace('_', ' ')}: {defs[key]}.", style="dim"))
    console.print(READING_NOTES)
