"""Why a benchmark case did not produce figures: unsupported, out of memory, or failed.

A case that cannot run is a result, not the end of the suite: the runner turns
these exceptions (and the runtime's own errors) into a status and one sentence.
"""

from __future__ import annotations

import re

from tpu_tools.bench.records import FAILED, OUT_OF_MEMORY, UNSUPPORTED
from tpu_tools.errors import first_line


class CaseSkipped(Exception):
    """Raised by a benchmark for a case it cannot run; `status` says why."""

    status = FAILED


class Unsupported(CaseSkipped):
    status = UNSUPPORTED


class OutOfMemory(CaseSkipped):
    status = OUT_OF_MEMORY


# Runtime error texts that mean "this platform cannot do that" or "no memory for that".
_OOM = re.compile(r"RESOURCE_EXHAUSTED|out of memory|failed to allocate|Allocator .* ran out", re.IGNORECASE)
_UNSUPPORTED = re.compile(r"UNIMPLEMENTED|not supported|does not support|unsupported|no kernel", re.IGNORECASE)


def classify(error: BaseException, platform: str) -> tuple[str, str]:
    """(status, sentence) for an exception raised while a case ran."""
    if isinstance(error, CaseSkipped):
        return error.status, str(error)
    text = first_line(error, limit=240, default="")
    if isinstance(error, MemoryError) or _OOM.search(str(error)):
        return OUT_OF_MEMORY, f"out of memory on {platform}: {text}"
    if _UNSUPPORTED.search(str(error)):
        return UNSUPPORTED, f"unsupported on {platform}: {text}"
    return FAILED, f"{type(error).__name__}: {text}"
