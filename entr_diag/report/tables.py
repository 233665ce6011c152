"""Terminal tables that fit the console: a table wider than the console is printed as
several tables, each holding the leading key columns (bin, step, stratum...) and as many of
the other columns as fit, numbers never cut.

rich shrinks a table to the console by wrapping its columns; a column of numbers that may
not wrap (``no_wrap``, or a ``min_width`` of its widest cell) is instead cut to ``0.00…``
or, past the console's edge, cropped away silently. At 80 columns that made ``fit``'s bin
and metrics tables and ``compare``'s keep-rate tables unreadable. :func:`print_fitting`
measures the table's natural width (its widest cell per column) and, where it does not
fit, splits the columns after the keys into consecutive groups, one table each, titled
``(1 of n)``.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.cells import cell_len
from rich.console import Console
from rich.table import Column, Table

__all__ = ["natural_width", "print_fitting", "split_table"]


def _text_len(x: object) -> int:
    return max((cell_len(line) for line in str(x).splitlines()), default=0)


def natural_width(col: Column) -> int:
    """A column's width without wrapping: its widest cell or header (terminal cells)."""
    return max([_text_len(col.header), *(_text_len(c) for c in col._cells), 1])


def _copy(table: Table, title: str | None, cols: Sequence[Column]) -> Table:
    out = Table(title=title, box=table.box, pad_edge=table.pad_edge,
                collapse_padding=table.collapse_padding, title_justify=table.title_justify,
                show_header=table.show_header, show_edge=table.show_edge,
                title_style=table.title_style)
    for c in cols:
        out.add_column(c.header, justify=c.justify, style=c.style, no_wrap=c.no_wrap,
                       overflow=c.overflow, min_width=max(c.min_width or 0, natural_width(c)))
    for r in range(table.row_count):
        out.add_row(*[c._cells[r] for c in cols])
    return out


def split_table(table: Table, width: int, keys: int = 1) -> list[Table]:
    """``table`` as one or more tables no wider than ``width`` terminal cells (where its
    key columns and any one other column fit): the first ``keys`` columns repeat in every
    part, the others are spread over the parts in their order; every column keeps its
    widest cell (never cut). One part: the table itself, unchanged."""
    cols = list(table.columns)
    # per column: its width plus its share of the padding and the box's separators
    pad = (1 if table.collapse_padding else 2) + (1 if table.box is not None else 0)
    edge = 2 if table.box is not None and table.show_edge else 0
    need = [natural_width(c) + pad for c in cols]
    if sum(need) + edge <= width or len(cols) <= keys + 1:
        return [table]
    base = sum(need[:keys]) + edge
    groups: list[list[int]] = [[]]
    used = base
    for i in range(keys, len(cols)):
        if groups[-1] and used + need[i] > width:
            groups.append([])
            used = base
        groups[-1].append(i)
        used += need[i]
    if len(groups) == 1:
        return [table]
    title = str(table.title) if table.title is not None else None
    out = []
    for n, grp in enumerate(groups):
        part = f"{title} ({n + 1} of {len(groups)})" if title else None
        out.append(_copy(table, part, [*cols[:keys], *(cols[i] for i in grp)]))
    return out


def print_fitting(console: Console, table: Table, keys: int = 1) -> None:
    """Print ``table`` to ``console``, split over several tables where it is wider than the
    console (:func:`split_table`)."""
    for t in split_table(table, console.width, keys):
        console.print(t)
