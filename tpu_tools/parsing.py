"""Parsing of sizes and durations given by users (flags, config files, the environment). Base layer."""

from __future__ import annotations

import math
import os
import re
from typing import Any

from tpu_tools.shorten import quoted

# ASCII digits only, everywhere: Python's int() and float() also take "١" (Arabic-Indic) and "1_0", which no
# documented option accepts, and "\d" in a pattern matches every script's digits unless re.ASCII.
_SIZE_PATTERN = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE | re.ASCII)
MAX_SIZE_BYTES = float(1 << 60)
_SIZE_FACTORS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """Parse "64", "4K", "16M", "1G", "2GiB", "512KB" as bytes (K = 1024). Raises ValueError."""
    match = _SIZE_PATTERN.match(text) if isinstance(text, str) and len(text) <= MAX_NUMBER_TEXT else None
    if not match:
        raise ValueError(f"{quoted(text)} is not a size (use a number with an optional K, M, G or T suffix)")
    value = float(match.group(1)) * _SIZE_FACTORS[match.group(2).upper()]
    if not math.isfinite(value) or value > MAX_SIZE_BYTES:
        raise ValueError(f"{quoted(text)} is far too large a size (at most 1E)")
    if value != int(value):
        raise ValueError(f"{text!r} is not a whole number of bytes")
    return int(value)


MAX_PERIOD_S = 86400.0
_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(ms|s|m|h)?\s*$", re.ASCII)
_FACTORS = {None: 1.0, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(value: Any, what: str = "period", *, minimum: float | None = None,
                   maximum: float = MAX_PERIOD_S) -> float:
    """Seconds from 1, 0.5, "500ms", "2s", "1m"; raises ValueError with a sentence.

    Always finite and greater than 0; `minimum` (a floor such as MIN_PERIOD_S) and `maximum` (a day unless
    given) bound it further.
    """
    if isinstance(value, bool):
        raise ValueError(f"{what} must be a duration, not {value!r}")
    if isinstance(value, str) and len(value) > MAX_NUMBER_TEXT:
        raise ValueError(f"{what} {quoted(value)} is not a duration")
    if isinstance(value, (int, float)):
        try:
            seconds = float(value)
        except OverflowError:  # a 400-digit integer from a JSON or TOML file
            raise ValueError(f"{what} {quoted(value)} is far too long") from None
    elif isinstance(value, str) and (match := _DURATION.match(value)):
        seconds = float(match.group(1)) * _FACTORS[match.group(2)]
    else:
        raise ValueError(f"{what} {quoted(value)} is not a duration (use seconds, or a number with ms, s, m or h)")
    if not seconds > 0 or seconds != seconds:
        raise ValueError(f"{what} must be greater than 0, got {quoted(value)}")
    if seconds > maximum:
        longest = "a day" if maximum == MAX_PERIOD_S else f"{maximum:g} s"
        raise ValueError(f"{what} {quoted(value)} is longer than {longest}")
    if minimum is not None and seconds < minimum:
        raise ValueError(f"{what} {quoted(value)} is shorter than {minimum:g} s")
    return seconds


# --- numbers ------------------------------------------------------------------------------------------
# Every number a user gives (flags, config files) goes through `parse_number`: finite, in range, whole where
# it must be. Text longer than this is refused before conversion: int("9" * 5000) is slow or refused, and no
# sensible option value needs more digits.
MAX_NUMBER_TEXT = 40
MIN_PERIOD_S = 0.1  # a report or refresh period below this is a busy loop, not a measurement
MAX_TIMEOUT_S = 7 * 86400.0  # a week: anything longer is a typo or an attempt to wait forever

_MAX_INTEGER = 2**63 - 1
_INTEGER = re.compile(r"^[+-]?[0-9]+$", re.ASCII)
_DECIMAL = re.compile(r"^[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?$", re.ASCII)
_NOT_FINITE = re.compile(r"^[+-]?(?:nan|inf|infinity)$", re.IGNORECASE)


def ascii_digits(text: str) -> bool:
    """True for a non-empty run of ASCII digits ("0" to "9"); str.isdigit() also takes "١" and "²"."""
    return text.isascii() and text.isdigit()


def port_number(text: str) -> int | None:
    """A TCP port (1 to 65535) written in ASCII digits, else None: "８０" or "٨٠" is no port, and "²" (which
    str.isdigit() takes) would make int() raise."""
    return int(text) if ascii_digits(text) and len(text) <= 5 and 0 < int(text) < 65536 else None


def parse_number(value: Any, what: str, *, minimum: float | None = None, maximum: float | None = None,
                 above: float | None = None, integer: bool = False) -> Any:
    """A finite number from a flag's text or a config value, checked against its range; ValueError otherwise.

    `minimum`/`maximum` are inclusive bounds, `above` an exclusive lower bound; `integer` asks for a whole number
    (returned as int). NaN, infinities, booleans and over-long text are refused with a sentence naming `what`.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{what} must be a number, not {quoted(value)}")
    number: float | int
    if isinstance(value, str):
        number = _number_from_text(value, what, integer)
    elif integer and isinstance(value, float):
        if not (math.isfinite(value) and value == int(value)):
            raise ValueError(f"{what} {quoted(value)} is not a whole number")
        number = int(value)
    else:
        number = value
    if isinstance(number, float) and not math.isfinite(number):
        raise ValueError(f"{what} must be a finite number, got {quoted(value)}")
    if isinstance(number, int) and abs(number) > _MAX_INTEGER:  # beyond int64 and float: no option means it
        raise ValueError(f"{what} {quoted(value)} is not a sensible number")
    if above is not None and not number > above:
        raise ValueError(f"{what} must be greater than {_bound(above)}, got {quoted(value)}")
    if minimum is not None and number < minimum:
        raise ValueError(f"{what} must be at least {_bound(minimum)}, got {quoted(value)}")
    if maximum is not None and number > maximum:
        raise ValueError(f"{what} {quoted(value)} is absurdly large (at most {_bound(maximum)})")
    return int(number) if integer else float(number) + 0.0  # + 0.0: -0 is 0


def _number_from_text(text: str, what: str, integer: bool) -> float | int:
    """parse_number's reading of text (not stripped: " 7 " is a quoting mistake, and str.strip() takes every
    script's spaces); its range is checked by the caller."""
    if len(text) > MAX_NUMBER_TEXT:
        raise ValueError(f"{what} {quoted(text)} is not a sensible number ({len(text)} characters)")
    if not text.strip():
        raise ValueError(f"{what} must not be empty")
    if integer:
        if not _INTEGER.fullmatch(text):
            raise ValueError(f"{what} {quoted(text)} is not a whole number")
        return int(text)
    if not (_DECIMAL.fullmatch(text) or _NOT_FINITE.fullmatch(text)):  # NaN and infinities refused later, by name
        raise ValueError(f"{what} {quoted(text)} is not a number")
    number = float(text)
    if number == 0 and re.search(r"[1-9]", re.split(r"[eE]", text)[0]):
        raise ValueError(f"{what} {quoted(text)} is too small to be told from 0")
    return number


def _bound(limit: float) -> str:
    return str(int(limit)) if float(limit).is_integer() and abs(limit) < 1e15 else f"{limit:g}"


# --- the terminal's size ------------------------------------------------------------------------------
# COLUMNS=99999999999 made a table or a tpu-top frame that wide (MemoryError); rich reads COLUMNS with
# str.isdigit() and int(), which raises on "²". Wider or taller than this is no screen anyone reads.
MAX_COLUMNS = 4096
MAX_LINES = 4096


def terminal_size(fd: int | None = None, fallback: tuple[int, int] = (120, 24)) -> os.terminal_size:
    """The size to draw for: COLUMNS and LINES where they are whole numbers in ASCII digits, else the terminal's
    own size (of `fd`, else of stdout), else `fallback`; each bounded to 1..MAX_COLUMNS or MAX_LINES."""
    real: tuple[int, int] | None = None
    for descriptor in ([fd] if fd is not None else []) + [1]:
        try:
            real = tuple(os.get_terminal_size(descriptor))  # type: ignore[assignment]
            break
        except (OSError, ValueError):
            continue
    size = []
    for index, (name, most) in enumerate((("COLUMNS", MAX_COLUMNS), ("LINES", MAX_LINES))):
        try:
            value = int(parse_number(os.environ.get(name, ""), name, minimum=1, integer=True))
        except ValueError:  # unset, empty or not a number: the terminal's own
            value = (real[index] if real else 0) or fallback[index]
        size.append(max(1, min(value, most)))
    return os.terminal_size(size)
