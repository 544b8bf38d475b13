"""Typed parsing of records that come from outside the program: one bad record is one error, never a crash.

Agents, libtpu services and bundles are other programs (or other users); what they send is checked
field by field against a small spec before anything reads it. `parse(spec, value)` returns a clean
copy (only JSON types, finite numbers, bounded strings and lists) or raises `RecordError` with one
sentence naming the first bad field, which the caller turns into an error for that record alone.

A field may be null or absent unless its spec says `nullable=False` (must be there and not null); an
object's `present` names fields that must be there but may be null (readers index them directly),
`List(min_items=1)` is a list that must not be empty, `Str(one_of=...)` a closed set of words, and
`Obj(others=spec)` keeps unknown fields of any kind after checking them against `spec`.

    SNAPSHOT = Obj({"pid": Int(min=1), "tag": Str(), "devices": List(Obj({"id": Int()}))}, required=("pid",))
    clean = parse(SNAPSHOT, document)        # or RecordError("devices[0].id: expected an integer, got 'x'")

JSON output is written by `tpu_tools.jsonout`, which writes null (and a note) for NaN and infinities.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tpu_tools.shorten import quoted, shorten

MAX_STRING = 1 << 16  # characters; longer strings are cut (a command line or an error message, not a payload)
MAX_ITEMS = 100_000
MAX_DEPTH = 64


class RecordError(ValueError):
    """A record from outside is malformed; the message names the field and what was wrong."""


class _Misfit(RecordError):
    """A field that does not fit, on its way up: each container it passes adds its step to `trail` (innermost
    first), and `parse` writes the path once. A record that fits builds no path at all: a monitor checks an
    agent's snapshot of some hundred fields 10 times a second, and formatting every field's path cost more
    than checking the fields."""

    def __init__(self, reason: str, step: str = ""):
        super().__init__(reason)
        self.reason = reason
        self.trail = [step] if step else []

    def sentence(self, where: str) -> str:
        path = where + "".join(reversed(self.trail))
        if not where and path.startswith("."):  # a field of the record itself: "devices", not ".devices"
            path = path[1:]
        return f"{path}: {self.reason}" if path else self.reason


def _describe(value: object) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"  # repr() of 5000 digits raises
    return quoted(value, 40)


def _key(key: object) -> str:
    # a key is outside data too: the error sentence must stay one printable line
    text = shorten(str(key), 40)
    return text if text.isprintable() else repr(text)


def _too_deep(depth: int) -> None:
    if depth > MAX_DEPTH:
        raise _Misfit(f"nested deeper than {MAX_DEPTH} levels")


class Spec(ABC):
    """How one value must look; `check` returns the clean value or raises RecordError."""

    nullable: bool = True

    @abstractmethod
    def check(self, value: Any, depth: int) -> Any:
        """The clean value of a value that is not None, at `depth` containers below the record."""


@dataclass
class Int(Spec):
    min: int | None = None
    max: int | None = 1 << 63
    nullable: bool = True

    def check(self, value: Any, depth: int) -> Any:
        if type(value) is not int:
            # bool is an int in Python, never in a record; an integral float (3.0) is accepted as JSON allows.
            if isinstance(value, float) and value.is_integer() and abs(value) < 2 ** 63:
                value = int(value)
            if isinstance(value, bool) or not isinstance(value, int):
                raise _Misfit(f"expected an integer, got {_describe(value)}")
        if (self.min is not None and value < self.min) or (self.max is not None and value > self.max):
            raise _Misfit(f"{_describe(value)} is out of range")
        return value


@dataclass
class Float(Spec):
    min: float | None = None
    max: float | None = None
    nullable: bool = True
    finite: bool = True  # False keeps NaN and infinities: a figure its reader judges (and flags) itself

    def check(self, value: Any, depth: int) -> Any:
        if type(value) is float:
            number = value
        else:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise _Misfit(f"expected a number, got {_describe(value)}")
            if isinstance(value, int) and abs(value) >= 1e308:  # no figure; float() of it would raise later
                raise _Misfit(f"{_describe(value)} is beyond any number this record holds")
            number = float(value)
        if not math.isfinite(number):
            if not self.finite:
                return value
            raise _Misfit(f"expected a finite number, got {_describe(value)}")
        if (self.min is not None and number < self.min) or (self.max is not None and number > self.max):
            raise _Misfit(f"{number:g} is out of range")
        return value


@dataclass
class Str(Spec):
    max_len: int = MAX_STRING
    nullable: bool = True
    one_of: tuple[str, ...] = ()  # when given, the only words allowed

    def check(self, value: Any, depth: int) -> Any:
        if not isinstance(value, str):
            raise _Misfit(f"expected a string, got {_describe(value)}")
        if self.one_of and value not in self.one_of:
            raise _Misfit(f"{_describe(value)} is not one of {', '.join(self.one_of)}")
        return value if len(value) <= self.max_len else value[: self.max_len]


@dataclass
class Bool(Spec):
    nullable: bool = True

    def check(self, value: Any, depth: int) -> Any:
        if not isinstance(value, bool):
            raise _Misfit(f"expected true or false, got {_describe(value)}")
        return value


def _item(spec: Spec, value: Any, depth: int) -> Any:
    # An item of a list or map is there: when it may not be null, null is the fault, not absence. An object's
    # place is never null: readers index the items of a list of objects.
    if value is None:
        if not spec.nullable or isinstance(spec, Obj):
            raise _Misfit("is null")
        return None
    return spec.check(value, depth)


@dataclass
class List(Spec):
    item: Spec
    max_items: int = MAX_ITEMS
    nullable: bool = True
    min_items: int = 0

    def check(self, value: Any, depth: int) -> Any:
        if not isinstance(value, list):
            raise _Misfit(f"expected a list, got {_describe(value)}")
        _too_deep(depth)
        if len(value) > self.max_items:
            raise _Misfit(f"has {len(value)} items, more than {self.max_items}")
        if len(value) < self.min_items:
            raise _Misfit("is empty" if not value else f"has {len(value)} items, fewer than {self.min_items}")
        clean = []
        for index, item in enumerate(value):
            try:
                clean.append(_item(self.item, item, depth + 1))
            except _Misfit as misfit:
                misfit.trail.append(f"[{index}]")
                raise
        return clean


@dataclass
class Map(Spec):
    """An object whose keys are data (names -> values of one spec)."""

    value: Spec
    max_items: int = MAX_ITEMS
    nullable: bool = True

    def check(self, value: Any, depth: int) -> Any:
        if not isinstance(value, dict):
            raise _Misfit(f"expected an object, got {_describe(value)}")
        _too_deep(depth)
        if len(value) > self.max_items:
            raise _Misfit(f"has {len(value)} entries, more than {self.max_items}")
        clean = {}
        for key, item in value.items():
            try:
                clean[str(key)[:MAX_STRING]] = _item(self.value, item, depth + 1)
            except _Misfit as misfit:
                misfit.trail.append("." + _key(key))
                raise
        return clean


@dataclass
class AnyJSON(Spec):
    """Any JSON value (kept as data, never interpreted); numbers must still be finite."""

    nullable: bool = True

    def check(self, value: Any, depth: int) -> Any:
        if isinstance(value, dict):
            return Map(self).check(value, depth)
        if isinstance(value, list):
            return List(self).check(value, depth)
        if isinstance(value, float):
            return _FLOAT.check(value, depth)
        if isinstance(value, str):
            return _STR.check(value, depth)
        if isinstance(value, (int, bool)):
            return value
        raise _Misfit(f"unexpected value {_describe(value)}")


@dataclass
class Obj(Spec):
    """An object with known fields. Absent fields read as None; `required` ones must be there and not null,
    `present` ones must be there but may be null.

    Unknown fields are kept when they are plain scalars (a newer peer's additions stay visible), and
    dropped otherwise so that nothing unchecked reaches a reader; with `others`, every unknown field is
    checked against that spec and kept.
    """

    fields: Mapping[str, Spec]
    required: tuple[str, ...] = ()
    nullable: bool = True
    keep_unknown_scalars: bool = True
    present: tuple[str, ...] = ()
    others: Spec | None = None

    def check(self, value: Any, depth: int) -> Any:
        if not isinstance(value, dict):
            raise _Misfit(f"expected an object, got {_describe(value)}")
        _too_deep(depth)
        clean: dict[str, Any] = {}
        for name in self.required:
            if value.get(name) is None:
                raise _Misfit(f"{name} is missing")
        for name in self.present:
            if name not in value and name not in self.fields:
                raise _Misfit(f"{name} is missing")
        for name, spec in self.fields.items():
            item = value.get(name)
            if item is None:
                if name not in value and name in self.present:
                    raise _Misfit(f"{name} is missing")
                if not spec.nullable:
                    raise _Misfit(f"{name} is null") if name in value else _Misfit("is missing", "." + name)
                clean[name] = None
                continue
            try:
                clean[name] = spec.check(item, depth + 1)
            except _Misfit as misfit:
                misfit.trail.append("." + name)
                raise
        if not value.keys() <= self.fields.keys():
            self._unknown(value, clean, depth)
        return clean

    def _unknown(self, value: dict[Any, Any], clean: dict[str, Any], depth: int) -> None:
        if self.others is not None:
            if len(value) > MAX_ITEMS:
                raise _Misfit(f"has {len(value)} entries, more than {MAX_ITEMS}")
            for name, item in value.items():
                if name not in clean:
                    try:
                        clean[str(name)[:MAX_STRING]] = _field(self.others, item, depth + 1)
                    except _Misfit as misfit:
                        misfit.trail.append("." + _key(name))
                        raise
        elif self.keep_unknown_scalars:
            for name, item in value.items():
                if name in clean or not isinstance(name, str) or len(clean) >= MAX_ITEMS:
                    continue
                if isinstance(item, (str, int, bool)) or (isinstance(item, float) and math.isfinite(item)):
                    clean[name] = item[:MAX_STRING] if isinstance(item, str) else item


_FLOAT = Float()
_STR = Str()


def _field(spec: Spec, value: Any, depth: int) -> Any:
    # an object's field or the record itself: absent or null is None where the spec allows it
    if value is None:
        if spec.nullable:
            return None
        raise _Misfit("is missing")
    return spec.check(value, depth)


def parse(spec: Spec, value: Any, where: str = "") -> Any:
    """The clean copy of `value`, or RecordError naming the first field that does not fit `spec`.

    `where` names the record itself in the error ("summary" gives "summary.devices: expected a list").
    """
    try:
        return _field(spec, value, 0)
    except _Misfit as misfit:
        raise RecordError(misfit.sentence(where)) from None
    except RecursionError as error:
        raise RecordError("nested too deeply") from error
