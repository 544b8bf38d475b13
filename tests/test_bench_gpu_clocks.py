"""tpu-bench's reading of the benchmark's NVIDIA GPU beside each case: the real nvidia-ml-py on the fake
libnvidia-ml.so.1 (tests/fake_nvml), and what the reading does to the case's noise verdict."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from fakenvml import nvml_env

from tpu_tools.bench.gpu_clocks import nvml_index
from tpu_tools.bench.interference import noise_reasons

READ = ("import json, sys\nfrom tpu_tools.bench.gpu_clocks import GpuClocks\n"
        "print(json.dumps(GpuClocks(int(sys.argv[1])).read()))\n")


def read_gpu(library, ordinal: int, **switches: str) -> dict | None:
    result = subprocess.run([sys.executable, "-c", READ, str(ordinal)], capture_output=True, text=True,
                            env=nvml_env(library, **switches), timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_the_busy_gpu_reads_its_clocks_heat_power_and_the_power_cap(fake_nvml_dir):
    busy = read_gpu(fake_nvml_dir, 0)
    assert busy == {"index": 0, "name": "NVIDIA H100 80GB HBM3", "sm_clock_mhz": 1965, "sm_clock_max_mhz": 1980,
                    "temperature_celsius": 57, "power_draw_watts": pytest.approx(471.191),
                    "power_limit_watts": 700, "clock_event_reasons": ["sw_power_cap"]}
    idle = read_gpu(fake_nvml_dir, 1)
    assert idle is not None
    assert idle["clock_event_reasons"] == []  # gpu_idle is no slowdown


def test_a_hot_gpu_and_the_gpu_cuda_shows_under_cuda_visible_devices(fake_nvml_dir):
    hot = read_gpu(fake_nvml_dir, 0, CUDA_VISIBLE_DEVICES="1", FAKE_NVML_SICK="1")
    assert hot is not None
    assert hot["index"] == 1
    assert hot["temperature_celsius"] == 92
    assert hot["clock_event_reasons"] == ["hw_thermal_slowdown"]
    assert read_gpu(fake_nvml_dir, 1, CUDA_VISIBLE_DEVICES="0") is None  # CUDA sees one GPU: no ordinal 1


def test_no_reading_where_nvml_cannot_answer(fake_nvml_dir):
    assert read_gpu(fake_nvml_dir, 0, FAKE_NVML_INIT="9") is None  # the driver is not loaded
    assert read_gpu(fake_nvml_dir, 0, FAKE_NVML_LOST="0") is None  # the GPU fell off the bus


@pytest.mark.parametrize(("visible", "ordinal", "index"), [
    (None, 0, 0), ("", 2, 2), ("2,3", 1, 3), (" 5 , 1 ", 0, 5), ("2", 1, None),
    ("GPU-8f6e3b2a-1c", 0, "GPU-8f6e3b2a-1c"), ("GPU-a,GPU-b", 1, "GPU-b")])
def test_the_cuda_ordinal_maps_to_nvml_through_cuda_visible_devices(visible, ordinal, index):
    assert nvml_index(ordinal, visible) == index


def _values(spread: float, reasons: list[str]) -> dict:
    return {"repeat_spread_percent": spread, "repeats": 3,
            "interference": {"gpu": {"sm_clock_mhz": 1410, "sm_clock_max_mhz": 1980, "temperature_celsius": 71,
                                     "power_draw_watts": 698, "power_limit_watts": 700,
                                     "clock_event_reasons": reasons}}}


def test_the_power_cap_of_a_busy_gpu_explains_a_noisy_case_but_does_not_make_one():
    assert noise_reasons(_values(1.0, ["sw_power_cap"]), "gpu") == []
    moved = noise_reasons(_values(8.8, ["sw_power_cap"]), "gpu")
    assert moved == ["its 3 repeats differ by 8.8% (min to max of their medians)",
                     "the GPU's clocks were held back at the end of the case (sw_power_cap): SM clock 1410 of "
                     "1980 MHz, 71 C, 698 of 700 W"]


def test_heat_or_a_power_brake_make_a_case_noisy_on_their_own():
    (reason,) = noise_reasons(_values(1.0, ["sw_thermal_slowdown"]), "gpu")
    assert reason.startswith("the GPU's clocks were held back at the end of the case (sw_thermal_slowdown)")
    assert noise_reasons(_values(1.0, ["hw_power_brake_slowdown"]), "gpu")
    assert noise_reasons(_values(1.0, []), "gpu") == []
