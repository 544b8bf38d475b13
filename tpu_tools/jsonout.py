"""The one way JSON documents are written: strict JSON, never NaN or Infinity tokens. Base layer.

Python's json writes float('nan') as the bare token NaN, which strict parsers (jq, Go, JavaScript's
JSON.parse, most databases) reject. A figure that is not finite is written as null instead, and the
document says so: a line in its top-level `notes` list naming each such key.
"""

from __future__ import annotations

import json
import math
from typing import Any

import msgspec


def finite_document(document: Any) -> tuple[Any, list[str]]:
    """A copy of `document` with every NaN or infinite float replaced by None, and where they were."""
    where: list[str] = []

    def clean(value: Any, path: str) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            where.append(path or "(document)")
            return None
        if isinstance(value, dict):
            return {key: clean(item, f"{path}.{key}" if path else str(key)) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return [clean(item, f"{path}[{index}]") for index, item in enumerate(value)]
        return value

    return clean(document, ""), where


def dumps(document: Any, *, indent: int | None = 2, compact: bool = False) -> str:
    """`document` as strict JSON text (no trailing newline); non-finite figures become null with a note.

    A typed record (a msgspec Struct, a dataclass) is written as its fields, in their declared order."""
    # Records anywhere in it become their fields; what JSON has no form for is written as its text, as before.
    document = msgspec.to_builtins(document, enc_hook=str)
    encoder = json.JSONEncoder(indent=None if compact else indent, separators=(",", ":") if compact else None,
                               allow_nan=False, default=str)
    try:  # the common case, a document with no such figure: json's C encoder alone, without a copy to walk
        return encoder.encode(document)
    except ValueError:  # a figure that is not finite (the encoder refuses it): copy and clean
        pass
    cleaned, where = finite_document(document)
    if where and isinstance(cleaned, dict):
        shown = ", ".join(where[:5]) + (f" and {len(where) - 5} more" if len(where) > 5 else "")
        message = f"not a finite number, written as null: {shown}"
        notes = cleaned.get("notes")
        if isinstance(notes, list):
            cleaned["notes"] = [*notes, message]
        elif "notes" not in cleaned:
            cleaned["notes"] = [message]
    return encoder.encode(cleaned)
