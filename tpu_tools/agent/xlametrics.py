"""A torch_xla job's metrics (`tpu_tools.agent.metric("loss", loss)` with a lazy XLA tensor), taken without
disturbing the job.

Reading a lazy tensor where it is reported (`float(loss)`) would compile and run its graph there, inside the
job's step. So the tensor is only kept, and its value is taken at the job's next `torch_xla.sync()` boundary
once its graph has run as part of the job's own sync: one device-to-host copy of one number (`.cpu()`, not the
`aten::_local_scalar_dense` fallback of `.item()`), never a compile, never while the agent answers a monitor.
The value is credited to the step at which it was reported.

Whether a metric claimed global is global is read from the tensor's own graph when it is reported (its IR,
`torch_xla._XLAC._get_xla_tensors_text`), as the kinds of `tpu_tools.agent.metrics`:

- SPMD (`xr.use_spmd()`): every tensor is a global view and the partitioner adds the collectives, so the
  value is the same on every device (`replicated` over all of them), unless its graph holds manually
  sharded parts (`xla::custom_sharding`, each device's own shard: `local`);
- one process per device: `replicated` where the graph went through `xla::cross_replica_sum` over every
  replica (`xm.all_reduce`; with replica groups it is over some of them only), else `local`, and a
  "global" metric that is local is suspect; a job of one device has nothing to reduce;
- a tensor whose graph already ran when it was reported (`device_data` only) cannot be proven: a "global"
  claim is then reported as unproven, with what to do.
"""

from __future__ import annotations

import math
import re
import threading
import time
from dataclasses import dataclass
from typing import Any

from tpu_tools.agent.metrics import MetricStore, MetricValue
from tpu_tools.shorten import shorten

ALL_REDUCE_OP = "xla::cross_replica_sum"
MANUAL_SHARDING_OP = "xla::custom_sharding"
MAX_PENDING = 256
_IR_NODE = re.compile(r"^\s*%\d+ = (?P<op>.*)$", re.MULTILINE)  # "  %3 = f32[] aten::sum(%2), xla_shape=..."


@dataclass
class Pending:
    name: str
    tensor: Any
    step: int
    scope: str | None
    kind: str
    devices: int
    job_devices: int
    suspect: str | None
    sync_index: int  # syncs seen when it was reported: taken at a later one


def graph_proof(ir_text: str, spmd: bool, job_devices: int) -> tuple[str, int, str | None]:
    """(kind, devices it is the same on, why a global claim cannot be proven or None) from a tensor's IR."""
    ops = [match["op"] for match in _IR_NODE.finditer(ir_text)]
    ran_already = bool(ops) and all(" xla::device_data(" in f" {op}" for op in ops)
    if spmd:
        if any(MANUAL_SHARDING_OP in op for op in ops):
            return "local", 1, None
        return "replicated", job_devices, None
    if job_devices <= 1:
        return "replicated", 1, None
    reduced = [op for op in ops if ALL_REDUCE_OP in op]
    if reduced and not any("groups=" in op and "groups=()" not in op for op in reduced):
        return "replicated", job_devices, None
    if ran_already:
        return "local", 1, ("unproven: its graph had already run when it was reported; report it before "
                            "torch_xla.sync to have its all-reduce checked")
    return "local", 1, None


class XlaMetricTaker:
    """Keeps the reported XLA tensors and takes their values at the job's step boundaries."""

    def __init__(self, torch_xla: Any, store: MetricStore):
        self._xlac = torch_xla._XLAC
        self._store = store
        self._lock = threading.Lock()
        self._pending: dict[str, Pending] = {}
        self._syncs = 0

    def defer(self, name: str, tensor: Any, scope: str | None, step: int) -> None:
        """(the job's thread, from `metric()`) Keep the tensor; its kind is read from its graph now, before a
        sync replaces the graph by its result. Raises ValueError for a tensor that is not one number."""
        if tensor.numel() != 1:  # metadata: nothing runs
            raise ValueError(f"a metric is one number, not a tensor of shape {tuple(tensor.shape)}")
        from torch_xla import runtime

        spmd = bool(runtime.is_spmd())
        job_devices = int(runtime.global_runtime_device_count() if spmd else runtime.world_size())
        # the graph is read for a global claim only (its text costs in proportion to the graph)
        kind, devices, unproven = ("replicated", job_devices, None) if spmd or job_devices <= 1 else ("local", 1, None)
        if scope == "global":
            kind, devices, unproven = graph_proof(self._xlac._get_xla_tensors_text([tensor]), spmd, job_devices)
        suspect = None
        if scope == "global" and job_devices > 1 and kind != "replicated":
            suspect = unproven or (f"claims to be global but its graph has no all-reduce over the job's "
                                   f"{job_devices} devices: it lives on {devices} of them")
        with self._lock:
            if name in self._pending or len(self._pending) < MAX_PENDING:
                self._pending[name] = Pending(name, tensor, step, scope, kind, devices, job_devices, suspect,
                                              self._syncs)
                return
        raise ValueError(f"more than {MAX_PENDING} metrics wait for the next torch_xla.sync")

    def take(self) -> None:
        """(the job's thread, right after a real sync) Read the values whose graphs have run."""
        with self._lock:
            self._syncs += 1
            ready = [p for p in self._pending.values() if p.sync_index < self._syncs]
            for pending in ready:
                del self._pending[pending.name]
        for pending in ready:
            try:
                number = float(pending.tensor.detach().cpu().reshape(()))
            except Exception as error:  # noqa: BLE001 a tensor the job deleted or a runtime error: reported, never raised
                self._store.reject(shorten(f"metric {pending.name}: {type(error).__name__}: {error}", 300))
                continue
            entry = MetricValue(pending.name, number if math.isfinite(number) else math.nan, pending.step,
                                pending.scope, pending.kind, pending.devices, pending.job_devices, time.time(),
                                pending.suspect)
            if not self._store.keep(entry):
                self._store.reject(f"more than the store holds; {pending.name} was not kept")
