"""tpu-ls lists the throttle score and ICI links of the TPU chips a job holds, as the job's agent read them through
libtpu's SDK (the stand-in): fixture v4 / v5e hosts whose chips are held by a real agent job, the real tpu-ls."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import sysroot
from agentjobs import agent_env, rundir, wait_for  # noqa: F401 (rundir is a fixture)
from conftest import run_tool
from hypothesis import given
from hypothesis import strategies as st

from tpu_tools.metrics.chiphealth import ChipHealth, JobHealth, link_text, pair, throttle_text
from tpu_tools.metrics.tpuhealth import TpuHealth, parse_link_health, parse_throttle
from tpu_tools.pjrt.discover import Chip

TESTS = Path(__file__).resolve().parent
FAKE_LIBTPU = TESTS / "fake_libtpu"

# A TPU job as far as the agent's SDK read goes (libtpu loaded), without jax: it starts in a fraction of a second.
JOB = textwrap.dedent("""
    import os, sys, time
    ready = sys.argv[1]
    import libtpu
    import tpu_tools.agent as agent
    agent.start(tag="train")
    open(ready, "w").write(str(os.getpid()))
    deadline = time.time() + 120
    while time.time() < deadline and not os.path.exists(ready + ".stop"):
        time.sleep(0.05)
""")


def _start(tmp_path: Path, rundir: Path, **env: str) -> subprocess.Popen:
    script, ready = tmp_path / "job.py", tmp_path / "ready"
    script.write_text(JOB)
    process = subprocess.Popen([sys.executable, str(script), str(ready)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.STDOUT, env=agent_env(rundir, PYTHONPATH=str(FAKE_LIBTPU), **env))
    wait_for(lambda: ready.exists() and ready.read_text() or process.poll() is not None, 60)
    assert process.poll() is None, "the job did not start"
    return process


def _stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)


def _rows(text: str) -> dict[str, str]:
    return {line.split()[0]: line for line in text.splitlines()[2:] if line[:1] == " " or line[:1].isdigit()}


def test_tpu_ls_shows_the_throttle_score_and_ici_links_of_every_chip_a_job_holds(rundir, tmp_path):
    process = _start(tmp_path, rundir)  # the stand-in's default read: devices 0-3, links of chips 0 and 1
    try:
        sysroot.v4_host(tmp_path / "host", holders={process.pid: [0, 1, 2, 3]})
        # JAX_PLATFORMS unset: the platform left to JAX, as a plain `tpu-ls` leaves it, also where the suite pins the
        # CPU platform (a host with an accelerator plugin); the fixture host decides, and nothing opens a device
        env = agent_env(rundir, TPU_TOOLS_SYSROOT=str(tmp_path / "host"))
        env.pop("JAX_PLATFORMS", None)
        listed = run_tool("tpu-ls", "--json", env=env)
        table = run_tool("tpu-ls", env=env)
    finally:
        _stop(process)
    assert listed.returncode == 0, listed.stderr
    document = json.loads(listed.stdout)
    assert document["runtime_status"] == "held"  # the TPU was never opened
    chips = [chip["tpu_health"] for chip in document["chips"]]
    assert [(c["pid"], c["tag"], c["throttle_score"], c["throttled_percent"]) for c in chips] == [
        (process.pid, "train", 0, 0), (process.pid, "train", 1, 10), (process.pid, "train", 0, 0),
        (process.pid, "train", 6, 60)]
    assert [[(link["location"], link["score"], link["state"]) for link in c["ici_links"]] for c in chips] == [
        [("tray1.chip0.ici0.int", 0, "healthy"), ("tray1.chip0.ici1.int", 10, "unusable")],
        [("tray1.chip1.ici0.int", 7, "persistent problem")], [], []]
    assert [c["worst_link_score"] for c in chips] == [10, 7, None, None]
    (job,) = document["tpu_health"]
    assert (job["pid"], job["chip_indexes"], job["error"], job["problems"]) == (process.pid, [0, 1, 2, 3], None, [])
    assert len(job["ici_links"]) == 3
    assert [t["device"] for t in job["throttle"]] == [0, 1, 2, 3]
    assert table.returncode == 0, table.stderr
    header = table.stdout.splitlines()[1]
    assert "THROTTLE" in header
    assert "ICI LINKS" in header
    rows = _rows(table.stdout)
    assert "ICI 10 tray1.chip0.ici1" in rows["0"]
    assert "1 (10%)" in rows["1"]
    assert "ICI 7 tray1.chip1.ici0" in rows["1"]
    assert "6 (60%)" in rows["3"]


def test_held_chips_of_a_v5e_host_unpaired_links_and_unreadable_values_are_notes(rundir, tmp_path):
    process = _start(tmp_path, rundir, FAKE_TPU_THROTTLE_SCORE="0-0;1-10;2-0;3-nan",
                     FAKE_TPU_ICI_LINK_HEALTH="tray1.chip2.ici0.int: 0;tray1.chip3.ici2.int: 10;"
                                              "tray1.chip7.ici0.int: 4;tray1.chip4.ici1.int: ten;warp.drive: 1")
    try:
        # the job holds chips 2-5 of 8; process 777 holds chips 6 and 7 without an agent
        sysroot.v5e_host(tmp_path / "host", holders={process.pid: [2, 3, 4, 5], 777: [6, 7]})
        env = agent_env(rundir, TPU_TOOLS_SYSROOT=str(tmp_path / "host"))
        document = json.loads(run_tool("tpu-ls", "--json", "--no-runtime", env=env).stdout)
        text = run_tool("tpu-ls", "--no-runtime", env=env).stdout
    finally:
        _stop(process)
    health = {chip["index"]: chip["tpu_health"] for chip in document["chips"]}
    assert [index for index, chip in health.items() if chip] == [2, 3, 4, 5]
    # 3 device scores read of 4 held chips: no throttle score is paired; link chip numbers name host chips
    assert all(chip["throttle_score"] is None for chip in health.values() if chip)
    assert [link["location"] for link in health[2]["ici_links"]] == ["tray1.chip2.ici0.int"]
    assert [link["location"] for link in health[3]["ici_links"]] == ["tray1.chip3.ici2.int"]
    (job,) = document["tpu_health"]  # process 777 has no agent: nothing asked, nothing said
    assert len(job["problems"]) == 3
    assert [t["device"] for t in job["throttle"]] == [0, 1, 2]
    notes = document["notes"]
    assert any("read throttle scores of 3 devices, which do not pair with the 4 TPU chips" in n for n in notes)
    assert any("read 1 ICI links that name no TPU chip it holds" in n for n in notes)
    assert any("health value not read: tpu_throttle_score device 3: score 'nan'" in n for n in notes)
    assert any("health value not read: ici_link_health: unknown link name 'warp.drive'" in n for n in notes)
    rows = _rows(text)
    assert "ICI 10 tray1.chip3.ici2" in rows["3"]
    assert " ok " in rows["2"]
    assert "ten" not in text.split("note:")[0]
    assert "nan" not in text.split("note:")[0]


def test_an_agent_that_does_not_answer_or_read_no_health_is_a_note(rundir, tmp_path):
    ready = tmp_path / "hung"
    hung = subprocess.Popen([sys.executable, str(TESTS / "fakeagent.py"), str(rundir), str(ready), "hang"])
    quiet = None
    try:
        wait_for(lambda: ready.exists() and ready.read_text(), 30)
        quiet = _start(tmp_path, rundir, TPU_TOOLS_AGENT_SDK="0")  # an agent with its SDK reads turned off
        sysroot.v4_host(tmp_path / "host", holders={hung.pid: [0, 1], quiet.pid: [2, 3]})
        env = agent_env(rundir, TPU_TOOLS_SYSROOT=str(tmp_path / "host"))
        result = run_tool("tpu-ls", "--json", "--no-runtime", "--timeout", "1", env=env)
        text = run_tool("tpu-ls", "--no-runtime", "--timeout", "1", env=env).stdout
    finally:
        hung.kill()
        hung.wait(10)
        if quiet is not None:
            _stop(quiet)
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    jobs = {job["pid"]: job for job in document["tpu_health"]}
    assert jobs[hung.pid]["error"] == "no complete answer within 1 s"
    assert jobs[hung.pid]["ici_links"] == []
    assert (jobs[quiet.pid]["error"], jobs[quiet.pid]["read"]) == (None, False)
    assert f"process {hung.pid} holds TPU chips but its agent did not answer: no complete answer within 1 s" \
        in document["notes"]
    assert f"process {quiet.pid} (train)'s agent read no TPU health (SDK reads turned off (TPU_TOOLS_AGENT_SDK=0))" \
        in document["notes"]
    assert all(chip["tpu_health"] is None for chip in document["chips"])
    assert "THROTTLE" not in text
    assert "did not answer" in text


def test_cells_of_a_chip():
    links = parse_link_health(["tray1.chip0.ici0.int: 0", "tray1.chip0.ici3.int: 3", "tray1.chip0.ici1.int: 10"],
                              [])
    chip = ChipHealth(1, "t", throttle=parse_throttle(["0-4"], []), links=links)
    assert link_text(chip) == "ICI 10 tray1.chip0.ici1 +1"
    assert throttle_text(chip) == "4 (40%)"
    assert link_text(ChipHealth(1, None, links=links[:1])) == "ok"
    assert throttle_text(ChipHealth(1, None)) == "-"
    assert link_text(None) == "-"
    assert throttle_text(ChipHealth(1, None, throttle=parse_throttle(["0-0"], []))) == "0"


def _chip(index: int) -> Chip:
    return Chip(index=index, name="TPU v5e", vendor="google", platform="tpu", pci_address=f"0000:00:{4 + index:02x}.0",
                pci_functions=[], numa_node=0, cpu_affinity=None, iommu_group=None, devices_per_chip=1,
                cores_per_chip=1)


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 12), st.integers(0, 7), st.integers(0, 10)), max_size=40),
       st.lists(st.integers(0, 10), max_size=12), st.sets(st.integers(0, 7), min_size=1))
def test_pairing_never_gives_a_chip_health_of_a_chip_its_job_does_not_hold(links, scores, held):
    problems: list[str] = []
    health = TpuHealth(links=parse_link_health([f"tray{t}.chip{c}.ici{p}.int: {s}" for t, c, p, s in links], problems),
                       throttle=parse_throttle([f"{d}-{s}" for d, s in enumerate(scores)], problems))
    host = [_chip(i) for i in range(8)]
    chips = [host[i] for i in sorted(held)]
    paired, notes = pair(JobHealth(9, "t", sorted(held), health=health), chips, host)
    assert set(paired) == held  # (a repeated link is a problem, kept once)
    for index, chip in paired.items():
        assert all(link.chip == index for link in chip.links)
        assert len(chip.throttle) == (1 if len(scores) == len(held) else 0)
    shown = sum(len(chip.links) for chip in paired.values())
    assert shown == len(health.links) or any("ICI links" in note for note in notes)


def test_on_a_terminal_an_unusable_link_is_in_the_error_style():
    import io

    from rich.console import Console

    from tpu_tools.metrics.chiphealth import HostHealth
    from tpu_tools.render.inventory_view import chip_table
    from tpu_tools.render.table import rich_table

    links = parse_link_health(["tray1.chip0.ici1.int: 10", "tray1.chip1.ici0.int: 0", "tray1.chip2.ici0.int: 6"], [])
    host = HostHealth(chips={0: ChipHealth(9, "t", parse_throttle(["0-0"], []), links[:1]),
                             1: ChipHealth(9, "t", parse_throttle(["1-7"], []), links[1:2]),
                             2: ChipHealth(9, "t", parse_throttle(["2-0"], []), links[2:])})
    table = chip_table([_chip(0), _chip(1), _chip(2)], None, host)
    throttle, ici = (table.columns.index(c) for c in table.columns if c.header in ("THROTTLE", "ICI LINKS"))
    assert [row[ici] for row in table.rows] == ["ICI 10 tray1.chip0.ici1", "ok", "ICI 6 tray1.chip2.ici0"]
    assert table.styles == {(0, ici): "bold red", (1, throttle): "yellow", (2, ici): "yellow"}
    stream = io.StringIO()
    Console(file=stream, force_terminal=True, color_system="standard", width=200).print(rich_table(table))
    assert "\x1b[1;31mICI 10 tray1.chip0.ici1" in stream.getvalue()
