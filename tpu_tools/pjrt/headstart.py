"""Starting the runtime child before a command knows it needs it: the listing's head start.

Importing a command line (click, the views, the readers) takes a noticeable share of `tpu-ls`'s run, and the
runtime child needs none of it: on the plainest command lines the entry point starts the child first
(`start_ahead`) and the listing takes it over (`take_or_start`) when it was started for exactly the same query,
policy and time limit. Anything else gets a fresh child and the early one is killed, as is one nobody takes
by the time the program exits. Whether the runtime may be started before NVML or amdsmi have answered is
decided here too, for both paths alike (`starts_first`).
"""

from __future__ import annotations

import atexit
import json
import os
from dataclasses import dataclass
from typing import Any

from tpu_tools.pjrt import isolate
from tpu_tools.pjrt.discover import Discovery, Holder, sysroot
from tpu_tools.pjrt.runtime import RuntimePolicy

# A kernel driver's control node: where it exists, NVML or amdsmi may list the GPUs and make the runtime (a CUDA
# or HIP context on every GPU) unneeded, so the runtime waits for their answer.
GPU_DRIVER_NODES = ("dev/nvidiactl", "dev/kfd")


def gpu_driver_present() -> bool:
    return any((sysroot() / node).exists() for node in GPU_DRIVER_NODES)


def tpu_holders(policy: RuntimePolicy, discovery: Discovery) -> list[Holder]:
    """Other processes holding TPU chips, when this command would open the TPU runtime."""
    platforms = policy.requested_platforms()
    if platforms and "tpu" not in platforms:
        return []
    return discovery.tpu_holders(exclude_pids={os.getpid()})


def starts_first(policy: RuntimePolicy, discovery: Discovery) -> bool:
    """The runtime may start before anything else is read: no TPU is held and no GPU driver could veto it."""
    return not tpu_holders(policy, discovery) and not gpu_driver_present()


@dataclass
class _Ahead:
    key: tuple[str, str, RuntimePolicy, float]
    call: isolate.IsolatedCall


_ahead: _Ahead | None = None


def _key(target: str, params: dict[str, Any], policy: RuntimePolicy, timeout_s: float) -> tuple[
        str, str, RuntimePolicy, float]:
    return target, json.dumps(params, sort_keys=True), policy, timeout_s


def start_ahead(target: str, params: dict[str, Any], policy: RuntimePolicy, timeout_s: float) -> None:
    """Start the call now if the runtime may start first; never raises (the real start reports any error)."""
    global _ahead
    try:
        from tpu_tools.pjrt.discover import discover

        if _ahead is not None or not starts_first(policy, discover()):
            return
        call = isolate.start_isolated(target, params, policy, timeout_s)
    except Exception:  # noqa: BLE001 the head start is an optimisation: the command starts its runtime itself
        return
    _ahead = _Ahead(_key(target, params, policy, timeout_s), call)
    atexit.register(cancel)


def take_or_start(target: str, params: dict[str, Any], policy: RuntimePolicy,
                  timeout_s: float) -> isolate.IsolatedCall:
    """The call started ahead for exactly this, else a new one (an early call for something else is killed)."""
    global _ahead
    ahead, _ahead = _ahead, None
    if ahead is not None:
        if ahead.key == _key(target, params, policy, timeout_s):
            return ahead.call
        ahead.call.kill()
    return isolate.start_isolated(target, params, policy, timeout_s)


def cancel() -> None:
    """Kill a call started ahead that is not needed after all (a held TPU, a GPU driver that lists the GPUs)."""
    global _ahead
    ahead, _ahead = _ahead, None
    if ahead is not None:
        ahead.call.kill()
