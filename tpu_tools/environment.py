"""Every environment variable the toolkit reads, declared once: its name, the kind of value, what it means and
which programs read it.

Base layer. The man pages' ENVIRONMENT sections and docs/environment.md are generated from this table
(tools/gen_docs.py), and tests/test_environment.py fails when code reads a TPU_TOOLS_* variable that is not
declared here, or declares one no code reads. `internal` variables are set by the toolkit for the programs it
starts itself; they are listed, so that nothing read is undocumented, but are not for users to set.
"""

from __future__ import annotations

from dataclasses import dataclass

ALL = "every program"
AGENT = "the agent"  # tpu_tools.agent.start() in a job, or python -m tpu_tools.agent

# The programs the man pages are written for, as the console scripts name them.
PROGRAMS = ("tpu-ls", "tpu-monitor", "tpu-top", "tpu-bench", "tpu-profile", "tpu-collectives-test", "tpu-dump",
            "tpu-diag")
_READERS_OF_DEVICES = ("tpu-ls", "tpu-monitor", "tpu-top", "tpu-dump", "tpu-diag")
_READERS_OF_SERVICES = ("tpu-ls", "tpu-monitor", "tpu-top", "tpu-dump")


@dataclass(frozen=True)
class Variable:
    name: str
    kind: str  # the value's form, as a user writes it
    meaning: str  # one sentence or two, what setting it does
    readers: tuple[str, ...]  # program names, ALL or AGENT
    internal: bool = False  # set by the toolkit for a program it starts

    def read_by(self, program: str) -> bool:
        return ALL in self.readers or program in self.readers or (program == "tpu-tools" and not self.internal)


VARIABLES: tuple[Variable, ...] = (
    Variable("JAX_PLATFORMS", "platform names, comma-separated",
             "The platform(s) used when --platform is auto.", (ALL,)),
    Variable("NO_COLOR", "any value", "When set, human output is plain text without colour.", (ALL,)),
    Variable("TPU_TOOLS_DEBUG", "1 or 0", "When 1, errors show their Python traceback (as --debug does).", (ALL,)),
    Variable("TPU_TOOLS_SYSROOT", "directory",
             "Root directory for passive discovery and tpu-dump's system files (sysfs, /dev, /proc, /etc, "
             "/tmp/tpu_logs); default /.", _READERS_OF_DEVICES),
    Variable("TPU_RUNTIME_METRICS_PORTS", "ports, comma-separated",
             "Ports of libtpu metrics services on localhost, read besides localhost:8431.", _READERS_OF_SERVICES),
    Variable("TPU_TOOLS_LIBTPU_DEFAULT_ADDR", "HOST:PORT",
             "libtpu's default metrics service, read instead of localhost:8431.", _READERS_OF_SERVICES),
    Variable("TPU_TOOLS_RUNTIME_DIR", "directory",
             "Where agents register their sockets (default $XDG_RUNTIME_DIR/tpu-tools, else /tmp/tpu-tools-UID).",
             (AGENT, "tpu-ls", "tpu-monitor", "tpu-top", "tpu-dump")),
    Variable("TPU_TOOLS_NVML", "0, off or 1", "0 or off: NVIDIA GPUs are not read through NVML at all.",
             _READERS_OF_SERVICES),
    Variable("TPU_TOOLS_AMDSMI", "0, off or 1", "0 or off: AMD GPUs are not read through amdsmi at all.",
             _READERS_OF_SERVICES),
    Variable("TPU_TOOLS_GCE_METADATA_URL", "URL",
             "The GCE metadata server's instance attributes, asked for a TPU VM's slice (default "
             "http://metadata.google.internal/computeMetadata/v1/instance/attributes/): a stand-in or a proxy.",
             _READERS_OF_DEVICES),
    Variable("TPU_TOOLS_POD_RESOURCES_SOCKET", "path",
             "The kubelet's pod-resources socket that places processes in their pods (default "
             "/var/lib/kubelet/pod-resources/kubelet.sock).", ("tpu-monitor", "tpu-top")),
    Variable("TPU_TOOLS_SERVICEACCOUNT_DIR", "directory",
             "Where the pod's service account (token, ca.crt, namespace) is mounted, for --pod-labels' reads of "
             "the Kubernetes API (default /var/run/secrets/kubernetes.io/serviceaccount).", ("tpu-monitor",)),
    Variable("TPU_TOOLS_TAG", "text", "The tag of a job started with the agent (default: its PID).", (AGENT,)),
    Variable("TPU_TOOLS_JOB", "text",
             "The job a process with the agent belongs to, across its restarts and hosts (as --job of python -m "
             "tpu_tools.agent); default: the Kubernetes JobSet or Job of its pod, else $SLURM_JOB_ID, else none "
             "(no job log).", (AGENT,)),
    Variable("TPU_TOOLS_JOB_DIR", "directory",
             "Where jobs' logs are written and read (a shared filesystem for a job of many hosts); default "
             "<runtime dir>/jobs.", (AGENT, "tpu-monitor")),
    Variable("TPU_TOOLS_JOB_HEARTBEAT_S", "seconds, 0.05 to 3600",
             "How often the agent writes a job's last step seen into its log: a death is known to within this "
             "(default 1).", (AGENT,)),
    Variable("TPU_TOOLS_SNAPSHOT_FILE", "0, off or 1",
             "0 or off: the agent publishes no snapshot file in its run directory, and monitors ask its socket "
             "instead (each poll then wakes a thread of the job).", (AGENT,)),
    Variable("TPU_TOOLS_STACKS_SIGNAL", "signal name or number, or 0",
             "The signal on which the agent has faulthandler write every thread's stack to its run directory, for a "
             "job stuck holding the interpreter's lock (default SIGUSR2; 0: none).", (AGENT,)),
    Variable("TPU_TOOLS_PRICE_PER_HOUR", "number > 0",
             "The job's machine price per hour, for its cost per 1M samples (as --price-per-hour).", (AGENT,)),
    Variable("TPU_TOOLS_PEAK_FLOPS", "number > 0",
             "The job's peak FLOP/s, for MFU, instead of the device table's.", (AGENT,)),
    Variable("TPU_TOOLS_AGENT_SDK", "0 or 1", "0: the agent never calls libtpu's SDK.", (AGENT,)),
    Variable("TPU_TOOLS_CACHE_KEY_RECORDS", "0 or 1",
             "0: the agent writes no key records into the compilation cache directory.", (AGENT,)),
    Variable("TPU_TOOLS_LAUNCHER_PID", "PID",
             "Set by tpu-collectives-test --launch in the processes it starts: their launcher.",
             ("tpu-collectives-test",), internal=True),
    Variable("TPU_TOOLS_WARM_REQUEST", "JSON",
             "Set by tpu-profile cache warm in the program it starts: what to compile.", ("tpu-profile",),
             internal=True),
)

BY_NAME = {variable.name: variable for variable in VARIABLES}


def _readers_text(variable: Variable) -> str:
    return ", ".join(variable.readers)


def man_section(program: str) -> str:
    """The ENVIRONMENT section of `program`'s man page: one paragraph per variable it reads."""
    lines = []
    for variable in VARIABLES:
        if variable.read_by(program):
            readers = f" Read by {_readers_text(variable)}." if program == "tpu-tools" else ""  # the group's page
            lines.append(f"{variable.name}  ({variable.kind}) {variable.meaning}{readers}")
    return "\n".join(lines)


def markdown_table() -> str:
    """docs/environment.md: every variable, its value, meaning and readers."""
    rows = [f"| `{v.name}` | {v.kind} | {v.meaning}{' (internal)' if v.internal else ''} | {_readers_text(v)} |"
            for v in VARIABLES]
    return "\n".join([
        "# Environment variables",
        "",
        "Generated from `tpu_tools/environment.py` by `tools/gen_docs.py`; the man pages' ENVIRONMENT sections",
        "come from the same table. Variables marked internal are set by the toolkit for the programs it starts.",
        "",
        "| variable | value | meaning | read by |",
        "| --- | --- | --- | --- |",
        *rows,
        "",
    ])
