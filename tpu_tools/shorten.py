"""Cutting text from outside down to a bounded length, so a message or a label stays one readable line.

Base layer. Every place that bounds a string it did not write (an error sentence, a value quoted in a
message, a label from another program) calls these rather than slicing by hand, so that a cut always
shows that it is one ("...") and never exceeds the limit it names.
"""

from __future__ import annotations

ELLIPSIS = "..."


def shorten(text: str, limit: int) -> str:
    """`text` itself when it fits in `limit` characters, else its start ending in "..." (`limit` long)."""
    if len(text) <= limit:
        return text
    if limit <= len(ELLIPSIS):
        return text[:limit]
    return text[: limit - len(ELLIPSIS)] + ELLIPSIS


def quoted(value: object, limit: int = 24) -> str:
    """`value` as an error message quotes it (its repr, printable), cut short: a 400-digit number is not repeated
    whole, and an object whose repr raises or prints control characters cannot break the message."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 an object's repr may raise anything; the message must still be made
        text = f"<{type(value).__name__}>"
    if not text.isprintable():
        text = "".join(c if c.isprintable() else "?" for c in text)
    return shorten(text, limit)


def one_line(text: str, limit: int) -> str:
    """`text` with its whitespace folded to single spaces, cut to `limit`: one line of a report."""
    return shorten(" ".join(text.split()), limit)
