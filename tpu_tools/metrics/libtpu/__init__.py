"""libtpu's runtime metrics service: a gRPC client and the records it returns.

Long-lived consumers (tpu-monitor, tpu-top) keep one `LibtpuClient` and call `snapshot()` on every
refresh; one-shot consumers (tpu-ls, tpu-dump) call `read_once()`, which does not even import gRPC when
nothing listens at any address. Nothing here prints; errors are fields of the records.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from tpu_tools.metrics.libtpu.addresses import (
    DEFAULT_ADDRESS,
    DEFAULT_TIMEOUT_S,
    PORTS_VARIABLE,
    accepts_connections,
    metrics_addresses,
    normalize_address,
    refused_sentence,
)
from tpu_tools.metrics.libtpu.distribution import DistributionSummary
from tpu_tools.metrics.libtpu.records import (
    NO_SAMPLES,
    NOT_SERVED,
    CoreStatus,
    DeliveryRate,
    DeviceFigures,
    LibtpuSnapshot,
    RuntimeStatus,
    TransferLatency,
    UsageFigures,
)

__all__ = [
    "DEFAULT_ADDRESS", "DEFAULT_TIMEOUT_S", "NOT_SERVED", "NO_SAMPLES", "PORTS_VARIABLE", "CoreStatus",
    "DeliveryRate", "DeviceFigures", "DistributionSummary", "LibtpuSnapshot", "RuntimeStatus", "TransferLatency",
    "UsageFigures",
    "accepts_connections", "metrics_addresses", "normalize_address", "read_once", "LibtpuClient",
]


def _refused(address: str) -> LibtpuSnapshot:
    return LibtpuSnapshot(address, error=refused_sentence(address))


def read_once(addresses: Sequence[str], timeout_s: float = DEFAULT_TIMEOUT_S, *, runtime_status: bool = False,
              include_hlo_info: bool = False) -> tuple[list[LibtpuSnapshot], list[RuntimeStatus] | None]:
    """One snapshot per address (and their runtime status if asked), in address order."""
    started = time.monotonic()
    listening = [a for a in addresses if accepts_connections(a, min(timeout_s, 0.5))]
    snapshots = {a: _refused(a) for a in addresses if a not in listening}
    statuses: dict[str, RuntimeStatus] = {a: RuntimeStatus(a, error=snapshots[a].error) for a in snapshots}
    if listening:
        from tpu_tools.metrics.libtpu.client import LibtpuClient

        with LibtpuClient(listening, timeout_s) as client:
            deadline = client.deadline()  # one deadline for the metrics and the status: the read costs at most it
            snapshots.update((s.address, s) for s in client.snapshot(deadline))
            if runtime_status:
                statuses.update((s.address, s) for s in client.runtime_status(include_hlo_info, deadline))
    for address in addresses:
        if address not in listening:
            snapshots[address].elapsed_ms = (time.monotonic() - started) * 1e3
    return [snapshots[a] for a in addresses], ([statuses[a] for a in addresses] if runtime_status else None)


def __getattr__(name: str) -> Any:  # LibtpuClient imports gRPC: only when it is used
    if name == "LibtpuClient":
        from tpu_tools.metrics.libtpu.client import LibtpuClient

        return LibtpuClient
    raise AttributeError(name)
