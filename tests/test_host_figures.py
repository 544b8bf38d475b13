"""The host group's figures read from /proc in one read of each file are psutil's figures: psutil, reading the same
files (its PROCFS_PATH), is the oracle."""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpu_tools.metrics.system import HostSampler

MEMINFO = """MemTotal:       16384000 kB
MemFree:         1000000 kB
MemAvailable:    {available} kB
Buffers:          200000 kB
Cached:          3000000 kB
SwapCached:            0 kB
Active:          5000000 kB
Inactive:        4000000 kB
Shmem:             10000 kB
Slab:             300000 kB
SReclaimable:     200000 kB
{swap}HugePages_Total:       0
Hugepagesize:       2048 kB
"""


def _stat(ticks: list[int]) -> str:
    cpu = " ".join(map(str, ticks))
    return (f"cpu  {cpu}\ncpu0 {cpu}\nintr 12345 1 2 3\nctxt 99999\nbtime 1764200000\nprocesses 4242\n"
            "procs_running 2\nprocs_blocked 0\n")


def _write(root: Path, ticks: list[int], available: int = 8000000, swap: bool = True) -> None:
    (root / "stat").write_text(_stat(ticks))
    (root / "meminfo").write_text(MEMINFO.format(
        available=available, swap="SwapTotal:       2097148 kB\nSwapFree:        2000000 kB\n" if swap else ""))
    (root / "vmstat").write_text("pswpin 10\npswpout 20\n")


@pytest.fixture
def proc(tmp_path, monkeypatch):
    monkeypatch.setattr(psutil, "PROCFS_PATH", str(tmp_path))  # psutil reads the same files
    return tmp_path


def _psutil_figures() -> tuple[float, int, int, int, int, float]:
    memory, swap = psutil.virtual_memory(), psutil.swap_memory()
    return (psutil.cpu_percent(None), memory.total, memory.total - memory.available, swap.total, swap.used,
            psutil.boot_time())


def _sampled(sampler: HostSampler) -> tuple[float | None, int | None, int | None, int | None, int | None, float]:
    record = sampler.sample()
    assert record.uptime_s is not None
    boot = time.time() - record.uptime_s
    return (record.cpu_percent, record.memory_total_bytes, record.memory_used_bytes, record.swap_total_bytes,
            record.swap_used_bytes, boot)


fields = len(psutil.cpu_times()._fields)  # as many as psutil reads on this kernel


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, 10**9), min_size=fields, max_size=fields),
       st.lists(st.integers(-1000, 10**6), min_size=fields, max_size=fields),
       st.sampled_from([8000000, 20000000]), st.booleans())
def test_host_figures_are_psutils_from_one_read_of_each_file(tmp_path_factory, first, moved, available, swap):
    root = tmp_path_factory.mktemp("proc")
    saved = psutil.PROCFS_PATH
    psutil.PROCFS_PATH = str(root)
    sampler = HostSampler(proc=str(root))
    try:
        _write(root, first, available, swap)
        sampler.sample()  # its first reading, and psutil's
        psutil.cpu_percent(None)
        _write(root, [max(0, a + b) for a, b in zip(first, moved)], available, swap)  # a counter may step back
        ours, theirs = _sampled(sampler), _psutil_figures()
    finally:
        sampler.close()
        psutil.PROCFS_PATH = saved
    assert ours[:5] == theirs[:5]
    assert abs(ours[5] - theirs[5]) < 1.0  # the boot time, through the uptime taken a moment apart


def test_host_figures_come_from_psutil_where_proc_cannot_be_read(proc):
    _write(proc, [100] * fields, swap=False)
    sampler = HostSampler(proc=str(proc / "missing"))  # its files are not there: psutil's calls, on the fixture's
    record = sampler.sample()
    assert record.memory_total_bytes == 16384000 * 1024
    assert record.memory_used_bytes == (16384000 - 8000000) * 1024
    assert record.cpu_percent == 0.0


def test_the_host_files_stay_open_between_samples():
    sampler = HostSampler()
    try:
        sampler.sample()
        opened = set(os.listdir("/proc/self/fd"))
        for _ in range(3):
            record = sampler.sample()
            assert record.memory_total_bytes == psutil.virtual_memory().total
        assert set(os.listdir("/proc/self/fd")) <= opened  # nothing opened anew
    finally:
        sampler.close()
