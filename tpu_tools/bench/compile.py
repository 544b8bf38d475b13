"""`compile`: compile time of the reference train step, cold and warm from the persistent cache.

Each compile runs in a fresh child process (no in-memory cache can help it),
first with an empty cache directory (cold), then with the entries the cold
compile wrote (warm). The warm compile must report a cache hit and no miss,
and the cold one a miss and a written entry, or the case fails.

Cache directories are created, used and removed by the tool under its own
root (`--cache-dir`, default ~/.cache/tpu-tools/bench-compile-cache), never in
a directory that holds anything else. This benchmark runs before the suite
opens the device in its own process: a TPU belongs to one process at a time.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpu_tools.bench.compile_child import TARGET
from tpu_tools.bench.failures import CaseSkipped
from tpu_tools.bench.model import ModelChoice, model_name
from tpu_tools.bench.records import Case, CaseResult
from tpu_tools.bench.stats import summarize
from tpu_tools.pjrt.runtime import RuntimePolicy


def default_cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tpu-tools" / "bench-compile-cache"


@dataclass(frozen=True)
class CompileOptions:
    model: ModelChoice = ModelChoice("tiny")
    repeats: int = 1
    cache_root: str | None = None


def plan(options: CompileOptions) -> list[Case]:
    config = options.model.config()
    return [Case("compile", model_name(options.model, config),
                 {"config": config.to_dict(), "repeats": options.repeats,
                  "cache_root": str(options.cache_root or default_cache_root())})]


def run_out_of_process(case: Case, policy: RuntimePolicy, timeout_s: float) -> CaseResult:
    from tpu_tools.pjrt.isolate import run_isolated

    root = Path(case.params["cache_root"])
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise CaseSkipped(f"cannot create the compile cache directory {root}: {error.strerror}") from error
    colds: list[dict[str, Any]] = []
    warms: list[dict[str, Any]] = []
    for _ in range(case.params["repeats"]):
        cache_dir = tempfile.mkdtemp(prefix="run-", dir=root)
        try:
            params = {"config": case.params["config"], "cache_dir": cache_dir}
            cold = run_isolated(TARGET, params, policy, timeout_s)
            warm = run_isolated(TARGET, params, policy, timeout_s)
        finally:
            shutil.rmtree(cache_dir, ignore_errors=True)
        _verify(cold, warm)
        colds.append(cold)
        warms.append(warm)

    result = CaseResult(case, primary="warm_compile_ms")
    result.stats["cold_compile_ms"] = summarize([c["compile_s"] * 1e3 for c in colds])
    result.stats["warm_compile_ms"] = summarize([w["compile_s"] * 1e3 for w in warms])
    result.values.update({
        "speedup": result.stats["cold_compile_ms"].median / result.stats["warm_compile_ms"].median,
        "cache_hit_verified": True,
        "cache_entries_written": colds[-1]["cache_entries_written"],
        "cold_backend_compile_ms": _median_ms(colds, "backend_compile_s"),
        "warm_backend_compile_ms": _median_ms(warms, "backend_compile_s"),
        "devices": colds[-1]["device_count"],
        "device_kind": colds[-1]["device_kind"],
        "cache_root": str(root),
    })
    return result


def _verify(cold: dict[str, Any], warm: dict[str, Any]) -> None:
    if cold["cache_hits"] or not cold["cache_misses"] or cold["cache_entries_at_start"]:
        raise CaseSkipped(f"the cold compile was not cold (cache hits {cold['cache_hits']}, misses "
                          f"{cold['cache_misses']}, entries at start {cold['cache_entries_at_start']})")
    if cold["cache_entries_written"] < 1:
        raise CaseSkipped("the cold compile wrote no entry to the persistent compilation cache")
    if not warm["cache_hits"] or warm["cache_misses"]:
        raise CaseSkipped(f"the warm compile did not hit the persistent compilation cache (hits "
                          f"{warm['cache_hits']}, misses {warm['cache_misses']})")


def _median_ms(records: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in records if r.get(key) is not None]
    return summarize(values).median * 1e3 if values else None
