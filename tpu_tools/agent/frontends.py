"""The frontends the agent serves: one interface, one adapter per PJRT frontend, filling the same records.

A frontend is the library that builds and runs the job's programs on PJRT: JAX, or PyTorch/XLA (`torch_xla`).
Each adapter attaches when the job imports its library and answers with a `FrontendFigures`: the runtime and
devices, the compiles in the compile tracker's shape (per function, recompiles with their reasons), the
persistent cache, and where the frontend gives them the executions, transfers and CPU fallbacks. Every view
(tpu-monitor, Prometheus, tpu-top, tpu-dump, the job-end record) reads those records without knowing which
frontend filled them; the snapshot names it (`frontend`).

When both libraries are loaded the one that runs the job's programs is reported: a torch_xla SPMD job imports
jax (`xs.mark_sharding` does) but compiles nothing through it, so it is never shown as a JAX job that
compiled nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

JAX = "jax"
TORCH_XLA = "torch_xla"


@dataclass
class FrontendFigures:
    """One answer's figures of a frontend (the agent snapshot's keys of the same names)."""

    runtime: dict[str, Any] | None
    devices: list[dict[str, Any]]
    memory_error: str | None
    compiles: dict[str, Any]
    compilation_cache: dict[str, Any] | None
    executions: dict[str, Any] | None = None  # {count, time_s}
    transfers: dict[str, Any] | None = None  # {to_device: {count, time_s, bytes}, from_device: {...}}
    cpu_fallbacks: dict[str, Any] | None = None  # {total, ops: [{op, count}]}
    startup: list[dict[str, Any]] | None = None  # the startup contract's findings [{check, message, fix}]

    def fields(self) -> dict[str, Any]:
        """The figures as the snapshot's fields of the same names."""
        return {"runtime": self.runtime, "devices": self.devices, "memory_error": self.memory_error,
                "compiles": self.compiles, "compilation_cache": self.compilation_cache,
                "executions": self.executions, "transfers": self.transfers, "cpu_fallbacks": self.cpu_fallbacks,
                "startup": self.startup}


class Frontend(Protocol):
    """What the agent asks of a frontend's adapter; called from the agent's serving thread, never raises."""

    name: str

    def version(self) -> str | None: ...

    def compile_count(self) -> int: ...

    def figures(self) -> FrontendFigures: ...

    def step_figures(self) -> dict[str, Any]:
        """The snapshot's fields of this frontend that steps change, read now: what a publication between two
        full snapshots brings up to date (tpu_tools.agent.publish)."""
        ...


class JaxFrontend:
    """JAX: compiles from `jax.monitoring` (the compile tracker), memory and live arrays from its devices, the
    persistent compilation cache from the cache watcher."""

    name = JAX

    def __init__(self, jax_module: Any, compiles: Any, device_memory: Any, cache_watch: Any):
        self.jax = jax_module
        self._compiles = compiles
        self._device_memory = device_memory
        self._cache_watch = cache_watch

    def version(self) -> str | None:
        return getattr(self.jax, "__version__", None)

    def compile_count(self) -> int:
        return int(self._compiles.snapshot()["compile_count"])

    def figures(self) -> FrontendFigures:
        runtime, memory_error = None, None
        devices: list[dict[str, Any]] = []
        try:
            runtime, devices = self._device_memory.read(self.jax)
        except Exception as error:  # noqa: BLE001 a runtime that fails must not cost the other figures
            memory_error = f"{type(error).__name__}: {error}"
        return FrontendFigures(runtime, devices, memory_error, self._compiles.snapshot(),
                               self._cache_watch().snapshot())

    def step_figures(self) -> dict[str, Any]:
        """The devices' memory (the compiles and the persistent cache change when the job compiles, which asks
        for a full snapshot)."""
        try:
            runtime, devices = self._device_memory.read(self.jax, refresh=False)
        except Exception as error:  # noqa: BLE001 a runtime that fails must not cost the other figures
            return {"runtime": None, "devices": [], "memory_error": f"{type(error).__name__}: {error}"}
        return {"runtime": runtime, "devices": devices, "memory_error": None}


def reported(frontends: dict[str, Frontend]) -> Frontend | None:
    """The frontend that runs the job's programs: the only one loaded; of two, the one that compiled more
    (torch_xla where neither compiled yet: jax in a torch_xla job is its helper)."""
    if len(frontends) <= 1:
        return next(iter(frontends.values()), None)
    jax, torch_xla = frontends.get(JAX), frontends.get(TORCH_XLA)
    if jax is None or torch_xla is None:
        return next(iter(frontends.values()))
    return jax if jax.compile_count() > torch_xla.compile_count() else torch_xla
