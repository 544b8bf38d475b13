"""The agent never raises into the job: bad step callbacks are ignored at registration or disabled when they raise."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import clean_env

# Run in a fresh interpreter: the process's step tracker is shared by everything imported in it.
JOB = r'''
import json, os, sys, threading
import tpu_tools.agent as agent

refused = []
for bad in (None, 42, "callback", [print]):
    remove = agent.on_step(bad)  # ignored, with a warning: not raised into the job
    remove()
    refused.append(type(bad).__name__)

class Sulky(Exception):
    def __str__(self):
        raise RuntimeError("no text either")

good = []
agent.on_step(lambda i, t: good.append(i))
agent.on_step(lambda i, t: 1 / 0)
agent.on_step(lambda i, t: (_ for _ in ()).throw(Sulky()))

marked = [agent.step()]
with agent.step_context():
    pass
marked.append(agent.step_count())
worker = threading.Thread(target=lambda: marked.append(agent.step()))
worker.start(); worker.join()

child = os.fork()
if child == 0:  # a forked child steps too, with the callbacks it inherited
    try:
        agent.step(); agent.step()
        os._exit(0)
    except BaseException:
        os._exit(7)
_, status = os.waitpid(child, 0)
print(json.dumps({"refused": refused, "good": good, "marked": marked, "child_status": status}))
'''


def test_bad_callbacks_never_reach_the_training_loop():
    result = subprocess.run([sys.executable, "-c", JOB], capture_output=True, text=True, timeout=60,
                            env=clean_env())
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["refused"] == ["NoneType", "int", "str", "list"]
    ignored = [line for line in result.stderr.splitlines() if "on_step needs a callable" in line]
    assert [line.rsplit("got ", 1)[1] for line in ignored] == [f"{name}; it is ignored" for name in document["refused"]]
    assert document["good"] == [0, 1, 2]  # the good callback keeps running after the others were disabled
    assert document["marked"] == [0, 2, 2]
    assert document["child_status"] == 0
    warnings = [line for line in result.stderr.splitlines() if "it is disabled" in line]
    assert len(warnings) == 2, result.stderr  # each bad callback reported once, then never called again
    assert any("ZeroDivisionError" in line for line in warnings)
    assert any("Sulky" in line for line in warnings)
    assert "Traceback" not in result.stderr
