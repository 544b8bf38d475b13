"""The labels of a process's series: pid, tag, its command where the operator asks for it, and its pod's.

The command (`tpu-monitor --prometheus --process-command-label`) is off by default: every distinct command line
is a new series of every process family, and a job whose arguments change from run to run (a timestamp, an
output folder) leaves a trail of series behind it. It is the agent's command line with its whitespace folded
to single spaces, control characters made "?" and cut to 128 characters (labeltext.label_value).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tpu_tools.metrics.labeltext import label_value
from tpu_tools.metrics.records.jobs import AgentEntry

POD_LABELS = ("namespace", "pod", "container")
COMMAND_LABEL = "command"


def process_labels(agents: Sequence[AgentEntry], command: bool = False) -> list[str]:
    """pid, tag, command (asked for), then the pod's labels where any process runs in a Kubernetes pod."""
    in_pods = any(agent.kubernetes for agent in agents)
    return ["pid", "tag", *([COMMAND_LABEL] if command else []), *(POD_LABELS if in_pods else ())]


def command_label_value(command: Any) -> str:
    return label_value(" ".join(str(command or "").split()))


def process_label_values(agent: AgentEntry, labels: Sequence[str]) -> list[str]:
    """The values of `labels` (process_labels) for one agent's entry of the processes group."""
    pod = agent.kubernetes
    values = []
    for label in labels:
        if label == "pid":
            values.append(str(agent.pid))
        elif label == "tag":
            values.append(label_value(agent.tag or ""))
        elif label == COMMAND_LABEL:
            values.append(command_label_value(agent.command))
        else:
            values.append(label_value(str((getattr(pod, label) if pod is not None else None) or "")))
    return values
