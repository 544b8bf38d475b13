"""Ctrl-C and SIGTERM that Python would swallow while benchmarks run.

jax runs Python in a garbage-collector callback (`_xla_gc_callback`, at every collection); a signal whose
handler raises there (tpu_tools.signals) raises inside that callback, and Python does not propagate what a
gc callback raises: it prints "Exception ignored in ..." with a traceback and goes on, so the run would
continue to its end and exit 0 (a SIGTERM early in a case, while jax traces and compiles, is often lost so).
While cases run, such an interrupt is kept instead, without the traceback, and raised again at the next
`raise_kept_interrupt()`: between timed samples and between cases.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_pending: list[BaseException] = []


@contextmanager
def kept_interrupts() -> Iterator[None]:
    """While inside, an interrupt raised where Python cannot propagate it waits for `raise_kept_interrupt()`."""
    previous = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt):  # tpu_tools.signals.Terminated too
            _pending.append(unraisable.exc_value)
        else:
            previous(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = previous
        _pending.clear()


def raise_kept_interrupt() -> None:
    """Raise the interrupt that arrived where it could not be raised, if any."""
    if _pending:
        error = _pending[0]
        _pending.clear()
        raise error
