"""A monitor that reads snapshot files round after round pays only for what changed: counted, not timed."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from agentjobs import rundir  # noqa: F401 (a fixture)

from tpu_tools.agent.server import AgentServer
from tpu_tools.metrics import wire
from tpu_tools.metrics.agent_client import AgentConnections, query_agents
from tpu_tools.metrics.agent_snapshot import decode_snapshot
from tpu_tools.metrics.snapfile import HEADER_SIZE, SnapshotFileError, SnapshotWriter
from tpu_tools.metrics.snapreader import SnapshotFiles
from tpu_tools.outside import OutsideError


def snapshot(step: int, **fields: object) -> dict[str, object]:
    return {"schema": wire.SNAPSHOT_SCHEMA, "pid": os.getpid(), "tag": "kept", "uptime_s": 1.5 + step,
            "devices": [{"id": 0, "platform": "cpu", "device_kind": "cpu", "memory_used_bytes": 1024}],
            "compiles": {"count": 3, "functions": [{"name": "train_step", "count": 1}]},
            "steps": {"count": step, "last_step_age_s": 0.25}, **fields}


@pytest.fixture
def writer(rundir: Path) -> Iterator[SnapshotWriter]:
    kept = SnapshotWriter(rundir / f"agent-{os.getpid()}.snap", 1 << 20)
    kept.create()
    yield kept
    kept.close()


def test_an_unchanged_generation_is_not_decoded_again(writer):
    files = SnapshotFiles()
    writer.publish(orjson.dumps(snapshot(1)))
    first = files.read(writer.path, 1 << 20)
    assert first is not None
    assert first.snapshot.steps.count == 1
    assert files.counts.decoded == 1
    assert files.counts.unchanged == 0
    for _ in range(5):
        again = files.read(writer.path, 1 << 20)
        assert again is not None
        assert again.snapshot == first.snapshot
        assert again.snapshot is first.snapshot  # the record decoded before, shared: readers never change it
    assert files.counts.decoded == 1
    assert files.counts.unchanged == 5
    writer.publish(orjson.dumps(snapshot(2)))
    changed = files.read(writer.path, 1 << 20)
    assert changed is not None
    assert changed.snapshot.steps.count == 2
    assert files.counts.decoded == 2
    files.close()


def test_a_new_generation_is_decoded_whole_into_the_record_an_answer_gives(writer):
    files = SnapshotFiles()
    writer.publish(orjson.dumps(snapshot(1)))
    files.read(writer.path, 1 << 20)
    document = orjson.dumps(snapshot(2, tag="renamed"))
    writer.publish(document)
    read = files.read(writer.path, 1 << 20)
    assert read is not None
    assert read.snapshot == decode_snapshot(document)
    assert read.snapshot.tag == "renamed"
    assert files.counts.decoded == 2
    files.close()


def test_a_field_that_turns_bad_is_refused_though_the_last_generation_held_it_good(writer):
    files = SnapshotFiles()
    writer.publish(orjson.dumps(snapshot(1)))
    files.read(writer.path, 1 << 20)
    writer.publish(orjson.dumps(snapshot(2, devices=[{"id": "zero", "platform": "cpu", "device_kind": "cpu"}])))
    with pytest.raises(OutsideError, match=r"devices\[0\]\.id"):
        files.read(writer.path, 1 << 20)
    writer.publish(orjson.dumps(snapshot(3)))
    read = files.read(writer.path, 1 << 20)
    assert read is not None
    assert read.snapshot.devices[0].id == 0
    files.close()


def test_a_file_replaced_at_its_path_is_opened_anew(rundir, writer):
    files = SnapshotFiles()
    writer.publish(orjson.dumps(snapshot(1, tag="first")))
    assert files.read(writer.path, 1 << 20).snapshot.tag == "first"
    writer.close()  # its agent ended; another took the same path
    assert files.read(writer.path, 1 << 20) is None
    second = SnapshotWriter(writer.path, 1 << 20)
    second.create()
    try:
        second.publish(orjson.dumps(snapshot(1, tag="second")))  # generation 2, as the first one's was
        read = files.read(writer.path, 1 << 20)
        assert read is not None
        assert read.snapshot.tag == "second"
    finally:
        second.close()
        files.close()


def test_a_kept_file_whose_writer_is_gone_reads_as_none(writer):
    files = SnapshotFiles()
    writer.publish(orjson.dumps(snapshot(1)))
    assert files.read(writer.path, 1 << 20) is not None
    writer.forget_after_fork()  # lets its lock go and leaves the file: as a killed agent does
    assert files.read(writer.path, 1 << 20) is None


def test_a_file_that_turns_to_garbage_is_refused(writer):
    files = SnapshotFiles()
    writer.publish(orjson.dumps(snapshot(1)))
    files.read(writer.path, 1 << 20)
    writer.publish(b"{not json")
    with pytest.raises(SnapshotFileError, match="not JSON"):
        files.read(writer.path, 1 << 20)
    files.close()


def test_a_monitors_rounds_read_each_generation_once_and_age_every_round(rundir, writer):
    server = AgentServer(rundir / f"agent-{os.getpid()}.sock", lambda request: snapshot(0, tag="socket"))
    server.start()
    connections = AgentConnections()
    try:
        writer.publish(orjson.dumps(snapshot(7)))
        for _ in range(3):
            scan = query_agents(5.0, directory=rundir, connections=connections)
            [result] = scan.results
            assert result.error is None
            assert result.snapshot.steps.count == 7
            assert result.snapshot.steps.last_step_age_s >= 0.25
        assert connections.files.counts.decoded == 1
        assert connections.files.counts.unchanged == 2
        kept = connections.files.read(writer.path, 1 << 20)
        # each round aged a copy
        assert kept is not None
        assert kept.snapshot.steps.last_step_age_s == 0.25
        assert server.counters.served == 0
    finally:
        connections.close()
        server.stop()


def test_a_kept_file_whose_mode_opens_up_is_refused(writer):
    files = SnapshotFiles()
    writer.publish(orjson.dumps(snapshot(1)))
    assert files.read(writer.path, 1 << 20) is not None
    os.chmod(writer.path, 0o644)
    with pytest.raises(SnapshotFileError, match="has mode 0644, not 0600"):
        files.read(writer.path, 1 << 20)
    files.close()


def test_a_damaged_document_read_with_its_header_is_called_damaged(writer):
    files = SnapshotFiles()
    writer.publish(orjson.dumps(snapshot(1)))
    files.read(writer.path, 1 << 20)  # the next read takes the header and a document of this size in one
    writer.publish(orjson.dumps(snapshot(2)))
    fd = os.open(writer.path, os.O_WRONLY)
    try:
        os.pwrite(fd, b"#", HEADER_SIZE + 3)  # the content no longer matches its checksum
    finally:
        os.close(fd)
    with pytest.raises(SnapshotFileError, match="is damaged"):
        files.read(writer.path, 1 << 20)
    files.close()
