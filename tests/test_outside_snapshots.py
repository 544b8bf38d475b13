"""Records from outside the program (agent snapshots): a bad one is one error, the rest are reported."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from agentjobs import agent_env, make_rundir, remove_rundir, start_job, wait_for
from conftest import TESTS, run_tool
from hypothesis import given, settings
from hypothesis import strategies as st
from test_dump_cli import _members

from tpu_tools.jsonout import finite_document
from tpu_tools.metrics.agent_snapshot import parse_snapshot
from tpu_tools.outside import OutsideError


@pytest.fixture(name="rundir")
def _rundir():
    path = make_rundir()
    yield path
    remove_rundir(path)


def _file_agent(rundir: Path, tmp_path: Path, name: str, payload: bytes) -> subprocess.Popen:
    answer = tmp_path / f"{name}.json"
    answer.write_bytes(payload)
    ready = tmp_path / f"ready-{name}"
    process = subprocess.Popen([sys.executable, str(TESTS / "fakeagent.py"), str(rundir), str(ready), "file",
                                str(answer)])
    wait_for(lambda: ready.exists() and ready.read_text(), timeout=20)
    return process


def _stop(*processes: subprocess.Popen) -> None:
    for process in processes:
        process.kill()
        process.wait(timeout=10)


def _bad_agents(rundir: Path, tmp_path: Path) -> list[subprocess.Popen]:
    wrong_type = b'{"schema":"tpu-tools/agent/v1","pid":4242,"devices":"x"}\n'
    nan = b'{"schema":"tpu-tools/agent/v1","pid":4243,"uptime_s":NaN,"process":{"cpu_percent":Infinity}}\n'
    deep = b'{"schema":"tpu-tools/agent/v1","pid":1,"compiles":' + b"[" * 100_000 + b"]" * 100_000 + b"}\n"
    return [_file_agent(rundir, tmp_path, name, payload)
            for name, payload in (("wrong-type", wrong_type), ("nan", nan), ("deep", deep))]


def test_bad_agents_are_one_error_each_and_the_healthy_job_is_reported(rundir, tmp_path):
    good = start_job(rundir, tag="healthy", light=True, launcher=False)
    bad = _bad_agents(rundir, tmp_path)
    try:
        good.wait_ready()
        result = run_tool("tpu-monitor", "--count", "1", env=agent_env(rundir), timeout=60)
    finally:
        good.stop()
        _stop(*bad)
    assert result.returncode == 0, result.stderr
    assert result.stderr == "", result.stderr
    assert "NaN" not in result.stdout
    assert "Infinity" not in result.stdout
    group = json.loads(result.stdout)["processes"]
    assert group["error"] is None
    agents = {a["pid"]: a for a in group["agents"]}
    assert agents[good.pid]["error"] is None
    assert agents[good.pid]["tag"] == "healthy"
    wrong, nan, deep = (agents[p.pid] for p in bad)
    assert wrong["error"] == "answered a malformed snapshot (devices: expected a list, got 'x')"
    assert wrong["devices"] == []
    assert wrong["tag"] is None
    assert nan["error"] == "answered a malformed snapshot (uptime_s: expected a finite number, got nan)"
    assert deep["error"] in ("answered something that is not JSON",
                             "answered a malformed snapshot (nested too deeply)")


def test_a_dump_next_to_bad_agents_keeps_the_healthy_one(rundir, tmp_path):
    good = start_job(rundir, tag="healthy", light=True, launcher=False)
    bad = _bad_agents(rundir, tmp_path)
    output = tmp_path / "b.tar.gz"
    try:
        good.wait_ready()
        result = run_tool("tpu-dump", "--only", "accelerators.agents", "-o", str(output), env=agent_env(rundir))
    finally:
        good.stop()
        _stop(*bad)
    assert result.returncode == 0, result.stderr
    members = _members(output)
    text = members["accelerators/agents.json"].decode()
    assert "NaN" not in text
    assert "Infinity" not in text
    agents = {a["pid"]: a for a in json.loads(text)["agents"]}
    assert agents[good.pid]["error"] is None
    assert agents[good.pid]["snapshot"]["tag"] == "healthy"
    assert all(agents[p.pid]["error"] and agents[p.pid]["snapshot"] is None for p in bad)
    shown = run_tool("tpu-dump", "show", str(output))
    assert shown.returncode == 0
    assert f"{good.pid} (healthy" in shown.stdout


def test_a_huge_agent_costs_only_itself(rundir, tmp_path):
    good = start_job(rundir, tag="healthy", light=True, launcher=False)
    padding = "x" * (60 << 20)
    huge = _file_agent(rundir, tmp_path, "huge", json.dumps(
        {"schema": "tpu-tools/agent/v1", "pid": 7, "command": padding}).encode() + b"\n")
    output = tmp_path / "b.tar.gz"
    try:
        good.wait_ready()
        result = run_tool("tpu-dump", "--only", "accelerators.agents", "-o", str(output), env=agent_env(rundir),
                          timeout=60)  # the hang guard
    finally:
        good.stop()
        _stop(huge)
    assert result.returncode == 0, result.stderr
    agents = {a["pid"]: a for a in json.loads(_members(output)["accelerators/agents.json"])["agents"]}
    assert agents[good.pid]["error"] is None
    assert agents[huge.pid]["error"].startswith("the answer is larger than ")


def test_bundle_agents_json_of_wrong_types_is_read_as_errors(tmp_path):
    from tpu_tools.dump.findings import _agents

    class FakeBundle:
        def read_json(self, name):
            return {"agents": [{"pid": 5, "snapshot": {"schema": "tpu-tools/agent/v1", "pid": 5, "steps": 3}},
                               {"pid": "x"}, "junk", {"pid": 6, "snapshot": None, "error": "gone"}],
                    "ignored_sockets": "x"}

    found = msgspec.to_builtins(_agents(FakeBundle()))
    assert [a["pid"] for a in found["agents"]] == [5, 6]
    assert found["agents"][0]["error"] == "answered a malformed snapshot (steps: expected an object, got 3)"
    assert found["ignored_sockets"] == 0


# -- properties: any JSON document gives a clean snapshot or one OutsideError ---------------------------------

_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
_json = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=30)
_fields = st.sampled_from(["pid", "tag", "command", "devices", "runtime", "process", "compiles", "steps",
                           "uptime_s", "error", "memory_error", "explain_recompiles"])


def _finite_everywhere(value) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _finite_everywhere(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_finite_everywhere(v) for v in value)
    return value is None or isinstance(value, (str, int, bool))


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_fields, _json, max_size=8), st.integers(min_value=-5, max_value=10**20))
def test_any_snapshot_is_a_clean_record_or_one_error(extra, pid):
    document = {"schema": "tpu-tools/agent/v1", "pid": pid, **extra}
    try:
        snapshot = parse_snapshot(document)
    except OutsideError as error:
        message = str(error)
        assert message.startswith("answered a malformed snapshot (")
        assert "\n" not in message
        return
    assert _finite_everywhere(snapshot)
    json.dumps(snapshot, allow_nan=False)  # strict JSON
    assert isinstance(snapshot["pid"], int)
    assert snapshot["pid"] >= 1
    assert snapshot["devices"] is None or all(isinstance(d, dict) for d in snapshot["devices"])


@given(_json)
def test_finite_documents_are_strict_json(value):
    json.dumps(finite_document(value)[0], allow_nan=False)


def test_finite_document_replaces_only_non_finite_numbers():
    cleaned, where = finite_document({"a": [math.nan, 1.5, -math.inf], "b": "NaN", "c": 3})
    assert cleaned == {"a": [None, 1.5, None], "b": "NaN", "c": 3}
    assert where == ["a[0]", "a[2]"]


# -- bundle manifests and members: a hostile bundle is one error line or a summary with notes ------------------

def _bundle(path: Path, manifest: object, extra: dict[str, bytes] | None = None) -> Path:
    from dump_fixtures import file_member, tar_gz

    raw = manifest if isinstance(manifest, bytes) else json.dumps(manifest).encode()
    members = [file_member("b/manifest.json", raw)]
    members += [file_member(f"b/{name}", data) for name, data in (extra or {}).items()]
    path.write_bytes(tar_gz(members))
    return path


@pytest.mark.parametrize(("manifest", "fragment"), [
    ({"schema": "tpu-tools/dump/v1", "files": "x"},
     "manifest.json is malformed (Expected `array | null`, got `str` - at `$.files`)"),
    ({"schema": "tpu-tools/dump/v1", "collectors": [{"name": 5}]}, "got `int` - at `$.collectors[0].name`"),
    ({"schema": "tpu-tools/dump/v1", "duration_s": math.inf}, "duration_s: expected a finite number"),
    ({"schema": "tpu-tools/dump/v1", "files": [{"size_bytes": 1}]}, "missing required field `name` - at `$.files[0]`"),
    (b'{"schema": "tpu-tools/dump/v1", "notes": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "manifest.json is"),
], ids=["files-not-a-list", "name-not-a-string", "infinite-duration", "file-without-name", "nested-100000-deep"])
# (named: the last one's own id would be its 200 KB, which pytest puts in PYTEST_CURRENT_TEST, and the programs the
# test starts then fail to start with "Argument list too long" where an older pytest passes the whole id)
def test_a_malformed_manifest_is_one_error_line(tmp_path, manifest, fragment):
    from conftest import assert_one_line_error

    path = _bundle(tmp_path / "b.tar.gz", manifest)
    for args in (("show", str(path)), ("show", "--json", str(path))):
        result = run_tool("tpu-dump", *args)
        message = assert_one_line_error(result, 1, fragment)
        assert message.startswith("tpu-dump: error: ")
        assert "internal error" not in message


def test_member_files_of_wrong_types_become_notes(tmp_path):
    path = _bundle(tmp_path / "b.tar.gz", {"schema": "tpu-tools/dump/v1"}, {
        "accelerators/runtime.json": b'{"devices": "x", "runtime": 5}',
        "accelerators/discovery.json": b'{"chips": [{"holders": [{"pid": "a"}, {"pid": 3}]}]}',
        "software/stack.json": b'{"versions": [], "checks": "x"}',
        "system/cgroup.json": b'{"oom_kills": "many"}',
        "accelerators/agents.json": b'{"agents": {"pid": 1}}',
    })
    result = run_tool("tpu-dump", "show", "--json", str(path))
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    document = json.loads(result.stdout)
    assert any("could not be summarised" in note for note in document["notes"])
    assert run_tool("tpu-dump", "show", str(path)).returncode == 0


_manifest_values = st.fixed_dictionaries({"schema": st.just("tpu-tools/dump/v1")}, optional={
    key: _json for key in ("host", "time", "duration_s", "command", "options", "redaction", "collectors", "files",
                           "notes", "tool_version")})


@settings(max_examples=200, deadline=None)
@given(_manifest_values)
def test_any_manifest_is_a_clean_record_or_one_error(manifest):
    import msgspec

    from tpu_tools.dump.manifest import Manifest
    from tpu_tools.outside import convert

    try:
        clean = convert(manifest, Manifest)
    except OutsideError as error:
        assert "\n" not in str(error)
        return
    json.dumps(msgspec.to_builtins(clean), allow_nan=False)
    assert clean.files is None or all(isinstance(f.name, str) for f in clean.files)


def test_a_minimal_valid_snapshot_feeds_the_devices_group(rundir, tmp_path):
    minimal = {"schema": "tpu-tools/agent/v1", "pid": 9, "runtime": {"platform": "cpu"},
               "devices": [{"id": 0, "platform": "cpu", "device_kind": "cpu", "live_array_bytes": 1024}]}
    agent = _file_agent(rundir, tmp_path, "minimal", json.dumps(minimal).encode() + b"\n")
    try:
        result = run_tool("tpu-monitor", "--count", "1", env=agent_env(rundir), timeout=60)
    finally:
        _stop(agent)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["devices"]["error"] is None
    assert report["processes"]["error"] is None
    [entry] = [a for a in report["processes"]["agents"] if a["pid"] == agent.pid]
    assert entry["error"] is None
    assert entry["live_array_bytes"] == 1024
    assert any(d["live_array_bytes"] == 1024 for d in report["devices"]["devices"])


def test_socket_names_of_impossible_processes_are_ignored(rundir):
    import os
    import socket

    sockets = []
    for pid in ("0", "99999999999999999999"):
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(str(rundir / f"agent-{pid}.sock"))
        os.chmod(rundir / f"agent-{pid}.sock", 0o600)
        sockets.append(listener)
    try:
        result = run_tool("tpu-monitor", "--count", "1", env=agent_env(rundir), timeout=60)
    finally:
        for listener in sockets:
            listener.close()
    assert result.returncode == 0, result.stderr
    group = json.loads(result.stdout)["processes"]
    assert group["error"] is None
    assert group["agents"] == []
    reasons = sorted(i["reason"] for i in group["ignored_sockets"])
    assert reasons == ["agent-0.sock names no possible process; ignored",
                       "agent-99999999999999999999.sock names no possible process; ignored"]


def test_a_null_where_a_list_holds_objects_is_one_error():
    """Found by the manifest property test: readers index every item of a list of objects."""
    from tpu_tools.dump.manifest import Manifest
    from tpu_tools.metrics.agent_snapshot import parse_snapshot
    from tpu_tools.outside import convert

    with pytest.raises(OutsideError, match=r"got `null` - at `\$\.files\[0\]`"):
        convert({"schema": "tpu-tools/dump/v1", "files": [None]}, Manifest)
    with pytest.raises(OutsideError, match=r"devices\[0\]: is null"):
        parse_snapshot({"schema": "tpu-tools/agent/v1", "pid": 7, "devices": [None]})
