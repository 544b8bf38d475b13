"""The live tpu-top screen: curses, keys, resizes, and a terminal restored however it ends.

The loop sleeps in `getch` until a key arrives or the next refresh is due, so
between refreshes it costs nothing. `q`, Ctrl-C and SIGTERM all leave through
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
from collections.abc import Callable, Iterator
from typing import Any

from tpu_tools.errors import UsageError
from tpu_tools.sanitize import safe_text
from tpu_tools.top.frame import (
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
    Line,
    render,
)
from tpu_tools.top.model import QUIT, ViewState, handle_key, rows_from_report

_KEYS = {
    curses.KEY_UP: "up", curses.KEY_DOWN: "down", curses.KEY_PPAGE: "pageup", curses.KEY_NPAGE: "pagedown",
    curses.KEY_HOME: "home", curses.KEY_END: "end",
}


class _Terminated(Exception):
    """SIGTERM arrived: leave through the same clean-up as `q`."""


def _raise_terminated(signum: int, frame: Any) -> None:
    raise _Terminated()


def _styles() -> dict[str, int]:
    styles = {NORMAL: curses.A_NORMAL, TITLE: curses.A_BOLD, HEADER: curses.A_REVERSE, COLUMNS: curses.A_REVERSE,
              SORTED: curses.A_REVERSE | curses.A_BOLD, SELECTED: curses.A_REVERSE | curses.A_BOLD,
              BAR_LOW: curses.A_BOLD, BAR_MID: curses.A_BOLD, BAR_HIGH: curses.A_BOLD, DIM: curses.A_DIM,
              ERROR: curses.A_BOLD}
    if not curses.has_colors():
        return styles
    try:
        curses.start_color()
        curses.use_default_colors()
        background = -1
    except curses.error:
        background = curses.COLOR_BLACK
    pairs = {BAR_LOW: curses.COLOR_GREEN, BAR_MID: curses.COLOR_YELLOW, BAR_HIGH: curses.COLOR_RED,
             ERROR: curses.COLOR_RED, TITLE: curses.COLOR_CYAN}
    for number, (style, colour) in enumerate(pairs.items(), start=1):
        try:
            curses.init_pair(number, colour, background)
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


def _paint(window: Any, lines: list[Line], styles: dict[str, int], width: int, height: int) -> None:
    window.erase()
    for y, line in enumerate(lines[:height]):
        x = 0
        for segment in line.segments:
            text = safe_text(segment.text)[: max(0, width - x)]  # names and commands come from other processes
            if not text:
                continue
            try:
                window.addstr(y, x, text, styles.get(segment.style, curses.A_NORMAL))
            except curses.error:  # writing the bottom-right cell moves the cursor off screen; harmless
                pass
            x += len(text)
        if line.fill is not None and x < width:
            try:
                window.addstr(y, x, " " * (width - x), styles.get(line.fill, curses.A_NORMAL))
            except curses.error:
                pass
    window.noutrefresh()
    curses.doupdate()


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


def run_screen(build: Callable[[], dict[str, Any]], state: ViewState) -> None:
    """Show reports from `build()` every `state.interval_s` until q, Ctrl-C or SIGTERM."""
    with _stderr_held():
        _run_screen(build, state)


def _run_screen(build: Callable[[], dict[str, Any]], state: ViewState) -> None:
    locale.setlocale(locale.LC_ALL, "")
    previous_term = signal.signal(signal.SIGTERM, _raise_terminated)
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
        styles = _styles()
        _loop(window, build, state, styles)
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


def _loop(window: Any, build: Callable[[], dict[str, Any]], state: ViewState, styles: dict[str, int]) -> None:
    report = build()
    next_refresh = time.monotonic() + state.interval_s

    def draw() -> None:
        height, width = window.getmaxyx()
        _paint(window, render(report, state, width, height, interactive=True), styles, width, height)

    draw()
    while True:
        wait_s = next_refresh - time.monotonic()
        window.timeout(max(0, int(wait_s * 1000)) if not state.paused else 1000)
        code = window.getch()
        if code == -1:
            if not state.paused and time.monotonic() >= next_refresh:
                report = build()
                next_refresh = max(next_refresh + state.interval_s, time.monotonic() + 0.05)
                draw()
            continue
        if code == curses.KEY_RESIZE:
            curses.update_lines_cols()
            draw()
            continue
        key = _KEYS.get(code) or (chr(code) if 0 <= code < 256 else "")
        was_paused = state.paused
        if handle_key(state, key, rows_from_report(report)) == QUIT:
            return
        if was_paused and not state.paused:
            report = build()
            next_refresh = time.monotonic() + state.interval_s
        draw()
