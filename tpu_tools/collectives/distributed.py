"""Joining the processes of a run with jax.distributed, without its fatal failure modes.

JAX's coordination client ends the process (a C++ fatal error) when the
coordinator does not answer in time, and its service crashes when its port is
taken. Both are checked here first, within --timeout, so that the user gets a
sentence instead. JAX's own limits are set a little past --timeout so that the
watchdog, which names the missing processes, always speaks first.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import time
from dataclasses import dataclass
from typing import Any

from tpu_tools.errors import RuntimeFailure, RuntimeHang, UsageError
from tpu_tools.parsing import port_number
from tpu_tools.shorten import quoted
from tpu_tools.signals import interruptible


@dataclass(frozen=True)
class JoinSpec:
    coordinator: str | None = None  # HOST:PORT of process 0
    num_processes: int | None = None
    process_id: int | None = None

    @property
    def given(self) -> bool:
        return any(v is not None for v in (self.coordinator, self.num_processes, self.process_id))

    def validate(self) -> None:
        if self.coordinator is not None:
            parse_address(self.coordinator)
        if self.num_processes is not None and self.num_processes < 1:
            raise UsageError(f"--num-processes must be at least 1, got {self.num_processes}")
        if self.process_id is not None and self.process_id < 0:
            raise UsageError(f"--process-id must not be negative, got {self.process_id}")
        if (self.num_processes is not None and self.process_id is not None
                and self.process_id >= self.num_processes):
            raise UsageError(f"--process-id {self.process_id} is out of range for --num-processes "
                             f"{self.num_processes} (use 0 to {self.num_processes - 1})")


_HOST_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252}[A-Za-z0-9])?$", re.ASCII)


def parse_address(text: str) -> tuple[str, int]:
    """HOST:PORT, an IPv6 address in brackets ([::1]:8476); a UsageError otherwise."""
    host, separator, port_text = text.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            valid = ipaddress.ip_address(host).version == 6
        except ValueError:
            valid = False
    else:
        valid = bool(_HOST_NAME.match(host))  # a name or an IPv4 address: no brackets, spaces or colons
    port = port_number(port_text)
    if not separator or not valid or port is None:
        raise UsageError(f"--coordinator {quoted(text, 60)}: use HOST:PORT, e.g. 10.0.0.2:8476 or [fd00::2]:8476")
    return host, port


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def check_port_free(host: str, port: int) -> None:
    """Process 0 is about to serve on this port: fail clearly if something already does."""
    bind_host = host if is_loopback(host) else ""
    family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((bind_host, port))
        except OSError as error:
            where = f"{host}:{port}" if bind_host else f"port {port}"
            raise RuntimeFailure(f"cannot serve the coordinator on {where}: {error.strerror or error} "
                                 "(choose another port with --coordinator, or stop what holds it)") from None


def wait_for_coordinator(host: str, port: int, timeout_s: float) -> None:
    """Process k > 0: wait until process 0's coordinator accepts connections, at most `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    last_error = ""
    while True:
        try:
            with socket.create_connection((host, port), timeout=max(0.1, min(1.0, deadline - time.monotonic()))):
                return
        except OSError as error:
            last_error = error.strerror or str(error)
        if time.monotonic() >= deadline:
            raise RuntimeHang(f"the coordinator {host}:{port} did not answer within {timeout_s:g} s "
                              f"({last_error}); start process 0 first, or check --coordinator")
        time.sleep(0.2)


def detected_cluster() -> str | None:
    """The name of the cluster environment JAX would join by itself (scheduler, TPU pod), if any."""
    if os.environ.get("JAX_COORDINATOR_ADDRESS"):
        return "JAX_COORDINATOR_ADDRESS"
    try:
        from jax._src import clusters
    except ImportError:
        return None
    for environment in clusters.ClusterEnv._cluster_types:
        if environment.opt_in_only_method:
            continue
        try:
            if environment.is_env_present() and environment.get_process_count() > 1:
                return environment.__name__
        except Exception:  # noqa: BLE001 a half-configured environment is not one to join
            continue
    return None


def configure_cpu_collectives(jax: Any) -> None:
    """Before the backend starts: cross-process CPU collectives over gloo, no SIGTERM capture."""
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    # The preemption service swallows SIGTERM; a test tool must stay killable.
    jax.config.update("jax_enable_preemption_service", False)


def join(jax: Any, spec: JoinSpec, timeout_s: float) -> None:
    """jax.distributed.initialize with our limits; `spec` fields left None come from the environment."""
    configure_cpu_collectives(jax)
    arguments: dict[str, Any] = {
        "coordinator_address": spec.coordinator,
        "num_processes": spec.num_processes,
        "process_id": spec.process_id,
        "initialization_timeout": int(timeout_s) + 10,
        "heartbeat_timeout_seconds": int(2 * timeout_s) + 10,
        "shutdown_timeout_seconds": int(timeout_s) + 5,
    }
    if spec.coordinator is not None:
        host, port = parse_address(spec.coordinator)
        if is_loopback(host):  # serve on loopback only, not on every interface
            arguments["coordinator_bind_address"] = f"{host}:{port}"
    try:
        # blocks in C++ until every process joined (up to the timeout): signals are answered meanwhile
        interruptible(lambda: jax.distributed.initialize(**arguments), "tpu-collectives-join")
    except ValueError as error:
        raise UsageError(f"cannot join the processes: {error} (give --coordinator, --num-processes and "
                         "--process-id, or run under a scheduler that sets them)") from error
    except RuntimeError as error:
        raise RuntimeFailure(f"cannot join the processes: {error}") from error


def leave(jax: Any) -> None:
    """Orderly shutdown: a barrier of all processes, bounded by the shutdown timeout set in `join`."""
    jax.distributed.shutdown()


def client() -> Any:
    """The coordination service client (its key-value store carries our exchange)."""
    from jax._src import distributed as jax_distributed

    return jax_distributed.global_state.client
