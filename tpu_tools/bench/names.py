"""The benchmarks `tpu-bench` knows, in the order a suite runs them.

A module of its own so that the command line can list them at start-up without loading the runner (its
statistics, interference and NVML readers load only when something runs): every `tpu-bench` call, a usage
error, --help or a shell completion among them, starts faster.
"""

from __future__ import annotations

BENCHMARKS = ("compile", "dispatch", "matmul", "memory", "transfer", "train", "infer")
USER_BENCHMARKS = ("fn", "program")  # the user's own code: run by name only, never in a suite
OUT_OF_PROCESS = ("compile", "program")  # run in child processes, before the suite opens the device
