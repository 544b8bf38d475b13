"""MFU of the reference transformer: FLOPs per step from XLA's cost analysis of the compiled step, checked
against the FLOPs counted by hand (within 2 %), on the CPU platform's real runtime with two devices."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from agentjobs import Job, agent_env, make_rundir, remove_rundir
from conftest import clean_env, run_tool

# The reference transformer's data-parallel train step on the job's devices, as both jobs below set it up.
# The state and batch are filled on the host with the shapes of T.init_train_state and T.random_tokens: FLOPs
# depend on shapes only, and initialising with jax.random compiles programs that cost seconds of CPU.
TRAIN_SETUP = """
    import numpy as np
    config = T.config_for("tiny", d_model=384, n_heads=6, d_ff=1536, n_layers=1, seq_len=128, vocab_size=1024,
                          batch_per_device=4)
    devices = jax.local_devices()
    batch_size = config.batch_per_device * len(devices)
    step, state_sharding, batch_sharding = T.data_parallel_train_step(config, devices)
    rng = np.random.default_rng(0)
    shapes = jax.eval_shape(lambda: T.init_train_state(config, jax.random.key(0)))  # traced, not compiled
    zeros = lambda tree: jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), tree)
    state = jax.device_put({
        "params": jax.tree.map(lambda s: (0.02 * rng.standard_normal(s.shape)).astype(s.dtype), shapes["params"]),
        "mu": zeros(shapes["mu"]), "nu": zeros(shapes["nu"]), "step": zeros(shapes["step"])}, state_sharding)
    batch = jax.device_put(rng.integers(0, config.vocab_size, (batch_size, config.seq_len + 1), np.int32),
                           batch_sharding)
"""

SCRIPT = textwrap.dedent("""
    import json
    import jax
    import tpu_tools.agent as agent
    from tpu_tools.workloads import transformer as T
""" + TRAIN_SETUP + """
    with agent.phase("warmup"):
        compiled = step.lower(state, batch).compile()
    xla = agent.step_flops(compiled)
    for _ in range(3):
        with agent.step_context(samples=batch_size):
            state, loss = compiled(state, batch)
            loss.block_until_ready()
    print(json.dumps({"xla": xla, "hand": T.train_step_flops(config, batch_size), "figures": agent.goodput()}))
""")


def test_xla_flops_of_the_reference_step_match_the_hand_count_and_make_mfu():
    rundir = make_rundir()
    try:
        env = clean_env(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=2",
                        TPU_TOOLS_RUNTIME_DIR=str(rundir), TPU_TOOLS_PEAK_FLOPS="2e12")
        (rundir / "mfu_job.py").write_text(SCRIPT)
        result = subprocess.run([sys.executable, "-m", "tpu_tools.agent", str(rundir / "mfu_job.py")],
                                capture_output=True, text=True, env=env, timeout=300)
        assert result.returncode == 0, result.stderr
        report = json.loads(result.stdout.strip().splitlines()[-1])
    finally:
        remove_rundir(rundir)
    assert abs(report["xla"] / report["hand"] - 1) < 0.02, report
    figures = report["figures"]
    since = figures["since_start"]
    assert figures["step_flops_source"] == "xla_cost_analysis"
    assert figures["peak_flops_per_s"] == 2e12
    assert since["flops"] == 3 * report["xla"]
    assert since["samples"] == 24
    assert abs(since["mfu_percent"] - 100 * since["flops"] / since["wall_s"] / 2e12) < 1e-9
    assert since["causes_s"]["compile"] > 0  # the agent heard the compile through JAX's monitoring events


AUTOMATIC_JOB = textwrap.dedent("""
    import json, sys, time
    import jax, jax.numpy as jnp
    import tpu_tools.agent as agent
    from tpu_tools.workloads import transformer as T
""" + TRAIN_SETUP + """
    square = jax.jit(lambda m: m @ m)
    m = jnp.ones((512, 512))
    square(m).block_until_ready()  # set-up before the loop (0.27 GFLOP): not the step's
    for index in range(3):
        with agent.step_context(samples=batch_size):
            state, loss = step(state, batch)  # compiled in the first step: no step_flops() anywhere
            loss.block_until_ready()
            if index == 0:
                with agent.phase("eval"):  # compiled inside a phase: not the step's
                    jax.jit(lambda m: m @ m @ m)(m).block_until_ready()
    with open(sys.argv[1] + ".tmp", "w") as out:
        json.dump({"hand": T.train_step_flops(config, batch_size)}, out)
    import os
    os.rename(sys.argv[1] + ".tmp", sys.argv[1])
    time.sleep(120)  # until the test has read the figures through tpu-monitor and stops the job
""")


def test_flops_of_the_steps_programs_are_read_automatically_and_shown_by_tpu_monitor():
    rundir = make_rundir()
    workdir = rundir / "job"
    workdir.mkdir()
    (workdir / "job.py").write_text(AUTOMATIC_JOB)
    ready = workdir / "ready"
    env = agent_env(rundir, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=2",
                    TPU_TOOLS_PEAK_FLOPS="2e12")
    process = subprocess.Popen([sys.executable, "-m", "tpu_tools.agent", "--tag", "auto", str(workdir / "job.py"),
                                str(ready)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               stdin=subprocess.DEVNULL)
    job = Job(process, ready, workdir)
    try:
        job.wait_ready(timeout=240)
        hand = json.loads(Path(ready).read_text())["hand"]
        result = run_tool("tpu-monitor", "--count", "1", env=agent_env(rundir))
    finally:
        job.stop()
        remove_rundir(rundir)
    assert result.returncode == 0, result.stderr
    [entry] = json.loads(result.stdout)["processes"]["agents"]
    goodput = entry["goodput"]
    assert goodput["step_flops_source"] == "xla_step_programs", goodput
    assert [p["name"] for p in goodput["step_programs"]] == ["jit_train_step"]
    assert abs(goodput["step_flops"] / hand - 1) < 0.02, (goodput["step_flops"], hand)
    since = goodput["since_start"]
    assert since["flops"] == 3 * goodput["step_flops"]
    assert since["samples"] == 24
    assert since["mfu_percent"] > 0


CHECKPOINT_JOB = textwrap.dedent("""
    import json, time
    import jax, jax.numpy as jnp
    import tpu_tools.agent as agent

    for _ in range(3):
        with agent.step_context():
            jnp.ones(4).block_until_ready()
    started = time.perf_counter()
    time.sleep(0.3)  # a save that blocks the training thread, as Orbax reports it through jax.monitoring
    blocked = time.perf_counter() - started
    jax.monitoring.record_event_duration_secs("/jax/orbax/write/blocking_duration_secs", blocked)
    phase_started = time.perf_counter()
    with agent.phase("checkpoint"):  # a labelled save with Orbax's report inside it: counted once
        started = time.perf_counter()
        time.sleep(0.2)
        jax.monitoring.record_event_duration_secs("/jax/checkpoint/write/async/blocking_duration_secs",
                                                  time.perf_counter() - started)
    truth = blocked + time.perf_counter() - phase_started
    print(json.dumps({"truth": truth, "causes": agent.goodput()["since_start"]["causes_s"]}))
""")


def test_orbax_blocking_saves_are_checkpoint_time():
    rundir = make_rundir()
    try:
        (rundir / "job.py").write_text(CHECKPOINT_JOB)
        result = subprocess.run([sys.executable, "-m", "tpu_tools.agent", str(rundir / "job.py")],
                                capture_output=True, text=True, timeout=120,
                                env=clean_env(JAX_PLATFORMS="cpu", TPU_TOOLS_RUNTIME_DIR=str(rundir)))
        assert result.returncode == 0, result.stderr
        report = json.loads(result.stdout.strip().splitlines()[-1])
    finally:
        remove_rundir(rundir)
    assert abs(report["causes"]["checkpoint"] - report["truth"]) <= 0.02, report
    assert report["truth"] >= 0.5
