"""The one conversion of a value the job hands the agent: it never raises, whatever the value is.

The agent's calls (`step(flops=...)`, `metric(name, value)`, `start(price_per_hour=...)`) run inside
the job's training loop, so a value the agent cannot use is counted and ignored, never raised: an
int of 400 digits (`float()` raises OverflowError), an object whose `__float__` or `__index__`
raises or returns something that is not a float, a string, a bool. A NumPy or JAX scalar (one
element) is a number. Only `KeyboardInterrupt` and `SystemExit` raised by the job's own
`__float__` go on: they are the job's, not a bad value.
"""

from __future__ import annotations

import math
from typing import Any

from tpu_tools.shorten import one_line


def job_float(value: Any) -> float | None:
    """`value` as a float (NaN and infinities included: an int too large for a float is +-inf), or None
    where it is not a number: None, a bool, text, bytes, an array of several elements, or a value
    whose conversion fails."""
    if value is None or isinstance(value, (bool, str, bytes, bytearray)):
        return None
    try:
        return float(value)  # a __float__ that returns junk makes float() raise TypeError
    except OverflowError:
        return (math.inf if value > 0 else -math.inf) if type(value) is int else None
    except Exception:  # noqa: BLE001 whatever the job's __float__ or __index__ raises (or a warning made an error)
        return None


def finite_at_least(value: Any, low: float, *, above: bool = False) -> float | None:
    """`value` as a finite float >= `low` (> `low` with `above`), else None."""
    number = job_float(value)
    if number is None or not math.isfinite(number):
        return None
    return number if (number > low if above else number >= low) else None


def job_name(value: Any) -> str | None:
    """`value` as a plain str (a subclass's overridden methods left behind), or None where it is not text."""
    return str.__str__(value) if isinstance(value, str) else None


def job_flag(value: Any) -> bool:
    """A yes/no setting from the job: True only for a true value whose truth can be asked."""
    try:
        return bool(value)
    except Exception:  # noqa: BLE001 the job's value may raise anything when asked its truth
        return False


def error_text(error: BaseException, limit: int = 200) -> str:
    """`Type: message` of an exception raised by the job's value, made even when its `__str__` raises."""
    try:
        message = str(error)
    except Exception:  # noqa: BLE001 the job's exception may raise anything from its __str__
        message = "<no message>"
    text = f"{type(error).__name__}: {message}"
    return one_line("".join(c if c.isprintable() else "?" for c in text), limit)
