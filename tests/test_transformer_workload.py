"""The reference transformer on the real CPU runtime: it learns, and its FLOP count matches XLA's.

Runs in a child interpreter so this test process never imports jax (runtime
policy must be applied before jax is imported, and other tests rely on that).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from conftest import clean_env

SCRIPT = textwrap.dedent("""
    import json
    import jax
    from tpu_tools.workloads import transformer as T

    config = T.config_for("tiny", n_layers=1, seq_len=64, vocab_size=512, batch_per_device=4)
    devices = jax.local_devices()
    batch_size = config.batch_per_device * len(devices)
    step, state_sharding, batch_sharding = T.data_parallel_train_step(config, devices, T.AdamW(learning_rate=1e-2))
    state = jax.device_put(T.init_train_state(config, jax.random.key(0)), state_sharding)
    batch = jax.device_put(T.random_tokens(config, batch_size, jax.random.key(1)), batch_sharding)
    parameters = sum(leaf.size for leaf in jax.tree_util.tree_leaves(state["params"]))
    compiled = step.lower(state, batch).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    losses = []
    for _ in range(25):
        state, loss = compiled(state, batch)
        losses.append(float(loss))
    logits = T.forward(state["params"], batch[:, :-1], config)
    print(json.dumps({
        "devices": len(devices),
        "parameters": parameters,
        "expected_parameters": T.parameter_count(config),
        "losses": losses,
        "logits_shape": list(logits.shape),
        "xla_flops": cost["flops"] * len(devices),  # XLA counts per device
        "analytic_flops": T.train_step_flops(config, batch_size),
        "batch_sharding": str(batch.sharding.spec),
        "steps": int(state["step"]),
    }))
""")


@pytest.mark.budget(60)  # 25 real training steps: enough for the loss to halve
def test_train_step_learns_data_parallel_and_flops_agree_with_xla():
    env = clean_env(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=2",
                    JAX_NUM_CPU_DEVICES="2")
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=180)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["devices"] == 2
    assert "data" in report["batch_sharding"]
    assert report["parameters"] == report["expected_parameters"]
    assert report["steps"] == 25
    losses = report["losses"]
    assert losses[0] > 5.5  # about ln(512) for random weights
    assert losses[-1] < 0.5 * losses[0]  # it memorises the batch: gradients and AdamW work
    assert report["logits_shape"] == [8, 64, 512]
    assert abs(report["xla_flops"] / report["analytic_flops"] - 1) < 0.10
