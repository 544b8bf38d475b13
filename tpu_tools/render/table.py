"""One table description, rendered as rich (terminal) or fixed-width plain text (pipes)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from tpu_tools.sanitize import safe_text

if TYPE_CHECKING:
    from rich.table import Table as RichTable


@dataclass
class Column:
    header: str
    align: Literal["left", "right"] = "left"
    style: str | None = None  # rich style on terminals
    max_width: int | None = None  # rich folds longer cells; plain text never truncates
    no_wrap: bool = False  # rich keeps the cells on one line; other columns give way on narrow terminals
    priority: int = 0  # on a terminal too narrow for every column, lower priorities are left out first


@dataclass
class TableData:
    columns: list[Column]
    rows: list[list[str]] = field(default_factory=list)
    title: str | None = None
    styles: dict[tuple[int, int], str] = field(default_factory=dict)  # (row, column) -> rich style on terminals

    def add_row(self, *cells: object) -> None:
        self.rows.append(["" if c is None else str(c) for c in cells])

    def style_last(self, column: int, style: str) -> None:
        """A rich style for one cell of the last row added (plain text has none: the cell's words carry it)."""
        self.styles[(len(self.rows) - 1, column)] = style


def _safe_rows(table: TableData) -> list[list[str]]:
    # cells often carry outside text (command lines, host names, error messages): never raw to a terminal
    return [[safe_text(cell) for cell in row] for row in table.rows]


def plain_table(table: TableData, gap: int = 2) -> str:
    """Fixed-width text: stable for scripts and diff-friendly; no colour, no box drawing."""
    headers = [safe_text(c.header) for c in table.columns]
    rows = _safe_rows(table)
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))

    def line(cells: list[str]) -> str:
        parts = []
        for i, cell in enumerate(cells):
            last = i == len(cells) - 1
            if table.columns[i].align == "right":
                parts.append(cell.rjust(widths[i]))
            else:
                parts.append(cell if last else cell.ljust(widths[i]))
        return (" " * gap).join(parts).rstrip()

    lines = [safe_text(table.title)] if table.title else []
    lines.append(line(headers))
    lines.extend(line(row) for row in rows)
    return "\n".join(lines)


_CELL_PADDING = 3  # rich's (0, 1) padding on either side of a cell, and the column divider
_EDGE = 1
_LONGEST_WORD_KEPT = 16  # a longer word (a path, a command line) is folded rather than widening its column


def _longest_word(text: str) -> int:
    return max((len(word) for word in text.split()), default=0)


def min_widths(table: TableData) -> list[int]:
    """Per column, the narrowest width that breaks no header word and (up to a cap) no cell word."""
    rows = _safe_rows(table)
    widths = []
    for i, column in enumerate(table.columns):
        cells = max((_longest_word(row[i]) for row in rows if i < len(row)), default=0)
        widths.append(max(_longest_word(safe_text(column.header)), min(cells, _LONGEST_WORD_KEPT), 1))
    return widths


def columns_that_fit(table: TableData, width: int) -> list[int]:
    """Indices of the columns to show in `width` characters: the lowest priority (then rightmost) goes first.

    The first column (what a row is about) always stays.
    """
    minimum = min_widths(table)
    kept = list(range(len(table.columns)))
    by_drop_order = sorted(kept[1:], key=lambda i: (table.columns[i].priority, -i))
    while by_drop_order and sum(minimum[i] + _CELL_PADDING for i in kept) + _EDGE > width:
        kept.remove(by_drop_order.pop(0))
    return kept


def rich_table(table: TableData, width: int | None = None) -> RichTable:
    """A rich table; given the terminal `width`, columns that cannot fit without breaking words are left out
    (lowest priority first) and named in the caption."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    kept = columns_that_fit(table, width) if width else list(range(len(table.columns)))
    minimum = min_widths(table)
    hidden = [safe_text(c.header) for i, c in enumerate(table.columns) if i not in kept]
    caption = f"(not shown at this width: {', '.join(hidden)})" if hidden else None
    # Text, not str: rich would read "[link=...]" or "[red]" in a cell as markup
    result = Table(title=Text(safe_text(table.title)) if table.title else None, box=box.SIMPLE_HEAD,
                   title_justify="left", header_style="bold", caption=caption, caption_justify="left")
    for i in kept:
        column = table.columns[i]
        result.add_column(Text(safe_text(column.header)), justify=column.align, style=column.style,
                          max_width=column.max_width, min_width=minimum[i] if width else None, overflow="fold",
                          no_wrap=column.no_wrap)
    for r, row in enumerate(_safe_rows(table)):
        result.add_row(*(Text(row[i], style=table.styles.get((r, i), "")) if i < len(row) else Text("")
                         for i in kept))
    return result
