"""A job's goodput over its whole life, from its log (tpu_tools.metrics.joblog): per process, per host, for the job.

Definitions (docs/goodput.md, "A job's whole life"):
- A process's *place* is its worker (TPU worker, indexed Job completion index, Slurm task) where known, else its
  host: a restarted pod gets a new host name but keeps its place. Its *successor* is the next process started in
  its place.
- A process whose newest line is older than SILENT_AFTER_S (or ten of its heartbeats) without an end is *silent*:
  hung, or dead where no reader can tell (another host, no successor yet); it is not counted as a disruption.
- A process *died* when the log says so (its successor saw it without an end), when a successor started in its
  place while it had not ended, or when it ran on this host and its PID is gone; its death is its last sign of life
  (its last line).
- **Lost progress** of a process that died: the steps it ran after the state its successor restored (the
  successor's `checkpoint_restored(step)`; without one, the process's own last checkpoint, else all its steps),
  which the successor repeats; in seconds, from when that checkpoint was saved (else the process's first
  productive start) to its last step's end.
- **Recovery**: from a process's death to its successor's first productive step's end (scheduling, start-up,
  compile, checkpoint restore).
- For the job, the n-th disruption is the n-th death in each place: its lost progress is the largest over the
  places, its recovery runs from the first of those deaths to the last of the successors' first steps.
- Goodput over the life: each process's goodput ledger (its last figures in the log), the time no process ran
  in a place ("down"), the ledger's time a process did not report before it died ("unreported"), and the lost
  progress moved out of productive time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tpu_tools.metrics.joblog import JobEvent

PRODUCTIVE = "productive"
LOST = "lost_progress"
DOWN = "down"
UNREPORTED = "unreported"
SILENT_AFTER_S = 60.0


@dataclass
class ProcessLife:
    process: str
    host: str
    pid: int
    place: str
    started_unix_s: float
    last_seen_unix_s: float
    state: str = "running"  # running, silent, ended, died
    heartbeat_s: float | None = None
    restored_step: int | None = None
    restored_unix_s: float | None = None
    first_step_unix_s: float | None = None
    last_step: int | None = None
    last_step_unix_s: float | None = None
    checkpoints: list[tuple[int, float]] = field(default_factory=list)  # (step, saved at), newest last
    checkpoint_count: int = 0
    causes_s: dict[str, float] = field(default_factory=dict)
    ended_unix_s: float | None = None
    died_unix_s: float | None = None
    successor: str | None = None
    lost_steps: int | None = None
    lost_s: float | None = None
    recovery_s: float | None = None

    @property
    def last_checkpoint_step(self) -> int | None:
        return self.checkpoints[-1][0] if self.checkpoints else None


@dataclass
class Figures:
    """Goodput over a span of wall time: seconds per cause, lost progress and recovery."""

    wall_s: float
    causes_s: dict[str, float]
    goodput_percent: float | None
    disruptions: int
    lost_steps: int
    lost_s: float
    recovery_s: float

    def to_dict(self) -> dict[str, object]:
        return {"wall_s": self.wall_s, "goodput_percent": self.goodput_percent, "causes_s": self.causes_s,
                "disruptions": self.disruptions, "lost_progress_steps": self.lost_steps,
                "lost_progress_s": self.lost_s, "recovery_s": self.recovery_s}


@dataclass
class PlaceLife:
    place: str
    hosts: list[str]
    processes: list[ProcessLife]
    figures: Figures


@dataclass
class Disruption:
    index: int  # 0 for the first death in each place
    died_unix_s: float
    recovered_unix_s: float | None  # every successor's first productive step; None while one has none
    lost_steps: int
    lost_s: float
    recovery_s: float | None


@dataclass
class JobLife:
    processes: list[ProcessLife]
    places: list[PlaceLife]
    disruptions: list[Disruption]
    figures: Figures
    last_step: int | None

    @property
    def state(self) -> str | None:
        """running while any place's newest process runs, else silent, else died when one's newest died; else
        ended (None: no process yet)."""
        newest = [place.processes[-1].state for place in self.places]
        return next((state for state in ("running", "silent", "died", "ended") if state in newest), None)


def _processes(events: list[JobEvent]) -> dict[str, ProcessLife]:
    found: dict[str, ProcessLife] = {}
    for event in events:
        if event.event == "died":
            continue
        life = found.get(event.process)
        if life is None:
            started = event.started_unix_s if event.started_unix_s is not None else event.time_unix_s
            life = found[event.process] = ProcessLife(event.process, event.host, event.pid,
                                                      event.worker or event.host, started, event.time_unix_s)
        life.last_seen_unix_s = max(life.last_seen_unix_s, event.time_unix_s)
        if event.worker is not None:
            life.place = event.worker
        if event.event == "start":
            life.started_unix_s = life.started_unix_s if event.started_unix_s is None else event.started_unix_s
            life.heartbeat_s = event.heartbeat_s
        elif event.event == "restore" and event.step is not None:
            life.restored_step, life.restored_unix_s = event.step, event.time_unix_s
        elif event.event == "first_step":
            life.first_step_unix_s = event.step_unix_s if event.step_unix_s is not None else event.time_unix_s
        elif event.event == "checkpoint" and event.step is not None:
            life.checkpoints.append((event.step, event.time_unix_s))
            life.checkpoint_count += 1
        elif event.event == "end":
            life.state, life.ended_unix_s = "ended", event.time_unix_s
        if event.step is not None and event.event in ("alive", "end", "first_step"):
            if life.last_step is None or event.step >= life.last_step:
                life.last_step = event.step
                life.last_step_unix_s = event.step_unix_s if event.step_unix_s is not None else event.time_unix_s
        if event.causes_s is not None:
            life.causes_s = dict(event.causes_s)
    for event in events:
        if event.event == "died" and event.of_process in found and found[event.of_process].state != "ended":
            found[event.of_process].state = "died"
    return found


def _lost(life: ProcessLife, successor: ProcessLife | None) -> tuple[int, float]:
    """The steps (and seconds) `life` ran after the state its successor resumed from."""
    if life.last_step is None or life.last_step_unix_s is None:
        return 0, 0.0
    resumed = successor.restored_step if successor is not None and successor.restored_step is not None else None
    if resumed is None:
        resumed = life.last_checkpoint_step
    base = resumed if resumed is not None else (life.restored_step or 0)
    steps = max(0, life.last_step - base)
    saved = next((at for step, at in reversed(life.checkpoints) if step == base), None)
    if saved is None:  # resumed from before this process saved anything: all its productive time is lost
        saved = life.restored_unix_s if life.restored_unix_s is not None else life.started_unix_s
    return steps, max(0.0, life.last_step_unix_s - saved) if steps else 0.0


def _figures(processes: list[ProcessLife], down_s: float, wall_s: float) -> Figures:
    causes: dict[str, float] = {}
    for life in processes:
        own = dict(life.causes_s)
        span = (life.ended_unix_s or life.died_unix_s or life.last_seen_unix_s) - life.started_unix_s
        own[UNREPORTED] = max(0.0, span - sum(own.values()))
        if life.lost_s:  # repeated by the successor: out of this process's productive time, else of what it did
            # not report (the steps after its last figures)
            taken = min(life.lost_s, own.get(PRODUCTIVE, 0.0))
            own[PRODUCTIVE] = own.get(PRODUCTIVE, 0.0) - taken
            own[UNREPORTED] = max(0.0, own[UNREPORTED] - (life.lost_s - taken))
            own[LOST] = life.lost_s
        for cause, seconds in own.items():
            if seconds or cause == PRODUCTIVE:
                causes[cause] = causes.get(cause, 0.0) + seconds
    died = [life for life in processes if life.state == "died"]
    lost_s = sum(life.lost_s or 0.0 for life in died)
    if down_s:
        causes[DOWN] = down_s
    return Figures(wall_s, causes, 100.0 * causes.get(PRODUCTIVE, 0.0) / wall_s if wall_s > 0 else None,
                   len(died), sum(life.lost_steps or 0 for life in died), lost_s,
                   sum(life.recovery_s or 0.0 for life in died))


def _place_order(place: str) -> tuple[int, str]:
    """Workers by their number (2 before 10), then host names."""
    return (int(place), "") if place.isascii() and place.isdigit() and len(place) < 19 else (1 << 62, place)


def job_life(events: list[JobEvent], pid_gone: Callable[[ProcessLife], bool], now: float | None = None) -> JobLife:
    """The job's life from its log's events; `pid_gone(process)` says whether a process of this host is gone;
    `now` (Unix s), where given, finds the silent ones."""
    found = _processes(events)
    by_place: dict[str, list[ProcessLife]] = {}
    for life in sorted(found.values(), key=lambda p: p.started_unix_s):
        by_place.setdefault(life.place, []).append(life)
    places = []
    for place, lives in sorted(by_place.items(), key=lambda item: _place_order(item[0])):
        down = 0.0
        for index, life in enumerate(lives):
            successor = lives[index + 1] if index + 1 < len(lives) else None
            if life.state == "running" and (successor is not None or pid_gone(life)):
                life.state = "died"
            elif life.state == "running" and now is not None and now - life.last_seen_unix_s > max(
                    SILENT_AFTER_S, 10 * (life.heartbeat_s or 0.0)):
                life.state = "silent"
            if life.state != "died":
                continue
            life.died_unix_s = life.last_seen_unix_s
            life.lost_steps, life.lost_s = _lost(life, successor)
            if successor is not None:
                life.successor = successor.process
                down += max(0.0, successor.started_unix_s - life.died_unix_s)
                if successor.first_step_unix_s is not None:
                    life.recovery_s = max(0.0, successor.first_step_unix_s - life.died_unix_s)
        wall = max(life.last_seen_unix_s for life in lives) - lives[0].started_unix_s
        places.append(PlaceLife(place, sorted({life.host for life in lives}), lives, _figures(lives, down, wall)))
    disruptions = []
    for index in range(max((p.figures.disruptions for p in places), default=0)):
        deaths = [[life for life in p.processes if life.state == "died"][index] for p in places
                  if p.figures.disruptions > index]
        died = min(life.died_unix_s or 0.0 for life in deaths)
        firsts = [found[life.successor].first_step_unix_s if life.successor else None for life in deaths]
        recovered = None if any(first is None for first in firsts) else max(f or 0.0 for f in firsts)
        disruptions.append(Disruption(index, died, recovered, max(life.lost_steps or 0 for life in deaths),
                                      max(life.lost_s or 0.0 for life in deaths),
                                      None if recovered is None else max(0.0, recovered - died)))
    everyone = [life for p in places for life in p.processes]
    job = _figures(everyone, sum(p.figures.causes_s.get(DOWN, 0.0) for p in places),
                   sum(p.figures.wall_s for p in places))
    job.disruptions = len(disruptions)
    job.lost_steps = sum(d.lost_steps for d in disruptions)
    job.lost_s = sum(d.lost_s for d in disruptions)
    job.recovery_s = sum(d.recovery_s or 0.0 for d in disruptions)
    steps = [life.last_step for life in everyone if life.last_step is not None]
    return JobLife(everyone, places, disruptions, job, max(steps) if steps else None)
