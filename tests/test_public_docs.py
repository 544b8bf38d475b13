"""The public API users call from their code (tpu_tools.agent, tpu_tools.api) says what each name does: ruff's D1
rules check the modules of that API, this test the classes tpu_tools.api re-exports from elsewhere."""

from __future__ import annotations

import inspect

import pytest

import tpu_tools.agent
import tpu_tools.api


def _own_docstring(thing: object) -> str:
    """The docstring `thing` was given, not one inherited or the signature a dataclass writes for itself."""
    doc = thing.__dict__.get("__doc__") if inspect.isclass(thing) else getattr(thing, "__doc__", None)
    name = getattr(thing, "__name__", "")
    if not doc or doc.startswith(f"{name}("):
        return ""
    return doc.strip()


def _public_names() -> list[tuple[str, object]]:
    return [(f"{module.__name__}.{name}", getattr(module, name))
            for module in (tpu_tools.agent, tpu_tools.api) for name in module.__all__
            if not isinstance(getattr(module, name), str)]  # constants (ENV_TAG) are named, not documented


@pytest.mark.parametrize(("name", "thing"), _public_names(), ids=[name for name, _ in _public_names()])
def test_every_public_name_and_method_has_its_own_docstring(name, thing):
    assert _own_docstring(thing), name
    if not inspect.isclass(thing) or issubclass(thing, BaseException):
        return
    for attribute, member in vars(thing).items():
        if attribute.startswith("_"):
            continue
        if isinstance(member, property):
            member = member.fget
        if inspect.isfunction(member):
            assert _own_docstring(member), f"{name}.{attribute}"


def test_the_agents_calls_say_they_never_raise_into_the_job():
    """Every call a job makes between its steps says what becomes of a bad argument or a failure: never raised."""
    for name in ("step", "on_step", "phase", "metric", "step_flops", "stop", "current", "step_count"):
        doc = " ".join(_own_docstring(getattr(tpu_tools.agent, name)).lower().split())
        assert "never raise" in doc or "neither this nor" in doc, name
