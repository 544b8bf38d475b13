"""tpu-top's job screen: goodput, MFU and cost, the bar of where the time went, and the job's metrics."""

from __future__ import annotations

from conftest import as_report
from test_top import _report

from tpu_tools.top.frame import frame_text, render
from tpu_tools.top.keys import handle_key
from tpu_tools.top.model import ViewState

GOODPUT = {
    "since_start": {"wall_s": 100.0, "goodput_percent": 60.0, "mfu_percent": None, "samples_per_s": None,
                    "cost_per_million_samples": None,
                    "causes_s": {"productive": 60.0, "startup": 10.0, "compile": 5.0, "data": 15.0, "idle": 10.0,
                                 "host": 0.0, "warmup\x1b[2J": 0.0}},
    "recent": {"wall_s": 60.0, "goodput_percent": 75.0, "mfu_percent": 41.5, "samples_per_s": 1200.0,
               "cost_per_million_samples": 0.97, "causes_s": {"productive": 45.0, "data": 15.0}},
    "problems": ["price per hour 'nan' ($TPU_TOOLS_PRICE_PER_HOUR) is not a finite number > 0; unknown"],
    "last_error": None,
}


def _job_screen(agent_update: dict, width: int = 120, height: int = 40) -> tuple[str, list]:
    report = _report()
    report["processes"]["agents"][1].update(agent_update)
    state = ViewState()
    rows = state.visible_rows(as_report(report))
    handle_key(state, "end", rows)
    handle_key(state, "enter", rows)
    lines = render(as_report(report), state, width, height)
    return frame_text(lines), lines


def test_job_screen_shows_goodput_a_bar_of_causes_and_suspect_metrics():
    metrics = [{"name": "loss", "value": 2.5, "step": 7, "scope": "global", "kind": "local",
                "suspect": "claims to be global but lives on 1 of the job's 8 devices"}]
    frame, lines = _job_screen({"goodput": GOODPUT, "metrics": metrics})
    assert "GOODPUT 60.0% since start, 75.0% recent  MFU 41.5%  samples/s 1200  cost/1M samples 0.97" in frame
    bar = next(line.text for line in lines if line.text.startswith(" PPPP"))
    assert len(bar) == 119
    assert bar.count("P") == round(118 * 0.6)
    assert bar.count("D") == round(118 * 0.15)
    assert "I" in bar
    assert "C" in bar
    assert "P productive 60%" in frame
    assert "D data 15%" in frame
    assert "\x1b" not in frame
    assert "not a finite number > 0; unknown" in frame
    assert "loss 2.50  step 7  global, local  claims to be global" in frame


def test_unknown_figures_read_unknown_and_an_old_agent_shows_nothing():
    unknown = {**GOODPUT, "recent": None, "problems": []}
    frame, _ = _job_screen({"goodput": unknown}, 120, 30)
    assert "MFU unknown  samples/s unknown  cost/1M samples unknown" in frame
    frame, _ = _job_screen({"goodput": None})
    assert "GOODPUT" not in frame


def test_fleet_hosts_show_their_goodput_and_global_metric_findings():
    from tpu_tools.top.fleet_panel import fleet_lines

    fleet = {"source": "http://prometheus:9090", "global_metric_findings": 1,
             "hosts": [{"host": "w0", "up": True, "chips": 4, "jobs": 1, "goodput_percent": 81.25},
                       {"host": "w1", "up": True, "chips": 4, "jobs": 1, "goodput_percent": None}]}
    text = "\n".join(line.text for line in fleet_lines(as_report({"fleet": fleet}), 140, None))
    assert "GOODPUT" in text
    assert "1 global metrics differ between workers" in text
    rows = [line for line in text.splitlines() if line.startswith(" w")]
    assert "81.2" in rows[0]
    assert "81" not in rows[1]
