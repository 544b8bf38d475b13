"""Print the exporter's whole /metrics text for one report of this host, as `tpu-monitor --prometheus` serves it.

    python exposition_once.py [LIBTPU_ADDRESS ...]

Run with the environment of a fixture host (TPU_TOOLS_SYSROOT, the stand-in NVML or amdsmi libraries, an
agent run directory): the collectors, the report and the exposition are the real ones.
"""

import sys

from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry

from tpu_tools.metrics.groups.base import CollectOptions
from tpu_tools.metrics.prometheus import ReportCollector, exporters_for
from tpu_tools.metrics.report import ReportBuilder

builder = ReportBuilder(options=CollectOptions(metrics_addresses=sys.argv[1:], metrics_timeout_s=2.0))
try:
    collector = ReportCollector(exporters_for(builder.collectors))
    collector.update(builder.build())
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    sys.stdout.buffer.write(generate_latest(registry))
finally:
    builder.close()
