"""What tpu-top saves from round to round stays true: lines painted again only where they changed (a resized
terminal painted whole), rows made once per report and new with the next, graphs drawn as before, the screen's
loop asleep until something can have changed."""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path

from agentjobs import wait_for
from conftest import as_report
from hypothesis import given
from hypothesis import strategies as st
from programs import require_program
from test_top import Tmux, _report

from tpu_tools.metrics.groups import GROUPS
from tpu_tools.top.arrays_view import ArraysBoard
from tpu_tools.top.collector import Collector
from tpu_tools.top.drawing import graph_rows
from tpu_tools.top.frame import SHOWN_GROUPS, frame_text, render
from tpu_tools.top.model import ViewState
from tpu_tools.top.screen import wake_ms

PAINTER = Path(__file__).with_name("painter_screen.py")


def _status(path: Path) -> tuple[int, str, int] | None:
    try:
        index, size, written = path.read_text().split()
    except (FileNotFoundError, ValueError):
        return None
    return int(index), size, int(written)


def _status_when(path: Path, predicate) -> tuple[int, str, int]:
    """The painter's status once it satisfies `predicate` (it paints, then writes it)."""
    def found() -> tuple[int, str, int] | None:
        status = _status(path)
        return status if status is not None and predicate(status) else None

    return wait_for(found)


def _expected(document: dict, width: int, height: int) -> list[str]:
    return [line.rstrip() for line in frame_text(render(as_report(document), ViewState(), width, height)).splitlines()]


def test_only_changed_lines_are_painted_again_and_a_resize_paints_all(tmp_path):
    require_program("tmux")
    first = _report(agents=3, devices=2)
    second = json.loads(json.dumps(first))
    second["processes"]["agents"][1]["cpu_percent"] = 77.5  # one job's figure moved, the rest held still
    frames, status = tmp_path / "frames.json", tmp_path / "status"
    frames.write_text(json.dumps([first, second]))
    env = {**os.environ, "TERM": "xterm-256color"}
    env.pop("TPU_TOOLS_RUNTIME_DIR", None)
    tmux = Tmux(100, 30, env)
    try:
        tmux.keys(f"clear; {sys.executable} {PAINTER} {frames} {status}", "Enter")

        def shows(document: dict, width: int, height: int):
            expected = _expected(document, width, height)
            return lambda screen: [line.rstrip() for line in screen.splitlines()] == expected

        painted = _status_when(status, lambda found: found[0] == 0)
        width, height = (int(v) for v in painted[1].split("x"))  # the pane, less a status line if tmux shows one
        assert painted[2] == height  # the first frame: every line
        tmux.wait_for(shows(first, width, height))

        tmux.keys("n")
        after = _status_when(status, lambda found: found[0] == 1)
        tmux.wait_for(shows(second, width, height))
        changed = [a != b for a, b in zip(_expected(first, width, height), _expected(second, width, height))]
        assert sum(changed) == 1  # the moved job's row alone differs between the two frames
        assert after[2] == height + 1  # and it alone was painted again

        tmux.run("resize-window", "-t", "t", "-x", "120", "-y", "34")
        # and a key: the same report again, painted at the size curses now gives, whether curses said KEY_RESIZE
        # or took the resize in while it painted the last frame (under load it can)
        tmux.keys("n")
        resized = _status_when(status, lambda found: found[1] != painted[1])
        width, height = (int(v) for v in resized[1].split("x"))
        assert width == 120
        tmux.wait_for(shows(second, width, height))
        assert resized[2] == after[2] + height  # a frame of the new size: every line
        tmux.keys("q")
    finally:
        tmux.kill()


def test_a_rows_figures_follow_each_new_report():
    state = ViewState()
    document = _report(agents=3, devices=2)
    report = as_report(document)
    rows = state.report_rows(report)
    assert state.report_rows(report) is rows  # the same report: the rows made for it
    assert " 50.0 " in frame_text(render(report, state, 120, 30))
    document["processes"]["agents"][1]["cpu_percent"] = 77.5
    moved = as_report(document)
    assert state.report_rows(moved) is not rows
    text = frame_text(render(moved, state, 120, 30))
    row = next(line for line in text.splitlines() if " 1001 " in line)
    assert " 77.5 " in row


def test_tpu_top_gathers_only_the_groups_it_shows():
    assert set(SHOWN_GROUPS) < set(GROUPS)
    assert list(SHOWN_GROUPS) == [name for name in GROUPS if name in SHOWN_GROUPS]  # in the report's order
    document = _report(agents=2, devices=2)
    with_workload = {**document, "workload": {"endpoints": [{"address": "127.0.0.1:9431", "sources": ["orbax"],
                                                             "error": "no metrics endpoint"}]}}
    for width, height in ((80, 24), (200, 60)):
        assert frame_text(render(as_report(with_workload), ViewState(), width, height)) == \
            frame_text(render(as_report(document), ViewState(), width, height))


def _graph_rows_by_cell(values: list[float | None], width: int, rows: int, top: float | None,
                        unicode: bool) -> list[str]:
    """The graph as its definition reads, cell by cell: what graph_rows computes at C speed."""
    marks = " \u2581\u2582\u2583\u2584\u2585\u2586\u2587\u2588"
    values = values[-width:] if width > 0 else []
    known = [v for v in values if v is not None]
    scale = top if top else (max(known) if known else 0.0)
    out = []
    for row in range(rows - 1, -1, -1):
        cells = []
        for value in values:
            if value is None or scale <= 0:
                cells.append(" ")
                continue
            eighths = max(0, min(8, max(1, round(max(0.0, min(1.0, value / scale)) * rows * 8)) - row * 8))
            cells.append(marks[eighths] if unicode else ("#" if eighths >= 4 else " "))
        out.append("".join(cells))
    return out


@given(st.lists(st.one_of(st.none(), st.floats(allow_nan=False), st.floats(0, 100)), max_size=60),
       st.integers(0, 70), st.integers(1, 4), st.sampled_from([None, 100.0, 0.0]), st.booleans())
def test_graph_rows_draw_each_cell_as_defined(values, width, rows, top, unicode):
    assert graph_rows(values, width, rows, top, unicode) == _graph_rows_by_cell(values, width, rows, top, unicode)


def test_the_screen_sleeps_until_the_next_report_is_due_and_no_longer():
    released = threading.Event()

    def ask(pid: int):
        released.wait(20.0)
        raise RuntimeError("no agent answers")

    reports = []
    collector = Collector(lambda: reports.append(1) or as_report(_report(agents=1, devices=1)), interval_s=5.0)
    state = ViewState(arrays=ArraysBoard(ask))
    assert wake_ms(collector, state, 100.0) == 100  # nothing gathered yet: looked for every 100 ms
    collector.start()
    try:
        assert collector.wait_first(10.0) is not None
        due = wait_for(collector.next_due)
        assert wake_ms(collector, state, due - 3.0) == 1000  # at most a second at a time
        assert wake_ms(collector, state, due - 0.5) == 510  # just past the time the next report is due
        assert wake_ms(collector, state, due + 0.002) == 10  # late: soon, then less and less often
        assert wake_ms(collector, state, due + 0.04) == 40
        assert wake_ms(collector, state, due + 3.0) == 100
        state.say("sent SIGTERM", now=due - 4.0)  # shown until 5 s later
        assert wake_ms(collector, state, due - 0.5) == 510
        assert wake_ms(collector, state, due - 3.0) == 1000
        state.say("sent SIGTERM", now=due - 5.5)
        assert wake_ms(collector, state, due - 1.0) == 501  # the message ends first
        state.message = None
        collector.pause(True)
        assert collector.next_due() is None
        assert wake_ms(collector, state, due - 3.0) == 1000  # paused: no report to wait for
        assert state.arrays.ask("4242", 4242)
        assert wake_ms(collector, state, due - 3.0) == 100  # a read under way ends at any moment
        released.set()
        wait_for(lambda: not state.arrays.pending())
        assert wake_ms(collector, state, due - 3.0) == 1000
    finally:
        released.set()
        collector.close()
