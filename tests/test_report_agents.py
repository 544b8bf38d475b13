"""A report asks the agents at the start of its round, while it samples everything else, and only in a round
in which a group that reads them is due."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from agentjobs import make_rundir, remove_rundir
from conftest import report_document

from tpu_tools.agent.server import AgentServer
from tpu_tools.metrics import wire
from tpu_tools.metrics.groups import GROUPS
from tpu_tools.metrics.groups.base import CollectContext, CollectOptions
from tpu_tools.metrics.records.diag import DiagGroup
from tpu_tools.metrics.report import GroupPlan, ReportBuilder

ASKED = threading.Event()  # set by the agent below when it is asked for its snapshot


class AskedYet:
    """A group collected before any group that reads the agents: it says (in its error, the one text every group
    carries) whether the agent has been asked yet, waiting for that (with a deadline) so that the answer does not
    depend on which thread runs first."""

    name = "diag"  # in the place of a group the report has: it reads no agent
    record_type = DiagGroup

    def __init__(self, options: CollectOptions):
        pass

    def collect(self, context: CollectContext) -> DiagGroup:
        return DiagGroup(error=f"agent asked: {ASKED.wait(timeout=10.0)}")


@pytest.fixture
def agent(monkeypatch) -> Iterator[AgentServer]:
    directory = make_rundir()
    monkeypatch.setenv("TPU_TOOLS_RUNTIME_DIR", str(directory))
    monkeypatch.setitem(GROUPS, "diag", "test_report_agents:AskedYet")
    ASKED.clear()

    def answer(request: str) -> dict[str, Any]:
        ASKED.set()
        return {"schema": wire.SNAPSHOT_SCHEMA, "pid": os.getpid(), "tag": "early"}

    server = AgentServer(directory / f"agent-{os.getpid()}.sock", answer)  # this process is the agent's
    server.start()
    yield server
    server.stop()
    remove_rundir(directory)


def test_the_agents_are_asked_before_the_first_group_is_sampled(agent):
    builder = ReportBuilder([GroupPlan("diag"), GroupPlan("host"), GroupPlan("processes")], report_period_s=0.1)
    try:
        report = builder.build()
    finally:
        builder.close()
    document = report_document(report)
    assert document["diag"]["error"] == "agent asked: True"
    assert document["processes"]["error"] is None
    assert [a["tag"] for a in document["processes"]["agents"]] == ["early"]
    assert agent.counters.served == 1  # asked once, although two groups read the answer


def test_a_round_without_a_group_that_reads_the_agents_does_not_ask_them(agent):
    builder = ReportBuilder([GroupPlan("host"), GroupPlan("processes", period_s=3600.0)])  # host: every report
    try:
        first = builder.build()
        assert agent.counters.served == 1
        second = builder.build()  # the processes group is not due: its figures are repeated, nobody is asked
    finally:
        builder.close()
    assert second.host is not first.host
    assert report_document(second)["host"]["error"] is None  # collected again
    document = report_document(second)
    assert document["sequence"] == 1
    assert [a["tag"] for a in document["processes"]["agents"]] == ["early"]
    assert second.processes is first.processes
    assert agent.counters.served == 1
