"""ICI link health and throttle scores of the TPU chips a job holds, from the job's agent (for `tpu-ls`).

A TPU is held by one process; when that process runs the tpu-tools agent, the agent's snapshot carries what
libtpu's SDK read in the job (`tpu_tools.metrics.tpuhealth`). Nothing here opens a TPU: the agents of the
holders are asked over their sockets, each within the timeout, and their health is paired with the chips:
- throttle scores are per device: the job's devices, in id order, pair with the chips it holds, in PCI order,
  when the counts agree (as the metrics service's devices pair with chips), `devices_per_chip` to a chip;
- an ICI link names its chip (`tray1.chip3.ici0.int`: the host's TPU chip 3, in PCI order), when every link
  names one tray and a chip the job holds.
What does not pair stays in the job's record and is said in a note; values that do not parse are the job's
`problems`, never health.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tpu_tools.metrics.agent_client import AgentResult, query_agents
from tpu_tools.metrics.rundir import RunDirError
from tpu_tools.metrics.tpuhealth import LinkHealth, ThrottleScore, TpuHealth, health_from_sdk
from tpu_tools.pjrt.discover import Chip, Discovery
from tpu_tools.shorten import shorten


@dataclass
class ChipHealth:
    """What a holder's agent read of one chip: its devices' throttle scores and its ICI links."""

    pid: int
    tag: str | None
    throttle: list[ThrottleScore] = field(default_factory=list)
    links: list[LinkHealth] = field(default_factory=list)

    @property
    def throttle_score(self) -> int | None:
        """The chip's score: its most throttled device's."""
        return max((t.score for t in self.throttle), default=None)

    @property
    def worst_link(self) -> LinkHealth | None:
        return max(self.links, key=lambda link: link.score, default=None)

    def to_dict(self) -> dict[str, Any]:
        score = self.throttle_score
        worst = self.worst_link
        return {"pid": self.pid, "tag": self.tag, "throttle_score": score,
                "throttled_percent": None if score is None else score * 10,
                "devices": [t.to_dict() for t in self.throttle],
                "worst_link_score": worst.score if worst else None,
                "ici_links": [link.to_dict() for link in self.links]}


@dataclass
class JobHealth:
    """One holder's agent: its whole read (every link and device, paired or not) or why there is none."""

    pid: int
    tag: str | None
    chip_indexes: list[int]  # the TPU chips it holds
    error: str | None = None  # the agent did not answer
    sdk_status: str | None = None
    health: TpuHealth | None = None
    frontend: str | None = None  # the library that runs the job's programs (jax, torch_xla), None before one loads

    def to_dict(self) -> dict[str, Any]:
        health = self.health or TpuHealth()
        return {"pid": self.pid, "tag": self.tag, "chip_indexes": list(self.chip_indexes), "error": self.error,
                "frontend": self.frontend,
                "sdk_status": self.sdk_status, "read": self.health is not None,
                "ici_links": [link.to_dict() for link in health.links],
                "throttle": [t.to_dict() for t in health.throttle], "problems": list(health.problems)}


@dataclass
class HostHealth:
    jobs: list[JobHealth] = field(default_factory=list)
    chips: dict[int, ChipHealth] = field(default_factory=dict)  # chip index -> health
    notes: list[str] = field(default_factory=list)


def held_chips(discovery: Discovery, exclude_pids: frozenset[int] = frozenset()) -> dict[int, list[Chip]]:
    """PID -> the TPU chips it holds (PCI order), for every holder but `exclude_pids`."""
    holders: dict[int, list[Chip]] = {}
    for chip in discovery.chips_for_platform("tpu"):
        for holder in chip.holders:
            if holder.pid not in exclude_pids:
                holders.setdefault(holder.pid, []).append(chip)
    return holders


def _job_health(result: AgentResult) -> tuple[str | None, TpuHealth | None]:
    sdk = result.snapshot.tpu_sdk if result.snapshot is not None else None
    if sdk is None:
        return None, None
    status = shorten(sdk.status, 200) if sdk.status is not None else None
    return status, health_from_sdk(sdk.metrics)


def pair(job: JobHealth, chips: Sequence[Chip], host_chips: Sequence[Chip]) -> tuple[dict[int, ChipHealth],
                                                                                       list[str]]:
    """The job's health per chip it holds, and sentences for what did not pair."""
    health = job.health
    result = {chip.index: ChipHealth(job.pid, job.tag) for chip in chips}
    notes: list[str] = []
    if health is None or not chips:
        return result, notes
    who = _who(job)
    per_chip = chips[0].devices_per_chip or 1
    devices = sorted(health.throttle, key=lambda t: t.device)
    if devices and len(devices) == len(chips) * per_chip:
        for position, score in enumerate(devices):
            result[chips[position // per_chip].index].throttle.append(score)
    elif devices:
        notes.append(f"{who} read throttle scores of {len(devices)} devices, which do not pair with the "
                     f"{len(chips)} TPU chips it holds ({per_chip} devices a chip): see its record")
    held = {chip.index for chip in chips}
    trays = {link.tray for link in health.links}
    unpaired = 0
    for link in health.links:
        chip = host_chips[link.chip] if len(trays) == 1 and link.chip < len(host_chips) else None
        if chip is None or chip.index not in held:
            unpaired += 1
            continue
        result[chip.index].links.append(link)
    if unpaired:
        notes.append(f"{who} read {unpaired} ICI links that name no TPU chip it holds on this host: see its record")
    return result, notes


def _who(job: JobHealth) -> str:
    return f"process {job.pid}" + (f" ({job.tag})" if job.tag else "")


def read_host_health(discovery: Discovery, timeout_s: float,
                     exclude_pids: frozenset[int] = frozenset()) -> HostHealth:
    """Ask the agents of the processes holding TPU chips (each within `timeout_s`, in parallel) for their TPU
    health, paired with the chips they hold. Holders without an agent are left out; never raises."""
    host = HostHealth()
    holders = held_chips(discovery, exclude_pids)
    if not holders:
        return host
    try:
        scan = query_agents(timeout_s, pids=frozenset(holders))
    except (RunDirError, OSError) as error:
        host.notes.append(f"the agents of the jobs holding the TPU chips were not asked: {error}")
        return host
    host_chips = discovery.chips_for_platform("tpu")
    for result in scan.results:
        chips = holders.get(result.pid, [])
        job = JobHealth(result.pid, result.tag, [chip.index for chip in chips], error=result.error)
        host.jobs.append(job)
        who = _who(job)
        if result.error is not None:
            host.notes.append(f"{who} holds TPU chips but its agent did not answer: {result.error}")
            continue
        frontend = result.snapshot.frontend if result.snapshot is not None else None
        job.frontend = shorten(frontend, 32) if frontend else None
        job.sdk_status, job.health = _job_health(result)
        if job.health is None:
            host.notes.append(f"{who}'s agent read no TPU health ({job.sdk_status or 'no libtpu SDK read'})")
            continue
        chip_health, notes = pair(job, chips, host_chips)
        host.chips.update(chip_health)
        host.notes += notes
        host.notes += [f"{who}: health value not read: {problem}" for problem in job.health.problems]
    return host


def name_frontends(discovery: Discovery, host: HostHealth) -> None:
    """Set each TPU holder's frontend to the one its agent named; a holder whose agent did not answer, or that
    runs none, keeps None (never a guess)."""
    named = {job.pid: job.frontend for job in host.jobs if job.frontend}
    nodes = [node for chip in discovery.chips_for_platform("tpu") for node in chip.device_nodes]
    for holder in [*(h for node in nodes for h in node.holders), *discovery.libtpu_lock_holders]:
        holder.frontend = named.get(holder.pid, holder.frontend)


def link_text(chip: ChipHealth | None) -> str:
    """The ICI cell of a chip: "ok", its worst link ("ICI 10 tray1.chip3.ici0", "+N" more not healthy),
    or "-" where nothing was read."""
    if chip is None or not chip.links:
        return "-"
    bad = sorted((link for link in chip.links if link.score > 0), key=lambda link: (-link.score, link.location))
    if not bad:
        return "ok"
    worst = bad[0]
    text = f"ICI {worst.score} tray{worst.tray}.chip{worst.chip}.ici{worst.port}"
    return text + (f" +{len(bad) - 1}" if len(bad) > 1 else "")


def link_level(chip: ChipHealth | None) -> str:
    """"error" (a link unusable), "warn" (a link with a problem), "ok", or "none" (no link read)."""
    worst = chip.worst_link if chip is not None else None
    if worst is None:
        return "none"
    return "error" if worst.score >= 10 else ("warn" if worst.score > 0 else "ok")


def throttle_level(chip: ChipHealth | None) -> str:
    """"warn" (throttled by 50 % or more: the alert rules' threshold), "ok", or "none"."""
    score = chip.throttle_score if chip is not None else None
    if score is None:
        return "none"
    return "warn" if score >= 5 else "ok"


def throttle_text(chip: ChipHealth | None) -> str:
    """The throttle cell of a chip: "0", "6 (60%)", or "-" where nothing was read."""
    score = chip.throttle_score if chip is not None else None
    if score is None:
        return "-"
    return "0" if score == 0 else f"{score} ({score * 10}%)"
