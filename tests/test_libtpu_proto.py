"""The project's .proto: its generated modules are fresh, and it keeps libtpu's wire contract."""

from __future__ import annotations

import importlib.util
import sys

import pytest
from conftest import REPO

from tpu_tools.metrics.libtpu.proto import runtime_metric_service_pb2 as pb


def _gen_proto():
    spec = importlib.util.spec_from_file_location("gen_proto", REPO / "tools" / "gen_proto.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_proto"] = module
    spec.loader.exec_module(module)
    return module


def test_checked_in_generated_modules_match_the_proto():
    try:
        stale = _gen_proto().stale_files()
    except SystemExit as error:  # the pinned grpcio-tools is not the installed one
        pytest.fail(str(error))
    assert not stale, f"regenerate with `python tools/gen_proto.py`: {[str(p) for p in stale]}"


# Field numbers of the public wire contract (shared reference libtpu-metrics.md), message by message.
CONTRACT = {
    "MetricRequest": {"metric_name": 1, "skip_node_aggregation": 2},
    "MetricResponse": {"metric": 1},
    "ListSupportedMetricsRequest": {"filter": 1},
    "ListSupportedMetricsResponse": {"supported_metric": 1},
    "SupportedMetric": {"metric_name": 1},
    "GetTpuRuntimeStatusRequest": {"include_hlo_info": 1},
    "TPUMetric": {"name": 1, "description": 2, "metrics": 3},
    "Metric": {"attribute": 1, "timestamp": 2, "gauge": 3, "counter": 4, "distribution": 5, "summary": 6,
               "start_timestamp": 7},
    "Attribute": {"key": 1, "value": 2},
    "AttrValue": {"string_attr": 1, "bool_attr": 2, "int_attr": 3, "double_attr": 4, "array_attr": 5,
                  "kvlist_attr": 6, "bytes_attr": 7},
    "ArrayAttrValue": {"attrs": 1},
    "KeyValueList": {"attributes": 1},
    "Gauge": {"as_double": 1, "as_int": 2, "as_string": 3, "as_bool": 4},
    "Counter": {"as_double": 1, "as_int": 2, "exemplar": 3},
    "Summary": {"sample_count": 1, "sample_sum": 2, "quantile": 3},
    "Quantile": {"quantile": 1, "value": 2},
    "Distribution": {"count": 1, "mean": 2, "min": 3, "max": 4, "sum_of_squared_deviation": 5,
                     "bucket_options": 6, "bucket_counts": 7, "exemplars": 8},
    "Distribution.BucketOptions": {"exponential_buckets": 2, "explicit_buckets": 3, "linear_buckets": 4},
    "Distribution.BucketOptions.Exponential": {"num_finite_buckets": 1, "growth_factor": 2, "scale": 3},
    "Distribution.BucketOptions.Explicit": {"bounds": 1},
    "Distribution.BucketOptions.Linear": {"num_finite_buckets": 1, "width": 2, "offset": 3},
    "Exemplar": {"value": 1, "timestamp": 2, "attributes": 3},
}


def _message(path: str):
    descriptor = pb.DESCRIPTOR.message_types_by_name[path.split(".")[0]]
    for part in path.split(".")[1:]:
        descriptor = descriptor.nested_types_by_name[part]
    return descriptor


@pytest.mark.parametrize("message", sorted(CONTRACT))
def test_field_numbers_follow_the_wire_contract(message):
    assert {f.name: f.number for f in _message(message).fields} == CONTRACT[message]


def test_service_name_and_rpcs():
    service = pb.DESCRIPTOR.services_by_name["RuntimeMetricService"]
    assert service.full_name == "tpu.monitoring.runtime.RuntimeMetricService"
    assert {m.name: (m.input_type.name, m.output_type.name) for m in service.methods} == {
        "GetRuntimeMetric": ("MetricRequest", "MetricResponse"),
        "ListSupportedMetrics": ("ListSupportedMetricsRequest", "ListSupportedMetricsResponse"),
        "GetTpuRuntimeStatus": ("GetTpuRuntimeStatusRequest", "GetTpuRuntimeStatusResponse"),
    }
    status = _message("GetTpuRuntimeStatusResponse")
    assert {f.name: f.number for f in status.fields} == {"host_name": 1, "core_states": 2}
