"""`transfer`: host-to-device and device-to-host bandwidth over sizes, in GB/s.

Every sample moves a buffer the other side does not have yet. Each
device-to-host sample reads a freshly computed array (jax caches the host copy
of an array it has already fetched). On the CPU platform device memory is host
memory and the runtime aliases suitably aligned host buffers instead of copying
them (whatever `may_alias` says): where that happens, host-to-device is measured
from a buffer offset by one element, which the runtime must copy, and
device-to-host as a copy into a new host buffer. `host_memory_aliased` in the
result says so.

`path` names what was measured. `h2d` and `d2h` use ordinary (pageable) numpy
memory, as most programs do; device-to-host lands in a host buffer jax
allocates for each fetch. A fresh allocation above glibc's mmap threshold (32
MiB at most) is new pages every time, and the first touch of each page costs a
fault, and the runtime stages the copy through its own pinned buffer: large
pageable fetches run far below the link (1.5-1.9 GB/s for 256 MiB on an H100
whose PCIe 5 link moves 50 GB/s). `h2d-pinned` and `d2h-pinned` move the same
bytes between device memory and the device's `pinned_host` memory space
(page-locked host memory the DMA engine reads and writes directly,
`jax.device_put` with a `memory_kind="pinned_host"` sharding): the link's own
bandwidth, what a program gets when it keeps host copies there. Transfers are
timed one at a time (a transfer is host work as much as device work), with at
least `MIN_SAMPLES` samples so that every size has a spread.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from tpu_tools.bench.context import BenchContext
from tpu_tools.bench.failures import CaseSkipped
from tpu_tools.bench.records import Case, CaseResult
from tpu_tools.bench.stats import rates, summarize
from tpu_tools.bench.timing import TimingSettings, time_calls
from tpu_tools.units import format_bytes

DIRECTIONS = ("h2d", "d2h", "h2d-pinned", "d2h-pinned")
MIN_SAMPLES = 10
PINNED_HOST = "pinned_host"
PATHS = {"h2d": "jax.device_put from a pageable numpy array",
         "d2h": "numpy.asarray of a jax Array: a copy into a host buffer jax allocates (pageable)",
         "h2d-pinned": "jax.device_put from the device's pinned_host memory space to device memory",
         "d2h-pinned": "jax.device_put from device memory to the device's pinned_host memory space"}
DEFAULT_SIZES = (64 << 10, 1 << 20, 16 << 20)


@dataclass(frozen=True)
class TransferOptions:
    sizes: tuple[int, ...] = DEFAULT_SIZES
    directions: tuple[str, ...] = DIRECTIONS


def plan(options: TransferOptions) -> list[Case]:
    return [Case("transfer", f"{direction} {format_bytes(size).replace(' ', '')}",
                 {"direction": direction, "size_bytes": size})
            for direction in options.directions for size in options.sizes]


def run(ctx: BenchContext, case: Case) -> CaseResult:
    import numpy as np

    jax = ctx.jax
    timing = replace(ctx.timing, min_samples=max(MIN_SAMPLES, ctx.timing.min_samples))
    direction, size = case.params["direction"], case.params["size_bytes"]
    elements = max(1, size // 4)
    ctx.require_memory(3 * elements * 4, f"a {format_bytes(size)} transfer")
    device = ctx.devices[0]
    host = np.random.default_rng(ctx.seed).standard_normal(elements, dtype=np.float32)
    if direction.endswith("-pinned"):
        seconds, aliased = _pinned(ctx, direction, host, timing), False
    elif direction == "h2d":
        aliased = _aliases(jax.device_put(host, device, may_alias=False).block_until_ready(), host)
        if aliased:
            host = _unaligned_copy(host, np)
            if _aliases(jax.device_put(host, device, may_alias=False).block_until_ready(), host):
                raise CaseSkipped(f"the {ctx.platform} runtime aliases host memory instead of copying it: "
                                  "there is no host-to-device transfer to measure")
        seconds = time_calls(lambda _: jax.device_put(host, device, may_alias=False).block_until_ready(),
                             timing)
    else:
        bump = jax.jit(lambda x: x + 1.0)
        current = [jax.device_put(host, device)]

        def fresh() -> Any:
            current[0] = bump(current[0]).block_until_ready()
            return current[0]

        sample = fresh()
        aliased = _aliases(sample, np.asarray(sample))
        fetch = (lambda array: np.array(array, copy=True)) if aliased else (lambda array: np.asarray(array))
        seconds = time_calls(fetch, timing, prepare=fresh)
    moved = elements * 4
    result = CaseResult(case, primary="bandwidth_gbps")
    result.values["host_memory_aliased"] = aliased
    result.values["path"] = PATHS[direction] + (" (the runtime aliases aligned host memory: measured as a copy)"
                                                if aliased else "")
    result.values["timing"] = "per_call"
    result.stats["time_us"] = summarize([s * 1e6 for s in seconds])
    result.stats["bandwidth_gbps"] = summarize([r / 1e9 for r in rates(moved, seconds)], higher_is_better=True)
    result.values["bytes_per_call"] = moved
    return result


def _pinned(ctx: BenchContext, direction: str, host: Any, timing: TimingSettings) -> list[float]:
    """Seconds per transfer between device memory and the device's pinned_host memory space."""
    jax = ctx.jax
    device = ctx.devices[0]
    if PINNED_HOST not in {memory.kind for memory in device.addressable_memories()}:
        raise CaseSkipped(f"the {ctx.platform} runtime has no pinned_host memory space on {device}")
    from jax.sharding import SingleDeviceSharding

    pinned, on_device = SingleDeviceSharding(device, memory_kind=PINNED_HOST), SingleDeviceSharding(device)
    if direction == "h2d-pinned":
        source = jax.device_put(host, pinned).block_until_ready()
        return time_calls(lambda _: jax.device_put(source, on_device).block_until_ready(), timing)
    bump = jax.jit(lambda x: x + 1.0)
    current = [jax.device_put(host, on_device)]

    def fresh() -> Any:  # a new device array each sample: nothing of it is on the host yet
        current[0] = bump(current[0]).block_until_ready()
        return current[0]

    return time_calls(lambda array: jax.device_put(array, pinned).block_until_ready(), timing,
                      prepare=fresh)


def _aliases(device_array: Any, host_array: Any) -> bool:
    """Whether a device array and a host array share memory (the runtime did not copy)."""
    try:
        return device_array.unsafe_buffer_pointer() == host_array.ctypes.data
    except Exception:  # noqa: BLE001 arrays without a single buffer pointer are not aliased
        return False


def _unaligned_copy(host: Any, np: Any) -> Any:
    """The same values in a buffer offset by one element: no runtime can alias it as device memory."""
    backing = np.empty(host.size + 1, dtype=host.dtype)
    view = backing[1:]
    view[:] = host
    return view
