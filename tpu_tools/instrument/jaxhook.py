"""Run a function as soon as `jax` (or another frontend, `torch_xla`) has been imported, without importing it.

The agent and the profiler must not import a frontend early: a script sets JAX_PLATFORMS, XLA_FLAGS or
PJRT_DEVICE in `os.environ` before its own `import jax` / `import torch_xla`, and both read some of them at
import. So when the module is not imported yet, a meta-path finder waits for it and calls the function right
after its `__init__.py` has run, before the script can compile anything.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

_lock = threading.Lock()
_pending: dict[str, list[Callable[[ModuleType], None]]] = {}  # module name -> callbacks waiting for it
_before: dict[str, list[Callable[[], None]]] = {}  # module name -> called right before its code runs


def call_when_imported(callback: Callable[[ModuleType], None], name: str = "jax",
                       before: Callable[[], None] | None = None) -> Callable[[], None]:
    """`callback(module)` now if the module `name` is imported, else right after its import finishes; then
    `before()` first, right before the module's code runs (what the environment said before the module could
    change it).

    Returns a function that cancels a callback still waiting (a profiled program
    that never imports jax must not leave the finder behind).
    """
    with _lock:
        module = sys.modules.get(name)
        if module is None or getattr(getattr(module, "__spec__", None), "_initializing", False):
            _pending.setdefault(name, []).append(callback)
            if before is not None:
                _before.setdefault(name, []).append(before)
            if not any(isinstance(f, _JaxFinder) for f in sys.meta_path):
                sys.meta_path.insert(0, _JaxFinder())
            return lambda: _cancel(callback, name)
    callback(module)
    return lambda: None


def _remove_finder_when_idle() -> None:
    """(under _lock) The finder goes once no callback waits for any module."""
    if not any(_pending.values()):
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _JaxFinder)]


def _cancel(callback: Callable[[ModuleType], None], name: str) -> None:
    with _lock:
        waiting = _pending.get(name, [])
        if callback in waiting:
            waiting.remove(callback)
        _remove_finder_when_idle()


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, name: str):
        self._inner = inner
        self._name = name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        with _lock:
            first = _before.pop(self._name, [])
        for call in first:
            call()
        self._inner.exec_module(module)
        with _lock:
            callbacks = _pending.pop(self._name, [])
            _remove_finder_when_idle()
        for callback in callbacks:
            callback(module)

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, is_package, ...
        return getattr(self._inner, name)


class _JaxFinder(importlib.abc.MetaPathFinder):
    """Wraps the loader of each awaited module; stays in place until they have really been imported.

    Libraries often probe with `importlib.util.find_spec("jax")` without
    importing it: such a probe gets a wrapped spec and changes nothing.
    """

    _busy = threading.local()

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if not _pending.get(fullname) or getattr(self._busy, "active", False):
            return None
        self._busy.active = True  # the other finders are asked below; do not answer ourselves again
        try:
            spec = None
            for finder in list(sys.meta_path):
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._busy.active = False
        if spec is not None and spec.loader is not None and not isinstance(spec.loader, _Loader):
            spec.loader = _Loader(spec.loader, fullname)
        return spec
