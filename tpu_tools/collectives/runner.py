"""One process's part of a collectives run: join, build the mesh, sweep, check, agree on the verdict.

Every process runs this same code (JAX is multi-controller). Per size: build
the crafted input, compile (timed apart), warm up, calibrate k (see timing),
time samples of k calls issued back to back, and compare every local device's
last out-of-place result (the input never changes, so it stays exact) with the
host's; then the in-place column: its first call on the crafted buffer is
checked, the chain of calls after it is timed with the same k. Process 0
gathers every process's times and wrong counts, decides whether the sweep
goes on, and announces the exit status; it is the one whose results the CLI
renders.
"""

from __future__ import annotations

import os
import socket
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from tpu_tools.collectives import distributed
from tpu_tools.collectives.data import Crafted, count_wrong
from tpu_tools.collectives.distributed import JoinSpec
from tpu_tools.collectives.exchange import KeyValueExchange, LocalExchange, linger_s
from tpu_tools.collectives.memory import shortfall
from tpu_tools.collectives.mesh import MeshPlan, build_mesh
from tpu_tools.collectives.ops import Case
from tpu_tools.collectives.report import (
    CaseResult,
    CollectivesReport,
    InPlaceResult,
    ProcessInfo,
    ProcessTime,
    SizeResult,
    judge,
)
from tpu_tools.collectives.settings import Settings
from tpu_tools.collectives.sizes import SizePlan, plan_sizes
from tpu_tools.collectives.spmd import in_place_elements
from tpu_tools.collectives.stats import algbw_gbps, slow_processes, summarise
from tpu_tools.collectives.timing import calibrate, per_call_us, plan_for
from tpu_tools.collectives.watchdog import Watchdog, plain_diagnosis
from tpu_tools.errors import EXIT_OK, RuntimeFailure, ToolError, UsageError
from tpu_tools.pjrt.runtime import RuntimePolicy, import_jax
from tpu_tools.shorten import one_line
from tpu_tools.units import format_bytes

CONTINUE = "continue"
# The CPU runtime hangs when about 50 multi-device collective calls are queued (seen with jax 0.10: 48
# calls back to back finish, 64 never do, whatever the device count). There the host waits for the
# latest call after every 16: one round trip per 16 calls, which errs on the slow side.
MAX_IN_FLIGHT_CPU = 16


class SizeDoesNotFit(Exception):
    """A size larger than the memory it needs (refused before anything is allocated)."""


@dataclass
class Section:
    """A test about to run: its result record and the sizes it will run."""

    test: Case
    result: CaseResult
    plans: list[SizePlan]
    note: str | None
    collective: Any  # spmd.Collective


class CollectivesRun:
    """Drive one process's part of a run; `report` is complete on process 0."""

    def __init__(self, settings: Settings, policy: RuntimePolicy, join: JoinSpec,
                 on_fatal: Callable[[str], None], command: str):
        self.settings = settings
        self.policy = policy
        self.join = join
        self.command = command
        self.jax: Any = None
        self.plan: MeshPlan | None = None
        self.exchange: LocalExchange | KeyValueExchange | None = None
        self.report: CollectivesReport | None = None
        self.distributed = False
        self._step = 0
        self._stopped: str | None = None
        self._finished = False
        self.watchdog = Watchdog(settings.timeout_s, on_fatal, diagnose=self._diagnose,
                                 presample=self._presample, before_exit=self._before_exit,
                                 exit_margin_s=linger_s(settings.timeout_s))

    # --- start --------------------------------------------------------------------------------------
    @property
    def process_id(self) -> int:
        return self.exchange.process_id if self.exchange else 0

    @property
    def is_reporter(self) -> bool:
        return self.process_id == 0

    def open(self) -> CollectivesReport:
        settings = self.settings
        self.watchdog.start("starting the runtime")
        if self.join.given:
            self._precheck_join()
        self.watchdog.progress("starting the runtime")
        self.jax = import_jax(self.policy, before_backend=self._before_backend)
        self.watchdog.progress("exchanging process identities")
        info = ProcessInfo(int(self.jax.process_index()), socket.gethostname(), os.getpid(),
                           [int(d.id) for d in self.jax.local_devices()])
        if self.distributed:
            self.exchange = KeyValueExchange(distributed.client(), info, int(self.jax.process_count()),
                                             settings.timeout_s, self.join.coordinator or "the coordinator")
        else:
            self.exchange = LocalExchange(info)
        processes = self.exchange.share_identity()
        self.plan = build_mesh(self.jax, settings.device_ids, settings.mesh_shape, settings.axis)
        self._validate_against_mesh()
        self.report = self._new_report(processes)
        return self.report

    def _precheck_join(self) -> None:
        if self.join.coordinator is None:
            return
        host, port = distributed.parse_address(self.join.coordinator)
        if self.join.process_id == 0:
            distributed.check_port_free(host, port)
        elif self.join.process_id is not None:
            self.watchdog.pause()  # this wait has its own limit and message
            distributed.wait_for_coordinator(host, port, self.settings.timeout_s)

    def _before_backend(self, jax: Any) -> None:
        """jax is imported under the policy; its backend is not started yet."""
        if self.settings.dtype.needs_x64:
            jax.config.update("jax_enable_x64", True)
        # Flags, or a scheduler / TPU pod that JAX recognises, make this a multi-process run.
        self.distributed = self.join.given or distributed.detected_cluster() is not None
        if self.distributed:
            self.watchdog.progress(f"joining {self.join.num_processes or 'the'} processes at "
                                   f"{self.join.coordinator or 'the coordinator'}")
            distributed.join(jax, self.join, self.settings.timeout_s)
        else:
            distributed.configure_cpu_collectives(jax)

    def _validate_against_mesh(self) -> None:
        ranks = self.plan.ranks  # type: ignore[union-attr]
        names = {t.op.name for t in self.settings.tests}
        if "broadcast" in names and not 0 <= self.settings.root < ranks:
            raise UsageError(f"--root {self.settings.root} is not a rank: the collective runs over {ranks} "
                             f"ranks (0 to {ranks - 1})")
        if "permute" in names and ranks > 1 and self.settings.shift % ranks == 0:
            raise UsageError(f"--shift {self.settings.shift} moves nothing on {ranks} ranks "
                             "(use a shift that is not a multiple of the rank count)")

    def _new_report(self, processes: list[ProcessInfo]) -> CollectivesReport:
        import jaxlib

        plan = self.plan
        assert plan is not None
        first = plan.devices[0]
        return CollectivesReport(
            command=self.command,
            time=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            platform=first.platform,
            device_kind=first.device_kind,
            jax_version=self.jax.__version__,
            jaxlib_version=jaxlib.__version__,
            processes=processes,
            device_ids=[int(d.id) for d in plan.devices],
            mesh_shape=list(plan.shape),
            mesh_axes=list(plan.names),
            axis=plan.axis,
            ranks=plan.ranks,
            groups=plan.groups,
            settings=self.settings.record(),
        )

    # --- the sweep ----------------------------------------------------------------------------------
    def begin(self, test: Case) -> Section:
        from tpu_tools.collectives.spmd import build_collective

        plan, settings = self.plan, self.settings
        assert plan is not None and self.report is not None
        plans, note = plan_sizes(settings.sizes, test.op, settings.dtype, plan.ranks)
        op = test.op
        collective = build_collective(self.jax, test, plan, root=settings.root, shift=settings.shift,
                                      is_integer=not settings.dtype.is_float)
        result = CaseResult(
            op=op.name, redop=test.redop, root=settings.root if op.has_root else None,
            shift=settings.shift if op.name == "permute" else None, implementation=collective.implementation,
            ranks=plan.ranks, groups=plan.groups, busbw_factor=op.busbw_factor(plan.ranks),
            busbw_formula=op.busbw_formula(plan.ranks))
        self.report.tests.append(result)
        if note:
            self.report.notes.append(note)
        return Section(test, result, plans, note, collective)

    def run(self, section: Section) -> Iterator[SizeResult]:
        """Run the sizes of a section; yields each size's result (complete on process 0)."""
        if self._stopped:
            return
        for size_plan in section.plans:
            local = self._run_size(section, size_plan)
            row = self._combine(section, size_plan, local)
            if row is not None:
                section.result.results.append(row)
            decision = self._decide(row, local.get("error"))
            if row is not None:
                yield row
            if decision != CONTINUE:
                self._stopped = decision
                return

    def _activity(self, section: Section, size_plan: SizePlan) -> str:
        return f"{section.test.label} at {format_bytes(size_plan.size_bytes)}"

    def _run_size(self, section: Section, size_plan: SizePlan) -> dict[str, Any]:
        """This process's measurement of one size (a JSON-ready dict: it may travel to process 0)."""
        settings, plan, jax, collective = self.settings, self.plan, self.jax, section.collective
        assert plan is not None and self.exchange is not None
        self._step += 1
        self.exchange.enter_step(self._step)
        activity = self._activity(section, size_plan)
        self.watchdog.progress(activity)
        crafted = Crafted(section.test, settings.dtype, plan.ranks, size_plan.count, settings.shift, settings.root)
        local: dict[str, Any] = {"process_id": self.process_id, "host": socket.gethostname(), "error": None}
        try:
            in_length = section.test.op.input_elements(size_plan.count, plan.ranks)
            out_length = section.test.op.output_elements(size_plan.count, plan.ranks)
            itemsize = settings.dtype.itemsize
            # Out-of-place: the input, the previous output and the new one.
            too_big = shortfall(self._local_devices, in_length * itemsize, 2 * out_length * itemsize)
            if too_big:
                raise SizeDoesNotFit(too_big)
            inputs = self._global(crafted.input, in_length, collective.sharding)
            shape = (*plan.shape, out_length)
            previous = jax.ShapeDtypeStruct(shape, inputs.dtype, sharding=collective.sharding)
            started = time.perf_counter()
            compiled = collective.timed.lower(inputs, previous).compile()
            local["compile_ms"] = (time.perf_counter() - started) * 1e3
            self.watchdog.progress()
            dtype = inputs.dtype
            zeros = jax.jit(lambda: jax.numpy.zeros(shape, dtype), out_shardings=collective.sharding)()
            out_of_place = _OutOfPlace(compiled, inputs, zeros, self.watchdog.progress, self._depth)
            self._measure(section, size_plan, out_of_place, local, "")
            if settings.check:
                local["wrong"], local["checked_elements"] = self._check(out_of_place.last, crafted.expected)
            else:
                local["wrong"], local["checked_elements"] = None, 0
            del out_of_place, inputs, zeros  # the in-place column needs the memory
            self.watchdog.progress()
            self._run_in_place(section, size_plan, crafted, local)
        except ToolError:
            raise
        except Exception as error:  # noqa: BLE001 the runtime refused this size (memory, compile): record, then stop
            local["error"] = _one_line(error)
            self.exchange.report_failure(f"{activity}: {local['error']}")
        return local

    def _run_in_place(self, section: Section, size_plan: SizePlan, crafted: Crafted, local: dict[str, Any]) -> None:
        """The in-place column: checked on its first call (crafted input), then timed on the chain."""
        plan, collective = self.plan, section.collective
        assert plan is not None
        length = in_place_elements(section.test, size_plan.count, plan.ranks)
        buffer = self._global(crafted.in_place_input, length, collective.sharding)
        started = time.perf_counter()
        compiled = collective.in_place.lower(buffer).compile()
        local["compile_ms"] += (time.perf_counter() - started) * 1e3
        self.watchdog.progress()
        first = compiled(buffer)  # the crafted buffer is donated: only the result lives on
        if self.settings.check:
            local["in_place_wrong"], local["in_place_checked_elements"] = self._check(
                first, crafted.in_place_expected)
        else:
            local["in_place_wrong"], local["in_place_checked_elements"] = None, 0
        self.watchdog.progress()
        self._measure(section, size_plan, _InPlace(compiled, first, self.watchdog.progress, self._depth), local,
                      "in_place_", calls=local["calls_per_sample"])

    @property
    def _depth(self) -> int:
        """Calls in flight at most before the host waits (see MAX_IN_FLIGHT_CPU)."""
        assert self.plan is not None
        return MAX_IN_FLIGHT_CPU if self.plan.devices[0].platform == "cpu" else 1 << 62

    def _measure(self, section: Section, size_plan: SizePlan, runner: _Chain, local: dict[str, Any], prefix: str,
                 calls: int | None = None) -> None:
        """Warm up, calibrate k (unless given), then time --iters samples of k calls back to back."""
        settings = self.settings
        assert self.exchange is not None
        for _ in range(settings.warmup):
            runner.sample(1)
        if calls is None:
            calibration = calibrate(runner.sample, plan_for(settings.sample_ms, settings.timeout_s),
                                    self.exchange.agree)
            calls = calibration.calls
            local["calls_per_sample"] = calls
            local["blocking_call_us"] = calibration.blocking_call_us
            local["calibration_note"] = (f"{self._activity(section, size_plan)}: {calibration.short}"
                                         if calibration.short else None)
        samples = [runner.sample(calls) for _ in range(settings.iters)]
        times = per_call_us(samples, calls)
        local[prefix + "time_us"] = statistics.fmean(times)
        local[prefix + "stats_us"] = summarise(times, settings.stats)
        local[prefix + "sample_ms"] = statistics.fmean(samples) * 1e3

    def _global(self, make: Callable[[int, int], Any], length: int, sharding: Any) -> Any:
        """A global array of every device's buffer, each built on the host by make(group, rank)."""
        plan = self.plan
        assert plan is not None
        block = (1,) * len(plan.shape)
        return self.jax.make_array_from_callback(
            (*plan.shape, length), sharding,
            lambda index: make(*plan.position(index)).reshape(*block, length))

    @property
    def _local_devices(self) -> list[Any]:
        assert self.plan is not None
        mine = self.jax.process_index()
        return [d for d in self.plan.devices if d.process_index == mine]

    def _check(self, output: Any, expected: Callable[[int, int], Any]) -> tuple[int, int]:
        import numpy as np

        plan = self.plan
        assert plan is not None
        wrong = checked = 0
        for shard in output.addressable_shards:
            group, rank = plan.position(shard.index)
            actual = np.asarray(shard.data)
            wrong += count_wrong(actual, expected(group, rank), self.settings.dtype)
            checked += actual.size
            self.watchdog.progress()
        return wrong, checked

    def _combine(self, section: Section, size_plan: SizePlan, local: dict[str, Any]) -> SizeResult | None:
        """Process 0: one row from every process's measurement. The others: None."""
        assert self.exchange is not None and self.plan is not None
        self.watchdog.pause()  # the gather waits with its own limit and names who is missing
        gathered = self.exchange.gather(f"size/{self._step}", local)
        self.watchdog.progress()
        if gathered is None:
            return None
        test, settings = section.test, self.settings
        row = SizeResult(requested_bytes=size_plan.requested_bytes, size_bytes=size_plan.size_bytes,
                         count=size_plan.count, dtype=settings.dtype.name, redop=test.redop,
                         root=settings.root if test.op.has_root else None)
        failures = [g for g in gathered if g.get("error")]
        if failures:
            row.error = "; ".join((f"process {g['process_id']}: " if len(gathered) > 1 else "") + g["error"]
                                  for g in failures)
            return row
        times = {g["process_id"]: g["time_us"] for g in gathered}
        verdict = slow_processes(times, settings.slow_threshold)
        row.processes = [ProcessTime(g["process_id"], g["host"], g["time_us"], g["stats_us"], g["wrong"],
                                     g["process_id"] in verdict.slow, g["in_place_time_us"], g["in_place_wrong"])
                         for g in gathered]
        # The collective is done when the last process is done.
        row.time_us = max(times.values())
        row.stats_us = {name: max(g["stats_us"][name] for g in gathered) for name in settings.stats}
        row.algbw_gbps = algbw_gbps(size_plan.size_bytes, row.time_us)
        row.busbw_gbps = row.algbw_gbps * section.result.busbw_factor
        row.compile_ms = max(g["compile_ms"] for g in gathered)
        if settings.check:
            row.wrong = sum(g["wrong"] for g in gathered)
            row.checked_elements = sum(g["checked_elements"] for g in gathered)
        row.calls_per_sample = gathered[0]["calls_per_sample"]  # the same on every process (agreed)
        row.sample_ms = max(g["sample_ms"] for g in gathered)
        row.blocking_call_us = max(g["blocking_call_us"] for g in gathered)
        row.calibration_note = gathered[0]["calibration_note"]
        if row.calibration_note and row.calibration_note not in self.report.notes:  # type: ignore[union-attr]
            self.report.notes.append(row.calibration_note)  # type: ignore[union-attr]
        in_place_us = max(g["in_place_time_us"] for g in gathered)
        in_place_algbw = algbw_gbps(size_plan.size_bytes, in_place_us)
        row.in_place = InPlaceResult(
            time_us=in_place_us,
            stats_us={name: max(g["in_place_stats_us"][name] for g in gathered) for name in settings.stats},
            algbw_gbps=in_place_algbw, busbw_gbps=in_place_algbw * section.result.busbw_factor,
            wrong=sum(g["in_place_wrong"] for g in gathered) if settings.check else None,
            checked_elements=sum(g["in_place_checked_elements"] for g in gathered))
        return row

    def _decide(self, row: SizeResult | None, own_error: str | None) -> str:
        """Process 0 says whether the sweep goes on (it stops at the first failed size); all follow."""
        assert self.exchange is not None
        decision = CONTINUE if row is None or row.error is None else f"stop: {row.error}"
        self.watchdog.pause()
        try:
            decision = self.exchange.decide(self._step, decision)
        except RuntimeFailure:
            if own_error:  # this process failed first: that is the news, not the silence that followed
                raise RuntimeFailure(own_error) from None
            raise
        self.watchdog.progress()
        return decision

    # --- the end ------------------------------------------------------------------------------------
    def finish(self) -> int:
        """Status and exit code (process 0 decides, everyone returns the same), then leave the job."""
        assert self.exchange is not None
        code = EXIT_OK
        if self.is_reporter:
            assert self.report is not None
            code = judge(self.report, self.settings.min_busbw_gbps)
        self.watchdog.pause()
        code = self.exchange.settle(code)
        self._finished = True
        return code

    def close(self) -> None:
        """Stop the helpers; after a finished run, leave the job in order (jax's shutdown barrier).

        After a failure the others may never reach that barrier: skip it rather than wait on it.
        """
        self.watchdog.pause()
        if self.exchange is not None:
            self.exchange.close()
        if self.distributed and self.jax is not None and self._finished:
            try:
                distributed.leave(self.jax)
            except Exception:  # noqa: BLE001 leaving is best effort: the verdict is already settled
                pass
        self.watchdog.stop()

    # --- watchdog hooks -----------------------------------------------------------------------------
    def _diagnose(self, activity: str, elapsed: float) -> str:
        if self.exchange is None:
            if self.distributed:
                expected = self.join.num_processes or "all"
                where = self.join.coordinator or "the coordinator"
                return (f"not every process joined within {elapsed:.0f} s (--timeout "
                        f"{self.settings.timeout_s:g}; expected {expected} at {where}): the missing ones did not "
                        "start or cannot reach it")
            return plain_diagnosis(activity, elapsed)
        return self.exchange.diagnose(activity, elapsed)

    def _presample(self) -> None:
        if self.exchange is not None:
            self.exchange.presample()

    def _before_exit(self) -> None:
        if self.exchange is not None:
            self.exchange.linger()


class _OutOfPlace:
    """Calls on one input into fresh outputs; each call also takes the previous output (unused by the
    program), so the runtime starts it only once that output exists: the calls cannot overlap."""

    def __init__(self, compiled: Any, inputs: Any, first: Any, progress: Callable[[], None], depth: int):
        self.compiled, self.inputs, self.last, self.progress = compiled, inputs, first, progress
        self.depth = depth

    def sample(self, calls: int) -> float:
        """Issue `calls` calls back to back, wait for the last; seconds."""
        compiled, inputs, depth = self.compiled, self.inputs, self.depth
        started = time.perf_counter()
        # The last sample's output is let go inside this one (freed once the first call is done with it), so a
        # sample pays for as many frees as it makes outputs, as a long loop does (see bench/timing.py).
        output, self.last = self.last, None
        for call in range(1, calls + 1):
            output = compiled(inputs, output)
            if call % depth == 0:
                output.block_until_ready()
                self.progress()  # the runtime answers: a long sample on a busy machine is not a hang
        output.block_until_ready()
        elapsed = time.perf_counter() - started
        self.last = output
        self.progress()
        return elapsed


class _InPlace:
    """Calls that write over their (donated) input: each consumes the previous call's result."""

    def __init__(self, compiled: Any, buffer: Any, progress: Callable[[], None], depth: int):
        self.compiled, self.buffer, self.progress, self.depth = compiled, buffer, progress, depth

    def sample(self, calls: int) -> float:
        compiled, buffer, depth = self.compiled, self.buffer, self.depth
        started = time.perf_counter()
        for call in range(1, calls + 1):
            buffer = compiled(buffer)
            if call % depth == 0:
                buffer.block_until_ready()
                self.progress()
        buffer.block_until_ready()
        elapsed = time.perf_counter() - started
        self.buffer = buffer
        self.progress()
        return elapsed


_Chain = _OutOfPlace | _InPlace


def _one_line(error: BaseException) -> str:
    return one_line(str(error), 300) or type(error).__name__

