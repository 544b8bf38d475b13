"""Real JAX persistent compilation caches on the CPU platform, written by real processes, for the cache tests.

`CACHE_JOB` compiles one function for the sizes it is given with the cache at a directory (the minimum
compile time and entry size set to 0 so that small programs are cached), with tpu-tools' cache watch
listening, and writes the watch's snapshot as JSON. `AGENT_CACHE_JOB` does the same under the real agent
(`python -m tpu_tools.agent`) and stays up until told to stop, for tpu-monitor.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from conftest import clean_env

CACHE_JOB = textwrap.dedent("""
    import json, os, sys
    cache_dir, out, sizes = sys.argv[1], sys.argv[2], [int(s) for s in sys.argv[3].split(",")]
    late = sys.argv[4] if len(sys.argv) > 4 else ""
    import jax, jax.numpy as jnp
    from tpu_tools.instrument.cachewatch import watch
    watch().install(jax)
    jax.config.update("jax_compilation_cache_dir", cache_dir)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)

    @jax.jit
    def step(x):
        return jnp.tanh(x) * 2.0 + 1.0

    for n in sizes:
        step(jnp.zeros((n,), jnp.float32)).block_until_ready()
    if late:
        os.environ["XLA_FLAGS"] = "--xla_cpu_enable_fast_math=true"
        jax.config.update("jax_compilation_cache_dir", cache_dir + "-elsewhere")
        step(jnp.zeros((int(late),), jnp.float32)).block_until_ready()
    open(out, "w").write(json.dumps(watch().snapshot()))
""")

AGENT_CACHE_JOB = textwrap.dedent("""
    import os, sys, time
    cache_dir, ready, stop, size = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    import jax, jax.numpy as jnp
    jax.config.update("jax_compilation_cache_dir", cache_dir)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)

    @jax.jit
    def step(x):
        return jnp.tanh(x) * 2.0 + 1.0

    step(jnp.zeros((size,), jnp.float32)).block_until_ready()
    open(ready, "w").write(str(os.getpid()))
    deadline = time.time() + 120
    while not os.path.exists(stop) and time.time() < deadline:
        time.sleep(0.05)
""")


def run_cache_job(workdir: Path, cache_dir: Path, sizes: str, late: str = "", env: dict[str, str] | None = None,
                  name: str = "job") -> dict[str, Any]:
    """Run CACHE_JOB to its end; its cache watch's snapshot."""
    script = workdir / "cache_job.py"
    if not script.exists():
        script.write_text(CACHE_JOB)
    out = workdir / f"{name}.json"
    command = [sys.executable, str(script), str(cache_dir), str(out), sizes, *([late] if late else [])]
    result = subprocess.run(command, env=env or clean_env(JAX_PLATFORMS="cpu"), capture_output=True, text=True,
                            timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(out.read_text())


def empty_entries(cache: Path, count: int) -> None:
    """`count` entries that are empty files (broken: "empty file"), named as jax names entries.

    They are hard links to a few inodes: no data blocks, and none of the cost (seconds of CPU, tens of seconds on
    a busy disk) of allocating 10^5 inodes.
    """
    source = ""
    for index in range(count):
        name = str(cache / f"jit_f-{index:064x}-cache")
        if source:
            try:
                os.link(source, name)
                continue
            except OSError as error:
                if error.errno != errno.EMLINK:  # the file system's link limit (65,000 on ext4): a new inode
                    raise
        os.close(os.open(name, os.O_CREAT | os.O_WRONLY, 0o644))
        source = name
