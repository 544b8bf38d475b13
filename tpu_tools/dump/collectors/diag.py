"""The last `tpu-diag` result of this host (kept in the runtime directory), as its JSON and its table."""

from __future__ import annotations

import json

from tpu_tools.dump.collector import CollectContext, Skipped
from tpu_tools.errors import RuntimeFailure


def collect_diag(ctx: CollectContext) -> None:
    from tpu_tools.metrics.diagstate import last_path, read_last

    last = read_last()
    if last is None:
        raise Skipped(f"no tpu-diag result on this host (runtime directory {last_path().parent})")
    if last.error:
        raise RuntimeFailure(last.error)
    document = json.loads(last_path().read_text(encoding="utf-8"))
    ctx.add_json("accelerators/diag-last.json", document)
    from tpu_tools.diag.records import DiagReport
    from tpu_tools.render.diag_view import checks_table, coverage_lines, header_line, sensor_lines, verdict_line
    from tpu_tools.render.table import plain_table

    report = DiagReport.from_dict(document)
    age = last.age_s()
    lines = [header_line(report), f"run at {last.time}" + (f", {age:.0f} s before this bundle" if age is not None
                                                          else ""),
             plain_table(checks_table(report)), *sensor_lines(report), *coverage_lines(report), verdict_line(report)]
    ctx.add_text("accelerators/diag-last.txt", "\n".join(lines) + "\n")
