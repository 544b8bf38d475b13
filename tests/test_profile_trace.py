"""Trace reading on device planes shaped like a TPU's and a GPU's (fixture XSpaces; no such device here)."""

from __future__ import annotations

import json

from conftest import run_tool
from xspace import Event, Plane, write_xspace

US = 1000


def tpu_planes() -> list[Plane]:
    module = "jit_train_step(1234)"
    tpu0 = Plane("/device:TPU:0", lines={
        "XLA Modules": [Event(module, 0, 400 * US), Event(module, 500 * US, 400 * US)],
        "XLA Ops": [Event("fusion.1", 0, 100 * US), Event("convolution.2", 100 * US, 250 * US),
                    Event("fusion.1", 500 * US, 100 * US), Event("convolution.2", 600 * US, 250 * US)],
        "Steps": [Event("0", 0, 900 * US)],
    })
    tpu1 = Plane("/device:TPU:1", lines={
        "XLA Modules": [Event(module, 0, 300 * US)],
        "XLA Ops": [Event("all-reduce.3", 0, 200 * US)],
    })
    host = Plane("/host:CPU", lines={"python": [
        Event("PjitFunction(train_step)", 0, 60 * US),
        Event("PjRtCApiLoadedExecutable::Execute", 10 * US, 40 * US),
        Event("PjitFunction(train_step)", 500 * US, 30 * US),
        Event("PjRtCApiLoadedExecutable::Execute", 505 * US, 20 * US),
    ]})
    return [tpu0, tpu1, host]


def test_tpu_device_planes(tmp_path):
    write_xspace(tmp_path, "tpu-vm", tpu_planes(), duration_ns=1_000 * US)
    result = run_tool("tpu-profile", "summary", str(tmp_path), "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    devices = {d["device"]: d for d in document["devices"]}
    assert devices["TPU:0"]["busy_us"] == 700
    assert devices["TPU:0"]["idle_us"] == 300
    assert devices["TPU:0"]["busy_percent"] == 70.0
    assert devices["TPU:0"]["op_count"] == 4
    assert devices["TPU:1"]["busy_us"] == 200
    top = document["top_ops"]
    assert [(o["name"], o["module"], o["count"]) for o in top] == [
        ("convolution.2", "jit_train_step", 2), ("fusion.1", "jit_train_step", 2),
        ("all-reduce.3", "jit_train_step", 1)]
    assert top[0]["total_us"] == 500
    assert top[0]["mean_us"] == 250
    assert top[0]["percent_of_device_time"] == round(100 * 500 / 900, 2)
    assert document["device_time_us"] == 900
    dispatch = document["host_dispatch"]
    assert dispatch["dispatches"] == 2
    assert dispatch["dispatch_time_us"] == 90
    assert document["eager"]["dispatches"] == 0


def test_gpu_stream_lines_use_the_hlo_op_stats(tmp_path):
    gpu = Plane("/device:GPU:0", lines={
        "Stream #14(Compute)": [
            Event("loop_add_fusion_kernel", 0, 30 * US, {"hlo_op": "add.7", "hlo_module": "jit_f"}),
            Event("gemm_kernel_sm90", 40 * US, 60 * US, {"hlo_op": "dot.3", "hlo_module": "jit_f"}),
        ],
        "Stream #15(MemcpyH2D)": [Event("MemcpyH2D", 100 * US, 10 * US)],
        "XLA Modules": [Event("jit_f(7)", 0, 110 * US)],
    })
    write_xspace(tmp_path, "gpu-host", [gpu], duration_ns=200 * US)
    document = json.loads(run_tool("tpu-profile", "summary", str(tmp_path), "--json").stdout)
    ops = {(o["name"], o["module"]) for o in document["top_ops"]}
    assert ("dot.3", "jit_f") in ops
    assert ("add.7", "jit_f") in ops
    assert ("MemcpyH2D", None) in ops
    assert document["devices"] == [{"device": "GPU:0", "op_count": 3, "busy_us": 100.0, "idle_us": 100.0,
                                    "busy_percent": 50.0}]


def test_nested_ops_count_their_self_time(tmp_path):
    host = Plane("/host:CPU", lines={"worker": [
        Event("while.1", 0, 100 * US, {"hlo_op": "while.1", "hlo_module": "jit_loop", "device_ordinal": 0}),
        Event("fusion.2", 10 * US, 60 * US, {"hlo_op": "fusion.2", "hlo_module": "jit_loop", "device_ordinal": 0}),
    ]})
    write_xspace(tmp_path, "host", [host], duration_ns=100 * US)
    document = json.loads(run_tool("tpu-profile", "summary", str(tmp_path), "--json").stdout)
    times = {o["name"]: o["total_us"] for o in document["top_ops"]}
    assert times == {"fusion.2": 60, "while.1": 40}
    assert document["devices"][0]["busy_us"] == 100
    assert document["device_time_us"] == 100
