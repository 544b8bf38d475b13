"""The one-sentence form of an error that every command reports."""

from __future__ import annotations

from tpu_tools.errors import first_line


def test_first_non_blank_line_of_the_message():
    assert first_line(RuntimeError("\n  INTERNAL: compile failed  \n  at frame 3\n")) == "INTERNAL: compile failed"


def test_an_error_without_a_message_gives_its_type_or_the_default():
    assert first_line(TimeoutError()) == "TimeoutError"
    assert first_line(ValueError("   \n  ")) == "ValueError"
    assert first_line(KeyError(), default="") == ""


def test_a_long_line_is_cut_to_the_limit():
    text = first_line(OSError("x" * 500), limit=200)
    assert len(text) == 200
    assert text.endswith("...")
    assert text.startswith("x" * 197)
    assert first_line(OSError("y" * 200), limit=200) == "y" * 200
