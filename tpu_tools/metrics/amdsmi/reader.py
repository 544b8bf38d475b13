"""Reading AMD GPUs through AMD's `amdsmi` bindings (libamd_smi.so) into the GPU records NVML fills.

The same record as NVML's (`tpu_tools.metrics.nvml.records.GpuRecord`): what amdsmi has a figure for is
filled, in SI units, and the rest stays None. As with NVML, every read runs in daemon threads (one for
the library's start, one per GPU) and the caller waits only until its deadline: a GPU whose call has not
returned is reported as not answering, with what was read before it (its bus id places it), and it is not
asked again while that call is still stuck.

Field rule: an amdsmi error on one field (NOT_SUPPORTED on this GPU or driver, NO_PERM, ...) makes the
field None and records why in `unsupported`; amdsmi's own "N/A" (a value of all ones) is None as well.
"""

from __future__ import annotations

import contextlib
import io
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from tpu_tools.metrics.nvml.procfs import identify_process
from tpu_tools.metrics.nvml.records import NvmlSnapshot
from tpu_tools.metrics.records.gpu import STATUS_NOT_ANSWERING, GpuProcess, GpuRecord

DEFAULT_TIMEOUT_S = 5.0
ENABLE_VARIABLE = "TPU_TOOLS_AMDSMI"  # "0" or "off": do not read amdsmi at all
_STATUS_DRIVER_NOT_LOADED = 34
_STATUS_NOT_INIT = 32
_MIB = 1024 * 1024  # amdsmi counts VRAM in MB of 2**20 bytes
# PCIe transfer rate per lane (MT/s, as amdsmi reports the link speed) -> the link generation
_PCIE_GENERATIONS = {2500: 1, 5000: 2, 8000: 3, 16000: 4, 32000: 5, 64000: 6, 128000: 7}

T = TypeVar("T")


def enabled() -> bool:
    return os.environ.get(ENABLE_VARIABLE, "").strip().lower() not in ("0", "off", "no", "false")


@dataclass
class AmdSmiSnapshot(NvmlSnapshot):
    """One read of amdsmi: NVML's snapshot with amdsmi's versions in place of NVML's and CUDA's."""

    bindings_version: str | None = None  # the amdsmi Python package

    def to_dict(self) -> dict[str, Any]:
        data = super().to_dict()
        del data["nvml_version"], data["cuda_driver_version"]
        return {**data, "source": "amdsmi", "bindings_version": self.bindings_version}


def pci_bus_id(bdf_id: int) -> str:
    """amdsmi's 64-bit BDF id (domain << 32 | partition << 28 | bus << 8 | device << 3 | function) in sysfs form."""
    domain, bus, device, function = bdf_id >> 32, (bdf_id >> 8) & 0xFF, (bdf_id >> 3) & 0x1F, bdf_id & 0x7
    return f"{domain:04x}:{bus:02x}:{device:02x}.{function:x}"


def pcie_generation(speed_mt_s: int | None) -> int | None:
    return None if speed_mt_s is None else _PCIE_GENERATIONS.get(int(speed_mt_s))


def _number(value: Any) -> float | None:
    """amdsmi's figure, None for its "N/A" (the bindings turn an all-ones value into that string)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, int) and value in (0xFFFF, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF):
        return None
    return float(value)


def _int(value: Any) -> int | None:
    number = _number(value)
    return None if number is None else int(number)


def _scaled(value: Any, factor: float) -> float | None:
    number = _number(value)
    return None if number is None else round(number * factor, 6)


def _reason(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return text or type(error).__name__


def _load() -> Any:
    """The bindings; they print to stdout when libamd_smi.so is missing, which must not reach a JSON document."""
    with contextlib.redirect_stdout(io.StringIO()):
        import amdsmi  # type: ignore[import-untyped,unused-ignore]
    return amdsmi


class _Gpu:
    """Reads one GPU's fields, each under the field rule."""

    def __init__(self, smi: Any, index: int, handle: Any, sysroot: Path, want_driver: bool = False):
        self.smi = smi
        self.handle = handle
        self.record = GpuRecord(index=index)
        self.sysroot = sysroot
        self.want_driver = want_driver
        self.driver_version: str | None = None  # the amdgpu driver's, the same for every GPU

    def get(self, name: str, call: Callable[[], T]) -> T | None:
        try:
            return call()
        except (self.smi.AmdSmiException, ValueError, KeyError, TypeError) as error:
            self.record.unsupported[name] = _reason(error)
            return None

    def read(self) -> GpuRecord:
        smi, h, r = self.smi, self.handle, self.record
        bdf = self.get("pci_bus_id", lambda: int(smi.amdsmi_get_gpu_bdf_id(h)))
        r.pci_bus_id = pci_bus_id(bdf) if bdf is not None else None
        asic = self.get("asic_info", lambda: smi.amdsmi_get_gpu_asic_info(h))
        if asic is not None:
            r.name = str(asic.get("market_name") or "").strip() or None
            r.serial = str(asic.get("asic_serial") or "").strip() or None
        r.uuid = self.get("uuid", lambda: str(smi.amdsmi_get_gpu_device_uuid(h))) or None
        vram = self.get("vram_usage", lambda: smi.amdsmi_get_gpu_vram_usage(h))
        if vram is not None:
            total, used = _int(vram.get("vram_total")), _int(vram.get("vram_used"))
            r.memory_total_bytes = None if total is None else total * _MIB
            r.memory_used_bytes = None if used is None else used * _MIB
            if total is not None and used is not None:
                r.memory_free_bytes = (total - used) * _MIB
        activity = self.get("activity", lambda: smi.amdsmi_get_gpu_activity(h))
        if activity is not None:
            r.utilization_gpu_percent = _number(activity.get("gfx_activity"))
            r.utilization_memory_percent = _number(activity.get("umc_activity"))
        self._temperatures()
        self._power()
        self._clocks()
        counts = self.get("ecc", lambda: smi.amdsmi_get_gpu_total_ecc_count(h))
        if counts is not None:
            r.ecc_volatile_uncorrected_errors = _int(counts.get("uncorrectable_count"))
        self._pcie()
        self._processes()
        if self.want_driver:
            info = self.get("driver", lambda: smi.amdsmi_get_gpu_driver_info(h))
            version = str((info or {}).get("driver_version") or "N/A")
            self.driver_version = None if version == "N/A" else version
        return r

    def _temperatures(self) -> None:
        smi, h, r = self.smi, self.handle, self.record
        kind, current = smi.AmdSmiTemperatureType, smi.AmdSmiTemperatureMetric.CURRENT
        edge = self.get("temperature_edge", lambda: _number(smi.amdsmi_get_temp_metric(h, kind.EDGE, current)))
        r.temperature_hotspot_celsius = self.get(
            "temperature_hotspot", lambda: _number(smi.amdsmi_get_temp_metric(h, kind.HOTSPOT, current)))
        r.temperature_memory_celsius = self.get(
            "temperature_vram", lambda: _number(smi.amdsmi_get_temp_metric(h, kind.VRAM, current)))
        # MI300-class boards have no edge sensor: the hotspot is their temperature.
        r.temperature_celsius = edge if edge is not None else r.temperature_hotspot_celsius

    def _power(self) -> None:
        smi, h, r = self.smi, self.handle, self.record
        power = self.get("power", lambda: smi.amdsmi_get_power_info(h))
        if power is not None:
            current = _number(power.get("current_socket_power"))
            r.power_draw_watts = current if current is not None else _number(power.get("average_socket_power"))
        cap = self.get("power_cap", lambda: smi.amdsmi_get_power_cap_info(h))
        if cap is not None:
            r.power_limit_watts = _scaled(cap.get("power_cap"), 1e-6)  # microwatts
        energy = self.get("energy", lambda: smi.amdsmi_get_energy_count(h))
        if energy is not None:
            ticks, resolution = _number(energy.get("energy_accumulator")), _number(energy.get("counter_resolution"))
            if ticks is not None and resolution is not None:  # ticks of `resolution` microjoules
                r.energy_joules = round(ticks * resolution * 1e-6, 3)

    def _clocks(self) -> None:
        smi, h, r = self.smi, self.handle, self.record
        gfx = self.get("clock_gfx", lambda: smi.amdsmi_get_clock_info(h, smi.AmdSmiClkType.GFX))
        if gfx is not None:
            r.clock_sm_hz, r.clock_sm_max_hz = _scaled(gfx.get("clk"), 1e6), _scaled(gfx.get("max_clk"), 1e6)
        mem = self.get("clock_memory", lambda: smi.amdsmi_get_clock_info(h, smi.AmdSmiClkType.MEM))
        if mem is not None:
            r.clock_memory_hz, r.clock_memory_max_hz = _scaled(mem.get("clk"), 1e6), _scaled(mem.get("max_clk"), 1e6)

    def _pcie(self) -> None:
        smi, h, r = self.smi, self.handle, self.record
        pcie = self.get("pcie", lambda: smi.amdsmi_get_pcie_info(h))
        if pcie is None:
            return
        static, metric = pcie.get("pcie_static") or {}, pcie.get("pcie_metric") or {}
        r.pcie_link_width, r.pcie_link_width_max = _int(metric.get("pcie_width")), _int(static.get("max_pcie_width"))
        r.pcie_link_generation = pcie_generation(_int(metric.get("pcie_speed")))
        r.pcie_link_generation_max = (_int(static.get("pcie_interface_version"))
                                      or pcie_generation(_int(static.get("max_pcie_speed"))))

    def _processes(self) -> None:
        smi, h, r = self.smi, self.handle, self.record
        found: dict[int, GpuProcess] = {}
        for info in self.get("processes", lambda: smi.amdsmi_get_gpu_process_list(h)) or []:
            pid = _int(info.get("pid"))
            if pid is None:
                continue
            vram = _int((info.get("memory_usage") or {}).get("vram_mem"))
            found.setdefault(pid, GpuProcess(pid=pid, kind="compute", gpu_memory_bytes=vram))
        for process in found.values():
            identify_process(process, self.sysroot)
        r.processes = sorted(found.values(), key=lambda p: p.pid)


class AmdSmiReader:
    """Reads amdsmi snapshots; keeps the library open between reads (a monitor reads every period)."""

    def __init__(self) -> None:
        self._smi: Any = None
        self._started: threading.Thread | None = None
        self._start_result: list[Any] = []
        self._stuck: dict[int, threading.Thread] = {}  # GPU index -> the thread still in an amdsmi call
        self._handles: list[Any] | None = None
        self._bindings: str | None = None
        self._driver: str | None = None  # asked of each GPU's own thread until one answers (a GPU may hang)
        self._absent: str | None = None  # no bindings or no library: not worth asking again every round

    def read(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> AmdSmiSnapshot:
        began = time.monotonic()
        snapshot = self._read(began + max(0.0, timeout_s))
        snapshot.elapsed_ms = round((time.monotonic() - began) * 1e3, 3)
        return snapshot

    def _read(self, deadline: float) -> AmdSmiSnapshot:
        if not enabled():
            return AmdSmiSnapshot(available=False, error=f"amdsmi reading is off ({ENABLE_VARIABLE}="
                                                         f"{os.environ.get(ENABLE_VARIABLE)})")
        if self._absent is not None:
            return AmdSmiSnapshot(available=False, error=self._absent)
        if self._handles is None:
            failure = self._start(deadline)
            if failure is not None:
                return AmdSmiSnapshot(available=False, error=failure)
        assert self._handles is not None
        snapshot = AmdSmiSnapshot(available=True, bindings_version=self._bindings)
        sysroot = Path(os.environ.get("TPU_TOOLS_SYSROOT") or "/")
        readers: dict[int, _Gpu] = {}
        threads: dict[int, threading.Thread] = {}
        for index, handle in enumerate(self._handles):
            stuck = self._stuck.get(index)
            if stuck is not None and stuck.is_alive():
                continue
            self._stuck.pop(index, None)
            readers[index] = gpu = _Gpu(self._smi, index, handle, sysroot, want_driver=self._driver is None)
            threads[index] = thread = threading.Thread(target=gpu.read, name=f"amdsmi-gpu{index}", daemon=True)
            thread.start()
        for index, thread in threads.items():
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                self._stuck[index] = thread
        for index in range(len(self._handles)):
            if index in threads and not threads[index].is_alive():
                snapshot.gpus.append(readers[index].record)
                self._driver = self._driver or readers[index].driver_version
                continue
            partial = readers[index].record if index in readers else GpuRecord(index=index)
            snapshot.gpus.append(GpuRecord(index=index, status=STATUS_NOT_ANSWERING, name=partial.name,
                                           serial=partial.serial, pci_bus_id=partial.pci_bus_id,
                                           error="an amdsmi call on this GPU did not return in time (a hung GPU?)"))
        snapshot.driver_version = self._driver
        return snapshot

    def _start(self, deadline: float) -> str | None:
        """Load and initialise amdsmi and list the GPUs; a sentence saying why not, or None."""
        if self._started is None:
            self._started = threading.Thread(target=self._start_worker, name="amdsmi-init", daemon=True)
            self._started.start()
        self._started.join(max(0.0, deadline - time.monotonic()))
        if self._started.is_alive():
            return "amdsmi did not answer in time while starting (amdsmi_init is blocked)"
        self._started = None
        result = self._start_result.pop() if self._start_result else "amdsmi did not start"
        if isinstance(result, str):
            return result
        self._smi, self._handles, self._bindings = result
        return None

    def _start_worker(self) -> None:
        try:
            smi = _load()
        except ImportError as error:
            self._absent = f"the amdsmi Python package is not installed ({error}; pip install 'tpu-tools[amd]')"
            self._start_result.append(self._absent)
            return
        except KeyError:  # the bindings' way of saying that no libamd_smi.so was found
            self._absent = "amdsmi is not available: libamd_smi.so not found (no ROCm amd-smi-lib on this host)"
            self._start_result.append(self._absent)
            return
        except (OSError, AttributeError) as error:  # a library that does not load, or lacks a function
            self._absent = f"amdsmi is not available: libamd_smi.so could not be loaded ({_reason(error)})"
            self._start_result.append(self._absent)
            return
        try:
            smi.amdsmi_init(smi.AmdSmiInitFlags.INIT_AMD_GPUS)
        except smi.AmdSmiException as error:
            self._start_result.append(_start_error(error))
            return
        try:
            handles = list(smi.amdsmi_get_processor_handles())
        except smi.AmdSmiException as error:
            self._start_result.append(f"amdsmi could not list the GPUs: {_reason(error)}")
            with contextlib.suppress(smi.AmdSmiException):
                smi.amdsmi_shut_down()
            return
        self._start_result.append((smi, handles, _bindings_version()))

    def close(self) -> None:
        """Shut amdsmi down, unless a call is still stuck in it."""
        if self._smi is not None and not any(t.is_alive() for t in self._stuck.values()):
            with contextlib.suppress(self._smi.AmdSmiException):
                self._smi.amdsmi_shut_down()
        self._smi, self._handles = None, None


def _start_error(error: Any) -> str:
    code = getattr(error, "err_code", None)
    if code == _STATUS_DRIVER_NOT_LOADED:
        return "amdsmi is not available: the amdgpu driver is not loaded"
    return f"amdsmi failed to start: {_reason(error)}"


def _bindings_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("amdsmi")
    except PackageNotFoundError:
        return None


def read_snapshot(timeout_s: float = DEFAULT_TIMEOUT_S) -> AmdSmiSnapshot:
    """One read for a command that reads once (tpu-ls, tpu-dump)."""
    reader = AmdSmiReader()
    try:
        return reader.read(timeout_s)
    finally:
        reader.close()

