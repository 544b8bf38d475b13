"""A job that spends known amounts of time in each goodput cause, then prints the truth and the ledger.

Run as `python -m tpu_tools.agent tests/goodput_job.py STEPS [STEP_S [STALL_S]]`. Every injected amount is measured
around the sleep that makes it (a busy machine oversleeps), so the truth is what really happened.
The last line of stdout is JSON: {"truth": {cause: seconds}, "ledger": tpu_tools.agent.goodput()}.
"""

import json
import sys
import time

import tpu_tools.agent as agent


def timed_sleep(seconds):
    start = time.perf_counter()
    time.sleep(seconds)
    return time.perf_counter() - start


steps = int(sys.argv[1])
step_s = float(sys.argv[2]) if len(sys.argv) > 2 else 0.005
stall_s = float(sys.argv[3]) if len(sys.argv) > 3 else 1.2
truth = dict.fromkeys(("productive", "data", "checkpoint", "eval", "warmup", "idle"), 0.0)
truth["startup_sleep"] = timed_sleep(0.2)
first_block = None
for index in range(steps):
    with agent.phase("data"):
        data_s = timed_sleep(0.004)
    truth["data"] += data_s
    if first_block is None:
        first_block, first_data = time.time(), data_s
    with agent.step_context(samples=32, flops=1e9):
        truth["productive"] += timed_sleep(step_s)
    if index % 10 == 9:
        with agent.phase("checkpoint"):
            truth["checkpoint"] += timed_sleep(0.03)
    if index % 20 == 19:
        with agent.phase("eval"):
            truth["eval"] += timed_sleep(0.02)
            with agent.phase("warmup"):  # a custom phase inside another: its time is its own
                truth["warmup"] += timed_sleep(0.01)
    if index == steps // 2:
        truth["idle"] += timed_sleep(stall_s)  # a stall with no step and no phase
figures = agent.goodput()
end = time.time()
truth["startup"] = first_block - figures["started_unix_s"] - first_data  # the first data phase claims its own
truth["wall"] = end - figures["started_unix_s"]
print(json.dumps({"truth": truth, "ledger": figures}))
