"""The toolkit's one signal policy: SIGTERM is handled as Ctrl-C is, and the exit status says which came.

`timeout`, CI runners and Kubernetes stop a program with SIGTERM. `install()` (called by the CLI's `run_cli`)
makes SIGTERM raise `Terminated`, a KeyboardInterrupt, so every path that keeps partial results on Ctrl-C
(bench results, the profile's trace, the dump's clean-up) runs for SIGTERM too; the program then exits 130
after SIGINT and 143 after SIGTERM (128 + the signal number, as shells report it). Base layer: no printing.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import TypeVar

from tpu_tools.errors import EXIT_INTERRUPTED, EXIT_TERMINATED

_received: int | None = None
_T = TypeVar("_T")


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: unwinds like Ctrl-C."""


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    global _received
    _received = signal.SIGINT
    raise KeyboardInterrupt


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    global _received
    _received = signal.SIGTERM
    raise Terminated


def install() -> None:
    """Route SIGINT and SIGTERM to KeyboardInterrupt / Terminated (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        return
    signal.signal(signal.SIGINT, _on_sigint)
    signal.signal(signal.SIGTERM, _on_sigterm)


def note_interrupt(error: BaseException) -> None:
    """Remember which signal an interrupt came from when it was raised past our handlers."""
    global _received
    if isinstance(error, Terminated):
        _received = signal.SIGTERM
    elif _received is None:
        _received = signal.SIGINT


def received() -> int | None:
    """The signal number of the last SIGINT or SIGTERM this program received, else None."""
    return _received


def interrupted_exit_code() -> int:
    """130 after Ctrl-C (or when nothing was received), 143 after SIGTERM."""
    return EXIT_TERMINATED if _received == signal.SIGTERM else EXIT_INTERRUPTED


def interrupt_word() -> str:
    """How the last interrupt is named in messages."""
    return "terminated (SIGTERM)" if _received == signal.SIGTERM else "interrupted (Ctrl-C)"


class deferred:  # noqa: N801 - used as a statement: `with deferred():`
    """Hold SIGINT and SIGTERM while partial results are written; a signal received meanwhile is recorded,
    and the write completes (the program is ending anyway). `held` is the signal that came meanwhile, if any:
    a caller that goes on raises it again (`signal.raise_signal`) once the block is done."""

    def __enter__(self) -> deferred:
        self.held: int | None = None
        self._previous: list[tuple[int, object]] = []
        if threading.current_thread() is threading.main_thread():
            for number in (signal.SIGINT, signal.SIGTERM):
                self._previous.append((number, signal.signal(number, self._hold)))
        return self

    def _hold(self, signum: int, frame: FrameType | None) -> None:
        global _received
        _received = _received or signum
        self.held = self.held or signum

    def __exit__(self, *exc: object) -> None:
        for number, handler in self._previous:
            signal.signal(number, handler)  # type: ignore[arg-type]


def interruptible(function: Callable[[], _T], name: str = "tpu-tools-blocking-call") -> _T:
    """`function()`, run so that SIGINT and SIGTERM are answered at once even while it blocks in native code.

    A Python handler runs only when the main thread returns to the interpreter; a C++ call (gRPC's profiler
    client, jax.distributed's join) can hold it for minutes. The call runs in a daemon thread and the main
    thread waits for it, so a signal raises here and the call is abandoned (the process is ending). Its result
    or exception is passed on. Outside the main thread it is a plain call.
    """
    if threading.current_thread() is not threading.main_thread():
        return function()
    # A plain lock, held until the call ends, rather than an Event: a signal that raises inside Event.wait can
    # land between its condition's inner wait and its re-acquire, and the condition's release then fails with
    # "release unlocked lock", a RuntimeError that replaces the KeyboardInterrupt. An interrupted
    # Lock.acquire just raises.
    running = threading.Lock()
    running.acquire()
    outcome: list[tuple[bool, object]] = []

    def work() -> None:
        try:
            outcome.append((True, function()))
        except BaseException as error:  # noqa: BLE001 raised again in the caller's thread
            outcome.append((False, error))
        finally:
            running.release()

    threading.Thread(target=work, name=name, daemon=True).start()
    while not running.acquire(timeout=0.1):
        pass
    succeeded, value = outcome[0]
    if not succeeded:
        raise value  # type: ignore[misc]
    return value  # type: ignore[return-value]
