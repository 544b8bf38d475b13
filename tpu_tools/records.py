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


def _describe(value: object) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"  # repr() of 5000 digits raises
    return quoted(value, 40)


def _key(key: object) -> str:
    # a key is outside data too: the error sentence must stay one printable line
    text = shorten(str(key), 40)
    return text if text.isprintable() else repr(text)


def _where(path: str) -> str:
    return f"{path}: " if path else ""


class Spec(ABC):
    """How one value must look; `check` returns the clean value or raises RecordError."""

    nullable: bool = True

    @abstractmethod
    def check(self, value: Any, path: str, depth: int) -> Any:
        """The clean value, or RecordError naming `path`."""


@dataclass
class Int(Spec):
    min: int | None = None
    max: int | None = 1 << 63
    nullable: bool = True

    def check(self, value: Any, path: str, depth: int) -> Any:
        # bool is an int in Python, never in a record; an integral float (3.0) is accepted as JSON allows.
        if isinstance(value, float) and value.is_integer() and abs(value) < 2 ** 63:
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise RecordError(f"{_where(path)}expected an integer, got {_describe(value)}")
        if (self.min is not None and value < self.min) or (self.max is not None and value > self.max):
            raise RecordError(f"{_where(path)}{_describe(value)} is out of range")
        return value


@dataclass
class Float(Spec):
    min: float | None = None
    max: float | None = None
    nullable: bool = True
    finite: bool = True  # False keeps NaN and infinities: a figure its reader judges (and flags) itself

    def check(self, value: Any, path: str, depth: int) -> Any:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise RecordError(f"{_where(path)}expected a number, got {_describe(value)}")
        if isinstance(value, int) and abs(value) >= 1e308:  # no figure; float() of it would raise later
            raise RecordError(f"{_where(path)}{_describe(value)} is beyond any number this record holds")
        number = float(value)
        if not self.finite and not math.isfinite(number):
            return value
        if not math.isfinite(number):
            raise RecordError(f"{_where(path)}expected a finite number, got {_describe(value)}")
        if (self.min is not None and number < self.min) or (self.max is not None and number > self.max):
            raise RecordError(f"{_where(path)}{number:g} is out of range")
        return value


@dataclass
class Str(Spec):
    max_len: int = MAX_STRING
    nullable: bool = True
    one_of: tuple[str, ...] = ()  # when given, the only words allowed

    def check(self, value: Any, path: str, depth: int) -> Any:
        if not isinstance(value, str):
            raise RecordError(f"{_where(path)}expected a string, got {_describe(value)}")
        if self.one_of and value not in self.one_of:
            raise RecordError(f"{_where(path)}{_describe(value)} is not one of {', '.join(self.one_of)}")
        return value[: self.max_len]


@dataclass
class Bool(Spec):
    nullable: bool = True

    def check(self, value: Any, path: str, depth: int) -> Any:
        if not isinstance(value, bool):
            raise RecordError(f"{_where(path)}expected true or false, got {_describe(value)}")
        return value


@dataclass
class List(Spec):
    item: Spec
    max_items: int = MAX_ITEMS
    nullable: bool = True
    min_items: int = 0

    def check(self, value: Any, path: str, depth: int) -> Any:
        if not isinstance(value, list):
            raise RecordError(f"{_where(path)}expected a list, got {_describe(value)}")
        if len(value) > self.max_items:
            raise RecordError(f"{_where(path)}has {len(value)} items, more than {self.max_items}")
        if len(value) < self.min_items:
            raise RecordError(f"{_where(path)}is empty" if not value
                              else f"{_where(path)}has {len(value)} items, fewer than {self.min_items}")
        return [_check_item(self.item, item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value)]


@dataclass
class Map(Spec):
    """An object whose keys are data (names -> values of one spec)."""

    value: Spec
    max_items: int = MAX_ITEMS
    nullable: bool = True

    def check(self, value: Any, path: str, depth: int) -> Any:
        if not isinstance(value, dict):
            raise RecordError(f"{_where(path)}expected an object, got {_describe(value)}")
        if len(value) > self.max_items:
            raise RecordError(f"{_where(path)}has {len(value)} entries, more than {self.max_items}")
        return {str(k)[:MAX_STRING]: _check_item(self.value, v, f"{path}.{_key(k)}" if path else _key(k), depth + 1)
                for k, v in value.items()}


@dataclass
class AnyJSON(Spec):
    """Any JSON value (kept as data, never interpreted); numbers must still be finite."""

    nullable: bool = True

    def check(self, value: Any, path: str, depth: int) -> Any:
        if isinstance(value, dict):
            return Map(self).check(value, path, depth)
        if isinstance(value, list):
            return List(self).check(value, path, depth)
        if isinstance(value, float):
            return Float().check(value, path, depth)
        if isinstance(value, (str, int, bool)):
            return Str().check(value, path, depth) if isinstance(value, str) else value
        raise RecordError(f"{_where(path)}unexpected value {_describe(value)}")


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

    def check(self, value: Any, path: str, depth: int) -> Any:
        if not isinstance(value, dict):
            raise RecordError(f"{_where(path)}expected an object, got {_describe(value)}")
        clean: dict[str, Any] = {}
        for name in self.required:
            if value.get(name) is None:
                raise RecordError(f"{_where(path)}{name} is missing")
        for name in self.present:
            if name not in value and name not in self.fields:
                raise RecordError(f"{_where(path)}{name} is missing")
        for name, spec in self.fields.items():
            if name not in value and name in self.present:
                raise RecordError(f"{_where(path)}{name} is missing")
            if name in value and value[name] is None and not spec.nullable:
                raise RecordError(f"{_where(path)}{name} is null")
            clean[name] = _check(spec, value.get(name), f"{path}.{name}" if path else name, depth + 1)
        if self.others is not None:
            if len(value) > MAX_ITEMS:
                raise RecordError(f"{_where(path)}has {len(value)} entries, more than {MAX_ITEMS}")
            for name, item in value.items():
                if name not in clean:
                    key = _key(name)
                    clean[str(name)[:MAX_STRING]] = _check(self.others, item, f"{path}.{key}" if path else key,
                                                           depth + 1)
        elif self.keep_unknown_scalars:
            for name, item in value.items():
                if name in clean or not isinstance(name, str) or len(clean) >= MAX_ITEMS:
                    continue
                if isinstance(item, (str, int, bool)) or (isinstance(item, float) and math.isfinite(item)):
                    clean[name] = item[:MAX_STRING] if isinstance(item, str) else item
        return clean


def _check(spec: Spec, value: Any, path: str, depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise RecordError(f"{_where(path)}nested deeper than {MAX_DEPTH} levels")
    if value is None:
        if spec.nullable:
            return None
        raise RecordError(f"{_where(path)}is missing")
    return spec.check(value, path, depth)


def _check_item(spec: Spec, value: Any, path: str, depth: int) -> Any:
    # An item of a list or map is there: when it may not be null, null is the fault, not absence. An object's
    # place is never null: readers index the items of a list of objects.
    if value is None and (not spec.nullable or isinstance(spec, Obj)):
        raise RecordError(f"{_where(path)}is null")
    return _check(spec, value, path, depth)


def parse(spec: Spec, value: Any, where: str = "") -> Any:
    """The clean copy of `value`, or RecordError naming the first field that does not fit `spec`.

    `where` names the record itself in the error ("summary" gives "summary.devices: expected a list").
    """
    try:
        return _check(spec, value, where, 0)
    except RecursionError as error:
        raise RecordError("nested too deeply") from error
