"""One table description, rendered as rich (terminal) or fixed-width plain text (pipes)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from rich.table import Table as RichTable


@dataclass
class Column:
    header: str
    align: Literal["left", "right"] = "left"
    style: str | None = None  # rich style on terminals
    max_width: int | None = None  # rich folds longer cells; plain text never truncates
    no_wrap: bool = False  # rich keeps the cells on one line; other columns give way on narrow terminals


@dataclass
class TableData:
    columns: list[Column]
    rows: list[list[str]] = field(default_factory=list)
    title: str | None = None

    def add_row(self, *cells: object) -> None:
        self.rows.append(["" if c is None else str(c) for c in cells])


def plain_table(table: TableData, gap: int = 2) -> str:
    """Fixed-width text: stable for scripts and diff-friendly; no colour, no box drawing."""
    headers = [c.header for c in table.columns]
    widths = [len(h) for h in headers]
    for row in table.rows:
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

    lines = [table.title] if table.title else []
    lines.append(line(headers))
    lines.extend(line(row) for row in table.rows)
    return "\n".join(lines)


def rich_table(table: TableData) -> RichTable:
    from rich import box
    from rich.table import Table

    result = Table(title=table.title, box=box.SIMPLE_HEAD, title_justify="left", header_style="bold")
    for column in table.columns:
        result.add_column(column.header, justify=column.align, style=column.style, max_width=column.max_width,
                          overflow="fold", no_wrap=column.no_wrap)
    for row in table.rows:
        result.add_row(*row)
    return result
