"""How the processes of a run tell each other what they measured, and notice who went missing.

One process: nothing to exchange. Several: the key-value store of JAX's
distributed coordination service (hosted by process 0) carries every
process's identity, per-size results and final verdict. Each process also
bumps a heartbeat counter twice a second and marks which step it is on, so
that a process stuck in a collective can tell a dead or frozen peer (its
heartbeat stopped) from one that is alive but elsewhere (its step is behind).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict
from typing import Any

from tpu_tools.collectives.report import ProcessInfo
from tpu_tools.collectives.watchdog import plain_diagnosis
from tpu_tools.errors import RuntimeFailure

PREFIX = "tpu_tools/collectives/"
HEARTBEAT_S = 0.5


def linger_s(timeout_s: float) -> float:
    """How long process 0 stays up after giving up, so the others can still diagnose through it."""
    return min(2.0, timeout_s / 4)


class MissingProcesses(RuntimeFailure):
    """Some processes did not report within the time limit."""

    def __init__(self, message: str, process_ids: list[int]):
        super().__init__(message)
        self.process_ids = process_ids


class LocalExchange:
    """A run with one process."""

    process_id = 0
    process_count = 1

    def __init__(self, info: ProcessInfo):
        self.processes = [info]

    def share_identity(self) -> list[ProcessInfo]:
        return self.processes

    def enter_step(self, step: int) -> None:
        pass

    def gather(self, name: str, payload: dict[str, Any]) -> list[dict[str, Any]] | None:
        return [payload]

    def decide(self, step: int, decision: str) -> str:
        return decision

    def agree(self, name: str, value: str) -> str:
        return value

    def report_failure(self, message: str) -> None:
        pass

    def settle(self, exit_code: int) -> int:
        return exit_code

    def presample(self) -> None:
        pass

    def diagnose(self, activity: str, elapsed: float) -> str:
        return plain_diagnosis(activity, elapsed)

    def linger(self) -> None:
        pass

    def close(self) -> None:
        pass


class KeyValueExchange:
    """A run with several processes joined by jax.distributed."""

    def __init__(self, client: Any, info: ProcessInfo, process_count: int, timeout_s: float, coordinator: str):
        self.client = client
        self.process_id = info.process_id
        self.process_count = process_count
        self.timeout_s = timeout_s
        self.coordinator = coordinator
        self.processes = [info]
        self._step = -1
        self._beats_before: dict[int, str] | None = None
        self._stop = threading.Event()
        self._heartbeat = threading.Thread(target=self._beat, name="tpu-tools-heartbeat", daemon=True)
        self._heartbeat.start()

    # --- keys ---------------------------------------------------------------------------------------
    def _set(self, key: str, value: str) -> None:
        self.client.key_value_set(PREFIX + key, value, allow_overwrite=True)

    def _dir(self, key: str) -> dict[int, str]:
        entries = self.client.key_value_dir_get(PREFIX + key + "/")
        return {int(k.rsplit("/", 1)[1]): v for k, v in entries}

    def _beat(self) -> None:
        beats = 0
        while not self._stop.wait(HEARTBEAT_S):
            beats += 1
            try:
                self._set(f"beat/{self.process_id}", str(beats))
            except Exception:  # noqa: BLE001 the coordinator is gone; the watchdog reports it
                return  # the coordinator is gone; the watchdog reports it

    # --- the run ------------------------------------------------------------------------------------
    def share_identity(self) -> list[ProcessInfo]:
        mine = self.processes[0]
        self._set(f"info/{self.process_id}", json.dumps(asdict(mine)))
        answers = self._collect("info")
        self.processes = [ProcessInfo(**answers[p]) for p in range(self.process_count)]
        return self.processes

    def enter_step(self, step: int) -> None:
        self._step = step
        self._set(f"step/{self.process_id}", str(step))

    def gather(self, name: str, payload: dict[str, Any]) -> list[dict[str, Any]] | None:
        """Every process publishes; process 0 gets all payloads in process order, the others None."""
        self._set(f"{name}/{self.process_id}", json.dumps(payload))
        if self.process_id != 0:
            return None
        answers = self._collect(name)
        return [answers[p] for p in range(self.process_count)]

    def decide(self, step: int, decision: str) -> str:
        """Process 0's decision after a step, which every process follows."""
        key = f"decision/{step}"
        if self.process_id == 0:
            self._set(key, decision)
            return decision
        try:
            return self.client.blocking_key_value_get(PREFIX + key, int(self.timeout_s * 1000))
        except Exception:  # noqa: BLE001 the distributed client raises its own kinds; each means the process is missing
            raise MissingProcesses(f"{self._names([0])} did not say within {self.timeout_s:g} s whether the "
                                   "sweep goes on (it died or hung)", [0]) from None

    def agree(self, name: str, value: str) -> str:
        """Process 0's value of `name` within the current step (e.g. a calibration's decision)."""
        key = f"agree/{self._step}/{name}"
        if self.process_id == 0:
            self._set(key, value)
            return value
        try:
            return self.client.blocking_key_value_get(PREFIX + key, int(self.timeout_s * 1000))
        except Exception:  # noqa: BLE001 the distributed client raises its own kinds; each means the process is missing
            raise MissingProcesses(f"{self._names([0])} did not send its timing decision within "
                                   f"{self.timeout_s:g} s (it died or hung)", [0]) from None

    def report_failure(self, message: str) -> None:
        try:
            self._set(f"error/{self.process_id}", message)
        except Exception:  # noqa: BLE001 best effort: a failure already stops this process
            pass

    def settle(self, exit_code: int) -> int:
        """Process 0 announces the run's exit status; the others wait for it and return it."""
        if self.process_id == 0:
            self._set("verdict", str(exit_code))
            return exit_code
        try:
            return int(self.client.blocking_key_value_get(PREFIX + "verdict", int(self.timeout_s * 1000)))
        except Exception:  # noqa: BLE001 the distributed client raises its own kinds; each means the process is missing
            raise MissingProcesses(f"{self._names([0])} did not announce the result within "
                                   f"{self.timeout_s:g} s (it died or hung)", [0]) from None

    def _collect(self, name: str) -> dict[int, dict[str, Any]]:
        deadline = time.monotonic() + self.timeout_s
        answers: dict[int, dict[str, Any]] = {}
        missing: list[int] = []
        for process in range(self.process_count):
            key = f"{PREFIX}{name}/{process}"
            remaining_ms = int(max(0.001, deadline - time.monotonic()) * 1000)
            try:
                text = (self.client.blocking_key_value_get(key, remaining_ms) if not missing
                        else self.client.key_value_try_get(key))
                answers[process] = json.loads(text)
            except Exception:  # noqa: BLE001 the client's errors and bad JSON alike: the process did not report
                missing.append(process)
        if missing:
            raise MissingProcesses(f"{self._names(missing)} did not report within {self.timeout_s:g} s "
                                   "(died or hung)", missing)
        return answers

    # --- when stuck ---------------------------------------------------------------------------------
    def presample(self) -> None:
        self._beats_before = self._dir("beat")

    def diagnose(self, activity: str, elapsed: float) -> str:
        head = f"no progress for {elapsed:.0f} s (--timeout {self.timeout_s:g}) in {activity}"
        try:
            beats = self._dir("beat")
            steps = {p: int(v) for p, v in self._dir("step").items()}
            errors = self._dir("error")
        except Exception:  # noqa: BLE001 the distributed client raises its own kinds; each means contact is lost
            return (f"{head}: lost contact with the coordinator (process 0 at {self.coordinator}); "
                    "it died or hung")
        others = [p for p in range(self.process_count) if p != self.process_id]
        before = self._beats_before or {}
        stopped = [p for p in others if p not in beats or (before and beats[p] == before.get(p))]
        behind = [p for p in others if p not in stopped and steps.get(p, -1) < self._step]
        # The silent ones first: a peer's failure is often only the echo of a dead process.
        parts = [f"{self._names(stopped)} stopped responding (died or hung)"] if stopped else []
        failed = {p: errors[p] for p in others if p in errors and p not in stopped}
        parts.extend(f"{self._names([p])} failed: {m}" for p, m in sorted(failed.items()))
        behind = [p for p in behind if p not in failed]
        if behind:
            parts.append(f"{self._names(behind)} never reached this step (stuck before it)")
        if not parts:
            parts.append("every process is alive and on this step: the collective itself hung")
        return f"{head}: " + "; ".join(parts)

    def _names(self, process_ids: list[int]) -> str:
        known = {p.process_id: p for p in self.processes}
        labels = [known[p].label() if p in known else f"process {p}" for p in process_ids]
        if len(labels) == 1:
            return labels[0]
        return ", ".join(labels[:-1]) + " and " + labels[-1]

    def linger(self) -> None:
        """Process 0 hosts the coordinator: give the others a moment to read it before it goes."""
        if self.process_id == 0:
            time.sleep(linger_s(self.timeout_s))

    def close(self) -> None:
        self._stop.set()
        self._heartbeat.join(timeout=2)
