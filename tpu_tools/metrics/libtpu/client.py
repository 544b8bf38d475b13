"""A long-lived client of libtpu's runtime metrics services: one gRPC channel per address.

Every refresh asks each address which metrics it serves (ListSupportedMetrics), then reads those that
tpu-tools understands, all calls of all addresses in flight at once, under one deadline for the whole
refresh: every call gets the time left of it. So a refresh costs at most the deadline however many
addresses hang or how slowly they answer, and one address that hangs or dies costs only its own snapshot
an `error`. A runtime that restarts is found again on the same channel.
"""

from __future__ import annotations

import os
import queue
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

# gRPC's core logs events such as a runtime's GOAWAY at info level on stderr, where they would land in
# tpu-top's screen or tpu-monitor's stderr; every failure already comes back as an error sentence. Read
# when gRPC starts, so it is set before the import; a user's own setting wins.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import grpc  # noqa: E402

from tpu_tools.metrics.libtpu import decode, names
from tpu_tools.metrics.libtpu.addresses import DEFAULT_TIMEOUT_S, probe_connection, refused_sentence
from tpu_tools.metrics.libtpu.proto import runtime_metric_service_pb2 as pb
from tpu_tools.metrics.libtpu.proto import runtime_metric_service_pb2_grpc as pb_grpc
from tpu_tools.metrics.libtpu.records import LibtpuSnapshot, RuntimeStatus

_CHANNEL_OPTIONS = (
    ("grpc.enable_http_proxy", 0),  # the service is on this host: never through a proxy
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 1000),  # a runtime that comes back is found within a second
)
_PROBE_S = 0.5  # the longest a connection test before a read may take (a refusal is immediate)
# Answers that mean "this runtime has no such metric or rpc", as opposed to a failure.
_NOT_SERVED = {grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.INVALID_ARGUMENT,
               grpc.StatusCode.FAILED_PRECONDITION}


def _code_and_details(error: grpc.RpcError) -> tuple[grpc.StatusCode, str]:
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = (error.details() if hasattr(error, "details") else "") or ""
    return code, details


def is_refusal(error: grpc.RpcError) -> bool:
    """Whether a call failed because nothing listens at its address."""
    code, details = _code_and_details(error)
    return bool(code == grpc.StatusCode.UNAVAILABLE and "refused" in details.lower())


def describe_rpc_error(address: str, error: grpc.RpcError, timeout_s: float) -> str:
    """One sentence for a failed call."""
    code, details = _code_and_details(error)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"the metrics service at {address} did not answer within {timeout_s:g} s"
    if code == grpc.StatusCode.UNAVAILABLE:
        if is_refusal(error):
            return refused_sentence(address)
        return f"the metrics service at {address} is unavailable: {details or 'no reason given'}"
    return f"the metrics service at {address} failed: {code.name}: {details or 'no details'}"


@dataclass
class _Refresh:
    """One address's part of a refresh."""

    snapshot: LibtpuSnapshot
    listed: bool = True  # False: the runtime cannot list its metrics, so every known one is asked for
    refused: bool = False  # nothing listens at the address
    served: list[str] = field(default_factory=list)
    reads: dict[str, grpc.Future] = field(default_factory=dict)


class LibtpuClient:
    """Reads every address on each `snapshot()`; `close()` (or `with`) releases the channels."""

    def __init__(self, addresses: Iterable[str], timeout_s: float = DEFAULT_TIMEOUT_S):
        if not timeout_s > 0:
            raise ValueError(f"timeout must be greater than 0, got {timeout_s}")
        self.addresses = list(dict.fromkeys(addresses))
        self.timeout_s = timeout_s
        self._channels: dict[str, grpc.Channel] = {}
        self._stubs: dict[str, pb_grpc.RuntimeMetricServiceStub] = {}

    def __enter__(self) -> LibtpuClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()
        self._stubs.clear()

    def _stub(self, address: str) -> pb_grpc.RuntimeMetricServiceStub:
        stub = self._stubs.get(address)
        if stub is None:
            channel = grpc.secure_channel(address, grpc.local_channel_credentials(), options=_CHANNEL_OPTIONS)
            self._channels[address] = channel
            stub = self._stubs[address] = pb_grpc.RuntimeMetricServiceStub(channel)
        return stub

    def _describe(self, address: str, error: grpc.RpcError) -> str:
        return describe_rpc_error(address, error, self.timeout_s)

    # --- metrics ------------------------------------------------------------------------------------

    def deadline(self) -> float:
        """The end (time.monotonic) of a refresh starting now."""
        return time.monotonic() + self.timeout_s

    @staticmethod
    def _left(deadline: float) -> float:
        """The gRPC timeout of a call made now: what is left of the refresh's deadline (a call made after it
        fails at once with DEADLINE_EXCEEDED)."""
        return max(deadline - time.monotonic(), 1e-3)

    def snapshot(self, deadline: float | None = None) -> list[LibtpuSnapshot]:
        """One snapshot per address, in address order, all within `deadline` (default: timeout_s from now)."""
        started = time.monotonic()
        end = self.deadline() if deadline is None else deadline
        refusing = self._refusing(end)
        listings = {address: self._stub(address).ListSupportedMetrics.future(
            pb.ListSupportedMetricsRequest(), timeout=self._left(end)) for address in self.addresses
            if address not in refusing}
        # Each address's reads start as soon as its listing is in, so one that hangs until the deadline does not
        # leave the others no time (every listing ends by the deadline: gRPC cancels it then).
        answered: queue.Queue[str] = queue.Queue()
        for address, listing in listings.items():
            listing.add_done_callback(lambda _done, address=address: answered.put(address))
        started_reads: dict[str, _Refresh] = {}
        for _ in listings:
            address = answered.get()
            started_reads[address] = self._start_reads(address, listings[address], end)
        for refresh in started_reads.values():
            self._finish_reads(refresh)
            if refresh.refused:
                self._forget(refresh.snapshot.address)
        snapshots = [started_reads[address].snapshot if address in started_reads
                     else LibtpuSnapshot(address, error=refused_sentence(address)) for address in self.addresses]
        elapsed_ms = (time.monotonic() - started) * 1e3
        for snapshot in snapshots:
            snapshot.elapsed_ms = elapsed_ms
        return snapshots

    def _refusing(self, deadline: float) -> set[str]:
        """The addresses without a channel where nothing listens now. A host without a TPU runtime has nothing
        at the default address: a TCP connection refused costs far less than a gRPC call failing, every round
        (a channel gRPC keeps trying to connect in the background costs too, so a refused one is closed)."""
        return {address for address in self.addresses if address not in self._channels
                and probe_connection(address, min(self._left(deadline), _PROBE_S)) is False}

    def _forget(self, address: str) -> None:
        channel = self._channels.pop(address, None)
        self._stubs.pop(address, None)
        if channel is not None:
            channel.close()

    def _start_reads(self, address: str, listing: grpc.Future, deadline: float) -> _Refresh:
        refresh = _Refresh(LibtpuSnapshot(address))
        try:
            listed = listing.result()
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.UNIMPLEMENTED:
                refresh.snapshot.error = self._describe(address, error)
                refresh.refused = is_refusal(error)
                return refresh
            refresh.listed = False
            refresh.snapshot.notes.append("the service does not list its metrics; each known metric was asked for")
            wanted = list(names.KNOWN)
        else:
            refresh.served = sorted({m.metric_name for m in listed.supported_metric if m.metric_name})
            wanted = [n for n in refresh.served if names.is_read(n)]
        stub = self._stub(address)
        refresh.reads = {name: stub.GetRuntimeMetric.future(pb.MetricRequest(metric_name=name),
                                                            timeout=self._left(deadline)) for name in wanted}
        return refresh

    def _finish_reads(self, refresh: _Refresh) -> None:
        snapshot = refresh.snapshot
        if snapshot.error is not None:
            return
        metrics: dict[str, pb.TPUMetric] = {}
        refused: list[str] = []
        failures: list[grpc.RpcError] = []
        for name, future in refresh.reads.items():
            try:
                metrics[name] = future.result().metric
            except grpc.RpcError as error:
                if error.code() in _NOT_SERVED:
                    refused.append(name)
                    if refresh.listed:
                        snapshot.notes.append(f"{name} is listed but the service answered {error.code().name}")
                else:
                    failures.append(error)
        if failures and not metrics:
            snapshot.error = self._describe(snapshot.address, failures[0])
            return
        if failures:
            snapshot.notes.append(f"{len(failures)} metric{'s' if len(failures) > 1 else ''} could not be read: "
                                  + self._describe(snapshot.address, failures[0]))
        served = [n for n in refresh.served if n not in refused] if refresh.listed else sorted(metrics)
        snapshot.served_metrics = served
        snapshot.not_served_metrics = [n for n in names.KNOWN if n not in served]
        snapshot.unread_metrics = [n for n in served if n not in refresh.reads]
        decode.fill_snapshot(snapshot, metrics)

    # --- runtime status -----------------------------------------------------------------------------

    def runtime_status(self, include_hlo_info: bool = False, deadline: float | None = None) -> list[RuntimeStatus]:
        """GetTpuRuntimeStatus of every address, in address order, within `deadline` (default: timeout_s from
        now; pass a snapshot's deadline to bound both together)."""
        request = pb.GetTpuRuntimeStatusRequest(include_hlo_info=include_hlo_info)
        end = self.deadline() if deadline is None else deadline
        calls = {address: self._stub(address).GetTpuRuntimeStatus.future(request, timeout=self._left(end))
                 for address in self.addresses}
        result = []
        for address, call in calls.items():
            try:
                result.append(decode.runtime_status(address, call.result()))
            except grpc.RpcError as error:
                if error.code() in _NOT_SERVED:
                    result.append(RuntimeStatus(address, served=False))
                else:
                    result.append(RuntimeStatus(address, error=self._describe(address, error)))
        return result
