"""libtpu's own SDK (`libtpu.sdk`) as a second client of the fixture metrics services.

The SDK reads the runtime metrics service only at 127.0.0.1:8431 and can abort its process (SIGABRT) on
an answer it cannot decode. So every read runs in a child, in a network namespace of its own
(`unshare -rn`): there the fixture service binds 127.0.0.1:8431 without touching the host's port 8431 (a
TPU VM's running job serves there), and tests can run in parallel. One child serves a fixture and makes
many reads, printing each result before the next; when a read aborts the child, the parent records that
metric as aborted and starts a new child for the rest.

    reading = read_fixture(v5e_host(), ["duty_cycle_pct", "hlo_execution_timing"], runtime_status=True)
    reading.metrics["duty_cycle_pct"]  -> ["87.50", ...];  reading.aborted -> {name: why}

libtpu is installed by tools/test.sh into `.libtpu/` (`uv pip install --target`), outside the test virtualenv, so that
JAX in the tests does not see a TPU plugin; the children put it on their path.
"""

from __future__ import annotations

import functools
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from libtpu_server import (
    COLLECTIVE_LATENCY,
    D2H_LATENCY,
    DCN_LATENCY,
    H2D_LATENCY,
    HLO_EXECUTION_TIMING,
    HOST_COMPUTE_LATENCY,
    INBOUND_LATENCY,
    TCP_DELIVERY_RATE,
    TCP_MIN_RTT,
)

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
LIBTPU_DIR = Path(os.environ.get("TPU_TOOLS_TEST_LIBTPU", REPO / ".libtpu"))
LIBTPU_VERSION = "0.0.51"
SDK_PORT = 8431  # the SDK's fixed address, private to each child's network namespace

GAUGES = ["duty_cycle_pct", "hbm_capacity_total", "hbm_capacity_usage", "hlo_queue_size", "runtime_hbm_utilization",
          "idle_duration"]
# The SDK's name of each distribution it reads from the service, and the served metric behind it.
DISTRIBUTIONS = {"hlo_execution_timing": HLO_EXECUTION_TIMING, "buffer_transfer_latency": DCN_LATENCY,
                 "inbound_buffer_transfer_latency": INBOUND_LATENCY, "collective_e2e_latency": COLLECTIVE_LATENCY,
                 "tcp_min_rtt": TCP_MIN_RTT, "tcp_delivery_rate": TCP_DELIVERY_RATE,
                 "host_to_device_transfer_latency": H2D_LATENCY, "device_to_host_transfer_latency": D2H_LATENCY,
                 "host_compute_latency": HOST_COMPUTE_LATENCY}
FIGURES = ("mean", "p50", "p90", "p95", "p999")  # the order of the SDK's numbers in a distribution row


def row(text: str) -> tuple[str | None, list[float]]:
    """'8MB, 1.00, 2.00, ...' -> ('8MB', [1.0, 2.0, ...]); an unlabelled row has label None."""
    parts = [p.strip() for p in text.split(",")]
    label = None if len(parts) == len(FIGURES) else parts.pop(0)
    return label, [float(p) for p in parts]


@functools.cache
def unavailable() -> str | None:
    """Why the SDK cannot be run here, or None."""
    if not (LIBTPU_DIR / "libtpu" / "sdk.so").exists():
        return f"libtpu {LIBTPU_VERSION} is not installed in {LIBTPU_DIR} (tools/test.sh installs it)"
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is missing"
    probe = subprocess.run(["unshare", "-rn", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"no network namespace for the SDK's children: {probe.stderr.strip()[:200]}"
    return None


def require() -> None:
    """Skip the calling test where the SDK cannot run; fail it instead where the suite must run it (CI)."""
    import pytest

    why = unavailable()
    if why is not None:
        if os.environ.get("TPU_TOOLS_TEST_REQUIRE_LIBTPU") == "1":
            pytest.fail(f"libtpu's SDK is required here: {why}")
        pytest.skip(why)


def sdk_env(**extra: str) -> dict[str, str]:
    """The environment of a child that loads libtpu: no metadata server, no accelerator guess; give it a
    TPU_LOG_DIR, or libtpu writes its logs to /tmp/tpu_logs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TPU_", "MEGASCALE_", "LIBTPU_"))}
    env.update({"TPU_SKIP_MDS_QUERY": "1", "TPU_ACCELERATOR_TYPE": "v5litepod-8", "PYTHONUNBUFFERED": "1",
                "PYTHONPATH": os.pathsep.join([str(LIBTPU_DIR), str(TESTS), str(REPO)]),
                "JAX_PLATFORMS": "cpu"})
    env.update(extra)
    return env


def in_namespace(command: list[str]) -> list[str]:
    """command run in a fresh user and network namespace, its loopback up."""
    return ["unshare", "-rn", sys.executable, str(Path(__file__)), "loopback-exec", *command]


@dataclass
class SdkReading:
    metrics: dict[str, list[str]] = field(default_factory=dict)
    aborted: dict[str, str] = field(default_factory=dict)  # metric -> how its child ended
    runtime_status: dict[str, Any] | None = None
    runtime_status_error: str | None = None
    log: str = ""


def read_fixture(fixture: Any, metrics: list[str], *, runtime_status: bool = False,
                 timeout: float = 90.0) -> SdkReading:
    """What libtpu's SDK reads of these metrics (and GetTpuRuntimeStatus) from the fixture service."""
    reading = SdkReading()
    with tempfile.TemporaryDirectory(prefix="libtpu-sdk-") as scratch:
        served = Path(scratch) / "fixture.pickle"
        served.write_bytes(pickle.dumps(fixture))
        pending = list(metrics)
        status_pending = runtime_status
        # Not measured by coverage: these children run libtpu's code and the test's fixture service, none of
        # tpu-tools' (each of the three processes of a read would pay 0.15 s of CPU to start and save coverage).
        from conftest import UNMEASURED  # (here: this file also runs as the children's script)

        env = {k: v for k, v in sdk_env(TPU_LOG_DIR=scratch).items() if k not in UNMEASURED}
        while pending or status_pending:
            request = {"fixture": str(served), "metrics": pending, "runtime_status": status_pending}
            child = subprocess.run(in_namespace([sys.executable, str(Path(__file__)), "serve-and-read",
                                                 json.dumps(request)]),
                                   capture_output=True, text=True, env=env, timeout=timeout)
            reading.log += child.stderr[-4000:]
            started: str | None = None
            for line in child.stdout.splitlines():
                if not line.startswith("{"):
                    continue
                event = json.loads(line)
                if "start" in event:
                    started = event["start"]
                elif "metric" in event:
                    reading.metrics[event["metric"]] = event["data"]
                    pending.remove(event["metric"])
                    started = None
                elif "runtime_status" in event:
                    reading.runtime_status = event["runtime_status"]
                    reading.runtime_status_error = event.get("error")
                    status_pending = False
                    started = None
            if child.returncode == 0 and not pending and not status_pending:
                break
            why = f"exit {child.returncode}" + (f" (signal {-child.returncode})" if child.returncode < 0 else "")
            if started is None:  # died outside any read: nothing to resume from
                raise RuntimeError(f"the SDK child failed before a read ({why}): {child.stderr[-2000:]}")
            reading.aborted[started] = why
            if started == "runtime_status":
                status_pending = False
            else:
                pending.remove(started)
    return reading


def read_ours(fixture: Any) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """What tpu-tools reads of the same fixture (on a free port): the snapshot and runtime status as JSON."""
    from libtpu_server import FakeMetricsService

    from tpu_tools.metrics.libtpu import read_once

    with FakeMetricsService(fixture) as service:
        snapshots, statuses = read_once([service.address], runtime_status=True, include_hlo_info=True)
    assert snapshots[0].ok, snapshots[0].error
    return snapshots[0].to_dict(), statuses[0].to_dict() if statuses else None


def side_by_side(name: str) -> str:
    """A Markdown table of the SDK's figures and tpu-tools' for one fixture (docs/tpu.md shows v5p's)."""
    from libtpu_server import FIXTURES

    reading = read_fixture(FIXTURES[name](), GAUGES + list(DISTRIBUTIONS))
    snapshot, _ = read_ours(FIXTURES[name]())
    devices = {d["device_id"]: d for d in snapshot["devices"]}

    def text(value: Any) -> str:
        return "null" if value is None else f"{value:.2f}" if isinstance(value, float) else str(value)

    lines = [f"| figure | libtpu SDK {LIBTPU_VERSION} | tpu-tools |", "| --- | --- | --- |"]
    for sdk_name, figure in (("duty_cycle_pct", "duty_cycle_percent"), ("hbm_capacity_usage", "hbm_used_bytes"),
                             ("hbm_capacity_total", "hbm_total_bytes"), ("hlo_queue_size", "hlo_queue_size"),
                             ("runtime_hbm_utilization", "hbm_bandwidth_utilization_percent"),
                             ("idle_duration", "tensorcore_idle_duration_s")):
        ours = ", ".join(text(devices[i][figure]) for i in sorted(devices))
        lines.append(f"| `{sdk_name}` | {', '.join(reading.metrics[sdk_name])} | {ours} |")
    groups = {(g["metric"], g.get("buffer_size", g.get("label"))): g.get("latency_us", g.get("rate_mbps"))
              for g in snapshot["transfer_latencies"] + snapshot["delivery_rates"]}
    for sdk_name, served in DISTRIBUTIONS.items():
        for line in reading.metrics[sdk_name][:1] if served == HLO_EXECUTION_TIMING else reading.metrics[sdk_name]:
            label, numbers = row(line)
            if served == HLO_EXECUTION_TIMING:
                summary = devices[int(str(label).split("-")[0])]["hlo_execution_time_us"]
            else:
                summary = groups[(served, label or "all")]
            where = f"{sdk_name} {label or ''}".strip()
            lines.append(f"| `{where}` (max {summary['max']:.2f}) | {', '.join(f'{n:.2f}' for n in numbers)} | "
                         f"{', '.join(text(summary[k]) for k in FIGURES)} |")
    return "\n".join(lines)


# --- inside the namespace -----------------------------------------------------------------------------

def _loopback_up() -> None:
    """ip link set lo up, without iproute2: SIOCSIFFLAGS on the loopback interface."""
    import fcntl
    import socket
    import struct

    siocsifflags, iff_up, iff_loopback, iff_running = 0x8914, 0x1, 0x8, 0x40
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14s", b"lo", iff_up | iff_loopback | iff_running, b"")
        fcntl.ioctl(sock.fileno(), siocsifflags, request)


def _emit(event: dict[str, Any]) -> None:
    print(json.dumps(event), flush=True)


def _serve(fixture_file: str) -> int:
    """The fixture service on 127.0.0.1:8431 until stdin closes (the reader's end)."""
    from libtpu_server import FakeMetricsService

    with FakeMetricsService(pickle.loads(Path(fixture_file).read_bytes()), SDK_PORT):
        print("serving", flush=True)
        sys.stdin.read()
    return 0


def _serve_and_read(request: dict[str, Any]) -> int:
    # The service runs in a process of its own: the SDK holds the GIL through its blocking gRPC call.
    server = subprocess.Popen([sys.executable, str(Path(__file__)), "serve", request["fixture"]],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None, "the service did not start"
    assert server.stdout.readline().strip() == "serving", "the service did not start"
    from libtpu import sdk

    for name in request["metrics"]:
        _emit({"start": name})
        _emit({"metric": name, "data": [str(item) for item in sdk.tpumonitoring.get_metric(name).data()]})
    if request["runtime_status"]:
        _emit({"start": "runtime_status"})
        try:
            summary = sdk.tpuz.get_core_state_summary(include_hlo_info=True)
            _emit({"runtime_status": json.loads(json.dumps(summary, default=str))})
        except Exception as error:  # noqa: BLE001 an unimplemented rpc is an answer too
            _emit({"runtime_status": None, "error": f"{type(error).__name__}: {error}"})
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "loopback-exec":
        import resource

        _loopback_up()
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a read that aborts leaves no core file behind
        os.execvp(sys.argv[2], sys.argv[2:])
    if sys.argv[1] == "table":  # python tests/libtpu_sdk.py table v5p
        print(side_by_side(sys.argv[2]))
        sys.exit(0)
    if sys.argv[1] == "serve":
        sys.exit(_serve(sys.argv[2]))
    if sys.argv[1] == "serve-and-read":
        sys.exit(_serve_and_read(json.loads(sys.argv[2])))
    sys.exit(f"unknown verb {sys.argv[1]}")
