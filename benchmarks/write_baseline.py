#!/usr/bin/env python3
"""Keep a `tpu-bench --json` result as the reference baseline of its device in `benchmarks/baselines/`.

The file is named for the chip and suite (h100-sxm-quick.json) so that
`tpu-bench --baseline benchmarks/baselines/h100-sxm-quick.json` gates a later
run on the same kind of device. A result with failed or interrupted cases is
refused (a baseline must be whole); cases flagged noisy are listed, since a
figure that did not repeat in its own run makes a weak reference.

    PYTHONPATH=. python3 -m tpu_tools bench --suite quick --json out.json
    PYTHONPATH=. python3 benchmarks/write_baseline.py out.json [--name h100-sxm-quick]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def slug(document: dict) -> str:
    """h100-sxm-quick from chip "NVIDIA H100 SXM" and suite "quick"."""
    device = document.get("device") or {}
    chip = device.get("chip") or device.get("kind") or device.get("platform") or "device"
    words = re.sub(r"^(nvidia|google|amd)\s+", "", chip.strip(), flags=re.IGNORECASE)
    name = re.sub(r"[^a-z0-9]+", "-", words.lower()).strip("-")
    return f"{name}-{document.get('suite') or 'custom'}"


def main() -> int:
    from tpu_tools.bench.compare import load_result
    from tpu_tools.errors import UsageError

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("result", help="a tpu-bench --json result")
    parser.add_argument("--name", help="file name without .json (default: chip and suite, e.g. h100-sxm-quick)")
    parser.add_argument("--directory", default=str(REPO / "benchmarks" / "baselines"))
    args = parser.parse_args()
    try:
        document = load_result(args.result, "result")
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    bad = [f"{r['id']} ({r['status']})" for r in document["results"] if r["status"] in ("failed", "interrupted")]
    if bad or document.get("interrupted"):
        print(f"error: not a whole run, refused as a baseline: {', '.join(bad) or 'interrupted'}", file=sys.stderr)
        return 1
    target = Path(args.directory) / f"{args.name or slug(document)}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    noisy = [r["id"] for r in document["results"] if (r.get("values") or {}).get("noisy")]
    print(f"wrote {target} ({len(document['results'])} cases on {document['device'].get('kind')})")
    if noisy:
        print(f"note: {len(noisy)} case(s) were flagged noisy in this run: {', '.join(noisy)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
