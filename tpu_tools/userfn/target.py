"""A user's function named MODULE:FUNCTION: checked before jax starts, imported, and its arity checked."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tpu_tools.errors import UsageError


def _split_target(target: str) -> tuple[str, str]:
    module_name, sep, attribute = target.partition(":")
    if not sep or not module_name or not attribute:
        raise UsageError(f"bad target {target!r}: expected MODULE:FUNCTION, e.g. mypkg.model:loss")
    return module_name, attribute


@contextmanager
def _cwd_importable() -> Iterator[None]:
    """Modules of the current directory importable, as `python -c` would have them."""
    sys.path.insert(0, os.getcwd())
    try:
        yield
    finally:
        sys.path.pop(0)


def check_target(target: str) -> None:
    """Refuse a target that is not MODULE:FUNCTION, or whose top-level package is nowhere to be found.

    Run before jax is imported and its backend started (seconds on an accelerator), so that a typo is told at
    once; finding a top-level module imports nothing. The rest is judged by resolve_target.
    """
    module_name, _ = _split_target(target)
    top = module_name.partition(".")[0]
    if not top:  # a relative name: resolve_target says why it cannot be imported
        return
    try:
        with _cwd_importable():
            spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):  # a finder that fails: resolve_target says why
        return
    if spec is None:
        raise UsageError(f"cannot import module {module_name!r}: ModuleNotFoundError: No module named {top!r}")


def resolve_target(target: str) -> Any:
    """The callable named by "module:function" (attributes may be dotted: "module:Class.method")."""
    module_name, attribute = _split_target(target)
    try:
        with _cwd_importable():
            module = importlib.import_module(module_name)
    except Exception as error:
        raise UsageError(f"cannot import module {module_name!r}: {type(error).__name__}: {error}") from error
    value: Any = module
    for part in attribute.split("."):
        if not hasattr(value, part):
            raise UsageError(f"module {module_name!r} has no {attribute!r}")
        value = getattr(value, part)
    if inspect.isclass(value) or not callable(value):
        raise UsageError(f"{target} is not a function (it is {_describe(value)}); name a function to compile")
    return value


def _describe(value: Any) -> str:
    if inspect.isclass(value):
        return f"the class {value.__name__}"
    if inspect.ismodule(value):
        return "a module"
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def check_arity(target: str, function: Any, count: int) -> None:
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(*range(count))
    except TypeError as error:
        raise UsageError(f"{target} cannot be called with {count} argument(s) from --arg: {error}") from error
