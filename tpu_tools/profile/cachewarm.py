"""`tpu-profile cache warm`: compile into a cache in one child, then prove in a fresh child that the start hits.

Each run is a new process (`python -m tpu_tools.profile.cachewarm`) with the
cache set in its environment before jax is imported, so it starts exactly as
a job would. It compiles the target (a function with abstract arguments, a
built-in workload, or a whole program run to its end), counts the XLA compile
time JAX reports (`backend_compile_duration`, which on a hit is the time to
load the entry) and the cache's lookups, hits and writes (`cachewatch`, which
also writes key records). The first run warms; the second must hit every
lookup and miss none.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from tpu_tools.errors import RuntimeFailure
from tpu_tools.profile.cachedir import make_directory
from tpu_tools.shorten import shorten

SCHEMA = "tpu-tools/cache-warm/v1"
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


@dataclass
class WarmTarget:
    """What to compile: kind "function" (target, args), "builtin" (name, preset, batch) or "program"."""

    kind: str
    target: str | None = None  # "module:function", or the built-in's name
    args: list[str] = field(default_factory=list)  # --arg specs, or the program's arguments
    preset: str | None = None
    batch: int | None = None
    script: str | None = None
    module: str | None = None

    @property
    def display(self) -> str:
        if self.kind == "program":
            return " ".join([self.script or f"-m {self.module}", *self.args])
        if self.kind == "builtin":
            return f"{self.target}[{self.preset or 'tiny'}]"
        return f"{self.target}({', '.join(self.args)})"


@dataclass
class WarmRun:
    compile_time_s: float
    compiles: int
    lookups: int
    hits: int
    misses: int
    entries_written: int
    wall_time_s: float
    miss_explanations: list[str] = field(default_factory=list)


@dataclass
class WarmResult:
    path: str
    target: str
    warming: WarmRun
    proof: WarmRun

    @property
    def proven(self) -> bool:
        return self.proof.lookups > 0 and self.proof.misses == 0 and self.proof.hits > 0

    @property
    def ratio(self) -> float | None:
        if self.warming.compile_time_s <= 0:
            return None
        return self.proof.compile_time_s / self.warming.compile_time_s

    def report(self) -> WarmDocument:
        """The `tpu-tools/cache-warm/v1` document."""
        return WarmDocument(
            schema=SCHEMA, path=self.path, target=self.target, warming=self.warming, fresh_start=self.proof,
            proven=self.proven,
            compile_seconds_saved_s=max(0.0, self.warming.compile_time_s - self.proof.compile_time_s),
            warm_to_cold_ratio=self.ratio)


class WarmDocument(msgspec.Struct, kw_only=True):
    """`tpu-profile cache warm`'s document, in its JSON key order."""

    schema: str
    path: str
    target: str
    warming: WarmRun
    fresh_start: WarmRun
    proven: bool
    compile_seconds_saved_s: float
    warm_to_cold_ratio: float | None


def run_child(directory: Path, target: WarmTarget, timeout_s: float, min_compile_time_s: float = 0.0) -> WarmRun:
    """One fresh process compiling `target` with the cache at `directory`; RuntimeFailure if it fails."""
    with tempfile.TemporaryDirectory(prefix="tpu-tools-warm-") as scratch:
        answer = Path(scratch) / "answer.json"
        request = {"target": asdict(target), "answer": str(answer)}
        env = dict(os.environ)
        env["JAX_COMPILATION_CACHE_DIR"] = str(directory)
        env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = repr(min_compile_time_s)
        env["TPU_TOOLS_WARM_REQUEST"] = json.dumps(request)
        started = time.monotonic()
        try:
            process = subprocess.run([sys.executable, "-m", "tpu_tools.profile.cachewarm"], env=env,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     timeout=timeout_s, start_new_session=True)
        except subprocess.TimeoutExpired:
            raise RuntimeFailure(f"compiling {target.display} did not finish within {timeout_s:g} s") from None
        wall = time.monotonic() - started
        try:
            data = json.loads(answer.read_text())
        except (OSError, ValueError):
            tail = process.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no message"]
            raise RuntimeFailure(f"compiling {target.display} failed (exit status {process.returncode}): "
                                 f"{tail[0][:300]}") from None
    if data.get("error"):
        raise RuntimeFailure(f"compiling {target.display} failed: {shorten(str(data['error']), 300)}")
    return WarmRun(float(data["compile_time_s"]), int(data["compiles"]), int(data["lookups"]), int(data["hits"]),
                   int(data["misses"]), int(data["entries_written"]), wall, list(data.get("explanations") or []))


def warm(directory: Path, target: WarmTarget, timeout_s: float, min_compile_time_s: float = 0.0) -> WarmResult:
    make_directory(directory)  # before the runs: a FIFO, a device or a file in its place is one sentence
    warming = run_child(directory, target, timeout_s, min_compile_time_s)
    proof = run_child(directory, target, timeout_s, min_compile_time_s)
    return WarmResult(str(directory), target.display, warming, proof)


# --- the child -------------------------------------------------------------------------------------

def _compile(target: WarmTarget) -> None:
    import jax

    if target.kind == "builtin":
        from tpu_tools.profile.workloads import builtin_workload

        workload = builtin_workload(target.target or "train", target.preset or "tiny", target.batch)
        jax.jit(workload.function).lower(*workload.arguments).compile()
    elif target.kind == "function":
        from tpu_tools.userfn.specs import abstract_arguments, parse_arg_spec
        from tpu_tools.userfn.target import resolve_target

        function = resolve_target(target.target or "")
        jitted = function if hasattr(function, "lower") else jax.jit(function)
        jitted.lower(*abstract_arguments([parse_arg_spec(a) for a in target.args])).compile()
    else:
        import runpy

        sys.argv = [target.script or target.module or "", *target.args]
        sys.path.insert(0, os.getcwd())
        try:
            if target.script:
                runpy.run_path(target.script, run_name="__main__")
            else:
                runpy.run_module(target.module or "", run_name="__main__", alter_sys=True)
        except SystemExit as end:
            if end.code not in (None, 0):
                raise RuntimeError(f"the program exited with status {end.code}") from None


def _child_main() -> int:
    request = json.loads(os.environ.pop("TPU_TOOLS_WARM_REQUEST"))
    target = WarmTarget(**request["target"])
    import jax

    from tpu_tools.instrument.cachewatch import watch

    watch().install(jax)
    compiled = {"time": 0.0, "count": 0}

    def on_duration(event: str, duration_secs: float, **kwargs: Any) -> None:
        if event == COMPILE_EVENT:
            compiled["time"] += duration_secs
            compiled["count"] += 1

    jax.monitoring.register_event_duration_secs_listener(on_duration)
    error = None
    try:
        _compile(target)
    except Exception as failure:  # noqa: BLE001 the user's program fails its own ways: the answer says how
        error = f"{type(failure).__name__}: {failure}"
    figures = watch().snapshot()
    answer = {"error": error, "compile_time_s": compiled["time"], "compiles": compiled["count"],
              "lookups": figures["lookups"], "hits": figures["hits"], "misses": figures["misses"],
              "entries_written": figures["entries_written"],
              "explanations": [m["explanation"] for m in figures["recent_misses"]][-10:]}
    Path(request["answer"]).write_text(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(_child_main())
