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
from dataclasses import asdict, dataclass, field
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

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


@dataclass
class Writer:
    pid: int | None
    tag: str | None
    host: str | None
    entries_written: int

    @property
    def text(self) -> str:
        where = f"{self.host}:" if self.host else ""
        return f"{where}{self.pid}" + (f" ({self.tag})" if self.tag else "")


@dataclass
class SharedCacheDir:
    """A cache directory written by more than one process."""

    dir: str
    writers: list[Writer] = field(default_factory=list)

    @property
    def hosts(self) -> list[str]:
        return sorted({w.host for w in self.writers if w.host})

    @property
    def message(self) -> str:
        across = f" on {len(self.hosts)} hosts" if len(self.hosts) > 1 else ""
        return (f"compilation cache {self.dir} is written by {len(self.writers)} processes{across}: "
                f"{', '.join(w.text for w in self.writers)}; give each process or host its own cache, or let one "
                "writer warm it and the others read")

    def to_dict(self) -> dict[str, Any]:
        return {"dir": self.dir, "writers": [asdict(w) for w in self.writers], "hosts": self.hosts,
                "message": self.message}


def _cache(agent: dict[str, Any]) -> dict[str, Any]:
    cache = agent.get("compilation_cache")
    return cache if isinstance(cache, dict) else {}


def shared_cache_dirs(agents: list[dict[str, Any]]) -> list[SharedCacheDir]:
    """The directories more than one of these agents' jobs wrote entries into (never raises on odd entries)."""
    by_dir: dict[str, list[Writer]] = {}
    for agent in agents:
        cache = _cache(agent)
        directory, written = cache.get("dir_in_use"), cache.get("entries_written")
        if not isinstance(directory, str) or not isinstance(written, int) or written <= 0:
            continue
        host = agent.get("host") or cache.get("host")
        pid = agent.get("pid")
        by_dir.setdefault(directory, []).append(Writer(pid if isinstance(pid, int) else None, agent.get("tag"),
                                                       str(host) if host else None, written))
    return [SharedCacheDir(d, sorted(w, key=lambda x: (x.host or "", x.pid or 0)))
            for d, w in sorted(by_dir.items()) if len(w) > 1]


def cache_metrics(data: dict[str, Any]) -> Iterator[Metric]:
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
    agents = [a for a in data.get("agents") or [] if isinstance(a, dict) and not a.get("error")]
    for agent in agents:
        cache = _cache(agent)
        pid, tag = str(agent.get("pid")), str(agent.get("tag") or "")
        directory = cache.get("dir_in_use")
        if isinstance(directory, str):
            for key, family in counters.items():
                value = cache.get(key)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    family.add_metric([pid, tag, directory], float(value))
        for setting in cache.get("set_too_late") or []:
            if isinstance(setting, dict):
                late.add_metric([pid, tag, str(setting.get("setting"))], 1.0)
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
