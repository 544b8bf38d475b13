"""`tpu-dump` and `tpu-dump show` end to end: the real console script, the real CPU runtime, fixture hosts."""

from __future__ import annotations

import gzip
import json
import os
import shlex
import signal
import stat
import subprocess
import tarfile
import time
from pathlib import Path

import psutil
import pytest
import sysroot
from conftest import DEFAULT_METRICS_ADDR, assert_one_line_error, clean_env, run_tool, tool_command
from dump_fixtures import (
    PRIVATE_KEY,
    SECRETS,
    file_member,
    plant_logs,
    special_member,
    system_files,
    tar_gz,
)
from isolation import kill_tmux_server, tmux_command, unique_name
from programs import require_program

MANIFEST_KEYS = {"schema", "tool", "tool_version", "host", "time", "duration_s", "command", "options", "redaction",
                 "collectors", "files", "notes"}
COLLECTOR_KEYS = {"name", "status", "error", "duration_s", "files", "notes"}
FILE_KEYS = {"name", "collector", "size_bytes", "sha256", "redactions", "source", "source_size_bytes",
             "trimmed_from_bytes"}
SHOW_KEYS = {"schema", "bundle", "host", "time", "tool_version", "duration_s", "redaction", "devices", "versions",
             "libtpu", "agents", "collectors", "failed_collectors", "warnings", "files", "unsafe_members", "notes"}


def _host(root: Path) -> Path:
    sysroot.v4_host(root, holders={2001: [0]})
    system_files(root)
    plant_logs(root)
    (root / "proc/2001/environ").write_bytes(
        f"JAX_PLATFORMS=tpu\0TPU_SECRET_KEY={SECRETS['env_token']}\0HOME=/home/alice\0".encode())
    return root


def _members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path, "r:gz") as tar:
        return {m.name.split("/", 1)[1]: tar.extractfile(m).read() for m in tar if m.isfile()}


def _manifest(path: Path) -> dict:
    return json.loads(_members(path)["manifest.json"])


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """One full run with secrets planted everywhere, shared by the tests that read its bundle."""
    base = tmp_path_factory.mktemp("planted")
    root = _host(base / "root")
    added = base / "run-logs"
    added.mkdir()
    (added / "train.log").write_text(f"step 10 loss 1.5\nconnecting to redis://:{SECRETS['url_password']}@cache:6379\n"
                                     f"loaded key:\n{PRIVATE_KEY}step 11 loss 1.4\n")
    credentials = added / "sa.json"
    credentials.write_text(json.dumps({"value": SECRETS["credentials_file"]}))
    os.symlink(str(root / "outside-secret.txt"), added / "escape.log")
    env = clean_env(TPU_TOOLS_SYSROOT=str(root), TPU_API_TOKEN=SECRETS["env_token"],
                    TPU_PROXY_URL=f"https://proxy-user:{SECRETS['url_password']}@proxy.internal:3128",
                    MY_SERVICE_PASSWORD=SECRETS["log_password"], GOOGLE_APPLICATION_CREDENTIALS=str(credentials))
    output = base / "bundle.tar.gz"
    result = run_tool("tpu-dump", "--platform", "cpu", "--host-devices", "2", "--add", str(added), "-o", str(output),
                      env=env, cwd=base)  # run_tool's timeout is the hang guard
    return {"result": result, "path": output, "env": env, "base": base}


def test_the_bundle_is_private_complete_and_pinned(planted):
    result, path = planted["result"], planted["path"]
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"wrote {path} (")
    assert f"read it with: tpu-dump show {path}" in result.stdout
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in path.parent.iterdir() if p.name.startswith(".")] == []  # no temporary left
    manifest = _manifest(path)
    assert set(manifest) == MANIFEST_KEYS
    assert manifest["schema"] == "tpu-tools/dump/v1"
    assert all(set(c) == COLLECTOR_KEYS for c in manifest["collectors"])
    assert all(set(f) == FILE_KEYS for f in manifest["files"])
    statuses = {c["name"]: c["status"] for c in manifest["collectors"]}
    from tpu_tools.dump.collectors import collector_names

    assert list(statuses) == collector_names()
    assert set(statuses.values()) <= {"ok", "skipped"}, statuses
    assert statuses["accelerators.runtime"] == statuses["logs.added"] == statuses["system.pci"] == "ok"
    libtpu = next(c for c in manifest["collectors"] if c["name"] == "accelerators.libtpu")
    assert (libtpu["status"], libtpu["error"]) == ("skipped", "no libtpu metrics service answered (tried "
                                                              f"{DEFAULT_METRICS_ADDR}: connection refused)")
    members = _members(path)
    import hashlib

    for entry in manifest["files"]:
        assert hashlib.sha256(members[entry["name"]]).hexdigest() == entry["sha256"]
        assert len(members[entry["name"]]) == entry["size_bytes"]
    runtime = json.loads(members["accelerators/runtime.json"])
    assert [d["id"] for d in runtime["devices"]] == [0, 1]
    assert all(d["probe"]["ok"] for d in runtime["devices"])


def test_planted_secrets_appear_nowhere_in_the_bundle(planted):
    path = planted["path"]
    stream = gzip.decompress(path.read_bytes())
    members = _members(path)
    for label, secret in SECRETS.items():
        assert secret.encode() not in stream, label
        for name, data in members.items():
            assert secret.encode() not in data, (label, name)
    manifest = json.loads(members["manifest.json"])
    files = {f["name"]: f for f in manifest["files"]}
    assert files["software/env.json"]["redactions"]["secret_variable"] >= 2  # ours and the holder's
    assert files["software/env.txt"]["redactions"]
    log = "logs/libtpu/tpu_driver.vm.root.log.INFO.20250101-120000.1"
    assert set(files[log]["redactions"]) >= {"url_credentials", "bearer_token", "secret_value", "high_entropy"}
    added = files["logs/added/1-run-logs/train.log"]["redactions"]
    assert added["private_key"] == 1
    assert added["url_credentials"] == 1
    assert manifest["redaction"]["redacted_total"] == sum(sum(f["redactions"].values()) for f in files.values())
    # what was skipped is said, without the content
    index = json.loads(members["logs/added/index.json"])["paths"][0]
    reasons = {s["path"]: s["reason"] for s in index["skipped"]}
    assert reasons["sa.json"] == "a credential file; never collected"
    assert "leaves" in reasons["escape.log"]
    assert "MY_SERVICE_PASSWORD" not in members["software/env.txt"].decode()  # not a stack variable


def test_show_summarises_without_extracting(planted):
    path, env = planted["path"], planted["env"]
    before = sorted(os.listdir(path.parent))
    shown = run_tool("tpu-dump", "show", str(path), env=env, cwd=path.parent)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].startswith(f"bundle     {path} (")
    assert lines[2] == ("devices    2 x cpu on the cpu platform; probe 2 passed, 0 failed; chips: 4 x TPU v4; "
                        "held by 2001 (/usr/bin/python3)")
    assert lines[3].startswith("versions   jax ")
    assert lines[3].endswith("they agree")
    assert "oom_kills: the OOM killer ended 2 processes in this cgroup" in shown.stdout
    assert "kernel_errors: 1 kernel messages" in shown.stdout
    assert "logs/libtpu/tpu_driver.vm.root.log.INFO.20250101-120000.1" in shown.stdout
    document = json.loads(run_tool("tpu-dump", "show", "--json", str(path), env=env).stdout)
    assert set(document) == SHOW_KEYS
    assert document["schema"] == "tpu-tools/dump-show/v1"
    assert document["devices"]["device_count"] == 2
    assert document["failed_collectors"] == []
    assert document["libtpu"] is None  # no metrics service answered: the collector skipped, no file
    assert {w["kind"] for w in document["warnings"]} == {"oom_kills", "kernel_errors"}
    member = run_tool("tpu-dump", "show", str(path), "--file", "software/packages.txt", env=env)
    assert member.returncode == 0
    assert "jax==" in member.stdout
    via_group = run_tool("tpu-tools", "dump", "show", str(path), "--file", "manifest.json", env=env)
    assert json.loads(via_group.stdout)["schema"] == "tpu-tools/dump/v1"
    assert sorted(os.listdir(path.parent)) == before


def test_no_redact_keeps_the_values_and_warns(tmp_path):
    root = _host(tmp_path / "root")
    env = clean_env(TPU_TOOLS_SYSROOT=str(root), TPU_API_TOKEN=SECRETS["env_token"])
    result = run_tool("tpu-dump", "--no-redact", "--only", "software.env,logs", "-o", str(tmp_path / "b.tar.gz"),
                      env=env)
    assert result.returncode == 0, result.stderr
    assert "warning: --no-redact" in result.stderr
    assert "redaction: OFF" in result.stdout
    stream = gzip.decompress((tmp_path / "b.tar.gz").read_bytes())
    assert SECRETS["env_token"].encode() in stream
    assert SECRETS["bearer"].encode() in stream
    shown = run_tool("tpu-dump", "show", str(tmp_path / "b.tar.gz"), env=env)
    assert "not_redacted: this bundle was written with --no-redact" in shown.stdout


# --- faults -------------------------------------------------------------------------------------------

def _hanging_host(root: Path) -> Path:
    """/proc/meminfo is a FIFO nobody writes: reading it blocks, like a file on a dead mount."""
    _host(root)
    (root / "proc/meminfo").unlink()
    os.mkfifo(root / "proc/meminfo")
    return root


def test_a_hanging_collector_costs_its_timeout_and_the_bundle_arrives(tmp_path):
    env = clean_env(TPU_TOOLS_SYSROOT=str(_hanging_host(tmp_path / "root")))
    # The hang guard is run_tool's timeout; the collector's own timeout shows in its status.
    result = run_tool("tpu-dump", "--timeout", "2", "--skip", "accelerators.runtime", "-o",
                      str(tmp_path / "b.tar.gz"), env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "system.memory  TIMED OUT" in result.stdout
    statuses = {c["name"]: (c["status"], c["error"]) for c in _manifest(tmp_path / "b.tar.gz")["collectors"]}
    assert statuses["system.memory"] == ("timed_out", "did not finish within 2 s; stopped")
    assert statuses["system.cpu"][0] == "ok"


def test_a_hanging_runtime_is_reported_and_the_bundle_still_written(tmp_path, hanging_plugin):
    env = clean_env(PYTHONPATH=str(hanging_plugin))
    result = run_tool("tpu-dump", "--timeout", "4", "--only", "accelerators,software.python", "-o",
                      str(tmp_path / "b.tar.gz"), env=env, timeout=120)  # the hang guard
    assert result.returncode == 0, result.stderr
    runtime = next(c for c in _manifest(tmp_path / "b.tar.gz")["collectors"] if c["name"] == "accelerators.runtime")
    assert runtime["status"] == "timed_out"
    assert "runtime did not answer within 2 s" in runtime["error"]


def test_a_bad_jax_platforms_is_recorded_not_fatal(tmp_path):
    env = clean_env(JAX_PLATFORMS="garbage")
    result = run_tool("tpu-dump", "--only", "accelerators.runtime", "-o", str(tmp_path / "b.tar.gz"), env=env)
    assert result.returncode == 0, result.stderr
    runtime = next(c for c in _manifest(tmp_path / "b.tar.gz")["collectors"] if c["name"] == "accelerators.runtime")
    assert runtime["status"] == "failed"
    assert "JAX_PLATFORMS='garbage' names no known platform" in runtime["error"]


def test_unreadable_sources_become_notes(tmp_path):
    root = _host(tmp_path / "root")
    (root / "etc/os-release").unlink()
    (root / "etc/os-release").mkdir()  # reading it fails with EISDIR
    (root / "proc/cpuinfo").unlink()
    os.symlink("/nonexistent", root / "proc/cpuinfo")  # dangling
    result = run_tool("tpu-dump", "--only", "system.os,system.cpu,logs.libtpu", "-o", str(tmp_path / "b.tar.gz"),
                      env=clean_env(TPU_TOOLS_SYSROOT=str(root)))
    assert result.returncode == 0, result.stderr
    collectors = {c["name"]: c for c in _manifest(tmp_path / "b.tar.gz")["collectors"]}
    assert collectors["system.os"]["status"] == "ok"
    assert any("is a directory" in n for n in collectors["system.os"]["notes"])
    assert collectors["system.cpu"]["status"] == "failed"
    assert "cpuinfo" in collectors["system.cpu"]["error"]
    assert collectors["system.cpu"]["files"] == ["errors/system.cpu.txt"]  # the traceback, for whoever fixes it
    assert b"Traceback" in _members(tmp_path / "b.tar.gz")["errors/system.cpu.txt"]
    assert any("dangling.log" in n and "no such file" in n for n in collectors["logs.libtpu"]["notes"])


def test_ctrl_c_leaves_no_file_and_no_process(tmp_path):
    env = clean_env(TPU_TOOLS_SYSROOT=str(_hanging_host(tmp_path / "root")))
    out = tmp_path / "out"
    out.mkdir()
    process = subprocess.Popen([*tool_command("tpu-dump"), "--timeout", "60", "-o", str(out / "b.tar.gz")],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(100):  # wait until collecting: the temporary file exists and collectors run
            children = psutil.Process(process.pid).children(recursive=True)
            if os.listdir(out) and children:
                break
            time.sleep(0.1)
        assert os.listdir(out)[0].startswith(".b.tar.gz.partial-")
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=15)
    finally:
        process.kill()
    assert process.returncode == 130
    assert "tpu-dump: interrupted" in stderr
    assert "Traceback" not in stderr
    assert os.listdir(out) == []
    for _ in range(50):
        alive = [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
        if not alive:
            break
        time.sleep(0.1)
    assert not alive


# --- bad input ----------------------------------------------------------------------------------------

def test_output_folder_missing_or_not_writable(tmp_path):
    message = assert_one_line_error(run_tool("tpu-dump", "-o", str(tmp_path / "no/such/b.tar.gz")), 2)
    assert message.endswith(f"the folder {tmp_path / 'no/such'} does not exist")
    (tmp_path / "file").write_text("")
    message = assert_one_line_error(run_tool("tpu-dump", "-o", str(tmp_path / "file/b.tar.gz")), 2)
    assert "is not a folder" in message
    if os.path.ismount("/sys"):  # sysfs refuses new files even to root
        message = assert_one_line_error(run_tool("tpu-dump", "-o", "/sys/b.tar.gz"), 2)
        assert message == ("tpu-dump: error: cannot write the bundle in /sys: permission denied "
                           "(choose another --output)")
    message = assert_one_line_error(run_tool("tpu-dump", "-o", str(tmp_path)), 2)
    assert "it is a folder" in message


def test_an_existing_output_is_refused_unless_forced(tmp_path):
    target = tmp_path / "b.tar.gz"
    target.write_text("keep me")
    message = assert_one_line_error(run_tool("tpu-dump", "--only", "system.os", "-o", str(target)), 2)
    assert message == f"tpu-dump: error: {target} already exists; use --force to replace it, or choose another --output"
    assert target.read_text() == "keep me"
    forced = run_tool("tpu-dump", "--only", "system.os", "-o", str(target), "--force")
    assert forced.returncode == 0
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert "system/os.json" in _members(target)


def test_default_output_name_in_the_current_folder(tmp_path):
    result = run_tool("tpu-dump", "--only", "system.os", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    name = Path(document["bundle"]["path"]).name
    assert Path(document["bundle"]["path"]).parent == tmp_path
    assert name.startswith("tpu-dump-")
    assert name.endswith("Z.tar.gz")
    assert document["schema"] == "tpu-tools/dump/v1"
    assert {c["name"]: c["status"] for c in document["collectors"]}["system.cpu"] == "skipped"


@pytest.mark.parametrize(("args", "fragment"), [
    (["--only", "system,bogus"], "--only: unknown collector 'bogus'"),
    (["--skip", "nope.thing"], "--skip: unknown collector 'nope.thing'"),
    (["--max-size", "lots"], "Invalid value for '--max-size'"),
    (["--max-size", "1K"], "must be at least 64K"),
    (["--timeout", "0"], "Invalid value for '--timeout'"),
    (["--add", "/no/such/path"], "--add /no/such/path: no such file or folder"),
])
def test_bad_options_are_usage_errors(tmp_path, args, fragment):
    result = run_tool("tpu-dump", *args, "-o", str(tmp_path / "b.tar.gz"))
    assert_one_line_error(result, 2, fragment)
    assert os.listdir(tmp_path) == []


def test_list_collectors():
    result = run_tool("tpu-dump", "--list-collectors")
    assert result.returncode == 0
    assert result.stdout.splitlines()[0].split() == ["COLLECTOR", "WHAT", "IT",
                                                                                "COLLECTS"]
    assert "accelerators.runtime" in result.stdout
    assert "logs.kernel" in result.stdout


# --- show on bad and hostile files ----------------------------------------------------------------------

def test_show_on_a_file_that_is_not_an_archive(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("just text\n" * 100)
    message = assert_one_line_error(run_tool("tpu-dump", "show", str(path)), 1)
    assert message == f"tpu-dump: error: {path} is not a tpu-dump bundle: not a tar archive, compressed or not"
    assert_one_line_error(run_tool("tpu-dump", "show", str(tmp_path / "missing.tar.gz")), 2, "does not exist")


def test_show_on_a_truncated_archive(planted, tmp_path):
    data = planted["path"].read_bytes()
    truncated = tmp_path / "truncated.tar.gz"
    truncated.write_bytes(data[: len(data) // 2])
    message = assert_one_line_error(run_tool("tpu-dump", "show", str(truncated)), 1)
    assert f"{truncated} is truncated or corrupt" in message


def test_show_on_a_hostile_archive_reports_and_writes_nothing(planted, tmp_path):
    with tarfile.open(planted["path"], "r:gz") as tar:
        original = [(m, tar.extractfile(m).read()) for m in tar if m.isfile()]
    top = original[0][0].name.split("/")[0]
    hostile = tmp_path / "hostile.tar.gz"
    hostile.write_bytes(tar_gz([
        *original,
        file_member("../escaped.txt", b"written outside"),
        file_member("/tmp/absolute-evil.txt", b"absolute"),
        special_member(f"{top}/passwd", tarfile.SYMTYPE, "/etc/passwd"),
        special_member(f"{top}/hard", tarfile.LNKTYPE, "/etc/shadow"),
        special_member(f"{top}/pipe", tarfile.FIFOTYPE),
        file_member(f"{top}/\x1b[2Jclear.txt", b"terminal escape in the name"),
    ]))
    run_in = tmp_path / "cwd"
    run_in.mkdir()
    result = run_tool("tpu-dump", "show", str(hostile), cwd=run_in)
    assert result.returncode == 0, result.stderr
    for fragment in ("'../escaped.txt': a path with '..' that leaves the bundle; not read",
                     "'/tmp/absolute-evil.txt': an absolute path; not read",
                     "a symbolic link to '/etc/passwd'; not followed", "a hard link to '/etc/shadow'; not followed",
                     "a fifo entry; ignored", "control characters in the name; not read"):
        assert fragment in result.stdout, fragment
    assert "\x1b" not in result.stdout
    assert os.listdir(run_in) == []
    assert not (tmp_path / "escaped.txt").exists()
    assert not Path("/tmp/absolute-evil.txt").exists()
    refused = run_tool("tpu-dump", "show", str(hostile), "--file", "passwd")
    assert_one_line_error(refused, 1, "is a symbolic link to '/etc/passwd'; not followed")
    assert_one_line_error(run_tool("tpu-dump", "show", str(hostile), "--file", "nothing.txt"), 1,
                          "has no file 'nothing.txt'")
    assert_one_line_error(run_tool("tpu-dump", "show", str(hostile), "--file", "passwd", "--json"), 2,
                          "cannot be combined with --json")


def test_show_flags_files_changed_after_writing(planted, tmp_path):
    with tarfile.open(planted["path"], "r:gz") as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar if m.isfile()]
    changed = []
    for info, data in members:
        if info.name.endswith("software/packages.txt"):
            data = data + b"injected==1.0\n"
            info.size = len(data)
        changed.append((info, data))
    path = tmp_path / "changed.tar.gz"
    path.write_bytes(tar_gz(changed))
    document = json.loads(run_tool("tpu-dump", "show", "--json", str(path)).stdout)
    assert {"kind": "integrity", "message": "software/packages.txt: its sha256 does not match the manifest "
            "(changed after it was written)"} in document["warnings"]


def test_bundle_members_are_readable_by_plain_tar(planted, tmp_path):
    result = subprocess.run(["tar", "-xzf", str(planted["path"]), "-C", str(tmp_path)], capture_output=True)
    assert result.returncode == 0, result.stderr
    (folder,) = tmp_path.iterdir()
    assert (folder / "manifest.json").exists()
    assert (folder / "system/cpu.json").exists()


# --- on a terminal --------------------------------------------------------------------------------------

def _tmux(server: str, *args: str) -> str:
    return subprocess.run([*tmux_command(server), *args], capture_output=True, text=True, timeout=10).stdout


@pytest.mark.parametrize("size", [(80, 24), (132, 40)])
def test_progress_line_on_a_terminal_then_a_clean_report(tmp_path, size):
    require_program("tmux")
    root = _hanging_host(tmp_path / "root")
    session = "tpu-dump-test"
    server = unique_name("tpu-dump")
    command = " ".join([f"TPU_TOOLS_SYSROOT={shlex.quote(str(root))}", *map(shlex.quote, tool_command("tpu-dump")),
                        "--timeout", "3", "--skip", "accelerators.runtime", "-o", shlex.quote(str(tmp_path / "b.tgz")),
                        "; echo exit=$?; sleep 30"])
    _tmux(server, "new-session", "-d", "-s", session, "-x", str(size[0]), "-y", str(size[1]), command)
    try:
        during = after = ""
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            screen = _tmux(server, "capture-pane", "-p", "-t", session)
            if "collecting:" in screen:
                during = screen
            if "exit=" in screen:
                after = screen
                break
            time.sleep(0.1)
    finally:
        kill_tmux_server(server)
    assert "waiting for system.memory" in during
    assert all(len(line) <= size[0] for line in during.splitlines())
    assert "exit=0" in after
    assert "collecting:" not in after  # the progress line is gone
    assert after.lstrip().replace("\n", "").startswith(f"wrote {tmp_path / 'b.tgz'} (")  # a long path wraps
    assert "system.memory" in after
    assert "TIMED OUT" in after
