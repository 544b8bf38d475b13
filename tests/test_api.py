"""`tpu_tools.api`: the examples of docs/api.md run against a fixture host whose chips are partly held, libtpu's
metrics service stand-in and a real job with the agent; the caller never imports jax."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap

import sysroot
from agentjobs import agent_env, rundir, start_job  # noqa: F401 (rundir is a fixture)
from conftest import REPO, clean_env
from libtpu_server import FIXTURES, FakeMetricsService

EXAMPLES = re.findall(r"```python\n(.*?)```", (REPO / "docs" / "api.md").read_text(), re.S)

RUNNER = textwrap.dedent('''
    import json, logging, sys
    notebook, logger = json.loads(sys.argv[1])
    exec(compile(notebook, "notebook", "exec"), {})
    print("--- logger")
    logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(levelname)s %(message)s")
    namespace = {}
    exec(compile(logger, "logger", "exec"), namespace)
    namespace["log_jobs"](period_s=0.05, rounds=2)
    from tpu_tools import api
    job = api.job(int(sys.argv[2]))
    print("--- job", json.dumps({"tag": job.tag, "steps": job.steps.count, "rate": job.steps_per_s}))
    try:
        api.job(1)
    except api.AgentGone as error:
        print("--- gone", error)
    print("--- jax", sorted(name for name in sys.modules if name == "jax" or name.startswith(("jax.", "jaxlib"))))
''')


def test_the_documented_examples_run_and_never_import_jax(tmp_path, rundir):  # noqa: F811
    assert len(EXAMPLES) == 2
    root = tmp_path / "root"
    sysroot.v5e_host(root, holders={3001: [0, 1], 3002: [3]})
    job = start_job(rundir, tag="logged", light=True, launcher=False).wait_ready()
    try:
        with FakeMetricsService(FIXTURES["v5e"]()) as service:
            env = agent_env(rundir, TPU_TOOLS_SYSROOT=str(root), TPU_TOOLS_LIBTPU_DEFAULT_ADDR=service.address)
            result = subprocess.run([sys.executable, "-c", RUNNER, json.dumps(EXAMPLES), str(job.process.pid)],
                                    env=env, capture_output=True, text=True, timeout=120)
    finally:
        job.stop()
    assert result.returncode == 0, result.stderr
    notebook, _, rest = result.stdout.partition("--- logger\n")
    rows = notebook.splitlines()
    assert len(rows) == 9  # eight chips and the free chips' line
    assert rows[0].split()[:3] == ["0", "TPU", "v5e"]
    assert rows[0].endswith("3001 (alice)")
    assert rows[2].endswith("free")
    assert rows[3].endswith("3002 (alice)")
    assert re.search(r"\d+\.\d / 16\.0 GiB +\d+%", rows[0])  # libtpu's HBM and duty cycle, paired with the chip
    assert rows[8].startswith("tpu: free [2, 4, 5, 6, 7]; a new job on [4, 5, 6, 7]:")
    assert "'TPU_VISIBLE_CHIPS': '4,5,6,7'" in rows[8]
    logged = [line for line in rest.splitlines() if line.startswith("INFO job")]
    assert len(logged) == 2
    assert all(f"job {job.process.pid} (logged): " in line for line in logged)
    assert re.search(r": \d+ steps, [\d.]+ steps/s", logged[-1])
    figures = json.loads(rest.split("--- job ", 1)[1].splitlines()[0])
    assert figures["tag"] == "logged"
    assert figures["steps"] >= 1
    assert "--- gone no agent is registered for process 1" in rest
    assert rest.rstrip().endswith("--- jax []")


def test_devices_with_the_runtime_asked_in_a_child_list_pjrt_devices_and_the_caller_has_no_jax():
    program = textwrap.dedent('''
        import json, sys
        from tpu_tools import api
        found = api.devices(runtime=True, metrics=False)
        print(json.dumps([[d.index, d.platform, d.device_id] for d in found]))
        print(json.dumps(sorted(name for name in sys.modules if name == "jax" or name.startswith("jax."))))
    ''')
    env = clean_env(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=3")
    result = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    listed, modules = (json.loads(line) for line in result.stdout.splitlines())
    assert listed == [[0, "cpu", 0], [1, "cpu", 1], [2, "cpu", 2]]
    assert modules == []
