"""tpu-top's parts without a terminal: history bounds, the background collector, filters, signals, layout."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import threading
import time

from agentjobs import wait_for
from conftest import as_report
from hypothesis import given, settings
from hypothesis import strategies as st
from test_top import _report

from tpu_tools.dump.redact import make_redactor
from tpu_tools.top import signals
from tpu_tools.top.collector import Collector
from tpu_tools.top.drawing import Column, layout, sparkline
from tpu_tools.top.environ import read_environment
from tpu_tools.top.frame import elapsed_text, frame_text, render
from tpu_tools.top.history import MAX_SAMPLES, History, Ring
from tpu_tools.top.keys import IGNORED, handle_key
from tpu_tools.top.model import SORT_KEYS, Filters, ProcessRow, ViewState, rows_from_report
from tpu_tools.top.procinfo import ProcessInfo


def _sample(report: dict, sequence: int, utilization: float) -> dict:
    report = {**report, "sequence": sequence}
    report["devices"] = {"error": None, "devices": [{**d, "utilization_percent": utilization}
                                                    for d in report["devices"]["devices"]]}
    return report


# --- history ---------------------------------------------------------------------------------------------

def test_ring_keeps_the_last_samples_in_order_with_gaps():
    ring = Ring(4)
    for value in (1.0, None, 3.0, 4.0, 5.0, 6.0):
        ring.append(value)
    assert len(ring) == 4
    assert ring.values() == [3.0, 4.0, 5.0, 6.0]
    assert ring.values(2) == [5.0, 6.0]
    ring.append(None)
    assert ring.values() == [4.0, 5.0, 6.0, None]


def test_history_grows_then_stays_bounded_and_forgets_gone_jobs():
    history = History(interval_s=1.0, window_s=20)
    report = _report(agents=3, devices=2)
    for n in range(50):
        sample = _sample(report, n, float(n))
        if n >= 10:  # one job exits after ten samples
            sample["processes"] = {**report["processes"], "agents": report["processes"]["agents"][:2]}
        record = as_report(sample)
        assert history.record(record, rows_from_report(record))
        assert not history.record(record, rows_from_report(record))  # the same report twice is one sample
        if n == 5:
            assert history.device("tpu:0", "utilization_percent") == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert history.device("tpu:1", "utilization_percent") == [float(n) for n in range(30, 50)]
    assert len(history.job("1000", "steps_per_second")) == 20
    assert "1002" not in history.jobs  # gone for longer than the window
    assert history.nbytes() == (2 * 3 + 2 * 4) * 20 * 8  # devices x series + jobs x series, 8 bytes a sample


def test_history_records_reports_without_a_time_every_time():
    history = History(interval_s=1.0)
    report = {"devices": {"devices": [{"key": "tpu:0", "host": "vm-a", "utilization_percent": 5.0}]}}
    assert history.record(as_report(report), [])
    assert history.record(as_report(report), [])
    assert history.device("vm-a/tpu:0", "utilization_percent") == [5.0, 5.0]


def test_history_capacity_is_capped_whatever_the_interval():
    assert History(interval_s=0.1).capacity == MAX_SAMPLES
    assert History(interval_s=1.0).capacity == 600
    history = History(interval_s=1.0, max_subjects=5)
    report = _report(agents=10, devices=2)
    history.record(as_report(report), rows_from_report(as_report(report)))
    assert len(history.devices) + len(history.jobs) == 5


def test_sparkline_scales_and_keeps_gaps():
    assert sparkline([0.0, 50.0, 100.0, None], 4, 100.0) == "\u2581\u2584\u2588 "
    assert sparkline([1.0, 2.0, 4.0], 2, None, unicode=False) == "=@"
    assert sparkline([], 5) == ""


# --- the background collector ----------------------------------------------------------------------------

def test_collector_never_blocks_the_reader_of_the_last_report():
    release = threading.Event()
    calls = []

    def slow() -> dict:
        calls.append(time.monotonic())
        if len(calls) > 1:
            release.wait(600)  # a source that takes its time: until the test releases it
        return {"sequence": len(calls)}

    collector = Collector(slow, interval_s=0.05).start()
    try:
        first = collector.wait_first(5)
        assert first is not None
        assert first.report == {"sequence": 1}
        wait_for(lambda: len(calls) > 1, timeout=10)  # the second collect is now stuck
        for _ in range(100):  # a read that waited on the stuck collect would wait until release: a hang
            assert collector.latest().report == {"sequence": 1}
        release.set()
        deadline = time.monotonic() + 5
        while collector.latest().sequence < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert collector.latest().report["sequence"] >= 2
    finally:
        release.set()
        collector.close()


def test_collector_pause_stops_collecting_and_errors_keep_the_last_report():
    count = [0]

    def source() -> dict:
        count[0] += 1
        if count[0] == 3:
            raise RuntimeError("agent scan failed\ndetails")
        return {"n": count[0]}

    collector = Collector(source, interval_s=0.02).start()
    try:
        deadline = time.monotonic() + 5
        while (collector.latest() is None or collector.latest().sequence < 4) and time.monotonic() < deadline:
            time.sleep(0.01)
        errors = [collector.latest()]
        assert collector.latest().sequence >= 4
        collector.pause(True)
        time.sleep(0.1)
        frozen = count[0]
        time.sleep(0.2)
        assert count[0] == frozen
        collector.pause(False)
        deadline = time.monotonic() + 5
        while count[0] == frozen and time.monotonic() < deadline:
            time.sleep(0.01)
        assert count[0] > frozen
        assert errors
    finally:
        collector.close()


def test_collector_reports_an_error_with_the_previous_figures():
    results = iter([{"n": 1}])

    def source() -> dict:
        try:
            return next(results)
        except StopIteration:
            raise RuntimeError("source gone\nmore") from None

    collector = Collector(source, interval_s=0.01).start()
    try:
        deadline = time.monotonic() + 5
        while (collector.latest() is None or collector.latest().sequence < 2) and time.monotonic() < deadline:
            time.sleep(0.01)
        snapshot = collector.latest()
        assert snapshot.error == "source gone"
        assert snapshot.report == {"n": 1}
    finally:
        collector.close()


# --- filters and keys ------------------------------------------------------------------------------------

def test_text_filter_typed_after_slash_and_command_line_filters():
    report = _report(agents=6)
    state = ViewState()
    rows = rows_from_report(as_report(report))
    handle_key(state, "/", rows)
    for key in "mid":
        handle_key(state, key, rows)
    assert state.editing_filter
    assert sorted(r.tag for r in state.visible_rows(as_report(report))) == ["mid", "mid5"]
    handle_key(state, "backspace", rows)
    handle_key(state, "enter", rows)
    assert not state.editing_filter
    assert state.filters.text == "mi"
    frame = frame_text(render(as_report(report), state, 120, 40))
    assert "filter: /mi" in frame
    assert " small " not in frame
    handle_key(state, "escape", rows)
    assert state.filters.text == ""
    assert len(state.visible_rows(as_report(report))) == 6
    state.filters = Filters(pids=(1001,))
    assert [r.pid for r in state.visible_rows(as_report(report))] == [1001]
    state.filters = Filters(users=("bob",))
    assert state.visible_rows(as_report(report)) == []
    assert "no process matches the filter" in frame_text(render(as_report(report), state, 120, 40))


def test_device_filter_and_agents_only_toggle():
    report = _report(agents=3, devices=4)
    report["devices"]["devices"][1]["processes"] = [{"pid": 1002, "tag": "mid"}]
    report["processes"]["holders"] = [{"pid": 77, "user": "bob", "command": "/usr/bin/holder", "chips": [3]}]
    state = ViewState(filters=Filters(devices=("tpu:1",)))
    assert [r.pid for r in state.visible_rows(as_report(report))] == [1002]
    frame = frame_text(render(as_report(report), state, 120, 40))
    assert " tpu:1 " in frame
    assert " tpu:0 " not in frame
    state = ViewState()
    assert 77 in [r.pid for r in state.visible_rows(as_report(report))]
    handle_key(state, "a", rows_from_report(as_report(report)))
    assert 77 not in [r.pid for r in state.visible_rows(as_report(report))]
    assert "agents only" in frame_text(render(as_report(report), state, 120, 40))


def test_enter_opens_the_job_screen_and_escape_goes_back():
    report = _report()
    report["processes"]["agents"][1]["compiles"]["functions"] = [
        {"name": "train_step", "compile_count": 2, "recompile_count": 1, "trace_time_s": 0.1, "lowering_time_s": 0.1,
         "backend_compile_time_s": 0.5, "cache_hits": 0, "cache_misses": 2,
         "last_recompile_reason": "at x, now f32[16] and before f32[8]"}]
    report["processes"]["agents"][1]["uptime_s"] = 60.0
    state = ViewState()
    rows = state.visible_rows(as_report(report))
    handle_key(state, "end", rows)  # the last row: small (pid 1001)
    handle_key(state, "enter", rows)
    assert state.job_key == "1001"
    history = History(1.0)
    for n in range(5):
        sample = {**report, "sequence": n}
        history.record(as_report(sample), rows_from_report(as_report(sample)))
    for width, height in ((80, 24), (120, 40), (200, 60)):
        lines = render(as_report(report), state, width, height, history=history)
        frame = frame_text(lines)
        assert len(lines) == height
        assert all(len(line.text) <= width for line in lines)
        assert " 1001 small" in frame
        assert "/usr/bin/python train.py --run small" in frame
        assert "Compiles by function" in frame
        assert "train_step" in frame
        assert "different input types; at x, now f32[16]" in frame  # the recent recompile's reason
        assert "Esc back" in lines[-1].text
    frame = frame_text(render(as_report(report), state, 200, 60, history=history))
    assert "at x, now f32[16] and before f32[8]" in frame  # the function's reason in the table
    assert "Step time histogram" not in frame
    assert "steady at 100.00 ms over 5 samples" in frame
    handle_key(state, "escape", rows)
    assert state.job_key is None
    assert "Processes" in frame_text(render(as_report(report), state, 120, 40))
    del report["processes"]["agents"][1]
    state.job_key = "1001"
    assert "process 1001 is gone" in frame_text(render(as_report(report), state, 120, 40))


def test_signal_keys_ask_then_send_and_refuse_what_the_kernel_would():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        row = ProcessRow(pid=child.pid, user="me", tag="victim", command="sleep")
        state = ViewState()
        handle_key(state, "T", [row], signals.send, signals.refusal)
        assert state.pending is not None
        frame = frame_text(render(as_report(_report()), state, 120, 40))
        assert f"send SIGTERM to {child.pid} (victim)? y / n" in frame
        handle_key(state, "n", [row], signals.send, signals.refusal)
        assert child.poll() is None
        assert "SIGTERM not sent" in state.current_message()[0]
        handle_key(state, "T", [row], signals.send, signals.refusal)
        handle_key(state, "y", [row], signals.send, signals.refusal)
        assert child.wait(10) == -signal.SIGTERM
        assert state.current_message() == (f"SIGTERM sent to {child.pid} (victim)", False)
        handle_key(state, "K", [row], signals.send, signals.refusal)  # it is gone now
        assert state.pending is None
        assert "already exited" in state.current_message()[0]
        remote = ProcessRow(pid=os.getpid(), user="me", tag=None, command="x", host="other-host")
        handle_key(state, "I", [remote], signals.send, signals.refusal)
        assert state.pending is None
        assert "runs on other-host" in state.current_message()[0]
    finally:
        child.kill()
        child.wait()


def test_readonly_sends_no_signal_and_says_so():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        row = ProcessRow(pid=child.pid, user="me", tag="victim", command="sleep")
        state = ViewState(readonly=True)
        for key in ("T", "y", "K", "y", "I", "y"):
            handle_key(state, key, [row], signals.send, signals.refusal)
            assert state.pending is None
        assert child.poll() is None
        assert state.current_message() == ("read-only (--readonly): tpu-top sends no signals", True)
    finally:
        child.kill()
        child.wait()


def test_refusal_follows_the_kernel_permission_rule():
    row = ProcessRow(pid=1, user="root", tag=None, command="init")
    if os.geteuid() == 0:
        assert signals.refusal(row) is None  # root may signal anyone (the tmux test covers a refusal)
    else:
        assert "not permitted to signal 1" in signals.refusal(row)


# --- layout ----------------------------------------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 30), st.integers(0, 9), st.integers(0, 40)), min_size=1, max_size=10),
       st.integers(1, 250))
def test_layout_keeps_whole_columns_by_priority_within_the_width(specs, width):
    columns = [Column(f"c{i}", "c", w, priority=p, flex_max=w + extra) for i, (w, p, extra) in enumerate(specs)]
    laid = layout(columns, width)
    used = 1 + sum(size for _, size in laid) + max(0, len(laid) - 1)
    assert used <= max(width, 1)
    assert all(size >= column.width for column, size in laid)
    kept = [column for column, _ in laid]
    least = 1 + sum(c.width for c in kept) + max(0, len(kept) - 1)  # the kept columns at their least widths
    for column in columns:  # a column is dropped only when it cannot fit next to the ones kept
        if column not in kept:
            assert least + (1 if kept else 0) + column.width > width


def test_narrow_terminals_drop_whole_columns_and_never_break_a_header_word():
    report = _report(agents=3, devices=4)
    words = {"DEVICE", "NAME", "MEMORY", "USED", "TOTAL", "UTIL%", "HISTORY", "PROCESSES", "PID", "USER", "TAG",
             "CPU%", "RSS", "DEV", "MEM", "COMP", "RECOMP", "STEP/S", "COMMAND", "tpu-top", "host", "tpu-vm-1",
             "platform", "tpu", "refresh", "1s", "help", "quit", "select", "Processes", "sorted", "by", "TIME", "SM%"}
    for width in range(40, 81, 4):
        text = frame_text(render(as_report(report), ViewState(), width, 24, history=History(1.0)))
        lines = text.splitlines()
        header_lines = [lines[0], lines[-1], *[line for line in lines if line.startswith((" DEVICE", "     PID"))]]
        for line in header_lines:
            for word in line.split():
                assert word in words or word in ("/", "^", "v", "q", "j/k", "Enter", "job", "filter", "a", "all",
                                                 "I/T/K", "signal", "s/S", "sort", "r", "reverse", "p", "pause",
                                                 "h") or ":" in word, (width, word, line)
        device = next(line for line in lines if line.startswith(" tpu:0"))
        assert "1.0 GiB / 16.0 GiB" in device
        assert "0.0" in device  # USED / TOTAL and UTIL% are kept
        process = next(line for line in lines if line.split()[:1] == ["1000"])
        assert "big" in process
        assert "8.0G" in process  # PID, TAG and DEV MEM are kept
    at_80 = frame_text(render(as_report(report), ViewState(), 80, 24, history=History(1.0)))
    assert "USED / TOTAL UTIL%" in at_80
    assert "RECOMP STEP/S COMMAND" in at_80


def test_device_states_temperature_power_and_a_host_column():
    report = _report(agents=2, devices=3)
    devices = report["devices"]["devices"]
    devices[0].update(extra={"temperature_celsius": 71.0, "power_draw_watts": 245.0}, host="vm-a")
    devices[1].update(extra={"gpu_status": "lost"}, host="vm-a")
    devices[2].update(extra={"gpu_status": "not_answering"}, host="vm-b")
    report["processes"]["agents"][0]["host"] = "vm-a"
    report["processes"]["agents"][1]["host"] = "vm-b"
    frame = frame_text(render(as_report(report), ViewState(), 200, 50))
    rows = {line.split()[1]: line for line in frame.splitlines() if line.startswith(" vm-")}
    assert "71C" in rows["tpu:0"]
    assert "245W" in rows["tpu:0"]
    assert "LOST" in rows["tpu:1"]
    assert "LOST" in rows["tpu:2"]
    assert " HOST " in frame
    assert "2 hosts" in frame.splitlines()[0]
    process_rows = [line.split() for line in frame.splitlines() if line.split()[1:2] in (["1000"], ["1001"])]
    assert {(r[0], r[1]) for r in process_rows} == {("vm-a", "1000"), ("vm-b", "1001")}
    one_host = frame_text(render(as_report(_report()), ViewState(), 200, 50))
    assert " HOST " not in one_host
    assert "TEMP" not in one_host
    assert "POWER" not in one_host


def test_job_screen_of_a_process_without_agent():
    report = _report(agents=1, devices=2)
    report["processes"]["holders"] = [{"pid": 77, "user": "bob", "command": "/usr/bin/holder --serve", "chips": [0, 1],
                                       "cpu_percent": 5.0, "rss_bytes": 1 << 20}]
    state = ViewState(job_key="77")
    frame = frame_text(render(as_report(report), state, 100, 30, history=History(1.0)))
    assert " 77" in frame
    assert "no tpu-tools agent" in frame
    assert "holds chips 0, 1" in frame
    assert "/usr/bin/holder --serve" in frame
    assert "user bob" in frame
    assert "Compiles by function" not in frame


def test_tall_graph_rows_stack_eighths():
    from tpu_tools.top.drawing import graph_rows

    rows = graph_rows([0.0, 50.0, 100.0, None], 4, 2, 100.0)
    assert rows == ["  \u2588 ", "\u2581\u2588\u2588 "]  # top line first; a gap stays blank
    assert graph_rows([1.0, 2.0], 2, 2, None, unicode=False) == [" #", "##"]


def _history_panel(frame: str) -> list[str]:
    lines = frame.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(" History"))
    return lines[start + 1:]


def test_history_graphs_grow_taller_with_the_terminal():
    report = _report(agents=2, devices=2)
    history = History(1.0)
    for n in range(40):  # utilization climbing from 0 to 100 %
        sample = {**report, "sequence": n}
        for index, device in enumerate(sample["devices"]["devices"]):
            sample["devices"]["devices"][index] = {**device, "utilization_percent": n * 2.5}
        history.record(as_report(sample), rows_from_report(as_report(sample)))
    tall = _history_panel(frame_text(render(as_report(report), ViewState(), 200, 60, history=history)))
    first, *rest = tall[:4]
    assert first.startswith(" tpu:0")
    assert " UTIL " in first
    assert " MEM " in first
    assert all(line.startswith(" " * 8) and _cells(line) for line in rest)  # 3 more lines of the same graphs
    assert tall[4].startswith(" tpu:1")
    # Top line first: the climb fills the bottom line more than the top one.
    assert _cells(rest[-1]) > _cells(first)
    short = _history_panel(frame_text(render(as_report(report), ViewState(), 120, 24, history=history)))
    assert short[0].startswith(" tpu:0")
    assert short[1].startswith(" tpu:1")  # one line each where room is short
    for width, height in ((80, 24), (120, 26), (200, 60)):
        lines = render(as_report(report), ViewState(), width, height, history=history)
        assert len(lines) == height
        assert all(len(line.text) <= width for line in lines)


def _cells(line: str) -> int:
    return sum(1 for c in line if c in "\u2581\u2582\u2583\u2584\u2585\u2586\u2587\u2588")


# --- running time, SM utilization ------------------------------------------------------------------------

def _gpu_report() -> dict:
    report = _report(agents=1, devices=1)
    report["nvml"] = {"gpus": [
        {"index": 0, "device_key": "gpu:0", "processes": [
            {"pid": 4242, "kind": "compute", "gpu_memory_bytes": 1 << 30, "sm_utilization_percent": 37.0,
             "command": "python train.py", "user": "bob"}]},
        {"index": 1, "device_key": "gpu:1", "processes": [
            {"pid": 4242, "kind": "compute", "gpu_memory_bytes": 1 << 30, "sm_utilization_percent": 80.0},
            {"pid": 4343, "kind": "compute", "gpu_memory_bytes": 1 << 20}]}]}
    return report


def test_sm_utilization_is_the_busiest_gpus_and_shown_only_with_gpus():
    rows = {r.pid: r for r in rows_from_report(as_report(_gpu_report()))}
    assert rows[4242].sm_percent == 80.0
    assert rows[4343].sm_percent is None
    assert rows[1000].sm_percent is None
    frame = frame_text(render(as_report(_gpu_report()), ViewState(), 200, 40))
    assert "SM%" in frame
    header = next(line.split() for line in frame.splitlines() if line.split()[:1] == ["PID"])
    row = next(line.split() for line in frame.splitlines() if line.split()[:1] == ["4242"])
    assert row[header.index("SM%") - 1] == "80.0"  # - 1: the header's "DEV MEM" is two words
    assert "SM%" not in frame_text(render(as_report(_report()), ViewState(), 200, 40))


def test_elapsed_text_reads_like_ps():
    assert [elapsed_text(s) for s in (None, 0, 65, 3 * 3600 + 5 * 60 + 7, 2 * 86400 + 3 * 3600 + 5)] == \
        ["-", "00:00", "01:05", "3:05:07", "2-03:00:05"]


def test_running_time_comes_from_proc_once_per_pid():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        info = ProcessInfo()
        report = _report(agents=1, devices=1)
        report["processes"]["holders"] = [{"pid": child.pid, "command": "sleep", "user": "me"}]
        report["time_unix_s"] = time.time() + 3725  # the report is an hour, 2 min and 5 s after now
        state = ViewState(annotate=info.annotate, sort_index=SORT_KEYS.index("time"))
        rows = state.visible_rows(as_report(report))
        child_row = next(r for r in rows if r.pid == child.pid)
        assert child_row.started_unix_s is not None
        assert child_row.parent_pid == os.getpid()
        assert len(info) == 2  # the agent's PID 1000 too (read, unknown or not)
        frame = frame_text(render(as_report(report), state, 200, 40))
        line = next(line for line in frame.splitlines() if line.split()[:1] == [str(child.pid)])
        assert " 1:02:0" in line  # 1:02:05, a second more when the child started a second after `now`
        # a PID that leaves the list is forgotten
        report["processes"]["holders"] = []
        state.visible_rows(as_report(report))
        assert len(info) == 1
    finally:
        child.kill()
        child.wait()


# --- marks: one signal to several processes --------------------------------------------------------------

def test_marked_processes_get_one_signal_after_one_confirmation():
    children = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(3)]
    try:
        rows = [ProcessRow(pid=c.pid, user="me", tag=f"job{i}", command="sleep") for i, c in enumerate(children)]
        state = ViewState(sort_index=SORT_KEYS.index("pid"))
        ordered = state.sorted_rows(rows)
        handle_key(state, " ", rows)  # marks the first and moves down
        handle_key(state, "down", rows)
        handle_key(state, " ", rows)  # the third
        assert state.marked == {ordered[0].key, ordered[2].key}
        frame = frame_text(render(as_report(_with_holders(rows)), state, 160, 30))
        assert f"*{ordered[0].pid}" in frame
        assert f"*{ordered[2].pid}" in frame
        assert f"*{ordered[1].pid}" not in frame
        assert "2 marked (space)" in frame
        handle_key(state, "T", rows, signals.send, signals.refusal)
        assert state.pending is not None
        assert {r.pid for r in state.pending.targets} == \
            {ordered[0].pid, ordered[2].pid}
        shown = frame_text(render(as_report(_with_holders(rows)), state, 160, 30))
        assert "send SIGTERM to 2 marked processes? y / n" in shown
        handle_key(state, "y", rows, signals.send, signals.refusal)
        assert state.current_message() == ("SIGTERM sent to 2 of 2 marked processes", False)
        assert children[[c.pid for c in children].index(ordered[0].pid)].wait(10) == -signal.SIGTERM
        assert children[[c.pid for c in children].index(ordered[2].pid)].wait(10) == -signal.SIGTERM
        assert children[[c.pid for c in children].index(ordered[1].pid)].poll() is None
        assert state.marked == set()
    finally:
        for child in children:
            child.kill()
            child.wait()


def test_marks_refused_under_readonly_toggled_and_cleared():
    rows = [ProcessRow(pid=p, user="me", tag=None, command="x") for p in (11, 12)]
    state = ViewState(readonly=True, sort_index=SORT_KEYS.index("pid"))
    handle_key(state, " ", rows)
    handle_key(state, "up", rows)
    handle_key(state, " ", rows)  # unmarks
    assert state.marked == set()
    handle_key(state, " ", rows)  # marks 12, the selection stays on the last row
    assert state.marked == {"12"}
    handle_key(state, "K", rows, lambda row, name: (True, "sent"), lambda row: None)
    assert state.pending is None
    assert state.current_message()[0].startswith("read-only")
    state.readonly = False
    handle_key(state, "K", rows, lambda row, name: (True, "sent"), lambda row: f"not permitted to signal {row.pid}")
    assert state.pending is None
    assert state.current_message() == ("not permitted to signal 12", True)
    handle_key(state, "n", rows)
    handle_key(state, "escape", rows)
    assert state.marked == set()
    handle_key(state, " ", rows)
    assert state.marked == {"12"}
    handle_key(state, "I", [rows[0]], lambda row, name: (True, "sent"), lambda row: None)  # 12 left the list
    assert state.marked == set()
    assert state.pending is not None
    assert state.pending.targets == [rows[0]]


def _with_holders(rows: list[ProcessRow]) -> dict:
    report = _report(agents=0, devices=1)
    report["processes"]["holders"] = [{"pid": r.pid, "user": r.user, "command": r.command} for r in rows]
    return report


# --- tree view -------------------------------------------------------------------------------------------

def test_tree_puts_children_under_their_parent_sorted_among_siblings():
    def row(pid: int, parent: int | None, cpu: float) -> ProcessRow:
        return ProcessRow(pid=pid, user="me", tag=None, command=f"cmd{pid}", cpu_percent=cpu, parent_pid=parent)

    rows = [row(10, 1, 5.0), row(11, 10, 1.0), row(12, 10, 9.0), row(13, 12, 2.0), row(20, 1, 50.0),
            row(21, 21, 0.0), row(30, 31, 3.0), row(31, 30, 4.0)]  # 21 its own parent; 30 and 31 a loop
    state = ViewState(sort_index=SORT_KEYS.index("cpu"))
    flat = [r.pid for r in state.sorted_rows(rows)]
    assert flat == [20, 12, 10, 31, 30, 13, 11, 21]
    handle_key(state, "t", rows)
    tree = state.sorted_rows(rows)
    assert [(r.pid, r.depth) for r in tree] == [(20, 0), (10, 0), (12, 1), (13, 2), (11, 1), (21, 0), (31, 0),
                                                (30, 0)]
    handle_key(state, "r", rows)  # reversed: still under the parent, siblings reversed
    assert [(r.pid, r.depth) for r in state.sorted_rows(rows)][:5] == [(21, 0), (10, 0), (11, 1), (12, 1), (13, 2)]
    frame = frame_text(render(as_report(_with_holders(rows)), ViewState(tree=True, annotate=_parents(rows)), 160, 30))
    assert "tree (t)" in frame
    line = next(line for line in frame.splitlines() if line.split()[:1] == ["13"])
    assert line.rstrip().endswith("  `- cmd13")
    handle_key(state, "t", rows)
    assert all(r.depth == 0 for r in state.sorted_rows(rows))


def _parents(rows: list[ProcessRow]):
    parents = {r.pid: r.parent_pid for r in rows}

    def annotate(listed: list[ProcessRow]) -> None:
        for each in listed:
            each.parent_pid = parents.get(each.pid)
    return annotate


# --- environment screen ----------------------------------------------------------------------------------

def test_environment_screen_shows_redacted_variables_and_esc_returns():
    env = {"PATH": os.environ.get("PATH", "/usr/bin"), "HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyz0123",
           "DB_URL": "postgres://alice:hunter2@db:5432/x", "XLA_FLAGS": "--xla_dump_to=/tmp/d", "LONG": "v" * 300}
    # the child says when it runs: read at once, /proc/PID/environ of a process still in its exec was empty once
    child = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"], env=env,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "up\n"
        rows = [ProcessRow(pid=child.pid, user="me", tag="train", command="sleep")]
        state = ViewState(read_environment=functools.partial(read_environment, redact=make_redactor(True).env_value))
        handle_key(state, "e", rows)
        assert state.environment is not None
        assert state.environment.error is None
        frame = frame_text(render(as_report(_with_holders(rows)), state, 100, 8))
        lines = frame.splitlines()
        assert lines[1].startswith(f" Environment of {child.pid} (train) of me")
        assert "5 variables" in lines[1]
        assert " DB_URL=postgres://<redacted>@db:5432/x" in lines
        assert " HF_TOKEN=<redacted>" in lines
        assert "hunter2" not in frame
        assert "hf_abc" not in frame
        assert all(len(line) <= 100 for line in lines)
        assert "Esc back" in lines[-1]
        handle_key(state, "end", rows)  # scrolls to the last screenful: three lines on a 6-line terminal
        lines = frame_text(render(as_report(_with_holders(rows)), state, 100, 6)).splitlines()
        assert lines[-2] == " XLA_FLAGS=--xla_dump_to=/tmp/d"
        assert lines[2].startswith(" LONG=vvv")
        handle_key(state, "up", rows)
        report = as_report(_with_holders(rows))
        assert frame_text(render(report, state, 100, 6)).splitlines()[2].startswith(" HF_TOKEN=")
        assert handle_key(state, "T", rows) == IGNORED
        assert state.pending is None  # no signal from this screen
        handle_key(state, "escape", rows)
        assert state.environment is None
        assert "Processes" in frame_text(render(report, state, 100, 20))
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()
    handle_key(state, "e", rows)  # the process is gone (a zombie's environment is empty, a reaped one missing)
    assert state.environment is not None
    assert state.environment.error in (
        f"process {child.pid} has exited", f"{child.pid} (train) of me has an empty environment")
    remote = ProcessRow(pid=1, user=None, tag=None, command="x", host="other")
    assert read_environment(remote, make_redactor(True).env_value).error == \
        "1 runs on other: only this host's processes can be read"
    if os.geteuid() != 0:  # root reads every process's environment
        unreadable = read_environment(ProcessRow(pid=1, user="root", tag=None, command="init"),
                                      make_redactor(True).env_value)
        assert unreadable.error
        assert "not readable" in unreadable.error
    assert "no environment screen here" in _message_after_e(ViewState(), rows)


def _message_after_e(state: ViewState, rows: list[ProcessRow]) -> str:
    handle_key(state, "e", rows)
    return state.current_message()[0]


# --- mouse -----------------------------------------------------------------------------------------------

def test_a_click_selects_the_row_under_it_and_the_wheel_scrolls():
    report = _report(agents=12, devices=2)
    rows = rows_from_report(as_report(report))
    state = ViewState(sort_index=SORT_KEYS.index("pid"))
    lines = frame_text(render(as_report(report), state, 160, 40)).splitlines()
    line_of = {pid: next(i for i, line in enumerate(lines) if line.split()[:1] == [str(pid)]) for pid in (1004, 1007)}
    assert state.row_at[line_of[1007]] == "1007"
    assert 0 not in state.row_at
    handle_key(state, f"click:{line_of[1007]}", rows)
    assert state.selected_key == "1007"
    assert handle_key(state, "click:0", rows) == IGNORED
    assert state.selected_key == "1007"  # the header
    handle_key(state, "wheelup", rows)
    assert state.selected_key == "1004"
    handle_key(state, "wheeldown", rows)
    handle_key(state, "wheeldown", rows)
    assert state.selected_key == "1010"
    handle_key(state, "enter", rows)  # the job screen has no rows to click
    render(as_report(report), state, 160, 40)
    assert state.row_at == {}
    assert handle_key(state, f"click:{line_of[1004]}", rows) == IGNORED


def test_mouse_events_become_keys():
    import curses

    from tpu_tools.top.screen import mouse_key

    assert mouse_key((0, 5, 7, 0, curses.BUTTON1_PRESSED)) == "click:7"
    assert mouse_key((0, 5, 7, 0, curses.BUTTON4_PRESSED)) == "wheelup"
    if hasattr(curses, "BUTTON5_PRESSED"):
        assert mouse_key((0, 5, 7, 0, curses.BUTTON5_PRESSED)) == "wheeldown"
    assert mouse_key((0, 5, 7, 0, curses.BUTTON1_RELEASED)) == ""
