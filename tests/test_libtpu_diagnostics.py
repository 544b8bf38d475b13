"""libtpu's stall and crash files in support bundles: found where libtpu's flags and variables put them,
size-capped and listed in the manifest, decoded by libtpu's own SDK (0.0.51) in a child per file, named by
`tpu-dump show`; a decoder that crashes or hangs costs only that file's decode."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import libtpu_sdk
from conftest import clean_env, run_tool
from libtpu_server import v5e_host, v6e_host

from tpu_tools.dump.collectors.diagnostics import folders_from

TESTS = Path(__file__).resolve().parent
FAKE_LIBTPU = TESTS / "fake_libtpu"


def varint(value: int) -> bytes:
    out = b""
    while True:
        low, value = value & 0x7F, value >> 7
        out += bytes([low | (0x80 if value else 0)])
        if not value:
            return out


def stall_summary(cores: dict[int, object]) -> bytes:
    """An AllCoreStateSummaries as libtpu writes it: field 1, a map of core id to the runtime's CoreState
    (libtpu's decoder reads it back with every field: tests below)."""
    out = b""
    for key, core in cores.items():
        body = core.SerializeToString()
        entry = b"\x08" + varint(key) + b"\x12" + varint(len(body)) + body
        out += b"\x0a" + varint(len(entry)) + entry
    return out


def _plant(root: Path) -> None:
    (root / "dumps").mkdir(parents=True)
    (root / "artifacts").mkdir()
    (root / "tmp").mkdir()
    running, failed = v6e_host().status.core_states, v5e_host().status.core_states
    (root / "artifacts" / "tpu_stall_summary_host0_1.pb").write_bytes(stall_summary({0: running[0], 5: failed[5]}))
    (root / "dumps" / "tpu_core_dump_host0_1.bin").write_bytes(b"not a riegeli file" * 4)
    (root / "tmp" / "tpu_compiler_metadata_host0_1.pb").write_bytes(b"")
    (root / "tmp" / "unrelated.pb").write_bytes(b"x")


def _dump(tmp_path: Path, root: Path, pythonpath: Path, *extra: str, **env: str) -> tuple[Path, dict]:
    output = tmp_path / "bundle.tar.gz"
    result = run_tool("tpu-dump", "--only", "logs.libtpu_diagnostics", "-o", str(output), *extra, env=clean_env(
        TPU_TOOLS_SYSROOT=str(root), PYTHONPATH=str(pythonpath), TPU_CORE_DUMP_DIRECTORY="/dumps",
        LIBTPU_INIT_ARGS="--xla_tpu_impure_diagnostic_artifacts_dir=/artifacts --foo=1", **env), timeout=180)
    assert result.returncode == 0, result.stderr
    shown = run_tool("tpu-dump", "show", "--json", str(output))
    assert shown.returncode == 0, shown.stderr
    return output, json.loads(shown.stdout)


def _members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as bundle:
        return {m.name.split("/", 1)[1]: bundle.extractfile(m).read() for m in bundle.getmembers() if m.isfile()}


def test_the_folders_come_from_libtpus_flags_and_variables():
    flags = "--xla_tpu_impure_diagnostic_artifacts_dir=/a --tpu_core_dump_directory=/b --other=/c"
    assert folders_from({"LIBTPU_INIT_ARGS": flags, "TPU_LOG_DIR": "/logs", "TPU_CORE_DUMP_DIRECTORY": "/d"}) == [
        "/d", "/logs", "/a", "/b"]
    assert folders_from({"LIBTPU_INIT_ARGS": "'unclosed"}) == []


def test_stall_and_crash_files_are_collected_and_decoded_by_libtpus_sdk(tmp_path):
    libtpu_sdk.require()
    root = tmp_path / "root"
    _plant(root)
    output, shown = _dump(tmp_path, root, libtpu_sdk.LIBTPU_DIR)
    members = _members(output)
    index = json.loads(members["libtpu/diagnostics/index.json"])
    assert index["decoder"] == "libtpu.sdk.diagnostics"
    files = {Path(f["path"]).name: f for f in index["files"]}
    assert set(files) == {"tpu_stall_summary_host0_1.pb", "tpu_core_dump_host0_1.bin",
                          "tpu_compiler_metadata_host0_1.pb"}
    assert files["tpu_stall_summary_host0_1.pb"]["path"] == "/artifacts/tpu_stall_summary_host0_1.pb"
    manifest = {f["name"] for f in json.loads(members["manifest.json"])["files"]}
    assert {f["copied"] for f in files.values()} <= manifest
    decoded = json.loads(members["libtpu/diagnostics/decoded/tpu_stall_summary_host0_1.pb.json"])["decoded"]
    assert decoded["core_states"]["5"]["error_message"].startswith("program 0x3fa29c01 aborted")
    assert "Riegeli" in files["tpu_core_dump_host0_1.bin"]["error"]  # libtpu's decoder refused it: reported
    warnings = {w["kind"]: w["message"] for w in shown["warnings"]}
    assert warnings["libtpu_stall"] == (
        "libtpu stall summary tpu_stall_summary_host0_1.pb: core 0 (chip 0) program 19 run 88 at fusion.142 "
        "(train.py:211); core 5 (chip 5) program 7 run 1200 error: program 0x3fa29c01 aborted: TensorCore halted "
        "on an HBM out-of-memory condition")
    assert warnings["libtpu_core_dump"].startswith("libtpu core dump tpu_core_dump_host0_1.bin: the decoder failed")
    assert warnings["libtpu_program"].startswith("libtpu compiler metadata tpu_compiler_metadata_host0_1.pb: module")


def test_a_decoder_that_crashes_or_hangs_costs_only_that_files_decode(tmp_path):
    root = tmp_path / "root"
    _plant(root)
    output, shown = _dump(tmp_path, root, FAKE_LIBTPU, "--timeout", "6",
                          FAKE_TPU_DIAGNOSTICS="stall_summary=abort,core_dump=hang")
    index = json.loads(_members(output)["libtpu/diagnostics/index.json"])
    files = {f["kind"]: f for f in index["files"]}
    assert files["stall_summary"]["error"] == "the decoder failed (signal 6)"
    assert files["core_dump"]["error"].startswith("the decoder did not finish in")
    assert all(f["copied"] for f in files.values())  # every file is in the bundle, decoded or not
    assert any(w["kind"] == "libtpu_file" and "signal 6" in w["message"] for w in shown["warnings"])


def test_without_libtpu_the_files_are_copied_and_said_not_decoded(tmp_path):
    root = tmp_path / "root"
    _plant(root)
    output, shown = _dump(tmp_path, root, tmp_path / "nothing")
    index = json.loads(_members(output)["libtpu/diagnostics/index.json"])
    assert index["decoder"] is None
    assert all(f["copied"] and f["decoded"] is None for f in index["files"])
    (collector,) = [c for c in json.loads(_members(output)["manifest.json"])["collectors"]
                    if c["name"] == "logs.libtpu_diagnostics"]
    assert any("copied, not decoded" in note for note in collector["notes"]), collector
    assert [w["message"] for w in shown["warnings"] if w["kind"] == "libtpu_core_dump"] == [
        "libtpu core dump tpu_core_dump_host0_1.bin: not decoded"]
