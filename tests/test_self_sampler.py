"""The agent's figures of its own process: read from a stat file kept open, right after CPU work and after a fork."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from conftest import clean_env

SCRIPT = textwrap.dedent("""
    import json, os, threading, time
    from tpu_tools.metrics.process import SelfSampler

    def burn(seconds):
        started = time.process_time()
        while time.process_time() - started < seconds:
            pass

    sampler = SelfSampler()
    first = sampler.sample()
    burn(0.3)
    waiting = threading.Event()
    threads = [threading.Thread(target=waiting.wait) for _ in range(5)]
    for thread in threads:
        thread.start()
    second = sampler.sample()
    waiting.set()
    for thread in threads:
        thread.join()
    read_r, read_w = os.pipe()
    child = os.fork()
    if child == 0:  # the parent's sampler, in the child: the child's own figures
        in_child = sampler.sample()
        os.write(read_w, json.dumps({"pid": in_child.pid, "cpu": in_child.cpu_time_s,
                                     "threads": in_child.threads}).encode())
        os._exit(0)
    os.waitpid(child, 0)
    child_figures = json.loads(os.read(read_r, 4096))
    open_before_close = sorted(os.listdir("/proc/self/fd"))
    sampler.close()
    print(json.dumps({"first": first.to_dict(), "second": second.to_dict(), "child": child_figures,
                      "child_pid": child, "fds_before": len(open_before_close),
                      "fds_after": len(os.listdir("/proc/self/fd")), "parent": os.getpid()}))
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_figures_follow_cpu_work_threads_and_a_fork(tmp_path):
    script = tmp_path / "sample.py"
    script.write_text(SCRIPT)
    result = subprocess.run([sys.executable, str(script)], env=clean_env(), capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout.splitlines()[-1])
    first, second = found["first"], found["second"]
    # the stat file read again from its start is made anew: 0.3 s of CPU later, the figure has moved
    assert second["cpu_time_s"] - first["cpu_time_s"] >= 0.2
    assert second["threads"] >= first["threads"] + 5
    assert second["rss_bytes"] > 0
    # after a fork, the same sampler reads the child's own file, not the parent's it had open
    child = found["child"]
    assert child["pid"] == found["child_pid"] != found["parent"]
    assert child["cpu"] < first["cpu_time_s"] + 0.2
    assert child["threads"] == 1
    assert found["fds_after"] == found["fds_before"] - 1  # close() gives the file back


def test_figures_younger_than_the_age_asked_are_given_again_and_older_ones_read_anew():
    import time

    from tpu_tools.metrics.process import SelfSampler

    sampler = SelfSampler()
    first = sampler.sample()
    assert sampler.sample(max_age_s=3600.0) is first  # the agent's publications between two /proc reads
    started = time.process_time()
    while time.process_time() - started < 0.05:  # CPU the next read must see
        pass
    fresh = sampler.sample()  # no age given: read now
    assert fresh is not first
    assert fresh.cpu_time_s is not None
    assert first.cpu_time_s is not None
    assert fresh.cpu_time_s > first.cpu_time_s
