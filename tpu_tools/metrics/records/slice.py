"""The report header's `tpu_slice`: this host's place in a TPU slice, every figure None where nothing says."""

from __future__ import annotations

import msgspec

from tpu_tools.pjrt.tpuvm import SliceInfo


class TpuSlice(msgspec.Struct, kw_only=True):
    gce_vm: bool = False  # the DMI product name says GCE
    source: str = "none"  # "environment", "metadata", "environment+metadata" or "none"
    accelerator_type: str | None = None  # e.g. "v5litepod-16", "v6e-8", "tpu7x-128"
    worker_id: int | None = None
    worker_hostnames: list[str] = msgspec.field(default_factory=list)
    name: str | None = None  # the TPU's name (metadata NODE_ID or TPU_NAME)
    topology: str | None = None
    slice_id: int | None = None  # multi-slice index
    num_slices: int | None = None
    environment: dict[str, str] = msgspec.field(default_factory=dict)  # the slice's variables that are set
    notes: list[str] = msgspec.field(default_factory=list)
    slice: str | None = None  # the same on every worker of the slice (SliceInfo.slice_label)
    labels: dict[str, str] = msgspec.field(default_factory=dict)  # Prometheus `slice` and `worker`; empty off a slice

    @classmethod
    def of(cls, info: SliceInfo) -> TpuSlice:
        return msgspec.convert(info.to_dict(), cls)
