"""The one helper that cuts outside text: never longer than asked, always the start, a cut always shown."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tpu_tools.shorten import ELLIPSIS, one_line, quoted, shorten


@given(st.text(), st.integers(min_value=0, max_value=200))
def test_a_cut_text_fits_its_limit_and_keeps_its_start(text, limit):
    cut = shorten(text, limit)
    assert len(cut) <= limit
    if len(text) <= limit:
        assert cut == text
    elif limit > len(ELLIPSIS):
        assert cut.endswith(ELLIPSIS)
        assert text.startswith(cut[: -len(ELLIPSIS)])


def test_a_value_is_quoted_by_its_repr_cut_short():
    assert quoted("abc") == "'abc'"
    assert quoted(10 ** 400, 24) == "1" + "0" * 20 + "..."
    assert one_line("a\n  b\tc" + "d" * 50, 12) == "a b cdddd..."
