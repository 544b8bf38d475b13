"""Calls run ahead on daemon threads, which a program may abandon when it ends. Base layer.

concurrent.futures joins its workers when the interpreter exits, so one call blocked on something that never
answers (a hung agent, a silent service) holds the program's exit, after Ctrl-C or SIGTERM too, until the
call's own deadline. The threads here are daemon threads: an ending program leaves them behind.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

_T = TypeVar("_T")
_Work = tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class DaemonExecutor(Executor):
    """An executor of up to `max_workers` daemon threads, started as calls need them and kept for later calls.

    `shutdown()` waits for nothing. In a child forked from the process that started the threads, the first
    call starts new ones (a forked child has only the thread that forked).
    """

    def __init__(self, max_workers: int, name: str):
        self._max_workers = max_workers
        self._name = name
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._work: queue.SimpleQueue[_Work] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)  # one count per thread waiting for work
        self._started = 0

    def submit(self, fn: Callable[..., _T], /, *args: Any, **kwargs: Any) -> Future[_T]:
        future: Future[_T] = Future()
        with self._lock:
            if self._pid != os.getpid():
                self._reset()
            self._work.put((future, fn, args, kwargs))
            if not self._idle.acquire(blocking=False) and self._started < self._max_workers:
                self._started += 1
                threading.Thread(target=self._run, args=(self._work, self._idle), daemon=True,
                                 name=f"{self._name}-{self._started}").start()
        return future

    @staticmethod
    def _run(work: queue.SimpleQueue[_Work], idle: threading.Semaphore) -> None:
        while True:
            future, fn, args, kwargs = work.get()
            if future.set_running_or_notify_cancel():
                try:
                    value = fn(*args, **kwargs)
                except BaseException as error:  # noqa: BLE001 handed to the caller, which raises it
                    future.set_exception(error)
                else:
                    future.set_result(value)
            del future, fn, args, kwargs  # hold nothing of a finished call while waiting for the next
            idle.release()
