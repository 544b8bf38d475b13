"""Reading system files for the dump: under the discovery root, bounded in size.

System files are read below `TPU_TOOLS_SYSROOT` (default `/`), the same root
passive discovery uses, so tests point the dump at fixture trees. Reads are
capped in size; a read that blocks (a hung mount, a FIFO) is the collector
runner's business: it stops the collector at its timeout.
"""

from __future__ import annotations

from pathlib import Path

from tpu_tools.pjrt.discover import sysroot

DEFAULT_LIMIT = 4 << 20


def under_root(path: str, root: Path | None = None) -> Path:
    """`path` (absolute, as on the host) below the root."""
    return (root or sysroot()) / path.lstrip("/")


def read_bytes(path: Path, limit: int = DEFAULT_LIMIT) -> bytes:
    """At most `limit` bytes from the start of a file; raises OSError."""
    with open(path, "rb") as handle:
        return handle.read(limit)


def read_text(path: Path, limit: int = DEFAULT_LIMIT) -> str:
    return read_bytes(path, limit).decode("utf-8", "replace")


def try_text(path: Path, notes: list[str] | None = None, limit: int = DEFAULT_LIMIT) -> str | None:
    """The file's text, or None (with a note) when it is missing or unreadable."""
    try:
        return read_text(path, limit).strip()
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        if notes is not None:
            notes.append(f"{path}: {describe_os_error(error)}")
        return None


def describe_os_error(error: BaseException) -> str:
    if isinstance(error, OSError) and error.strerror:
        return error.strerror.lower()
    return f"{type(error).__name__}: {error}"


def parse_key_values(text: str, separator: str = ":") -> dict[str, str]:
    """`Key: value` lines (meminfo, cpuinfo blocks, os-release with "=") as a dict; first wins."""
    result: dict[str, str] = {}
    for line in text.splitlines():
        key, found, value = line.partition(separator)
        if found and key.strip():
            result.setdefault(key.strip(), value.strip().strip('"'))
    return result
