"""An in-process libtpu runtime metrics service, built from the project's own .proto, for tests.

    with FakeMetricsService(v5e_host()) as service:
        ... read service.address ("127.0.0.1:PORT") ...

It binds 127.0.0.1 on a free port with local server credentials (what libtpu's service uses) and serves
fixture data shaped like real hosts:
- v5e_host: 8 chips of 1 device, a libtpu of the HLO-metrics era: duty cycle per device, int device
  ordinals, no HBM bandwidth or idle-duration metric, runtime status with one core in error;
- v6e_host: 4 chips, a newer libtpu of a multi-slice job: HBM bandwidth utilization, TensorCore idle
  duration, device ordinals as digit strings, megascale transfer latencies by buffer size, a metric name
  this client does not know;
- v4_host: 4 chips, an older libtpu: duty cycle per chip ("chip-id"), int ordinals, no runtime status rpc;
- tpu7x_host: 4 chips of 2 devices with the duty cycle per chip, so one chip value covers two devices.
Distributions carry a count for every bucket of an exponential layout, as the runtime sends them (libtpu's
own SDK reads every fixture: tests/test_libtpu_oracle.py); odd_shapes_host keeps the shapes it cannot read
(trimmed counts, linear and explicit layouts) as a hostile case.
Fault switches: `hang()` (every call blocks until `release()` or stop), `stop()` / `start()` on the same
port (a runtime that dies and comes back), and fixture fields for empty and malformed answers.

Run it by hand for a demonstration: `python tests/libtpu_server.py v5e --port 8431`.
"""

from __future__ import annotations

import argparse
import bisect
import math
import re
import sys
import threading
import time
from collections import Counter
from concurrent import futures
from dataclasses import dataclass, field

import grpc

from tpu_tools.metrics.libtpu.proto import runtime_metric_service_pb2 as pb
from tpu_tools.metrics.libtpu.proto import runtime_metric_service_pb2_grpc as pb_grpc

GIB = 1 << 30
HBM_USAGE = "tpu.runtime.hbm.memory.usage.bytes"
HBM_TOTAL = "tpu.runtime.hbm.memory.total.bytes"
DUTY_CYCLE = "tpu.runtime.tensorcore.dutycycle.percent"
HBM_UTILIZATION = "tpu.runtime.hbm.utilization.percent"
TENSORCORE_IDLE = "tpu.runtime.tensorcore.idle_duration.seconds"
HLO_QUEUE_SIZE = "hlo.queue.size.gauge"
HLO_EXECUTION_TIMING = "hlo.execution.timing.distribution.microseconds"
DCN_LATENCY = "megascale.dcn_transfer_latencies.microsecond.cumulative.distribution"
H2D_LATENCY = "megascale.host_to_device_transfer_latencies.microsecond.cumulative.distribution"
COLLECTIVE_LATENCY = "megascale.collective_end_to_end_latencies.microsecond.cumulative.distribution"
D2H_LATENCY = "megascale.device_to_host_transfer_latencies.microsecond.cumulative.distribution"
INBOUND_LATENCY = "megascale.dcn_inbound_transfer_latencies.microsecond.cumulative.distribution"
HOST_COMPUTE_LATENCY = "megascale.mxla_compute_latencies.microsecond.cumulative.distribution"
TCP_MIN_RTT = "megascale.grpc_tcp_min_rtt.microsecond.cumulative.distribution"
TCP_DELIVERY_RATE = "megascale.grpc_tcp_delivery_rate.Mbps.cumulative.distribution"
UNKNOWN_METRIC = "tpu.runtime.sparsecore.future.metric"


# --- building data points ---------------------------------------------------------------------------

def int_attr(key: str, value: int) -> pb.Attribute:
    return pb.Attribute(key=key, value=pb.AttrValue(int_attr=value))


def string_attr(key: str, value: str) -> pb.Attribute:
    return pb.Attribute(key=key, value=pb.AttrValue(string_attr=value))


def kvlist(*attributes: pb.Attribute) -> pb.Attribute:
    return pb.Attribute(key="", value=pb.AttrValue(kvlist_attr=pb.KeyValueList(attributes=list(attributes))))


def ordinal(device: int | str) -> pb.Attribute:
    """The HLO metrics' key: device_ordinal (int in older libtpu, a digit string in newer) and core_type."""
    value = int_attr("device_ordinal", device) if isinstance(device, int) else string_attr("device_ordinal", device)
    return kvlist(value, string_attr("core_type", "tensor_core"))


def gauge(attribute: pb.Attribute, value: int | float | str) -> pb.Metric:
    if isinstance(value, bool):
        measure = pb.Gauge(as_bool=value)
    elif isinstance(value, int):
        measure = pb.Gauge(as_int=value)
    elif isinstance(value, float):
        measure = pb.Gauge(as_double=value)
    else:
        measure = pb.Gauge(as_string=value)
    return pb.Metric(attribute=attribute, gauge=measure)


def exponential_layout(num_finite: int, growth: float, scale: float) -> pb.Distribution.BucketOptions:
    return pb.Distribution.BucketOptions(exponential_buckets=pb.Distribution.BucketOptions.Exponential(
        num_finite_buckets=num_finite, growth_factor=growth, scale=scale))


def linear_layout(num_finite: int, width: float, offset: float) -> pb.Distribution.BucketOptions:
    return pb.Distribution.BucketOptions(linear_buckets=pb.Distribution.BucketOptions.Linear(
        num_finite_buckets=num_finite, width=width, offset=offset))


def explicit_layout(bounds: list[float]) -> pb.Distribution.BucketOptions:
    return pb.Distribution.BucketOptions(explicit_buckets=pb.Distribution.BucketOptions.Explicit(bounds=bounds))


def layout_bounds(layout: pb.Distribution.BucketOptions) -> list[float]:
    """Finite bucket boundaries, computed here independently of the client's code."""
    kind = layout.WhichOneof("options")
    if kind == "exponential_buckets":
        e = layout.exponential_buckets
        return [e.scale * e.growth_factor ** i for i in range(e.num_finite_buckets + 1)]
    if kind == "linear_buckets":
        lin = layout.linear_buckets
        return [lin.offset + lin.width * i for i in range(lin.num_finite_buckets + 1)]
    return list(layout.explicit_buckets.bounds)


def distribution(attribute: pb.Attribute, samples: list[float], layout: pb.Distribution.BucketOptions,
                 *, trim: bool = False) -> pb.Metric:
    """A distribution data point holding these samples: a count for every bucket of the layout, as the runtime
    sends it (libtpu's own client aborts on fewer); `trim=True` drops trailing empty buckets, a hostile shape."""
    bounds = layout_bounds(layout)
    counts = [0] * (len(bounds) + 1)
    for sample in samples:
        counts[bisect.bisect_right(bounds, sample)] += 1
    while trim and counts and counts[-1] == 0:
        counts.pop()
    mean = sum(samples) / len(samples) if samples else 0.0
    squares = sum((s - mean) ** 2 for s in samples)
    return pb.Metric(attribute=attribute, distribution=pb.Distribution(
        count=len(samples), mean=mean, min=min(samples, default=0.0), max=max(samples, default=0.0),
        sum_of_squared_deviation=squares, bucket_options=layout, bucket_counts=counts))


def spread(center: float, width: float, count: int) -> list[float]:
    """count deterministic samples around center (a smooth bump, no randomness in tests)."""
    return [center + width * math.sin(i * 2.39996) * (i % 7) / 7 for i in range(count)]


# --- fixture hosts ----------------------------------------------------------------------------------

@dataclass
class HostFixture:
    name: str
    metrics: dict[str, list[pb.Metric]] = field(default_factory=dict)
    listed: list[str] | None = None  # what ListSupportedMetrics names; None: the keys of `metrics`
    list_unimplemented: bool = False  # a runtime without ListSupportedMetrics
    status: pb.GetTpuRuntimeStatusResponse | None = None  # None: GetTpuRuntimeStatus is UNIMPLEMENTED
    devices: int = 0
    chips: int = 0

    def names(self) -> list[str]:
        return list(self.metrics) if self.listed is None else list(self.listed)


HLO_LAYOUT = exponential_layout(30, 2.0, 1.0)  # 1 us .. 1 s, doubling


def _core(global_id: int, chip: int, *, core_type: int = pb.CORE_TYPE_TENSOR_CORE, index: int = 0, program: int = 7,
          run: int = 1200, error: str | None = None, queued: int = 0, hlo: str | None = None) -> pb.CoreState:
    state = pb.CoreState(
        core_id=pb.CoreId(global_core_id=global_id, chip_id=chip,
                          core_on_chip=pb.CoreOnChip(type=core_type, index=index)),
        sequencer_info=[pb.SequencerState(sequencer_type=pb.SEQUENCER_TYPE_TENSOR_CORE, sequencer_index=0,
                                          pc=0x1A40 + global_id, tag=3, tracemark=11, program_id=program, run_id=run)],
        xdb_server_running=False, program_fingerprint=bytes.fromhex("3fa29c01"), launch_id=run,
        queued_program_info=[pb.QueuedProgram(run_id=run + 1 + i, launch_id=run + 1 + i) for i in range(queued)])
    if hlo:
        state.sequencer_info[0].hlo_location = hlo
    if error:
        state.error_message = error
    return state


def v5e_host() -> HostFixture:
    used = [int(x * GIB) for x in (11.2, 11.4, 11.1, 11.3, 11.2, 11.2, 11.0, 11.5)]
    duty = [87.5, 88.1, 86.9, 87.7, 0.0, 0.0, 0.0, 0.0]
    metrics = {
        HBM_USAGE: [gauge(int_attr("device-id", d), used[d]) for d in range(8)],
        HBM_TOTAL: [gauge(int_attr("device-id", d), 16 * GIB) for d in range(8)],
        DUTY_CYCLE: [gauge(int_attr("device-id", d), duty[d]) for d in range(8)],
        HLO_QUEUE_SIZE: [gauge(ordinal(d), 2 if d < 4 else 0) for d in range(8)],
        HLO_EXECUTION_TIMING: [distribution(ordinal(d), spread(2400 + 40 * d, 600, 200) if d < 4 else [], HLO_LAYOUT)
                               for d in range(8)],
    }
    status = pb.GetTpuRuntimeStatusResponse(host_name="t1v-n-5e8-w-0")
    for core in range(8):
        status.core_states[core].CopyFrom(_core(core, core, queued=1 if core < 4 else 0, error=(
            "program 0x3fa29c01 aborted: TensorCore halted on an HBM out-of-memory condition" if core == 5 else None)))
    return HostFixture("v5e", metrics, status=status, devices=8, chips=8)


def v6e_host() -> HostFixture:
    used = [int(x * GIB) for x in (27.5, 27.9, 28.1, 27.4)]
    metrics = {
        HBM_USAGE: [gauge(int_attr("device-id", d), used[d]) for d in range(4)],
        HBM_TOTAL: [gauge(int_attr("device-id", d), 32 * GIB) for d in range(4)],
        DUTY_CYCLE: [gauge(int_attr("device-id", d), [99.1, 98.7, 99.4, 98.9][d]) for d in range(4)],
        HBM_UTILIZATION: [gauge(int_attr("device-id", d), [61.0, 59.5, 62.3, 60.1][d]) for d in range(4)],
        TENSORCORE_IDLE: [gauge(int_attr("device-id", d), [0.004, 0.006, 0.003, 0.005][d]) for d in range(4)],
        HLO_QUEUE_SIZE: [gauge(ordinal(str(d)), 1) for d in range(4)],
        HLO_EXECUTION_TIMING: [distribution(ordinal(str(d)), spread(9800, 900, 300), HLO_LAYOUT) for d in range(4)],
        # Two slices report the same buffer sizes: the client merges them.
        DCN_LATENCY: [distribution(kvlist(string_attr("buffer-size", size)), spread(center * (1 + slice_ / 10),
                                                                                     center / 4, 120),
                                   exponential_layout(24, 1.5, 10.0))
                      for slice_ in range(2) for size, center in (("8MB", 950.0), ("1MB", 140.0), ("64MB", 7400.0))],
        H2D_LATENCY: [distribution(kvlist(string_attr("buffer-size", "16MB")), spread(410, 80, 90),
                                   exponential_layout(24, 1.5, 10.0))],
        COLLECTIVE_LATENCY: [distribution(kvlist(string_attr("buffer-size", "8MB")), spread(1900, 400, 60),
                                          exponential_layout(24, 1.5, 10.0))],
        UNKNOWN_METRIC: [gauge(int_attr("device-id", d), 1.0) for d in range(4)],
    }
    status = pb.GetTpuRuntimeStatusResponse(host_name="t1v-n-6e4-w-3")
    for core in range(4):
        status.core_states[core].CopyFrom(_core(core, core, program=19, run=88, hlo="fusion.142 (train.py:211)"))
    return HostFixture("v6e", metrics, status=status, devices=4, chips=4)


def v4_host() -> HostFixture:
    used = [int(x * GIB) for x in (20.0, 20.5, 19.8, 20.1)]
    metrics = {
        HBM_USAGE: [gauge(int_attr("device-id", d), used[d]) for d in range(4)],
        HBM_TOTAL: [gauge(int_attr("device-id", d), 32 * GIB) for d in range(4)],
        DUTY_CYCLE: [gauge(int_attr("chip-id", c), [45.0, 47.5, 44.2, 46.8][c]) for c in range(4)],
        HLO_QUEUE_SIZE: [gauge(ordinal(d), 3) for d in range(4)],
        HLO_EXECUTION_TIMING: [distribution(ordinal(d), spread(15000, 2000, 100), HLO_LAYOUT) for d in range(4)],
    }
    return HostFixture("v4", metrics, devices=4, chips=4)


def tpu7x_host() -> HostFixture:
    metrics = {
        HBM_USAGE: [gauge(int_attr("device-id", d), 80 * GIB + d * GIB) for d in range(8)],
        HBM_TOTAL: [gauge(int_attr("device-id", d), 96 * GIB) for d in range(8)],
        DUTY_CYCLE: [gauge(int_attr("device-id", c), [70.0, 71.0, 72.0, 73.0][c]) for c in range(4)],
    }
    return HostFixture("tpu7x", metrics, devices=8, chips=4)


def v5p_host() -> HostFixture:
    """4 chips of a multi-slice job on a current libtpu: every metric tpu-info reads, and hostile values
    (a NaN duty cycle on device 2, 150 % on device 3, an empty distribution, a unit nobody knows)."""
    exponential = exponential_layout(24, 1.5, 10.0)
    metrics = {
        HBM_USAGE: [gauge(int_attr("device-id", d), int((60 + d) * GIB)) for d in range(4)],
        HBM_TOTAL: [gauge(int_attr("device-id", d), 95 * GIB) for d in range(4)],
        DUTY_CYCLE: [gauge(int_attr("device-id", d), [91.0, 92.5, float("nan"), 150.0][d]) for d in range(4)],
        HBM_UTILIZATION: [gauge(int_attr("device-id", d), 40.0 + d) for d in range(4)],
        TENSORCORE_IDLE: [gauge(int_attr("device-id", d), 0.01 * (d + 1)) for d in range(4)],
        HLO_QUEUE_SIZE: [gauge(ordinal(str(d)), d) for d in range(4)],
        HLO_EXECUTION_TIMING: [distribution(ordinal(str(d)), spread(5000, 500, 50), HLO_LAYOUT) for d in range(4)],
        DCN_LATENCY: [distribution(kvlist(string_attr("buffer-size", "8MB")), spread(900, 200, 80), exponential)],
        INBOUND_LATENCY: [distribution(kvlist(string_attr("buffer-size", "8MB")), spread(1100, 200, 80),
                                       exponential)],
        H2D_LATENCY: [distribution(kvlist(string_attr("buffer-size", "16MB")), spread(410, 80, 90), exponential)],
        D2H_LATENCY: [distribution(kvlist(string_attr("buffer-size", "16MB")), [], exponential, trim=False)],
        COLLECTIVE_LATENCY: [distribution(kvlist(string_attr("buffer-size", "8MB")), spread(1900, 400, 60),
                                          exponential)],
        HOST_COMPUTE_LATENCY: [distribution(kvlist(string_attr("buffer-size", "all")), spread(300, 50, 40),
                                            exponential)],
        TCP_MIN_RTT: [distribution(kvlist(), spread(85, 20, 70), exponential)],
        TCP_DELIVERY_RATE: [distribution(kvlist(), spread(9200, 800, 70), exponential)],
        "megascale.grpc_tcp_something.furlongs.cumulative.distribution": [
            distribution(kvlist(), [1.0], exponential)],
    }
    status = pb.GetTpuRuntimeStatusResponse(host_name="t1v-n-5p8-w-1")
    for core in range(8):
        status.core_states[core].CopyFrom(_core(core, core // 2, index=core % 2, program=5, run=40))
    return HostFixture("v5p", metrics, status=status, devices=4, chips=4)


def odd_shapes_host() -> HostFixture:
    """Shapes no runtime sends and libtpu's own client cannot read (it aborts on trimmed bucket counts and
    returns nothing for linear or explicit layouts): the tpu-tools client reads what it can and says what not."""
    metrics = {
        HBM_USAGE: [gauge(int_attr("device-id", d), 10 * GIB) for d in range(2)],
        HBM_TOTAL: [gauge(int_attr("device-id", d), 16 * GIB) for d in range(2)],
        HLO_EXECUTION_TIMING: [distribution(ordinal(d), spread(2400, 600, 200), HLO_LAYOUT, trim=True)
                               for d in range(2)],
        H2D_LATENCY: [distribution(kvlist(string_attr("buffer-size", "16MB")), spread(410, 80, 90),
                                   linear_layout(40, 25.0, 0.0))],
        COLLECTIVE_LATENCY: [distribution(kvlist(string_attr("buffer-size", "8MB")), spread(1900, 400, 60),
                                          explicit_layout([250, 500, 1000, 1500, 2000, 3000, 5000, 10000]))],
        TCP_DELIVERY_RATE: [distribution(kvlist(), spread(9200, 800, 70), linear_layout(40, 500.0, 0.0))],
    }
    return HostFixture("odd-shapes", metrics, devices=2, chips=2)


# What a runtime sends (hostile values in v5p included); odd_shapes_host is kept apart: no runtime sends it.
FIXTURES = {"v5e": v5e_host, "v6e": v6e_host, "v4": v4_host, "tpu7x": tpu7x_host, "v5p": v5p_host}
HOSTILE_FIXTURES = {"odd-shapes": odd_shapes_host}


# --- the service ------------------------------------------------------------------------------------

class FakeRuntimeService(pb_grpc.RuntimeMetricServiceServicer):
    def __init__(self, fixture: HostFixture):
        self.fixture = fixture
        self.calls: Counter[str] = Counter()
        self.requests: list[tuple[str, object]] = []
        self.peers: set[str] = set()  # client sockets seen: one per channel
        self.hanging = False
        self.delay_s = 0.0  # every call answers this late: a slow runtime
        self.released = threading.Event()
        self._lock = threading.Lock()

    def _enter(self, rpc: str, request: object, context: grpc.ServicerContext) -> None:
        with self._lock:
            self.calls[rpc] += 1
            self.requests.append((rpc, request))
            self.peers.add(context.peer())
        if self.hanging:
            self.released.wait(timeout=30)
        if self.delay_s:
            time.sleep(self.delay_s)

    def ListSupportedMetrics(self, request, context):
        self._enter("ListSupportedMetrics", request, context)
        if self.fixture.list_unimplemented:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
        pattern = re.compile(request.filter) if request.filter else None
        chosen = [n for n in self.fixture.names() if pattern is None or pattern.fullmatch(n)]
        return pb.ListSupportedMetricsResponse(supported_metric=[pb.SupportedMetric(metric_name=n) for n in chosen])

    def GetRuntimeMetric(self, request, context):
        self._enter("GetRuntimeMetric", request, context)
        points = self.fixture.metrics.get(request.metric_name)
        if points is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"metric {request.metric_name} not found")
        return pb.MetricResponse(metric=pb.TPUMetric(name=request.metric_name, metrics=points))

    def GetTpuRuntimeStatus(self, request, context):
        self._enter("GetTpuRuntimeStatus", request, context)
        if self.fixture.status is None:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
        return self.fixture.status


class FakeMetricsService:
    """The fake service on 127.0.0.1; `stop()` and `start()` keep the port, as a restarted runtime would."""

    def __init__(self, fixture: HostFixture, port: int = 0):
        self.servicer = FakeRuntimeService(fixture)
        self.port = port
        self._server: grpc.Server | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> FakeMetricsService:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        pb_grpc.add_RuntimeMetricServiceServicer_to_server(self.servicer, server)
        self.port = server.add_secure_port(f"127.0.0.1:{self.port}", grpc.local_server_credentials())
        if not self.port:
            raise RuntimeError("could not bind the fake metrics service")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        self.release()
        if self._server is not None:
            self._server.stop(grace=None).wait(5)
            self._server = None

    def hang(self) -> None:
        """Every call from now on blocks (until release() or stop()): a stalled runtime."""
        self.servicer.released.clear()
        self.servicer.hanging = True

    def release(self) -> None:
        self.servicer.hanging = False
        self.servicer.released.set()

    def __enter__(self) -> FakeMetricsService:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description="Serve fixture libtpu runtime metrics on 127.0.0.1.")
    parser.add_argument("host", choices=sorted({**FIXTURES, **HOSTILE_FIXTURES}))
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=600.0, help="stop after this long")
    args = parser.parse_args()
    with FakeMetricsService({**FIXTURES, **HOSTILE_FIXTURES}[args.host](), args.port) as service:
        print(service.address, flush=True)
        try:
            time.sleep(args.seconds)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
