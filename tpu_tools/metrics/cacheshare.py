"""Jobs' compilation caches across processes and hosts: shared writers, Prometheus series, fleet records.

Each agent reports the cache directory its job uses and how many entries the
job wrote there (`compilation_cache` in its snapshot). A directory written by
more than one process, or by processes on more than one host (the fleet view
names hosts by Prometheus's `instance`), is the trap the safe patterns avoid:
one writable cache per process or host, or one writer that warms a shared cache
the others only read. `shared_cache_dirs` names the writers of each such
directory.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from tpu_tools.metrics.records.jobs import AgentEntry, CacheWriter, ProcessesGroup, SharedCacheDir

PREFIX = "tpu_tools_"
_COUNTERS = (("lookups", "compilation_cache_lookups", "Persistent compilation cache lookups of the job."),
             ("hits", "compilation_cache_hits", "Lookups served from the persistent compilation cache."),
             ("misses", "compilation_cache_misses", "Lookups not found in the persistent compilation cache."),
             ("entries_written", "compilation_cache_entries_written",
              "Entries the job wrote into the persistent compilation cache."),
             ("seconds_saved_s", "compilation_cache_saved_seconds",
              "Compile seconds saved by hits, as JAX counts them (stored whole seconds minus the read time)."))
# Scraped series names (after "tpu_tools_process_") -> the snapshot's keys, for the fleet view.
FLEET_SERIES = {f"{name}_total": key for key, name, _ in _COUNTERS}


def _writer_text(writer: CacheWriter) -> str:
    where = f"{writer.host}:" if writer.host else ""
    return f"{where}{writer.pid}" + (f" ({writer.tag})" if writer.tag else "")


def _shared(directory: str, writers: list[CacheWriter]) -> SharedCacheDir:
    hosts = sorted({w.host for w in writers if w.host})
    across = f" on {len(hosts)} hosts" if len(hosts) > 1 else ""
    return SharedCacheDir(dir=directory, writers=writers, hosts=hosts, message=(
        f"compilation cache {directory} is written by {len(writers)} processes{across}: "
        f"{', '.join(_writer_text(w) for w in writers)}; give each process or host its own cache, or let one "
        "writer warm it and the others read"))


def shared_cache_dirs(agents: list[AgentEntry]) -> list[SharedCacheDir]:
    """The directories more than one of these agents' jobs wrote entries into."""
    by_dir: dict[str, list[CacheWriter]] = {}
    for agent in agents:
        cache = agent.compilation_cache
        if cache is None or not cache.dir_in_use or not cache.entries_written:
            continue
        host = agent.host_name or cache.host
        by_dir.setdefault(cache.dir_in_use, []).append(CacheWriter(pid=agent.pid, tag=agent.tag, host=host or None,
                                                                   entries_written=cache.entries_written))
    return [_shared(d, sorted(w, key=lambda x: (x.host or "", x.pid or 0)))
            for d, w in sorted(by_dir.items()) if len(w) > 1]


def cache_metrics(data: ProcessesGroup) -> Iterator[Metric]:
    """Prometheus families of the jobs' caches, labelled by pid, tag and cache_dir (the directory in use)."""
    labels = ["pid", "tag", "cache_dir"]
    counters = {key: CounterMetricFamily(f"{PREFIX}process_{name}", doc, labels=labels)
                for key, name, doc in _COUNTERS}
    late = GaugeMetricFamily(f"{PREFIX}process_compilation_cache_set_too_late",
                             "1 for each runtime setting the job changed after it could take effect.",
                             labels=["pid", "tag", "setting"])
    shared = GaugeMetricFamily(f"{PREFIX}compilation_cache_writers",
                               "Processes on this host that wrote into a cache directory written by more than one.",
                               labels=["cache_dir"])
    agents = [a for a in data.agents if not a.error]
    for agent in agents:
        cache = agent.compilation_cache
        if cache is None:
            continue
        pid, tag = str(agent.pid), agent.tag or ""
        if cache.dir_in_use is not None:
            for key, family in counters.items():
                value = getattr(cache, key)
                if value is not None:
                    family.add_metric([pid, tag, cache.dir_in_use], float(value))
        for setting in cache.set_too_late or []:
            late.add_metric([pid, tag, str(setting.setting)], 1.0)
    for found in shared_cache_dirs(agents):
        shared.add_metric([found.dir], float(len(found.writers)))
    yield from counters.values()
    yield late
    yield shared


def take_fleet_sample(agent: dict[str, Any], figure: str, labels: dict[str, str], value: float) -> bool:
    """Put one scraped `process_compilation_cache_*` series into a fleet agent record; False if not one."""
    if figure == "compilation_cache_set_too_late":
        cache = agent.setdefault("compilation_cache", {})
        cache.setdefault("set_too_late", []).append({"setting": labels.get("setting"), "message":
                                                     f"{labels.get('setting')} set too late: no effect"})
        return True
    key = FLEET_SERIES.get(figure)
    if key is None:
        return False
    cache = agent.setdefault("compilation_cache", {})
    cache["dir_in_use"] = labels.get("cache_dir")
    cache[key] = value if key == "seconds_saved_s" else int(value)
    return True
