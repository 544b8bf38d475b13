"""A program with its stderr on a pseudo-terminal, as in a shell, and its stdout in a pipe.

What a program draws only on a terminal (a progress bar naming the case or device in flight) is read as it
comes, in a thread of its own, so that a test can wait for it with a deadline: signal a program while a case
runs, not after a guessed delay.
"""

from __future__ import annotations

import os
import pty
import signal
import subprocess
import threading
import time


class StderrOnTerminal:
    def __init__(self, command: list[str], env: dict[str, str]) -> None:
        main, secondary = pty.openpty()
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=secondary, text=True, env=env)
        os.close(secondary)
        self._main = main
        self._chunks: list[bytes] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def __enter__(self) -> StderrOnTerminal:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self._reader.join(timeout=10)
        os.close(self._main)

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self._main, 4096)
            except OSError:  # the terminal's other end closed: the program ended
                return
            if not chunk:
                return
            self._chunks.append(chunk)

    def stderr(self) -> str:
        return b"".join(self._chunks).decode("utf-8", "replace")

    def wait_for(self, text: str, timeout: float = 120) -> None:
        """Until the terminal shows `text`, the program still running."""
        deadline = time.monotonic() + timeout
        while text not in self.stderr():
            assert self.process.poll() is None, f"the program ended before showing {text!r}: {self.stderr()[-2000:]}"
            assert time.monotonic() < deadline, f"timed out waiting for {text!r}: {self.stderr()[-2000:]}"
            time.sleep(0.05)

    def finish(self, number: signal.Signals | None = None, timeout: float = 90) -> tuple[str, str]:
        """Send `number` (if given) and wait for the end; the program's stdout and what its terminal showed."""
        if number is not None:
            self.process.send_signal(number)
        out, _ = self.process.communicate(timeout=timeout)
        self._reader.join(timeout=10)
        return out, self.stderr()
