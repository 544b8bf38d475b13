"""Human formatting of bytes, times and rates; "-" for what is unknown. Base layer: imports nothing of tpu_tools."""

from __future__ import annotations

MISSING = "-"
_BINARY_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
_SI_PREFIXES = ((1.0, ""), (1e3, "k"), (1e6, "M"), (1e9, "G"), (1e12, "T"), (1e15, "P"))


def format_bytes(value: float | int | None) -> str:
    if value is None:
        return MISSING
    size = float(value)
    for unit in _BINARY_UNITS:
        if abs(size) < 1024 or unit == _BINARY_UNITS[-1]:
            if unit == "B":
                return f"{int(size)} B"
            return f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def format_duration_us(value: float | None) -> str:
    """Microseconds shown in the most readable unit."""
    if value is None:
        return MISSING
    if value < 1e3:
        return f"{value:.1f} us"
    if value < 1e6:
        return f"{value / 1e3:.2f} ms"
    return f"{value / 1e6:.2f} s"


def format_ms(value: float | None) -> str:
    return MISSING if value is None else f"{value:.1f} ms"


def format_percent(value: float | None, digits: int = 1) -> str:
    return MISSING if value is None else f"{value:.{digits}f}%"


def format_rate(value: float | None, unit: str, digits: int = 2) -> str:
    return MISSING if value is None else f"{value:.{digits}f} {unit}"


def format_memory_pair(used: int | None, total: int | None) -> str:
    if used is None and total is None:
        return MISSING
    return f"{format_bytes(used)} / {format_bytes(total)}"


def format_si(value: float | None, unit: str = "", digits: int = 3) -> str:
    """`digits` significant digits under the largest SI prefix that keeps the number at least 1.

    "4.31 GFLOP", "819 GB/s", "5.72 k" (k is lower case, as SI writes it); "-" for None.
    """
    if value is None:
        return MISSING
    chosen = 0
    for index, (factor, _) in enumerate(_SI_PREFIXES):
        if abs(value) >= factor:
            chosen = index
    factor, prefix = _SI_PREFIXES[chosen]
    number = f"{value / factor:.{digits}g}"
    if abs(float(number)) >= 1000 and chosen + 1 < len(_SI_PREFIXES):  # 999.7 rounds up to the next prefix
        factor, prefix = _SI_PREFIXES[chosen + 1]
        number = f"{value / factor:.{digits}g}"
    return f"{number} {prefix}{unit}".rstrip()
def format_bytes_short(value: float | int | None) -> str:
    """Bytes in at most 7 characters for narrow table cells: 512B, 16.0K, 220.7M, 23.6G (powers of 1024)."""
    if value is None:
        return MISSING
    size = float(value)
    for unit in ("B", "K", "M", "G", "T", "P"):
        if abs(size) < 1024 or unit == "P":
            return f"{int(size)}B" if unit == "B" else f"{size:.1f}{unit}"
        size /= 1024
    raise AssertionError("unreachable")


def format_number(value: float | None) -> str:
    """A figure with about three significant digits and no unit: 0.25, 12.5, 250."""
    if value is None:
        return MISSING
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.2f}" if abs(value) < 10 else f"{value:.1f}"


def format_known(value: object) -> str:
    """A count or word as it is, MISSING where it is unknown (None)."""
    return MISSING if value is None else str(value)
