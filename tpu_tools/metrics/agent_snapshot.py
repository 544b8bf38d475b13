"""The agent snapshot (schema tpu-tools/agent/v1) as a typed record.

An agent is another process: whatever it answers is checked here, field by field, before a
monitor, tpu-top or a bundle reads it. A snapshot that does not fit becomes one error for that
agent (`RecordError`), so one broken or hostile job never hides the others.
"""

from __future__ import annotations

from typing import Any

from tpu_tools.records import AnyJSON, Bool, Float, Int, List, Map, Obj, RecordError, Str, parse

SCHEMA = "tpu-tools/agent/v1"

_COUNT = Int(min=0)
_BYTES = Int(min=0)
_SECONDS = Float(min=0.0)

DEVICE = Obj({
    "id": Int(min=0), "local_hardware_id": Int(), "platform": Str(256), "device_kind": Str(256),
    "process_index": Int(min=0), "host": Str(256), "coords": List(Int(), max_items=8), "core_on_chip": Int(min=0),
    "memory_limit_bytes": _BYTES, "memory_used_bytes": _BYTES, "memory_peak_bytes": _BYTES,
    "live_array_bytes": _BYTES, "live_array_count": _COUNT,
}, required=("id", "platform", "device_kind"))  # what the devices group pairs devices with chips by

FUNCTION = Obj({
    "name": Str(4096), "compile_count": _COUNT, "recompile_count": _COUNT, "trace_count": _COUNT,
    "trace_time_s": _SECONDS, "lowering_time_s": _SECONDS, "backend_compile_time_s": _SECONDS,
    "cache_hits": _COUNT, "cache_misses": _COUNT, "last_recompile_reason": Str(),
})

RECOMPILE = Obj({
    "function": Str(4096), "time_unix_s": Float(), "compile_count": _COUNT, "backend_compile_time_s": _SECONDS,
    "reason": Str(),
})

COMPILES = Obj({
    "listening": Bool(), "compile_count": _COUNT, "recompile_count": _COUNT, "trace_count": _COUNT,
    "trace_time_s": _SECONDS, "lowering_time_s": _SECONDS, "backend_compile_time_s": _SECONDS,
    "cache_hits": _COUNT, "cache_misses": _COUNT, "in_memory_cache_hits": _COUNT,  # the last: torch_xla's
    "functions": List(FUNCTION), "recent_recompiles": List(RECOMPILE),
})

# torch_xla's figures (tpu_tools.agent.torchxla); a JAX job's are null
_TRANSFER = Obj({"count": _COUNT, "time_s": _SECONDS, "bytes": _BYTES})
EXECUTIONS = Obj({"count": _COUNT, "time_s": _SECONDS})
TRANSFERS = Obj({"to_device": _TRANSFER, "from_device": _TRANSFER})
CPU_FALLBACKS = Obj({"total": _COUNT, "ops": List(Obj({"op": Str(256), "count": _COUNT}, required=("op",)),
                                                  max_items=1024)})

COMPILATION_CACHE = Obj({
    "listening": Bool(), "dir_configured": Str(4096), "dir_in_use": Str(4096), "lookups": _COUNT, "hits": _COUNT,
    "misses": _COUNT, "entries_written": _COUNT, "seconds_saved_s": _SECONDS, "key_records_written": _COUNT,
    "key_record_error": Str(512), "host": Str(256), "deserialize_failures": _COUNT,
    "recent_misses": List(Obj({"module": Str(1024), "key": Str(1200), "time_unix_s": Float(),
                               "differing": List(Str(64), max_items=32), "explanation": Str(2000)}), max_items=64),
    "set_too_late": List(Obj({"setting": Str(64), "in_effect": Str(4096), "now": Str(4096), "message": Str(512)}),
                         max_items=8),
})

STEPS = Obj({
    "count": _COUNT, "steps_per_second": _SECONDS, "last_step_time_s": _SECONDS, "p50_step_time_s": _SECONDS,
    "p99_step_time_s": _SECONDS, "last_step_age_s": _SECONDS,
})

_FIGURE = Float(min=0.0)
GOODPUT_SPAN = Obj({
    "wall_s": _SECONDS, "goodput_percent": _FIGURE, "causes_s": Map(_SECONDS, max_items=32),
    "causes_percent": Map(_FIGURE, max_items=32), "flops": _FIGURE, "samples": _FIGURE, "flops_per_s": _FIGURE,
    "mfu_percent": _FIGURE, "samples_per_s": _FIGURE, "cost_per_million_samples": _FIGURE,
})

GOODPUT = Obj({
    "started_unix_s": Float(), "steps": _COUNT, "median_step_time_s": _SECONDS, "idle_threshold_s": _SECONDS,
    "step_flops": _FIGURE, "step_flops_source": Str(64),
    "step_programs": List(Obj({"name": Str(256), "flops": _FIGURE}), max_items=16),
    "since_start": GOODPUT_SPAN, "recent": GOODPUT_SPAN,
    "window_s": _SECONDS, "rejected": Map(_COUNT, max_items=16), "last_error": Str(512),
    "peak_flops_per_s": _FIGURE, "peak_source": Str(256), "price_per_hour": _FIGURE,
    "problems": List(Str(512), max_items=16),
})

METRIC = Obj({
    "name": Str(128), "value": Float(), "step": _COUNT, "scope": Str(16, one_of=("global", "local")),
    "kind": Str(16, one_of=("replicated", "local", "host")), "devices": _COUNT, "job_devices": _COUNT,
    "time_unix_s": Float(), "suspect": Str(256),
}, required=("name", "kind"))

METRICS = Obj({"values": List(METRIC, max_items=256), "rejected": _COUNT, "last_error": Str(512)})

# The answer to the "arrays" request (tpu_tools.agent.arrays): device memory by allocation, on request only
ARRAYS = Obj({
    "arrays": List(Obj({"shape": Str(1024), "dtype": Str(64), "sharding": Str(4096), "source": Str(4096),
                        "bytes": _BYTES,
                        "count": _COUNT}), max_items=1000),
    "arrays_looked_at": _COUNT, "truncated": Bool(),
    "sites": List(Obj({"source": Str(4096), "bytes": _BYTES, "count": _COUNT}), max_items=1000),
    "sites_error": Str(), "elapsed_s": _SECONDS,
})

# The answer to the "stacks" request (tpu_tools.agent.stacks), also what faulthandler's text is read into
FRAME = Obj({"file": Str(4096), "line": Int(min=0), "function": Str(1024)})
STACKS = Obj({
    "time_unix_s": Float(),
    "threads": List(Obj({"name": Str(256), "id": Int(), "main": Bool(), "daemon": Bool(),
                         "frames": List(FRAME, max_items=256)}), max_items=1024),
})

SNAPSHOT = Obj({
    "schema": Str(64), "pid": Int(min=1), "tag": Str(1024), "user": Str(256), "command": Str(),
    "agent_version": Str(256), "started_unix_s": Float(), "uptime_s": Float(), "jax_version": Str(256),
    "frontend": Str(32), "frontend_version": Str(256),
    "explain_recompiles": Bool(),
    "runtime": Obj({"platform": Str(256), "platform_version": Str(1024), "process_index": Int(min=0),
                    "process_count": Int(min=1), "live_arrays_age_s": _SECONDS}, required=("platform",)),
    "devices": List(DEVICE, max_items=4096),
    "memory_error": Str(),
    "process": Obj({"cpu_percent": Float(min=0.0), "cpu_time_s": _SECONDS, "rss_bytes": _BYTES,
                    "threads": _COUNT}),
    "compiles": COMPILES,
    "compilation_cache": COMPILATION_CACHE,
    "executions": EXECUTIONS, "transfers": TRANSFERS, "cpu_fallbacks": CPU_FALLBACKS,
    # the startup contract's findings (tpu_tools.agent.xlastartup)
    "startup": List(Obj({"check": Str(64), "message": Str(512), "fix": Str(512)}, required=("message",)),
                    max_items=16),
    "steps": STEPS,
    # libtpu's SDK metrics read in the job (tpu_tools.agent.tpusdk); checked again where they are used
    "tpu_sdk": Obj({"status": Str(256), "metrics": Map(AnyJSON(), max_items=64),
                    "tensorcore_utilization_percent": List(AnyJSON(), max_items=1024),
                    "read_age_s": Float(min=0.0)}),
    "goodput": GOODPUT,  # tpu_tools.agent.goodput
    "metrics": METRICS,  # tpu_tools.agent.metrics
    "error": AnyJSON(),
    "arrays_report": ARRAYS,
    "arrays_error": Str(),
    "stacks": STACKS,
    "stacks_signal": Int(min=1, max=64),  # faulthandler writes the stacks to agent-<pid>.stacks on this signal
    "published_unix_s": Float(),  # read from the snapshot file (tpu_tools.metrics.snapfile): when it was written
    "publish_error": Str(512),
    # the job the process is one process of, across restarts and hosts (tpu_tools.agent.joblog)
    "job": Obj({"id": Str(200), "source": Str(64), "worker": Str(64), "log": Str(4096), "step": _COUNT,
                "last_checkpoint_step": _COUNT, "log_error": Str(512)}, required=("id",)),
}, required=("schema", "pid"))


def parse_snapshot(document: Any) -> dict[str, Any]:
    """The checked copy of an agent's answer; RecordError says what is wrong with it in one sentence."""
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        raise RecordError("answered something that is not an agent snapshot")
    try:
        snapshot: dict[str, Any] = parse(SNAPSHOT, document)
    except RecordError as error:
        raise RecordError(f"answered a malformed snapshot ({error})") from error
    return snapshot
