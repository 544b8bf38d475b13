#!/usr/bin/env python3
"""What checking outside input costs: the agent snapshot parse, the terminal sanitiser and the redactor.

- decode_snapshot: seconds per MiB of a realistic agent answer (8 devices, thousands of jitted functions
  and recompile records), i.e. what one agent's answer costs a monitor report or a dump; and microseconds
  per everyday answer (8 devices, 3 functions: about 5 KB), what a monitor polling 10 times a second pays;
- safe_text: MiB per second on text with a few escape characters;
- Redactor.text: seconds per MiB of log-like text (what the dump pays for every byte).

    python benchmarks/outside_records.py [--functions 20000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def _snapshot(functions: int) -> dict:
    devices = [{"id": i, "local_hardware_id": i, "platform": "tpu", "device_kind": "TPU v5 lite", "process_index": 0,
                "host": "t1v-n-0", "coords": [i % 4, i // 4, 0], "core_on_chip": 0,
                "memory_limit_bytes": 16 << 30, "memory_used_bytes": 11 << 30, "memory_peak_bytes": 12 << 30,
                "live_array_bytes": 10 << 30, "live_array_count": 812} for i in range(8)]
    records = [{"name": f"train_step_{i}", "compile_count": 3, "recompile_count": 2, "trace_count": 3,
                "trace_time_s": 0.12, "lowering_time_s": 0.05, "backend_compile_time_s": 1.7, "cache_hits": 0,
                "cache_misses": 3, "last_recompile_reason": "different input shapes: f32[128,512] vs f32[64,512]"}
               for i in range(functions)]
    recent = [{"function": f"train_step_{i}", "time_unix_s": 1.7e9 + i, "compile_count": 2,
               "backend_compile_time_s": 1.6, "reason": None} for i in range(min(functions, 100))]
    return {"schema": "tpu-tools/agent/v1", "pid": 4242, "tag": "train", "user": "alice",
            "command": "python3 train.py --steps 100000", "agent_version": "0.1.0", "started_unix_s": 1.7e9,
            "uptime_s": 3600.0, "jax_version": "0.10.2", "explain_recompiles": True,
            "runtime": {"platform": "tpu", "platform_version": "libtpu", "process_index": 0, "process_count": 1},
            "devices": devices, "memory_error": None,
            "process": {"cpu_percent": 101.5, "cpu_time_s": 3700.0, "rss_bytes": 12 << 30, "threads": 80},
            "compiles": {"listening": True, "compile_count": 3 * functions, "recompile_count": 2 * functions,
                         "trace_count": 3 * functions, "trace_time_s": 1.0, "lowering_time_s": 1.0,
                         "backend_compile_time_s": 1.0, "cache_hits": 0, "cache_misses": 3,
                         "functions": records, "recent_recompiles": recent},
            "steps": {"count": 100000, "steps_per_second": 9.5, "last_step_time_s": 0.1, "p50_step_time_s": 0.1,
                      "p99_step_time_s": 0.2, "last_step_age_s": 0.01}}


def _best(function, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--functions", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    from tpu_tools.dump.redact import Redactor
    from tpu_tools.metrics.agent_snapshot import decode_snapshot
    from tpu_tools.sanitize import safe_text

    wire = json.dumps(_snapshot(args.functions)).encode()
    mib = len(wire) / (1 << 20)
    parse_s = _best(lambda: decode_snapshot(wire), args.repeat)
    decode_s = _best(lambda: json.loads(wire), args.repeat)
    everyday = json.dumps(_snapshot(3)).encode()
    rounds = 2000
    everyday_s = _best(lambda: [decode_snapshot(everyday) for _ in range(rounds)], args.repeat) / rounds
    line = "2026-01-01 12:00:00.123 I0101 tpu_driver.cc:123] step 1234 loss 2.345 lr 3e-4 \x1b[0m host t1v-n-0\n"
    text = line * ((8 << 20) // len(line))
    text_mib = len(text) / (1 << 20)
    sanitise_s = _best(lambda: safe_text(text, multiline=True), args.repeat)
    redact_s = _best(lambda: Redactor().text(text), max(1, args.repeat // 2))
    print(f"command: {' '.join([sys.executable, *sys.argv])}")
    print(f"agent snapshot: {mib:.1f} MiB; json.loads {decode_s / mib:.3f} s/MiB; decode_snapshot (msgspec into "
          f"AgentSnapshot) {parse_s / mib:.3f} s/MiB ({parse_s:.2f} s for this answer)")
    print(f"decode_snapshot of an everyday answer ({len(everyday) / 1000:.1f} KB): "
          f"{everyday_s * 1e6:.0f} us")
    print(f"safe_text: {text_mib / sanitise_s:.0f} MiB/s on log text")
    print(f"Redactor.text: {redact_s / text_mib:.3f} s/MiB on log text")


if __name__ == "__main__":
    main()
