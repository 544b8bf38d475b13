"""The diagnostic levels, run where jax is imported: in the isolated child, or in each process of a
multi-process run. Results go to a `Sink` as they come (progress, partial results on interruption).

Per-device tests (compile, known answers, transfers, memory patterns) judge each device against exact
answers. Cross-device tests (GEMM digests, memory digests, sustained load) judge each device against the
majority of its peers of the same kind; with several processes the digests of every process are gathered
to process 0, which judges them all.
"""

from __future__ import annotations

import socket
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from tpu_tools.diag import kernels
from tpu_tools.diag.compare import Judgement, judge_digests, rate_outliers
from tpu_tools.diag.digest import digest_text, host_digest
from tpu_tools.diag.memory import free_bytes, is_out_of_memory, pattern_words
from tpu_tools.diag.records import FAIL, PASS, SKIP, WARN, Check, Coverage
from tpu_tools.diag.reference import digest_key, key_id, runtime_key
from tpu_tools.diag.settings import COLLECTIVES, GEMM_DTYPES, LONG_MEMORY_PATTERNS, MEMORY_PATTERNS, DiagSettings
from tpu_tools.errors import UsageError


class Sink(Protocol):
    def plan(self, info: dict[str, Any]) -> None: ...
    def begin(self, test: str, device: int | None) -> None: ...
    def check(self, check: Check) -> None: ...
    def tick(self, text: str) -> None: ...
    def note(self, text: str) -> None: ...


class Exchange(Protocol):
    process_id: int
    process_count: int

    def gather(self, name: str, payload: dict[str, Any]) -> list[dict[str, Any]] | None: ...
    def decide(self, step: int, decision: str) -> str: ...


@dataclass
class DigestTable:
    """test -> device -> digests of its runs; device kinds to compare only like with like."""

    runs: dict[int, list[str]] = field(default_factory=dict)
    kinds: dict[int, str] = field(default_factory=dict)
    durations: dict[int, float] = field(default_factory=dict)


class DiagRunner:
    def __init__(self, jax: Any, settings: DiagSettings, sink: Sink, exchange: Exchange | None = None):
        self.jax = jax
        self.settings = settings
        self.sink = sink
        self.exchange = exchange
        self.process_id = exchange.process_id if exchange else 0
        self.devices = list(jax.devices())
        self.local = [d for d in self.devices if d.process_index == jax.process_index()]
        self.coverage = Coverage()
        self.checks: list[Check] = []
        self.is_cpu = self.devices[0].platform == "cpu"
        self.runtime = runtime_key(jax, self.devices[0])
        self.iteration = 0

    # --- plan -----------------------------------------------------------------------------------------
    def steps(self) -> list[tuple[str, int | None]]:
        ids = [d.id for d in self.local]
        steps: list[tuple[str, int | None]] = []
        for test in self.settings.selected_tests():
            if test.startswith("collective "):
                steps += [(test, None)] if len(self.devices) > 1 else []
            elif test == "sustained":
                steps.append((test, None))
            else:
                steps += [(test, d) for d in ids]
        return steps * self.settings.iterations

    def validate(self) -> None:
        ids = [d.id for d in self.devices]
        for inject in self.settings.inject:
            if inject.device not in ids:
                from tpu_tools.collectives.mesh import id_ranges

                raise UsageError(f"--inject {inject.text()}: there is no device {inject.device} (this run's devices: "
                                 f"{id_ranges(ids)})")

    def info(self) -> dict[str, Any]:
        first = self.devices[0]
        return {"platform": first.platform, "device_kind": first.device_kind,
                "device_ids": [d.id for d in self.devices], "process_count": self.jax.process_count(),
                "total": len(self.steps()), "host": socket.gethostname(), "runtime": self.runtime}

    def run(self) -> None:
        self.validate()
        self.sink.plan(self.info())
        for iteration in range(self.settings.iterations):
            self.iteration = iteration
            self._run_once()

    def _run_once(self) -> None:
        selected = self.settings.selects
        for test, body in (("compile", self._compile), ("known-answer", self._known_answer),
                           ("transfer", self._transfer)):
            if selected(test):
                for device in self.local:
                    self._per_device(test, device, body)
        times: dict[int, float] = {}
        for dtype in GEMM_DTYPES if self.settings.level >= 2 else ():
            if selected(f"gemm {dtype}") or selected("rate") and dtype == "f32":
                self._gemm(dtype, times, judged=selected(f"gemm {dtype}"))
            if selected(f"gemm {dtype} exact"):
                self._exact_gemm(dtype)
        if self.settings.level >= 2 and selected("rate"):
            self._rate(times)
        for name in MEMORY_PATTERNS if self.settings.level >= 2 else ():
            if selected(f"memory {name}"):
                self._memory(name)
        collectives = [name for name in COLLECTIVES if self.settings.level >= 2 and selected(f"collective {name}")]
        if collectives and len(self.devices) < 2:
            if self.iteration == 0:
                self.sink.note("one device: no collectives or links to test")
        else:
            for name in collectives:
                self._collective(name)
        long_patterns = [name for name in LONG_MEMORY_PATTERNS
                         if self.settings.level >= 4 and selected(f"memory long {name}")]
        if long_patterns:
            self._long_memory(long_patterns)
        if self.settings.level >= 3 and selected("sustained"):
            self._sustained()

    # --- helpers --------------------------------------------------------------------------------------
    def _emit(self, check: Check) -> None:
        check.process_id = self.process_id
        check.iteration = self.iteration
        self.checks.append(check)
        self.sink.check(check)

    def _gather(self, name: str, payload: dict[str, Any]) -> list[dict[str, Any]] | None:
        """Every process's `payload` on process 0 (None on the others); one name per repeat of the run."""
        if self.exchange is None:
            return [payload]
        return self.exchange.gather(f"{self.iteration}/{name}", payload)

    def _injected(self, kind: str, device: Any) -> bool:
        inject = self.settings.injected(kind)
        return inject is not None and inject.device == device.id

    def _per_device(self, test: str, device: Any, body: Callable[[Any], Check]) -> Check:
        self.sink.begin(test, device.id)
        start = time.perf_counter()
        try:
            check = body(device)
        except Exception as error:  # noqa: BLE001 a device that errors fails its test; an allocation that fails skips it
            status = SKIP if is_out_of_memory(error) else FAIL
            prefix = "out of memory: " if status == SKIP else ""
            check = Check(test, status, prefix + f"{type(error).__name__}: {_first_line(error)}")
        check.test, check.device = test, device.id
        check.duration_s = round(time.perf_counter() - start, 4)
        self._emit(check)
        return check

    def _put(self, value: Any, device: Any) -> Any:
        return self.jax.device_put(value, device)

    # --- level 1 ----------------------------------------------------------------------------------------
    def _compile(self, device: Any) -> Check:
        from tpu_tools.pjrt.probe import probe_device

        probe = probe_device(self.jax, device)
        figures = {"compile_ms": probe.compile_ms, "execute_us": probe.execute_us}
        if probe.ok:
            return Check("compile", PASS, f"compiled in {probe.compile_ms:.1f} ms, ran in {probe.execute_us:.0f} us",
                         figures=figures)
        return Check("compile", FAIL, probe.error or "the probe failed", figures=figures)

    def _known_answer(self, device: Any) -> Check:
        size = self.settings.kat_size
        a, b = kernels.small_ints(size, 7, 3), kernels.small_ints(size, 5, 1)
        expected = kernels.known_answers(a, b)
        x, y = self._put(a.astype(np.int32), device), self._put(b.astype(np.int32), device)
        problems = []
        for position, (name, program) in enumerate(kernels.known_answer_programs().items()):
            result = program(x, y)
            if position == 0 and self._injected("kat", device):
                result = kernels.flip_bit(result)
            got = np.asarray(result)
            want = expected[name]
            bits = np.dtype(f"u{want.dtype.itemsize}")
            wrong = int(np.count_nonzero(got.reshape(-1).view(bits) != want.reshape(-1).view(bits)))
            if wrong:
                problems.append(f"{name}: {wrong} of {want.size} values wrong")
        names = ", ".join(kernels.known_answer_programs())
        if problems:
            return Check("known-answer", FAIL, "; ".join(problems))
        return Check("known-answer", PASS, f"exact: {names}")

    def _transfer(self, device: Any) -> Check:
        words = self.settings.transfer_bytes // 4
        host = np.random.default_rng(self.settings.seed + device.id).integers(0, 1 << 32, words, dtype=np.uint32)
        want = host_digest(host)
        start = time.perf_counter()
        buffer = self._put(host, device).block_until_ready()
        h2d_s = time.perf_counter() - start
        if self._injected("transfer", device):
            buffer = kernels.flip_bit(buffer)
        on_device = digest_text(kernels.digest_program()(buffer))
        start = time.perf_counter()
        back = np.asarray(buffer)
        d2h_s = time.perf_counter() - start
        figures = {"bytes": host.nbytes, "h2d_gbps": round(host.nbytes / h2d_s / 1e9, 3) if h2d_s else None,
                   "d2h_gbps": round(host.nbytes / d2h_s / 1e9, 3) if d2h_s else None}
        if on_device != want:
            return Check("transfer", FAIL, f"host-to-device: the device's digest {on_device} is not the host's "
                                           f"{want}", figures=figures)
        wrong = int(np.count_nonzero(back != host))
        if wrong:
            return Check("transfer", FAIL, f"device-to-host: {wrong} of {host.size} words wrong", figures=figures)
        return Check("transfer", PASS, f"{host.nbytes >> 20} MiB both ways, digests match", figures=figures)

    # --- level 2 ----------------------------------------------------------------------------------------
    def _gemm(self, dtype: str, times: dict[int, float], judged: bool = True) -> None:
        test = f"gemm {dtype}"
        size = self.settings.gemm_size
        a, b = kernels.gemm_inputs(dtype, size, self.settings.seed)
        program = kernels.gemm_program()
        table = DigestTable()
        for device in self.local:
            self.sink.begin(test, device.id)
            begun = time.perf_counter()
            try:
                x, y = self._put(a, device), self._put(b, device)
                digests = []
                samples = []
                for _ in range(2 if dtype != "f32" else 4):
                    start = time.perf_counter()
                    product, words = program(x, y)
                    if self._injected("gemm", device):
                        words = kernels.digest_program()(kernels.flip_bit(product))
                    digests.append(digest_text(words))
                    samples.append(time.perf_counter() - start)
                table.runs[device.id] = digests[:2]
                table.kinds[device.id] = device.device_kind
                table.durations[device.id] = round(time.perf_counter() - begun, 4)
                if dtype == "f32":
                    times[device.id] = statistics.median(samples[1:])  # the first run pays for the compile
            except Exception as error:  # noqa: BLE001 a device that errors fails its check; the other devices run
                self._emit(_error_check(test, device.id, error))
        self.coverage.add_dtype(dtype)
        if judged:
            key = digest_key(self.runtime, test, [size, size], dtype, self.settings.seed)
            self._judge(test, table, f"{dtype} {size}x{size} product", key)

    def _exact_gemm(self, dtype: str) -> None:
        """Inputs whose exact product the host knows: the device is judged alone, value for value."""
        test = f"gemm {dtype} exact"
        size = self.settings.gemm_size
        a, b, want = kernels.exact_gemm_inputs(dtype, size)
        program = kernels.gemm_program()
        bits = np.dtype(f"u{want.dtype.itemsize}")
        expected = want.reshape(-1).view(bits)

        def body(device: Any) -> Check:
            product, _ = program(self._put(a, device), self._put(b, device))
            if self._injected("gemm", device):
                product = kernels.flip_bit(product)
            got = np.asarray(product).reshape(-1).view(bits)
            wrong = np.flatnonzero(got != expected)
            what = f"{dtype} {size}x{size} product of small integers"
            if wrong.size:
                first = int(wrong[0])
                return Check(test, FAIL, f"{what}: {wrong.size} of {expected.size} values differ from the exact "
                                         f"answer (first at [{first // size}, {first % size}])",
                             figures={"wrong": int(wrong.size)})
            return Check(test, PASS, f"{what}: every value exact", figures={"values": int(expected.size)})

        for device in self.local:
            self._per_device(test, device, body)

    def _judge(self, test: str, table: DigestTable, what: str, key: dict[str, Any] | None = None) -> None:
        """Every process's digests of `test`, judged on process 0 against the majority of each device kind."""
        payload: dict[str, Any] = {"runs": {str(k): v for k, v in table.runs.items()},
                   "kinds": {str(k): v for k, v in table.kinds.items()},
                   "durations": {str(k): v for k, v in table.durations.items()}}
        gathered = self._gather(f"digest/{test}", payload)
        if gathered is None:
            return
        runs: dict[int, list[str]] = {}
        kinds: dict[int, str] = {}
        durations: dict[int, float] = {}
        for entry in gathered:
            runs.update({int(k): v for k, v in entry["runs"].items()})
            kinds.update({int(k): v for k, v in entry["kinds"].items()})
            durations.update({int(k): v for k, v in entry["durations"].items()})
        for kind in sorted(set(kinds.values())):
            group = {d: r for d, r in runs.items() if kinds[d] == kind}
            for judgement in judge_digests(group, what):
                figures: dict[str, Any] = {"digest": group[judgement.device][0]}
                if key is not None:  # its key names the device kind: judged with devices of its own kind only
                    kind_key = {**key, "device_kind": kind}
                    figures.update(key=key_id(kind_key), key_fields=kind_key)
                check = _judged(test, judgement, figures)
                check.duration_s = durations.get(judgement.device, 0.0)
                self._emit(check)

    def _rate(self, times: dict[int, float]) -> None:
        gathered = self._gather("rate", {str(k): v for k, v in times.items()})
        if gathered is None:
            return
        merged = {int(k): v for entry in gathered for k, v in entry.items()}
        flops = 2 * self.settings.gemm_size ** 3
        for judgement in rate_outliers(merged, self.settings.rate_threshold, judged=not self.is_cpu):
            seconds = merged[judgement.device]
            self._emit(_judged("rate", judgement, {"time_s": round(seconds, 6),
                                                   "gflops": round(flops / seconds / 1e9, 3) if seconds else None}))

    def _memory(self, name: str) -> None:
        test = f"memory {name}"
        write, check_buffer = None, None
        frees = {device.id: free_bytes(device, len(self.local)) for device in self.local}
        known = [free for free in frees.values() if free is not None]
        # One size on every device, so that their digests compare: the share of the least free memory.
        words = pattern_words(min(known) if known else None, self.settings.memory_fraction)
        if self.settings.memory_bytes is not None:
            words = max(1, self.settings.memory_bytes // 4)
        for device in self.local:
            self.sink.begin(test, device.id)
            start = time.perf_counter()
            free = frees[device.id]
            figures: dict[str, Any] = {"bytes": words * 4, "free_bytes": free}
            try:
                write, check_buffer = kernels.memory_programs(name, words)
                seed = self._put(np.uint32(self.settings.seed & 0xFFFFFFFF), device)
                buffer = write(seed).block_until_ready()
                if self._injected("memory", device):
                    buffer = kernels.flip_bit(buffer)
                wrong_words, words_digest = check_buffer(buffer, seed)
                wrong = int(wrong_words)
                digest = digest_text(words_digest)
                del buffer
            except Exception as error:  # noqa: BLE001 a device that errors fails its check; the other devices run
                check = _error_check(test, device.id, error)
                check.figures = figures
                self._emit(check)
                continue
            covered = self.coverage.device(device.id)
            covered.memory_tested_bytes = max(covered.memory_tested_bytes, words * 4)
            if covered.memory_free_bytes is None:
                covered.memory_free_bytes = free
            figures["digest"] = digest
            size = _mib(words * 4)
            if wrong:
                check = Check(test, FAIL, f"{wrong} of {words} words read back wrong ({size})", figures=figures)
            else:
                check = Check(test, PASS, f"{size} written and read back exactly", figures=figures)
            check.device, check.duration_s = device.id, round(time.perf_counter() - start, 4)
            self._emit(check)
        del write, check_buffer

    def _collective(self, name: str) -> None:
        from tpu_tools.diag.links import run_collective

        test = f"collective {name}"
        self.sink.begin(test, None)
        start = time.perf_counter()
        inject = self.settings.injected("collective")
        target = inject.device if inject is not None else None
        try:
            outcome = run_collective(self.jax, name, self.settings.collective_elements,
                                     target if name == "ring +1" else None)
        except Exception as error:  # noqa: BLE001 a collective that errors fails its check; the other tests run
            self._emit(_error_check(test, None, error))
            return
        for link in outcome.links:
            self.coverage.add_link(link)
        local: list[dict[str, Any]] = [{"device": w.device, "link": w.link, "wrong": w.wrong, "checked": w.checked}
                                       for w in outcome.wrong]
        gathered = self._gather(f"collective/{name}", {"wrong": local})
        if gathered is None:
            return
        wrong: list[dict[str, Any]] = [w for entry in gathered for w in entry["wrong"]]
        elapsed = round(time.perf_counter() - start, 4)
        if not wrong:
            self._emit(Check(test, PASS, f"exact on {len(self.devices)} devices, {len(outcome.links)} links",
                             duration_s=elapsed, figures={"elements": self.settings.collective_elements}))
        for item in wrong:
            place = f"over link {item['link']}" if item["link"] else f"on device {item['device']}"
            self._emit(Check(test, FAIL, f"{item['wrong']} of {item['checked']} values wrong {place}",
                             device=item["device"], link=item["link"], duration_s=elapsed))

    # --- level 4 ----------------------------------------------------------------------------------------
    def _long_memory(self, patterns: list[str]) -> None:
        """Most of each device's free memory, held at once in chunks, under every long pattern; the time it
        will take is measured on the first pattern of the first device and said before the rest runs."""
        frees = {device.id: free_bytes(device, len(self.local)) for device in self.local}
        known = [free for free in frees.values() if free is not None]
        total = pattern_words(min(known) if known else None, self.settings.long_memory_fraction)
        if self.settings.memory_bytes is not None:
            total = max(1, self.settings.memory_bytes // 4)
        chunk = min(total, LONG_CHUNK_WORDS)
        chunks = max(1, total // chunk)
        seed_value = np.uint32(self.settings.seed & 0xFFFFFFFF)
        estimated = False
        for name in patterns:
            test = f"memory long {name}"
            write, check_chunk = kernels.long_memory_programs(name, chunk)
            for device in self.local:
                self.sink.begin(test, device.id)
                start = time.perf_counter()
                figures: dict[str, Any] = {"bytes": chunks * chunk * 4, "chunks": chunks,
                                           "free_bytes": frees[device.id]}
                wrong = 0
                try:
                    seed = self._put(seed_value, device)
                    firsts = [self._put(np.uint32(i * chunk), device) for i in range(chunks)]
                    buffers = [write(seed, first).block_until_ready() for first in firsts]
                    if self._injected("memory", device):
                        buffers[-1] = kernels.flip_bit(buffers[-1])
                    for buffer, first in zip(buffers, firsts):
                        count, _ = check_chunk(buffer, seed, first)
                        wrong += int(count)
                    del buffers
                except Exception as error:  # noqa: BLE001 a device that errors fails its check; the other devices run
                    check = _error_check(test, device.id, error)
                    check.figures = figures
                    check.duration_s = round(time.perf_counter() - start, 4)
                    self._emit(check)
                    continue
                covered = self.coverage.device(device.id)
                covered.memory_tested_bytes = max(covered.memory_tested_bytes, chunks * chunk * 4)
                if covered.memory_free_bytes is None:
                    covered.memory_free_bytes = frees[device.id]
                size = _mib(chunks * chunk * 4)
                seconds = time.perf_counter() - start
                figures["gbps"] = round(2 * chunks * chunk * 4 / seconds / 1e9, 3) if seconds else None
                if wrong:
                    check = Check(test, FAIL, f"{wrong} of {chunks * chunk} words read back wrong ({size} in {chunks} "
                                              "buffers)", figures=figures)
                else:
                    check = Check(test, PASS, f"{size} in {chunks} buffer(s) written and read back exactly",
                                  figures=figures)
                check.device, check.duration_s = device.id, round(seconds, 4)
                self._emit(check)
                if not estimated:
                    self._estimate(seconds, chunks, chunk, len(patterns))
                    estimated = True

    def _estimate(self, first_s: float, chunks: int, chunk: int, patterns: int) -> None:
        """Say how long the long memory test will take, from its first pattern on the first device."""
        seconds = first_s * (patterns * len(self.local) - 1)
        self.sink.note(f"-r 4 long memory: {_mib(chunks * chunk * 4)} per device on {len(self.local)} device(s), "
                       f"{patterns} patterns: about {_duration(seconds)} more"
                       + (f", then {_duration(self.settings.duration_s)} of sustained load"
                          if self.settings.selects("sustained") else ""))

    # --- level 3 ----------------------------------------------------------------------------------------
    def _sustained(self) -> None:
        from tpu_tools.diag.telemetry import Telemetry

        test = "sustained"
        self.sink.begin(test, None)
        size, duration = self.settings.sustained_size, self.settings.duration_s
        program = kernels.gemm_program()
        telemetry = Telemetry(self.devices[0].platform)
        start = time.monotonic()
        iteration = 0
        first_bad: tuple[int, list[int]] | None = None
        while self._go_on(iteration, iteration < 2 or time.monotonic() - start < duration):
            a, b = kernels.gemm_inputs("bf16", size, self.settings.seed + iteration)
            runs: dict[str, list[str]] = {}
            for device in self.local:
                product, words = program(self._put(a, device), self._put(b, device))
                if iteration >= 1 and self._injected("sustained", device):
                    words = kernels.digest_program()(kernels.flip_bit(product))
                runs[str(device.id)] = [digest_text(words)]
            gathered = self._gather(f"sustained/{iteration}", runs)
            if gathered is not None and first_bad is None:
                merged = {int(k): v for entry in gathered for k, v in entry.items()}
                bad = [j.device for j in judge_digests(merged) if j.status == FAIL]
                if bad:
                    first_bad = (iteration, bad)
            iteration += 1
            telemetry.sample()
            self.sink.tick(f"{time.monotonic() - start:.0f}/{duration:.0f} s")
        elapsed = round(time.monotonic() - start, 3)
        figures: dict[str, Any] = {"iterations": iteration, "duration_s": elapsed, **telemetry.figures()}
        if self.process_id != 0:
            return
        if first_bad is not None:
            at, devices = first_bad
            for device_id in devices:
                self._emit(Check(test, FAIL, f"digest differs from the majority first at iteration {at} of "
                                             f"{iteration}", device=device_id, duration_s=elapsed, figures=figures))
            return
        warnings = telemetry.warnings()
        status = WARN if warnings else PASS
        why = "; ".join(warnings) or f"{iteration} iterations over {elapsed:.0f} s, every digest agreed"
        self._emit(Check(test, status, why, duration_s=elapsed, figures=figures))


    def _go_on(self, iteration: int, mine: bool) -> bool:
        """Every process runs the same iterations: process 0's clock decides when to stop."""
        if self.exchange is None:
            return mine
        step = SUSTAINED_STEP * (self.iteration + 1) + iteration  # unique over the run's --iterations too
        return self.exchange.decide(step, "go" if mine else "stop") == "go"


SUSTAINED_STEP = 1_000_000
LONG_CHUNK_WORDS = 64 << 20  # 256 MiB per buffer: a device's share is held as many, allocated together


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:300] if text else ""


def _error_check(test: str, device: int | None, error: BaseException) -> Check:
    if is_out_of_memory(error):
        return Check(test, SKIP, f"out of memory: {_first_line(error)}", device=device)
    return Check(test, FAIL, f"{type(error).__name__}: {_first_line(error)}", device=device)


def _judged(test: str, judgement: Judgement, figures: dict[str, Any]) -> Check:
    return Check(test, judgement.status, judgement.why, device=judgement.device, figures=figures)


def _mib(size: int) -> str:
    return f"{size / (1 << 20):.1f} MiB"


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
