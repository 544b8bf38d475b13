#!/usr/bin/env python3
"""How long `tpu-bench --suite quick` takes, start to exit, against its budget of 2 minutes.

Wall time of the whole program (start-up, the compile children, every case),
next to the sum of the cases' own durations from its JSON result, so the
figure shows where the time goes.

    python benchmarks/bench_quick_suite.py [--runs 1] [--platform cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from harness import script

BUDGET_S = 120.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--platform", default="cpu")
    args = parser.parse_args()
    command = script("tpu-bench")
    walls, by_benchmark = [], defaultdict(list)
    with tempfile.TemporaryDirectory() as folder:
        result_path = Path(folder) / "quick.json"
        for _ in range(args.runs):
            start = time.perf_counter()
            subprocess.run([*command, "--suite", "quick", "--platform", args.platform, "--json", str(result_path)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
            walls.append(time.perf_counter() - start)
            document = json.loads(result_path.read_text())
            totals: dict[str, float] = defaultdict(float)
            for case in document["results"]:
                totals[case["benchmark"]] += case["duration_s"]
            for name, seconds in totals.items():
                by_benchmark[name].append(seconds)
    wall = statistics.median(walls)
    print(f"# {' '.join([os.path.basename(sys.executable), *sys.argv])}")
    print(f"# {document['device']['kind']} x{document['device']['count']}, "
          f"{document['environment']['cpu_count']} CPUs, {len(document['results'])} cases, {args.runs} run(s)")
    print("per benchmark: " + ", ".join(f"{name} {statistics.median(v):.1f} s" for name, v in by_benchmark.items()))
    verdict = "ok" if wall < BUDGET_S else "OVER BUDGET"
    print(f"tpu-bench --suite quick: {wall:.1f} s / budget {BUDGET_S:.0f} s = {wall / BUDGET_S:.2f} {verdict}")
    return 0 if wall < BUDGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
