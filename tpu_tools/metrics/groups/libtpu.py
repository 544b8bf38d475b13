"""The `libtpu` group: the running job's figures from libtpu's runtime metrics services.

One `LibtpuClient` per monitor run: one gRPC channel per address, reused every period and closed when
the run ends (created on first use, so a run without this group never imports gRPC). Each round reads
every address once, within the deadline, shared by this group and the devices group. The group body is
`export.report_group`: `error` is set only when no address answered, and the rest of the report goes
on. A service that dies is an error until it comes back on the same address, which the client finds
again by itself. Per-device figures (HBM, duty cycle) reach the devices group, tpu-top's device panel
and Prometheus through `device_figures`, paired with this host's TPU chips as tpu-ls pairs them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from tpu_tools.metrics.groups.base import CollectContext, CollectOptions, DeviceFigures
from tpu_tools.metrics.libtpu import DeviceFigures as ServiceDevice
from tpu_tools.metrics.libtpu import LibtpuSnapshot
from tpu_tools.metrics.libtpu.export import gauge_samples, histogram_samples, report_group
from tpu_tools.metrics.libtpu.pairing import pair_with_chips, served_devices
from tpu_tools.metrics.records.devices import DeviceExtra
from tpu_tools.metrics.records.libtpu import LibtpuGroup as LibtpuGroupRecord
from tpu_tools.pjrt.discover import Chip

SOURCE = "libtpu"


def place_devices(snapshots: Sequence[LibtpuSnapshot],
                  chips: Sequence[Chip]) -> tuple[list[tuple[int, ServiceDevice]], str | None]:
    """(local TPU device index, service device) for the devices group, and a note when they cannot be placed.

    Devices of every answering service go to the chips' devices in order when the counts agree; one
    service alone is placed by its own device ids; several that do not pair stay in the libtpu group only.
    """
    served = served_devices(snapshots)
    if not served:
        return [], None
    if pair_with_chips(served, chips) is not None:
        return [(position, device) for position, (_, device) in enumerate(served)], None
    count = f"the libtpu metrics services report {len(served)} devices, which do not pair with this host's " \
            f"{len(chips)} TPU chips"
    if len({address for address, _ in served}) == 1:
        return [(device.device_id, device) for _, device in served], (f"{count}: placed by the service's device ids"
                                                                       if chips else None)
    return [], f"{count}: their figures are in the libtpu group only"


class LibtpuGroup:
    name = "libtpu"
    record_type = LibtpuGroupRecord

    def __init__(self, options: CollectOptions):
        self._addresses = list(options.metrics_addresses)
        self._timeout_s = options.metrics_timeout_s
        self._client: Any = None
        self._latest: list[LibtpuSnapshot] = []  # what the last report's group holds, for Prometheus

    def snapshots(self, context: CollectContext) -> list[LibtpuSnapshot]:
        """This round's read of every address (once per round, whichever group asks first)."""
        return context.memo("libtpu", self._read)

    def _read(self) -> list[LibtpuSnapshot]:
        if not self._addresses:
            return []
        if self._client is None:
            from tpu_tools.metrics.libtpu import LibtpuClient

            self._client = LibtpuClient(self._addresses, self._timeout_s)
        snapshots: list[LibtpuSnapshot] = self._client.snapshot()
        return snapshots

    def _placed(self, context: CollectContext) -> tuple[list[tuple[int, ServiceDevice]], str | None]:
        return place_devices(self.snapshots(context), context.discovery().chips_for_platform("tpu"))

    def collect(self, context: CollectContext) -> LibtpuGroupRecord:
        snapshots = self.snapshots(context)
        self._latest = snapshots
        _, note = self._placed(context)
        return report_group(snapshots, [note] if note else [])

    def device_figures(self, context: CollectContext) -> list[DeviceFigures]:
        placed, _ = self._placed(context)
        return [DeviceFigures("tpu", position, SOURCE, memory_used_bytes=device.hbm_used_bytes,
                              memory_total_bytes=device.hbm_total_bytes,
                              utilization_percent=device.duty_cycle_percent,
                              extra=DeviceExtra(
                                  hbm_bandwidth_utilization_percent=device.hbm_bandwidth_utilization_percent,
                                  tensorcore_idle_duration_seconds=device.tensorcore_idle_duration_s,
                                  hlo_queue_size=device.hlo_queue_size))
                for position, device in placed]

    def prometheus(self, data: LibtpuGroupRecord) -> Iterable[Any]:
        from tpu_tools.metrics.samplefamilies import histogram_families, sample_families

        return [*sample_families(gauge_samples(self._latest)), *histogram_families(histogram_samples(self._latest))]

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
