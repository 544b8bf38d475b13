"""What every group of a monitor report carries, apart from the report so that each group's record can build on it."""

from __future__ import annotations

import msgspec


class GroupRecord(msgspec.Struct, kw_only=True):
    """The part of a report group common to all groups: its sampling period (None: every report), when it was
    sampled (ISO 8601 UTC) and why it failed (None when it did not: a failed group keeps its other fields at
    their defaults, or at its last figures where the report repeats them)."""

    period_s: float | None = None
    sampled_at: str | None = None
    error: str | None = None
