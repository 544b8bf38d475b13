"""`tpu-monitor`: a complete JSON report every period (JSON Lines), or Prometheus /metrics."""

from __future__ import annotations

import queue
import re
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource

from tpu_tools.cli.common import ToolCommand, common_options, metrics_options, run_cli
from tpu_tools.cli.params import Count, Duration, Number, PathParam
from tpu_tools.errors import EXIT_OK, UsageError
from tpu_tools.metrics.rundir import MAX_PID
from tpu_tools.parsing import MIN_PERIOD_S

if TYPE_CHECKING:
    from tpu_tools.cli.monitor_config import MonitorConfig
    from tpu_tools.exporter.selection import MetricSelection
    from tpu_tools.exporter.webconfig import WebConfig
    from tpu_tools.metrics.groups.base import CollectOptions
    from tpu_tools.metrics.report import ReportBuilder

MAN_SECTIONS = {
    "DESCRIPTION": (
        "Every period, tpu-monitor writes one complete report as one line of JSON on stdout (JSON Lines), "
        "so a pipeline can read it line by line; --count N stops after N reports. Each report has groups: "
        "host (CPU, memory, load), devices (accelerators from passive discovery with the processes holding "
        "them, and runtime figures from agents and libtpu), processes (one entry per process running the "
        "tpu-tools agent), libtpu (the figures of libtpu's runtime metrics services) and nvml (NVIDIA GPUs as "
        "the driver's NVML reports them: every tpu-ls --json nvml field, processes with their agent's tag, "
        "device_key pairing each GPU with the devices group, whose entries get the card's memory, utilization "
        "and, in extra, temperature_celsius, power_draw_watts and the rest; error says why NVML cannot be read on a "
        "host with NVIDIA GPUs, notes[] says it on a host without any; "
        "each read within --metrics-timeout, a GPU whose NVML calls hang is not_answering), amdsmi (AMD GPUs as "
        "amdsmi reports them, with the tpu-tools[amd] extra: the same as nvml, the fields amdsmi lacks null, "
        "extra.gpu_status in the devices group), diag (the last tpu-diag result of this host: last {time, "
        "age_s, level, platform, status, failed_checks, checks[]} or null, extra.diag_status and diag_age_s in "
        "the devices group) and workload (what "
        "the job and the node serve besides: the Orbax and Grain families of the job's Prometheus endpoint, "
        "endpoints[] {address, sources, error, families[]}, and on a Kubernetes node GKE's TPU device plugin, "
        "device_plugin {address, error, accelerators[] with their pod}). "
        "Each group carries its own error field: a group that fails is reported "
        "as such and the rest of the report is still complete. With no accelerator and no agent the report is "
        "still valid (empty lists).\n"
        "tpu-monitor never opens an accelerator runtime itself (a TPU belongs to one process): devices come "
        "from sysfs, /dev and /proc, and runtime figures from the agents inside the jobs. Start a job with "
        "the agent with `python -m tpu_tools.agent [--tag T] script.py args...` or `tpu_tools.agent.start()`.\n"
        "On a TPU VM, the job's libtpu serves runtime metrics over gRPC: localhost:8431, every port in "
        "TPU_RUNTIME_METRICS_PORTS, and each --metrics-addr are read every period, on one channel per address "
        "kept for the whole run, each call within --metrics-timeout. The libtpu group lists each service's "
        "figures; HBM used and total and the TensorCore duty cycle also go to the devices group (paired with the "
        "chips in order, as tpu-ls pairs them), hence to tpu-top and Prometheus. A metric that a libtpu version "
        "does not serve is listed in not_served_metrics and its figures are null. When no service answers, the "
        "libtpu group's error says why and the rest of the report is unchanged; a service that hangs costs at "
        "most the deadline per period; one that stops and comes back is read again.\n"
        "Agents are found in the per-user runtime directory (mode 0700, sockets 0600) and asked in parallel, "
        "each within --agent-timeout; one that hangs or answers garbage gets an entry with its error and the "
        "others are unaffected. Processes that exit disappear from the next report; their leftover sockets are "
        "removed. Sockets that are not this user's or not private are listed under ignored_sockets and never "
        "used.\n"
        "SIGTERM and SIGINT end tpu-monitor after the line being written is complete, with status 0; a closed "
        "stdout pipe ends it quietly with status 141."
    ),
    "JSON OUTPUT": (
        "Each line is one document, schema \"tpu-tools/monitor/v1\". Units are in key names; unknown values "
        "are null. Top level: schema, time (UTC, ISO 8601), time_unix_s, hostname, sequence (0, 1, ...), "
        "tpu_tools_version, and one object per group. Every group has period_s (null: every report), "
        "sampled_at (when its figures were taken; a group with a longer period repeats them) and error (null "
        "or a sentence).\n"
        "host: hostname, cpu_count, cpu_percent, memory_total_bytes, memory_used_bytes, memory_available_bytes, "
        "swap_total_bytes, swap_used_bytes, load_average_1m, load_average_5m, load_average_15m, uptime_s.\n"
        "devices: devices[] {key (tpu:0, gpu:1, or cpu:0@PID for a process's own device), platform, id, name, "
        "chip_index, pci_address, memory_used_bytes, memory_total_bytes, memory_peak_bytes, live_array_bytes, "
        "live_array_count, utilization_percent, holders[] {pid, user, command, frontend (null here: "
        "processes.agents[] names an agent's)}, holders_source (nvml or amdsmi: the "
        "processes the GPU's driver lists; device_nodes: the processes holding its device node open, where no "
        "driver list was read; tpu-ls, tpu-monitor, tpu-top and tpu-dump are never holders), processes[] {pid, tag}, "
        "sources[] (discovery, agent, libtpu), extra {name: value}}; chips[] (as in tpu-ls --json); notes[]. "
        "From libtpu: memory_used_bytes and memory_total_bytes (HBM), utilization_percent (TensorCore duty cycle, "
        "of the chip when the runtime keys it by chip), and extra hbm_bandwidth_utilization_percent, "
        "tensorcore_idle_duration_seconds and hlo_queue_size where served.\n"
        "processes: agents[] {pid, tag, user, command, error, socket, uptime_s, jax_version, frontend (jax or "
        "torch_xla: the library that runs the job's programs), frontend_version, platform, "
        "cpu_percent, cpu_time_s, rss_bytes, threads, device_memory_used_bytes, live_array_bytes, "
        "live_array_count, devices[] {id, platform, device_kind, memory_used_bytes, memory_peak_bytes, "
        "memory_limit_bytes, live_array_bytes, live_array_count}, compiles {compile_count, recompile_count, "
        "trace_count, trace_time_s, lowering_time_s, backend_compile_time_s, cache_hits, cache_misses, "
        "in_memory_cache_hits (torch_xla's CachedCompile), functions[] {name, compile_count, recompile_count, "
        "trace_count, trace_time_s, lowering_time_s, "
        "backend_compile_time_s, cache_hits, cache_misses, last_recompile_reason}, recent_recompiles[] "
        "{function, time_unix_s, compile_count, backend_compile_time_s, reason}}, executions {count, time_s}, "
        "transfers {to_device, from_device: {count, time_s, bytes}}, cpu_fallbacks {total, ops[] {op, count}} "
        "(torch_xla's figures, null for JAX; docs/torch-xla.md), startup[] {check, message, fix} (the startup "
        "contract a torch_xla job broke), steps {count, "
        "steps_per_second, last_step_time_s, p50_step_time_s, p99_step_time_s, last_step_age_s}, "
        "goodput {started_unix_s, steps, median_step_time_s, idle_threshold_s, step_flops, step_flops_source "
        "(given, xla_cost_analysis or xla_step_programs), step_programs[] {name, flops}, "
        "since_start and recent {wall_s, goodput_percent, causes_s {cause: seconds}, causes_percent, flops, "
        "samples, flops_per_s, mfu_percent, samples_per_s, cost_per_million_samples}, window_s, rejected "
        "{what: count}, last_error, peak_flops_per_s, peak_source, price_per_hour, price_source (job or "
        "monitor: --price-per-hour), problems[]} (docs/goodput.md; unknown figures are null), "
        "process_index, process_count, metrics[] {name, value, step, scope, kind (replicated, local, host), "
        "devices, job_devices, time_unix_s, suspect} (what the job published with tpu_tools.agent.metric), "
        "metrics_rejected, metrics_error, compilation_cache {dir_configured, dir_in_use, lookups, hits, misses, "
        "entries_written, seconds_saved_s, recent_misses[] {module, key, differing[], explanation}, set_too_late[] "
        "{setting, in_effect, now, message}} (docs/cache.md), job {id, source, worker, log, step, "
        "last_checkpoint_step, log_error} (the job across restarts, see JOB; null without one), query_time_s, "
        "kubernetes, slurm_job_id}; "
        "global_metric_findings[] {tag, name, step, reason, workers[] {host, pid, process_index, value, kind, step}} "
        "(a metric published as global that "
        "lives on only some of the job's devices, or differs between the workers of a job at the same step); "
        "shared_cache_dirs[] {dir, writers[] {pid, tag, host, entries_written}, hosts[], message}: a compilation "
        "cache written by more than one process; "
        "jobs[] {job, log, state, processes, last_step, goodput {as --job's}, error}: the jobs across restarts "
        "the agents name, read from their logs; "
        "holders[] {pid, user, command, chips[], cpu_percent, cpu_time_s, rss_bytes, threads, kubernetes, "
        "slurm_job_id} (device holders without an agent); slurm_job_id is SLURM_JOB_ID from the process's "
        "environment where it can be read, else null; ignored_sockets[] {socket, reason}; "
        "pod_labels_error. kubernetes is null or {namespace, pod, container}: the container that holds the "
        "process's chips according to the kubelet's pod-resources API "
        "(/var/lib/kubelet/pod-resources/kubelet.sock, or TPU_TOOLS_POD_RESOURCES_SOCKET), or that shares the "
        "process's cgroup container with such a process; pod_labels_error says why no process could be placed "
        "(no socket, no answer within --agent-timeout, or with --pod-labels the Kubernetes API's refusal), and "
        "--debug writes it on stderr. With --pod-labels, kubernetes also has labels {label_KEY: value}: the "
        "pod's own Kubernetes labels (at most 32, values cut at 128 characters), read from the API server "
        "with the service account's token once a minute per pod.\n"
        "libtpu: error (null when any address answered, else each address's sentence), services[] (one per "
        "address, as libtpu_metrics[] of tpu-ls --json: {address, error, elapsed_ms, served_metrics[], "
        "not_served_metrics[], unread_metrics[], duty_cycle_scope, devices[] {device_id, hbm_used_bytes, "
        "hbm_total_bytes, duty_cycle_percent, hbm_bandwidth_utilization_percent, tensorcore_idle_duration_s, "
        "hlo_queue_size, hlo_execution_time_us}, transfer_latencies[] {metric, name, buffer_size, latency_us}, "
        "notes[]}; hlo_execution_time_us and latency_us are null or {count, mean, min, max, p50, p90, p99, p999}), "
        "notes[] (service devices that could not be paired with this host's chips)."
    ),
    "CONFIGURATION": (
        "--config FILE (TOML, or JSON when the name ends in .json) chooses groups, periods and agents; each key "
        "but groups is the default of the option of its name, and an option given on the command line wins:\n"
        "period = \"1s\"  seconds between reports (a number, or with ms, s, m, h); --period overrides it.\n"
        "tag_filter = \"^train\"  only agents whose tag matches this regular expression; --tag-filter "
        "overrides it.\n"
        "agent_timeout = 1.0  seconds to wait for each agent.\n"
        "metrics_addr = [\"localhost:8432\"]  libtpu metrics services to read besides localhost:8431 and "
        "TPU_RUNTIME_METRICS_PORTS (an address or a list); --metrics-addr overrides it.\n"
        "metrics_timeout = \"500ms\"  deadline of every call to them; --metrics-timeout overrides it.\n"
        "price_per_hour = 4.2  price of this machine per hour, for the cost per 1M samples of jobs that set no "
        "price (a number > 0, not text); --price-per-hour overrides it.\n"
        "[groups.host] period = \"5s\"  one table per group to report (host, devices, processes, libtpu, nvml, "
        "amdsmi, diag); "
        "groups not "
        "listed are left out; a group's period (not shorter than the report period) says how often its figures "
        "are taken again. groups = [\"host\", \"processes\"] is accepted too.\n"
        "[prometheus] allow = [\"tpu_tools_device_*\"], deny = [\"tpu_tools_gpu_process_*\"]  the families "
        "--prometheus serves: names or globs (* ? [ ]), a counter by its name with or without _total; no allow "
        "list serves every family, deny wins; --allow-metric and --deny-metric replace the file's lists.\n"
        "Unknown keys or groups, bad periods and bad regular expressions are errors (exit 2)."
    ),
    "PROMETHEUS": (
        "--prometheus [HOST:]PORT serves the figures of the latest report at http://HOST:PORT/metrics in the "
        "Prometheus text format (HOST defaults to 127.0.0.1; HEAD answers like GET without the body). Metric "
        "names start with tpu_tools_ and end in their base unit (seconds, bytes, ratios from 0 to 1); "
        "distributions are histograms; a family without samples is not served; series of processes that exit "
        "disappear. A port in use is an error (exit 1). JSON lines are still written unless --quiet. The server "
        "listens before the first report is built: until then a scrape of /metrics waits for it, at most 5 s from "
        "its arrival, then gets 503 with Retry-After: 1, never a 200 with no series. "
        "The metrics:\n"
        "host: tpu_tools_host_cpu_percent, tpu_tools_host_memory_total_bytes, tpu_tools_host_memory_used_bytes, "
        "tpu_tools_host_memory_available_bytes, tpu_tools_host_swap_used_bytes, tpu_tools_host_load_average "
        "(label window).\n"
        "devices (labels device, platform, name): tpu_tools_device_memory_used_bytes, "
        "tpu_tools_device_memory_total_bytes, tpu_tools_device_live_array_bytes, "
        "tpu_tools_device_utilization_ratio (TPU duty cycle, GPU utilization), tpu_tools_device_holder_processes "
        "(with a holders_source label), "
        "and, on TPUs, tpu_tools_device_NAME for each extra figure a source reports (a percent as NAME_ratio).\n"
        "processes (labels pid, tag, command with --process-command-label, and namespace, pod, container where a "
        "process runs in a Kubernetes pod): "
        "tpu_tools_agent_up, tpu_tools_process_cpu_percent, "
        "tpu_tools_process_rss_bytes, tpu_tools_process_threads, tpu_tools_process_device_memory_used_bytes, "
        "tpu_tools_process_live_array_bytes, tpu_tools_process_live_arrays, tpu_tools_process_compiles_total, "
        "tpu_tools_process_recompiles_total, tpu_tools_process_compile_seconds_total (label phase), "
        "tpu_tools_process_persistent_cache_hits_total, tpu_tools_process_persistent_cache_misses_total, "
        "tpu_tools_process_steps_total, tpu_tools_process_steps_per_second, "
        "tpu_tools_process_step_time_seconds (label stat: last, p50, p99), "
        "tpu_tools_process_device_memory_used_bytes_per_device (label device), "
        "tpu_tools_process_frontend_info (labels frontend, version), and from a torch_xla job "
        "tpu_tools_process_cpu_fallbacks_total (label op: the aten:: op run on the CPU), "
        "tpu_tools_process_executions_total, tpu_tools_process_execute_seconds_total, "
        "tpu_tools_process_transfer_bytes_total and tpu_tools_process_transfer_seconds_total (label direction: "
        "to_device, from_device); for a job whose steps stopped (more than 10 times its median step and 5 s ago) "
        "tpu_tools_process_stalled_seconds and tpu_tools_process_stack_info (labels where, in_library: where its "
        "main thread is).\n"
        "goodput of each process (docs/goodput.md): the wall time by cause in "
        "tpu_tools_process_goodput_seconds_total (label cause); the goodput share, MFU, samples per second, "
        "model FLOPs per second and cost of one million samples in tpu_tools_process_goodput_ratio, "
        "tpu_tools_process_mfu_ratio, tpu_tools_process_samples_per_second, "
        "tpu_tools_process_model_flops_per_second and tpu_tools_process_cost_per_million_samples, each with "
        "the label window (since_start or recent); a figure that is unknown has no series. The job's own "
        "scalars: tpu_tools_process_metric (labels name, scope, kind) and tpu_tools_process_metric_step (labels "
        "name, scope).\n"
        "A job across restarts (see JOB): tpu_tools_process_job_info (label job_id) for each process that names "
        "its job, and from the job's log, labelled job_id: tpu_tools_job_goodput_ratio (over its whole life), "
        "tpu_tools_job_lost_progress_seconds, tpu_tools_job_lost_progress_steps, tpu_tools_job_recovery_seconds "
        "and tpu_tools_job_disruptions.\n"
        "libtpu (label address; series of a service that stops answering disappear): tpu_tools_libtpu_up, and "
        "with label device: tpu_tools_libtpu_hbm_used_bytes, tpu_tools_libtpu_hbm_total_bytes, "
        "tpu_tools_libtpu_duty_cycle_ratio, tpu_tools_libtpu_hbm_bandwidth_utilization_ratio, "
        "tpu_tools_libtpu_tensorcore_idle_duration_seconds, tpu_tools_libtpu_hlo_queue_size, and the histogram "
        "tpu_tools_libtpu_hlo_execution_time_seconds; with labels metric and buffer_size: the histogram "
        "tpu_tools_libtpu_transfer_latency_seconds; with labels metric and label: the histogram "
        "tpu_tools_libtpu_tcp_delivery_rate_bytes_per_second. Histograms have libtpu's own buckets. A figure "
        "the runtime does not serve has no series.\n"
        "nvml (names begin with tpu_tools_gpu_; labels gpu, uuid, pci_bus_id, device; the card's memory and "
        "utilization are the devices series): up (label status), memory_reserved_bytes, memory_free_bytes, "
        "memory_utilization_ratio, temperature_celsius, power_draw_watts, power_limit_watts, energy_joules_total, "
        "sm_clock_hertz, sm_clock_max_hertz, memory_clock_hertz, memory_clock_max_hertz, performance_state, "
        "clock_event_reason (label reason), ecc_volatile_uncorrected_errors, "
        "ecc_aggregate_uncorrected_errors_total, remapped_rows (label kind), remapped_rows_pending, "
        "remapped_rows_failed, pcie_link_generation, pcie_link_generation_max, pcie_link_width, "
        "pcie_link_width_max, pcie_tx_bytes_per_second, pcie_rx_bytes_per_second, nvlink_links_active, "
        "nvlink_tx_bytes_total, nvlink_rx_bytes_total, nvlink_links, nvlink_link_down (label link), "
        "nvlink_replay_errors_total, nvlink_recovery_errors_total, nvlink_crc_errors_total, "
        "pcie_replay_errors_total, fan_speed_ratio, xid_errors_total (label code: XID events counted as they "
        "arrive), xid_last_event_timestamp_seconds (labels code, description), mig_enabled, "
        "mig_instance_memory_used_bytes and mig_instance_memory_total_bytes (labels gpu_instance, "
        "compute_instance), persistence_mode; "
        "with labels pid and tag "
        "as well: process_memory_used_bytes, process_sm_utilization_ratio.\n"
        "amdsmi: the nvml series that amdsmi has figures for, under the same names with one more label, "
        "vendor=\"amd\".\n"
        "diag: tpu_tools_diag_check_status (labels test, device, link; 0 pass, 1 fail, 2 warn, 3 skip), "
        "tpu_tools_diag_failed, tpu_tools_diag_age_seconds (since the last complete run), "
        "tpu_tools_diag_last_run_timestamp_seconds, tpu_tools_diag_level, tpu_tools_diag_digest_info (labels "
        "test, device, key, digest: each GEMM digest under its comparability key).\n"
        "Every tpu_tools_device_* and tpu_tools_gpu_* series of a held device (but the per-process ones) also "
        "carries its holder's labels: tag (the agent's), namespace, pod and container (the kubelet's "
        "pod-resources API, as for process series) and slurm_job_id (SLURM_JOB_ID in the holder's "
        "environment), empty where unknown. Label values from outside are made printable (control characters "
        "become ?) and cut at 128 characters.\n"
        "tpu_tools_group_error (label group): 1 when that group failed in the latest report.\n"
        "tpu_tools_build_info (value 1; labels version (tpu-tools), jax, jaxlib and libtpu as installed beside the "
        "exporter, driver (the NVIDIA or AMD driver's version; empty on TPU hosts), platform (tpu, cuda, rocm, "
        "else cpu) and accelerator_type (the TPU slice's type, else the first accelerator's name)): what this host "
        "runs, to join on instance.\n"
        "--process-command-label adds each job's command line as the label command of its process series "
        "(whitespace folded, made printable, cut at 128 characters). It multiplies series: every distinct "
        "command is a new series of every process family, and a job whose arguments change from run to run "
        "leaves a trail of them; it is off by default.\n"
        "--web-config FILE secures the server with TLS and basic auth, in the file format of Prometheus's "
        "exporter-toolkit: tls_server_config {cert_file, key_file, client_auth_type (NoClientCert, "
        "VerifyClientCertIfGiven or RequireAndVerifyClientCert, with client_ca_file), min_version, max_version} "
        "and basic_auth_users {user: bcrypt hash}. Relative file names are relative to the file. A file that "
        "is not valid YAML, names a file that does not exist, holds a key or certificate that cannot be used, "
        "or a password instead of a bcrypt hash, is an error at start (exit 2): nothing is served in the clear "
        "by mistake. Without credentials the answer is 401."
    ),
    "FLEET": (
        "--from-prometheus URL reports every host that a Prometheus server scrapes (each running tpu-monitor "
        "--prometheus) instead of this host: the same report, built from the server's HTTP API every period. "
        "Hosts are told apart by the instance label (CLUSTER/INSTANCE where series carry a cluster label: many "
        "clusters writing to one store); device keys become INSTANCE/tpu:0 and every device and "
        "agent carries a host field. A fleet group adds hosts[] {host, up, cluster, chips, utilization_percent, "
        "memory_used_bytes, memory_total_bytes, jobs, steps_per_second, step_time_s, recompiles, goodput_percent "
        "(the median of its jobs' recent goodput), outlier}, global_metric_findings (how many; the findings are "
        "in processes.global_metric_findings, the workers of a job compared across hosts), "
        "hosts_down[], median_utilization_percent, median_step_time_s and outliers[] (the host furthest from "
        "the median duty cycle or step time when at least three hosts of a cluster report it: the slow worker "
        "of a slice), clusters[], silent_clusters[] (no sample for 120 s) and detail_hosts (above 64 hosts, "
        "with deploy/prometheus/records.yml loaded, the hosts whose chips and jobs were read; else null). "
        "user:password@ in the URL is sent as basic auth. When the server is down, slow (beyond "
        "--from-prometheus-timeout), answers garbage or refuses the credentials, the last report is repeated "
        "with fleet.stale true and fleet.error saying why, and the sentence is written once on stderr. Options "
        "that only apply to this host (--config, --prometheus, --quiet, --tag-filter, --agent-timeout, "
        "--metrics-addr) are usage errors with it."
    ),
    "JOB": (
        "--job JOB prints one JSON document, schema \"tpu-tools/job/v1\", the job's goodput over its whole life "
        "from its log in $TPU_TOOLS_JOB_DIR (else <runtime dir>/jobs), which every process of the job with the "
        "agent appends to (python -m tpu_tools.agent --job JOB, or $TPU_TOOLS_JOB, or found: the Kubernetes JobSet "
        "or Job, the Slurm job): schema, job, log, malformed_lines, truncated, state (running, silent, died or ended), "
        "started_unix_s, last_seen_unix_s, last_step, processes, goodput {wall_s, goodput_percent, causes_s (the "
        "processes' causes, plus lost_progress, down: no process ran, unreported: not in a process's last "
        "figures), disruptions, lost_progress_steps, lost_progress_s, recovery_s}, disruptions[] {index, "
        "died_unix_s, recovered_unix_s, lost_progress_steps, lost_progress_s, recovery_s}, hosts[] {host (the "
        "worker, else the host name), host_names, goodput, processes[] {process, host_name, pid, state, "
        "started_unix_s, first_step_unix_s, last_seen_unix_s, restored_step, last_step, checkpoints, "
        "last_checkpoint_step, ended_unix_s, died_unix_s, lost_progress_steps, lost_progress_s, recovery_s, "
        "successor}}. A job with no log is an error (exit 2) naming the jobs there; a directory or log that "
        "cannot be read, exit 1."
    ),
    "EXAMPLES": (
        "tpu-monitor --count 3\n"
        "tpu-monitor --period 0.5 | jq -c '.processes.agents[] | {tag, steps: .steps.steps_per_second}'\n"
        "tpu-monitor --config monitor.toml --prometheus 9100 --quiet\n"
        "tpu-monitor --prometheus 0.0.0.0:9400 --web-config /etc/tpu-tools/web.yml --quiet\n"
        "tpu-monitor --count 1 --metrics-addr localhost:8432 | jq '.libtpu.services[].devices'\n"
        "python -m tpu_tools.agent --tag train train.py & tpu-monitor --tag-filter '^train$' --count 1\n"
        "tpu-monitor --from-prometheus http://prometheus:9090 --count 1 | jq '.fleet.outliers'\n"
        "tpu-monitor --count 1 --price-per-hour 4.2 | jq '.processes.agents[].goodput.recent'\n"
        "tpu-monitor --jobs-ended | jq '.jobs[] | {tag, goodput: .goodput.since_start.goodput_percent}'\n"
        "tpu-monitor --job train-llm | jq '.goodput | {goodput_percent, lost_progress_s, recovery_s}'"
    ),
}


class Regex(click.ParamType):
    name = "regex"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> re.Pattern[str]:
        if isinstance(value, re.Pattern):
            return value
        try:
            return re.compile(value)
        except re.error as error:
            self.fail(f"{value!r} is not a valid regular expression: {error}", param, ctx)


def explicit(ctx: click.Context, name: str) -> bool:
    """Whether the option was given on the command line, not left to its default or to --config's."""
    return ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP, None)


def option_defaults(config: MonitorConfig) -> dict[str, Any]:
    """The config file's values under the names of the options whose defaults they become."""
    values = {"period": config.period_s, "tag_filter": config.tag_filter, "agent_timeout": config.agent_timeout_s,
              "metrics_addr": config.metrics_addr, "metrics_timeout_s": config.metrics_timeout_s,
              "price_per_hour": config.price_per_hour, "allow_metrics": config.metrics_allow,
              "deny_metrics": config.metrics_deny}
    return {name: value for name, value in values.items() if value is not None}


def load_config_defaults(ctx: click.Context, param: click.Parameter, path: Path | None) -> MonitorConfig | None:
    """--config, read before the other options (it is eager): its values become their defaults (click's
    default_map), so an option given on the command line wins. A bad file is a usage error naming it."""
    if path is None or ctx.resilient_parsing:
        return None
    from tpu_tools.cli.monitor_config import load_config
    from tpu_tools.metrics.groups import GROUPS

    config = load_config(path, list(GROUPS))
    ctx.default_map = {**(ctx.default_map or {}), **option_defaults(config)}
    return config


@click.command(name="monitor", cls=ToolCommand, man_sections=MAN_SECTIONS)
@click.option("--period", type=Duration(minimum=MIN_PERIOD_S), default="1s", show_default=True, metavar="SECONDS",
              help="Time between reports (seconds, or with ms, s, m: 500ms, 2s).")
@click.option("--count", type=Count(1, 1 << 62), default=None, metavar="N",
              help="Exit after N reports (default: run until stopped).")
@click.option("--config", "config", type=PathParam(dir_okay=False, readable=True), default=None, is_eager=True,
              callback=load_config_defaults, metavar="FILE",
              help="TOML or JSON file choosing groups, their periods and a tag filter.")
@click.option("--tag-filter", type=Regex(), default=None, metavar="REGEX",
              help="Only agents whose tag matches this regular expression.")
@click.option("--agent-timeout", type=Duration(), default="1s", show_default=True, metavar="SECONDS",
              help="How long to wait for each agent's answer.")
@click.option("--prometheus", "prometheus_address", default=None, metavar="[HOST:]PORT",
              help="Also serve the figures at http://HOST:PORT/metrics (HOST defaults to 127.0.0.1).")
@click.option("--quiet", "-q", is_flag=True, help="With --prometheus: do not write JSON lines on stdout.")
@click.option("--web-config", "web_config_path", type=PathParam(dir_okay=False, readable=True), default=None,
              metavar="FILE", help="With --prometheus: TLS and basic auth from this file (exporter-toolkit format).")
@click.option("--from-prometheus", "from_prometheus", default=None, metavar="URL",
              help="Report every host that this Prometheus server scrapes instead of this host.")
@click.option("--from-prometheus-timeout", type=Duration(), default="2s", show_default=True, metavar="SECONDS",
              help="Deadline of each query to the --from-prometheus server.")
@click.option("--arrays", "arrays_pid", type=Count(1, MAX_PID), default=None, metavar="PID",
              help="Print the largest live arrays of the JAX job PID (by shape, dtype and sharding) and the source "
                   "lines that allocated its device memory, as one JSON document (tpu-tools/arrays/v1); then exit.")
@click.option("--pod-labels", is_flag=True,
              help="Add the Kubernetes labels of the pod that holds a device to its series (label_KEY), read "
                   "with the service account (RBAC: deploy/kubernetes/optional/pod-labels-rbac.yaml).")
@click.option("--process-command-label", is_flag=True,
              help="With --prometheus: add each job's command line (whitespace folded, made printable, cut to 128 "
                   "characters) as a `command` label of its process series. Every distinct command is a new series "
                   "of every process family: off by default.")
@click.option("--allow-metric", "allow_metrics", multiple=True, metavar="GLOB",
              help="With --prometheus: serve only the families matching these names or globs (repeatable, or "
                   "comma-separated).")
@click.option("--deny-metric", "deny_metrics", multiple=True, metavar="GLOB",
              help="With --prometheus: never serve the families matching these names or globs (repeatable).")
@click.option("--list-metrics", is_flag=True,
              help="Print one JSON document listing every family the exporter can serve (type, unit, help, "
                   "whether the allow and deny lists serve it), and the metrics every libtpu metrics service and "
                   "agent serves and what tpu-tools reads of them (schema tpu-tools/list-metrics/v1); then exit.")
@click.option("--price-per-hour", type=Number(above=0.0, maximum=1e9), default=None, metavar="PRICE",
              help="Price of this machine per hour: the jobs' cost per 1M samples where the job does not set "
                   "one (overrides price_per_hour of --config).")
@click.option("--jobs-ended", is_flag=True,
              help="Print the summaries that jobs with the agent left when they ended (schema "
                   "tpu-tools/jobs-ended/v1), newest first; then exit.")
@click.option("--job", "job", default=None, metavar="JOB",
              help="Print the goodput of job JOB over its whole life, across its processes' restarts and hosts, "
                   "from its log in $TPU_TOOLS_JOB_DIR (schema tpu-tools/job/v1: lost progress, recovery, per host); "
                   "then exit.")
@metrics_options
@common_options
@click.pass_context
def monitor_command(ctx: click.Context, period: float, count: int | None, config: MonitorConfig | None,
                    tag_filter: re.Pattern[str] | None, agent_timeout: float, prometheus_address: str | None,
                    quiet: bool, web_config_path: Path | None, from_prometheus: str | None,
                    from_prometheus_timeout: float, arrays_pid: int | None, pod_labels: bool,
                    process_command_label: bool, allow_metrics: tuple[str, ...], deny_metrics: tuple[str, ...],
                    list_metrics: bool,
                    price_per_hour: float | None, jobs_ended: bool, metrics_addresses: list[str],
                    metrics_timeout_s: float, job: str | None) -> int:
    """Report host, device and agent figures every period as JSON Lines, or for Prometheus."""
    if job is not None:
        from tpu_tools.cli.monitor_job import print_job
        from tpu_tools.cli.output import Output

        return print_job(job, Output("json", sys.stdout))
    if jobs_ended:
        return _jobs_ended()
    if from_prometheus is not None:
        return _fleet(ctx, from_prometheus, from_prometheus_timeout, period, count)
    if arrays_pid is not None:
        return _arrays(arrays_pid, agent_timeout)
    # the config file's [prometheus] lists are defaults, never a mistake without --prometheus
    selecting = (explicit(ctx, "allow_metrics") or explicit(ctx, "deny_metrics")) and not list_metrics
    _refuse_without_prometheus(prometheus_address is not None, quiet=quiet, web_config=web_config_path is not None,
                               command_label=process_command_label, selecting=selecting)
    from tpu_tools.exporter.selection import MetricSelection, parse_globs

    selection = MetricSelection(parse_globs(allow_metrics, "--allow-metric"),
                                parse_globs(deny_metrics, "--deny-metric"))
    web_config = None
    if web_config_path is not None:
        from tpu_tools.exporter.webconfig import load_web_config

        web_config = load_web_config(web_config_path)  # every mistake in it stops us here, before serving
    if list_metrics:
        return _list_metrics(metrics_addresses, metrics_timeout_s, agent_timeout, selection)
    from tpu_tools.metrics.groups.base import CollectOptions

    options = CollectOptions(agent_timeout_s=agent_timeout, tag_filter=tag_filter,
                             metrics_addresses=metrics_addresses, metrics_timeout_s=metrics_timeout_s,
                             price_per_hour=price_per_hour, pod_labels=pod_labels)
    builder = _report_builder(config, options, period)
    try:
        if prometheus_address is None:
            _loop(builder, period, count, None, False)
        else:
            _serve(builder, period, count, prometheus_address, web_config, selection, process_command_label, quiet)
    finally:
        builder.close()
    return EXIT_OK


def _refuse_without_prometheus(serving: bool, *, quiet: bool, web_config: bool, command_label: bool,
                               selecting: bool) -> None:
    """The options of the exporter given without --prometheus (the allow and deny lists also serve
    --list-metrics): usage errors, never silently ignored."""
    if serving:
        return
    if quiet:
        raise UsageError("--quiet only makes sense with --prometheus (otherwise nothing would be reported)")
    if web_config:
        raise UsageError("--web-config only makes sense with --prometheus (it secures the /metrics server)")
    if command_label:
        raise UsageError("--process-command-label only makes sense with --prometheus (it labels its series)")
    if selecting:
        raise UsageError("--allow-metric and --deny-metric only make sense with --prometheus or --list-metrics")


def _jobs_ended() -> int:
    """--jobs-ended: the summaries that ended jobs left, as one JSON document."""
    from tpu_tools.cli.jobs_ended import print_jobs_ended
    from tpu_tools.cli.output import Output

    return print_jobs_ended(Output("json", sys.stdout))


def _list_metrics(addresses: list[str], timeout_s: float, agent_timeout: float, selection: MetricSelection) -> int:
    """--list-metrics: every family the exporter can serve and what each source serves, as one JSON document."""
    from tpu_tools.cli.list_metrics import list_metrics
    from tpu_tools.cli.output import Output

    return list_metrics(addresses, timeout_s, agent_timeout, Output("json", sys.stdout), selection)


def _report_builder(config: MonitorConfig | None, options: CollectOptions, period: float) -> ReportBuilder:
    """The builder of this host's reports: every group, or the config file's groups with their periods."""
    from tpu_tools.metrics.groups import GROUPS
    from tpu_tools.metrics.report import GroupPlan, ReportBuilder

    plan = [GroupPlan(name) for name in GROUPS]
    if config is not None and config.groups is not None:
        plan = [GroupPlan(name, group.period_s) for name, group in config.groups.items()]
    return ReportBuilder(plan, options, report_period_s=period)


def _serve(builder: ReportBuilder, period: float, count: int | None, address: str, web_config: WebConfig | None,
           selection: MetricSelection, command_label: bool, quiet: bool) -> None:
    """--prometheus: serve each report at /metrics (with TLS and basic auth from --web-config), and write it as a
    JSON line unless --quiet."""
    from tpu_tools.exporter.prometheus import ReportCollector, exporters_for, parse_listen_address, serve

    host, port = parse_listen_address(address)
    exporter = ReportCollector(exporters_for(builder.collectors, command_label), selection)
    if web_config is not None:
        from tpu_tools.exporter.webserver import serve_secure

        serve_secure(exporter, host, port, web_config)
    else:
        serve(exporter, host, port)
    _loop(builder, period, count, exporter, quiet)


def _arrays(pid: int, agent_timeout: float) -> int:
    """--arrays PID: ask that job's agent once (the agent reads its arrays on this request only)."""
    import json

    import msgspec

    from tpu_tools.errors import RuntimeFailure
    from tpu_tools.metrics import wire
    from tpu_tools.metrics.agent_client import AgentQueryError, query_snapshot

    try:
        answer = query_snapshot(pid, max(agent_timeout, 10.0), request=wire.REQUEST_ARRAYS)
    except AgentQueryError as error:
        raise RuntimeFailure(f"--arrays {pid}: {error}") from None
    if answer.arrays_report is None:
        raise RuntimeFailure(f"--arrays {pid}: {answer.arrays_error or 'the agent read no arrays'}")
    document = {"schema": "tpu-tools/arrays/v1", "pid": pid, "tag": answer.tag,
                **msgspec.to_builtins(answer.arrays_report)}
    sys.stdout.write(json.dumps(document) + "\n")
    return EXIT_OK


def _fleet(ctx: click.Context, url: str, timeout_s: float, period: float, count: int | None) -> int:
    """--from-prometheus: the reports of every host from a Prometheus server, as JSON Lines."""
    local = [f"--{name.replace('_', '-')}" for name in ("config", "prometheus_address", "quiet", "tag_filter",
                                                          "agent_timeout", "metrics_addr")
             if explicit(ctx, name)]
    if local:
        names = ", ".join("--prometheus" if n == "--prometheus-address" else n for n in local)
        raise UsageError(f"--from-prometheus reads the figures Prometheus holds; {names} only apply to this host")
    from tpu_tools.metrics.fleet.source import FleetSource

    source = FleetSource(url, timeout_s)
    try:
        _loop(source, period, count, None, False)
    finally:
        source.close()
    return EXIT_OK


def _loop(builder: Any, period: float, count: int | None, exporter: Any, quiet: bool) -> None:
    from tpu_tools.cli.output import Output

    stop = threading.Event()

    def request_stop(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    from tpu_tools.cli.common import is_debug

    out = Output("json", sys.stdout)
    next_report = time.monotonic()
    written = 0
    pods_reason = None
    last_fleet_error = None
    rounds = RoundThread(builder)
    while not stop.is_set():
        report = rounds.build_unless_stopped(stop)
        if report is None:
            break
        reason = report.processes.pod_labels_error if report.processes is not None else None
        if reason != pods_reason and reason and is_debug():  # why process metrics carry no pod labels
            sys.stderr.write(f"tpu-monitor: no pod labels: {reason}\n")
        pods_reason = reason
        fleet_error = report.fleet.error if report.fleet is not None else None
        if fleet_error != last_fleet_error and fleet_error:  # --from-prometheus: one line each time it changes
            sys.stderr.write(f"tpu-monitor: {fleet_error} (repeating the last figures, marked stale)\n")
        last_fleet_error = fleet_error
        if exporter is not None:
            exporter.update(report)
        if not quiet:
            out.json_line(report)  # one write per line: a signal never cuts a line in half
        written += 1
        if count is not None and written >= count:
            break
        next_report += period
        now = time.monotonic()
        if next_report < now:  # a slow round: keep the period, do not catch up in a burst
            next_report = now
        stop.wait(next_report - now)


class RoundThread:
    """Runs builder.build() on one daemon thread kept for the whole run, and hands each report to the main thread,
    which gives up waiting as soon as `stop` is set: a hung libtpu service, agent or Prometheus holds a round up to
    its timeout (up to minutes), and Ctrl-C or SIGTERM must not wait for it. One thread for every round rather
    than a new one each time: at 10 reports a second, starting a thread cost more CPU than handing a round over."""

    def __init__(self, builder: Any):
        self._builder = builder
        self._asked: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._built: queue.SimpleQueue[tuple[Any, BaseException | None]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        while True:
            self._asked.get()
            try:
                self._built.put((self._builder.build(), None))
            except BaseException as error:  # noqa: BLE001 handed to the main thread, which raises it as before
                self._built.put((None, error))

    def build_unless_stopped(self, stop: threading.Event) -> Any:
        """The next report, or None as soon as `stop` is set."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="tpu-monitor-round", daemon=True)
            self._thread.start()
        self._asked.put(None)
        while True:
            try:
                report, error = self._built.get(timeout=0.05)
            except queue.Empty:
                if stop.is_set():
                    return None
                continue
            if error is not None:
                raise error
            return report


def main() -> None:
    run_cli(monitor_command)
