"""A monitor's rounds list the run directory again only when it changed: counted, not timed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from agentjobs import rundir  # noqa: F401 (a fixture)

from tpu_tools.agent.server import AgentServer
from tpu_tools.metrics import socketlist
from tpu_tools.metrics.rundir import RunDirError, list_socket_entries
from tpu_tools.metrics.socketlist import SocketListing


def settle(directory: Path) -> None:
    """Stamp the directory's last change a second back, as a directory nobody touched lately has it."""
    info = os.stat(directory)
    os.utime(directory, ns=(info.st_atime_ns, info.st_mtime_ns - 1_000_000_000))


def serve(directory: Path, pid: int) -> AgentServer:
    server = AgentServer(directory / f"agent-{pid}.sock", lambda request: {})
    server.start()
    return server


def test_an_unchanged_directory_is_not_listed_again_and_a_new_socket_is_seen(rundir):
    server = serve(rundir, os.getpid())
    listing = SocketListing()
    try:
        settle(rundir)
        assert listing.entries(rundir) == list_socket_entries(rundir)
        for _ in range(3):
            assert [e.pid for e in listing.entries(rundir)] == [os.getpid()]
        assert (listing.listed, listing.reused) == (1, 3)
        other = serve(rundir, 1)  # another agent registers: the directory changed
        try:
            assert [e.pid for e in listing.entries(rundir)] == [1, os.getpid()]
            assert listing.listed == 2
        finally:
            other.stop()
        assert [e.pid for e in listing.entries(rundir)] == [os.getpid()]
    finally:
        server.stop()


def test_a_listing_made_within_the_stamps_tick_is_made_again(rundir, monkeypatch):
    monkeypatch.setattr(socketlist, "SETTLED_S", 3600.0)  # every stamp is as fresh as a change just made
    listing = SocketListing()
    for _ in range(3):
        assert listing.entries(rundir) == []
    assert (listing.listed, listing.reused) == (3, 0)


def test_a_directory_made_unsafe_is_refused_at_once(rundir):
    listing = SocketListing()
    settle(rundir)
    listing.entries(rundir)
    os.chmod(rundir, 0o755)
    settle(rundir)
    with pytest.raises(RunDirError, match="not 0700"):
        listing.entries(rundir)


def test_an_absent_directory_has_no_sockets(tmp_path):
    assert SocketListing().entries(tmp_path / "absent") == []
