"""Print the exporter's whole /metrics text for one report of this host, as `tpu-monitor --prometheus` serves it.

    python exposition_once.py [--process-command-label] [--until TEXT] [LIBTPU_ADDRESS ...]

--until REGEX: report again (every 0.1 s, for at most 30 s) until REGEX matches a line of the exposition, as a
monitor reports every period (figures such as XID events are counted between reports, and the last of several
events may land a report later than the others).

Run with the environment of a fixture host (TPU_TOOLS_SYSROOT, the stand-in NVML or amdsmi libraries, an
agent run directory): the collectors, the report and the exposition are the real ones.
"""

import re
import sys
import time

from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry

from tpu_tools.exporter.prometheus import ReportCollector, exporters_for
from tpu_tools.metrics.groups.base import CollectOptions
from tpu_tools.metrics.report import ReportBuilder

args = sys.argv[1:]
command_label = args[:1] == ["--process-command-label"]
args = args[1:] if command_label else args
until = re.compile(args[1].encode(), re.M) if args[:1] == ["--until"] else None
addresses = args[2:] if until is not None else args
builder = ReportBuilder(options=CollectOptions(metrics_addresses=addresses, metrics_timeout_s=2.0))
try:
    collector = ReportCollector(exporters_for(builder.collectors, command_label))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    deadline = time.monotonic() + 30
    while True:
        collector.update(builder.build())
        text = generate_latest(registry)
        if until is None or until.search(text) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    sys.stdout.buffer.write(text)
finally:
    builder.close()
