"""The monitor report (schema `tpu-tools/monitor/v1`) as a typed record, and what every group carries."""

from __future__ import annotations

from typing import Any

import msgspec

from tpu_tools.metrics.records.devices import DevicesRecord
from tpu_tools.metrics.records.diag import DiagGroup
from tpu_tools.metrics.records.fleet import FleetGroup
from tpu_tools.metrics.records.gpu import GpusRecord
from tpu_tools.metrics.records.group import GroupRecord
from tpu_tools.metrics.records.host import HostRecord
from tpu_tools.metrics.records.jobs import ProcessesGroup, WorkloadGroup
from tpu_tools.metrics.records.libtpu import LibtpuGroup
from tpu_tools.metrics.records.slice import TpuSlice

__all__ = ["SCHEMA", "GroupRecord", "MonitorReport", "waiting_report"]

SCHEMA = "tpu-tools/monitor/v1"


# Groups not planned for a report (`--groups`) are left out of its JSON rather than written as null.
class MonitorReport(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One monitor round: the header, then each planned group in the report's group order."""

    schema: str
    time: str  # ISO 8601 UTC with milliseconds
    time_unix_s: float
    hostname: str
    sequence: int
    tpu_tools_version: str
    tpu_slice: TpuSlice | None = None  # this host's place in a TPU slice
    host: HostRecord | None = None
    devices: DevicesRecord | None = None
    processes: ProcessesGroup | None = None
    libtpu: LibtpuGroup | None = None
    workload: WorkloadGroup | None = None
    nvml: GpusRecord | None = None
    amdsmi: GpusRecord | None = None
    diag: DiagGroup | None = None
    fleet: FleetGroup | None = None  # a fleet reader's own group (metrics.fleet)


# A header with nothing known: what a report has before its first round, or where a document leaves a field out.
_BLANK_HEADER: dict[str, Any] = {"schema": SCHEMA, "time": "", "time_unix_s": 0.0, "hostname": "", "sequence": 0,
                                 "tpu_tools_version": ""}


def waiting_report() -> MonitorReport:
    """What a view shows before its first report arrives: a header with nothing known and no group."""
    return MonitorReport(**_BLANK_HEADER)


def report_from_document(document: dict[str, Any]) -> MonitorReport:
    """The record of a document of the report's JSON shape (a saved tpu-monitor line, a fixture), each group decoded
    into its record and checked as outside data is (msgspec.ValidationError for a group of the wrong shape); a header
    field it leaves out is blank."""
    return msgspec.convert({**_BLANK_HEADER, **document}, MonitorReport)
