"""The programs the tests drive that are not Python packages: tmux, prometheus, promtool, zsh, fish.

`tools/test.sh` installs them. Where one is missing a test that needs it is skipped on a developer's machine,
and fails in CI (`CI` set to true, as CI services set it): a CI host without them would otherwise stay green
while testing nothing of tpu-top's terminal, the exporter's scrapes, the alert rules or the completions.
"""

from __future__ import annotations

import functools
import os
import shutil
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

REQUIRED_IN_CI = ("tmux", "prometheus", "promtool", "zsh", "fish")
_F = TypeVar("_F", bound=Callable[..., Any])


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def require_program(name: str) -> str:
    """The path of `name`; where it is missing, skip the calling test, or in CI fail it."""
    found = shutil.which(name)
    if found is not None:
        return found
    why = f"{name} is not installed (tools/test.sh installs it)"
    if in_ci() and name in REQUIRED_IN_CI:
        pytest.fail(f"{why}; in CI (CI=true) a missing program fails the run instead of skipping its tests")
    pytest.skip(why)


def needs(name: str) -> Callable[[_F], _F]:
    """A test decorator: `require_program(name)` as the test starts (its fixtures are still the test's own)."""
    def decorate(test: _F) -> _F:
        @functools.wraps(test)
        def run(*args: Any, **kwargs: Any) -> Any:
            require_program(name)
            return test(*args, **kwargs)

        return run  # type: ignore[return-value]

    return decorate
