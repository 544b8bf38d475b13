"""Device memory by allocation, on request only (`tpu-monitor --arrays PID`): what holds a job's memory.

Two views, both bounded in count and time, and nothing is kept or watched between requests:
- the largest groups of live arrays by shape, dtype, sharding and the source line that made them (jaxlib keeps
  a traceback with every array; bytes on this host's devices, count);
- the largest allocation sites: JAX's device memory profile (pprof) folded by the first frame of the
  job's own code, i.e. the source line that made the buffers, with bytes and count.
The profile is decoded here (a few protobuf fields) rather than with pprof's own tooling.
"""

from __future__ import annotations

import gzip
import time
from collections import defaultdict
from typing import Any

from tpu_tools.agent.memory import shard_footprint

MAX_ARRAYS = 100_000  # live arrays looked at, at most
MAX_PROFILE_BYTES = 64 << 20
_LIBRARY_PARTS = ("/site-packages/", "/dist-packages/", "/lib/python3", "<frozen ")


def _varint(data: bytes, index: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[index]
        index += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return result, index


def _fields(data: bytes) -> list[tuple[int, int | bytes]]:
    """The (field number, value) pairs of one protobuf message: varints as int, length-delimited as bytes."""
    found: list[tuple[int, int | bytes]] = []
    index = 0
    while index < len(data):
        key, index = _varint(data, index)
        number, kind = key >> 3, key & 7
        if kind == 0:
            value, index = _varint(data, index)
            found.append((number, value))
        elif kind == 2:
            length, index = _varint(data, index)
            found.append((number, data[index:index + length]))
            index += length
        elif kind in (1, 5):
            index += 8 if kind == 1 else 4
        else:
            raise ValueError(f"protobuf wire type {kind}")
    return found


def _packed(value: int | bytes) -> list[int]:
    if isinstance(value, int):
        return [value]
    numbers, index = [], 0
    while index < len(value):
        number, index = _varint(value, index)
        numbers.append(number)
    return numbers


def allocation_sites(profile: bytes, limit: int) -> list[dict[str, Any]]:
    """The largest buffer allocation sites of a pprof device memory profile: {source, bytes, count}."""
    raw = gzip.decompress(profile) if profile[:2] == b"\x1f\x8b" else profile
    message = _fields(raw[:MAX_PROFILE_BYTES])
    strings = [v.decode("utf-8", "replace") if isinstance(v, bytes) else "" for n, v in message if n == 6]
    functions: dict[int, tuple[str, str]] = {}
    locations: dict[int, tuple[int, int]] = {}  # location id -> (function id, line)
    for number, value in message:
        if number == 5 and isinstance(value, bytes):
            f = dict(_fields(value))
            functions[int(f.get(1, 0))] = (strings[int(f.get(2, 0))], strings[int(f.get(4, 0))])
        elif number == 4 and isinstance(value, bytes):
            location = _fields(value)
            ident = next((int(v) for n, v in location if n == 1 and isinstance(v, int)), 0)
            line = next((dict(_fields(v)) for n, v in location if n == 4 and isinstance(v, bytes)), {})
            locations[ident] = (int(line.get(1, 0)), int(line.get(2, 0)))
    sites: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for number, value in message:
        if number != 2 or not isinstance(value, bytes):
            continue
        sample = _fields(value)
        labels = [dict(_fields(v)) for n, v in sample if n == 3 and isinstance(v, bytes)]
        if not any(strings[int(lab.get(1, 0))] == "kind" and strings[int(lab.get(2, 0))] == "buffer"
                   for lab in labels):
            continue  # executables: compiled code, not the job's data
        values = [v for n, v in sample if n == 2 for v in _packed(v)]
        stack = [v for n, v in sample if n == 1 for v in _packed(v)]
        sites[_source(stack, locations, functions)][0] += values[1] if len(values) > 1 else 0
        sites[_source(stack, locations, functions)][1] += values[0] if values else 0
    ranked = sorted(sites.items(), key=lambda item: -item[1][0])[:limit]
    return [{"source": source, "bytes": size, "count": count} for source, (size, count) in ranked]


def _source(stack: list[int], locations: dict[int, tuple[int, int]], functions: dict[int, tuple[str, str]]) -> str:
    """The innermost frame of the job's own code (not a library's): "file:line (function)"."""
    frames = [(functions.get(locations.get(i, (0, 0))[0], ("?", "?")), locations.get(i, (0, 0))[1]) for i in stack]
    for (name, filename), line in frames:
        if filename and not any(part in filename for part in _LIBRARY_PARTS):
            return f"{filename}:{line} ({name})"
    return "(inside libraries)"


def largest_arrays(jax_module: Any, limit: int = 20, budget_s: float = 0.5) -> dict[str, Any]:
    """The arrays document: groups by shape, dtype and sharding, and allocation sites; bounded."""
    started = time.monotonic()
    groups: dict[tuple[str, str, str, str], list[int]] = defaultdict(lambda: [0, 0])
    looked, truncated = 0, False
    backend = jax_module.local_devices()[0].client
    seen: dict[Any, str] = {}
    for array in backend.live_arrays():
        if looked >= MAX_ARRAYS or time.monotonic() - started > budget_s:
            truncated = True
            break
        looked += 1
        try:
            if array.is_deleted():
                continue
            per_shard, devices = shard_footprint(array)
            size = per_shard * len(devices)
            key = (str(tuple(array.shape)), str(array.dtype), _sharding_text(array.sharding),
                   array_source(array, seen))
        except Exception:  # noqa: BLE001 deleted while we looked, or an exotic sharding
            continue
        groups[key][0] += size
        groups[key][1] += 1
    ranked = sorted(groups.items(), key=lambda item: -item[1][0])[:limit]
    document: dict[str, Any] = {
        "arrays": [{"shape": shape, "dtype": dtype, "sharding": sharding, "source": source, "bytes": size,
                    "count": count} for (shape, dtype, sharding, source), (size, count) in ranked],
        "arrays_looked_at": looked, "truncated": truncated, "sites": [], "sites_error": None}
    try:
        document["sites"] = allocation_sites(jax_module.profiler.device_memory_profile(), limit)
    except Exception as error:  # noqa: BLE001 a backend without the profile, or one we cannot read
        document["sites_error"] = f"{type(error).__name__}: {error}"
    document["elapsed_s"] = round(time.monotonic() - started, 4)
    return document


def array_source(array: Any, seen: dict[Any, str] | None = None) -> str:
    """The line of the job's own code that made `array`, from the traceback jaxlib keeps with each array
    (captured when the array was created, unless tracebacks are switched off); "" when there is none.

    `seen` caches, for one read, what each code object and (code, instruction) came to: the traceback's raw
    frames cost a few microseconds an array where its formatted frames cost several times that."""
    traceback = getattr(array, "traceback", None)
    if traceback is None:
        return ""
    seen = {} if seen is None else seen
    try:
        codes, lasts = traceback.raw_frames()
    except AttributeError:  # an older jaxlib: the formatted frames
        return next((f"{frame.file_name}:{frame.line_num} ({frame.function_name})" for frame in traceback.frames
                     if frame.file_name and not _in_library(frame.file_name)), "(inside libraries)")
    for code, last in zip(codes, lasts):
        own = seen.get(code)
        if own is None:
            own = seen[code] = "" if _in_library(code.co_filename) else code.co_filename
        if own:
            where = seen.get((code, last))
            if where is None:
                name = getattr(code, "co_qualname", code.co_name)  # co_qualname: Python 3.11 on
                where = seen[(code, last)] = f"{own}:{traceback.code_addr2line(code, last)} ({name})"
            return where
    return "(inside libraries)"


def _in_library(filename: str) -> bool:
    return not filename or any(part in filename for part in _LIBRARY_PARTS)


def _sharding_text(sharding: Any) -> str:
    spec = getattr(sharding, "spec", None)
    if spec is not None:
        return f"{type(sharding).__name__}{tuple(spec)}"
    return type(sharding).__name__
