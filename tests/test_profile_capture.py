"""`tpu-profile capture` from a real JAX process running the profiler server.

jax's profiler server listens on every interface, so the server and the capture
run inside a network namespace of their own that has only a loopback interface.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import REPO, assert_one_line_error, clean_env, run_tool, tool_command

SERVER = """
    import sys
    import time
    import jax
    import jax.numpy as jnp

    jax.profiler.start_server(int(sys.argv[1]))


    @jax.jit
    def serve_step(x):
        return jnp.tanh(x @ x)


    x = jnp.ones((64, 64)) / 64
    serve_step(x).block_until_ready()
    print("ready", flush=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        x = serve_step(x).block_until_ready()
        time.sleep(0.001)
"""

DRIVER = """
    import json
    import subprocess
    import sys

    tool, server_script = sys.argv[1], sys.argv[2]
    server = subprocess.Popen([sys.executable, server_script, "9999"], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)
    results = {}
    try:
        results["ready"] = server.stdout.readline()
        for name, args in (("ok", ["--addr", "127.0.0.1:9999", "--duration", "0.5", "--out", "cap", "--json"]),
                           ("nobody", ["--addr", "127.0.0.1:9998", "--duration", "0.2", "--out", "none"])):
            done = subprocess.run([tool, "capture", *args], capture_output=True, text=True, timeout=120)
            results[name] = {"rc": done.returncode, "stdout": done.stdout, "stderr": done.stderr}
    finally:
        server.kill()
        server.wait()
    with open("results.json", "w") as handle:
        json.dump(results, handle)
"""


def _client_installed() -> bool:
    try:
        import xprof  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.fixture(scope="module")
def captured(tmp_path_factory) -> tuple[dict, Path]:
    if not _client_installed():
        pytest.skip("the profiler client package xprof is not installed")
    if not shutil.which("unshare") or not shutil.which("ip"):
        pytest.skip("unshare and ip are needed to keep the profiler server on a private loopback")
    folder = tmp_path_factory.mktemp("capture")
    (folder / "server.py").write_text(textwrap.dedent(SERVER))
    (folder / "driver.py").write_text(textwrap.dedent(DRIVER))
    command = f"ip link set lo up && exec {sys.executable} driver.py {tool_command('tpu-profile')[0]} server.py"
    result = subprocess.run(["unshare", "--map-root-user", "--net", "sh", "-c", command], cwd=folder,
                            env=clean_env(JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO)), capture_output=True,
                            text=True, timeout=300)
    if result.returncode != 0 and not (folder / "results.json").exists():
        pytest.skip(f"no private network namespace here: {result.stderr.strip()[-200:]}")
    return json.loads((folder / "results.json").read_text()), folder


def test_capture_from_a_running_program(captured):
    results, folder = captured
    assert results["ready"] == "ready\n"
    ok = results["ok"]
    assert ok["rc"] == 0, ok["stderr"]
    document = json.loads(ok["stdout"])  # nothing but the document on stdout
    assert document["schema"] == "tpu-tools/profile/v1"
    assert document["source"] == "capture"
    assert document["top_ops"][0]["module"] == "jit_serve_step"
    assert document["host_dispatch"]["dispatches"] > 0
    assert document["trace"]["duration_us"] >= 0.3e6  # the capture lasted (a loaded machine only lengthens it)
    assert document["trace"]["perfetto_file"]
    assert Path(document["trace"]["perfetto_file"]).exists()
    assert (folder / "cap" / "summary.json").exists()
    assert (folder / "cap" / "report.txt").exists()
    assert list((folder / "cap" / "trace" / "plugins" / "profile").glob("*/*.xplane.pb"))
    assert "profile written to cap" in ok["stderr"]


def test_capture_when_nothing_listens(captured):
    nobody = captured[0]["nobody"]
    assert nobody["rc"] == 1
    assert "Traceback" not in nobody["stderr"]
    assert "could not capture a trace from 127.0.0.1:9998" in nobody["stderr"]
    assert "jax.profiler.start_server(9998)" in nobody["stderr"]
    assert nobody["stdout"] == ""
    assert not (captured[1] / "none").exists()  # a failed capture leaves no folder behind


def test_capture_without_the_client_package_names_it(tmp_path):
    blocked = ("import sys; sys.modules['xprof'] = None; sys.argv = ['tpu-profile'] + sys.argv[1:]; "
               "from tpu_tools.cli.profile import main; main()")
    result = subprocess.run([sys.executable, "-c", blocked, "capture", "--addr", "127.0.0.1:9999"],
                            capture_output=True, text=True, cwd=tmp_path, env=clean_env(), timeout=60)
    assert_one_line_error(result, 1, "needs the profiler client package 'xprof'", "pip install xprof")
    assert not list(tmp_path.iterdir())  # nothing written


def test_bad_address():
    assert_one_line_error(run_tool("tpu-profile", "capture", "--addr", "localhost"), 2, "bad --addr 'localhost'")
    assert_one_line_error(run_tool("tpu-profile", "capture", "--addr", "127.0.0.1:70000"), 2, "bad --addr")
    assert_one_line_error(run_tool("tpu-profile", "capture", "--addr", "127.0.0.1:9", "--duration", "0"), 2,
                          "--duration")
