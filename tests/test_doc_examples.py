"""The examples of the docs, run again: the deterministic ones must show what the programs say today, and every
example's output has the shape of a real run's (headers, columns, words and JSON keys; figures masked)."""

from __future__ import annotations

import json
import re
import shlex
import socket

import pytest
import sysroot
from conftest import DEFAULT_METRICS_ADDR, REPO, clean_env, run_tool


def example(doc: str, command: str) -> tuple[list[str], str | None]:
    """(output lines, the ```python block just before it) of the example `$ command` in docs/<doc>."""
    text = (REPO / doc).read_text()
    blocks = re.findall(r"```(\w*)\n(.*?)```", text, re.S)
    for index, (_, body) in enumerate(blocks):
        lines = body.rstrip("\n").split("\n")
        if lines[0] == f"$ {command}":
            python = next((b for lang, b in reversed(blocks[:index]) if lang == "python"), None)
            return lines[1:], python
    raise AssertionError(f"{doc} has no example `$ {command}`")


HLO = ("tpu-profile hlo model:mlp --arg bf16[256,1024] --arg bf16[1024,4096] --arg bf16[4096,1024] "
       "--chip v5e --out hlo-mlp")


def test_the_hlo_example_in_the_profile_docs(tmp_path):
    shown, model = example("docs/profile.md", HLO)
    assert model is not None
    (tmp_path / "model.py").write_text(model)
    program, *args = shlex.split(HLO)
    result = run_tool(program, *args, cwd=tmp_path, env=clean_env(JAX_PLATFORMS="cpu"))
    assert result.returncode == 0, result.stderr
    timing = re.compile(r"^  lowering .*, XLA compile ")  # the only figures that vary from run to run
    assert [line for line in result.stdout.rstrip("\n").split("\n") if not timing.match(line)] == \
        [line for line in shown if not timing.match(line)]


# The collectors whose outcome is the host's: what it has installed, loaded or left behind. The example's host
# had no accelerator, no driver tools and no libtpu; a GPU machine has nvidia-smi and its PCI functions, and
# libtpu leaves /tmp/tpu_logs on any host that loaded it.
HOST_DEPENDENT_COLLECTORS = {"system.pci", "system.modules", "accelerators.nvml", "accelerators.nvidia_smi",
                             "accelerators.amdsmi", "accelerators.amd_smi", "accelerators.libtpu", "logs.libtpu",
                             "logs.libtpu_diagnostics", "logs.kernel"}
DUMP_SHOW = "tpu-dump show tpu-dump-vm-20261122T194824Z.tar.gz"


def _not_ok(listing: list[str]) -> dict[str, str]:
    """The collectors `tpu-dump show` lists (those that are not ok) with their status."""
    rows = (re.match(r"([a-z_]+\.[a-z_]+)\s+(skipped|failed|timed out)\s", line) for line in listing)
    return {row[1]: row[2] for row in rows if row}


def test_the_collector_counts_in_the_dump_docs(tmp_path):
    shown, _ = example("docs/dump.md", "tpu-dump --host-devices 4")
    shown_listing, _ = example("docs/dump.md", DUMP_SHOW)
    env = clean_env(TPU_TOOLS_RUNTIME_DIR=str(tmp_path / "run"), JAX_COMPILATION_CACHE_DIR=None)
    result = run_tool("tpu-dump", "--host-devices", "4", "-o", str(tmp_path / "b.tar.gz"), env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    shown_line = next(line for line in shown if line.startswith("collectors: "))
    ok, skipped = (int(n) for n in re.fullmatch(r"collectors: (\d+) ok, (\d+) skipped", shown_line).groups())
    documented = _not_ok(shown_listing)
    assert set(documented.values()) == {"skipped"}
    assert len(documented) == skipped  # the two examples agree
    listing = run_tool("tpu-dump", "show", str(tmp_path / "b.tar.gz"), env=env).stdout
    here = _not_ok(listing.splitlines())
    # every collector does here what the example says, but for those whose outcome is the host's
    assert set(here.values()) <= {"skipped"}, here
    assert documented.keys() ^ here.keys() <= HOST_DEPENDENT_COLLECTORS, documented.keys() ^ here.keys()
    actual_line = next(line for line in result.stdout.splitlines() if line.startswith("collectors: "))
    assert actual_line == f"collectors: {ok + skipped - len(here)} ok, {len(here)} skipped"


# --- the shape of every example ------------------------------------------------------------------------------
#
# Every `$ command` block of README.md and docs/*.md is either run here (once per command, shared by the docs
# that show it; small sizes on the CPU platform) and compared by shape, or named below with the reason it is
# not, so that a new example cannot go unchecked unnoticed. The shape of an output: its lines with every number
# masked and runs of spaces folded, so headers, columns, units and words must match and figures need not; a
# JSON line compares by its keys; a line "..." in the docs stands for any number of lines.

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
NUMBER = re.compile(r"[+-]?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?")
# A measured figure's scale is the machine's: 0 us or 0 ms, 0 GFLOP/s or 0 TFLOP/s, 0k tokens/s or 0 tokens/s.
FIGURE_SCALES = ((re.compile(r"\b0 ?(?:ns|us|\u00b5s|ms|s)\b"), "0 s"),
                 (re.compile(r"\b0 ?[kMGTP]?(FLOP|OP|B)/s\b"), r"0 \1/s"),
                 (re.compile(r"\b0[kM] (?=tokens/s)"), "0 "))

# What of a benchmark's output is the host's, not the code's: its CPU's model, and the load other programs put on it.
BENCH_VARIES = re.compile(r"(?<=^host vm: ).*(?=, \d+ CPUs )|^warning: .*: noisy: .*|, noisy$")
# command -> (program arguments, what of the output varies with the machine's load, not with the code: removed
# from both sides, and a line left empty dropped)
RUNS: dict[str, tuple[list[str], re.Pattern[str] | None]] = {
    "tpu-ls --host-devices 4 --probe": (["tpu-ls", "--host-devices", "4", "--probe"], None),
    "tpu-bench matmul --size 1024 --dtype f32,bf16": (["tpu-bench", "matmul", "--size", "1024", "--dtype", "f32,bf16"],
                                                      BENCH_VARIES),
    "tpu-bench matmul --size 512,8192x64x8192 --dtype bf16,int8,int4": (
        ["tpu-bench", "matmul", "--size", "512,8192x64x8192", "--dtype", "bf16,int8,int4"], BENCH_VARIES),
    "tpu-bench memory --size 1T,16M --op copy,triad": (
        ["tpu-bench", "memory", "--size", "1T,16M", "--op", "copy,triad"], BENCH_VARIES),
    "tpu-bench train --host-devices 2 --preset tiny --price-per-hour 4.20": (
        ["tpu-bench", "train", "--host-devices", "2", "--preset", "tiny", "--price-per-hour", "4.20"], BENCH_VARIES),
    "tpu-collectives-test all-reduce -b 1K -e 1M -f 32": (
        ["tpu-collectives-test", "all-reduce", "-b", "1K", "-e", "1M", "-f", "32"], None),
    "tpu-collectives-test all-reduce --stats p50,p99 -e 64K": (
        ["tpu-collectives-test", "all-reduce", "--stats", "p50,p99", "-e", "64K"], None),
    "tpu-collectives-test all-gather --launch 2 -b 1K -e 1M -f 4": (
        ["tpu-collectives-test", "all-gather", "--launch", "2", "-b", "1K", "-e", "1M", "-f", "4"], None),
}
CHECKED_ELSEWHERE = {  # run in this file by a test of its own, which compares more than the shape
    HLO: "test_the_hlo_example_in_the_profile_docs",
    "tpu-dump --host-devices 4": "test_the_collector_counts_in_the_dump_docs",
    DUMP_SHOW: "test_the_collector_counts_in_the_dump_docs",
    "tpu-monitor --list-metrics --deny-metric 'tpu_tools_gpu_*' | jq -c '.families[] | select(.name | "
    "test(\"hlo_exec|gpu_up\"))'": "test_the_list_metrics_example_has_the_families_and_keys_shown",
    # a job killed twice and restarted: its figures against the truth, and this example's shape
    "tpu-monitor --job train-life | jq -c '.goodput, .disruptions[]'":
        "tests/test_job_life.py::test_a_job_killed_twice_reports_lost_progress_and_recovery",
}
NOT_RUN = {  # what each needs that a cheap run on the CPU platform has not
    "COLUMNS=80 tpu-top --once | tail -3": "units and a command that are the job's (tests/test_top.py: the frame)",
    "COLUMNS=80 tpu-top --once": "agent jobs beside it",
    "tpu-diag -r 2 --host-devices 8 --inject gemm:5 --format plain | grep -E 'FAIL|verdict'": "45 s of two cores",
    "tpu-diag -r 2 --host-devices 8 --inject gemm:5": "45 s of two cores",
    "python benchmarks/host_speed.py": "a benchmark of the host, minutes",
    "python benchmarks/host_speed.py --xla --seconds 12 --window 0.15": "a benchmark of the host, minutes",
    "tpu-bench --json quick.json --junit quick.xml": "the whole quick suite, minutes",
    "tpu-bench matmul --size 1024 --dtype f32,int8 --json main.json": "a baseline of another build",
    "taskset -c 0 tpu-bench matmul --size 1024 --dtype f32,int8 --baseline main.json --json new.json --junit "
    "new.xml": "a baseline of another build",
    "echo $?": "the gate above",
    "tpu-profile cache inspect /data/jax-cache": "a compilation cache a job filled",
    "python benchmarks/cache_warm.py --runs 3   (each run: tpu-profile cache warm DIR WORKLOAD --preset PRESET "
    "--json, JAX_PLATFORMS=cpu)": "a benchmark, minutes",
    "TPU_TOOLS_SYSROOT=/tmp/fx2/v4-host tpu-dump --timeout 3 -o bug-1234.tar.gz": "a fixture TPU host",
    "tpu-dump show bug-1234.tar.gz": "that host's bundle",
    "tpu-dump --only accelerators --metrics-addr localhost:8432 -o bug-5678.tar.gz": "libtpu's metrics service",
    "tpu-dump show bug-5678.tar.gz": "that service's bundle",
    "tpu-dump show bug-5678.tar.gz --file accelerators/agents.txt": "that service's bundle",
    "python benchmarks/exporter_load.py": "a load benchmark, minutes",
    "python benchmarks/fleet_scale.py --hosts 250,500,1000,2000 --settle 60 --refreshes 5": "Prometheus, hours",
    "tpu-ls": "a fixture TPU host held by a job",
    "tpu-monitor --arrays 18180 | jq -c '.arrays[0], .sites[0]'": "a job's agent",
    "tpu-profile run --out prof -- train.py": "the reader's train.py",
    "tpu-profile run --start-step 10 --steps 5 --top 5 --out prof -- train.py": "the reader's train.py",
    "tpu-profile summary /tmp/tensorboard --top 5": "a trace a job wrote",
    "tpu-profile hlo train --preset small --chip v5e --out hlo-train": "the small transformer's compile, a minute",
    "tpu-profile capture --addr 127.0.0.1:9999 --duration 1 --out cap --top 5": "a job serving its profiler",
    "cat mykern.py": "the reader's module, shown, not run",
    "tpu-bench fn mykern:gemm --arg f32[512,512] --arg f32[512,512]": "the reader's mykern.py (tests/test_bench_fn.py)",
    "tpu-bench program --duration 10 -- steady.py      # 20 ms of sleep and a small GEMM per step":
        "a program run for 10 s (tests/test_bench_program.py runs one)",
    "tpu-bench program --duration 60 --json main.json -- train.py --config small.yaml": "the reader's train.py",
    "tpu-bench program --duration 60 --baseline main.json -- train.py --config small.yaml   # exit 3 if slower":
        "the reader's train.py",
    "tpu-ls --free": "a fixture TPU host whose chips are partly held (tests/test_ls_query_free.py)",
    'eval "$(tpu-ls --export)" && python train.py      # or: env $(tpu-ls --env) python train.py':
        "the reader's train.py",
    "tpu-ls --no-runtime --query chip_index,name,memory_total_bytes,holder_pids   # a v5e-8 host, two jobs":
        "a fixture TPU host held by two jobs (tests/test_ls_query_free.py)",
}


def all_examples() -> list[tuple[str, str, list[str]]]:
    """(doc, command, output lines shown) of every `$ command` in a code block of the docs."""
    found = []
    for path in DOCS:
        for body in re.findall(r"```\w*\n(.*?)```", path.read_text(), re.S):
            lines = body.rstrip("\n").split("\n")
            for index, line in enumerate(lines):
                if line.startswith("$ "):
                    rest = lines[index + 1:]
                    end = next((i for i, later in enumerate(rest) if later.startswith("$ ")), len(rest))
                    found.append((str(path.relative_to(REPO)), line[2:], rest[:end]))
    return found


def shape(line: str) -> str:
    """A line with its figures masked: a JSON object by its keys, else its words with numbers as 0."""
    text = line.strip()
    if text.startswith("{") and text.endswith("}"):
        try:
            return "json " + " ".join(sorted(json.loads(text)))
        except ValueError:
            pass
    masked = NUMBER.sub("0", text)
    for scaled, unscaled in FIGURE_SCALES:
        masked = scaled.sub(unscaled, masked)
    return " ".join(masked.split())


def same_shape(shown: list[str], actual: list[str]) -> bool:
    """Whether `actual` has the shape of `shown`, a line "..." of `shown` matching any number of lines."""
    if not shown:
        return not actual
    if shown[0].strip() == "...":
        return any(same_shape(shown[1:], actual[start:]) for start in range(len(actual) + 1))
    return bool(actual) and shape(shown[0]) == shape(actual[0]) and same_shape(shown[1:], actual[1:])


def test_every_example_is_run_here_or_says_why_not():
    commands = {command for _, command, _ in all_examples()}
    accounted = set(RUNS) | set(LIBTPU_RUNS) | set(AGENT_RUNS) | set(CHECKED_ELSEWHERE) | set(NOT_RUN)
    assert commands - accounted == set(), "run the new example in RUNS, or say in NOT_RUN why it is not"
    assert accounted - commands == set(), "no doc shows these any more"


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict[str, list[str]]:
    """Each command of RUNS run once, on the CPU platform, in an empty directory: its stdout's lines."""
    directory = tmp_path_factory.mktemp("examples")
    found = {}
    for command, (argv, _) in RUNS.items():
        result = run_tool(argv[0], *argv[1:], cwd=directory, env=clean_env(JAX_PLATFORMS="cpu"), timeout=300)
        assert result.returncode == 0, (command, result.stderr)
        host = socket.gethostname()
        found[command] = [line.replace(f"({host})", "(vm)").replace(f"host {host}", "host vm")
                          for line in result.stdout.rstrip("\n").split("\n")]
    return found


@pytest.mark.budget(120)  # eight small runs of real programs, shared by every example that shows them
@pytest.mark.parametrize(("doc", "command"), sorted({(doc, command) for doc, command, _ in all_examples()
                                                    if command in RUNS}))
def test_the_example_has_the_shape_of_a_real_run(doc, command, outputs):
    shown = next(lines for where, what, lines in all_examples() if (where, what) == (doc, command))
    varies = RUNS[command][1]

    def steady(lines: list[str]) -> list[str]:
        kept = [varies.sub("", line) if varies else line for line in lines]
        return [line for line, before in zip(kept, lines) if line or not before]

    shown, actual = steady(shown), steady(outputs[command])
    assert same_shape(shown, actual), "\n".join(
        ["the example's shape:", *map(shape, shown), "", "a run's today:", *map(shape, actual)])


def test_the_list_metrics_example_has_the_families_and_keys_shown():
    command = next(c for c in CHECKED_ELSEWHERE if c.startswith("tpu-monitor --list-metrics"))
    shown = next(lines for _, what, lines in all_examples() if what == command)
    result = run_tool("tpu-monitor", "--list-metrics", "--deny-metric", "tpu_tools_gpu_*")
    assert result.returncode == 0, result.stderr
    picked = [family for family in json.loads(result.stdout)["families"]
              if re.search("hlo_exec|gpu_up", family["name"])]  # the example's jq filter
    assert [json.loads(line) for line in shown] == picked


# The examples on a fixture host with libtpu's fixture service (tests/libtpu_server.py): command -> (the service's
# host, the run (arguments, environment) given the service's port, the example's jq filter in Python, if any).
def _devices_filter(report: dict) -> list[str]:
    device = report["devices"]["devices"][0]
    picked = {key: device[key] for key in ("key", "name", "memory_used_bytes", "memory_total_bytes",
                                           "utilization_percent", "sources", "extra")}
    return [json.dumps({**picked, "holders": [holder["pid"] for holder in device["holders"]]})]


def _libtpu_filter(report: dict) -> list[str]:
    group = report["libtpu"]
    services = [{key: service[key] for key in ("address", "error", "duty_cycle_scope", "not_served_metrics")}
                | {"devices": service["devices"][:1]} for service in group["services"]]
    return json.dumps({"error": group["error"], "notes": group["notes"], "services": services}, indent=2).split("\n")


MONITOR = ["tpu-monitor", "--count", "1"]
LIBTPU_RUNS = {
    "TPU_RUNTIME_METRICS_PORTS=8432 tpu-ls --runtime-status": (
        "v5e", lambda port: (["tpu-ls", "--runtime-status"], {"TPU_RUNTIME_METRICS_PORTS": str(port)}), None),
    "tpu-ls --metric hbm_usage --metric host_compute_latency --metrics-addr 127.0.0.1:18431": (
        "v5p", lambda port: (["tpu-ls", "--metric", "hbm_usage", "--metric", "host_compute_latency",
                              "--metrics-addr", f"127.0.0.1:{port}"], {}), None),
    "tpu-monitor --count 1 | jq -c '.devices.devices[0] | {key, name, memory_used_bytes, memory_total_bytes, "
    "utilization_percent, sources, extra, holders: [.holders[].pid]}'": (
        "v5e", lambda port: (MONITOR, {"TPU_RUNTIME_METRICS_PORTS": str(port)}), _devices_filter),
    "tpu-monitor --count 1 | jq '.libtpu | {error, notes, services: [.services[] | {address, error, "
    "duty_cycle_scope, not_served_metrics, devices: .devices[:1]}]}'": (
        "v5e", lambda port: (MONITOR, {"TPU_RUNTIME_METRICS_PORTS": str(port)}), _libtpu_filter),
}


@pytest.mark.auto_platform  # a held TPU keeps tpu-ls's runtime closed only when the platform is left to JAX
def test_the_libtpu_examples_have_the_shape_of_a_run_on_the_fixture_host(tmp_path):
    from libtpu_server import FIXTURES, FakeMetricsService

    sysroot.v5e_host(tmp_path / "root", holders={3001: list(range(8))})  # the docs' host: a job holds every chip
    checked = 0
    for doc, command, shown in all_examples():
        if command not in LIBTPU_RUNS:
            continue
        host, run, jq = LIBTPU_RUNS[command]
        with FakeMetricsService(FIXTURES[host]()) as service:
            argv, extra = run(service.port)
            env = clean_env(TPU_TOOLS_SYSROOT=str(tmp_path / "root"), **extra)
            result = run_tool(argv[0], *argv[1:], env=env)
        assert result.returncode == 0, (command, result.stderr)
        actual = jq(json.loads(result.stdout)) if jq else result.stdout.rstrip("\n").split("\n")
        # the suite's own default address (conftest) stands where the docs' host had localhost:8431
        actual = [line.replace(DEFAULT_METRICS_ADDR, "localhost:8431").replace(f"host {socket.gethostname()} ",
                                                                                "host vm ") for line in actual]
        assert same_shape(shown, actual), "\n".join(
            [f"{doc}: {command}", "the example's shape:", *map(shape, shown), "", "a run's today:",
             *map(shape, actual)])
        checked += 1
    assert checked == 4


AGENT_JOB = "python -m tpu_tools.agent --tag train --explain-recompiles train.py &"
AGENT_RUNS = {  # run beside a job started as the example starts its own (tests/agentjobs.py)
    AGENT_JOB: None,  # prints nothing: it is the job the next example reads
    "tpu-monitor --count 1 | jq -c '.processes.agents[0] | {pid, tag, compiles: .compiles.compile_count, "
    "steps_per_second: .steps.steps_per_second}'":
        lambda report: [json.dumps({"pid": agent["pid"], "tag": agent["tag"],
                                    "compiles": agent["compiles"]["compile_count"],
                                    "steps_per_second": agent["steps"]["steps_per_second"]})
                        for agent in report["processes"]["agents"][:1]],
}


def test_the_agent_examples_have_the_shape_of_a_run_beside_a_job():
    from agentjobs import agent_env, running_job

    examples = [(doc, command, shown) for doc, command, shown in all_examples() if command in AGENT_RUNS]
    assert {command for _, command, _ in examples} == set(AGENT_RUNS)
    with running_job(tag="train", explain=True) as (job, rundir):
        for doc, command, shown in examples:
            jq = AGENT_RUNS[command]
            if jq is None:
                assert shown == [], (doc, command)  # started in the background: nothing printed
                continue
            result = run_tool("tpu-monitor", "--count", "1", env=agent_env(rundir))
            assert result.returncode == 0, result.stderr
            actual = jq(json.loads(result.stdout))
            assert same_shape(shown, actual), (doc, shown, actual)
            assert json.loads(actual[0])["tag"] == "train"
            assert json.loads(actual[0])["pid"] == job.pid
