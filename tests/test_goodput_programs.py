"""FLOPs per step from the programs JAX builds: which programs are the step's (the ledger's rule), and the
watcher of JAX's compile-or-load function, which leaves a JAX without it alone."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from agentjobs import make_rundir, remove_rundir
from conftest import clean_env
from test_goodput import Clock, ledger

from tpu_tools.instrument.goodput import PROGRAMS_SOURCE
from tpu_tools.instrument.programs import ProgramWatcher, executable_flops, module_name


def test_the_programs_compiled_in_a_step_block_are_the_steps_and_set_up_programs_are_not():
    clock = Clock()
    book = ledger(clock)
    book.add_program("jit_init", 5e12)  # before the first block: set-up
    book.begin_step()
    book.add_program("jit_train_step", 1e9)
    with book.phase("eval"):  # compiled inside a phase, even inside a step: not the step's
        book.add_program("jit_eval", 7e12)
    clock.advance(0.1)
    book.end_step()
    book.begin_step()
    clock.advance(0.1)
    book.end_step()
    figures = book.snapshot()
    assert figures["step_flops"] == 1e9
    assert figures["step_flops_source"] == PROGRAMS_SOURCE
    assert figures["step_programs"] == [{"name": "jit_train_step", "flops": 1e9}]
    assert figures["since_start"]["flops"] == 2e9


def test_programs_between_blocks_are_dropped_a_recompile_replaces_and_the_job_figure_wins():
    clock = Clock()
    book = ledger(clock)
    book.begin_step()
    book.add_program("jit_train_step", 1e9)
    book.add_program("jit_update", 2e8)
    book.end_step()
    book.add_program("jit_log", 3e12)  # host work between steps
    book.begin_step()
    book.add_program("jit_train_step", 4e9)  # a new input shape: the step now runs this version
    book.end_step()
    assert book.snapshot()["since_start"]["flops"] == 1.2e9 + 4.2e9
    book.note_work(flops=1.0)  # the job's own figure for one step
    book.begin_step()
    book.end_step()
    book.set_step_flops(2.0, "given")  # and for every later step
    book.begin_step()
    book.end_step()
    figures = book.snapshot()
    assert figures["since_start"]["flops"] == 1.2e9 + 4.2e9 + 1.0 + 2.0
    assert figures["step_flops"] == 2.0
    assert figures["step_flops_source"] == "given"


def test_bare_steps_take_the_programs_of_the_interval_before_the_first_boundary():
    clock = Clock()
    book = ledger(clock)
    book.add_program("jit_step", 3e9)  # with bare step() the first step's start is unknown
    book.end_step()
    book.end_step()
    assert book.snapshot()["since_start"]["flops"] == 6e9


def test_programs_xla_cannot_count_leave_the_flops_unknown_never_zero():
    clock = Clock()
    book = ledger(clock)
    book.begin_step()
    book.add_program("jit_custom_call", None)
    book.add_program("jit_bad", float("nan"))
    book.end_step()
    figures = book.snapshot()
    assert figures["step_flops"] is None
    assert figures["since_start"]["flops"] is None
    assert {p["name"] for p in figures["step_programs"]} == {"jit_custom_call", "jit_bad"}


def test_xla_counts_one_run_of_a_real_executable():
    import jax
    import jax.numpy as jnp

    compiled = jax.jit(lambda a, b: a @ b).lower(jnp.ones((32, 64)), jnp.ones((64, 16))).compile()
    flops, devices = executable_flops(compiled.runtime_executable())
    assert devices == 1
    assert flops == 2 * 32 * 64 * 16
    copy = jax.jit(lambda a: a.astype(jnp.int32)).lower(jnp.ones(8)).compile()
    assert executable_flops(copy.runtime_executable())[0] is not None  # XLA leaves out a count of 0
    assert executable_flops(object()) == (None, 1)  # not an executable: unknown
    assert module_name(object()) == "?"


def test_a_jax_without_the_compile_function_is_left_alone_and_flops_stay_unknown():
    assert not ProgramWatcher("tpu_tools_no_such_module").install()
    assert not ProgramWatcher("tpu_tools.instrument.programs", "no_such_function").install()


SINKS_JOB = textwrap.dedent("""
    import json
    import jax, jax.numpy as jnp
    from tpu_tools.instrument.programs import watcher, ProgramWatcher

    seen = []
    class Failing:
        def add_program(self, program):
            raise RuntimeError("a sink that fails")
    class Keeping:
        def add_program(self, program):
            seen.append([program.name, program.flops, program.devices])
    watcher().add_sink(Failing())
    watcher().add_sink(Keeping())
    assert watcher().install() and watcher().install()
    assert ProgramWatcher().install()  # a second watcher does not wrap JAX's function again
    out = jax.jit(lambda a: a @ a)(jnp.ones((16, 16)))
    print(json.dumps({"out": float(out[0, 0]), "seen": seen}))
""")


def test_jax_gets_its_executable_whatever_a_sink_does():
    result = subprocess.run([sys.executable, "-c", SINKS_JOB], capture_output=True, text=True, timeout=120,
                            env=clean_env(JAX_PLATFORMS="cpu"))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["out"] == 16.0
    assert ["jit__lambda", 2 * 16 ** 3, 1] in report["seen"]
    assert all(name.startswith("jit_") for name, _, _ in report["seen"])


CACHED_JOB = textwrap.dedent("""
    import json, sys
    import jax, jax.numpy as jnp
    import tpu_tools.agent as agent

    hits = []
    jax.monitoring.register_event_listener(
        lambda event, **kw: hits.append(1) if event == "/jax/compilation_cache/cache_hits" else None)
    jax.config.update("jax_compilation_cache_dir", sys.argv[1])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    step = jax.jit(lambda w, x: jnp.tanh(x @ w) @ w.T)
    w, x = jnp.ones((128, 64)), jnp.ones((32, 128))
    for _ in range(2):
        with agent.step_context():
            step(w, x).block_until_ready()
    print(json.dumps({"goodput": agent.goodput(), "hits": len(hits)}))
""")


def test_a_program_read_from_the_persistent_compilation_cache_is_counted_too(tmp_path):
    rundir = make_rundir()
    try:
        (rundir / "job.py").write_text(CACHED_JOB)
        reports = []
        for _ in range(2):  # the second run loads the step from the cache instead of compiling it
            result = subprocess.run([sys.executable, "-m", "tpu_tools.agent", str(rundir / "job.py"),
                                     str(tmp_path / "cache")], capture_output=True, text=True, timeout=120,
                                    env=clean_env(JAX_PLATFORMS="cpu", TPU_TOOLS_RUNTIME_DIR=str(rundir)))
            assert result.returncode == 0, result.stderr
            reports.append(json.loads(result.stdout.strip().splitlines()[-1]))
    finally:
        remove_rundir(rundir)
    assert reports[0]["hits"] == 0
    assert reports[1]["hits"] > 0
    expected = 2 * 32 * 128 * 64 * 2  # two matrix products; XLA adds the tanh's elementwise work
    for goodput in (report["goodput"] for report in reports):
        assert goodput["step_flops_source"] == "xla_step_programs"
        assert expected <= goodput["step_flops"] <= expected * 1.02
        assert goodput["since_start"]["flops"] == 2 * goodput["step_flops"]
