"""tpu-top's painter in a real terminal, frame after frame, for tests/test_top_cost.py.

    python painter_screen.py FRAMES.json STATUS

FRAMES.json holds monitor report documents. The first is painted at once; each key paints the next (the last
stays), a resize paints the current one at the new size, `q` ends. After each paint STATUS holds one line:
"<report index> <width>x<height> <lines written since the start>", written whole (a rename).
"""

from __future__ import annotations

import curses
import json
import os
import sys
from pathlib import Path

from tpu_tools.metrics.records.report import report_from_document
from tpu_tools.top.frame import render
from tpu_tools.top.model import ViewState
from tpu_tools.top.screen import Painter, styles_for


def main() -> None:
    reports = [report_from_document(document) for document in json.loads(Path(sys.argv[1]).read_text())]
    status = Path(sys.argv[2])
    window = curses.initscr()
    try:
        curses.noecho()
        curses.cbreak()
        window.keypad(True)
        painter = Painter(window, styles_for(colour=True))
        state = ViewState()
        index = 0
        while True:
            height, width = window.getmaxyx()
            painter.paint(render(reports[index], state, width, height, interactive=True), width, height)
            written = status.with_suffix(".tmp")
            written.write_text(f"{index} {width}x{height} {painter.lines_written}\n")
            os.replace(written, status)
            key = window.getch()
            if key == ord("q"):
                return
            if key == curses.KEY_RESIZE:
                curses.update_lines_cols()
            else:
                index = min(index + 1, len(reports) - 1)
    finally:
        curses.endwin()


if __name__ == "__main__":
    main()
