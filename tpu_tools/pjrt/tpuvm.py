"""Which TPU slice this host belongs to: accelerator type, worker, slice name, topology.

A TPU VM says so in two places. Workloads (GKE pods, launch scripts) get environment variables
(`TPU_ACCELERATOR_TYPE`, `TPU_WORKER_ID`, `TPU_WORKER_HOSTNAMES`, ...); a plain TPU VM's shell often has
none, and libtpu itself asks the GCE metadata server. So does this module, but only where the DMI product
name (read under the sysroot) says the host is a GCE VM, only when `TPU_SKIP_MDS_QUERY` does not say no,
and with a deadline: on any other machine nothing is sent anywhere. The environment wins over metadata.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tpu_tools.parsing import parse_number
from tpu_tools.pjrt.discover import group_chips, read_pci_functions, sysroot

GCE_PRODUCT_NAMES = ("Google Compute Engine", "Google")
METADATA_URL = "http://metadata.google.internal/computeMetadata/v1/instance/attributes/"
METADATA_URL_VARIABLE = "TPU_TOOLS_GCE_METADATA_URL"  # another metadata server (a stand-in, a proxy)
DEFAULT_METADATA_TIMEOUT_S = 1.0
_MAX_ATTRIBUTE_BYTES = 64 << 10

# Environment variables a TPU workload is given, as shown by `tpu-ls` (name -> what it says).
SLICE_VARIABLES = {
    "TPU_ACCELERATOR_TYPE": "accelerator type",
    "TPU_WORKER_ID": "this worker's index in the slice",
    "TPU_WORKER_HOSTNAMES": "the slice's workers",
    "TPU_NAME": "the TPU (slice) name",
    "TPU_TOPOLOGY": "chip topology of the slice",
    "TPU_HOST_BOUNDS": "hosts of the slice per dimension",
    "TPU_CHIPS_PER_HOST_BOUNDS": "chips of a host per dimension",
    "TPU_SKIP_MDS_QUERY": "whether libtpu skips the metadata server",
    "MEGASCALE_NUM_SLICES": "slices of a multi-slice job",
    "MEGASCALE_SLICE_ID": "this slice's index in a multi-slice job",
    "MEGASCALE_COORDINATOR_ADDRESS": "the multi-slice coordinator",
}


@dataclass
class SliceInfo:
    """This host's place in a TPU slice; every field None where nothing says."""

    gce_vm: bool = False  # the DMI product name says GCE
    source: str = "none"  # "environment", "metadata", "environment+metadata" or "none"
    accelerator_type: str | None = None  # e.g. "v5litepod-16", "v6e-8", "tpu7x-128"
    worker_id: int | None = None
    worker_hostnames: list[str] = field(default_factory=list)
    name: str | None = None  # the TPU's name (metadata NODE_ID or TPU_NAME)
    topology: str | None = None
    slice_id: int | None = None  # multi-slice index
    num_slices: int | None = None
    environment: dict[str, str] = field(default_factory=dict)  # the SLICE_VARIABLES that are set
    notes: list[str] = field(default_factory=list)

    @property
    def known(self) -> bool:
        return self.accelerator_type is not None or self.worker_id is not None or bool(self.worker_hostnames)

    @property
    def slice_label(self) -> str:
        """The same value on every worker of a slice: its name, else a digest of what all workers share."""
        base = self.name
        if base is None and (self.accelerator_type or self.worker_hostnames):
            digest = hashlib.sha256(",".join(self.worker_hostnames).encode()).hexdigest()[:8]
            base = f"{self.accelerator_type or 'tpu'}-{digest}" if self.worker_hostnames else self.accelerator_type
        if base is not None and self.slice_id is not None and self.num_slices and self.num_slices > 1:
            base = f"{base}/{self.slice_id}"
        return base or ""

    def labels(self) -> dict[str, str]:
        """Prometheus labels (`slice`, `worker`) for every series; empty off a TPU slice."""
        if not self.known:
            return {}
        return {"slice": self.slice_label, "worker": "" if self.worker_id is None else str(self.worker_id)}

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["slice"] = self.slice_label or None
        data["labels"] = self.labels()
        return data


def is_gce_vm(root: Path | None = None) -> bool:
    """Whether DMI names Google Compute Engine as the product (TPU VMs are GCE VMs)."""
    path = (root or sysroot()) / "sys/class/dmi/id/product_name"
    try:
        product = path.read_text(errors="replace").strip()
    except OSError:
        return False
    return product in GCE_PRODUCT_NAMES


def has_tpu_chips(root: Path | None = None) -> bool:
    """Whether PCI lists a TPU chip (a cheap look at sysfs: no device nodes, no /proc scan)."""
    return any(spec.platform == "tpu" for spec, _ in group_chips(read_pci_functions(root or sysroot(), [])))


def accelerator_summary(root: Path | None = None) -> str | None:
    """"4 x TPU v5e" (every accelerator kind PCI lists, with its count); None where there is none."""
    counts: dict[str, int] = {}
    for spec, _ in group_chips(read_pci_functions(root or sysroot(), [])):
        counts[spec.name] = counts.get(spec.name, 0) + 1
    return ", ".join(f"{count} x {name}" for name, count in counts.items()) or None


def _int(text: str | None) -> int | None:
    try:
        return int(parse_number(text.strip(), "value", integer=True)) if text is not None else None
    except ValueError:  # not a whole number in ASCII digits (int() would take "١" or "1_0")
        return None


def _hostnames(text: str | None) -> list[str]:
    return [h.strip() for h in (text or "").split(",") if h.strip()]


def _skip_metadata(environ: Mapping[str, str]) -> bool:
    return environ.get("TPU_SKIP_MDS_QUERY", "").strip().lower() in ("1", "true", "yes")


def parse_tpu_env(text: str) -> dict[str, str]:
    """The metadata attribute `tpu-env`: lines of `KEY: 'value'` (YAML-like, quotes optional)."""
    values = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip():
            values[key.strip()] = value.strip().strip("'\"")
    return values


def read_metadata(keys: tuple[str, ...], timeout_s: float, environ: Mapping[str, str]) -> dict[str, str]:
    """Instance attributes from the metadata server; a missing one is left out, a failure raises OSError."""
    import urllib.error  # here: only a TPU VM asks; every other tpu-ls would pay for the HTTP stack's import
    import urllib.request

    base = environ.get(METADATA_URL_VARIABLE) or METADATA_URL
    found = {}
    for key in keys:
        request = urllib.request.Request(base + key, headers={"Metadata-Flavor": "Google"})
        # The metadata server is link-local: never through a proxy.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(request, timeout=timeout_s) as response:
                found[key] = response.read(_MAX_ATTRIBUTE_BYTES).decode("utf-8", errors="replace")
        except urllib.error.HTTPError as error:
            if error.code != 404:
                raise OSError(f"the metadata server answered {error.code} for {key}") from error
    return found


def slice_info(environ: Mapping[str, str] | None = None, *, root: Path | None = None,
               metadata_timeout_s: float = DEFAULT_METADATA_TIMEOUT_S, ask_metadata: bool | None = None) -> SliceInfo:
    """What the environment (and, on a GCE VM with TPUs, the metadata server) says of this host's slice.

    ask_metadata False: the environment alone; None: ask only where PCI lists TPU chips. Never raises: a
    metadata server that fails or is slow leaves a note.
    """
    env = os.environ if environ is None else environ
    info = SliceInfo(gce_vm=is_gce_vm(root))
    info.environment = {name: env[name] for name in SLICE_VARIABLES if env.get(name)}
    info.accelerator_type = env.get("TPU_ACCELERATOR_TYPE") or None
    info.worker_id = _int(env.get("TPU_WORKER_ID"))
    info.worker_hostnames = _hostnames(env.get("TPU_WORKER_HOSTNAMES"))
    info.name = env.get("TPU_NAME") or None
    info.topology = env.get("TPU_TOPOLOGY") or None
    info.slice_id = _int(env.get("MEGASCALE_SLICE_ID"))
    info.num_slices = _int(env.get("MEGASCALE_NUM_SLICES"))
    sources = ["environment"] if info.environment else []
    complete = info.accelerator_type and info.worker_id is not None and info.worker_hostnames and info.name
    if info.gce_vm and not complete and (has_tpu_chips(root) if ask_metadata is None else ask_metadata):
        if _skip_metadata(env):
            info.notes.append("TPU_SKIP_MDS_QUERY is set: the metadata server was not asked")
        else:
            try:
                _fill_from_metadata(info, read_metadata(("tpu-env", "accelerator-type", "agent-worker-number",
                                                         "worker-network-endpoints"), metadata_timeout_s, env))
                sources.append("metadata")
            except OSError as error:
                reason = getattr(error, "reason", None) or error
                info.notes.append(f"the GCE metadata server did not answer: {reason}")
    info.source = "+".join(sources) or "none"
    return info


def _fill_from_metadata(info: SliceInfo, attributes: dict[str, str]) -> None:
    tpu_env = parse_tpu_env(attributes.get("tpu-env", ""))
    info.accelerator_type = info.accelerator_type or attributes.get("accelerator-type", "").strip() or \
        tpu_env.get("ACCELERATOR_TYPE") or None
    if info.worker_id is None:
        info.worker_id = _int(attributes.get("agent-worker-number")) if "agent-worker-number" in attributes \
            else _int(tpu_env.get("WORKER_ID"))
    if not info.worker_hostnames:
        # "uid:worker:ip,uid:worker:ip" (one entry per worker, in worker order)
        endpoints = attributes.get("worker-network-endpoints", "")
        info.worker_hostnames = [entry.split(":")[-1] for entry in _hostnames(endpoints)]
    info.name = info.name or tpu_env.get("NODE_ID") or None
    info.topology = info.topology or tpu_env.get("TOPOLOGY") or None
