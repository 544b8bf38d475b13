"""jsonout.dumps: strict JSON for any document, written by json's encoder alone when every figure is finite and
cleaned (null, with a note naming where) when one is not."""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tpu_tools import jsonout

scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
documents = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                         | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=20)


def strict(text: str) -> Any:
    def refuse(token: str) -> Any:
        raise AssertionError(f"{token} is not JSON")

    return json.loads(text, parse_constant=refuse)


def finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, list):
        return [finite(item) for item in value]
    return value


def has_non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(has_non_finite(item) for item in value.values())
    if isinstance(value, list):
        return any(has_non_finite(item) for item in value)
    return False


@given(documents, st.booleans())
def test_any_document_is_strict_json_with_its_non_finite_figures_null(document, compact):
    text = jsonout.dumps(document, compact=compact)
    read = strict(text)
    expected = finite(document)
    if isinstance(document, dict) and has_non_finite(document) and isinstance(document.get("notes", []), list):
        *kept, note = read["notes"]  # the document's own notes, then one naming where
        assert note.startswith("not a finite number, written as null: ")
        read["notes"] = kept
        expected.setdefault("notes", [])
    assert read == expected
    assert ("\n" in text) == (not compact and bool(document) and isinstance(document, (dict, list)))


def test_a_finite_document_is_json_s_own_text_and_a_nan_is_named():
    document = {"a": 1.5, "b": [1, {"c": "x"}]}
    assert jsonout.dumps(document, compact=True) == json.dumps(document, separators=(",", ":"))
    assert jsonout.dumps(document) == json.dumps(document, indent=2)
    cleaned = strict(jsonout.dumps({"a": 1.5, "b": [1, {"c": math.nan}], "d": -math.inf}, compact=True))
    assert cleaned == {"a": 1.5, "b": [1, {"c": None}], "d": None,
                       "notes": ["not a finite number, written as null: b[1].c, d"]}
