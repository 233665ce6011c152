"""Terminal rendering of ``inspect`` (rich). Other commands have their own modules."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from entr_diag.io.schema import EXCLUSION_REASONS


def _fmt_int(n: int | None) -> str:
    return "-" if n is None else f"{n:,}"


def one_line(text: str) -> str:
    """``text`` on one line: a line break or carriage return inside it (a file name holding
    one) written as ``\\n`` / ``\\r``, as Python's repr writes them."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


def literal(x: object) -> Text:
    """A table cell or line printed as is: names from the input (paths, columns, seq_ids)
    may hold brackets, such as ``[/i]``, that rich would otherwise read as markup; a line
    break in one is written as the error lines write it (:func:`one_line`; helper-49: a
    file name with a newline printed as two table rows)."""
    return Text("" if x is None else one_line(str(x)))


def render_inspect(desc: dict, console: Console) -> None:
    """Print a dataset description (:meth:`entr_diag.io.Dataset.describe`) as rich tables."""
    acc = desc["accounting"]
    files = desc["files"]
    console.print(
        f"[bold]{len(files)} file(s)[/bold], layout [bold]{escape(str(desc['layout']))}[/bold]"
        + (" (bundled sample run)" if desc.get("bundled_sample") else "")
    )
    ft = Table("file", "layout", "rows", title=None, show_edge=False)
    for f in files[:20]:
        ft.add_row(literal(f["path"]), literal(f["layout"]), _fmt_int(f["rows"]))
    if len(files) > 20:
        ft.add_row(f"... {len(files) - 20} more", "", "")
    console.print(ft)

    mt = Table("canonical column", "source column", title="Column mapping", show_edge=False)
    for canon, src in desc["mapping"].items():
        mt.add_row(literal(canon), literal(src))
    console.print(mt)
    unused = desc.get("unused_columns") or []
    if unused:
        console.print(f"  columns not used ({len(unused)}; --column CANONICAL=SOURCE maps one): "
                      + ", ".join(repr(c) for c in unused[:20])
                      + (f", ... ({len(unused) - 20} more)" if len(unused) > 20 else ""),
                      markup=False)
    for note in desc.get("mapping_notes", []):
        console.print(f"  {note}" if note.startswith("warning: ") else f"  note: {note}",
                      markup=False)
    src = desc.get("entropy_source")
    console.print(
        "entropy used: "
        + ({"inference": "inference-side (engine)", "trainer": "trainer-side"}.get(src, "none"))
    )

    at = Table("tokens", "count", title="Token accounting", show_edge=False)
    at.add_row("rows (tokens) in input", _fmt_int(acc["tokens_total"]))
    at.add_row("outside the loss mask (ignored)", _fmt_int(acc["tokens_unmasked"]))
    if acc.get("tokens_padding"):
        at.add_row("  of which tensor padding (no loss mask)", _fmt_int(acc["tokens_padding"]))
    at.add_row("loss-masked", _fmt_int(acc["tokens_masked"]))
    for reason, n in acc["exclusions"].items():
        at.add_row(f"  excluded: {reason}", _fmt_int(n))
    at.add_row("[bold]valid loss-masked[/bold]", f"[bold]{_fmt_int(acc['tokens_valid'])}[/bold]")
    at.add_row("sequences", _fmt_int(acc["sequences_total"]))
    at.add_row("  with valid tokens", _fmt_int(acc["sequences_valid"]))
    at.add_row("  without loss-masked tokens", _fmt_int(acc["sequences_without_masked_tokens"]))
    console.print(at)
    if acc["exclusions"]:
        for reason in acc["exclusions"]:
            console.print(f"  {reason}: {EXCLUSION_REASONS.get(reason, '')}")

    st = acc.get("steps")
    lines = []
    if st:
        lines.append(f"steps: {st['count']}" + (
            f" ({st['min']}..{st['max']})" if st.get("min") is not None else "")
            + (" (steps are counted over the valid tokens: this input has none)"
               if not st["count"] and not acc.get("tokens_valid") else ""))
    if acc.get("policy_versions"):
        lo, hi = acc["policy_versions"]
        lines.append(f"policy_version: {lo}..{hi}")
    if acc.get("train_versions"):
        lo, hi = acc["train_versions"]
        lines.append(f"train_version: {lo}..{hi}")
    if acc.get("staleness_tokens"):
        lines.append(
            "staleness (tokens): "
            + ", ".join(f"{k}: {int(v):,}" for k, v in acc["staleness_tokens"].items())
        )
    if acc.get("sequences_with_version_switch") is not None:
        lines.append(f"sequences with an in-flight version switch: "
                     f"{acc['sequences_with_version_switch']:,}")
    if acc.get("sequences_with_duplicate_positions"):
        lines.append(f"sequences with duplicated (step, seq_id, position): "
                     f"{acc['sequences_with_duplicate_positions']:,} (their tokens count twice)")
    for line in lines:
        console.print(line)
    ct = Table("analysis", "available", title="What this data allows", show_edge=False)
    for name, reason in desc["capabilities"].items():
        ct.add_row(literal(name), literal("yes" if reason is None else f"no: {reason}"))
    console.print(ct)
