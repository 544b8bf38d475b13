"""Fixture hosts and archives for the tpu-dump tests.

`system_files` adds what the system collectors read (os-release, /proc files,
cgroup v2 limits, kernel log) to a fixture root built by `sysroot`; the
`SECRETS` are planted in the environment, logs, URLs and files, and must
appear nowhere in a redacted bundle.
"""

from __future__ import annotations

import gzip
import io
import os
import tarfile
from pathlib import Path

SECRETS = {
    "env_token": "tok-9f8e7d6c5b4a39281706",
    "url_password": "hunter2-Corr3ct-H0rse",
    "bearer": "eyBearerTokenValue0123456789abcdef",
    "log_password": "p4ss-in-the-log-file-77",
    "random": "Zq8Xv2Lm9Pw4Rt7Ks1Hd6Fj3Bn5Gc0Ya",
    "key_body": "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQDb",
    "credentials_file": "service-account-private-value-31337",
}

PRIVATE_KEY = f"-----BEGIN PRIVATE KEY-----\n{SECRETS['key_body']}\n-----END PRIVATE KEY-----\n"

CPUINFO = "".join(
    f"processor\t: {i}\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz\n"
    f"physical id\t: {i // 4}\ncore id\t\t: {i % 4}\nflags\t\t: fpu avx2 avx512f amx_tile\n\n" for i in range(8))

MEMINFO = ("MemTotal:       16384000 kB\nMemFree:         8192000 kB\nMemAvailable:   12288000 kB\n"
           "Cached:          1024000 kB\nSwapTotal:             0 kB\nSwapFree:              0 kB\n"
           "HugePages_Total:       0\nHugepagesize:       2048 kB\n")


def write(root: Path, path: str, text: str) -> Path:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    return target


def system_files(root: Path) -> None:
    write(root, "/etc/os-release", 'NAME="Ubuntu"\nVERSION_ID="22.04"\nPRETTY_NAME="Ubuntu 22.04.4 LTS"\n')
    write(root, "/proc/version", "Linux version 6.1.0-test (builder@fixture)\n")
    write(root, "/proc/uptime", "12345.67 45678.90\n")
    write(root, "/proc/loadavg", "1.50 0.75 0.25 3/412 9999\n")
    write(root, "/proc/cpuinfo", CPUINFO)
    write(root, "/proc/meminfo", MEMINFO)
    write(root, "/proc/mounts", "/dev/sda1 / ext4 rw,relatime 0 0\nproc /proc proc rw 0 0\n"
                                "tmpfs /dev/shm tmpfs rw 0 0\n")
    write(root, "/proc/cmdline", "BOOT_IMAGE=/vmlinuz root=/dev/sda1 intel_iommu=on iommu=pt\n")
    write(root, "/proc/modules", "vfio_pci 16384 0 - Live 0x0000000000000000\n"
                                 "vfio 45056 2 vfio_pci,vfio_iommu_type1, Live 0x0000000000000000\n"
                                 "ext4 999424 1 - Live 0x0000000000000000\n")
    write(root, "/proc/self/cgroup", "0::/user.slice/job.scope\n")
    cgroup = root / "sys/fs/cgroup"
    write(root, "/sys/fs/cgroup/cgroup.controllers", "cpu memory pids\n")
    for name, value in (("memory.max", "8589934592"), ("memory.current", "123456"), ("cpu.max", "200000 100000"),
                        ("pids.max", "max"), ("memory.events", "low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\n")):
        write(cgroup / "user.slice/job.scope", name, value + "\n")
    write(root, "/dev/kmsg", "6,100,1000000,-;vfio-pci 0000:00:04.0: enabling device\n"
                             "6,101,2000000,-;eth0: link up\n"
                             "3,102,3000000,-;vfio-pci 0000:00:05.0: AER: error recovery failed\n")


def plant_logs(root: Path) -> Path:
    """libtpu logs with secrets inside, a link that leaves the folder, and an unreadable entry."""
    logs = root / "tmp/tpu_logs"
    logs.mkdir(parents=True, exist_ok=True)
    (logs / "tpu_driver.vm.root.log.INFO.20250101-120000.1").write_text(
        "I0101 12:00:00 tpu_driver started\n"
        f"I0101 12:00:01 connecting to https://admin:{SECRETS['url_password']}@metadata.internal/v1\n"
        f"I0101 12:00:02 header Authorization: Bearer {SECRETS['bearer']}\n"
        f"I0101 12:00:03 db password={SECRETS['log_password']}\n"
        f"I0101 12:00:04 opaque blob {SECRETS['random']}\n"
        "E0101 12:00:05 TPU initialization failed: DEADLINE_EXCEEDED\n")
    os.symlink("tpu_driver.vm.root.log.INFO.20250101-120000.1", logs / "tpu_driver.INFO")
    outside = root / "outside-secret.txt"
    outside.write_text(f"outside the log folder: {SECRETS['log_password']}\n")
    os.symlink(str(outside), logs / "leak.log")
    os.symlink("rotated-away.log", logs / "dangling.log")  # inside, but gone
    return logs


def tar_gz(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb") as compressed:
        with tarfile.open(fileobj=compressed, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for info, data in members:
                tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buffer.getvalue()


def file_member(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def special_member(name: str, kind: bytes, link: str = "") -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    return info, None
