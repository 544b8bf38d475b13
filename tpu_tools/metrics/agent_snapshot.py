"""Decoding an agent's answer (schema tpu-tools/agent/v1) into its record, `records.agent.AgentSnapshot`.

An agent is another process: whatever it answers is decoded straight from its bytes into the typed record,
checked against its types and bounds, before a monitor, tpu-top or a bundle reads it. A snapshot that does not
fit becomes one error for that agent (`OutsideError`, one sentence naming the field), so one broken or hostile
job never hides the others.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec
import msgspec.inspect as types

from tpu_tools.metrics.records.agent import MAX_DEPTH, SCHEMA, AgentSnapshot
from tpu_tools.outside import OutsideError
from tpu_tools.shorten import quoted, shorten

__all__ = ["SCHEMA", "OutsideError", "decode_snapshot", "parse_snapshot", "snapshot_record"]

NOT_A_SNAPSHOT = "answered something that is not an agent snapshot"
NOT_JSON = "answered something that is not JSON"

_DECODER = msgspec.json.Decoder(AgentSnapshot)
_KINDS = {"array": "a list", "object": "an object", "int": "an integer", "float": "a number", "str": "a string",
          "bool": "true or false"}
_TOO_LONG = re.compile(r"Expected `str` of length <= \d+")
_SNAPSHOT_TYPE = msgspec.inspect.type_info(AgentSnapshot)
_MESSAGE = re.compile(r"(?P<what>.*?)(?: - at `\$(?P<path>.*)`)?$", re.DOTALL)
_STEP = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[(\d+|\.\.\.)\]")


def decode_snapshot(data: bytes | bytearray | memoryview) -> AgentSnapshot:
    """The record of an agent's answer, decoded from its JSON bytes; OutsideError says in one sentence what is
    wrong (the answer is not JSON, not a snapshot, or a field does not fit)."""
    try:
        snapshot = _DECODER.decode(data)
    except msgspec.ValidationError as error:
        document = _document(data)
        if _TOO_LONG.match(str(error)) and isinstance(document, dict):
            return snapshot_record(document)  # cuts the texts past their bounds
        raise OutsideError(_sentence(error, document)) from None
    except msgspec.DecodeError:
        # NaN and Infinity are not JSON, but Python's json writes them (earlier agents did): read them as json
        # does, and the record's check names the figure
        return snapshot_record(_lenient_document(data))
    except RecursionError as error:
        raise OutsideError(NOT_JSON) from error
    if snapshot.schema != SCHEMA:
        raise OutsideError(NOT_A_SNAPSHOT)
    return snapshot


def snapshot_record(document: Any) -> AgentSnapshot:
    """The record of an agent's answer already read as JSON (a bundle's member); OutsideError as decode_snapshot."""
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        raise OutsideError(NOT_A_SNAPSHOT)
    try:
        try:
            return msgspec.convert(document, AgentSnapshot)
        except msgspec.ValidationError as error:
            if not _TOO_LONG.match(str(error)):
                raise
            # A text past its bound is cut, not refused: read once more with every such text cut (the rare way:
            # the bounds are checked by msgspec as it decodes, the cutting walks the document in Python)
            return msgspec.convert(_cut_texts(document, _SNAPSHOT_TYPE, 0), AgentSnapshot)
    except msgspec.ValidationError as error:
        raise OutsideError(_sentence(error, document)) from None
    except RecursionError as error:
        raise OutsideError("answered a malformed snapshot (nested too deeply)") from error


def parse_snapshot(document: Any) -> dict[str, Any]:
    """The checked JSON document of an agent's answer (every field, None where the agent sent none)."""
    document_of_record: dict[str, Any] = msgspec.to_builtins(snapshot_record(document))
    return document_of_record


_TOO_DEEP = object()


def _cut_texts(value: Any, kind: types.Type, depth: int) -> Any:
    """`value` with every text longer than the `max_length` of its place in `kind` cut to it (what does not fit
    `kind` otherwise is left for msgspec to name)."""
    if depth > MAX_DEPTH:
        return value
    if isinstance(kind, types.UnionType):
        for member in kind.types:
            value = _cut_texts(value, member, depth)
        return value
    if isinstance(kind, types.StrType) and isinstance(value, str):
        return value[:kind.max_length] if kind.max_length is not None else value
    if isinstance(kind, types.StructType) and isinstance(value, dict):
        cut = dict(value)
        for field in kind.fields:
            if field.encode_name in cut:
                cut[field.encode_name] = _cut_texts(cut[field.encode_name], field.type, depth + 1)
        return cut
    if isinstance(kind, types.ListType) and isinstance(value, list):
        return [_cut_texts(item, kind.item_type, depth + 1) for item in value]
    if isinstance(kind, types.DictType) and isinstance(value, dict):
        return {key: _cut_texts(item, kind.value_type, depth + 1) for key, item in value.items()}
    return value


def _document(data: bytes | bytearray | memoryview) -> Any:
    """The answer as plain JSON, to name the value that did not fit (read only for an answer that does not)."""
    try:
        return msgspec.json.decode(data)
    except msgspec.DecodeError:
        return None
    except RecursionError:
        return _TOO_DEEP


def _lenient_document(data: bytes | bytearray | memoryview) -> Any:
    from tpu_tools.metrics import wire

    try:
        return wire.decode_response(bytes(data))
    except (ValueError, RecursionError) as error:
        raise OutsideError(NOT_JSON) from error


def _sentence(error: msgspec.ValidationError, document: Any) -> str:
    """msgspec's account of a misfit, in the words of the project's records: the path, then what is wrong."""
    if document is _TOO_DEEP:
        return "answered a malformed snapshot (nested too deeply)"
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        return NOT_A_SNAPSHOT
    match = _MESSAGE.match(str(error))
    assert match is not None  # the pattern matches any text
    what, path = match["what"], match["path"] or ""
    steps = [name or index for name, index in _STEP.findall(path)]
    value, found = _at(document, steps)
    reason = _reason(what, value if found else None)
    if found and value is None and steps:
        last = steps[-1]
        parent = _path(steps[:-1])
        if last.isdigit() or last == "...":
            reason, parent = "is null", _path(steps)
        else:
            reason = f"{last} is missing"
        return f"answered a malformed snapshot ({parent + ': ' if parent else ''}{reason})"
    required = re.fullmatch(r"Object missing required field `(.*)`", what)
    if required:
        reason = f"{required[1]} is missing"
    where = _path(steps)
    return f"answered a malformed snapshot ({where + ': ' if where else ''}{reason})"


def _at(document: Any, steps: list[str]) -> tuple[Any, bool]:
    value = document
    for step in steps:
        if isinstance(value, dict) and step in value:
            value = value[step]
        elif isinstance(value, list) and step.isdigit() and int(step) < len(value):
            value = value[int(step)]
        else:
            return None, False
    return value, True


def _path(steps: list[str]) -> str:
    text = "".join(f"[{step}]" if step.isdigit() or step == "..." else f".{step}" for step in steps)
    return text[1:] if text.startswith(".") else text


def _describe(value: object) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"  # repr() of 5000 digits raises
    return quoted(value, 40)


def _reason(what: str, value: Any) -> str:
    expected = re.fullmatch(r"Expected `([a-z]+)(?: \| null)?`, got `.*`", what)
    if expected:
        return f"expected {_KINDS.get(expected[1], expected[1])}, got {_describe(value)}"
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return f"expected a finite number, got {_describe(value)}"
    if re.fullmatch(r"Expected `(int|float)` [<>]=? .*", what) or what == "Integer value out of range":
        return f"{_describe(value)} is out of range"
    longest = re.fullmatch(r"Expected `(array|object)` of length <= (\d+)", what)
    if longest and isinstance(value, (list, dict)):
        unit = "items" if longest[1] == "array" else "entries"
        return f"has {len(value)} {unit}, more than {longest[2]}"
    if what.startswith("Invalid enum value"):
        return f"{_describe(value)} is not one of the words it may be"
    return shorten(what[:1].lower() + what[1:], 200)
