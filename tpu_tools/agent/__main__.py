"""`python -m tpu_tools.agent [--tag T] [--job JOB] [--explain-recompiles] [--price-per-hour P] script.py args...`
(or `-m module`).

Runs the script (or module) as `__main__` with the agent started, exactly as
`python script.py args...` would: same `sys.argv`, `sys.path[0]`, exit status
and tracebacks. Options go before the script; everything after it is the
script's. If the agent cannot start, a warning goes to stderr and the script
runs anyway: the job matters more than its monitoring.
"""

from __future__ import annotations

import os
import runpy
import sys
from dataclasses import dataclass

from tpu_tools.agent.goodput import positive_number
from tpu_tools.metrics.joblog import MAX_JOB_ID, clean_job_id
from tpu_tools.pjrt.runtime import module_exists
from tpu_tools.shorten import quoted

PROG = "python -m tpu_tools.agent"
USAGE = (f"usage: {PROG} [--tag TAG] [--job JOB] [--explain-recompiles] [--price-per-hour PRICE] "
         "(script.py | -m module) [args...]\n"
         "  --tag TAG              name of this job in tpu-monitor and tpu-top "
         "(default: $TPU_TOOLS_TAG, else the PID)\n"
         "  --job JOB              the job this process belongs to across restarts, for its log and "
         "tpu-monitor --job (default: $TPU_TOOLS_JOB, else the Kubernetes JobSet or Job, else $SLURM_JOB_ID)\n"
         "  --explain-recompiles   record why each recompilation happened (JAX: jax_explain_cache_misses; "
         "torch_xla: PT_XLA_DEBUG_LEVEL=1)\n"
         "  --price-per-hour PRICE price of the machine per hour, for the cost per 1M samples "
         "(default: $TPU_TOOLS_PRICE_PER_HOUR)\n")


class LaunchUsageError(Exception):
    pass


@dataclass
class Launch:
    tag: str | None
    explain_recompiles: bool
    module: str | None
    script: str | None
    args: list[str]
    price_per_hour: float | None = None
    job: str | None = None


def _option_value(argv: list[str], index: int, name: str) -> tuple[str, int]:
    """The value of option `name` at argv[index], written `--name VALUE` or `--name=VALUE`, and the index of its
    last word; raises LaunchUsageError when the value is missing."""
    if argv[index] != name:
        return argv[index].split("=", 1)[1], index
    if index + 1 >= len(argv):
        raise LaunchUsageError(f"{name} needs a value")
    return argv[index + 1], index + 1


def parse(argv: list[str]) -> Launch | None:
    """The launch request, or None for --help; raises LaunchUsageError."""
    tag, explain, index, price, job = None, False, 0, None, None
    while index < len(argv):
        arg = argv[index]
        if arg in ("-h", "--help"):
            return None
        if arg == "--explain-recompiles":
            explain = True
        elif arg == "--tag" or arg.startswith("--tag="):
            tag, index = _option_value(argv, index, "--tag")
            if not tag.strip():
                raise LaunchUsageError("--tag must not be empty")
        elif arg == "--job" or arg.startswith("--job="):
            job = _value(argv, index, "--job")
            index += arg == "--job"
            if clean_job_id(job) is None:
                raise LaunchUsageError(f"--job must be printable text of 1 to {MAX_JOB_ID} characters, "
                                       f"got {quoted(job, 40)}")
        elif arg == "--price-per-hour" or arg.startswith("--price-per-hour="):
            text, index = _option_value(argv, index, "--price-per-hour")
            price = positive_number(text)
            if price is None:
                raise LaunchUsageError(f"--price-per-hour must be a finite number > 0, got {quoted(text, 40)}")
        elif arg == "-m":
            if index + 1 >= len(argv):
                raise LaunchUsageError("-m needs a module name")
            return Launch(tag, explain, argv[index + 1], None, argv[index + 2:], price, job)
        elif arg == "--":
            index += 1
            break
        elif arg.startswith("-"):
            raise LaunchUsageError(f"unknown option {arg} (options go before the script)")
        else:
            break
        index += 1
    if index >= len(argv):
        raise LaunchUsageError("no script or -m module given")
    return Launch(tag, explain, None, argv[index], argv[index + 1:], price, job)


def _value(argv: list[str], index: int, option: str) -> str:
    """The value of `option` at argv[index]: `--option=value`, or the next argument."""
    if argv[index] != option:
        return argv[index].split("=", 1)[1]
    if index + 1 >= len(argv):
        raise LaunchUsageError(f"{option} needs a value")
    return argv[index + 1]


def main(argv: list[str] | None = None) -> None:
    try:
        launch = parse(sys.argv[1:] if argv is None else argv)
    except LaunchUsageError as error:
        sys.stderr.write(f"{PROG}: error: {error}\n{USAGE}")
        sys.exit(2)
    if launch is None:
        sys.stdout.write(USAGE)
        return
    if launch.script is not None and not os.path.isfile(launch.script):
        sys.stderr.write(f"{PROG}: error: can't open file {launch.script!r}: no such file\n")
        sys.exit(2)
    if launch.module is not None and not module_exists(launch.module):
        sys.stderr.write(f"{PROG}: error: no module named {launch.module!r}\n")
        sys.exit(2)

    import tpu_tools.agent as agent

    try:
        agent.start(launch.tag, explain_recompiles=launch.explain_recompiles, price_per_hour=launch.price_per_hour,
                    job=launch.job)
    except agent.AgentError as error:
        sys.stderr.write(f"{PROG}: warning: {error}; running the script without it\n")
    if launch.module is not None:
        sys.argv = [launch.module, *launch.args]  # sys.path[0] is already the working directory, as with -m
        runpy.run_module(launch.module, run_name="__main__", alter_sys=True)
    else:
        assert launch.script is not None
        sys.argv = [launch.script, *launch.args]
        sys.path[0] = os.path.dirname(os.path.abspath(launch.script))
        runpy.run_path(launch.script, run_name="__main__")


if __name__ == "__main__":
    main()
