"""tpu-dump's findings from a bundle's accelerator files, decoded into records: a GPU entry or a file of the
wrong shape costs only itself (a note), never the summary."""

from __future__ import annotations

import json
from pathlib import Path

from dump_fixtures import file_member, tar_gz

from tpu_tools.dump.findings import summarize
from tpu_tools.dump.reader import Bundle

TOP = "tpu-dump-host"


def _bundle(tmp_path: Path, files: dict[str, object]) -> Bundle:
    manifest = {"schema": "tpu-tools/dump/v1", "files": [], "collectors": []}
    members = [file_member(f"{TOP}/manifest.json", json.dumps(manifest).encode())]
    members += [file_member(f"{TOP}/{name}", json.dumps(body).encode() if not isinstance(body, bytes) else body)
                for name, body in files.items()]
    path = tmp_path / "bundle.tar.gz"
    path.write_bytes(tar_gz(members))
    return Bundle(path)


def _warnings(bundle: Bundle) -> dict[str, str]:
    return {w.kind: w.message for w in summarize(bundle).warnings}


def test_each_gpu_decodes_on_its_own_and_a_bad_one_is_left_out(tmp_path):
    lost = {"index": 0, "status": "lost", "name": "NVIDIA H100", "pci_bus_id": "0000:18:00.0"}
    hot = {"index": 1, "status": "ok", "clock_event_reasons": ["hw_thermal_slowdown"], "temperature_celsius": 92,
           "power_draw_watts": 650.5, "pcie_link_width": 4, "pcie_link_width_max": 16, "xid_errors": {"79": 2}}
    broken = {"index": "two", "status": "lost"}  # not a record: left out, the others still warn
    warnings = _warnings(_bundle(tmp_path, {"accelerators/nvml.json": {"gpus": [lost, broken, hot]}}))
    assert warnings["gpu_lost"].startswith("GPU 0 (NVIDIA H100, 0000:18:00.0) is lost")
    assert "at 92.0 C, 650.5 W" in warnings["gpu_thermal_slowdown"]
    assert "x4 of x16" in warnings["gpu_pcie_degraded"]
    assert "XID 79 x2" in warnings["gpu_xid_errors"]
    assert "two" not in json.dumps(warnings)


def test_discovery_and_runtime_files_give_holder_and_probe_findings(tmp_path):
    node = {"path": "/dev/accel0", "exists": True, "accessible": False, "mode": "0600", "uid": 0, "gid": 0,
            "holders": [{"pid": 77, "command": "python train.py", "state": "D", "alive": True}]}
    runtime = {"runtime_status": "ok", "devices": [{"id": 3, "device_kind": "TPU v4",
                                                    "probe": {"ok": False, "error": "matmul differs"}}]}
    warnings = _warnings(_bundle(tmp_path, {"accelerators/discovery.json": {"chips": [{"device_nodes": [node]}]},
                                            "accelerators/runtime.json": runtime}))
    assert warnings["stuck_holder"].startswith("/dev/accel0 is held by process 77 (python)")
    assert "/dev/accel0 (mode 0600, uid 0, gid 0) cannot be opened" in warnings["no_access"]
    assert warnings["probe_failed"] == "device 3 (TPU v4) failed the probe: matmul differs"


def test_a_file_of_the_wrong_shape_is_a_note(tmp_path):
    bundle = _bundle(tmp_path, {"accelerators/discovery.json": {"chips": "not a list"},
                                "accelerators/runtime.json": b"{not json",
                                "accelerators/nvml.json": {"gpus": {"0": {}}}})
    summary = summarize(bundle)
    assert not [w for w in summary.warnings if w.kind.startswith(("gpu_", "stuck_", "dead_", "probe_"))]
    notes = " ".join(summary.notes)
    for check in ("holder_warnings", "runtime_warnings", "gpu_warnings"):
        assert f"could not be summarised ({check}:" in notes, notes
