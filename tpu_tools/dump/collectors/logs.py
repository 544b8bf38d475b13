"""Log collectors: libtpu's logs, kernel messages about accelerator drivers, and --add paths.

Logs are taken from their end (the newest lines matter) up to a cap per file,
and marked so that --max-size may shorten them further. Walking a folder never
leaves it (see `tree`).
"""

from __future__ import annotations

import errno
import os
import re

from tpu_tools.dump.collector import TRIM_TAIL, CollectContext, Skipped
from tpu_tools.dump.sysfiles import describe_os_error, under_root
from tpu_tools.dump.tree import read_capped, walk_tree

LIBTPU_LOG_DIR = "/tmp/tpu_logs"
LOG_TAIL_BYTES = 2 << 20
LIBTPU_NEWEST_FILES = 8
ADD_CAP_BYTES = 32 << 20
_KMSG_LIMIT_BYTES = 8 << 20
# Kernel messages worth keeping: accelerator drivers, IOMMU and PCIe errors, memory pressure, hangs.
_KERNEL_PATTERN = re.compile(
    r"(?i)\b(vfio\w*|accel\d*|nvidia\w*|NVRM|Xid|amdgpu|kfd|gasket|apex|tpu\w*|iommu|DMAR|AER|pcieport"
    r"|1ae0|10de|oom[-_ ]kill\w*|out of memory|hung_task\w*|blocked for more than|machine check|mce|EDAC)\b")


def _tail_file(ctx: CollectContext, member: str, real: str, limit: int) -> int:
    data, size = read_capped(real, limit, keep="tail")
    ctx.add_bytes(member, data, trim=TRIM_TAIL, source=real, source_size_bytes=size if len(data) < size else None)
    return len(data)


def collect_libtpu_logs(ctx: CollectContext) -> None:
    folder = under_root(LIBTPU_LOG_DIR, ctx.root)
    if not folder.is_dir():
        raise Skipped(f"no libtpu log folder at {LIBTPU_LOG_DIR}")
    walk = walk_tree(folder, ctx.redactor)
    newest = sorted(walk.files, key=lambda f: f.mtime, reverse=True)[:LIBTPU_NEWEST_FILES]
    taken = []
    for item in newest:
        try:
            _tail_file(ctx, f"logs/libtpu/{item.relative}", item.real, LOG_TAIL_BYTES)
            taken.append(item.relative)
        except OSError as error:
            walk.skip(item.relative, describe_os_error(error))
    index = walk.to_dict()
    index["root"] = LIBTPU_LOG_DIR
    index["collected"] = taken
    ctx.add_json("logs/libtpu/index.json", index)
    for skipped in walk.skipped:
        ctx.note(f"{LIBTPU_LOG_DIR}/{skipped['path']}: {skipped['reason']}")
    if len(walk.files) > len(newest):
        ctx.note(f"the newest {len(newest)} of {len(walk.files)} log files collected (last "
                 f"{LOG_TAIL_BYTES >> 20} MiB of each)")


def _read_kmsg(path: str) -> str:
    """Every record in the kernel ring buffer, without blocking at its end."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    records, total = [], 0
    try:
        while total < _KMSG_LIMIT_BYTES:
            try:
                chunk = os.read(fd, 1 << 16)
            except BlockingIOError:
                break  # the end of the buffer
            except OSError as error:
                if error.errno == errno.EPIPE:
                    continue  # a record was overwritten while we read: go on with the next
                raise
            if not chunk:
                break
            records.append(chunk)
            total += len(chunk)
    finally:
        os.close(fd)
    return b"".join(records).decode("utf-8", "replace")


def _kmsg_lines(text: str) -> list[str]:
    """`prio,seq,usec,flags;message` records as `[seconds] message` lines."""
    lines = []
    for record in text.splitlines():
        if record.startswith(" "):
            continue  # continuation lines carry device properties
        header, found, message = record.partition(";")
        fields = header.split(",")
        if found and len(fields) >= 3 and fields[2].isdigit():
            lines.append(f"[{int(fields[2]) / 1e6:12.6f}] {message}")
        else:
            lines.append(record)
    return lines


def collect_kernel_log(ctx: CollectContext) -> None:
    attempts = []
    lines = None
    source = None
    for candidate in ("/dev/kmsg", "/var/log/kern.log", "/var/log/dmesg"):
        path = str(under_root(candidate, ctx.root))
        try:
            if candidate == "/dev/kmsg":
                lines = _kmsg_lines(_read_kmsg(path))
            else:
                data, _ = read_capped(path, _KMSG_LIMIT_BYTES, keep="tail")
                lines = data.decode("utf-8", "replace").splitlines()
            source = candidate
            break
        except OSError as error:
            attempts.append(f"{candidate}: {describe_os_error(error)}")
    if lines is None:
        raise Skipped("kernel messages are not readable (" + "; ".join(attempts)
                      + "); run as root or set kernel.dmesg_restrict=0")
    matching = [line for line in lines if _KERNEL_PATTERN.search(line)]
    header = (f"# kernel messages about accelerator drivers, IOMMU, PCIe, memory and hangs from {source}: "
              f"{len(matching)} of {len(lines)} lines\n")
    ctx.add_text("logs/kernel.txt", header + "".join(line + "\n" for line in matching), trim=TRIM_TAIL,
                 source=source)


def _member_prefix(index: int, path: str) -> str:
    name = os.path.basename(os.path.normpath(path)) or "root"
    return f"logs/added/{index}-{name}"


def collect_added(ctx: CollectContext) -> None:
    if not ctx.options.add_paths:
        raise Skipped("no --add paths given")
    indexes = []
    for index, given in enumerate(ctx.options.add_paths, start=1):
        walk = walk_tree(given, ctx.redactor)
        prefix = _member_prefix(index, given)
        budget = ADD_CAP_BYTES
        taken = []
        single = os.path.isfile(os.path.realpath(given))
        for item in walk.files:
            if budget <= 0:
                walk.skip(item.relative, f"over the {ADD_CAP_BYTES >> 20} MiB cap for one --add path")
                continue
            member = prefix if single else f"{prefix}/{item.relative}"
            try:
                budget -= _tail_file(ctx, member, item.real, budget)
                taken.append(item.relative)
            except OSError as error:
                walk.skip(item.relative, describe_os_error(error))
        entry = walk.to_dict()
        entry.update(member=prefix, collected=taken)
        indexes.append(entry)
        for skipped in walk.skipped:
            ctx.note(f"--add {given}: {skipped['path'] or given}: {skipped['reason']}")
    ctx.add_json("logs/added/index.json", {"paths": indexes, "cap_bytes_per_path": ADD_CAP_BYTES})
