"""A job's identity and its durable log: what every process of the job appends, read back by tpu-monitor --job.

A job outlives its processes: restarted after a crash or a preemption, on one host or many. Its identity is given
($TPU_TOOLS_JOB, `python -m tpu_tools.agent --job`) or found in what the process can see of its scheduler
(`job_identity`). Each process of the job appends one JSON line per event to `<dir>/<job>.log`, where `<dir>` is
$TPU_TOOLS_JOB_DIR (a shared filesystem for a job of many hosts), else `<runtime dir>/jobs`.

Many writers: a line is written with one `write` on a descriptor opened with O_APPEND, under an exclusive
`flock` of the file, and is at most PIPE_BUF bytes, so lines never interleave even where flock is advisory only.
Bounded: a writer that finds the file over `MAX_LOG_BYTES` compacts it under the same lock (`compact`): each
process keeps its start, first step, restore, last checkpoint, last sign of life and end, and only the newest
processes' lines are kept when even that is too large; the compacted copy replaces the file, and a writer that
opened the old file sees the inode change after taking the lock and opens the new one. A reader tolerates a torn
last line (a writer killed mid-line, or a line being written) and counts other malformed lines.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import select
import socket
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import msgspec

from tpu_tools.metrics.rundir import runtime_dir

ENV_JOB = "TPU_TOOLS_JOB"
ENV_JOB_DIR = "TPU_TOOLS_JOB_DIR"
LOG_SUFFIX = ".log"
MAX_LOG_BYTES = 1 << 20  # compacted past this
MAX_READ_BYTES = 4 * MAX_LOG_BYTES  # a reader reads no more of a file than this (a log others grew on purpose)
MAX_LINE_BYTES = select.PIPE_BUF  # one write of at most this many bytes is atomic on a pipe, and small on a file
MAX_JOB_ID = 200
# Kubernetes' downward API, where the pod mounts its labels (`downwardAPI: items: [{path: labels,
# fieldRef: {fieldPath: metadata.labels}}]` at /etc/podinfo)
DOWNWARD_LABELS = Path("/etc/podinfo/labels")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]", re.ASCII)

EventKind = Literal["start", "first_step", "restore", "checkpoint", "alive", "end", "died"]
_Seconds = Annotated[float, msgspec.Meta(ge=0.0)]
_Step = Annotated[int, msgspec.Meta(ge=0, le=1 << 62)]


class JobEvent(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=False):
    """One line of the log. `process` names a process for good (host, PID and start time: a PID is reused)."""

    event: EventKind
    time_unix_s: _Seconds
    process: Annotated[str, msgspec.Meta(max_length=300)]
    host: Annotated[str, msgspec.Meta(max_length=256)]
    pid: Annotated[int, msgspec.Meta(ge=1)]
    worker: Annotated[str, msgspec.Meta(max_length=64)] | None = None  # the host's place in the job, if known
    step: _Step | None = None  # the job's steps completed (checkpoint, restore, alive, first_step, end)
    step_unix_s: _Seconds | None = None  # when that step ended (alive, end)
    started_unix_s: _Seconds | None = None  # the process's start (start)
    causes_s: dict[Annotated[str, msgspec.Meta(max_length=64)], _Seconds] | None = None  # its goodput ledger
    of_process: Annotated[str, msgspec.Meta(max_length=300)] | None = None  # died: the process seen dead
    identity_source: Annotated[str, msgspec.Meta(max_length=64)] | None = None  # start: where the job's id came from
    heartbeat_s: _Seconds | None = None  # start: how often the process writes its last step


@dataclass(frozen=True)
class JobIdentity:
    """A job's name and where it came from ("given", "kubernetes-jobset", "kubernetes-job", "slurm"), and this
    host's place in it (TPU worker, indexed Job completion index, Slurm task), None where unknown."""

    job: str
    source: str
    worker: str | None


def _labels(text: str) -> dict[str, str]:
    """The downward API's `key="value"` lines."""
    labels = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and len(value) >= 2 and value[0] == value[-1] == '"':
            labels[key.strip()] = value[1:-1]
    return labels


def _read_labels(path: Path) -> dict[str, str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return _labels(handle.read(65536))
    except OSError:
        return {}


def _named(name: str, uid: str | None) -> str:
    """A Kubernetes object's name with its UID's first group: a Job deleted and created again is another job."""
    return f"{name}-{uid.split('-')[0]}" if uid else name


def clean_job_id(text: str) -> str | None:
    """A job's name as given, printable and bounded; None for one that is empty or not printable text."""
    text = text.strip()
    if not text or len(text) > MAX_JOB_ID or not text.isprintable():
        return None
    return text


def job_identity(environ: Mapping[str, str] | None = None, labels_file: Path = DOWNWARD_LABELS,
                 given: str | None = None) -> JobIdentity | None:
    """The job this process belongs to: `given`, else $TPU_TOOLS_JOB, else a JobSet's or a Job's name and UID
    (the pod's labels through the downward API, or the variables JobSet sets), else SLURM_JOB_ID; None when
    nothing names one."""
    env = os.environ if environ is None else environ
    worker = next((env[key] for key in ("TPU_WORKER_ID", "JOB_COMPLETION_INDEX", "SLURM_PROCID")
                   if clean_job_id(env.get(key, "")) is not None), None)
    for text, source in ((given, "given"), (env.get(ENV_JOB), "given")):
        if text is not None and clean_job_id(text) is not None:
            return JobIdentity(clean_job_id(text) or "", source, worker)
    labels = _read_labels(labels_file)
    jobset = labels.get("jobset.sigs.k8s.io/jobset-name") or env.get("JOBSET_NAME")
    if jobset and clean_job_id(jobset):
        uid = labels.get("jobset.sigs.k8s.io/jobset-uid") or env.get("JOBSET_UID")
        return JobIdentity(_named(jobset, uid), "kubernetes-jobset", worker)
    job = labels.get("batch.kubernetes.io/job-name") or labels.get("job-name")
    if job and clean_job_id(job):
        uid = labels.get("batch.kubernetes.io/controller-uid") or labels.get("controller-uid")
        return JobIdentity(_named(job, uid), "kubernetes-job", worker)
    slurm = env.get("SLURM_JOB_ID", "")
    if slurm.isdigit():
        return JobIdentity(f"slurm-{slurm}", "slurm", worker)
    return None


def job_dir() -> Path:
    """Where job logs are: $TPU_TOOLS_JOB_DIR, else `<runtime dir>/jobs`."""
    named = os.environ.get(ENV_JOB_DIR)
    return Path(named) if named else runtime_dir() / "jobs"


def log_path(job: str, directory: Path | None = None) -> Path:
    """The log of `job`: its name where that is a safe file name, else the safe part and a hash (two names never
    share a file)."""
    safe = _UNSAFE.sub("_", job)[:100]
    if safe != job or safe.startswith("."):
        safe = f"{safe}-{hashlib.sha256(job.encode()).hexdigest()[:12]}"
    return (directory or job_dir()) / f"{safe}{LOG_SUFFIX}"


def host_name() -> str:
    return socket.gethostname()[:256] or "unknown"


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(JobEvent)


def encode(event: JobEvent) -> bytes:
    """One line; the ledger's figures are left out of a line that would be over PIPE_BUF."""
    line = _ENCODER.encode(event) + b"\n"
    if len(line) > MAX_LINE_BYTES and event.causes_s is not None:
        line = _ENCODER.encode(msgspec.structs.replace(event, causes_s=None)) + b"\n"
    return line


@dataclass
class LogRead:
    events: list[JobEvent]
    malformed: int  # lines that are not events (a torn last line is not counted: it is being written)
    truncated: bool  # the file was larger than a reader reads


def decode(data: bytes) -> LogRead:
    lines = data.split(b"\n")
    lines.pop()  # after the last newline: empty, or a line not yet (or never to be) finished
    events, malformed = [], 0
    for line in lines:
        if not line.strip():
            continue
        try:
            events.append(_DECODER.decode(line))
        except (msgspec.DecodeError, msgspec.ValidationError):
            malformed += 1
    return LogRead(events, malformed, False)


def read_log(path: Path) -> LogRead:
    """The events of a log, oldest first; OSError where it cannot be read (missing, not a regular file)."""
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
    fd = os.open(path, flags)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise IsADirectoryError(0, "not a regular file", str(path))
        chunks, left = [], MAX_READ_BYTES + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    truncated = len(data) > MAX_READ_BYTES
    read = decode(data[:MAX_READ_BYTES])
    read.truncated = truncated
    return read


def _kept(events: list[JobEvent], budget: int) -> list[JobEvent]:
    """What compaction keeps: per process its one-off events, its last checkpoint and its last sign of life; the
    newest processes first where that is over `budget` bytes."""
    last: dict[tuple[str, str], int] = {}
    for index, event in enumerate(events):
        if event.event in ("checkpoint", "alive"):
            last[(event.process, event.event)] = index
    kept = [event for index, event in enumerate(events)
            if event.event not in ("checkpoint", "alive") or last[(event.process, event.event)] == index]
    order: list[str] = []
    for event in kept:
        if event.process not in order:
            order.append(event.process)
    sizes = {name: 0 for name in order}
    for event in kept:
        sizes[event.process] += len(encode(event))
    allowed, total = set(), 0
    for name in reversed(order):
        total += sizes[name]
        if total > budget:
            break
        allowed.add(name)
    return [event for event in kept if event.process in allowed]


def compact(path: Path) -> None:
    """Rewrite the log with what `_kept` keeps (the caller holds its lock); half the limit at most."""
    read = read_log(path)
    data = b"".join(encode(event) for event in _kept(read.events, MAX_LOG_BYTES // 2))
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temp.write_bytes(data)
    os.replace(temp, path)


def append(path: Path, event: JobEvent) -> None:
    """Append one event under the file's lock, compacting first where the file is over the limit; OSError where
    the directory or the file cannot be written."""
    line = encode(event)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    for _ in range(8):  # the file replaced by a compaction between open and lock: open the new one
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                held = os.fstat(fd)
                try:
                    current = os.stat(path)
                except FileNotFoundError:
                    continue
                if (held.st_dev, held.st_ino) != (current.st_dev, current.st_ino):
                    continue
                if held.st_size + len(line) > MAX_LOG_BYTES:
                    compact(path)
                    continue  # append to the compacted file, under its own lock
                os.write(fd, line)
                return
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
    raise OSError(f"{path} kept changing while appending to it")
