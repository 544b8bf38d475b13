"""tpu-top's key table: every key has an action and help, and the help screen, the man page and the docs list
exactly the table."""

from __future__ import annotations

import re

from conftest import REPO, as_report
from test_top import _report

from tpu_tools.cli.top import top_command
from tpu_tools.top.frame import frame_text, render
from tpu_tools.top.keys import BY_KEY, IGNORED, KEYS, QUIT, REDRAW, handle_key, man_text, markdown_table
from tpu_tools.top.model import ViewState, rows_from_report


def test_every_binding_has_keys_a_label_help_and_an_action():
    for binding in KEYS:
        assert binding.keys, binding
        assert binding.label.strip(), binding
        assert binding.help.strip(), binding.label
        assert binding.doc.strip(), binding.label
        assert callable(binding.action), binding.label
    labels = [b.label for b in KEYS]
    assert len(set(labels)) == len(labels)


def test_no_key_is_bound_twice():
    every = [key for binding in KEYS for key in binding.keys]
    assert len(every) == len(set(every)) == len(BY_KEY)


def _help_box(screen: str) -> list[str]:
    """The help overlay's inner lines: between its `+---+` borders, inside its `| ` and ` |`."""
    lines = screen.splitlines()
    top = next(i for i, line in enumerate(lines) if "| tpu-top keys" in line)
    left = lines[top].index("| tpu-top keys")
    right = lines[top - 1].index("+", left + 1)
    box = []
    for line in lines[top:]:
        if line[left] == "+":
            return box
        assert line[left] == "|", line
        assert line[right] == "|", line
        box.append(line[left + 2:right - 1].rstrip())
    raise AssertionError("the help box has no bottom border")


def test_the_help_screen_lists_exactly_the_table_in_its_order():
    report = _report()
    state = ViewState()
    assert handle_key(state, "h", rows_from_report(as_report(report))) == REDRAW
    box = _help_box(frame_text(render(as_report(report), state, 120, 40)))
    assert box[0] == "tpu-top keys"
    width = max(len(b.label) for b in KEYS)
    entries = [line[2:2 + width].rstrip() for line in box[2:] if line[2:3].strip()]  # a label starts the line
    assert entries == [b.label for b in KEYS]
    words = " ".join(line[width + 4:].strip() for line in box[2:])
    for binding in KEYS:
        assert binding.help in words, binding.label


def test_the_man_page_and_the_docs_list_exactly_the_table():
    man = top_command.man_sections["KEYS"]
    assert man == man_text()
    assert [line.split("  ")[0] for line in man.splitlines()] == [b.label for b in KEYS]
    screen_doc = (REPO / "docs" / "top-screen.md").read_text()
    assert markdown_table() in screen_doc  # tools/gen_docs.py writes it; tests/test_docs.py checks it is fresh
    assert screen_doc.count("\n| ") - screen_doc.count("\n| ---") >= len(KEYS) + 1


def test_the_summary_in_docs_top_names_bound_keys():
    """docs/top.md names a few keys in passing (the table is docs/top-screen.md's): each is one the table binds."""
    text = " ".join((REPO / "docs" / "top.md").read_text().split())
    summary = text[text.index("(keys: "):text.index("all in [top-screen.md]")]
    named = re.findall(r"`([^`]+)`", summary)
    assert len(named) >= 8
    for key in named:
        assert key in BY_KEY, key


def test_each_binding_acts_through_handle_key():
    """A key of every binding reaches that binding's action: pressed where it applies, it is not ignored."""
    report = _report()
    rows = rows_from_report(as_report(report))
    ordered = ViewState().sorted_rows(rows)
    for binding in KEYS:
        for key in binding.keys:
            state = ViewState()
            state.row_at = {5: ordered[0].key}
            if key in ("escape", "backspace", "\x7f", "left", "m"):
                state.job_key = "elsewhere/1"  # these act on a job screen (this one's process is gone: m reads nothing)
            if key == "click":
                key = "click:5"
            result = handle_key(state, key, rows)
            assert result == (QUIT if key == "q" else REDRAW), (binding.label, key, result)
    assert handle_key(ViewState(), "x", rows) == IGNORED
    assert handle_key(ViewState(), "m", rows) == IGNORED  # m only on a job screen


def test_keys_change_the_state_their_help_names():
    rows = rows_from_report(as_report(_report()))
    state = ViewState()
    for key, check in [("p", lambda s: s.paused), ("t", lambda s: s.tree), ("r", lambda s: s.reversed),
                       ("a", lambda s: not s.filters.show_all), ("/", lambda s: s.editing_filter)]:
        handle_key(state, key, rows)
        assert check(state), key
    state = ViewState()
    handle_key(state, "enter", rows)
    assert state.job_key is not None
    handle_key(state, "left", rows)
    assert state.job_key is None
    before = state.sort_index
    handle_key(state, "s", rows)
    handle_key(state, "S", rows)
    handle_key(state, "S", rows)
    assert state.sort_index == before - 1
