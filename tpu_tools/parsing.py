"""Parsing of sizes and durations given by users (flags, config files). Base layer."""

from __future__ import annotations

import re
from typing import Any

_SIZE_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)
_SIZE_FACTORS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """Parse "64", "4K", "16M", "1G", "2GiB", "512KB" as bytes (K = 1024). Raises ValueError."""
    match = _SIZE_PATTERN.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a size (use a number with an optional K, M, G or T suffix)")
    value = float(match.group(1)) * _SIZE_FACTORS[match.group(2).upper()]
    if value != int(value):
        raise ValueError(f"{text!r} is not a whole number of bytes")
    return int(value)


MAX_PERIOD_S = 86400.0
_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h)?\s*$")
_FACTORS = {None: 1.0, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(value: Any, what: str = "period") -> float:
    """Seconds from 1, 0.5, "500ms", "2s", "1m"; raises ValueError with a sentence."""
    if isinstance(value, bool):
        raise ValueError(f"{what} must be a duration, not {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str) and (match := _DURATION.match(value)):
        seconds = float(match.group(1)) * _FACTORS[match.group(2)]
    else:
        raise ValueError(f"{what} {value!r} is not a duration (use seconds, or a number with ms, s, m or h)")
    if not seconds > 0 or seconds != seconds:
        raise ValueError(f"{what} must be greater than 0, got {value!r}")
    if seconds > MAX_PERIOD_S:
        raise ValueError(f"{what} {value!r} is longer than a day")
    return seconds
