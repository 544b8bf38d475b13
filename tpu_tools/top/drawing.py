"""The drawing primitives of tpu-top's frames: styled segments and lines, bars, graphs, column layout.

Below every panel (the frame, the job screen, the fleet panel), which draw with them; nothing here knows a
report. Every character drawn is one terminal cell.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from tpu_tools.units import MISSING, format_duration_us

# Styles the screen maps to colours and attributes.
NORMAL, TITLE, HEADER, COLUMNS, SORTED, SELECTED, BAR_LOW, BAR_MID, BAR_HIGH, DIM, ERROR, WARN = (
    "normal", "title", "header", "columns", "sorted", "selected", "bar_low", "bar_mid", "bar_high", "dim", "error",
    "warn")

_SPARK_UNICODE = " \u2581\u2582\u2583\u2584\u2585\u2586\u2587\u2588"
_SPARK_ASCII = " .:-=+*#@"
_NARROW_GRAPHICS = (0x2580, 0x28FF)  # block elements and braille: one cell each


@dataclass(slots=True)
class Segment:
    text: str
    style: str = NORMAL


@dataclass
class Line:
    segments: list[Segment] = field(default_factory=list)
    fill: str | None = None  # a style painted to the end of the line (header bars, selection)

    def add(self, text: str, style: str = NORMAL) -> Line:
        self.segments.append(Segment(_printable(text), style))
        return self

    @property
    def text(self) -> str:
        return "".join(s.text for s in self.segments)

    def cut(self, width: int) -> Line:
        """The line cut to `width` (the line itself where it fits)."""
        if sum([len(segment.text) for segment in self.segments]) <= width:
            return self
        out, used = Line(fill=self.fill), 0
        for segment in self.segments:
            if used >= width:
                break
            piece = segment.text[: width - used]
            out.segments.append(Segment(piece, segment.style))
            used += len(piece)
        return out


_WITHOUT_GRAPHICS = {code: None for code in range(_NARROW_GRAPHICS[0], _NARROW_GRAPHICS[1] + 1)}


def _printable(text: str) -> str:
    # One terminal cell per character: control and wide characters would break the layout.
    rest = text.translate(_WITHOUT_GRAPHICS) if not text.isascii() else text
    if rest.isascii() and rest.isprintable():  # the common case, checked at C speed: every frame runs this
        return text
    return "".join(c if c.isprintable() and (ord(c) < 0x1100 or _NARROW_GRAPHICS[0] <= ord(c) <= _NARROW_GRAPHICS[1])
                   else "?" for c in text)


def fit(text: str, width: int, right: bool = False) -> str:
    if len(text) > width:
        text = text[: max(0, width - 1)] + "~" if width > 1 else text[:width]
    return text.rjust(width) if right else text.ljust(width)


def parts_line(parts: list[tuple[str, str]], width: int, separator: str = "  ") -> Line:
    """Whole parts, in order, while they fit: a header never ends in half a word."""
    line, used = Line(), 0
    for index, (text, style) in enumerate(parts):
        piece = (separator if index and used else "") + text
        if used + len(piece) > width:
            continue
        line.add(piece, style)
        used += len(piece)
    return line


def level_style(fraction: float | None) -> str:
    """Green while there is room, yellow from 70 %, red from 90 %."""
    if fraction is None:
        return DIM
    return BAR_HIGH if fraction >= 0.9 else BAR_MID if fraction >= 0.7 else BAR_LOW


def bar_segments(fraction: float | None, width: int) -> list[Segment]:
    """`[|||||     ]`, coloured by how full it is; an unknown fraction is an empty bar."""
    inner = max(1, width - 2)
    if fraction is None:
        return [Segment("[" + " " * inner + "]", DIM)]
    fraction = max(0.0, min(1.0, fraction))
    filled = int(round(fraction * inner))
    return [Segment("["), Segment("|" * filled, level_style(fraction)), Segment(" " * (inner - filled) + "]")]


def sparkline(values: list[float | None], width: int, top: float | None = None, unicode: bool = True) -> str:
    """The last `width` values as one line of bars scaled to `top` (else their maximum); a gap is a space."""
    if width <= 0:
        return ""
    values = values[-width:]
    marks = _SPARK_UNICODE if unicode else _SPARK_ASCII
    known = [v for v in values if v is not None]
    scale = top if top else (max(known) if known else 0.0)
    if scale <= 0:
        return "".join(" " if v is None else marks[1] for v in values)
    steps = (len(marks) - 1) / scale
    last = len(marks) - 1
    return "".join(" " if v is None else marks[min(last, max(1, round(v * steps)))] for v in values)


def graph_rows(values: list[float | None], width: int, rows: int, top: float | None = None,
               unicode: bool = True) -> list[str]:
    """The last `width` values as a bar graph `rows` lines tall (eighths of a cell in Unicode), top line first."""
    values = values[-width:] if width > 0 else []
    known = [v for v in values if v is not None]
    scale = top if top else (max(known) if known else 0.0)
    if scale <= 0:
        return [" " * len(values) for _ in range(rows)]
    # Each value's height in eighths of a cell once (0: a gap; a known value shows at least one eighth), then
    # each line as one lookup per value, at C speed: a tall history panel draws thousands of cells a frame.
    tall = rows * 8
    heights = [0 if value is None else max(1, round(min(1.0, max(0.0, value / scale)) * tall)) for value in values]
    return ["".join(map(ramp.__getitem__, heights)) for ramp in _graph_ramps(rows, unicode)]


@functools.lru_cache(maxsize=64)
def _graph_ramps(rows: int, unicode: bool) -> list[tuple[str, ...]]:
    """For each line of a graph `rows` tall, top first: the character it shows for each height in eighths."""
    tall = rows * 8
    ramps = []
    for row in range(rows - 1, -1, -1):
        floor = row * 8
        ramps.append((" ", *(_SPARK_UNICODE[max(0, min(8, height - floor))] if unicode
                             else ("#" if height - floor >= 4 else " ") for height in range(1, tall + 1))))
    return ramps


def percent_text(value: float | None) -> str:
    return MISSING if value is None else f"{value:.1f}"


def seconds_text(value: float | None) -> str:
    return format_duration_us(None if value is None else value * 1e6)


def short_command(command: str | None) -> str:
    if not command:
        return MISSING
    words = command.split()
    words[0] = words[0].rsplit("/", 1)[-1]
    return " ".join(words)


# --- column layout ---------------------------------------------------------------------------------------

@dataclass
class Column:
    key: str
    title: str
    width: int  # the fixed width, or the least width of a flexible column
    right: bool = False
    priority: int = 0  # 0 is kept longest; the highest priority goes first when the terminal is narrow
    flex_max: int = 0  # > width: the column takes spare room up to this width


def layout(columns: list[Column], width: int) -> list[tuple[Column, int]]:
    """The columns that fit `width` (one leading space, one between columns), in their order, with widths."""
    # A column is never narrower than its title: a header word is never cut.
    columns = [c if c.width >= len(c.title) else
               Column(c.key, c.title, len(c.title), c.right, c.priority, max(c.flex_max, len(c.title)))
               for c in columns]
    kept: list[Column] = []
    used = 1
    for column in sorted(columns, key=lambda c: c.priority):
        need = column.width + (1 if kept else 0)
        if used + need <= width:
            kept.append(column)
            used += need
    ordered = [c for c in columns if c in kept]
    widths = {c.key: c.width for c in ordered}
    spare = width - used
    flexible = [c for c in ordered if c.flex_max > c.width]
    while spare > 0 and flexible:  # share the spare room out evenly among the flexible columns
        share = max(1, spare // len(flexible))
        for column in list(flexible):
            grow = min(share, column.flex_max - widths[column.key], spare)
            widths[column.key] += grow
            spare -= grow
            if widths[column.key] >= column.flex_max:
                flexible.remove(column)
            if spare <= 0:
                break
    return [(c, widths[c.key]) for c in ordered]


def column_header(columns: list[tuple[Column, int]], sorted_key: str | None = None) -> Line:
    line = Line(fill=COLUMNS).add(" ", COLUMNS)
    for index, (column, size) in enumerate(columns):
        line.add(("" if index == 0 else " "), COLUMNS)
        line.add(fit(column.title, size, column.right), SORTED if column.key == sorted_key else COLUMNS)
    return line


def table_row(columns: list[tuple[Column, int]], cells: dict[str, list[Segment] | tuple[str, str]],
         fill: str | None = None) -> Line:
    line = Line(fill=fill)
    segments = line.segments
    gap_style = fill or NORMAL
    for column, size in columns:  # a space before each column: the row's first one, then one between two
        cell = cells.get(column.key, (MISSING, NORMAL))
        if isinstance(cell, tuple):
            text, style = cell[0], fill or cell[1]
            text = _printable(fit(text, size, column.right))
            if style == gap_style:  # the space and the cell in one segment: half the segments to draw
                segments.append(Segment(" " + text, style))
            else:
                segments += (Segment(" ", gap_style), Segment(text, style))
        else:  # segments drawn to the column's width (bars, graphs)
            segments.append(Segment(" ", gap_style))
            segments += _stretch(cell, size, fill)
    if not columns:
        segments.append(Segment(" ", gap_style))
    return line


def _stretch(segments: list[Segment], size: int, fill: str | None) -> list[Segment]:
    out, used = [], 0
    for segment in segments:
        piece = _printable(segment.text)[: size - used]
        out.append(Segment(piece, segment.style if fill is None else fill))
        used += len(piece)
    if used < size:
        out.append(Segment(" " * (size - used), fill or NORMAL))
    return out
