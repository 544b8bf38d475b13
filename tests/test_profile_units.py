"""The pure parts of tpu-profile: explanation parsing, the trace window controller, roofline math, arg specs."""

from __future__ import annotations

import threading
import time

import pytest

from tpu_tools.accelerators import GIB
from tpu_tools.errors import UsageError
from tpu_tools.instrument.compiles import CompileEvent, CompileLog, function_name, parse_cache_miss
from tpu_tools.profile.compiles import compile_rows, recompilations
from tpu_tools.profile.window import TraceController, WindowSpec
from tpu_tools.userfn.roofline import chip_by_name, compute_dtype, roofline
from tpu_tools.userfn.specs import ArgSpec, parse_arg_spec

# Explanations exactly as jax 0.10.2 logs them.
FIRST = ("TRACING CACHE MISS at /work/prog.py:20:4 (<module>):\n  never seen function:\n"
         "    f id=140284522072160 defined at /work/prog.py:16")
SHAPE = ("TRACING CACHE MISS at /work/prog.py:20:4 (<module>):\n  for f defined at /work/prog.py:16\n"
         "  all previously seen cache keys differ. For the closest previous key:\n  different input types:\n"
         "  * at x, now f32[4] and before f32[3]")
STATIC = ("TRACING CACHE MISS at /work/prog.py:11:19 (<module>):\n  for g defined at /work/prog.py:8\n"
          "  all previously seen cache keys differ. For the closest previous key:\n  different input pytree:\n"
          "  * at input path [0][1], now <class 'jax._src.tree_util.Static'> with pytree metadata Static(val=3) "
          "and before <class 'jax._src.tree_util.Static'> with pytree metadata Static(val=2), so the pytree node "
          "metadata does not match")
REDEFINED = ("TRACING CACHE MISS at /work/prog.py:16:4 (<module>):\n  never seen function:\n"
             "    <lambda> id=140250847402784 defined at /work/prog.py:15\n"
             "  but seen another function defined on the same line; maybe the function is\n"
             "  being re-defined repeatedly, preventing caching?")


def test_parse_first_trace_and_shape_miss():
    first = parse_cache_miss(FIRST)
    assert first.function == "f"
    assert first.first_trace
    assert first.defined_at == "/work/prog.py:16"
    shape = parse_cache_miss(SHAPE)
    assert (shape.function, shape.kind, shape.first_trace) == ("f", "types", False)
    assert shape.reasons == ["at x, now f32[4] and before f32[3]"]
    assert shape.call_site == "/work/prog.py:20:4 (<module>)"


def test_parse_static_argument_and_redefined_function():
    static = parse_cache_miss(STATIC)
    assert static.kind == "pytree"
    assert static.reasons == ["static argument at input path [0][1], now 3 and before 2"]
    redefined = parse_cache_miss(REDEFINED)
    assert redefined.kind == "redefined"
    assert not redefined.first_trace
    assert "defined (or wrapped in jax.jit) again every time" in redefined.reasons[0]


def test_other_log_lines_are_not_explanations():
    assert parse_cache_miss("Finished tracing + transforming f for pjit in 0.001 sec") is None
    assert parse_cache_miss("") is None


def test_recompilations_group_by_function_and_definition():
    log = CompileLog(misses=[parse_cache_miss(m) for m in (FIRST, SHAPE, SHAPE, STATIC)])
    groups = recompilations(log, base_dir="/work")
    assert [(g.function, g.defined_at, g.recompiles) for g in groups] == [("f", "prog.py:16", 2),
                                                                          ("g", "prog.py:8", 1)]
    assert groups[0].reasons == [{"reason": "at x, now f32[4] and before f32[3]", "count": 2,
                                  "call_sites": ["prog.py:20:4 (<module>)"]}]


def test_compile_rows_sum_the_stages_and_use_trace_calls():
    events = [CompileEvent("trace", "f", 0.01, 0), CompileEvent("lowering", "f", 0.02, 0),
              CompileEvent("xla_compile", "f", 0.1, 0), CompileEvent("xla_compile", "f", 0.2, 0, True)]
    rows = compile_rows(CompileLog(events, [parse_cache_miss(FIRST)]), {"f": (9, 7)}, base_dir="/work")
    row = rows[0]
    assert (row.function, row.defined_at, row.compiles, row.traces, row.persistent_cache_hits) == \
        ("f", "prog.py:16", 2, 1, 1)
    assert row.compile_time_s == pytest.approx(0.33)
    assert (row.calls, row.cache_hits) == (9, 7)


def test_function_names_lose_their_transformation():
    assert function_name("jit(f)") == "f"
    assert function_name("jit(jit(step))") == "step"
    assert function_name("pmap(train)") == "train"
    assert function_name("f") == "f"


class RecordingTracer:
    def __init__(self, fail_start: bool = False):
        self.calls: list[str] = []
        self.fail_start = fail_start

    def start(self) -> None:
        if self.fail_start:
            raise RuntimeError("Profile has already been started")
        self.calls.append("start")

    def stop(self) -> None:
        self.calls.append("stop")


def test_whole_run_opens_when_the_runtime_is_up_and_closes_at_the_end():
    tracer = RecordingTracer()
    controller = TraceController(WindowSpec(), tracer)
    controller.begin()
    assert tracer.calls == []
    controller.runtime_ready()
    assert tracer.calls == ["start"]
    result = controller.finish()
    assert tracer.calls == ["start", "stop"]
    assert result.closed_by == "program end"
    assert result.opened


def test_time_window_waits_for_the_delay_and_stops_after_the_duration():
    tracer = RecordingTracer()
    controller = TraceController(WindowSpec(delay_s=0.2, duration_s=0.2), tracer)
    controller.begin()
    controller.runtime_ready()
    assert tracer.calls == []
    deadline = time.monotonic() + 10
    while tracer.calls != ["start", "stop"] and time.monotonic() < deadline:
        time.sleep(0.02)
    result = controller.finish()
    assert tracer.calls == ["start", "stop"]
    assert result.closed_by == "duration"
    assert result.opened_at_s >= 0.2
    assert result.closed_at_s - result.opened_at_s >= 0.2


def test_a_delay_that_passes_before_the_runtime_starts_opens_at_start_up():
    tracer = RecordingTracer()
    controller = TraceController(WindowSpec(delay_s=0.05), tracer)
    controller.begin()
    time.sleep(0.2)
    assert tracer.calls == []
    controller.runtime_ready()
    assert tracer.calls == ["start"]
    controller.finish()


def test_step_window_follows_step_events_from_any_source():
    """Events are step ends (the agent's on_step): steps 3 and 4 are traced, from the end of 2 to the end of 4."""
    tracer = RecordingTracer()
    controller = TraceController(WindowSpec(start_step=3, steps=2), tracer)
    controller.begin()
    controller.runtime_ready()
    for index in range(2):
        controller.step(index, 0.1)
    assert tracer.calls == []
    controller.step(2, 0.1)
    assert tracer.calls == ["start"]
    controller.step(3, 0.1)
    assert tracer.calls == ["start"]
    controller.step(4, 0.1)
    assert tracer.calls == ["start", "stop"]
    controller.step(5, 0.1)
    result = controller.finish()
    assert tracer.calls == ["start", "stop"]
    assert (result.first_step, result.last_step, result.closed_by) == (3, 4, "steps")


def test_a_window_from_step_0_opens_with_the_runtime():
    tracer = RecordingTracer()
    controller = TraceController(WindowSpec(start_step=0, steps=2), tracer)
    controller.begin()
    controller.runtime_ready()
    assert tracer.calls == ["start"]
    controller.step(0, 0.1)
    assert tracer.calls == ["start"]
    controller.step(1, 0.1)
    result = controller.finish()
    assert tracer.calls == ["start", "stop"]
    assert (result.first_step, result.last_step, result.closed_by) == (0, 1, "steps")


def test_step_events_from_another_thread():
    tracer = RecordingTracer()
    controller = TraceController(WindowSpec(start_step=0, steps=1), tracer)
    controller.begin()
    controller.runtime_ready()
    worker = threading.Thread(target=lambda: [controller.step(i) for i in range(3)])
    worker.start()
    worker.join(timeout=10)
    assert tracer.calls == ["start", "stop"]


def test_a_window_that_cannot_start_is_explained():
    controller = TraceController(WindowSpec(), RecordingTracer(fail_start=True))
    controller.begin()
    controller.runtime_ready()
    result = controller.finish()
    assert not result.opened
    assert "already been started" in result.note


def test_window_spec_validation():
    with pytest.raises(ValueError, match="delay must be >= 0 and duration > 0"):
        WindowSpec(duration_s=0)
    with pytest.raises(ValueError, match="needs both a first step and a number of steps"):
        WindowSpec(start_step=2)
    assert WindowSpec(start_step=2, steps=3).describe() == "steps 2 to 4"


def test_arg_specs():
    assert parse_arg_spec("f32[128,512]") == ArgSpec("f32", (128, 512))
    assert parse_arg_spec("BF16[ 8 ]") == ArgSpec("bf16", (8,))
    assert parse_arg_spec("i32[]") == parse_arg_spec("s32") == ArgSpec("s32", ())
    assert parse_arg_spec("bool[2,0]").text == "pred[2,0]"
    for bad in ("f32[128,", "float[3]", "f32[-1]", "f32[2.5]", "[3]", "", "f32[a]"):
        with pytest.raises(UsageError, match=r"^bad --arg '.*': (expected DTYPE|dimension)"):
            parse_arg_spec(bad)


def test_roofline_verdicts():
    v5e = chip_by_name("v5e")
    assert v5e.name == "TPU v5e"
    assert chip_by_name("TPU v6e").name == "TPU v6e"
    assert chip_by_name("h100")
    # A big matmul in bf16: 2*4096^3 FLOPs over 3 * 4096^2 * 2 bytes -> far above the ridge point.
    flops, moved = 2 * 4096**3, 3 * 4096**2 * 2
    compute = roofline(flops, moved, v5e, "bf16")
    assert compute.bound == "compute"
    assert compute.best_case_time_us == pytest.approx(flops / 197e12 * 1e6)
    assert compute.ridge_point_flops_per_byte == pytest.approx(197e12 / 819e9)
    # An elementwise add: 1 FLOP per 12 bytes -> memory-bound, time = bytes / bandwidth.
    memory = roofline(1 * GIB, 12 * GIB, v5e, "f32")
    assert memory.bound == "memory"
    assert memory.peak_dtype == "bf16"
    assert "default precision" in memory.note
    assert memory.best_case_time_us == pytest.approx(12 * GIB / 819e9 * 1e6)
    unknown = roofline(100.0, 10.0, None, "f32", "cpu")
    assert unknown.bound is None
    assert unknown.arithmetic_intensity_flops_per_byte == 10
    assert "cpu" in unknown.note
    assert compute_dtype(["bf16", "bf16"]) == "bf16"
    assert compute_dtype(["f32", "bf16"]) == "f32"
    assert compute_dtype(["s8", "s8"]) == "int8"


def test_chip_names_that_are_ambiguous_or_unknown():
    with pytest.raises(UsageError, match="several chips"):
        chip_by_name("v5")
    with pytest.raises(UsageError, match="not a known chip"):
        chip_by_name("z80")
