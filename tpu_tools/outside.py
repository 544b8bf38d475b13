"""What comes from outside the program (files, other programs' answers) decoded into typed records.

The records are msgspec Structs whose annotations carry the bounds (`msgspec.Meta(ge=0, max_length=...)`):
decoding checks every field against them and names the first bad one by its path, so one bad record is one
`OutsideError` sentence ("Expected `int` >= 0 - at `$.checks[3].device`"), never a crash. Nesting deeper than
Python's recursion limit is the same error. Strings a reader cuts rather than refuses are cut with `cut`, in the
record's `__post_init__` (which decoding runs).
"""

from __future__ import annotations

import math
from typing import Any, TypeVar

import msgspec

T = TypeVar("T")


class OutsideError(ValueError):
    """A record from outside is malformed; the message names the field and what was wrong."""


def decode_json(data: bytes | str, record_type: type[T]) -> T:
    """`data` (JSON text) as a `record_type`; raises OutsideError."""
    try:
        return msgspec.json.decode(data, type=record_type)
    except msgspec.ValidationError as error:
        raise OutsideError(str(error)) from None
    except msgspec.DecodeError as error:
        raise OutsideError(f"is not JSON ({error})") from None
    except RecursionError:
        raise OutsideError("is nested too deeply") from None


def convert(value: Any, record_type: type[T], root: str = "$") -> T:
    """A value already parsed (JSON types) as a `record_type`; raises OutsideError, whose path starts at `root`
    ("$.devices[3].id", or "summary.devices[3].id" with root "summary")."""
    try:
        return msgspec.convert(value, record_type)
    except msgspec.ValidationError as error:
        raise OutsideError(str(error).replace("`$", f"`{root}")) from None
    except RecursionError:
        raise OutsideError("is nested too deeply") from None


MAX_STRING = 1 << 16  # characters: a command line or an error message, not a payload
MAX_ITEMS = 100_000
MAX_DEPTH = 64


def cut(text: str | None, limit: int = MAX_STRING) -> str | None:
    """`text` cut to `limit` characters: a label or a message from outside, shown, never a payload."""
    return text if text is None or len(text) <= limit else text[:limit]


def cut_all(texts: list[str] | None, limit: int = MAX_STRING) -> list[str] | None:
    return None if texts is None else [text[:limit] for text in texts]


def cut_fields(record: Any, limits: dict[str, int]) -> None:
    """Cut the record's string fields named in `limits` (a `__post_init__` calls it)."""
    for name, limit in limits.items():
        setattr(record, name, cut(getattr(record, name), limit))


def check_finite(record: Any, *names: str) -> None:
    """A ValueError (which decoding reports with the record's path) for a field that is NaN or infinite."""
    for name in names:
        value = getattr(record, name)
        if value is not None and not math.isfinite(value):
            raise ValueError(f"{name}: expected a finite number")


def plain_json(value: Any, where: str = "$", depth: int = 0) -> Any:
    """A clean copy of parsed JSON kept as data (a record's free-form part): strings and keys cut, containers of at
    most MAX_ITEMS, nested at most MAX_DEPTH deep; OutsideError naming the place otherwise. (Non-finite numbers
    are left to the record's types: jsonout writes them as null.)"""
    if isinstance(value, str):
        return value[:MAX_STRING]
    if not isinstance(value, (dict, list)):
        return value
    if depth >= MAX_DEPTH:
        raise OutsideError(f"nested deeper than {MAX_DEPTH} levels - at `{where}`")
    if len(value) > MAX_ITEMS:
        raise OutsideError(f"has {len(value)} entries, more than {MAX_ITEMS} - at `{where}`")
    if isinstance(value, list):
        return [plain_json(item, f"{where}[{index}]", depth + 1) for index, item in enumerate(value)]
    return {str(key)[:MAX_STRING]: plain_json(item, f"{where}.{_key(key)}", depth + 1) for key, item in value.items()}


def _key(key: object) -> str:
    text = str(key)[:40]  # a key is outside data too: an error sentence stays one printable line
    return text if text.isprintable() else repr(text)
