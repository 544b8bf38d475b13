"""Queries that run inside the isolated child (see `isolate`): they import jax.

Each returns JSON-serialisable data; callers rebuild records from it.
"""

from __future__ import annotations

from typing import Any

LIST_DEVICES = "tpu_tools.pjrt.queries:list_devices"


def list_devices(probe: bool = False) -> dict[str, Any]:
    """The runtime's devices as a dict ({"runtime": RuntimeRecord as dict}, plus "probe" results when asked).

    Runs inside the isolated child: it imports jax. Runtime errors propagate to the child's answer.
    """
    import jax

    from tpu_tools.pjrt.devices import runtime_record

    answer: dict[str, Any] = {"runtime": runtime_record(jax).to_dict()}
    if probe:
        from tpu_tools.pjrt.probe import probe_local_devices

        answer["probe"] = [result.to_dict() for result in probe_local_devices(jax)]
    return answer
