"""The one compile tracker and step tracker the agent and the profiler share (tpu_tools.instrument)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from conftest import clean_env

from tpu_tools.instrument.compiles import CompileEvent, CompileTracker, function_name, parse_cache_miss
from tpu_tools.instrument.steps import process_steps

# Real JAX compiles each transformation once; both sinks of the one listener see the same events.
NAMING_JOB = textwrap.dedent("""
    import functools, json
    import jax, jax.numpy as jnp
    from jax.sharding import Mesh, PartitionSpec as P
    from tpu_tools.instrument.compiles import CompileRecorder, CompileTracker
    try:
        from jax import shard_map
    except ImportError:
        from jax.experimental.shard_map import shard_map
    from jax.experimental.pjit import pjit

    agent, profile = CompileTracker(), CompileRecorder()
    agent.install(jax, explain_recompiles=True)
    profile.install(jax)

    def f_plain(x): return x * 2
    def f_pjit(x): return x * 3
    def f_sharded(x): return x + 1
    def f_batched(x): return x.sum()
    def f_partial(a, x): return x * a

    mesh = Mesh(jax.devices(), ("d",))
    x = jnp.ones(4)
    jax.jit(f_plain)(x)
    jax.jit(f_plain)(jnp.ones(5))  # a recompilation: new shape
    pjit(f_pjit)(x)
    jax.jit(shard_map(f_sharded, mesh=mesh, in_specs=P(), out_specs=P()))(x)
    jax.jit(jax.vmap(f_batched))(jnp.ones((2, 4)))
    jax.jit(functools.partial(f_partial, 3.0))(x)
    jax.jit(lambda x: x - 1)(x)
    log = profile.snapshot()
    snapshot = agent.snapshot()
    print(json.dumps({
        "agent": sorted(f["name"] for f in snapshot["functions"] if f["compile_count"]),
        "profile": sorted({e.function for e in log.events if e.stage == "xla_compile"}),
        "agent_reason": next(f["last_recompile_reason"] for f in snapshot["functions"] if f["name"] == "f_plain"),
        "profile_recompiled": sorted({m.function for m in log.misses if m.is_recompile}),
    }))
""")


def test_agent_and_profile_name_every_transformation_the_same_way(tmp_path):
    script = tmp_path / "naming.py"
    script.write_text(NAMING_JOB)
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                            env=clean_env(JAX_PLATFORMS="cpu"))
    assert result.returncode == 0, result.stderr
    names = json.loads(result.stdout.splitlines()[-1])
    assert names["agent"] == names["profile"]
    assert {"f_plain", "f_pjit", "f_sharded", "f_batched", "f_partial", "<lambda>"} <= set(names["agent"])
    assert not any("(" in name for name in names["agent"])  # no jit(...) / shard_map(...) wrapper left
    assert names["agent_reason"] == "different input types; at x, now f32[5] and before f32[4]"
    assert names["profile_recompiled"] == ["f_plain"]
    assert "TRACING CACHE MISS" not in result.stderr  # explanations are recorded, not printed


def test_function_names_lose_every_wrapper_jax_has_used():
    assert function_name("jit(shard_map(f))") == "f"
    assert function_name("shard_map(f)") == "f"
    assert function_name("pjit(train)") == "train"
    assert function_name("jit(jit(step))") == "step"
    assert function_name("xla_pmap(g)") == "g"
    assert function_name(" jit(<lambda>) ") == "<lambda>"
    assert function_name("vmap(f)") == "vmap(f)"  # a different program than f: kept apart
    assert function_name("convert_element_type") == "convert_element_type"


def test_the_agent_sink_counts_recompiles_with_the_reason():
    tracker = CompileTracker()
    miss = parse_cache_miss("TRACING CACHE MISS at /x.py:12:16 (<module>):\n  for f defined at /x.py:10\n"
                            "  all previously seen cache keys differ. For the closest previous key:\n"
                            "  different input types:\n  * at x, now f32[4] and before f32[3]")
    first = parse_cache_miss("TRACING CACHE MISS at /x.py:12 (<module>):\n  never seen function:\n"
                             "    f id=1 defined at /x.py:10")
    assert first is not None
    assert not first.is_recompile
    assert miss is not None
    assert miss.is_recompile
    tracker.add_miss(first)
    tracker.add_event(CompileEvent("trace", "f", 0.1, 0.0))
    tracker.add_event(CompileEvent("xla_compile", "f", 0.5, 0.0, persistent_cache_miss=True))
    tracker.add_miss(miss)
    tracker.add_event(CompileEvent("xla_compile", "f", 0.25, 0.0, persistent_cache_hit=True))
    snapshot = tracker.snapshot()
    (stats,) = snapshot["functions"]
    counts = (stats["compile_count"], stats["recompile_count"], stats["cache_hits"], stats["cache_misses"])
    assert counts == (2, 1, 1, 1)
    assert stats["last_recompile_reason"] == "different input types; at x, now f32[4] and before f32[3]"
    assert snapshot["recent_recompiles"][0]["backend_compile_time_s"] == 0.25
    assert snapshot["trace_time_s"] == 0.1
    assert snapshot["recompile_count"] == 1


def test_the_agent_sink_serves_its_last_snapshot_again_until_an_event_arrives():
    tracker = CompileTracker()
    tracker.add_event(CompileEvent("xla_compile", "f", 0.5, 0.0))
    first = tracker.snapshot()
    assert tracker.snapshot() is first  # nothing compiled meanwhile: not built again
    tracker.add_miss(parse_cache_miss("TRACING CACHE MISS at /x.py:12 (<module>):\n  never seen function:\n"
                                      "    g id=1 defined at /x.py:10"))
    assert tracker.snapshot() is first  # a first compile's explanation changes no figure
    tracker.add_event(CompileEvent("xla_compile", "f", 0.25, 0.0))
    second = tracker.snapshot()
    assert second is not first
    assert second["compile_count"] == 2
    assert second["recompile_count"] == 1
    assert first["compile_count"] == 1  # the snapshot served before is left as it was
    assert [f["compile_count"] for f in second["functions"]] == [2]


def test_the_agent_api_and_the_profiler_share_one_step_tracker():
    import tpu_tools.agent as agent

    seen: list[int] = []
    remove = process_steps().on_step(lambda index, _seconds: seen.append(index))
    try:
        index = agent.step()
    finally:
        remove()
    assert seen == [index]
    assert agent.step_count() == process_steps().count
