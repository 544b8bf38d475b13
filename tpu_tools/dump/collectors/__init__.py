"""The collectors of `tpu-dump`, in the order the manifest lists them.

Adding a source is one entry here: a `Collector(name, summary, function)`
whose function reads its source with a bounded wait (or simply blocks: the
runner stops it at --timeout) and adds files through its context.
"""

from __future__ import annotations

from tpu_tools.dump.collector import Collector
from tpu_tools.dump.collectors import accelerators, amd, diag, diagnostics, jobs, logs, nvidia, software, system

COLLECTORS: list[Collector] = [
    Collector("system.os", "OS release, kernel (uname), machine vendor and model", system.collect_os),
    Collector("system.uptime", "uptime and load averages", system.collect_uptime),
    Collector("system.cpu", "CPU model, sockets, cores, usable CPUs, NUMA nodes, /proc/cpuinfo", system.collect_cpu),
    Collector("system.memory", "memory, swap and huge pages (/proc/meminfo)", system.collect_memory),
    Collector("system.disks", "mounted filesystems with size and free space", system.collect_disks),
    Collector("system.cgroup", "cgroup limits (memory, CPU, pids) and OOM kills", system.collect_cgroup),
    Collector("system.container", "whether this runs in a container, and which kind", system.collect_container),
    Collector("system.cmdline", "the kernel command line", system.collect_cmdline),
    Collector("system.modules", "loaded kernel modules for accelerators (vfio, accel, nvidia, amdgpu, ...)",
              system.collect_modules),
    Collector("system.pci", "PCI functions of accelerators with driver, NUMA node and link", system.collect_pci),
    Collector("accelerators.discovery", "chips, device nodes with permissions, holders (passive, opens nothing)",
              accelerators.collect_discovery),
    Collector("accelerators.runtime", "PJRT device listing and a probe run, in an isolated child",
              accelerators.collect_runtime, starts_first=True),
    Collector("accelerators.nvml", "NVIDIA GPUs through NVML: memory, utilization, power, clocks, clock event "
              "reasons, ECC errors, remapped rows, PCIe and NVLink, processes", nvidia.collect_nvml),
    Collector("accelerators.nvidia_smi", "the output of nvidia-smi -q, where nvidia-smi is installed",
              nvidia.collect_nvidia_smi),
    Collector("accelerators.amdsmi", "AMD GPUs through amdsmi: VRAM, activity, temperatures, power, energy, clocks, "
              "ECC errors, PCIe, processes", amd.collect_amdsmi),
    Collector("accelerators.amd_smi", "the output of amd-smi static and amd-smi metric, where amd-smi is installed",
              amd.collect_amd_smi),
    Collector("accelerators.libtpu", "the running job's runtime metrics and per-core runtime status from libtpu's "
              "metrics services (localhost:8431, TPU_RUNTIME_METRICS_PORTS, --metrics-addr)", jobs.collect_libtpu),
    Collector("accelerators.agents", "a snapshot of every running workload of this user with the tpu-tools agent "
              "(devices, memory, compiles and recompiles, steps, goodput), and the summaries of jobs that ended",
              jobs.collect_agents),
    Collector("accelerators.diag", "the last tpu-diag result of this host (verdict per test and device, coverage)",
              diag.collect_diag),
    Collector("software.python", "Python version, executable and path", software.collect_python),
    Collector("software.packages", "installed distributions with versions", software.collect_packages),
    Collector("software.stack", "jax, jaxlib, libtpu and PJRT plugin versions, paths, and whether they agree",
              software.collect_stack),
    Collector("software.env", "environment variables of the stack (JAX_*, XLA_*, TPU_*, ...), of this process "
              "and of device holders", software.collect_env),
    Collector("software.compile_cache", "the compilation cache folder: size, entries, owner, writable",
              software.collect_compile_cache),
    Collector("software.xla_dump", "the XLA dump folder (--xla_dump_to), size-capped", software.collect_xla_dump),
    Collector("logs.libtpu", "the end of libtpu's logs in /tmp/tpu_logs", logs.collect_libtpu_logs),
    Collector("logs.libtpu_diagnostics", "libtpu's stall and crash files (tpu_stall_summary_*.pb, tpu_core_dump_*.bin, "
              "tpu_compiler_metadata_*.pb), size-capped, decoded by libtpu's SDK in a child where it is installed",
              diagnostics.collect_libtpu_diagnostics),
    Collector("logs.kernel", "kernel messages about accelerator drivers, IOMMU, PCIe, OOM and hangs",
              logs.collect_kernel_log),
    Collector("logs.added", "files and folders named with --add, size-capped", logs.collect_added),
]


def collector_names() -> list[str]:
    return [c.name for c in COLLECTORS]
