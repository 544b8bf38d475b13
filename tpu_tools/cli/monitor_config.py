"""`tpu-monitor --config FILE`: which groups, each group's period, a tag filter.

TOML or JSON (by extension; otherwise TOML, then JSON). Example (TOML)::

    period = "1s"             # seconds between reports (a number, or "500ms", "2s", "1m")
    tag_filter = "^train"     # only agents whose tag matches this regular expression
    agent_timeout = 1.0       # seconds to wait for each agent's answer
    metrics_addr = ["localhost:8432"]  # libtpu metrics services besides the default ones
    metrics_timeout = "500ms"  # deadline of every call to them
    price_per_hour = 4.2      # price of this machine per hour: the jobs' cost per 1M samples

    [prometheus]              # which families --prometheus serves (names or globs; deny wins)
    allow = ["tpu_tools_device_*", "tpu_tools_gpu_*"]
    deny = ["tpu_tools_gpu_process_*"]

    [groups.host]
    period = "5s"
    [groups.devices]
    [groups.processes]
    [groups.libtpu]

Groups not named under [groups] are left out of the report (no [groups]
table: all of them). Unknown keys, unknown groups, bad periods and bad
regular expressions are usage errors naming the file and the key.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpu_tools.errors import UsageError
from tpu_tools.infile import InputFileError, read_input_file
from tpu_tools.parsing import MIN_PERIOD_S, parse_duration, parse_number
from tpu_tools.shorten import quoted

TOP_KEYS = ("period", "tag_filter", "agent_timeout", "metrics_addr", "metrics_timeout", "price_per_hour", "groups",
            "prometheus")
PROMETHEUS_KEYS = ("allow", "deny")
GROUP_KEYS = ("period",)
MAX_CONFIG_BYTES = 1 << 20  # a monitor config is a few lines; a bigger file is a mistake
MAX_METRICS_TIMEOUT_S = 600.0  # as --metrics-timeout
MAX_PRICE_PER_HOUR = 1e9  # as --price-per-hour


@dataclass
class GroupConfig:
    period_s: float | None = None
    settings: dict[str, Any] = field(default_factory=dict)


@dataclass
class MonitorConfig:
    period_s: float | None = None
    tag_filter: re.Pattern[str] | None = None
    agent_timeout_s: float | None = None
    metrics_addr: list[str] | None = None  # libtpu metrics services, as given (normalized)
    metrics_timeout_s: float | None = None
    price_per_hour: float | None = None  # for jobs that do not set their own
    groups: dict[str, GroupConfig] | None = None  # None: every group
    metrics_allow: tuple[str, ...] | None = None  # [prometheus] allow: family names or globs
    metrics_deny: tuple[str, ...] | None = None


def _load_document(path: Path) -> dict[str, Any]:
    try:
        text = read_input_file(path, "config file", MAX_CONFIG_BYTES).decode("utf-8")
    except InputFileError as error:
        raise UsageError(str(error)) from None
    except UnicodeDecodeError as error:
        raise UsageError(f"config file {path} is not UTF-8 text") from error
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    if path.suffix.lower() == ".json":
        try:
            document = json.loads(text)
        except ValueError as error:
            raise UsageError(f"config file {path} is not valid JSON: {error}") from error
        except RecursionError:  # 100k nested brackets: no config nests more than two levels
            raise UsageError(f"config file {path} is nested too deeply") from None
    else:
        try:
            document = tomllib.loads(text)
        except RecursionError:
            raise UsageError(f"config file {path} is nested too deeply") from None
        except tomllib.TOMLDecodeError as error:
            if path.suffix.lower() == ".toml":
                raise UsageError(f"config file {path} is not valid TOML: {error}") from error
            try:
                document = json.loads(text)
            except RecursionError:
                raise UsageError(f"config file {path} is nested too deeply") from None
            except ValueError:
                raise UsageError(f"config file {path} is neither valid TOML ({error}) nor JSON") from error
        except ValueError:  # not a TOMLDecodeError: an integer beyond Python's conversion limit
            raise UsageError(f"config file {path} holds a number too long to read") from None
    if not isinstance(document, dict):
        raise UsageError(f"config file {path} must hold a table (a JSON object)")
    return document


def _unknown(keys: Any, allowed: tuple[str, ...], where: str, path: Path) -> None:
    extra = sorted(set(keys) - set(allowed))
    if extra:
        raise UsageError(f"config file {path}: unknown key{'s' if len(extra) > 1 else ''} "
                         f"{', '.join(repr(k) for k in extra)} {where} (known: {', '.join(allowed)})")


def _addresses(value: Any, path: Path) -> list[str]:
    from tpu_tools.metrics.libtpu.addresses import normalize_address

    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
        raise UsageError(f"config file {path}: metrics_addr must be an address or a list of addresses "
                         "(\"HOST:PORT\")")
    try:
        return [normalize_address(item) for item in items]
    except UsageError as error:
        raise UsageError(f"config file {path}: {error}") from error


def _selection(config: MonitorConfig, table: Any, path: Path) -> None:
    from tpu_tools.exporter.selection import parse_globs

    if not isinstance(table, dict):
        raise UsageError(f"config file {path}: prometheus must be a table (allow, deny)")
    _unknown(table, PROMETHEUS_KEYS, "in prometheus", path)
    for key in PROMETHEUS_KEYS:
        if key in table:
            value = table[key]
            items = [value] if isinstance(value, str) else value
            if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
                raise UsageError(f"config file {path}: prometheus.{key} must be a name or a list of names (globs)")
            setattr(config, f"metrics_{key}", parse_globs(items, f"config file {path}: prometheus.{key}"))


def _price(value: Any, path: Path) -> float:
    # A number of the file's own syntax: text ("4.2", "cheap") is refused rather than guessed at.
    if isinstance(value, str):
        raise UsageError(f"config file {path}: price_per_hour must be a number, not text ({quoted(value, 40)})")
    try:
        return float(parse_number(value, "price_per_hour", above=0.0, maximum=MAX_PRICE_PER_HOUR))
    except ValueError as error:
        raise UsageError(f"config file {path}: {error}") from error


def load_config(path: Path, known_groups: list[str]) -> MonitorConfig:
    """Read a tpu-monitor config file (TOML or JSON) into a `MonitorConfig`.

    Raises UsageError, naming the file and the key, for an unreadable file, bad syntax, an unknown key or
    group, or a value of the wrong kind.
    """
    document = _load_document(path)
    _unknown(document, TOP_KEYS, "at the top level", path)
    config = MonitorConfig()
    _durations(document, config, path)
    if "price_per_hour" in document:
        config.price_per_hour = _price(document["price_per_hour"], path)
    if "metrics_addr" in document:
        config.metrics_addr = _addresses(document["metrics_addr"], path)
    if "tag_filter" in document:
        config.tag_filter = _tag_filter(document["tag_filter"], path)
    if "prometheus" in document:
        _selection(config, document["prometheus"], path)
    if "groups" in document:
        config.groups = _groups(document["groups"], known_groups, path)
    return config


def _durations(document: dict[str, Any], config: MonitorConfig, path: Path) -> None:
    try:
        if "period" in document:
            config.period_s = parse_duration(document["period"], "period", minimum=MIN_PERIOD_S)
        if "agent_timeout" in document:
            config.agent_timeout_s = parse_duration(document["agent_timeout"], "agent_timeout")
        if "metrics_timeout" in document:
            config.metrics_timeout_s = parse_duration(document["metrics_timeout"], "metrics_timeout",
                                                      maximum=MAX_METRICS_TIMEOUT_S)
    except ValueError as error:
        raise UsageError(f"config file {path}: {error}") from error


def _tag_filter(pattern: Any, path: Path) -> re.Pattern[str]:
    if not isinstance(pattern, str):
        raise UsageError(f"config file {path}: tag_filter must be a string (a regular expression)")
    try:
        return re.compile(pattern)
    except re.error as error:
        raise UsageError(f"config file {path}: tag_filter {pattern!r} is not a valid regular expression: "
                         f"{error}") from error


def _groups(groups: Any, known_groups: list[str], path: Path) -> dict[str, GroupConfig]:
    if isinstance(groups, list):  # a plain list of names is accepted too
        groups = {name: {} for name in groups if isinstance(name, str)} if all(
            isinstance(n, str) for n in groups) else None
    if not isinstance(groups, dict):
        raise UsageError(f"config file {path}: groups must be a table of group names (or a list of names)")
    chosen: dict[str, GroupConfig] = {}
    for name, settings in groups.items():
        if name not in known_groups:
            raise UsageError(f"config file {path}: unknown group {name!r} (known: {', '.join(known_groups)})")
        if settings is None:
            settings = {}
        if not isinstance(settings, dict):
            raise UsageError(f"config file {path}: groups.{name} must be a table")
        _unknown(settings, GROUP_KEYS, f"in groups.{name}", path)
        group = GroupConfig()
        if "period" in settings:
            try:
                group.period_s = parse_duration(settings["period"], f"groups.{name}.period", minimum=MIN_PERIOD_S)
            except ValueError as error:
                raise UsageError(f"config file {path}: {error}") from error
        chosen[name] = group
    return chosen
