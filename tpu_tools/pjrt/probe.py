"""Health probe: compile a small program, run it on every device, verify it on the host.

Runs where jax is imported (the isolated child for `tpu-ls --probe`, the
benchmark or dump process otherwise). The inputs are small integers so the
exact answer is known on the host whatever precision the device multiplies at.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

from tpu_tools.shorten import shorten

PROBE_SIZE = 128
EXECUTE_REPEATS = 5


@dataclass
class ProbeResult:
    device_id: int
    ok: bool
    compile_ms: float | None = None
    execute_us: float | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProbeResult:
        return cls(**data)


def _probe_program(x: Any) -> Any:
    import jax.numpy as jnp

    return jnp.dot(x, x) + jnp.sum(x, axis=0)


def _probe_input() -> Any:
    import numpy as np

    values = (np.arange(PROBE_SIZE * PROBE_SIZE, dtype=np.int64) * 7 + 3) % 8
    return values.reshape(PROBE_SIZE, PROBE_SIZE)


def probe_device(jax_module: Any, device: Any) -> ProbeResult:
    """Compile, run and check a small program on `device`; returns its `ProbeResult`.

    A failure of the runtime is recorded in the result (passed False, with the error), not raised.
    """
    import numpy as np

    host_input = _probe_input()
    expected = host_input @ host_input + host_input.sum(axis=0)
    try:
        x = jax_module.device_put(host_input.astype(np.float32), device)
        start = time.perf_counter()
        compiled = jax_module.jit(_probe_program).lower(x).compile()
        compile_ms = (time.perf_counter() - start) * 1e3
        compiled(x).block_until_ready()  # first run pays one-off costs
        samples = []
        for _ in range(EXECUTE_REPEATS):
            start = time.perf_counter()
            result = compiled(x).block_until_ready()
            samples.append((time.perf_counter() - start) * 1e6)
        got = np.asarray(result)
    except Exception as exc:  # noqa: BLE001 a device that fails is a result, not a crash
        return ProbeResult(device_id=int(device.id), ok=False, error=shorten(f"{type(exc).__name__}: {exc}", 500))
    wrong = int(np.count_nonzero(got.astype(np.int64) != expected))
    return ProbeResult(
        device_id=int(device.id),
        ok=wrong == 0,
        compile_ms=round(compile_ms, 3),
        execute_us=round(statistics.median(samples), 3),
        error=None if wrong == 0 else f"{wrong} of {expected.size} values wrong",
    )


def probe_local_devices(jax_module: Any) -> list[ProbeResult]:
    """`probe_device` on every local device of the imported jax, in device order."""
    return [probe_device(jax_module, device) for device in jax_module.local_devices()]
