"""NVIDIA GPUs through NVML (nvidia-ml-py): the card's own figures, the way nvidia-smi and nvitop read them.

`read_snapshot(timeout_s)` reads once; `NvmlReader` keeps NVML open for a monitor. Records are in
`records`, NVML's codes in words in `decode`, Prometheus samples in `export`.
"""

from tpu_tools.metrics.nvml.reader import DEFAULT_TIMEOUT_S, ENABLE_VARIABLE, NvmlReader, enabled, read_snapshot
from tpu_tools.metrics.nvml.records import NvmlSnapshot
from tpu_tools.metrics.records.gpu import (
    STATUS_ERROR,
    STATUS_LOST,
    STATUS_NOT_ANSWERING,
    STATUS_OK,
    GpuProcess,
    GpuRecord,
)

__all__ = ["DEFAULT_TIMEOUT_S", "ENABLE_VARIABLE", "STATUS_ERROR", "STATUS_LOST", "STATUS_NOT_ANSWERING", "STATUS_OK",
           "GpuProcess", "GpuRecord", "NvmlReader", "NvmlSnapshot", "enabled", "read_snapshot"]
