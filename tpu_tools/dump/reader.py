"""Reading a bundle without extracting it, safely, whoever made it.

A bundle arrives from elsewhere and may be corrupt, truncated or hostile.
Nothing is ever written to disk: members are read into memory, one at a time,
up to a size limit. Members with absolute paths or `..`, links, devices,
FIFOs, control characters in their names or sizes over the limit are listed
with the reason and never read or followed. A corrupt or truncated archive is
one clear error.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import json
import lzma
import re
import stat
import tarfile
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tpu_tools.dump.manifest import MANIFEST_NAME, SCHEMA, Manifest
from tpu_tools.errors import ToolError, first_line
from tpu_tools.outside import OutsideError, convert

MAX_MEMBER_BYTES = 256 << 20
MAX_TOTAL_BYTES = 4 << 30
MAX_MEMBERS = 100_000
MAX_METADATA_BYTES = 1 << 20  # one pax or GNU long-name header
_METADATA_TYPES = {b"x": "pax", b"g": "global pax", b"L": "GNU long name", b"K": "GNU long link"}
_NO_DATA_TYPES = (b"1", b"2", b"3", b"4", b"5", b"6")  # links, devices, folders, FIFOs
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_ARCHIVE_ERRORS = (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile, OSError, ValueError)


class BundleError(ToolError):
    """The file cannot be read as a bundle (not an archive, truncated, corrupt, no manifest)."""


@dataclass
class Member:
    name: str  # as stored in the archive
    relative: str  # inside the bundle's top folder
    type: str  # file, folder, symlink, hardlink, fifo, device, other
    size_bytes: int
    problem: str | None = None  # why it is not read; None for a safe file or folder

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _type(info: tarfile.TarInfo) -> str:
    if info.issym():
        return "symlink"
    if info.islnk():
        return "hardlink"
    if info.isdir():
        return "folder"
    if info.isfile():
        return "file"
    if info.isfifo():
        return "fifo"
    if info.ischr() or info.isblk():
        return "device"
    return "other"


def _decompressed(path: Path):
    with open(path, "rb") as handle:
        magic = handle.read(6)
    if magic[:2] == b"\x1f\x8b":
        return gzip.open(path, "rb")
    if magic[:3] == b"BZh":
        return bz2.open(path, "rb")
    if magic == b"\xfd7zXZ\x00":
        return lzma.open(path, "rb")
    return open(path, "rb")


def _header_number(field: bytes) -> int | None:
    if field[:1] == b"\x80":  # base-256, for sizes over 8 GiB
        return int.from_bytes(field[1:], "big")
    if field[:1] == b"\xff":
        return None
    try:
        return int(field.split(b"\0", 1)[0].strip() or b"0", 8)
    except ValueError:
        return None


def check_metadata_headers(path: Path) -> None:
    """Refuse pax and GNU long-name headers too large to parse: tarfile reads them whole into memory.

    A few bytes of gzip can claim a gigabyte of header. This walks the raw
    512-byte headers first; anything malformed is left for tarfile to report.
    """
    declared = 0
    try:
        with _decompressed(path) as stream:
            for _ in range(MAX_MEMBERS * 2):
                block = stream.read(512)
                if len(block) < 512:
                    return
                if block == bytes(512):
                    continue
                size, kind = _header_number(block[124:136]), block[156:157]
                if size is None:
                    return
                if kind in _METADATA_TYPES and size > MAX_METADATA_BYTES:
                    raise BundleError(f"{path} is not a safe archive: a {_METADATA_TYPES[kind]} header claims "
                                      f"{size} bytes (at most {MAX_METADATA_BYTES} are read); nothing was read")
                remaining = 0 if kind in _NO_DATA_TYPES else (size + 511) // 512 * 512
                declared += remaining
                if declared > MAX_TOTAL_BYTES:
                    return
                while remaining > 0:
                    chunk = stream.read(min(remaining, 1 << 20))
                    if not chunk:
                        return
                    remaining -= len(chunk)
    except _ARCHIVE_ERRORS:
        return  # tarfile says what is wrong, in its own words


def member_problem(info: tarfile.TarInfo, max_member_bytes: int) -> str | None:
    name = info.name
    kind = _type(info)
    if name.startswith("/") or re.match(r"^[A-Za-z]:[\\/]", name):
        return "an absolute path; not read"
    if ".." in re.split(r"[\\/]", name):
        return "a path with '..' that leaves the bundle; not read"
    if _CONTROL.search(name):
        return "control characters in the name; not read"
    if kind == "symlink":
        return f"a symbolic link to {info.linkname!r}; not followed"
    if kind == "hardlink":
        return f"a hard link to {info.linkname!r}; not followed"
    if kind in ("fifo", "device", "other"):
        return f"a {kind} entry; ignored"
    if info.size > max_member_bytes:
        return f"{info.size} bytes, over the {max_member_bytes}-byte limit for one file; not read"
    return None


class Bundle:
    """An open bundle: its members, its manifest, and reads of single members."""

    def __init__(self, path: str | Path, max_member_bytes: int = MAX_MEMBER_BYTES):
        self.path = Path(path)
        self.max_member_bytes = max_member_bytes
        self.members: list[Member] = []
        self._by_name: dict[str, Member] = {}
        self.notes: list[str] = []
        self._infos: dict[str, tarfile.TarInfo] = {}
        try:
            info = self.path.stat()
            if not stat.S_ISREG(info.st_mode):
                raise BundleError(f"{self.path} is not a tpu-dump bundle: not a regular file")
            self.size_bytes = info.st_size
            check_metadata_headers(self.path)
            self._tar = tarfile.open(self.path, "r:*")
        except (tarfile.ReadError, tarfile.CompressionError, gzip.BadGzipFile, EOFError, zlib.error):
            raise BundleError(f"{self.path} is not a tpu-dump bundle: not a tar archive, compressed or not") \
                from None
        except OSError as error:
            raise BundleError(f"cannot read {self.path}: {(error.strerror or str(error)).lower()}") from None
        try:
            self._list()
            self.top = self._find_top()
            self.manifest = self._read_manifest()
        except BaseException:
            self._tar.close()
            raise

    def __enter__(self) -> Bundle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._tar.close()

    def _list(self) -> None:
        declared = 0
        try:
            for info in self._tar:
                if len(self.members) >= MAX_MEMBERS:
                    self.notes.append(f"more than {MAX_MEMBERS} members; the rest were not listed")
                    break
                problem = member_problem(info, self.max_member_bytes)
                if problem is None and info.name in self._infos:
                    problem = "a second member with the same name; not read"
                member = Member(info.name, info.name, _type(info), info.size, problem)
                self.members.append(member)
                self._by_name.setdefault(info.name, member)
                if problem is None and info.isfile():
                    self._infos[info.name] = info
                declared += info.size
                if declared > MAX_TOTAL_BYTES:
                    self.notes.append(f"members add up to more than {MAX_TOTAL_BYTES} bytes; the rest were not "
                                      "listed")
                    break
        except _ARCHIVE_ERRORS as error:
            raise BundleError(f"{self.path} is truncated or corrupt: {_short(error)} (after "
                              f"{len(self.members)} readable members)") from None

    def _find_top(self) -> str:
        candidates = [m.name for m in self.members if m.problem is None and m.type == "file"
                      and (m.name == MANIFEST_NAME or (m.name.endswith("/" + MANIFEST_NAME)
                                                       and m.name.count("/") == 1))]
        if not candidates:
            raise BundleError(f"{self.path} is not a tpu-dump bundle: it has no {MANIFEST_NAME}")
        top = min(candidates, key=len)[: -len(MANIFEST_NAME)]
        for member in self.members:
            if top and member.name.startswith(top):
                member.relative = member.name[len(top):]
        return top.rstrip("/")

    def _read_manifest(self) -> Manifest:
        data = self.read(MANIFEST_NAME)
        try:
            manifest = json.loads(data)  # NaN and infinities too, which the record refuses by name
        except (ValueError, RecursionError) as error:
            raise BundleError(f"{self.path}: {MANIFEST_NAME} is not valid JSON ({_short(error)})") from None
        if not isinstance(manifest, dict) or manifest.get("schema") != SCHEMA:
            raise BundleError(f"{self.path}: {MANIFEST_NAME} is not a {SCHEMA} manifest")
        try:
            return convert(manifest, Manifest)
        except OutsideError as error:
            raise BundleError(f"{self.path}: {MANIFEST_NAME} is malformed ({_short(error)})") from None

    def member(self, name: str) -> Member | None:
        """A member by its name inside the bundle (or its full stored name)."""
        return self._by_name.get(f"{self.top}/{name}" if self.top else name) or self._by_name.get(name)

    def read(self, name: str) -> bytes:
        member = self.member(name)
        if member is None:
            raise BundleError(f"{self.path} has no file {name!r} (see the file list in `tpu-dump show`)")
        if member.problem is not None:
            raise BundleError(f"{name!r} in {self.path} is {member.problem}")
        if member.type != "file":
            raise BundleError(f"{name!r} in {self.path} is a {member.type}, not a file")
        try:
            handle = self._tar.extractfile(self._infos[member.name])
            data = handle.read(self.max_member_bytes + 1) if handle is not None else b""
        except _ARCHIVE_ERRORS as error:
            raise BundleError(f"{self.path} is truncated or corrupt: {_short(error)} (reading {name})") from None
        return data

    def read_json(self, name: str) -> Any:
        """A JSON member, or None when it is absent, unsafe or not JSON (a summary works with what is there)."""
        try:
            return json.loads(self.read(name))
        except (BundleError, ValueError, RecursionError):
            return None

    def integrity_problems(self) -> list[str]:
        """Files whose bytes do not match the manifest, files it lists that are missing, and extra files."""
        problems = []
        listed = set()
        for entry in self.manifest.files or []:
            name = entry.name
            listed.add(name)
            member = self.member(name)
            if member is None:
                problems.append(f"{name}: listed in the manifest but not in the archive")
                continue
            if member.problem is not None:
                continue
            try:
                digest = hashlib.sha256(self.read(name)).hexdigest()
            except BundleError as error:
                problems.append(str(error))
                continue
            if digest != entry.sha256:
                problems.append(f"{name}: its sha256 does not match the manifest (changed after it was written)")
        for member in self.members:
            if member.type == "file" and member.problem is None and member.relative != MANIFEST_NAME \
                    and member.relative not in listed:
                problems.append(f"{member.relative}: in the archive but not listed in the manifest")
        return problems


def _short(error: BaseException) -> str:
    return first_line(error, limit=200)
