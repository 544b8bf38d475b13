"""A small JAX training loop that checkpoints every K steps with the agent's API and resumes from its last
checkpoint, writing the truth of what it did (each step's end, each checkpoint saved, where it resumed) as JSON
lines to a file of its own, for the test of a job killed and restarted (tests/test_job_life.py).

Run as `python -m tpu_tools.agent --job JOB tests/joblife_job.py CKPT_DIR TRUTH EVERY TOTAL STEP_S`. A truth line
is written right after the agent was told, with one `write` of a file opened for appending: what a SIGKILL leaves
of it is what happened.
"""

import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import tpu_tools.agent as agent

ckpt_dir, truth_path, every, total, step_s = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), \
    float(sys.argv[5])
truth = os.open(truth_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)


def note(event, **fields):
    os.write(truth, (json.dumps({"event": event, "pid": os.getpid(), "t": time.time(), **fields}) + "\n").encode())


latest = os.path.join(ckpt_dir, "latest.json")
step = 0
w = np.ones((64, 64), np.float32)
if os.path.exists(latest):
    with open(latest) as handle:
        step = json.load(handle)["step"]
    w = np.load(os.path.join(ckpt_dir, f"w-{step}.npy"))
    agent.checkpoint_restored(step)
note("start", step=step)


@jax.jit
def train_step(w, x):
    return w - 0.001 * (x.T @ (x @ w)) / x.shape[0]


x = jnp.ones((16, 64), jnp.float32)
w = jnp.asarray(w)
while step < total:
    w = train_step(w, x).block_until_ready()
    time.sleep(step_s)
    step += 1
    agent.step()
    note("step", step=step)
    if step % every == 0:
        np.save(os.path.join(ckpt_dir, f"w-{step}.npy"), np.asarray(w))
        with open(latest + ".tmp", "w") as handle:
            json.dump({"step": step}, handle)
        os.replace(latest + ".tmp", latest)
        agent.checkpoint_saved(step)
        note("checkpoint", step=step)
note("end", step=step)
