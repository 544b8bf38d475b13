"""tpu-diag's detectors on a real CPU runtime, in one process (cheap repeats): every injected fault is caught
and named (device or link, and test); healthy runs never fail; an out-of-memory test is a skip."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import clean_env

SCRIPT = r"""
import json, sys
import jax
from tpu_tools.diag.runner import DiagRunner
from tpu_tools.diag.settings import DiagSettings, Injection

class Sink:
    def __init__(self): self.begun = []
    def plan(self, info): self.info = info
    def begin(self, test, device): self.begun.append(test)
    def check(self, check): pass
    def tick(self, text): pass
    def note(self, text): pass

SMALL = dict(kat_size=32, transfer_bytes=1 << 16, gemm_size=64, sustained_size=64, collective_elements=256,
             memory_fraction=1e-6, duration_s=0.05)

def run(level, inject=None, **extra):
    runner = DiagRunner(jax, DiagSettings(level=level, inject=(inject,) if inject else (), **{**SMALL, **extra}),
                        Sink())
    runner.run()
    return [c.to_dict() for c in runner.checks], runner.coverage.to_dict()

out = {"healthy": [], "injected": {}}
for _ in range(20):  # the quick core checks, repeated
    checks, _ = run(1)
    out["healthy"].append([c for c in checks if c["status"] != "pass"])
checks, coverage = run(3)
out["level3"] = [c for c in checks if c["status"] not in ("pass",)]
out["level3_tests"] = sorted({c["test"] for c in checks})
out["coverage"] = coverage
# Where each device's memory pattern was written (the level-3 run's programs, already compiled): on that device.
import numpy as np
from tpu_tools.diag.kernels import MEMORY_PATTERNS, memory_programs
words = coverage["devices"][0]["memory_tested_bytes"] // 4
placed = set()
for name in MEMORY_PATTERNS:
    write, _ = memory_programs(name, words)
    for device in jax.devices():
        placed.add((device.id, *(d.id for d in write(jax.device_put(np.uint32(1), device)).devices())))
out["memory_placement"] = sorted(placed)
for kind, device in (("kat", 1), ("transfer", 2), ("gemm", 0), ("memory", 1), ("collective", 2), ("sustained", 1)):
    checks, _ = run(3 if kind == "sustained" else (1 if kind in ("kat", "transfer") else 2), Injection(kind, device))
    out["injected"][kind] = [c for c in checks if c["status"] == "fail"]
checks, _ = run(4, Injection("memory", 1), only=("memory long",), memory_bytes=1 << 20)
out["long"] = [(c["test"], c["device"], c["status"]) for c in checks]
checks, _ = run(2, memory_bytes=1 << 42)
out["oom"] = [c for c in checks if c["test"].startswith("memory")]
print(json.dumps(out))
"""


def test_every_injected_fault_is_caught_and_healthy_repeats_never_fail():
    # 3 devices: the fewest where the majority of its peers names the one device that differs (every test
    # compiles per device, so each device more costs a share of the run).
    env = clean_env(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=3")
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert len(out["healthy"]) == 20, out["healthy"]
    assert all(bad == [] for bad in out["healthy"]), out["healthy"]
    # a healthy long run: nothing fails (the CPU's rates are reported, not judged)
    assert [c for c in out["level3"] if c["status"] == "fail"] == [], out["level3"]
    assert {"compile", "known-answer", "transfer", "gemm f32", "gemm bf16", "gemm f16", "gemm int8", "rate",
            "memory address", "memory walking-ones", "memory walking-zeros", "memory random",
            "collective all-reduce", "collective all-gather", "collective ring +1", "collective ring -1",
            "sustained"} <= set(out["level3_tests"])
    assert len(out["coverage"]["links"]) == 6
    assert out["coverage"]["dtypes"] == ["f32", "bf16", "f16", "int8"]
    assert all(d["memory_tested_bytes"] > 0 for d in out["coverage"]["devices"])
    assert out["memory_placement"] == [[d, d] for d in range(3)]  # each device's memory test runs on it

    injected = out["injected"]
    assert [(c["test"], c["device"]) for c in injected["kat"]] == [("known-answer", 1)]
    assert "int32 matmul: 1 of" in injected["kat"][0]["why"]
    assert [(c["test"], c["device"]) for c in injected["transfer"]] == [("transfer", 2)]
    assert "host-to-device" in injected["transfer"][0]["why"]
    # against its peers (both runs) and against the exact answer
    assert {(c["test"], c["device"]) for c in injected["gemm"]} == {
        (f"gemm {t}{exact}", 0) for t in ("f32", "bf16", "f16", "int8") for exact in ("", " exact")}
    assert all("on both runs" in c["why"] or "differ from the exact answer" in c["why"] for c in injected["gemm"])
    assert {(c["test"], c["device"]) for c in injected["memory"]} == {
        (f"memory {p}", 1) for p in ("address", "walking-ones", "walking-zeros", "random")}
    assert [(c["test"], c["device"], c["link"]) for c in injected["collective"]] == [("collective ring +1", 2, "1->2")]
    assert [(c["test"], c["device"]) for c in injected["sustained"]] == [("sustained", 1)]
    assert "first at iteration 1" in injected["sustained"][0]["why"]
    # -r 4's long patterns: every one catches the flipped bit on its device, and only there
    from tpu_tools.diag.settings import LONG_MEMORY_PATTERNS

    assert sorted(map(tuple, out["long"])) == sorted((f"memory long {p}", d, "fail" if d == 1 else "pass")
                                         for p in LONG_MEMORY_PATTERNS for d in range(3))
    # a test that runs out of device memory is a skip of that test, not a crash
    assert out["oom"]
    assert all(c["status"] == "skip" and c["why"].startswith("out of memory") for c in out["oom"])
