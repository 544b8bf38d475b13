"""tpu-tools from Python, for readers outside the job: a notebook, a scheduler, an experiment tracker's logger.

    from tpu_tools import api
    for device in api.devices():
        print(device.index, device.name, device.memory_used_bytes, device.utilization_percent, device.holders)
    for job in api.jobs():
        print(job.pid, job.tag, job.steps_per_s, job.mfu_percent)

What `tpu-ls`, `tpu-monitor` and `tpu-ls --free` read, as typed records (dataclasses), without a runtime in the
caller: nothing here imports jax or opens a device (a TPU belongs to one process, and the caller's jax would
take it). Devices come from passive discovery (sysfs, /dev, /proc), a GPU driver's NVML or amdsmi, libtpu's
metrics service and, only when asked with `runtime=True`, PJRT queried in a child process (never when another
process holds the TPU). A job's figures are its agent's, over its socket.
"""

from __future__ import annotations

from tpu_tools.api.reads import (
    Job,
    devices,
    free_chips,
    job,
    jobs,
    libtpu_metrics,
)
from tpu_tools.instrument.steps import StepStats
from tpu_tools.inventory import DeviceSummary
from tpu_tools.metrics.agent_client import AgentGone, AgentQueryError
from tpu_tools.metrics.libtpu.records import DeviceFigures, LibtpuSnapshot
from tpu_tools.pjrt.discover import Holder
from tpu_tools.pjrt.placement import FreeChips

__all__ = ["AgentGone", "AgentQueryError", "DeviceFigures", "DeviceSummary", "FreeChips", "Holder", "Job",
           "LibtpuSnapshot", "StepStats", "devices", "free_chips", "job", "jobs", "libtpu_metrics"]
