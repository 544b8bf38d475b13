"""Every file read from outside is a regular file read with a cap: a FIFO never blocks, a huge or endless
file never eats memory, a directory or device is named as such (one line, before any work)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import assert_one_line_error, clean_env, run_tool
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tpu_tools.infile import InputFileError, check_input_file, read_input_file


def _hostile(folder: Path, kind: str, name: str = "input") -> Path:
    """A path of `kind`: a FIFO nobody writes, a directory, a 2 GiB sparse file, or the zero device."""
    path = folder / name
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "huge":
        with open(path, "wb") as handle:
            handle.truncate(2 << 30)
    else:
        return Path("/dev/zero")
    return path


EXPECTED = {"fifo": "is a FIFO, not a regular file", "directory": "is a directory",
            "huge": "is larger than", "device": "is a character device, not a regular file"}
KINDS = tuple(EXPECTED)
ENV = clean_env(JAX_PLATFORMS="cpu")


def _commands(path: Path, folder: Path) -> dict[str, tuple[list[str], int]]:
    """Every command option that reads a file the user names, with `path` there; the exit status expected."""
    good_result = folder / "good.json"
    good_result.write_text('{"schema": "tpu-tools/bench/v1", "results": []}')
    cert_config = folder / "web.yml"
    cert_config.write_text(f"tls_server_config:\n  cert_file: {path}\n  key_file: {path}\n")
    profile = folder / "profile"
    profile.mkdir(exist_ok=True)
    summary = profile / "summary.json"
    if not os.path.lexists(summary):
        summary.symlink_to(path)
    return {
        "monitor --config": (["tpu-monitor", "--count", "1", "--config", str(path)], 2),
        "monitor --web-config": (["tpu-monitor", "--count", "1", "--prometheus", "127.0.0.1:0", "--web-config",
                                  str(path)], 2),
        "web config cert_file": (["tpu-monitor", "--count", "1", "--prometheus", "127.0.0.1:0", "--web-config",
                                  str(cert_config)], 2),
        "bench compare": (["tpu-bench", "compare", str(path), str(good_result)], 2),
        "bench --baseline": (["tpu-bench", "dispatch", "--baseline", str(path)], 2),
        "profile summary": (["tpu-profile", "summary", str(profile)], 1),
    }


READERS = ("monitor --config", "monitor --web-config", "web config cert_file", "bench compare", "bench --baseline",
           "profile summary")


@pytest.mark.parametrize("reader", READERS)
def test_every_reader_refuses_fifos_directories_devices_and_huge_files(reader, tmp_path):
    for kind in KINDS:
        folder = tmp_path / kind
        folder.mkdir()
        path = _hostile(folder, kind)
        args, code = _commands(path, folder)[reader]
        if reader == "web config cert_file" and kind == "huge":
            expected = "is larger than 1 MiB"
        else:
            expected = EXPECTED[kind]
        result = run_tool(*args, env=ENV, timeout=120)  # a FIFO read would block: the timeout fails the test
        assert_one_line_error(result, code, expected)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=300), limit=st.integers(min_value=0, max_value=400))
def test_read_input_file_returns_the_file_or_refuses_it_by_size(tmp_path_factory, data, limit):
    path = tmp_path_factory.mktemp("in") / "f"
    path.write_bytes(data)
    if len(data) <= limit:
        assert read_input_file(path, "the file", limit) == data
    else:
        with pytest.raises(InputFileError, match="is larger than"):
            read_input_file(path, "the file", limit)


def test_missing_and_unreadable_are_one_sentence(tmp_path):
    with pytest.raises(InputFileError, match=r"^config file .*absent does not exist$"):
        read_input_file(tmp_path / "absent", "config file", 10)
    with pytest.raises(InputFileError, match="is a directory"):
        check_input_file(tmp_path, "cert_file", 10)
    link = tmp_path / "loop"
    link.symlink_to(link)
    with pytest.raises(InputFileError, match="cannot read config file"):
        read_input_file(link, "config file", 10)
