"""Reading NVML (through nvidia-ml-py) into `NvmlSnapshot` records, every call under a deadline.

NVML can block for a long time in a call on a GPU that fell off the bus. Each read therefore runs in
daemon threads (one for the library's start and its system figures, one per GPU) and the caller waits
only until its deadline: a GPU whose thread has not finished is reported as not answering, the others
as read. A thread still stuck from an earlier read is not started again for that GPU (the monitor reads
every period), and NVML is not shut down under a stuck call.

Field rule: an NVML error on one field (NotSupported, FunctionNotFound on an older driver, NoPermission,
...) makes that field None and records why in `unsupported`; GPU_IS_LOST marks the whole GPU lost.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from tpu_tools.metrics.nvml import decode
from tpu_tools.metrics.nvml.procfs import identify_process
from tpu_tools.metrics.nvml.records import NvmlSnapshot
from tpu_tools.metrics.records.gpu import (
    STATUS_ERROR,
    STATUS_LOST,
    STATUS_NOT_ANSWERING,
    GpuProcess,
    GpuRecord,
    MigInstance,
)

DEFAULT_TIMEOUT_S = 5.0
ENABLE_VARIABLE = "TPU_TOOLS_NVML"  # "0" or "off": do not read NVML at all
_NVML_ERROR_GPU_IS_LOST = 15
_NVML_ERROR_NOT_FOUND = 6
_MAX_NVLINKS = 18  # NVML_NVLINK_MAX_LINKS on current drivers
_NVLINK_TX_KIB, _NVLINK_RX_KIB = 138, 139  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_{TX,RX}, KiB since load
_ALL_LINKS = 0xFFFFFFFF
NVML_LIBRARY = "libnvidia-ml.so.1"
_NOT_FOUND = f"NVML is not available: {NVML_LIBRARY} not found (no NVIDIA driver on this host)"
_MAX_MIG_DEVICES = 64  # a driver's claim of more is not believed

T = TypeVar("T")


class _Lost(Exception):
    """The GPU answered GPU_IS_LOST: stop asking it."""


def enabled() -> bool:
    return os.environ.get(ENABLE_VARIABLE, "").strip().lower() not in ("0", "off", "no", "false")


def library_loadable() -> bool:
    """Whether the dynamic loader finds NVML's library, which nvidia-ml-py loads by this name on Linux. Where it
    does not (every host without the NVIDIA driver), importing the bindings, about 15 ms, only to learn so is
    skipped: tpu-ls reads NVML on any host whose PCI devices show no accelerator."""
    if not sys.platform.startswith("linux"):
        return True
    import ctypes

    try:
        ctypes.CDLL(NVML_LIBRARY)
    except OSError:
        return False
    return True


def _pynvml() -> Any:
    import pynvml  # type: ignore[import-untyped,unused-ignore]

    return pynvml


def _reason(error: BaseException) -> str:
    text = str(error).strip()
    return text or type(error).__name__


class _Gpu:
    """Reads one GPU's fields, each under the field rule."""

    def __init__(self, nvml: Any, index: int, sysroot: Path):
        self.nvml = nvml
        self.record = GpuRecord(index=index)
        self.sysroot = sysroot

    def get(self, name: str, call: Callable[[], T]) -> T | None:
        try:
            return call()
        except self.nvml.NVMLError as error:
            if getattr(error, "value", None) == _NVML_ERROR_GPU_IS_LOST:
                raise _Lost from error
            self.record.unsupported[name] = _reason(error)
            return None

    def read(self) -> GpuRecord:
        nvml, record = self.nvml, self.record
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(record.index)
        except nvml.NVMLError as error:
            lost = getattr(error, "value", None) == _NVML_ERROR_GPU_IS_LOST
            record.status, record.error = (STATUS_LOST if lost else STATUS_ERROR), _reason(error)
            return record
        try:
            self._identity(handle)
            self._memory(handle)
            self._activity(handle)
            self._health(handle)
            self._links(handle)
            self._processes(handle)
        except _Lost:
            record.status, record.error = STATUS_LOST, "GPU is lost (NVML: GPU_IS_LOST); it needs a reset"
        return record

    def _identity(self, handle: Any) -> None:
        nvml, r = self.nvml, self.record
        r.name = self.get("name", lambda: _text(nvml.nvmlDeviceGetName(handle)))
        r.uuid = self.get("uuid", lambda: _text(nvml.nvmlDeviceGetUUID(handle)))
        pci = self.get("pci_bus_id", lambda: nvml.nvmlDeviceGetPciInfo(handle))
        r.pci_bus_id = decode.pci_bus_id(_text(pci.busId)) if pci is not None else None
        r.minor_number = self.get("minor_number", lambda: int(nvml.nvmlDeviceGetMinorNumber(handle)))

    def _memory(self, handle: Any) -> None:
        nvml, r = self.nvml, self.record
        memory = self.get("memory_info_v2", lambda: nvml.nvmlDeviceGetMemoryInfo(handle, version=nvml.nvmlMemory_v2))
        if memory is not None:
            r.memory_info_version = 2
            r.memory_reserved_bytes = int(memory.reserved)
        else:  # an older driver: used includes what the driver reserves
            memory = self.get("memory_info", lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
            r.memory_info_version = 1 if memory is not None else None
        if memory is not None:
            r.memory_total_bytes, r.memory_used_bytes = int(memory.total), int(memory.used)
            r.memory_free_bytes = int(memory.free)

    def _activity(self, handle: Any) -> None:
        nvml, r = self.nvml, self.record
        util = self.get("utilization", lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
        if util is not None:
            r.utilization_gpu_percent, r.utilization_memory_percent = float(util.gpu), float(util.memory)
        r.temperature_celsius = _scaled(self.get(
            "temperature", lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)), 1)
        r.power_draw_watts = _scaled(self.get("power_draw", lambda: nvml.nvmlDeviceGetPowerUsage(handle)), 1e-3)
        r.power_limit_watts = _scaled(self.get("power_limit", lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle)),
                                      1e-3)
        r.energy_joules = _scaled(self.get("energy", lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(handle)), 1e-3)
        sm, mem = nvml.NVML_CLOCK_SM, nvml.NVML_CLOCK_MEM
        r.clock_sm_hz = _scaled(self.get("clock_sm", lambda: nvml.nvmlDeviceGetClockInfo(handle, sm)), 1e6)
        r.clock_sm_max_hz = _scaled(self.get("clock_sm_max", lambda: nvml.nvmlDeviceGetMaxClockInfo(handle, sm)), 1e6)
        r.clock_memory_hz = _scaled(self.get("clock_memory", lambda: nvml.nvmlDeviceGetClockInfo(handle, mem)), 1e6)
        r.clock_memory_max_hz = _scaled(self.get("clock_memory_max",
                                                 lambda: nvml.nvmlDeviceGetMaxClockInfo(handle, mem)), 1e6)
        r.performance_state = self.get("performance_state", lambda: int(nvml.nvmlDeviceGetPerformanceState(handle)))
        r.fan_speed_percent = _scaled(self.get("fan_speed", lambda: nvml.nvmlDeviceGetFanSpeed(handle)), 1)
        mask = self.get("clock_event_reasons", lambda: int(self._event_reasons(handle)))
        if mask is not None:
            r.clock_event_reasons_mask, r.clock_event_reasons = mask, decode.clock_event_reasons(mask)

    def _event_reasons(self, handle: Any) -> Any:
        """The clock event reasons, under the name drivers before 535 do not have, else the older name."""
        nvml = self.nvml
        try:
            return nvml.nvmlDeviceGetCurrentClocksEventReasons(handle)
        except (nvml.NVMLError_FunctionNotFound, AttributeError):
            return nvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle)

    def _health(self, handle: Any) -> None:
        nvml, r = self.nvml, self.record
        ecc = self.get("ecc_mode", lambda: nvml.nvmlDeviceGetEccMode(handle))
        r.ecc_enabled = bool(ecc[0]) if ecc is not None else None
        if r.ecc_enabled:
            unc = nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
            r.ecc_volatile_uncorrected_errors = self.get("ecc_volatile_uncorrected", lambda: int(
                nvml.nvmlDeviceGetTotalEccErrors(handle, unc, nvml.NVML_VOLATILE_ECC)))
            r.ecc_aggregate_uncorrected_errors = self.get("ecc_aggregate_uncorrected", lambda: int(
                nvml.nvmlDeviceGetTotalEccErrors(handle, unc, nvml.NVML_AGGREGATE_ECC)))
        rows = self.get("remapped_rows", lambda: nvml.nvmlDeviceGetRemappedRows(handle))
        if rows is not None:
            r.remapped_rows_correctable, r.remapped_rows_uncorrectable = int(rows[0]), int(rows[1])
            r.remapped_rows_pending, r.remapped_rows_failed = bool(rows[2]), bool(rows[3])
        mig = self.get("mig_mode", lambda: nvml.nvmlDeviceGetMigMode(handle))
        r.mig_enabled = bool(mig[0]) if mig is not None else None
        if r.mig_enabled:
            self._mig(handle)
        persistence = self.get("persistence_mode", lambda: nvml.nvmlDeviceGetPersistenceMode(handle))
        r.persistence_mode = bool(persistence) if persistence is not None else None
        mode = self.get("compute_mode", lambda: nvml.nvmlDeviceGetComputeMode(handle))
        r.compute_mode = decode.compute_mode(int(mode)) if mode is not None else None

    def _mig(self, handle: Any) -> None:
        """The MIG instances there are now. Instances are made and destroyed at any time: one that is gone
        between two calls is left out, never an error."""
        nvml, r = self.nvml, self.record
        most = self.get("mig_devices", lambda: int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)))
        instances: list[MigInstance] = []
        for index in range(min(most or 0, _MAX_MIG_DEVICES)):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, index)
                gpu_instance = int(nvml.nvmlDeviceGetGpuInstanceId(mig))
                compute_instance = int(nvml.nvmlDeviceGetComputeInstanceId(mig))
                memory = nvml.nvmlDeviceGetMemoryInfo(mig)
            except nvml.NVMLError as error:
                if getattr(error, "value", None) == _NVML_ERROR_GPU_IS_LOST:
                    raise _Lost from error
                continue  # an empty slot, or an instance destroyed since
            instances.append(MigInstance(index=index, gpu_instance_id=gpu_instance,
                                         compute_instance_id=compute_instance, memory_used_bytes=int(memory.used),
                                         memory_total_bytes=int(memory.total)))
        r.mig_instances = instances

    def _links(self, handle: Any) -> None:
        nvml, r = self.nvml, self.record
        r.pcie_link_generation = self.get("pcie_link_generation",
                                          lambda: int(nvml.nvmlDeviceGetCurrPcieLinkGeneration(handle)))
        r.pcie_link_generation_max = self.get("pcie_link_generation_max",
                                              lambda: int(nvml.nvmlDeviceGetMaxPcieLinkGeneration(handle)))
        r.pcie_link_width = self.get("pcie_link_width", lambda: int(nvml.nvmlDeviceGetCurrPcieLinkWidth(handle)))
        r.pcie_link_width_max = self.get("pcie_link_width_max",
                                         lambda: int(nvml.nvmlDeviceGetMaxPcieLinkWidth(handle)))
        r.pcie_replay_errors = self.get("pcie_replay_counter",
                                        lambda: int(nvml.nvmlDeviceGetPcieReplayCounter(handle)))
        # NVML counts PCIe throughput in KB/s (1024 bytes) over a 20 ms window.
        r.pcie_tx_bytes_per_second = _scaled(self.get("pcie_tx", lambda: nvml.nvmlDeviceGetPcieThroughput(
            handle, nvml.NVML_PCIE_UTIL_TX_BYTES)), 1024)
        r.pcie_rx_bytes_per_second = _scaled(self.get("pcie_rx", lambda: nvml.nvmlDeviceGetPcieThroughput(
            handle, nvml.NVML_PCIE_UTIL_RX_BYTES)), 1024)
        self._nvlink(handle)

    def _nvlink(self, handle: Any) -> None:
        nvml, r = self.nvml, self.record
        active = links = 0
        down: list[int] = []
        for link in range(_MAX_NVLINKS):
            try:
                state = nvml.nvmlDeviceGetNvLinkState(handle, link)
            except nvml.NVMLError as error:
                if getattr(error, "value", None) == _NVML_ERROR_GPU_IS_LOST:
                    raise _Lost from error
                if link == 0:  # a PCIe board: no NVLink at all
                    r.unsupported["nvlink"] = _reason(error)
                    return
                break  # past the board's last link
            links += 1
            active += 1 if state else 0
            if not state:
                down.append(link)
        r.nvlink_links, r.nvlink_links_active, r.nvlink_links_down = links, active, down
        # NVML_NVLINK_ERROR_DL_REPLAY, _DL_RECOVERY, _DL_CRC_FLIT, summed over the links
        for field_name, counter in (("nvlink_replay_errors", 0), ("nvlink_recovery_errors", 1),
                                    ("nvlink_crc_errors", 2)):
            counts = [self.get(field_name, functools.partial(nvml.nvmlDeviceGetNvLinkErrorCounter, handle, link,
                                                             counter)) for link in range(links)]
            if counts and all(c is not None for c in counts):
                setattr(r, field_name, sum(int(c) for c in counts if c is not None))
        values = self.get("nvlink_throughput", lambda: nvml.nvmlDeviceGetFieldValues(
            handle, [(_NVLINK_TX_KIB, _ALL_LINKS), (_NVLINK_RX_KIB, _ALL_LINKS)]))
        if values is not None:
            tx, rx = (int(v.value.ullVal) * 1024 if v.nvmlReturn == 0 else None for v in values)
            r.nvlink_tx_bytes_total, r.nvlink_rx_bytes_total = tx, rx

    def _processes(self, handle: Any) -> None:
        nvml, r = self.nvml, self.record
        found: dict[int, GpuProcess] = {}
        calls: list[tuple[str, Callable[[Any], Any]]] = [
            ("compute", nvml.nvmlDeviceGetComputeRunningProcesses),
            ("graphics", nvml.nvmlDeviceGetGraphicsRunningProcesses)]
        for kind, call in calls:
            infos = self.get(f"{kind}_processes", functools.partial(call, handle))
            for info in infos or []:
                used = getattr(info, "usedGpuMemory", None)
                found.setdefault(int(info.pid), GpuProcess(pid=int(info.pid), kind=kind,
                                                           gpu_memory_bytes=int(used) if used is not None else None))
        if found:
            for sample in self._utilization_samples(handle):
                process = found.get(int(sample.pid))
                if process is not None:
                    process.sm_utilization_percent = float(sample.smUtil)
                    process.memory_utilization_percent = float(sample.memUtil)
        for process in found.values():
            identify_process(process, self.sysroot)
        r.processes = sorted(found.values(), key=lambda p: p.pid)

    def _utilization_samples(self, handle: Any) -> list[Any]:
        nvml = self.nvml
        try:
            samples = nvml.nvmlDeviceGetProcessUtilization(handle, 0)
        except nvml.NVMLError as error:
            code = getattr(error, "value", None)
            if code == _NVML_ERROR_GPU_IS_LOST:
                raise _Lost from error
            if code != _NVML_ERROR_NOT_FOUND:  # NotFound: no sample in the window, nothing unsupported
                self.record.unsupported["process_utilization"] = _reason(error)
            return []
        latest: dict[int, Any] = {}
        for sample in samples:
            if sample.pid not in latest or sample.timeStamp > latest[sample.pid].timeStamp:
                latest[sample.pid] = sample
        return list(latest.values())


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _scaled(value: Any, factor: float) -> float | None:
    return None if value is None else round(float(value) * factor, 6)


class NvmlReader:
    """Reads NVML snapshots; keeps the library open between reads (a monitor reads every period)."""

    def __init__(self, watch_events: bool = False) -> None:
        """watch_events: count XID events as they arrive between reads (a monitor; tpu-ls reads once)."""
        self._watch_events = watch_events
        self._watcher: Any = None
        self._nvml: Any = None
        self._started: threading.Thread | None = None
        self._start_result: list[Any] = []
        self._stuck: dict[int, threading.Thread] = {}  # GPU index -> the thread still in an NVML call
        self._system: tuple[str | None, str | None, str | None, int] | None = None
        self._absent: str | None = None  # no bindings or no library: not worth asking again every round

    def read(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> NvmlSnapshot:
        began = time.monotonic()
        deadline = began + max(0.0, timeout_s)
        snapshot = self._read(deadline)
        snapshot.elapsed_ms = round((time.monotonic() - began) * 1e3, 3)
        return snapshot

    def _read(self, deadline: float) -> NvmlSnapshot:
        if not enabled():
            return NvmlSnapshot(available=False, error=f"NVML reading is off ({ENABLE_VARIABLE}="
                                                       f"{os.environ.get(ENABLE_VARIABLE)})")
        if self._absent is not None:
            return NvmlSnapshot(available=False, error=self._absent)
        if self._system is None:
            failure = self._start(deadline)
            if failure is not None:
                return NvmlSnapshot(available=False, error=failure)
        assert self._system is not None
        driver, nvml_version, cuda, count = self._system
        snapshot = NvmlSnapshot(available=True, driver_version=driver, nvml_version=nvml_version,
                                cuda_driver_version=cuda)
        sysroot = Path(os.environ.get("TPU_TOOLS_SYSROOT") or "/")
        readers: dict[int, _Gpu] = {}
        threads: dict[int, threading.Thread] = {}
        for index in range(count):
            stuck = self._stuck.get(index)
            if stuck is not None and stuck.is_alive():
                continue
            self._stuck.pop(index, None)
            readers[index] = gpu = _Gpu(self._nvml, index, sysroot)
            threads[index] = thread = threading.Thread(target=gpu.read, name=f"nvml-gpu{index}", daemon=True)
            thread.start()
        for index, thread in threads.items():
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                self._stuck[index] = thread
        if self._watch_events and self._watcher is None:
            from tpu_tools.metrics.nvml.events import XidWatcher

            self._watcher = XidWatcher(self._nvml, count)
        for index in range(count):
            if index in threads and not threads[index].is_alive():
                record = readers[index].record
                if self._watcher is not None and self._watcher.error is None:
                    record.xid_errors, last = self._watcher.of(index)
                    record.xid_last = last
                elif self._watcher is not None:
                    record.unsupported["xid_events"] = self._watcher.error
                snapshot.gpus.append(record)
                continue
            # What was read before the call that hangs (its name, its bus id) still places it.
            partial = readers[index].record if index in readers else GpuRecord(index=index)
            snapshot.gpus.append(GpuRecord(index=index, status=STATUS_NOT_ANSWERING, name=partial.name,
                                           uuid=partial.uuid, pci_bus_id=partial.pci_bus_id,
                                           error="an NVML call on this GPU did not return in time (a fallen GPU?)"))
        return snapshot

    def _start(self, deadline: float) -> str | None:
        """Load and initialise NVML and read the system figures; a sentence saying why not, or None."""
        if self._started is None:
            self._started = threading.Thread(target=self._start_worker, name="nvml-init", daemon=True)
            self._started.start()
        self._started.join(max(0.0, deadline - time.monotonic()))
        if self._started.is_alive():
            return "NVML did not answer in time while starting (nvmlInit is blocked)"
        self._started = None
        result = self._start_result.pop() if self._start_result else "NVML did not start"
        if isinstance(result, str):
            return result
        self._nvml, self._system = result
        return None

    def _start_worker(self) -> None:
        if not library_loadable():
            self._absent = _NOT_FOUND
            self._start_result.append(self._absent)
            return
        try:
            nvml = _pynvml()
        except ImportError as error:
            self._absent = f"nvidia-ml-py is not installed ({error})"
            self._start_result.append(self._absent)
            return
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as error:
            message = _start_error(nvml, error)
            if getattr(error, "value", None) == getattr(nvml, "NVML_ERROR_LIBRARY_NOT_FOUND", 12):
                self._absent = message
            self._start_result.append(message)
            return
        except OSError as error:
            self._start_result.append(f"NVML could not be loaded: {error}")
            return
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as error:
            self._start_result.append(_start_error(nvml, error))
            try:
                nvml.nvmlShutdown()
            except nvml.NVMLError:
                pass
            return
        self._start_result.append((nvml, (_system_text(nvml, nvml.nvmlSystemGetDriverVersion),
                                          _system_text(nvml, nvml.nvmlSystemGetNVMLVersion),
                                          _cuda_version(nvml), count)))

    def close(self) -> None:
        """Shut NVML down, unless a call is still stuck in it (shutting down would block too)."""
        watcher_stuck = self._watcher is not None and not self._watcher.stop()
        self._watcher = None
        if not watcher_stuck and self._nvml is not None and not any(t.is_alive() for t in self._stuck.values()):
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError:
                pass
        self._nvml, self._system = None, None


def _start_error(nvml: Any, error: Any) -> str:
    code = getattr(error, "value", None)
    if code == getattr(nvml, "NVML_ERROR_LIBRARY_NOT_FOUND", 12):
        return _NOT_FOUND
    if code == getattr(nvml, "NVML_ERROR_DRIVER_NOT_LOADED", 9):
        return "NVML is not available: the NVIDIA driver is not loaded"
    return f"NVML failed to start: {_reason(error)}"


def _system_text(nvml: Any, call: Callable[[], Any]) -> str | None:
    try:
        return _text(call())
    except nvml.NVMLError:
        return None


def _cuda_version(nvml: Any) -> str | None:
    try:
        return decode.cuda_version(int(nvml.nvmlSystemGetCudaDriverVersion()))
    except nvml.NVMLError:
        return None


def read_snapshot(timeout_s: float = DEFAULT_TIMEOUT_S) -> NvmlSnapshot:
    """One read for a command that reads once (tpu-ls, tpu-dump)."""
    reader = NvmlReader()
    try:
        return reader.read(timeout_s)
    finally:
        reader.close()


class PendingRead:
    """A one-shot read started in the background, so that NVML's start (in C, without the GIL) overlaps the
    caller's own imports and discovery; `result()` waits at most until the read's own deadline."""

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S):
        self._deadline = time.monotonic() + max(0.0, timeout_s)
        self._timeout_s = timeout_s
        self._result: list[NvmlSnapshot] = []
        self._thread = threading.Thread(target=lambda: self._result.append(read_snapshot(timeout_s)),
                                        name="nvml-read", daemon=True)
        self._thread.start()

    def result(self) -> NvmlSnapshot:
        # read_snapshot keeps its own deadline; the margin covers the thread's bookkeeping after it.
        self._thread.join(max(0.0, self._deadline - time.monotonic()) + 1.0)
        if self._result:
            return self._result[0]
        return NvmlSnapshot(available=False, error=f"NVML did not answer within {self._timeout_s:g} s")


def nvidia_driver_present(sysroot: Path | None = None) -> bool:
    """Whether this host has the NVIDIA driver's control node (where reading NVML early is worth it)."""
    root = sysroot or Path(os.environ.get("TPU_TOOLS_SYSROOT") or "/")
    return (root / "dev/nvidiactl").exists()
