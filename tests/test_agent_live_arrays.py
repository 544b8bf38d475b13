"""The agent's tally of live arrays, in a real JAX process on the CPU platform with 2 devices."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from conftest import clean_env

JOB = textwrap.dedent("""
    import json, math
    import jax, jax.numpy as jnp
    from tpu_tools.agent.memory import DeviceMemory, LiveArrayTally, live_array_usage, shard_footprint
    from tpu_tools.pjrt.devices import memory_figures

    mesh = jax.sharding.Mesh(jax.devices(), ("d",))
    split = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("d"))
    on_one = [jnp.full((16,), i, dtype=jnp.float32) for i in range(300)]
    on_both = [jax.device_put(jnp.zeros((8, 4), jnp.bfloat16), split) for _ in range(200)]
    on_second = [jax.device_put(jnp.ones((3, 5), jnp.int8), jax.devices()[1]) for _ in range(7)]
    deleted = jnp.ones((1000,))
    deleted.delete()
    jax.block_until_ready([on_one, on_both, on_second])
    backend = jax.local_devices()[0].client

    def sized_one_by_one():  # every array sized on its own, as the agent did before it counted kinds
        usage = {}
        for array in backend.live_arrays():
            if array.is_deleted():
                continue
            per_shard, devices = shard_footprint(array)
            for device in devices:
                entry = usage.setdefault(device.id, [0, 0])
                entry[0] += per_shard
                entry[1] += 1
        return usage

    counted, one_by_one = live_array_usage(backend), sized_one_by_one()
    fresh, reused = LiveArrayTally(cpu_share=float("inf"), min_interval_s=0.0), LiveArrayTally(cpu_share=1e-12)
    hourly = LiveArrayTally(cpu_share=float("inf"), min_interval_s=3600.0)
    first = {"fresh": fresh.read(backend), "reused": reused.read(backend), "hourly": hourly.read(backend)}
    more = [jnp.zeros((64,)) for _ in range(10)]
    jax.block_until_ready(more)
    second = {"fresh": fresh.read(backend), "reused": reused.read(backend), "hourly": hourly.read(backend)}
    memory = DeviceMemory(reused)
    runtime, devices = memory.read(jax)
    again = memory.read(jax)[1]
    kept = memory.read(jax, refresh=False)[1]  # between full snapshots: the devices of the last read
    asked = [memory_figures(device) for device in jax.local_devices()]  # what the platform says when asked now
    print(json.dumps({"counted": counted, "one_by_one": one_by_one, "first": first, "second": second,
                      "runtime": runtime, "devices": again, "asked": asked,
                      "records_made_again": [again is not devices, kept is not again]}))
""")


def run_job(tmp_path) -> dict:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    env = clean_env(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=2")
    result = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def test_arrays_counted_by_kind_give_what_sizing_each_gives_and_a_dear_walk_is_reused(tmp_path):
    found = run_job(tmp_path)
    # JSON turned the device ids into strings; 300 x 64 B on device 0, 200 bf16 (8, 4) arrays split in
    # halves of 32 B on both, 7 x 15 B on device 1, the deleted array nowhere
    assert found["counted"] == found["one_by_one"]
    assert found["counted"]["0"][1] >= 300 + 200
    assert found["counted"]["1"][1] >= 200 + 7
    assert found["counted"]["0"][0] >= 300 * 64 + 200 * 32
    assert found["counted"]["1"][0] >= 200 * 32 + 7 * 15
    # a tally that may always walk again sees the 10 new arrays; one whose walks are dear keeps its first count,
    # and says how old it is
    (fresh_before, fresh_age), (fresh_after, _) = found["first"]["fresh"], found["second"]["fresh"]
    assert fresh_age == 0.0
    assert fresh_after["0"][1] == fresh_before["0"][1] + 10
    (reused_before, reused_age), (reused_after, later_age) = found["first"]["reused"], found["second"]["reused"]
    assert reused_before == found["counted"]
    assert reused_after == reused_before
    assert reused_age == 0.0
    assert later_age > 0.0
    assert found["runtime"]["live_arrays_age_s"] >= later_age - 0.001
    assert found["second"]["hourly"][0] == found["first"]["hourly"][0]  # within its least interval: not walked
    assert [d["id"] for d in found["devices"]] == [0, 1]
    assert found["runtime"]["process_count"] == 1
    # the memory fields of a later read are what the platform gives when asked (none on the CPU platform, which
    # the reader then stops asking)
    assert [{k: d[k] for k in asked} for d, asked in zip(found["devices"], found["asked"])] == found["asked"]
    assert [d["live_array_count"] for d in found["devices"]] == [reused_before["0"][1], reused_before["1"][1]]
    # a platform without memory figures and the same tally: the records of the last read are given again
    assert found["records_made_again"] == [False, False]
