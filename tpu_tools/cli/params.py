"""Click parameter types for every number and duration a user gives on the command line.

They wrap `tpu_tools.parsing.parse_number` / `parse_duration`, the one validation of user numbers that
config files use too: NaN, infinities, over-long text and values out of range become a usage error (exit 2,
one line) before any command runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from tpu_tools.errors import UsageError
from tpu_tools.parsing import MAX_PERIOD_S, MAX_TIMEOUT_S, parse_duration, parse_number


class Number(click.ParamType):  # type: ignore[type-arg]
    """A finite float (or, with integer=True, a whole number) within bounds."""

    def __init__(self, *, minimum: float | None = None, maximum: float | None = None, above: float | None = None,
                 integer: bool = False) -> None:
        self.minimum, self.maximum, self.above, self.integer = minimum, maximum, above, integer
        self.name = "integer" if integer else "number"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            return parse_number(value, _name(param), minimum=self.minimum, maximum=self.maximum, above=self.above,
                                integer=self.integer)
        except ValueError as error:
            self.fail(str(error), param, ctx)


def Count(minimum: int = 1, maximum: int = 1_000_000_000) -> Number:  # noqa: N802 - reads as a type
    """A whole number of things (iterations, rows, processes): at least `minimum`, at most `maximum`."""
    return Number(minimum=minimum, maximum=maximum, integer=True)


def Seconds(*, maximum: float = MAX_TIMEOUT_S, zero: bool = False) -> Number:  # noqa: N802
    """A time in seconds given as a plain number: finite, greater than 0 (or 0 too with zero=True)."""
    return Number(minimum=0.0, maximum=maximum) if zero else Number(above=0.0, maximum=maximum)


class Duration(click.ParamType):  # type: ignore[type-arg]
    """Seconds, or a number with ms, s, m or h; `minimum` is a floor (periods: no busy loop)."""

    name = "duration"

    def __init__(self, *, minimum: float | None = None, maximum: float = MAX_PERIOD_S) -> None:
        self.minimum, self.maximum = minimum, maximum

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, float) and self.minimum is None:
            return value
        try:
            return parse_duration(value, _name(param), minimum=self.minimum, maximum=self.maximum)
        except ValueError as error:
            self.fail(str(error), param, ctx)


class PathParam(click.Path):
    """click.Path that refuses an empty name: click (and pathlib) turn '' into '.', the current folder, so an unset
    shell variable would make a command read, write or delete there. Every file or folder the tool takes goes
    through it; the defaults check nothing else (the commands judge existence and kind in their own words)."""

    def __init__(self, *, path_type: type | None = Path, readable: bool = False, **kwargs: Any) -> None:
        super().__init__(path_type=path_type, readable=readable, **kwargs)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, (str, Path)) and not str(value).strip():
            self.fail(f"{path_name(param)} must not be empty", param, ctx)
        return super().convert(value, param, ctx)


def path_name(param: click.Parameter | None) -> str:
    """An option by its longest flag, an argument by its metavar (DIR, BUNDLE)."""
    if isinstance(param, click.Argument):
        return param.metavar or param.human_readable_name
    return _name(param)


def refuse_empty_path(value: str, what: str) -> None:
    """The same refusal for a path that arrives outside a click parameter (a program after --)."""
    if not value.strip():
        raise UsageError(f"{what} must not be empty")


def non_empty(ctx: click.Context | None, param: click.Parameter | None, value: Any) -> Any:
    """Refuse '' (and, for a repeatable option, an empty item): an empty --baseline or --only is a mistake in a
    script, not a request for no baseline or for everything."""
    values = value if isinstance(value, tuple) else (value,)
    for item in values:
        if isinstance(item, (str, Path)) and not str(item).strip():
            raise click.BadParameter(f"{_name(param)} must not be empty", ctx=ctx, param=param)
    return value


def _name(param: click.Parameter | None) -> str:
    """How messages name the value: its longest flag (--min-time), so the sentence reads on its own."""
    flags = [opt for opt in getattr(param, "opts", []) if opt.startswith("-")]
    return max(flags, key=len) if flags else "the value"
