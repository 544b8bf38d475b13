"""The live tpu-top screen: curses, keys, resizes, and a terminal restored however it ends.

Reports are gathered by a `Collector` on its own thread; the loop sleeps in
`getch` until a key arrives (handled at once, from the last report) or until
the next report is due (`wake_ms`), then picks up a new report if there is one,
and paints only the lines that changed (`Painter`). A slow source makes
the figures older, never the keys slower. `q`, Ctrl-C and SIGTERM all leave through
the same `finally`, which gives the terminal back as it was (main screen,
echo, line mode, cursor). Nothing else writes to the terminal meanwhile:
stderr is held until the screen is gone.
"""

from __future__ import annotations

import contextlib
import curses
import locale
import os
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from tpu_tools.errors import UsageError
from tpu_tools.metrics.records.report import waiting_report
from tpu_tools.parsing import MAX_COLUMNS, MAX_LINES
from tpu_tools.sanitize import safe_text
from tpu_tools.top import signals
from tpu_tools.top.collector import Collector
from tpu_tools.top.drawing import (
    BAR_HIGH,
    BAR_LOW,
    BAR_MID,
    COLUMNS,
    DIM,
    ERROR,
    HEADER,
    NORMAL,
    SELECTED,
    SORTED,
    TITLE,
    WARN,
    Line,
)
from tpu_tools.top.frame import render
from tpu_tools.top.history import History
from tpu_tools.top.keys import QUIT, handle_key
from tpu_tools.top.model import ViewState

_KEYS = {
    curses.KEY_UP: "up", curses.KEY_DOWN: "down", curses.KEY_PPAGE: "pageup", curses.KEY_NPAGE: "pagedown",
    curses.KEY_HOME: "home", curses.KEY_END: "end",
}


class _Terminated(Exception):
    """SIGTERM arrived: leave through the same clean-up as `q`."""


def _raise_terminated(signum: int, frame: Any) -> None:
    raise _Terminated()


def styles_for(colour: bool = True) -> dict[str, int]:
    """Curses attributes for the frame's styles. Colours carry meaning (green to red as a bar fills, red for
    errors and lost devices, yellow for warnings); without colour (NO_COLOR, a monochrome terminal) the same
    styles are told apart by bold, dim and reverse. Text keeps the terminal's own background, so a light
    theme stays readable; on 256-colour terminals the yellow is a darker amber that reads on white too."""
    styles = {NORMAL: curses.A_NORMAL, TITLE: curses.A_BOLD, HEADER: curses.A_REVERSE, COLUMNS: curses.A_REVERSE,
              SORTED: curses.A_REVERSE | curses.A_BOLD, SELECTED: curses.A_REVERSE | curses.A_BOLD,
              BAR_LOW: curses.A_BOLD, BAR_MID: curses.A_BOLD, BAR_HIGH: curses.A_BOLD, DIM: curses.A_DIM,
              ERROR: curses.A_BOLD, WARN: curses.A_BOLD | curses.A_UNDERLINE}
    if not colour or not curses.has_colors():
        return styles
    try:
        curses.start_color()
        curses.use_default_colors()
        background = -1
    except curses.error:
        background = curses.COLOR_BLACK
    rich = getattr(curses, "COLORS", 8) >= 256
    pairs = {BAR_LOW: 34 if rich else curses.COLOR_GREEN, BAR_MID: 172 if rich else curses.COLOR_YELLOW,
             BAR_HIGH: 160 if rich else curses.COLOR_RED, ERROR: 160 if rich else curses.COLOR_RED,
             TITLE: 31 if rich else curses.COLOR_CYAN, WARN: 172 if rich else curses.COLOR_YELLOW}
    for number, (style, foreground) in enumerate(pairs.items(), start=1):
        try:
            curses.init_pair(number, foreground, background)
            styles[style] = curses.color_pair(number) | (curses.A_BOLD if style != TITLE else 0)
        except curses.error:
            pass
    try:
        curses.init_pair(len(pairs) + 1, curses.COLOR_BLACK, curses.COLOR_GREEN)
        styles[COLUMNS] = curses.color_pair(len(pairs) + 1)
        curses.init_pair(len(pairs) + 2, curses.COLOR_BLACK, curses.COLOR_CYAN)
        styles[SORTED] = curses.color_pair(len(pairs) + 2) | curses.A_BOLD
    except curses.error:
        pass
    return styles


Run = tuple[str, int]  # text and its curses attribute


def line_runs(line: Line, styles: dict[str, int], width: int) -> tuple[Run, ...]:
    """What a line puts on the screen, cut to `width`: runs of text of one attribute each (neighbouring segments
    that look alike become one run, one call to curses), then the fill's spaces."""
    runs: list[Run] = []
    pieces: list[str] = []
    attribute = curses.A_NORMAL
    x = 0
    for segment in line.segments:
        if not segment.text:
            continue
        style = styles.get(segment.style, curses.A_NORMAL)
        if pieces and style != attribute:
            x = _add_run(runs, pieces, attribute, x, width)
            pieces = []
        attribute = style
        pieces.append(segment.text)
    if pieces:
        x = _add_run(runs, pieces, attribute, x, width)
    if line.fill is not None and x < width:
        runs.append((" " * (width - x), styles.get(line.fill, curses.A_NORMAL)))
    return tuple(runs)


def _add_run(runs: list[Run], pieces: list[str], attribute: int, x: int, width: int) -> int:
    text = safe_text("".join(pieces))[: max(0, width - x)]  # names and commands come from other processes
    if text:
        runs.append((text, attribute))
    return x + len(text)


class Painter:
    """Paints frames into a curses window, writing only the lines that differ from the frame painted before
    (curses then sends the terminal only the cells that changed, as it would for the whole frame): most lines
    of a frame, titles, headers, blank lines and the rows whose figures held still, cost nothing to paint
    again. A frame of another size is painted whole, on a cleared window."""

    def __init__(self, window: Any, styles: dict[str, int]):
        self.window = window
        self.styles = styles
        self._shown: list[tuple[Run, ...]] = []  # each painted line's runs, top first
        self._size = (0, 0)
        self.lines_written = 0  # lines written to the window since it was made (the tests read it)

    def paint(self, lines: list[Line], width: int, height: int) -> None:
        window = self.window
        if (width, height) != self._size:  # resized: nothing on the window can be trusted to stand
            window.erase()
            self._shown, self._size = [], (width, height)
        shown = [line_runs(line, self.styles, width) for line in lines[:height]]
        for y, runs in enumerate(shown):
            if y < len(self._shown) and self._shown[y] == runs:
                continue
            self._write(y, runs, width)
        for y in range(len(shown), len(self._shown)):  # lines the last frame had and this one has not
            self._write(y, (), width)
        self._shown = shown
        window.noutrefresh()
        curses.doupdate()

    def _write(self, y: int, runs: tuple[Run, ...], width: int) -> None:
        window = self.window
        x = 0
        for text, attribute in runs:
            try:
                window.addstr(y, x, text, attribute)
            except curses.error:  # writing the bottom-right cell moves the cursor off screen; harmless
                pass
            x += len(text)
        if x < width:  # the rest of the line as erase() leaves it
            try:
                window.move(y, x)
                window.clrtoeol()
            except curses.error:
                pass
        self.lines_written += 1


@contextlib.contextmanager
def _stderr_held() -> Iterator[None]:
    """While the screen is up, what libraries write to stderr (fd 2) waits in a file instead of tearing the
    screen; it is written out once the terminal is restored."""
    try:
        held, saved = tempfile.TemporaryFile(), os.dup(2)
    except OSError:
        yield
        return
    try:
        sys.stderr.flush()
        os.dup2(held.fileno(), 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        held.seek(0)
        text = held.read()
        held.close()
        if text:
            sys.stderr.buffer.write(text)
            sys.stderr.flush()


def run_screen(collector: Collector, state: ViewState, history: History | None = None) -> None:
    """Show the collector's reports until q, Ctrl-C or SIGTERM; the collector gathers them meanwhile."""
    with _stderr_held():
        _run_screen(collector, state, history)


def _run_screen(collector: Collector, state: ViewState, history: History | None) -> None:
    locale.setlocale(locale.LC_ALL, "")
    os.environ.setdefault("ESCDELAY", "25")  # Esc alone is a key here (back), not the start of a sequence
    previous_term = signal.signal(signal.SIGTERM, _raise_terminated)
    for name in ("COLUMNS", "LINES"):  # curses prefers them to the terminal's own size: a 3000-column frame in 100
        os.environ.pop(name, None)
    try:
        window = curses.initscr()
    except curses.error as error:
        signal.signal(signal.SIGTERM, previous_term)
        raise UsageError(f"cannot use this terminal ({error}); check TERM, or use --once") from error
    try:
        curses.noecho()
        curses.cbreak()
        window.keypad(True)
        try:
            curses.curs_set(0)
        except curses.error:
            pass
        _enable_mouse()
        styles = styles_for(colour="NO_COLOR" not in os.environ)
        _loop(window, collector, state, history, styles)
    except (KeyboardInterrupt, _Terminated):
        pass
    finally:
        window.keypad(False)
        curses.nocbreak()
        curses.echo()
        try:
            curses.curs_set(1)
        except curses.error:
            pass
        curses.endwin()
        signal.signal(signal.SIGTERM, previous_term)


# With mouseinterval 0, curses reports a button at once, as a press or (press and release read together) a click.
_MOUSE_CLICK = curses.BUTTON1_PRESSED | curses.BUTTON1_CLICKED
_WHEEL_UP = curses.BUTTON4_PRESSED
_WHEEL_DOWN = getattr(curses, "BUTTON5_PRESSED", 0)  # ncurses 6 has it; older ones report no wheel down


def _enable_mouse() -> None:
    """Clicks select a row and the wheel scrolls, where the terminal reports the mouse; a terminal that does
    not simply sends no mouse events, and the keys do everything."""
    try:
        curses.mouseinterval(0)
        curses.mousemask(_MOUSE_CLICK | _WHEEL_UP | _WHEEL_DOWN)
    except curses.error:
        pass


def mouse_key(event: tuple[int, int, int, int, int]) -> str:
    """A curses mouse event as handle_key's key: "click:LINE", "wheelup", "wheeldown", or "" (ignored)."""
    _, _, y, _, buttons = event
    if buttons & _WHEEL_UP:
        return "wheelup"
    if _WHEEL_DOWN and buttons & _WHEEL_DOWN:
        return "wheeldown"
    if buttons & _MOUSE_CLICK:
        return f"click:{y}"
    return ""


# How long the loop waits for a key before it looks for a new report (keys end the wait at once): until the next
# report is due, then from _SOON_MS growing to _WAKE_MS while it is late; each wake costs the process more than its
# few lines (the code is cold after a wait), and ten a second were a fifth of tpu-top's CPU at a 1 s refresh.
_WAKE_MS = 100  # the longest wait while something may change at any moment (a late report, an arrays read)
_SOON_MS = 10
_IDLE_MS = 1000  # the longest wait of all
_WAITING = waiting_report()  # shown until the first report arrives


def wake_ms(collector: Collector, state: ViewState, now: float) -> int:
    """The loop's next wait for a key, in ms: a little past the time the next report is due, or, while it is late
    (being gathered, a slow source, the first one), as long as it has been late, from 10 to 100 ms; 100 ms while
    a job's arrays are being read; never past the end of the message shown."""
    wait = _IDLE_MS / 1000
    due = collector.next_due()
    if due is not None:
        late = now - due
        wait = min(wait, max(_SOON_MS / 1000, min(_WAKE_MS / 1000, late)) if late >= 0 else _SOON_MS / 1000 - late)
    if state.arrays.pending():
        wait = min(wait, _WAKE_MS / 1000)
    if state.message is not None:
        wait = min(wait, max(0.0, state.message[2] - now) + 0.001)
    return max(1, round(wait * 1000))


def _key_name(code: int) -> str:
    if code in _KEYS:
        return _KEYS[code]
    if code in (curses.KEY_ENTER, 10, 13):
        return "enter"
    if code == 27:
        return "escape"
    if code in (curses.KEY_BACKSPACE, 127, 8):
        return "backspace"
    return chr(code) if 0 <= code < 128 else ""


def _loop(window: Any, collector: Collector, state: ViewState, history: History | None,
          styles: dict[str, int]) -> None:
    snapshot = collector.wait_first(0.3)  # a quick source shows at once; a slow one does not hold the screen
    report = snapshot.report if snapshot else _WAITING
    if snapshot is not None and history is not None:
        history.record(report, state.report_rows(report))
    shown_message: tuple[str, bool] | None = None
    failed_sequence = 0
    arrays_version = state.arrays.version  # a read of a job's arrays started or ended: redraw

    painter = Painter(window, styles)

    def draw() -> None:
        height, width = window.getmaxyx()
        height, width = min(height, MAX_LINES), min(width, MAX_COLUMNS)
        painter.paint(render(report, state, width, height, interactive=True, history=history), width, height)

    draw()
    while True:
        window.timeout(wake_ms(collector, state, time.monotonic()))
        code = window.getch()
        if code == -1:
            latest = collector.latest()
            message = state.current_message()
            if (latest is not None and latest.error and latest.sequence != failed_sequence) \
                    or (not state.paused and latest is not None and latest.report is not report) \
                    or message != shown_message or state.arrays.version != arrays_version:
                arrays_version = state.arrays.version
                if not state.paused and latest is not None and latest.report is not report:
                    report = latest.report
                    if history is not None:
                        history.record(report, state.report_rows(report))
                if latest is not None and latest.error and latest.sequence != failed_sequence:
                    failed_sequence = latest.sequence  # say it once; the screen keeps the last figures
                    state.say(f"gathering the report failed: {latest.error}", error=True)
                    message = state.current_message()
                shown_message = message
                draw()
            continue
        if code == curses.KEY_RESIZE:
            curses.update_lines_cols()
            draw()
            continue
        key = _key_name(code)
        if code == curses.KEY_MOUSE:
            try:
                key = mouse_key(curses.getmouse())
            except curses.error:  # an event curses could not decode
                continue
        if not key:
            continue
        was_paused = state.paused
        rows = state.listed_rows(report)
        if handle_key(state, key, rows, signals.send, signals.refusal) == QUIT:
            return
        if was_paused != state.paused:
            collector.pause(state.paused)
        shown_message = state.current_message()
        draw()
