"""`tpu-profile cache verify`: load every entry as JAX would, in a child process with a deadline per entry.

An entry is trusted code for XLA's deserialiser: a corrupt or hostile one may
crash or hang whatever loads it. The child (`python -m
tpu_tools.profile.cacheverify`) reads entry names on stdin and answers one JSON
line as it starts each entry and one with the verdict. When it dies or
misses the deadline, the entry it had started is the bad one; a fresh child
goes on with the rest. Links are never handed to the child (they are not
entries). Checks, in order: a regular file of sane size, a complete
compressed stream, the 4-byte compile-time header, and deserialisation on the
local platform. A failure to deserialise counts as broken only when the
entry's key record says it was written for this platform; otherwise it may
belong to another accelerator and is kept.
"""

from __future__ import annotations

import json
import os
import select
import signal
import stat
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import msgspec

from tpu_tools.errors import first_line
from tpu_tools.profile import cachegc
from tpu_tools.profile.cachedir import TORCH_XLA, ZSTD_MAGIC, CacheScan

SCHEMA = "tpu-tools/cache-verify/v1"
DEFAULT_DEADLINE_S = 60.0
MAX_ENTRY_BYTES = 4 << 30  # beyond any executable: a larger "entry" is not read
# An entry may decompress to this many times its size (or to the floor, for small ones): executables written
# here compress 2 to 6 times; zlib cannot pass about 1,000, which its bombs reach.
MAX_EXPANSION = 256
EXPANSION_FLOOR = 64 << 20
STARTUP_S = 120.0  # importing jax and starting the backend, on a busy machine
BETWEEN_S = 30.0  # from one verdict to the child's next "start" line: no work, only scheduling
EXIT_S = 5.0  # a child that said "done" exits by itself (and writes what it has to) before it is killed
CHUNK = 1 << 20
WRITING_S = 60.0  # a truncated entry younger than this may be one jax is writing now


@dataclass
class Verdict:
    name: str
    status: str  # "ok", "broken", "skipped" (cannot be judged here), "link"
    problem: str | None = None
    compile_time_s: int | None = None
    pruned: bool = False
    prune_error: str | None = None


@dataclass
class VerifyResult:
    path: str
    platform: str | None = None
    verdicts: list[Verdict] = field(default_factory=list)
    pruning: bool = False
    truncated: bool = False
    entry_count: int = 0  # every entry of the directory; past the listing's limit they are not checked
    entries_listed: int = 0

    @property
    def broken(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.status in ("broken", "link")]

    def report(self) -> VerifyDocument:
        """The `tpu-tools/cache-verify/v1` document."""
        return VerifyDocument(
            schema=SCHEMA, path=self.path, platform=self.platform, checked=len(self.verdicts),
            ok=sum(v.status == "ok" for v in self.verdicts), broken=len(self.broken),
            skipped=sum(v.status == "skipped" for v in self.verdicts), prune=self.pruning,
            pruned=sum(v.pruned for v in self.verdicts), truncated=self.truncated, entry_count=self.entry_count,
            entries_listed=self.entries_listed, partial_figures=["ok", "broken", "skipped"] if self.truncated else [],
            entries=self.verdicts)


class VerifyDocument(msgspec.Struct, kw_only=True):
    """`tpu-profile cache verify`'s document, in its JSON key order."""

    schema: str
    path: str
    platform: str | None
    checked: int
    ok: int
    broken: int
    skipped: int
    prune: bool
    pruned: int
    truncated: bool
    entry_count: int
    entries_listed: int
    partial_figures: list[str]
    entries: list[Verdict]


# --- the parent ------------------------------------------------------------------------------------

class _Child:
    def __init__(self, folder: Path, names: list[str], platforms: dict[str, str | None], max_bytes: int):
        request = {"dir": str(folder), "names": names, "platforms": platforms, "max_bytes": max_bytes}
        self.process = subprocess.Popen([sys.executable, "-m", "tpu_tools.profile.cacheverify"],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                        start_new_session=True)
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(request).encode())
        self.process.stdin.close()
        self.out = self.process.stdout
        self.buffer = b""

    def line(self, deadline: float) -> dict[str, Any] | None:
        """The next answer, or None when the child ended or the deadline passed."""
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self.out], [], [], left)
            if not ready:
                return None
            chunk = os.read(self.out.fileno(), 65536)
            if not chunk:
                return None
            self.buffer += chunk
        raw, _, self.buffer = self.buffer.partition(b"\n")
        try:
            answer = json.loads(raw)
        except ValueError:
            return {}
        return answer if isinstance(answer, dict) else {}

    def stop(self, grace_s: float = 0.0) -> str:
        """Kill the child's whole group (after `grace_s` to exit by itself); how it ended, in words."""
        try:
            self.process.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except OSError:
                pass
        code = self.process.wait()
        self.out.close()
        return f"killed by signal {-code}" if code < 0 else f"exited with status {code}"


def verify(scan: CacheScan, deadline_s: float = DEFAULT_DEADLINE_S, prune: bool = False,
           max_bytes: int = MAX_ENTRY_BYTES) -> VerifyResult:
    """Judge every listed entry (and every link) of a scanned cache; with `prune`, remove the broken ones."""
    folder = Path(scan.path)
    result = VerifyResult(scan.path, pruning=prune, truncated=scan.truncated, entry_count=scan.entry_count,
                          entries_listed=len(scan.entries))
    for other in scan.planted_links:  # other links are not the cache's: never judged, never pruned
        result.verdicts.append(Verdict(other.name, "link", "a link in the cache (never followed)"))
    for entry in scan.entries:  # torch_xla cannot read its own entries back on the CPU platform in 2.9
        if entry.frontend == TORCH_XLA:
            result.verdicts.append(Verdict(entry.name, "skipped", "a PyTorch/XLA entry: verify loads JAX's "
                                           "entries only"))
    pending = [e.name for e in scan.entries if e.frontend != TORCH_XLA]
    platforms = {e.name: e.platform for e in scan.entries}
    while pending:
        child = _Child(folder, pending, platforms, max_bytes)
        started: str | None = None
        first = True
        judged = 0  # entries of `pending` this child has answered for, in order
        while True:
            # The deadline is the entry's alone: it runs from the child's "start" line to its verdict. Waiting
            # for that "start" line gets a generous bound, since a busy machine may leave the child unscheduled
            # for far longer than a short deadline between two lines it writes back to back.
            wait = STARTUP_S + deadline_s if first else (deadline_s if started is not None else BETWEEN_S)
            answer = child.line(time.monotonic() + wait)
            if answer is None:
                how = child.stop()
                if started is None:  # not within an entry: jax itself could not start, or the child went away
                    when = "before reading any entry" if first else "between two entries"
                    result.verdicts += [Verdict(n, "skipped", f"the verifying process {how} {when}")
                                        for n in pending[judged:]]
                    pending = []
                    break
                timed_out = how.startswith("killed by signal 9")
                problem = (f"loading it did not finish within {deadline_s:g} s" if timed_out
                           else f"loading it crashed the process ({how})")
                result.verdicts.append(Verdict(started, "broken", problem))
                pending = pending[pending.index(started) + 1:]
                break
            if "platform" in answer:
                result.platform = str(answer["platform"])
                first = False
                continue
            if "start" in answer:
                started = str(answer["start"])
                continue
            if answer.get("done"):
                child.stop(grace_s=EXIT_S)
                pending = []
                break
            name = str(answer.get("name"))
            result.verdicts.append(Verdict(name, str(answer.get("status")), answer.get("problem"),
                                           answer.get("compile_time_s")))
            judged += 1
            started = None
    if prune:
        _prune(folder, result)
    return result


def _prune(folder: Path, result: VerifyResult) -> None:
    """Remove the broken entries (and links) judged, with their companions and records; an entry modified
    moments ago is left, and each verdict says what became of it."""
    dir_fd = cachegc.open_dir(folder)
    try:
        for verdict in result.broken:
            if _maybe_being_written(dir_fd, verdict):
                verdict.prune_error = (f"modified in the last {WRITING_S:g} s: jax may still be writing it "
                                       "(it writes entries in place); run verify again later")
                continue
            verdict.prune_error = cachegc.remove_file(dir_fd, verdict.name, allow_link=verdict.status == "link")
            verdict.pruned = verdict.prune_error is None
            if verdict.pruned and verdict.status != "link":
                for extra in cachegc.companions(verdict.name):
                    cachegc.remove_file(dir_fd, extra)
                cachegc.remove_record(folder, verdict.name)
    finally:
        os.close(dir_fd)


def _maybe_being_written(dir_fd: int, verdict: Verdict) -> bool:
    """A truncated entry modified moments ago may be one jax is still writing: never pruned."""
    if verdict.status != "broken" or not (verdict.problem or "").startswith(("truncated", "too short")):
        return False
    try:
        modified = os.stat(verdict.name, dir_fd=dir_fd, follow_symlinks=False).st_mtime
    except OSError:
        return False
    return time.time() - modified < WRITING_S


# --- the child -------------------------------------------------------------------------------------

def expansion_cap(size: int, max_bytes: int) -> int:
    """The most an entry of `size` compressed bytes may decompress to: a bomb is refused, not read."""
    return min(max_bytes, max(size * MAX_EXPANSION, EXPANSION_FLOOR))


class Truncated(Exception):
    """The compressed stream ends before its end marker."""


def _pieces(handle: BinaryIO, zstd: Any) -> Iterator[bytes]:
    """The decompressed stream from the file's start, at most CHUNK bytes a piece whatever the ratio;
    `Truncated` when a zlib stream ends early."""
    handle.seek(0)
    if zstd is not None:
        reader = zstd.ZstdDecompressor().stream_reader(handle, read_size=CHUNK)
        while piece := reader.read(CHUNK):
            yield piece
        return
    stream = zlib.decompressobj()
    data = b""
    while not stream.eof:
        data = data or handle.read(CHUNK)
        if not data:
            raise Truncated
        yield stream.decompress(data, CHUNK)
        data = stream.unconsumed_tail


def _read_entry(folder: Path, name: str, max_bytes: int) -> tuple[bytes | None, str | None]:
    """The decompressed entry, or the problem with it.

    A first pass only counts what the stream expands to, a piece at a time, so that a bomb costs a piece of
    memory before it is refused; only an entry within its cap is decompressed again and kept.
    """
    try:
        fd = os.open(folder / name, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as error:
        return None, f"unreadable: {error.strerror or error}"
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            return None, "not a regular file"
        if info.st_size > max_bytes:
            return None, f"{info.st_size} bytes, more than any executable ({max_bytes} allowed)"
        zstd = None
        if handle.read(4).startswith(ZSTD_MAGIC[:4]):
            try:
                import zstandard as zstd  # type: ignore[import-not-found,no-redef,unused-ignore]
            except ImportError:
                return None, "skipped: compressed with zstd and zstandard is not installed"
        cap = expansion_cap(info.st_size, max_bytes)
        try:
            total = 0
            for piece in _pieces(handle, zstd):
                total += len(piece)
                if total > cap:
                    return None, (f"decompresses to more than {cap} bytes, over {MAX_EXPANSION} times its "
                                  f"{info.st_size} (a decompression bomb): refused, not read")
            raw = b"".join(_pieces(handle, zstd))
        except Truncated:
            return None, "truncated: the compressed stream ends early"
        except Exception as error:  # noqa: BLE001 hostile bytes: whatever the decoder raises, the entry is not valid
            return None, f"not a valid compressed entry ({first_line(error, limit=120)})"
    if len(raw) < 5:
        return None, "too short to hold a compile time and an executable"
    return raw, None


def _child_main() -> int:
    request = json.loads(sys.stdin.read())
    folder, names, platforms = Path(request["dir"]), request["names"], request["platforms"]
    max_bytes = int(request["max_bytes"])
    import jax

    backend = __import__("jax.extend.backend", fromlist=["get_backend"]).get_backend()
    devices = jax.local_devices()
    platform = str(backend.platform)

    def say(document: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(document) + "\n")
        sys.stdout.flush()

    say({"platform": platform})
    for name in names:
        say({"start": name})
        raw, problem = _read_entry(folder, name, max_bytes)
        if raw is None:
            status = "skipped" if problem and problem.startswith("skipped") else "broken"
            say({"name": name, "status": status, "problem": problem})
            continue
        compile_time = int.from_bytes(raw[:4], "big")
        written_for = platforms.get(name)
        if written_for and written_for != platform:
            say({"name": name, "status": "skipped", "problem": f"written for {written_for}, this is {platform}",
                 "compile_time_s": compile_time})
            continue
        error = None
        for chosen in (devices[:1], devices):
            try:
                backend.deserialize_executable(raw[4:], chosen, None)
                error = None
                break
            except Exception as failure:  # noqa: BLE001 a runtime refuses an executable its own ways: the verdict names it
                error = f"does not load on {platform}: {first_line(failure, limit=160)}"
        if error is None:
            say({"name": name, "status": "ok", "compile_time_s": compile_time})
        elif written_for:
            say({"name": name, "status": "broken", "problem": error, "compile_time_s": compile_time})
        else:
            say({"name": name, "status": "skipped", "problem": error + " (platform it was written for unknown: kept)",
                 "compile_time_s": compile_time})
    say({"done": True})
    return 0


if __name__ == "__main__":
    sys.exit(_child_main())
