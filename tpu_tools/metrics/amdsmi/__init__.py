"""AMD GPUs through AMD's amdsmi bindings (the `amd` extra): the same GPU records NVML fills.

`read_snapshot(timeout_s)` reads once; `AmdSmiReader` keeps amdsmi open for a monitor.
"""

from tpu_tools.metrics.amdsmi.reader import (
    DEFAULT_TIMEOUT_S,
    ENABLE_VARIABLE,
    AmdSmiReader,
    AmdSmiSnapshot,
    enabled,
    read_snapshot,
)

__all__ = ["DEFAULT_TIMEOUT_S", "ENABLE_VARIABLE", "AmdSmiReader", "AmdSmiSnapshot", "enabled", "read_snapshot"]
