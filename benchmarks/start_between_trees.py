#!/usr/bin/env python3
"""A program's start time in two source trees of tpu-tools, side by side: what a change costs at start.

    python benchmarks/start_between_trees.py OLD_TREE [--new NEW_TREE] [--runs 21] [-- ARGS...]

Each run imports tpu_tools from the given tree (first on sys.path, ahead of the installed package) with this
interpreter and its packages, and runs `tpu-ls ARGS` (default: `--no-runtime`, the start of the program
without a runtime child, where an import's cost shows most). Runs alternate between the trees, and the
figure is the ratio of the medians. It also times `import msgspec` against `python -c pass`, the part of the
start that the typed records add on their own. OLD_TREE is a checkout of the earlier commit, e.g.
`git worktree add /tmp/before <commit>`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

from harness import time_run

_RUN_LS = "import sys; sys.path.insert(0, sys.argv[1]); del sys.argv[1]; sys.argv[0] = 'tpu-ls'; " \
          "from tpu_tools.cli.ls_start import main; sys.exit(main())"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path, help="the earlier tree (a checkout with tpu_tools/ in it)")
    parser.add_argument("--new", type=Path, default=Path(__file__).resolve().parents[1], help="default: this tree")
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("args", nargs="*", default=["--no-runtime"], help="tpu-ls's arguments")
    options = parser.parse_args()
    for tree in (options.old, options.new):
        if not (tree / "tpu_tools" / "__init__.py").is_file():
            parser.error(f"{tree} holds no tpu_tools package")
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "TPU_TOOLS_SYSROOT")}
    env["JAX_PLATFORMS"] = "cpu"
    pairs = {
        f"tpu-ls {' '.join(options.args)}: new / old tree": (
            [sys.executable, "-c", _RUN_LS, str(options.new.resolve()), *options.args],
            [sys.executable, "-c", _RUN_LS, str(options.old.resolve()), *options.args]),
        "import msgspec / python -c pass": (
            [sys.executable, "-c", "import msgspec"], [sys.executable, "-c", "pass"]),
    }
    for name, (first, second) in pairs.items():
        time_run(first, env), time_run(second, env)  # warm the page cache and .pyc files of both
        firsts, seconds = [], []
        for index in range(options.runs):  # alternate, so a slow spell of the machine falls on both
            order = (first, second) if index % 2 == 0 else (second, first)
            times = [time_run(command, env) for command in order]
            firsts.append(times[0] if index % 2 == 0 else times[1])
            seconds.append(times[1] if index % 2 == 0 else times[0])
        new, old = statistics.median(firsts), statistics.median(seconds)
        print(f"{name}: {new * 1000:.0f} ms / {old * 1000:.0f} ms = {new / old:.2f}x "
              f"(medians of {options.runs} alternating runs)")
    print(f"command: python benchmarks/start_between_trees.py {options.old} --runs {options.runs} "
          f"-- {' '.join(options.args)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
