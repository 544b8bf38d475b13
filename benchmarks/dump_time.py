#!/usr/bin/env python3
"""How long a default `tpu-dump` takes on this machine, and how big its bundle is.

Measured side by side, interleaved, in one run (this machine is shared and
noisy): a default `tpu-dump` (every collector, the PJRT listing and probe
included) against `tpu-ls --probe --json` (the runtime query alone, the part
a dump cannot do without).
  tpu-dump wall time                     target < 15 s
  tpu-dump / tpu-ls --probe --json       target <= 2.5x (the other collectors run beside the runtime)

    python benchmarks/dump_time.py [--runs 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

from harness import script, time_run

TARGET_S = 15.0
TARGET_RATIO = 2.5


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "TPU_TOOLS_SYSROOT")}
    print(f"# {' '.join([sys.executable, *sys.argv])}")
    with tempfile.TemporaryDirectory() as folder:
        bundle = Path(folder) / "bundle.tar.gz"
        dump = [*script("tpu-dump"), "--force", "--output", str(bundle)]
        reference = [*script("tpu-ls"), "--probe", "--json"]
        time_run(dump, env), time_run(reference, env)  # warm the page cache
        dump_s, reference_s = [], []
        for _ in range(args.runs):
            dump_s.append(time_run(dump, env))
            reference_s.append(time_run(reference, env))
        size = bundle.stat().st_size
    median, reference_median = statistics.median(dump_s), statistics.median(reference_s)
    ratio = median / reference_median
    within = median < TARGET_S and ratio <= TARGET_RATIO
    print(f"tpu-dump (default, all collectors): median {median:.2f} s, max {max(dump_s):.2f} s over {args.runs} runs "
          f"(target < {TARGET_S:g} s); bundle {size / 1024:.1f} KiB")
    print(f"tpu-dump / tpu-ls --probe --json: {median * 1e3:.0f} ms / {reference_median * 1e3:.0f} ms = {ratio:.2f}x "
          f"(target <= {TARGET_RATIO}x) {'ok' if within else 'OVER TARGET'}")
    return 0 if within else 1


if __name__ == "__main__":
    sys.exit(main())
