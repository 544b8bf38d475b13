"""A diagnostic run spanning several processes (hosts) joined by jax.distributed.

Every process runs the levels on its own devices in-process (it was started for this run, by --launch or
by the operator on each host); digests, rates and collective results go through the coordination
service's key-value store (the collectives test's exchange), so process 0 compares every device of
every host, and gathers all checks into one report.
"""

from __future__ import annotations

import os
import socket
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


def _precheck(join: JoinSpec, timeout_s: float) -> None:
    if join.coordinator is None:
        return
    host, port = distributed.parse_address(join.coordinator)
    if join.process_id == 0:
        distributed.check_port_free(host, port)
    elif join.process_id is not None:
        distributed.wait_for_coordinator(host, port, timeout_s)


class WatchedSink:
    """Every event is progress for the watchdog: a test that makes none for --timeout ends the run."""

    def __init__(self, sink: Sink, watchdog: Watchdog):
        self.sink, self.watchdog = sink, watchdog

    def plan(self, info: dict[str, Any]) -> None:
        self.watchdog.progress("planning")
        self.sink.plan(info)

    def begin(self, test: str, device: int | None) -> None:
        self.watchdog.progress(test + (f" on device {device}" if device is not None else ""))
        self.sink.begin(test, device)

    def check(self, check: Check) -> None:
        self.watchdog.progress()
        self.sink.check(check)

    def tick(self, text: str) -> None:
        self.watchdog.progress()
        self.sink.tick(text)

    def note(self, text: str) -> None:
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
    try:
        exchange.share_identity()
        runner = DiagRunner(jax, settings, WatchedSink(sink, watchdog), exchange)
        runner.run()
        watchdog.progress("gathering the results")
        # process 0's checks include the judgements of every device; the others' are their own devices'
        payload: dict[str, Any] = {"checks": [c.to_dict() for c in runner.checks],
                                   "coverage": runner.coverage.to_dict()}
        gathered = exchange.gather("diag/checks", payload)
        if gathered is not None:
            report.checks = []
            coverage = Coverage()
            for entry in gathered:
                report.checks.extend(Check.from_dict(c) for c in entry["checks"])
                part = Coverage.from_dict(entry["coverage"])
                coverage.devices.update(part.devices)
                for link in part.links:
                    coverage.add_link(link)
                for dtype in part.dtypes:
                    coverage.add_dtype(dtype)
            report.coverage = coverage
            # in the order the tests ran (repeat by repeat), each test's devices in order
            order = {name: index for index, name in enumerate(dict.fromkeys(c.test for c in report.checks))}
            report.checks.sort(key=lambda c: (c.iteration, order[c.test], -1 if c.device is None else c.device))
        exchange.settle(report.exit_code if exchange.process_id == 0 else 0)
        exchange.linger()
    finally:
        watchdog.stop()
        exchange.close()
    distributed.leave(jax)
    return exchange.process_id
