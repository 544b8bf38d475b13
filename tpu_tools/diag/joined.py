"""A diagnostic run spanning several processes (hosts) joined by jax.distributed.

Every process runs the levels on its own devices in-process (it was started for this run, by --launch or
by the operator on each host); digests, rates and collective results go through the coordination
service's key-value store (the collectives test's exchange), so process 0 compares every device of
every host, and gathers all checks into one report.

The checks run on a thread of their own while the main thread waits for them: a process waiting for a
peer (the key-value store's blocking reads, a collective) sits in native code, where no Python signal
handler runs; a peer that ended on the same Ctrl-C or SIGTERM never answers. The main thread answers the
signal at once instead, and the report holds what ended before it.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable
from typing import Any

from tpu_tools.collectives import distributed
from tpu_tools.collectives.distributed import JoinSpec
from tpu_tools.collectives.exchange import KeyValueExchange
from tpu_tools.collectives.report import ProcessInfo
from tpu_tools.collectives.watchdog import Watchdog
from tpu_tools.diag.records import Check, Coverage, DiagReport
from tpu_tools.diag.runner import DiagRunner, Sink
from tpu_tools.diag.settings import DiagSettings
from tpu_tools.pjrt.runtime import RuntimePolicy, import_jax
from tpu_tools.signals import interruptible


def _precheck(join: JoinSpec, timeout_s: float) -> None:
    if join.coordinator is None:
        return
    host, port = distributed.parse_address(join.coordinator)
    if join.process_id == 0:
        distributed.check_port_free(host, port)
    elif join.process_id is not None:
        distributed.wait_for_coordinator(host, port, timeout_s)


class WatchedSink:
    """Every event is progress for the watchdog: a test that makes none for --timeout ends the run.

    Closed once the run was interrupted: the checks go on running on their thread until the process ends,
    and what they find after the signal is not added to the report being written."""

    def __init__(self, sink: Sink, watchdog: Watchdog):
        self.sink, self.watchdog = sink, watchdog
        self._lock = threading.Lock()
        self._open = True

    def close(self) -> None:
        with self._lock:
            self._open = False

    def plan(self, info: dict[str, Any]) -> None:
        with self._lock:
            if self._open:
                self.watchdog.progress("planning")
                self.sink.plan(info)

    def begin(self, test: str, device: int | None) -> None:
        with self._lock:
            if self._open:
                self.watchdog.progress(test + (f" on device {device}" if device is not None else ""))
                self.sink.begin(test, device)

    def check(self, check: Check) -> None:
        with self._lock:
            if self._open:
                self.watchdog.progress()
                self.sink.check(check)

    def tick(self, text: str) -> None:
        with self._lock:
            if self._open:
                self.watchdog.progress()
                self.sink.tick(text)

    def note(self, text: str) -> None:
        with self._lock:
            if self._open:
                self.sink.note(text)


def run_joined(settings: DiagSettings, join: JoinSpec, policy: RuntimePolicy, timeout_s: float, sink: Sink,
               report: DiagReport, on_expire: Callable[[str], None]) -> int:
    """Run this process's part; process 0 fills `report` with every process's checks. Returns the
    process id. A test without progress for `timeout_s` (a hung device or a lost peer) calls `on_expire`
    with the diagnosis, and the process ends with status 1."""
    _precheck(join, timeout_s)
    jax = import_jax(policy, before_backend=lambda module: distributed.join(module, join, timeout_s))
    info = ProcessInfo(int(jax.process_index()), socket.gethostname(), os.getpid(),
                       [int(d.id) for d in jax.local_devices()])
    exchange = KeyValueExchange(distributed.client(), info, int(jax.process_count()), timeout_s,
                                join.coordinator or "the coordinator")
    watchdog = Watchdog(timeout_s, on_expire, diagnose=exchange.diagnose, presample=exchange.presample,
                        before_exit=exchange.linger).start("exchanging process identities")
    watched = WatchedSink(sink, watchdog)

    def checks() -> list[dict[str, Any]] | None:
        exchange.share_identity()
        runner = DiagRunner(jax, settings, watched, exchange)
        runner.run()
        watchdog.progress("gathering the results")
        # process 0's checks include the judgements of every device; the others' are their own devices'
        payload: dict[str, Any] = {"checks": [c.to_dict() for c in runner.checks],
                                   "coverage": runner.coverage.to_dict()}
        return exchange.gather("diag/checks", payload)

    try:
        gathered = interruptible(checks, "tpu-diag-checks")
        if gathered is not None:
            _merge(report, gathered)
        interruptible(lambda: exchange.settle(report.exit_code if exchange.process_id == 0 else 0),
                      "tpu-diag-settle")
        exchange.linger()
    except KeyboardInterrupt:
        watched.close()
        raise
    finally:
        watchdog.stop()
        exchange.close()
    interruptible(lambda: distributed.leave(jax), "tpu-diag-leave")  # a barrier: a peer gone holds it
    return exchange.process_id


def _merge(report: DiagReport, gathered: list[dict[str, Any]]) -> None:
    """Every process's checks and coverage into process 0's report."""
    merged: list[Check] = []
    coverage = Coverage()
    for entry in gathered:
        merged.extend(Check.from_dict(c) for c in entry["checks"])
        part = Coverage.from_dict(entry["coverage"])
        coverage.devices.update(part.devices)
        for link in part.links:
            coverage.add_link(link)
        for dtype in part.dtypes:
            coverage.add_dtype(dtype)
    # in the order the tests ran (repeat by repeat), each test's devices in order
    order = {name: index for index, name in enumerate(dict.fromkeys(c.test for c in merged))}
    merged.sort(key=lambda c: (c.iteration, order[c.test], -1 if c.device is None else c.device))
    report.checks = merged
    report.coverage = coverage
