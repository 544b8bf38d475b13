"""The snapshot file: monitors read a job's snapshot without waking it, never a torn or foreign one."""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import tempfile
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from agentjobs import start_job, wait_for

import tpu_tools.agent as agent
from tpu_tools.agent.publish import Publisher
from tpu_tools.agent.server import AgentServer
from tpu_tools.metrics import wire
from tpu_tools.metrics.agent_client import query_agent, query_agents
from tpu_tools.metrics.snapfile import HEADER, HEADER_SIZE, MAGIC, SnapshotFileError, SnapshotWriter, read_snapshot_file


@pytest.fixture
def directory(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="ttp", dir="/tmp"))  # short: a socket path has at most 107 bytes
    os.chmod(path, 0o700)
    monkeypatch.setenv("TPU_TOOLS_RUNTIME_DIR", str(path))
    monkeypatch.delenv("TPU_TOOLS_SNAPSHOT_FILE", raising=False)
    agent.stop()  # an agent an earlier test of this process left running serves another directory
    yield path
    agent.stop()
    shutil.rmtree(path, ignore_errors=True)


def snapshot_of(pid: int, **fields: object) -> dict[str, object]:
    return {"schema": wire.SNAPSHOT_SCHEMA, "pid": pid, "tag": "file", **fields}


def served_by(directory: Path, answer: dict[str, object]) -> AgentServer:
    """A socket answering `answer` for this process, beside which the tests put snapshot files."""
    server = AgentServer(directory / f"agent-{os.getpid()}.sock", lambda request: answer)
    server.start()
    return server


def write_file(path: Path, document: bytes, *, generation: int = 2, crc: int | None = None, mode: int = 0o600,
               length: int | None = None) -> int:
    """A snapshot file as a writer would leave it; returns a descriptor holding the writer's lock."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, mode)
    os.fchmod(fd, mode)
    header = HEADER.pack(MAGIC, generation, len(document) if length is None else length,
                         zlib.crc32(document) if crc is None else crc, 0, 1.0)
    os.pwrite(fd, header.ljust(HEADER_SIZE, b"\0") + document, 0)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def test_a_monitor_reads_the_published_snapshot_and_the_agent_serves_nothing(directory):
    agent.start(tag="published")
    marked = agent.step_count() + 3  # steps are counted per process: earlier tests here may have marked some
    for _ in range(3):
        agent.step()
    served = agent._agent.server.counters.served
    wait_for(lambda: query_agents(5.0).results[0].snapshot.steps.count == marked, timeout=10, interval=0.02)
    scan = query_agents(5.0)
    assert [(r.tag, r.error) for r in scan.results] == [("published", None)]
    snapshot = scan.results[0].snapshot
    assert snapshot.published_unix_s > 0
    assert snapshot.uptime_s > 0
    assert agent._agent.server.counters.served == served  # nobody woke the job's serving thread
    assert query_agent(os.getpid(), 5.0)["tag"] == "published"  # on demand: made now, on the socket
    assert agent._agent.server.counters.served == served + 1
    agent.stop()
    assert not (directory / f"agent-{os.getpid()}.snap").exists()


def test_turned_off_the_monitor_asks_the_socket(directory, monkeypatch):
    monkeypatch.setenv("TPU_TOOLS_SNAPSHOT_FILE", "0")
    agent.start(tag="socket")
    assert not (directory / f"agent-{os.getpid()}.snap").exists()
    assert query_agents(5.0).results[0].tag == "socket"
    assert agent._agent.server.counters.served == 1


def test_a_reader_never_sees_half_a_snapshot(directory):
    """One thread publishes documents of changing sizes (the file grows under the reader) while another reads."""
    writer = SnapshotWriter(directory / "agent-1.snap", 1 << 24)
    writer.create()
    stop = threading.Event()

    def publish() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            writer.publish(orjson.dumps({"n": n, "pad": "x" * (n * 97 % 300_000), "m": n}))
            stop.wait(0.0002)

    thread = threading.Thread(target=publish)
    thread.start()
    try:
        seen = set()
        for _ in range(2000):
            published = read_snapshot_file(writer.path, 1 << 24)
            if published is None:
                continue
            document = orjson.loads(published.document)
            assert document["n"] == document["m"]
            assert len(document["pad"]) == document["n"] * 97 % 300_000
            seen.add(document["n"])
        assert len(seen) > 1
    finally:
        stop.set()
        thread.join()
        writer.close()
    assert not writer.path.exists()


def test_a_writer_stuck_mid_write_is_an_error_not_a_torn_read(directory):
    fd = write_file(directory / "agent-1.snap", b"{}", generation=3)
    try:
        with pytest.raises(SnapshotFileError, match="was being written at every read"):
            read_snapshot_file(directory / "agent-1.snap", 1 << 20)
    finally:
        os.close(fd)


@pytest.mark.parametrize(("kind", "message"), [
    ("mode", "has mode 0644, not 0600"),
    ("crc", "is damaged"),
    ("length", "more than the"),
    ("magic", "is not a snapshot file"),
    ("json", "published something that is not JSON"),
    ("schema", "not an agent snapshot"),
    ("pid", "names process 1, not"),
    ("link", "cannot be opened"),
    ("fifo", "is not a regular file"),
])
def test_a_hostile_file_is_refused_for_that_agent_alone(directory, kind, message):
    server = served_by(directory, snapshot_of(os.getpid()))
    path = directory / f"agent-{os.getpid()}.snap"
    good = orjson.dumps(snapshot_of(os.getpid()))
    fds = []
    try:
        if kind == "link":
            target = directory / "elsewhere"
            fds.append(write_file(target, good))
            path.symlink_to(target)
        elif kind == "fifo":
            os.mkfifo(path, 0o600)
        elif kind == "magic":
            fds.append(write_file(path, good))
            os.pwrite(fds[0], b"NOTSNAP!", 0)
        else:
            document = {"json": b"{not json", "schema": b'{"schema": "other", "pid": 1}',
                        "pid": orjson.dumps(snapshot_of(1))}.get(kind, good)
            fds.append(write_file(path, document, mode=0o644 if kind == "mode" else 0o600,
                                  crc=1 if kind == "crc" else None, length=1 << 30 if kind == "length" else None))
        scan = query_agents(5.0, directory=directory, max_bytes=1 << 20)
        assert len(scan.results) == 1
        assert scan.results[0].snapshot is None
        assert message in scan.results[0].error
        assert server.counters.served == 0  # refused, not papered over by asking the socket
    finally:
        for fd in fds:
            os.close(fd)
        server.stop()


def test_a_file_nobody_holds_is_a_dead_writers_and_the_socket_is_asked(directory):
    server = served_by(directory, snapshot_of(os.getpid(), tag="live"))
    path = directory / f"agent-{os.getpid()}.snap"
    fd = write_file(path, orjson.dumps(snapshot_of(os.getpid(), tag="dead")))
    fcntl.flock(fd, fcntl.LOCK_UN)  # its writer is gone; the PID is another process's now
    try:
        assert query_agents(5.0, directory=directory).results[0].tag == "live"
        assert server.counters.served == 1
    finally:
        os.close(fd)
        server.stop()


def test_a_killed_agent_leaves_no_file_behind_once_a_monitor_looks(directory):
    job = start_job(directory, tag="killed", light=True, launcher=False).wait_ready()
    snap = directory / f"agent-{job.pid}.snap"
    try:
        wait_for(lambda: [r.tag for r in query_agents(5.0).results] == ["killed"])
        assert snap.exists()
        job.process.send_signal(signal.SIGKILL)
        job.process.wait(timeout=10)
        scan = query_agents(5.0)
        assert scan.results == []
        assert scan.removed_stale == [job.pid]
        assert not snap.exists()
        assert not snap.with_suffix(".sock").exists()
    finally:
        job.stop()


def test_a_forked_child_leaves_its_parents_file_alone(directory):
    agent.start(tag="parent")
    path = directory / f"agent-{os.getpid()}.snap"
    child = os.fork()
    if child == 0:  # pragma: no cover (the child's exit code is the assertion)
        os._exit(0 if agent.current() is None else 1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    served = agent._agent.server.counters.served
    assert path.exists()
    assert query_agents(5.0).results[0].tag == "parent"
    assert agent._agent.server.counters.served == served  # the parent still holds its file's lock



def test_between_changes_a_publication_reads_again_only_what_steps_change(directory):
    built: list[str] = []

    def full() -> dict[str, object]:
        built.append("full")
        return snapshot_of(os.getpid(), built="full")

    def since_full() -> dict[str, object]:
        built.append("steps")
        return snapshot_of(os.getpid(), built="steps")

    # nothing but the test and a change asks for a publication here: no idle one, no full one by age
    publisher = Publisher(directory / f"agent-{os.getpid()}.sock", full, since_full, refresh_s=3600, idle_s=3600)
    publisher.start()
    try:
        assert built == ["full"]  # the first publication reads everything
        publisher.publish()
        publisher.publish()
        assert built == ["full", "steps", "steps"]  # step boundaries: what steps change, the rest kept
        assert orjson.loads(read_snapshot_file(publisher.path, 1 << 20).document)["built"] == "steps"
        publisher.request()  # a change outside a step (a compile, a metric): the publishing thread reads it all
        wait_for(lambda: built[-1] == "full", timeout=10, interval=0.01)
        publisher.publish()
        assert built[-1] == "steps"
    finally:
        publisher.stop()
    built.clear()
    every_time = Publisher(directory / f"agent-{os.getpid()}.sock", full, since_full, refresh_s=0.0, idle_s=3600)
    every_time.start()
    try:
        every_time.publish()
        assert built == ["full", "full"]  # a full snapshot at least every refresh_s
    finally:
        every_time.stop()


def test_a_step_snapshot_is_the_last_full_one_with_what_steps_change_read_again(directory):
    agent.start(tag="steps")
    running = agent._agent
    for _ in range(3):
        agent.step()
    full = running.snapshot()
    for _ in range(2):
        agent.step()
    between = running.step_snapshot()
    assert between.keys() == full.keys()
    assert between["steps"]["count"] == full["steps"]["count"] + 2
    assert between["goodput"]["steps"] == full["goodput"]["steps"] + 2
    assert between["uptime_s"] > full["uptime_s"]
    assert between["compiles"] is full["compiles"]  # what changes outside steps: the full snapshot's, not read
    assert between["metrics"] is full["metrics"]
    # a metric is a change outside a step: the publisher reads everything again for the file
    assert agent.metric("loss", 0.25)
    wait_for(lambda: [m.name for m in query_agents(5.0).results[0].snapshot.metrics.values] == ["loss"],
             timeout=10, interval=0.02)
