"""A job that spends known amounts of time in each goodput cause, then prints the truth and the ledger.

Run as `python -m tpu_tools.agent tests/goodput_job.py STEPS [STEP_S [STALL_S]]`. Every injected amount is measured
around the sleep that makes it (a busy machine oversleeps), so the truth is what really happened.

The ledger's clock reads inside the agent's context managers, the job's just inside and just outside them: on a
loaded machine the job can be preempted between the two readings, and that time is the block's for the ledger.
So each cause's truth is a range: `low` counts the sleeps alone, `high` whole blocks, from just before entering
to just after leaving. On an idle machine the two are microseconds apart.
The last line of stdout is JSON: {"truth": {cause: seconds}, "low": {...}, "high": {...},
"ledger": tpu_tools.agent.goodput()}; `truth` is `low` (the sleeps), as before.
"""

import json
import sys
import time

import tpu_tools.agent as agent

CAUSES = ("productive", "data", "checkpoint", "eval", "warmup", "idle")


def timed_sleep(seconds):
    start = time.perf_counter()
    time.sleep(seconds)
    return time.perf_counter() - start


class Block:
    """One block of the job: its sleep, and the block from just before entering to just after leaving."""

    def __init__(self, context, seconds, inner=None):
        self.before = time.perf_counter()
        self.entered_unix = time.time()
        with context:
            self.inside = time.perf_counter()
            self.inside_unix = time.time()
            self.slept = timed_sleep(seconds)
            self.nested = inner() if inner else None
        self.after = time.perf_counter()

    def pair(self):
        """(low, high) of the block's own time: a phase nested in it counts as its own, at least its sleep and
        at most its whole block."""
        whole = self.after - self.before
        if self.nested is None:
            return self.slept, whole
        return self.slept, whole - self.nested.slept


steps = int(sys.argv[1])
step_s = float(sys.argv[2]) if len(sys.argv) > 2 else 0.005
stall_s = float(sys.argv[3]) if len(sys.argv) > 3 else 1.2
low = dict.fromkeys(CAUSES, 0.0)
high = dict.fromkeys(CAUSES, 0.0)


def add(cause, pair):
    low[cause] += pair[0]
    high[cause] += pair[1]


startup_sleep = timed_sleep(0.2)
first_data = first_step = stall = None
for index in range(steps):
    data = Block(agent.phase("data"), 0.004)
    add("data", data.pair())
    step = Block(agent.step_context(samples=32, flops=1e9), step_s)
    add("productive", step.pair())
    if stall is not None and "high" not in stall:
        # the ledger's gap runs from the end of the last block to this step's start, less this data phase
        stall["high"] = step.inside - stall["last_slept_by"] - data.slept
    first_data, first_step = first_data or data, first_step or step
    last = step
    if index % 10 == 9:
        last = Block(agent.phase("checkpoint"), 0.03)
        add("checkpoint", last.pair())
    if index % 20 == 19:
        # a custom phase inside another: its time is its own
        last = Block(agent.phase("eval"), 0.02, lambda: Block(agent.phase("warmup"), 0.01))
        add("eval", last.pair())
        add("warmup", (last.nested.slept, last.nested.after - last.nested.before))
    if index == steps // 2:
        # a stall with no step and no phase
        stall = {"last_slept_by": last.before + last.slept, "slept": timed_sleep(stall_s)}
figures = agent.goodput()
end = time.time()
started = figures["started_unix_s"]
if stall is not None:
    add("idle", (stall["slept"], stall.get("high", time.perf_counter() - stall["last_slept_by"])))
if first_step is not None:
    # start-up: from the process's start to the first step, less the first data phase, which claims its own time
    low["startup"] = first_step.entered_unix - started - (first_data.after - first_data.before)
    high["startup"] = first_step.inside_unix - started - first_data.slept
low["wall"] = high["wall"] = end - started
truth = dict(low, startup_sleep=startup_sleep)
print(json.dumps({"truth": truth, "low": low, "high": high, "ledger": figures}))
