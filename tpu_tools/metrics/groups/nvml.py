"""The `nvml` group: NVIDIA GPUs as the driver's NVML reports them (memory, utilization, power, processes).

One `NvmlReader` per monitor run keeps NVML open between rounds; every read is bounded by the metrics
deadline, and a GPU stuck in an NVML call is reported as not answering without piling up new calls. The
card's memory, utilization and the rest reach the devices group (and so tpu-top and the device
metrics) through `device_figures`, placed by PCI bus id on the GPUs passive discovery found. Processes
carry the tag of their agent, where they have one. When NVML cannot be read on a host with NVIDIA GPUs the
group's `error` says why; on a host without any, the sentence is a note and the group is not in error.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from tpu_tools.metrics.groups.base import CollectContext, CollectOptions, DeviceFigures
from tpu_tools.metrics.nvml import GpuRecord, NvmlReader, NvmlSnapshot
from tpu_tools.metrics.processfacts import ProcessFacts
from tpu_tools.metrics.records.devices import DeviceExtra
from tpu_tools.metrics.records.gpu import GpusRecord
from tpu_tools.metrics.slurm import job_id
from tpu_tools.pjrt.discover import Holder, is_observer, sysroot
from tpu_tools.pjrt.pairing import GPU_PLATFORMS

SOURCE = "nvml"


class NvmlGroup:
    name = "nvml"
    record_type = GpusRecord
    vendor = "nvidia"  # discovery's vendor of the GPUs this group reads
    name_prefix = "NVIDIA "  # what the card's name repeats of the vendor

    def __init__(self, options: CollectOptions):
        self._timeout_s = options.metrics_timeout_s
        self._reader: Any = None
        root = sysroot()
        self._slurm_jobs = ProcessFacts(lambda pid: job_id(pid, root))  # as the processes group keeps them

    def _new_reader(self) -> Any:
        return NvmlReader(watch_events=True)

    def snapshot(self, context: CollectContext) -> NvmlSnapshot:
        """This round's read (once per round, whichever group asks first)."""
        def read() -> NvmlSnapshot:
            if self._reader is None:
                self._reader = self._new_reader()
            snapshot: NvmlSnapshot = self._reader.read(self._timeout_s)
            return snapshot

        return context.memo(self.name, read)

    def collect(self, context: CollectContext) -> GpusRecord:
        snapshot = self.snapshot(context)
        # This round's copies: the reader's records stay as NVML gave them, the report's carry the monitor's own.
        gpus = [msgspec.structs.replace(gpu, device_key=None, processes=list(gpu.processes))
                for gpu in snapshot.gpus]
        tags = {r.pid: r.tag for r in context.agents().results}
        self._slurm_jobs.forget_except({process.pid for gpu in gpus for process in gpu.processes})
        for gpu in gpus:
            gpu.processes = [msgspec.structs.replace(process, tag=tags.get(process.pid),
                                                     slurm_job_id=self._slurm_jobs.get(process.pid))
                             for process in gpu.processes]
        for position, gpu in self._placed(context, snapshot):
            gpus[snapshot.gpus.index(gpu)].device_key = f"gpu:{position}"
        record = self._versions(snapshot, GpusRecord(available=snapshot.available, error=snapshot.error,
                                                     driver_version=snapshot.driver_version,
                                                     elapsed_ms=snapshot.elapsed_ms, gpus=gpus))
        if not snapshot.available and not any(c.vendor == self.vendor for c in context.discovery().chips):
            # No GPU of this vendor here: nothing is wrong, and the group must not count as failed (alerts).
            record.error, record.notes = None, [snapshot.error or ""]
        return record

    def _versions(self, snapshot: NvmlSnapshot, record: GpusRecord) -> GpusRecord:
        """The record with the versions this library reports."""
        return msgspec.structs.replace(record, nvml_version=snapshot.nvml_version,
                                       cuda_driver_version=snapshot.cuda_driver_version)

    def _placed(self, context: CollectContext, snapshot: NvmlSnapshot) -> list[tuple[int, GpuRecord]]:
        """(the devices group's GPU position, NVML GPU): by PCI bus id on discovery's GPUs, else NVML's index."""
        chips = [c for c in context.discovery().chips if c.platform in GPU_PLATFORMS]
        if not chips:  # no sysfs view of the GPUs (a container): NVML's order
            return [(gpu.index, gpu) for gpu in snapshot.gpus]
        snapshot.place_unidentified([c.pci_address for c in chips if c.vendor == self.vendor])
        positions = {chip.pci_address.lower(): position for position, chip in enumerate(chips)}
        return [(positions[gpu.pci_bus_id], gpu) for gpu in snapshot.gpus if gpu.pci_bus_id in positions]

    def device_figures(self, context: CollectContext) -> list[DeviceFigures]:
        snapshot = self.snapshot(context)
        figures = []
        for position, gpu in self._placed(context, snapshot):
            extra = DeviceExtra(temperature_celsius=gpu.temperature_celsius, power_draw_watts=gpu.power_draw_watts,
                                power_limit_watts=gpu.power_limit_watts, energy_joules=gpu.energy_joules,
                                clock_sm_hz=gpu.clock_sm_hz, utilization_memory_percent=gpu.utilization_memory_percent,
                                # the model, which discovery's PCI ids alone do not tell
                                gpu_name=gpu.name.removeprefix(self.name_prefix) if gpu.name else None,
                                gpu_status=gpu.status)
            figures.append(DeviceFigures("gpu", position, self.name, memory_used_bytes=gpu.memory_used_bytes,
                                         memory_total_bytes=gpu.memory_total_bytes,
                                         utilization_percent=gpu.utilization_gpu_percent, extra=extra,
                                         holders=self._holders(gpu)))
        return figures

    def _holders(self, gpu: GpuRecord) -> list[Holder] | None:
        """The GPU's processes as the driver lists them (NVML's compute and graphics processes): a process that
        opened /dev/nvidia* to ask NVML, as every monitor does, is not one. None where the list was not read."""
        if not gpu.ok or any(name.endswith("processes") for name in gpu.unsupported):
            return None
        return [Holder(p.pid, p.user or "?", p.command or "?") for p in gpu.processes
                if not is_observer(p.command or "")]

    def prometheus(self, data: GpusRecord) -> Iterable[Any]:
        from tpu_tools.metrics.nvml.export import families

        return families(data)

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None
