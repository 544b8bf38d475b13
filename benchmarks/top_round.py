#!/usr/bin/env python3
"""Where tpu-top's CPU goes in one round, piece by piece, with the agent jobs of top_cpu.py (20 by default).

In one process, as tpu-top runs them once a second: the report's round (`ReportBuilder.build` with the groups
tpu-top gathers), the history's sample (with the process rows, made once per report), the frame (`render`),
and painting it through curses into a pseudo-terminal of the size asked (`--size`; a thread drains it).
The round, the history, the frame and the paint are timed in CPU time of the whole process; each group,
and the agents' snapshot files (read on the round's early thread while the first groups run), in CPU time
of the thread that runs it. After `--warmup` rounds, `--rounds` are measured; the medians per round are
printed. `--profile` adds cProfile's heaviest functions over the same rounds (the main thread's).

    python benchmarks/top_round.py [--jobs 20] [--rounds 20] [--size 80x24] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import shutil
import statistics
import sys
import threading
import time
from collections import defaultdict
from typing import Any

from harness import private_workdir
from top_cpu import start_jobs, wait_for_agents


class Terminal:
    """curses on a pseudo-terminal of `width` x `height`, its output drained by a thread."""

    def __init__(self, width: int, height: int):
        import curses
        import fcntl
        import struct
        import termios

        self.master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", height, width, 0, 0))
        self.saved = os.dup(0), os.dup(1)
        os.dup2(slave, 0)
        os.dup2(slave, 1)
        os.close(slave)
        threading.Thread(target=self._drain, daemon=True).start()
        os.environ["TERM"] = "xterm-256color"
        for name in ("COLUMNS", "LINES"):
            os.environ.pop(name, None)
        self.window = curses.initscr()
        curses.noecho()
        curses.cbreak()
        from tpu_tools.top.screen import styles_for

        self.styles = styles_for(colour=True)

    def _drain(self) -> None:
        while True:
            try:
                if not os.read(self.master, 1 << 16):
                    return
            except OSError:
                return

    def close(self) -> None:
        import curses

        curses.endwin()
        os.dup2(self.saved[0], 0)
        os.dup2(self.saved[1], 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20, help="agent jobs running (20; two of them JAX jobs)")
    parser.add_argument("--rounds", type=int, default=20, help="rounds measured, one a second (20)")
    parser.add_argument("--warmup", type=int, default=3, help="rounds before the measured ones (3)")
    parser.add_argument("--size", default="80x24", help="the terminal, WIDTHxHEIGHT (80x24)")
    parser.add_argument("--profile", action="store_true", help="also cProfile's heaviest functions")
    args = parser.parse_args()
    width, height = (int(v) for v in args.size.split("x"))
    print(f"# {' '.join([sys.executable, *sys.argv])}", flush=True)
    workdir, rundir = private_workdir("ttround")
    os.environ["TPU_TOOLS_RUNTIME_DIR"] = str(rundir)
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "TPU_TOOLS_TAG")}
    env.update(JAX_PLATFORMS="cpu")
    jobs = start_jobs(args.jobs, workdir, env, args.rounds + args.warmup + 180)
    terminal = None
    try:
        wait_for_agents(rundir, args.jobs)
        from tpu_tools.metrics.groups import base
        from tpu_tools.metrics.groups.base import CollectOptions
        from tpu_tools.metrics.report import GroupPlan, ReportBuilder
        from tpu_tools.top.frame import SHOWN_GROUPS, render
        from tpu_tools.top.history import History
        from tpu_tools.top.model import ViewState
        from tpu_tools.top.procinfo import ProcessInfo
        from tpu_tools.top.screen import Painter

        builder = ReportBuilder(plan=[GroupPlan(name) for name in SHOWN_GROUPS],
                                options=CollectOptions(agent_timeout_s=0.5))
        times: dict[str, list[float]] = defaultdict(list)
        current: dict[str, float] = {}

        def timed(name: str, call: Any) -> Any:
            def run(*args: Any, **kwargs: Any) -> Any:
                started = time.thread_time()  # the thread it runs on: the agents are read on the early thread
                try:
                    return call(*args, **kwargs)
                finally:
                    current[name] = current.get(name, 0.0) + time.thread_time() - started
            return run

        for name, collector in builder.collectors.items():
            collector.collect = timed(f"group {name}", collector.collect)  # type: ignore[method-assign]
        base.query_agents = timed("agents' files (early)", base.query_agents)
        state = ViewState(interval_s=1.0)
        state.annotate = ProcessInfo().annotate
        history = History(1.0)
        terminal = Terminal(width, height)
        painter = Painter(terminal.window, terminal.styles)
        profiler = cProfile.Profile() if args.profile else None
        for number in range(args.warmup + args.rounds):
            measured = number >= args.warmup
            if measured and profiler is not None:
                profiler.enable()
            current.clear()
            started = time.process_time()
            report = builder.build()
            current["report (all groups)"] = time.process_time() - started
            mark = time.process_time()
            history.record(report, state.report_rows(report))
            current["history"] = time.process_time() - mark
            mark = time.process_time()
            lines = render(report, state, width, height, interactive=True, history=history)
            current["frame"] = time.process_time() - mark
            mark = time.process_time()
            painter.paint(lines, width, height)
            current["paint"] = time.process_time() - mark
            current["round"] = time.process_time() - started
            if profiler is not None:
                profiler.disable()
            if measured:
                for name, value in current.items():
                    times[name].append(value)
            time.sleep(max(0.0, 1.0 - (time.process_time() - started)))
        terminal.close()
        terminal = None
        builder.close()
        shown = len(report.processes.agents) if report.processes else 0
        print(f"tpu-top's round at {width}x{height} with {args.jobs} agent jobs ({shown} in the report), median CPU "
              f"per round over {args.rounds} rounds:")
        for name in sorted(times, key=lambda n: (n != "round", n.startswith("group"), n)):
            print(f"  {name:24s} {statistics.median(times[name]) * 1e3:7.2f} ms")
        if profiler is not None:
            pstats.Stats(profiler, stream=sys.stdout).sort_stats("cumulative").print_stats(120)
            pstats.Stats(profiler, stream=sys.stdout).sort_stats("tottime").print_stats(60)
    finally:
        if terminal is not None:
            terminal.close()
        for job in jobs:
            job.kill()
            job.wait(timeout=30)
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
