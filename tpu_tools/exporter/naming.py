"""The naming rules of every Prometheus family tpu-tools serves, in one place.

Every family the exporter serves follows them (a test walks the whole output of every fixture host):

- the name is `tpu_tools_` and snake_case, and ends in its unit in base units: seconds, bytes,
  bytes_per_second, joules, watts, celsius, hertz, or `_ratio` (0..1) for a share; a count has no unit;
- no abbreviated units (`_us`, `_ms`, `_mbps`, `_hz`, `_secs`, ...): a figure is converted, not relabelled;
- a counter's name is given without `_total` (the client library adds it); a gauge never ends in `_total`;
- distributions are histograms (`_bucket`/`_sum`/`_count`), never gauges with a `quantile` label;
- a family with no sample is not served (the collector drops it);
- one figure, one name: each family is served by one exporter (a test checks no name is produced twice).

`LEGACY_PERCENT` lists the families that predate the `_ratio` rule and keep their name because dashboards and
alert rules of deployed fleets read them; no new family joins it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from prometheus_client.core import Metric

PREFIX = "tpu_tools_"
NAME = re.compile(r"^tpu_tools_[a-z][a-z0-9]*(_[a-z0-9]+)*$")
LABEL = re.compile(r"^[a-z][a-z0-9_]*$")
# Abbreviated or non-base units, as a name's last words.
ABBREVIATED = ("us", "ms", "ns", "usec", "msec", "sec", "secs", "mbps", "gbps", "kbps", "hz", "mhz", "ghz", "kb",
               "mb", "gb", "kib", "mib", "gib", "pct", "celcius", "c", "w", "j")
# Units a histogram may be measured in (a histogram of a count has none, e.g. `..._size`; name it so).
HISTOGRAM_UNITS = ("_seconds", "_bytes", "_bytes_per_second", "_ratio")
# CPU use as a percent of one core (a process) or of all cores (the host): read by deployed dashboards.
LEGACY_PERCENT = frozenset({"tpu_tools_host_cpu_percent", "tpu_tools_process_cpu_percent"})
RESERVED_LABELS = ("le", "quantile")


def family_problems(family: Metric) -> list[str]:
    """What breaks the rules in one family, as sentences naming it; [] when it follows them."""
    name, problems = family.name, []
    if not NAME.match(name):
        problems.append(f"{name}: not a snake_case name starting with {PREFIX}")
    words = name.split("_")
    if words[-1] in ABBREVIATED or (len(words) > 1 and words[-1] == "second" and words[-2] in ABBREVIATED):
        problems.append(f"{name}: an abbreviated unit; convert the figure to base units")
    if "percent" in words and name not in LEGACY_PERCENT:
        problems.append(f"{name}: a share is a _ratio from 0 to 1, not a percent")
    if family.type == "gauge" and name.endswith("_total"):
        problems.append(f"{name}: a gauge ending in _total reads as a counter")
    if family.type == "histogram" and not name.endswith(HISTOGRAM_UNITS) and not name.endswith("_size"):
        problems.append(f"{name}: a histogram's name ends in its base unit ({', '.join(HISTOGRAM_UNITS)})")
    if not family.samples:
        problems.append(f"{name}: a family without samples")
    if not family.documentation.strip():
        problems.append(f"{name}: no help text")
    labels = {label for sample in family.samples for label in sample.labels}
    for label in sorted(labels):
        if not LABEL.match(label):
            problems.append(f"{name}: label {label!r} is not snake_case")
        if label in RESERVED_LABELS and family.type not in ("histogram", "summary"):
            problems.append(f"{name}: label {label!r} belongs to histograms and summaries only")
    return problems


def problems(families: Iterable[Metric]) -> list[str]:
    """The rule problems of many families, plus a name served by more than one family."""
    found: list[str] = []
    seen: set[str] = set()
    for family in families:
        found += family_problems(family)
        if family.name in seen:
            found.append(f"{family.name}: served twice")
        seen.add(family.name)
    return found
