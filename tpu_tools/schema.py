"""Checking the shape of a JSON record read from outside the program, before anything uses it. Base layer.

A spec is a type or a tuple of types (`NUMBER` for int or float, never a boolean), `Optional(spec)` for a
value that may be null or missing, `Nullable(spec)` for one that must be present but may be null,
`NonEmpty(spec)` for a list of at least one item, a one-element list `[spec]` for a list of such items, or a dict of key
to spec for an object (other keys are allowed: newer writers may add some). `check` raises ValueError
naming the first field that does not fit, so a damaged record is one error, never a crash later on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

NUMBER = (int, float)
ANY = object


@dataclass(frozen=True)
class Optional:
    """May be null or missing."""

    spec: Any


@dataclass(frozen=True)
class Nullable:
    """Must be present; may be null (readers index it directly)."""

    spec: Any


@dataclass(frozen=True)
class NonEmpty:
    """A list of at least one item of `spec`."""

    spec: Any


def check(value: Any, spec: Any, where: str = "document") -> None:
    """Raise ValueError when `value` does not fit `spec` (see the module's docstring)."""
    if isinstance(spec, (Optional, Nullable)):
        if value is not None:
            check(value, spec.spec, where)
        return
    if isinstance(spec, NonEmpty):
        check(value, [spec.spec], where)
        if not value:
            raise ValueError(f"{where} is empty")
        return
    if isinstance(spec, list):
        if not isinstance(value, list):
            raise ValueError(f"{where} is {_kind(value)}, expected a list")
        for index, item in enumerate(value):
            check(item, spec[0], f"{where}[{index}]")
        return
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            raise ValueError(f"{where} is {_kind(value)}, expected an object")
        for key, item_spec in spec.items():
            item = value.get(key)
            if key not in value and not isinstance(item_spec, Optional):
                raise ValueError(f"{where}.{key} is missing")
            if item is None and not isinstance(item_spec, (Optional, Nullable)):
                raise ValueError(f"{where}.{key} is null")
            check(item, item_spec, f"{where}.{key}")
        return
    kinds = spec if isinstance(spec, tuple) else (spec,)
    if spec is ANY:
        return
    if isinstance(value, bool) and bool not in kinds:
        raise ValueError(f"{where} is a boolean, expected {_names(kinds)}")
    if not isinstance(value, kinds):
        raise ValueError(f"{where} is {_kind(value)}, expected {_names(kinds)}")


def _kind(value: Any) -> str:
    return "null" if value is None else f"a {type(value).__name__}"


def _names(kinds: tuple[type, ...]) -> str:
    return "a number" if set(kinds) == set(NUMBER) else " or ".join(f"a {k.__name__}" for k in kinds)
