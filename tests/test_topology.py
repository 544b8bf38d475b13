"""The text drawing of a device mesh from TPU coordinates."""

from __future__ import annotations

from tpu_tools.pjrt.devices import DeviceRecord
from tpu_tools.render.topology import draw_topology, wraps_around


def _devices(kind: str, shape: tuple[int, int, int], per_chip: int = 1) -> list[DeviceRecord]:
    devices = []
    for z in range(shape[2]):
        for y in range(shape[1]):
            for x in range(shape[0]):
                for core in range(per_chip):
                    devices.append(DeviceRecord(len(devices), len(devices), "tpu", kind, 0, "h",
                                                coords=[x, y, z], core_on_chip=core))
    return devices


def test_2d_slice_is_one_grid_without_wraparound():
    text = draw_topology(_devices("TPU v5 lite", (2, 4, 1)))
    lines = text.splitlines()
    assert lines[0] == "TPU v5 lite: 8 chips, 8 devices, 2x4"
    assert "x=0" in lines[1]
    assert "x=1" in lines[1]
    assert lines[2].startswith("y=0")
    assert "[ 0 ]---[ 1 ]" in lines[2]
    assert "y=3   [ 6 ]---[ 7 ]" in lines
    assert "~" not in text


def test_3d_torus_is_layered_and_marks_wraparound():
    text = draw_topology(_devices("TPU v4", (4, 4, 4)))
    assert text.splitlines()[0] == "TPU v4: 64 chips, 64 devices, 4x4x4"
    assert text.count("z=") == 4
    assert "(~ wraps to the other end of z)" in text
    assert "~ marks a wrap-around link along x and y" in text
    assert "y=0 ~ [ 0  ]---[ 1  ]---[ 2  ]---[ 3  ] ~" in text
    assert "y=3 ~ [ 60 ]---[ 61 ]---[ 62 ]---[ 63 ] ~" in text


def test_two_devices_per_chip_share_a_cell():
    text = draw_topology(_devices("TPU7x", (2, 2, 1), per_chip=2))
    assert "[ 0/1 ]---[ 2/3 ]" in text
    assert "4 chips, 8 devices" in text


def test_wraparound_rules():
    assert wraps_around("TPU v4", 4)
    assert not wraps_around("TPU v4", 2)
    assert not wraps_around("TPU v4", 6)
    assert wraps_around("TPU v5 lite", 16)
    assert not wraps_around("TPU v5 lite", 8)
    assert not wraps_around("cpu", 8)


def test_devices_without_coordinates_are_listed():
    text = draw_topology([DeviceRecord(0, 0, "cpu", "cpu", 0, "h"), DeviceRecord(1, 1, "cpu", "cpu", 0, "h")])
    assert text.splitlines()[0].startswith("no chip coordinates")
    assert "device 1: cpu (cpu), process 0, host h" in text
