"""`tpu-ls --query` (CSV rows of chosen fields) and `tpu-ls --free` (chips no process holds, and the environment
that pins a new job to them), on the real CPU runtime and on fixture hosts whose chips are partly held."""

from __future__ import annotations

import csv
import io
import json
import subprocess

import pytest
import sysroot
from conftest import assert_one_line_error, clean_env, run_tool, tool_command
from fakenvml import nvml_env

from tpu_tools.pjrt.placement import tpu_block


def test_query_prints_a_header_and_one_csv_row_per_runtime_device():
    result = run_tool("tpu-ls", "--query", "index,platform,device_id,name,holder_count", "--host-devices", "3")
    assert result.returncode == 0, result.stderr
    table = list(csv.reader(io.StringIO(result.stdout)))
    assert table[0] == ["index", "platform", "device_id", "name", "holder_count"]
    assert [row[:3] for row in table[1:]] == [["0", "cpu", "0"], ["1", "cpu", "1"], ["2", "cpu", "2"]]
    assert all(row[4] == "0" for row in table[1:])


def test_query_json_is_a_list_of_objects_with_the_fields_asked_for():
    result = run_tool("tpu-ls", "--query", "index,memory_used_bytes", "--json", "--host-devices", "2")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [{"index": 0, "memory_used_bytes": None},
                                         {"index": 1, "memory_used_bytes": None}]


def test_query_of_a_fixture_host_lists_its_chips_with_their_holders(tmp_path):
    sysroot.v5e_host(tmp_path, holders={3001: [1], 3002: [1, 2]})
    result = run_tool("tpu-ls", "--no-runtime", "--format", "csv", "--query",
                      "chip_index,name,pci_address,memory_total_bytes,memory_free_bytes,holder_pids",
                      env=clean_env(TPU_TOOLS_SYSROOT=str(tmp_path)))
    assert result.returncode == 0, result.stderr
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert [row["chip_index"] for row in rows] == [str(i) for i in range(8)]
    assert {row["name"] for row in rows} == {"TPU v5e"}
    assert rows[1]["holder_pids"] == "3001;3002"
    assert rows[2]["holder_pids"] == "3002"
    assert rows[0]["holder_pids"] == ""
    assert rows[0]["memory_total_bytes"] == str(16 << 30)
    assert rows[0]["memory_free_bytes"] == ""
    assert rows[3]["pci_address"] == "0000:00:07.0"


def test_format_csv_alone_prints_the_default_fields():
    result = run_tool("tpu-ls", "--format", "csv")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0].startswith("index,platform,name,")
    assert len(result.stdout.splitlines()) == 2


def test_help_query_lists_every_field_the_query_takes():
    from tpu_tools.render.query_view import FIELDS

    result = run_tool("tpu-ls", "--help-query")
    assert result.returncode == 0, result.stderr
    assert [line.split()[0] for line in result.stdout.splitlines()] == list(FIELDS)


@pytest.mark.parametrize("query", ["index,bogus", ",", ""])
def test_a_bad_query_is_a_usage_error(query):
    result = run_tool("tpu-ls", "--query", query, "--no-runtime")
    assert_one_line_error(result, 2, "--query")


def test_a_holder_command_with_a_comma_and_escapes_stays_one_printable_cell(tmp_path):
    host = sysroot.v4_host(tmp_path)
    host.process(sysroot.FakeProcess(4242, 1000, ["python", "a,b\x1b[31m\nc"], ["/dev/accel0"]))
    result = run_tool("tpu-ls", "--no-runtime", "--query", "chip_index,holder_commands",
                      env=clean_env(TPU_TOOLS_SYSROOT=str(tmp_path)))
    assert result.returncode == 0, result.stderr
    assert "\x1b" not in result.stdout
    rows = list(csv.reader(io.StringIO(result.stdout)))
    assert len(rows) == 5
    assert rows[1][0] == "0"
    assert rows[1][1].startswith("python a,b")


# --- --free --------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("count", "free", "chosen", "bounds"), [
    (8, range(8), list(range(8)), (2, 4, 1)),
    (8, [0, 1, 2, 3, 5, 6, 7], [0, 1, 2, 3], (2, 2, 1)),
    (8, [2, 3, 4, 6, 7], [2, 3], (2, 1, 1)),
    (8, [1, 2, 4, 7], [1], (1, 1, 1)),
    (4, [2, 3], [2, 3], (2, 1, 1)),
    (4, [1, 2, 3], [2, 3], (2, 1, 1)),
    (4, [0, 1, 2, 3], [0, 1, 2, 3], (2, 2, 1)),
    (4, [], None, None),
])
def test_the_largest_block_of_free_tpu_chips_the_runtime_accepts(count, free, chosen, bounds):
    block = tpu_block(free, count)
    assert (block == (chosen, bounds)) if chosen is not None else block is None


def test_free_on_a_partly_held_v5e_host_names_the_held_chips_and_pins_the_free_half(tmp_path):
    sysroot.v5e_host(tmp_path, holders={3001: [0, 1], 3002: [3]})
    env = clean_env(TPU_TOOLS_SYSROOT=str(tmp_path))
    result = run_tool("tpu-ls", "--free", env=env)
    assert result.returncode == 0, result.stderr
    assert "tpu: 8 chips, 3 held, free: 2,4,5,6,7" in result.stdout
    assert "chip 3 held by 3002 python3 train.py" in result.stdout
    assert "TPU_VISIBLE_CHIPS=4,5,6,7" in result.stdout
    document = json.loads(run_tool("tpu-ls", "--free", "--json", env=env).stdout)
    assert document["schema"] == "tpu-tools/ls-free/v1"
    (tpu,) = document["platforms"]
    assert tpu["free"] == [2, 4, 5, 6, 7]
    assert tpu["chosen"] == [4, 5, 6, 7]
    assert [h["chip_index"] for h in tpu["held"]] == [0, 1, 3]
    assert tpu["held"][0]["holders"][0]["pid"] == 3001
    assert tpu["environment"] == {"TPU_VISIBLE_CHIPS": "4,5,6,7", "TPU_CHIPS_PER_PROCESS_BOUNDS": "2,2,1",
                                  "TPU_PROCESS_BOUNDS": "1,1,1"}


def test_export_lines_pin_a_shell_job_and_env_lines_pin_an_env_job(tmp_path):
    sysroot.v4_host(tmp_path, holders={2001: [0]})
    env = clean_env(TPU_TOOLS_SYSROOT=str(tmp_path))
    program = " ".join(tool_command("tpu-ls"))
    show = ("python3 -c 'import os; "
            "print(os.environ[\"TPU_VISIBLE_CHIPS\"], os.environ[\"TPU_CHIPS_PER_PROCESS_BOUNDS\"])'")
    shell = subprocess.run(["bash", "-c", f'eval "$({program} --export)" && {show}'], capture_output=True, text=True,
                           env=env, timeout=120)
    assert shell.returncode == 0, shell.stderr
    assert shell.stdout.split() == ["2,3", "2,1,1"]
    plain = subprocess.run(["bash", "-c", f"env $({program} --env) {show}"], capture_output=True, text=True, env=env,
                           timeout=120)
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.split() == ["2,3", "2,1,1"]


def test_free_on_a_gpu_host_gives_cuda_visible_devices_in_pci_order(tmp_path):
    sysroot.nvidia_host(tmp_path, holders={4001: [0]}, count=3)  # /dev/nvidia0 is the last GPU in PCI order
    result = run_tool("tpu-ls", "--env", env=clean_env(TPU_TOOLS_SYSROOT=str(tmp_path), TPU_TOOLS_NVML="0"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["CUDA_DEVICE_ORDER=PCI_BUS_ID", "CUDA_VISIBLE_DEVICES=0,1"]


def test_a_fully_held_host_has_no_environment_and_export_fails_in_one_sentence(tmp_path):
    sysroot.v4_host(tmp_path, holders={2001: [0, 1], 2002: [2, 3]})
    env = clean_env(TPU_TOOLS_SYSROOT=str(tmp_path))
    result = run_tool("tpu-ls", "--export", env=env)
    assert_one_line_error(result, 1, "no free chip", "every tpu chip is held")
    assert result.stdout == ""
    document = json.loads(run_tool("tpu-ls", "--free", "--json", env=env).stdout)
    assert document["platforms"][0]["free"] == []
    assert document["platforms"][0]["environment"] == {}


def test_free_never_starts_a_runtime(tmp_path):
    sysroot.v4_host(tmp_path, holders={2001: [0]})
    # No TPU runtime is installed here: opening one would fail.
    result = run_tool("tpu-ls", "--free", "--platform", "tpu", env=clean_env(TPU_TOOLS_SYSROOT=str(tmp_path)))
    assert result.returncode == 0, result.stderr
    assert "TPU_VISIBLE_CHIPS=2,3" in result.stdout


def test_free_with_query_is_a_usage_error():
    assert_one_line_error(run_tool("tpu-ls", "--free", "--query", "index"), 2, "--free")
    assert_one_line_error(run_tool("tpu-ls", "--export", "--probe"), 2, "never opens a device")


def test_a_gpu_process_only_the_driver_lists_holds_its_gpu(fake_nvml_dir, tmp_path):
    # Process 4574 has a context on GPU 0 and lives in another PID namespace: /proc does not show it.
    sysroot.nvidia_host(tmp_path)
    env = nvml_env(fake_nvml_dir, tmp_path, FAKE_NVML_PROCS="0:4574:12190000000")
    result = run_tool("tpu-ls", "--env", env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["CUDA_DEVICE_ORDER=PCI_BUS_ID", "CUDA_VISIBLE_DEVICES=1"]
    query = run_tool("tpu-ls", "--query", "index,name,holder_pids,memory_total_bytes,utilization_percent", env=env)
    assert query.returncode == 0, query.stderr
    rows = list(csv.DictReader(io.StringIO(query.stdout)))
    assert [row["holder_pids"] for row in rows] == ["4574", ""]
    assert rows[0]["name"] == "NVIDIA H100 80GB HBM3"
    assert int(rows[0]["memory_total_bytes"]) > 0
    assert rows[0]["utilization_percent"] != ""  # the driver's figure, not PJRT's
