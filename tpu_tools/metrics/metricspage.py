"""Reading one Prometheus text page served on this host (a job's endpoint, GKE's device plugin), bounded.

The page comes from another program, so it is read within a deadline, never through a proxy (the address
is local), and never beyond a size: a page over it is refused rather than half read.
"""

from __future__ import annotations

import functools
import urllib.request


class PageTooLarge(Exception):
    """The page is longer than the caller's bound."""


@functools.cache
def _opener() -> urllib.request.OpenerDirector:
    """One opener for the process (a monitor reads these pages every period), with no proxy."""
    return urllib.request.build_opener(urllib.request.ProxyHandler({}))


def read_metrics_page(address: str, timeout_s: float, max_bytes: int) -> str:
    """The text of http://ADDRESS/metrics. Raises OSError or ValueError (no answer), PageTooLarge."""
    with _opener().open(f"http://{address}/metrics", timeout=timeout_s) as response:
        body: bytes = response.read(max_bytes + 1)
    if len(body) > max_bytes:
        raise PageTooLarge(f"more than {max_bytes >> 20} MiB")
    return body.decode("utf-8", errors="replace")


def unreachable_reason(error: BaseException) -> object:
    """What to say of a page that could not be read: urllib's reason where it gives one."""
    return getattr(error, "reason", None) or error
