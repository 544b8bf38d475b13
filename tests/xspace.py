"""Build XSpace traces shaped like a TPU's or a GPU's (no such device here) and write them as .xplane.pb.

The protobuf is produced by jaxlib itself (ProfileData.text_proto_to_serialized_xspace) from text format.
Times are in nanoseconds from the session start.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Event:
    name: str
    start_ns: int
    duration_ns: int
    stats: dict[str, str | int] = field(default_factory=dict)


@dataclass
class Plane:
    name: str
    lines: dict[str, list[Event]] = field(default_factory=dict)
    stats: dict[str, str | int] = field(default_factory=dict)


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _stat(metadata_id: int, value: str | int) -> str:
    kind = f"int64_value: {value}" if isinstance(value, int) else f"str_value: {_quote(value)}"
    return f"stats {{ metadata_id: {metadata_id} {kind} }}"


def text_proto(planes: list[Plane], start_time_ns: int, duration_ns: int) -> str:
    planes = [*planes, Plane("Task Environment", stats={"profile_start_time": start_time_ns,
                                                         "profile_stop_time": start_time_ns + duration_ns})]
    out = []
    for plane_id, plane in enumerate(planes, start=1):
        event_ids: dict[str, int] = {}
        stat_ids: dict[str, int] = {}

        def stat_id(name: str, stat_ids: dict[str, int] = stat_ids) -> int:
            return stat_ids.setdefault(name, len(stat_ids) + 1)

        body = [f"id: {plane_id}", f"name: {_quote(plane.name)}"]
        for line_id, (line_name, events) in enumerate(plane.lines.items(), start=1):
            parts = [f"id: {line_id}", f"display_id: {line_id}", f"name: {_quote(line_name)}", "timestamp_ns: 0"]
            for event in events:
                metadata = event_ids.setdefault(event.name, len(event_ids) + 1)
                stats = " ".join(_stat(stat_id(k), v) for k, v in event.stats.items())
                parts.append(f"events {{ metadata_id: {metadata} offset_ps: {event.start_ns * 1000} "
                             f"duration_ps: {event.duration_ns * 1000} {stats} }}")
            body.append("lines { " + " ".join(parts) + " }")
        body += [_stat(stat_id(k), v) for k, v in plane.stats.items()]
        body += [f"event_metadata {{ key: {i} value {{ id: {i} name: {_quote(n)} }} }}" for n, i in event_ids.items()]
        body += [f"stat_metadata {{ key: {i} value {{ id: {i} name: {_quote(n)} }} }}" for n, i in stat_ids.items()]
        out.append("planes { " + " ".join(body) + " }")
    return "\n".join(out)


def write_xspace(folder: Path, host: str, planes: list[Plane], start_time_ns: int = 1_700_000_000_000_000_000,
                 duration_ns: int = 1_000_000) -> Path:
    from jax.profiler import ProfileData

    run = folder / "plugins" / "profile" / "2026_01_01_00_00_00"
    run.mkdir(parents=True, exist_ok=True)
    path = run / f"{host}.xplane.pb"
    path.write_bytes(ProfileData.text_proto_to_serialized_xspace(text_proto(planes, start_time_ns, duration_ns)))
    return path
