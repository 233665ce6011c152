"""Terminal rendering of mismatch forensics (:mod:`entr_diag.forensics`) with rich.

Built only from :class:`~entr_diag.forensics.Findings` (or its ``to_dict()``): nothing is
recomputed here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

_SEV_ORDER = {"critical": 0, "warning": 1, "info": 2}
_SEV_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}
_STATUS_STYLE = {"found": "bold", "clear": "green", "cannot_tell": "dim"}
#: evidence entries shown per finding (the JSON has all of them)
MAX_EVIDENCE = 8
#: list evidence shows at most this many items
MAX_LIST_ITEMS = 5


def _as_dict(findings: Any) -> Mapping[str, Any]:
    if isinstance(findings, Mapping):
        return findings
    return findings.to_dict()


def _fmt_value(v: Any) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if v != v:  # NaN
            return "-"
        return f"{v:.4g}"
    if isinstance(v, (list, tuple)):
        items = [_fmt_value(x) for x in v[:MAX_LIST_ITEMS]]
        more = f", ... ({len(v)} in all)" if len(v) > MAX_LIST_ITEMS else ""
        return "[" + ", ".join(items) + more + "]"
    if v is None:
        return "-"
    return str(v)


def _evidence_text(ev: Mapping[str, Any]) -> str:
    lines = []
    for k, v in list(ev.items())[:MAX_EVIDENCE]:
        lines.append(f"{k} = {_fmt_value(v)}")
    if len(ev) > MAX_EVIDENCE:
        lines.append(f"... {len(ev) - MAX_EVIDENCE} more in the JSON report")
    return "\n".join(lines)


def status_labels(findings: Any) -> dict[str, str]:
    """Each check's status as shown to a reader: ``found`` followed by the most severe
    severity among the check's findings (``found: info``; a check whose findings are all
    info did not find a cause of mismatch, as the Forensics line says), else the status
    (``clear``, ``cannot_tell``).

    Args:
        findings: a :class:`~entr_diag.forensics.Findings` or its ``to_dict()``.

    Returns:
        {check name: label}, in the order of ``checks``.
    """
    d = _as_dict(findings)
    worst: dict[str, str] = {}
    for f in d.get("findings", []) or []:
        kind, sev = f.get("kind"), f.get("severity", "info")
        if kind and _SEV_ORDER.get(sev, 3) < _SEV_ORDER.get(worst.get(kind, ""), 4):
            worst[kind] = sev
    out = {}
    for name, st in (d.get("checks") or {}).items():
        status = str((st or {}).get("status", "")) if isinstance(st, Mapping) else ""
        out[name] = f"{status}: {worst[name]}" if status == "found" and name in worst \
            else status
    return out


def render_findings(findings: Any, console: Console, *, show_checks: bool = True) -> None:
    """Print findings, most severe first, then every check's status.

    Args:
        findings: a :class:`~entr_diag.forensics.Findings` or its ``to_dict()``.
        console: where to print.
        show_checks: also print the table of checks (status and reason).
    """
    d = _as_dict(findings)
    items = sorted(
        d.get("findings", []), key=lambda f: _SEV_ORDER.get(f.get("severity", "info"), 3)
    )
    if not items:
        console.print("[green]Mismatch forensics: no known cause of mismatch found.[/green]")
    else:
        n_bad = sum(1 for f in items if f.get("severity") in ("warning", "critical"))
        head = (
            f"Mismatch forensics: {len(items)} finding(s)"
            + (f", {n_bad} above info" if n_bad else ", all info")
        )
        console.print(Text(head, style="bold"))
        t = Table("severity", "finding", "evidence", show_lines=True, expand=False)
        for f in items:
            sev = f.get("severity", "info")
            body = Text()
            body.append(f.get("title", ""), style="bold")
            body.append(f"  [{f.get('kind', '')}]\n", style="dim")
            body.append(f.get("message", ""))
            if f.get("check"):
                body.append("\nCheck: ", style="bold")
                body.append(f["check"])
            t.add_row(
                Text(sev.upper(), style=_SEV_STYLE.get(sev, "")),
                body,
                Text(_evidence_text(f.get("evidence", {}))),
            )
        console.print(t)
    checks = d.get("checks", {})
    if show_checks and checks:
        ct = Table("check", "status", "why", title="Forensic checks", show_edge=False)
        labels = status_labels(d)
        for name, st in checks.items():
            status = st.get("status", "")
            # Text, not str: reasons hold brackets such as E[delta^2] that rich would parse
            ct.add_row(Text(name), Text(labels.get(name, status),
                                        style=_STATUS_STYLE.get(status, "")),
                       Text(st.get("reason", "")))
        console.print(ct)
