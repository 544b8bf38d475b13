"""The agent snapshot and the report's jobs as typed records: a real job's answer decodes into them whole, texts
past their bounds are cut as before, other misfits are one sentence naming the field."""

from __future__ import annotations

import json

import msgspec
import pytest
from agentjobs import agent_env, running_job
from conftest import TESTS, run_tool

from tpu_tools.metrics.agent_snapshot import decode_snapshot, snapshot_record
from tpu_tools.metrics.records.agent import MAX_TEXT, AgentSnapshot
from tpu_tools.metrics.records.jobs import ProcessesGroup, WorkloadGroup
from tpu_tools.outside import OutsideError

# The answer of a real job on the CPU platform (8 host devices, recompiles, goodput, a compilation cache, a
# metric): benchmarks/snapshot_decode.py --record tests/agent_snapshot_cpu.json
FIXTURE = TESTS / "agent_snapshot_cpu.json"


def _payload(document: dict) -> bytes:
    return json.dumps(document).encode() + b"\n"


def _holds(record: object, sent: object) -> bool:
    """Whether a record's JSON has every value that was sent, and None for the fields that were not."""
    if isinstance(sent, dict) and isinstance(record, dict):
        return all(_holds(record.get(key), value) for key, value in sent.items()) and all(
            record[key] is None for key in record.keys() - sent.keys())
    if isinstance(sent, list) and isinstance(record, list):
        return len(sent) == len(record) and all(_holds(r, s) for r, s in zip(record, sent))
    return record == sent and type(record) in (type(sent), float)


def test_a_real_jobs_snapshot_decodes_whole_into_its_record():
    document = json.loads(FIXTURE.read_text())
    snapshot = decode_snapshot(_payload(document))
    assert isinstance(snapshot, AgentSnapshot)
    assert len(snapshot.devices or []) == 8
    assert snapshot.compiles is not None
    assert snapshot.goodput is not None
    assert snapshot.compiles.recompile_count
    assert snapshot.compiles.recent_recompiles
    assert snapshot.compilation_cache is not None
    assert snapshot.compilation_cache.entries_written
    # every figure the agent sent is in the record, under its own name; a field it did not send is None
    assert _holds(msgspec.to_builtins(snapshot), document)
    assert snapshot_record(document) == snapshot  # a bundle's member (already read as JSON) gives the same record


def test_texts_past_their_bounds_are_cut_not_refused():
    document = json.loads(FIXTURE.read_text())
    document["command"] = "x" * (MAX_TEXT + 10)
    document["devices"][0]["host"] = "h" * 300
    document["goodput"]["problems"] = ["p" * 600]
    document["frontend"] = "j" * 40
    for snapshot in (decode_snapshot(_payload(document)), snapshot_record(document)):
        assert snapshot.command == "x" * MAX_TEXT
        assert snapshot.devices is not None
        assert snapshot.devices[0].host == "h" * 256
        assert snapshot.goodput is not None
        assert snapshot.goodput.problems == ["p" * 512]
        assert snapshot.frontend == "j" * 32
    assert len(document["command"]) == MAX_TEXT + 10  # the caller's document is left as it was


@pytest.mark.parametrize(("change", "sentence"), [
    ({"devices": [{"id": 0, "platform": "cpu", "device_kind": "cpu"}] * 4097}, "devices: has 4097 items, more "
                                                                                "than 4096"),
    ({"steps": {"count": -1}}, "steps.count: -1 is out of range"),
    ({"process": {"rss_bytes": 1 << 70}}, "process.rss_bytes: 1180591620717411303424 is out of range"),
    ({"goodput": {"recent": {"wall_s": "long"}}}, "goodput.recent.wall_s: expected a number, got 'long'"),
    ({"runtime": {"process_index": 0}}, "runtime: platform is missing"),
    ({"startup": [{"check": "x"}]}, "startup[0]: message is missing"),
    ({"compiles": {"functions": [None]}}, "compiles.functions[0]: is null"),
    ({"stacks_signal": 65}, "stacks_signal: 65 is out of range"),
])
def test_a_misfit_is_one_sentence_naming_the_field(change, sentence):
    document = {"schema": "tpu-tools/agent/v1", "pid": 7, **change}
    for decode in (lambda: decode_snapshot(_payload(document)), lambda: snapshot_record(document)):
        with pytest.raises(OutsideError) as caught:
            decode()
        assert str(caught.value) == f"answered a malformed snapshot ({sentence})"


@pytest.mark.parametrize("payload", [b"[]\n", b'{"schema": "other/v1", "pid": 3}\n', b'"x"\n'])
def test_what_is_no_snapshot_is_said_so(payload):
    with pytest.raises(OutsideError, match="^answered something that is not an agent snapshot$"):
        decode_snapshot(payload)


def test_not_json_is_said_so():
    with pytest.raises(OutsideError, match="^answered something that is not JSON$"):
        decode_snapshot(b'{"schema": "tpu-tools/agent/v1", "pid": 3')


def test_free_form_sdk_figures_are_finite():
    document = {"schema": "tpu-tools/agent/v1", "pid": 7, "tpu_sdk": {"metrics": {"duty_cycle": [float("nan")]}}}
    with pytest.raises(OutsideError, match="tpu_sdk: expected a finite number, got nan"):
        snapshot_record(document)


def test_a_monitor_reports_jobs_groups_are_their_records(tmp_path):
    """The processes and workload groups of a real report (a job with its agent) decode into their records and
    encode back to the same JSON."""
    with running_job(tag="records", light=True, launcher=False) as (job, rundir):
        result = run_tool("tpu-monitor", "--count", "1", env=agent_env(rundir), timeout=60)
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    processes = msgspec.convert(document["processes"], ProcessesGroup)
    assert [agent.tag for agent in processes.agents if agent.pid == job.pid] == ["records"]
    assert json.loads(msgspec.json.encode(processes)) == document["processes"]
    workload = msgspec.convert(document["workload"], WorkloadGroup)
    assert json.loads(msgspec.json.encode(workload)) == document["workload"]
