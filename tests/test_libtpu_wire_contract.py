"""The libtpu metrics service's wire contract, checked against the protos tpu-info publishes.

tpu-tools' client was built from its own .proto; a fake service built from the same file only proves the
code agrees with itself. FACTS below are the published messages (tpu-info 0.14.x: tpu_metric_service.proto
in package tpu.monitoring.runtime and tpu_telemetry.proto in package tpu_telemetry), field by field: name,
number, type, label. The tests check tpu-tools' descriptors against them, and then build the published
messages from the table alone (a descriptor made here, with the published names), serve them from a gRPC
server that knows nothing of tpu-tools' .proto, and read them through tpu-tools' real client.
"""

from __future__ import annotations

import math
from concurrent import futures

import grpc
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2  # noqa: F401

from tpu_tools.metrics.libtpu import LibtpuClient
from tpu_tools.metrics.libtpu.proto import runtime_metric_service_pb2 as ours

RUNTIME = "tpu.monitoring.runtime"
TELEMETRY = "tpu_telemetry"
SERVICE = f"{RUNTIME}.RuntimeMetricService"

# (message, field, number, type, label, type name for message/enum fields). Types as descriptor.proto names.
# Nested messages are named Outer.Inner. Published names; OUR_NAMES maps the few we call otherwise.
FACTS: list[tuple[str, str, int, str, str, str | None]] = [
    (f"{RUNTIME}.Exemplar", "value", 1, "double", "optional", None),
    (f"{RUNTIME}.Exemplar", "timestamp", 2, "message", "optional", "google.protobuf.Timestamp"),
    (f"{RUNTIME}.Exemplar", "attributes", 3, "message", "repeated", f"{RUNTIME}.Attribute"),
    (f"{RUNTIME}.Distribution", "count", 1, "int64", "optional", None),
    (f"{RUNTIME}.Distribution", "mean", 2, "double", "optional", None),
    (f"{RUNTIME}.Distribution", "min", 3, "double", "optional", None),
    (f"{RUNTIME}.Distribution", "max", 4, "double", "optional", None),
    (f"{RUNTIME}.Distribution", "sum_of_squared_deviation", 5, "double", "optional", None),
    (f"{RUNTIME}.Distribution", "bucket_options", 6, "message", "optional", f"{RUNTIME}.Distribution.BucketOptions"),
    (f"{RUNTIME}.Distribution", "bucket_counts", 7, "int64", "repeated", None),
    (f"{RUNTIME}.Distribution", "exemplars", 8, "message", "repeated", f"{RUNTIME}.Exemplar"),
    (f"{RUNTIME}.Distribution.BucketOptions", "regular_buckets", 1, "message", "optional",
     f"{RUNTIME}.Distribution.BucketOptions.Regular"),
    (f"{RUNTIME}.Distribution.BucketOptions", "exponential_buckets", 2, "message", "optional",
     f"{RUNTIME}.Distribution.BucketOptions.Exponential"),
    (f"{RUNTIME}.Distribution.BucketOptions", "explicit_buckets", 3, "message", "optional",
     f"{RUNTIME}.Distribution.BucketOptions.Explicit"),
    (f"{RUNTIME}.Distribution.BucketOptions", "linear_buckets", 4, "message", "optional",
     f"{RUNTIME}.Distribution.BucketOptions.Linear"),
    (f"{RUNTIME}.Distribution.BucketOptions.Regular", "num_finite_buckets", 1, "int32", "optional", None),
    (f"{RUNTIME}.Distribution.BucketOptions.Regular", "bounds", 2, "message", "repeated",
     f"{RUNTIME}.Distribution.BucketOptions.Bound"),
    (f"{RUNTIME}.Distribution.BucketOptions.Exponential", "num_finite_buckets", 1, "int32", "optional", None),
    (f"{RUNTIME}.Distribution.BucketOptions.Exponential", "growth_factor", 2, "double", "optional", None),
    (f"{RUNTIME}.Distribution.BucketOptions.Exponential", "scale", 3, "double", "optional", None),
    (f"{RUNTIME}.Distribution.BucketOptions.Bound", "width", 1, "double", "optional", None),
    (f"{RUNTIME}.Distribution.BucketOptions.Bound", "offset", 2, "double", "optional", None),
    (f"{RUNTIME}.Distribution.BucketOptions.Linear", "num_finite_buckets", 1, "int32", "optional", None),
    (f"{RUNTIME}.Distribution.BucketOptions.Linear", "width", 2, "double", "optional", None),
    (f"{RUNTIME}.Distribution.BucketOptions.Linear", "offset", 3, "double", "optional", None),
    (f"{RUNTIME}.Distribution.BucketOptions.Explicit", "bounds", 1, "double", "repeated", None),
    (f"{RUNTIME}.Gauge", "as_double", 1, "double", "optional", None),
    (f"{RUNTIME}.Gauge", "as_int", 2, "int64", "optional", None),
    (f"{RUNTIME}.Gauge", "as_string", 3, "string", "optional", None),
    (f"{RUNTIME}.Gauge", "as_bool", 4, "bool", "optional", None),
    (f"{RUNTIME}.Counter", "as_double", 1, "double", "optional", None),
    (f"{RUNTIME}.Counter", "as_int", 2, "uint64", "optional", None),
    (f"{RUNTIME}.Counter", "exemplar", 3, "message", "optional", f"{RUNTIME}.Exemplar"),
    (f"{RUNTIME}.Quantile", "quantile", 1, "double", "optional", None),
    (f"{RUNTIME}.Quantile", "value", 2, "double", "optional", None),
    (f"{RUNTIME}.Summary", "sample_count", 1, "uint64", "optional", None),
    (f"{RUNTIME}.Summary", "sample_sum", 2, "double", "optional", None),
    (f"{RUNTIME}.Summary", "quantile", 3, "message", "repeated", f"{RUNTIME}.Quantile"),
    (f"{RUNTIME}.AttrValue", "string_attr", 1, "string", "optional", None),
    (f"{RUNTIME}.AttrValue", "bool_attr", 2, "bool", "optional", None),
    (f"{RUNTIME}.AttrValue", "int_attr", 3, "int64", "optional", None),
    (f"{RUNTIME}.AttrValue", "double_attr", 4, "double", "optional", None),
    (f"{RUNTIME}.AttrValue", "array_attr", 5, "message", "optional", f"{RUNTIME}.ArrayAttrValue"),
    (f"{RUNTIME}.AttrValue", "kvlist_attr", 6, "message", "optional", f"{RUNTIME}.KeyValueList"),
    (f"{RUNTIME}.AttrValue", "bytes_attr", 7, "bytes", "optional", None),
    (f"{RUNTIME}.ArrayAttrValue", "attrs", 1, "message", "repeated", f"{RUNTIME}.AttrValue"),
    (f"{RUNTIME}.KeyValueList", "attributes", 1, "message", "repeated", f"{RUNTIME}.Attribute"),
    (f"{RUNTIME}.Attribute", "key", 1, "string", "optional", None),
    (f"{RUNTIME}.Attribute", "value", 2, "message", "optional", f"{RUNTIME}.AttrValue"),
    (f"{RUNTIME}.Metric", "attribute", 1, "message", "optional", f"{RUNTIME}.Attribute"),
    (f"{RUNTIME}.Metric", "start_timestamp", 7, "message", "optional", "google.protobuf.Timestamp"),
    (f"{RUNTIME}.Metric", "timestamp", 2, "message", "optional", "google.protobuf.Timestamp"),
    (f"{RUNTIME}.Metric", "gauge", 3, "message", "optional", f"{RUNTIME}.Gauge"),
    (f"{RUNTIME}.Metric", "counter", 4, "message", "optional", f"{RUNTIME}.Counter"),
    (f"{RUNTIME}.Metric", "distribution", 5, "message", "optional", f"{RUNTIME}.Distribution"),
    (f"{RUNTIME}.Metric", "summary", 6, "message", "optional", f"{RUNTIME}.Summary"),
    (f"{RUNTIME}.TPUMetric", "name", 1, "string", "optional", None),
    (f"{RUNTIME}.TPUMetric", "description", 2, "string", "optional", None),
    (f"{RUNTIME}.TPUMetric", "metrics", 3, "message", "repeated", f"{RUNTIME}.Metric"),
    (f"{RUNTIME}.MetricRequest", "metric_name", 1, "string", "optional", None),
    (f"{RUNTIME}.MetricRequest", "skip_node_aggregation", 2, "bool", "optional", None),
    (f"{RUNTIME}.MetricResponse", "metric", 1, "message", "optional", f"{RUNTIME}.TPUMetric"),
    (f"{RUNTIME}.ListSupportedMetricsRequest", "filter", 1, "string", "optional", None),
    (f"{RUNTIME}.SupportedMetric", "metric_name", 1, "string", "optional", None),
    (f"{RUNTIME}.ListSupportedMetricsResponse", "supported_metric", 1, "message", "repeated",
     f"{RUNTIME}.SupportedMetric"),
    (f"{RUNTIME}.GetTpuRuntimeStatusRequest", "include_hlo_info", 1, "bool", "optional", None),
    (f"{RUNTIME}.GetTpuRuntimeStatusResponse", "host_name", 1, "string", "optional", None),
    (f"{RUNTIME}.GetTpuRuntimeStatusResponse", "core_states", 2, "message", "repeated",
     f"{RUNTIME}.GetTpuRuntimeStatusResponse.CoreStatesEntry"),
    (f"{TELEMETRY}.TpuCoreOnChipProto", "type", 1, "enum", "optional", f"{TELEMETRY}.TpuCoreTypeProto"),
    (f"{TELEMETRY}.TpuCoreOnChipProto", "index", 2, "int32", "optional", None),
    (f"{TELEMETRY}.TpuCoreIdentifier", "global_core_id", 1, "int32", "optional", None),
    (f"{TELEMETRY}.TpuCoreIdentifier", "chip_id", 2, "int32", "optional", None),
    (f"{TELEMETRY}.TpuCoreIdentifier", "core_on_chip", 3, "message", "optional", f"{TELEMETRY}.TpuCoreOnChipProto"),
    (f"{TELEMETRY}.QueuedProgramInfo", "run_id", 1, "int64", "optional", None),
    (f"{TELEMETRY}.QueuedProgramInfo", "launch_id", 2, "int64", "optional", None),
    (f"{TELEMETRY}.QueuedProgramInfo", "program_fingerprint", 3, "bytes", "optional", None),
    (f"{TELEMETRY}.SequencerInfo", "sequencer_type", 1, "enum", "optional", f"{TELEMETRY}.TpuSequencerTypeProto"),
    (f"{TELEMETRY}.SequencerInfo", "sequencer_index", 2, "int32", "optional", None),
    (f"{TELEMETRY}.SequencerInfo", "pc", 3, "int64", "optional", None),
    (f"{TELEMETRY}.SequencerInfo", "tag", 4, "int64", "optional", None),
    (f"{TELEMETRY}.SequencerInfo", "tracemark", 5, "int64", "optional", None),
    (f"{TELEMETRY}.SequencerInfo", "program_id", 6, "int64", "optional", None),
    (f"{TELEMETRY}.SequencerInfo", "run_id", 7, "int64", "optional", None),
    (f"{TELEMETRY}.SequencerInfo", "hlo_location", 8, "string", "optional", None),
    (f"{TELEMETRY}.SequencerInfo", "hlo_detailed_info", 9, "string", "optional", None),
    (f"{TELEMETRY}.CurrentCoreStateSummary", "core_id", 1, "message", "optional", f"{TELEMETRY}.TpuCoreIdentifier"),
    (f"{TELEMETRY}.CurrentCoreStateSummary", "sequencer_info", 2, "message", "repeated",
     f"{TELEMETRY}.SequencerInfo"),
    (f"{TELEMETRY}.CurrentCoreStateSummary", "xdb_server_running", 3, "bool", "optional", None),
    (f"{TELEMETRY}.CurrentCoreStateSummary", "program_fingerprint", 4, "bytes", "optional", None),
    (f"{TELEMETRY}.CurrentCoreStateSummary", "launch_id", 5, "int32", "optional", None),
    (f"{TELEMETRY}.CurrentCoreStateSummary", "queued_program_info", 6, "message", "repeated",
     f"{TELEMETRY}.QueuedProgramInfo"),
    (f"{TELEMETRY}.CurrentCoreStateSummary", "error_message", 7, "string", "optional", None),
]
# Map entries and their value type (map<int32, CurrentCoreStateSummary> core_states = 2).
MAP_ENTRIES = {f"{RUNTIME}.GetTpuRuntimeStatusResponse.CoreStatesEntry": ("int32",
                                                                        f"{TELEMETRY}.CurrentCoreStateSummary")}
ENUMS = {
    f"{TELEMETRY}.TpuCoreTypeProto": [("TPU_CORE_TYPE_INVALID", 0), ("TPU_CORE_TYPE_TENSOR_CORE", 1),
                                      ("TPU_CORE_TYPE_SPARSE_CORE_V0", 2), ("TPU_CORE_TYPE_SPARSE_CORE", 3)],
    f"{TELEMETRY}.TpuSequencerTypeProto": [
        ("TPU_SEQUENCER_TYPE_INVALID", 0), ("TPU_SEQUENCER_TYPE_TENSOR_CORE_SEQUENCER", 1),
        ("TPU_SEQUENCER_TYPE_SPARSE_CORE_V0_SEQUENCER", 2),
        ("TPU_SEQUENCER_TYPE_SPARSE_CORE_V0_ADDRESS_HANDLER", 3),
        ("TPU_SEQUENCER_TYPE_SPARSE_CORE_SEQUENCER", 4),
        ("TPU_SEQUENCER_TYPE_SPARSE_CORE_TILE_ACCESS_CORE_SEQUENCER", 5),
        ("TPU_SEQUENCER_TYPE_SPARSE_CORE_TILE_EXECUTE_CORE_SEQUENCER", 6)],
}
# Oneofs: (message, oneof name, fields). Proto3 "optional" scalars are synthetic oneofs and are not listed.
ONEOFS = [
    (f"{RUNTIME}.Distribution.BucketOptions", "options",
     ["regular_buckets", "exponential_buckets", "explicit_buckets", "linear_buckets"]),
    (f"{RUNTIME}.Gauge", "value", ["as_double", "as_int", "as_string", "as_bool"]),
    (f"{RUNTIME}.Counter", "value", ["as_double", "as_int"]),
    (f"{RUNTIME}.AttrValue", "attr", ["string_attr", "bool_attr", "int_attr", "double_attr", "array_attr",
                                      "kvlist_attr", "bytes_attr"]),
    (f"{RUNTIME}.Metric", "measure", ["gauge", "counter", "distribution", "summary"]),
]
# Fields the published protos declare `optional` in proto3 (explicit presence).
EXPLICIT_PRESENCE = {(f"{RUNTIME}.GetTpuRuntimeStatusResponse", "host_name")} | {
    (message, field) for message, field, _, _, label, _ in FACTS
    if message.startswith(TELEMETRY) and label != "repeated"}
RPCS = [("GetRuntimeMetric", f"{RUNTIME}.MetricRequest", f"{RUNTIME}.MetricResponse"),
        ("ListSupportedMetrics", f"{RUNTIME}.ListSupportedMetricsRequest", f"{RUNTIME}.ListSupportedMetricsResponse"),
        ("GetTpuRuntimeStatus", f"{RUNTIME}.GetTpuRuntimeStatusRequest", f"{RUNTIME}.GetTpuRuntimeStatusResponse")]

# Where tpu-tools names a published message otherwise (wire-identical: only numbers and types travel).
OUR_NAMES = {
    f"{TELEMETRY}.TpuCoreOnChipProto": f"{RUNTIME}.CoreOnChip",
    f"{TELEMETRY}.TpuCoreIdentifier": f"{RUNTIME}.CoreId",
    f"{TELEMETRY}.QueuedProgramInfo": f"{RUNTIME}.QueuedProgram",
    f"{TELEMETRY}.SequencerInfo": f"{RUNTIME}.SequencerState",
    f"{TELEMETRY}.CurrentCoreStateSummary": f"{RUNTIME}.CoreState",
    f"{TELEMETRY}.TpuCoreTypeProto": f"{RUNTIME}.CoreType",
    f"{TELEMETRY}.TpuSequencerTypeProto": f"{RUNTIME}.SequencerType",
}

_TYPES = {name.removeprefix("TYPE_").lower(): number
          for name, number in descriptor_pb2.FieldDescriptorProto.Type.items()}
_LABELS = {name.removeprefix("LABEL_").lower(): number
           for name, number in descriptor_pb2.FieldDescriptorProto.Label.items()}


def _ours(name: str) -> str:
    return OUR_NAMES.get(name, name)


def _our_message(name: str):
    return ours.DESCRIPTOR.pool.FindMessageTypeByName(_ours(name))


@pytest.mark.parametrize("fact", FACTS, ids=lambda f: f"{f[0].rsplit('.', 1)[-1]}.{f[1]}")
def test_every_published_field_has_the_same_number_type_and_label_here(fact):
    message, name, number, kind, label, type_name = fact
    field = _our_message(message).fields_by_name.get(name)
    assert field is not None, f"{_ours(message)} has no field {name}"
    assert field.number == number
    assert field.type == _TYPES[kind]
    assert field.is_repeated == (label == "repeated")
    if type_name is not None:
        target = field.message_type or field.enum_type
        assert target.full_name == _ours(type_name)
    presence = label != "repeated" and ((message, name) in EXPLICIT_PRESENCE or kind == "message"
                                        or any(message == m and name in f for m, _, f in ONEOFS))
    assert field.has_presence == presence


def test_no_field_here_that_the_published_protos_lack():
    published = {(_ours(m), f) for m, f, *_ in FACTS}
    messages = {_ours(m) for m, *_ in FACTS}
    for message in messages:
        for field in _our_message(message).fields:
            if not message.endswith("Entry"):
                assert (message, field.name) in published, f"{message}.{field.name} is not in the published protos"


def test_oneofs_enums_map_entries_and_the_service_agree():
    for message, oneof, fields in ONEOFS:
        assert [f.name for f in _our_message(message).oneofs_by_name[oneof].fields] == fields
    for enum, values in ENUMS.items():
        ours_enum = ours.DESCRIPTOR.pool.FindEnumTypeByName(_ours(enum))
        assert [v.number for v in ours_enum.values] == [number for _, number in values]
    for entry, (key, value) in MAP_ENTRIES.items():
        descriptor = _our_message(entry)
        assert descriptor.GetOptions().map_entry
        assert descriptor.fields_by_name["key"].type == _TYPES[key]
        assert descriptor.fields_by_name["value"].message_type.full_name == _ours(value)
    service = ours.DESCRIPTOR.services_by_name["RuntimeMetricService"]
    assert service.full_name == SERVICE
    assert [(m.name, m.input_type.full_name, m.output_type.full_name) for m in service.methods] == \
           [(name, _ours(i), _ours(o)) for name, i, o in RPCS]


# --- the published messages built from the table alone, served, read through tpu-tools' client ---------------

def _published_pool() -> descriptor_pool.DescriptorPool:
    """A descriptor pool of the published messages, made from FACTS / ENUMS / MAP_ENTRIES (their names)."""
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(descriptor_pb2.FileDescriptorProto.FromString(
        timestamp_pb2.DESCRIPTOR.serialized_pb).SerializeToString())
    files: dict[str, descriptor_pb2.FileDescriptorProto] = {}
    for package in (TELEMETRY, RUNTIME):
        files[package] = descriptor_pb2.FileDescriptorProto(name=f"published/{package}.proto", package=package,
                                                            syntax="proto3",
                                                            dependency=["google/protobuf/timestamp.proto"])
    files[RUNTIME].dependency.append(f"published/{TELEMETRY}.proto")
    messages: dict[str, descriptor_pb2.DescriptorProto] = {}

    def message(full: str) -> descriptor_pb2.DescriptorProto:
        if full in messages:
            return messages[full]
        package = RUNTIME if full.startswith(RUNTIME + ".") else TELEMETRY
        path = full[len(package) + 1:].split(".")
        outer = f"{package}." + ".".join(path[:-1])
        parent = files[package].message_type if len(path) == 1 else message(outer).nested_type
        messages[full] = parent.add(name=path[-1])
        return messages[full]

    for enum, values in ENUMS.items():
        files[TELEMETRY].enum_type.add(name=enum.split(".")[-1],
                                       value=[descriptor_pb2.EnumValueDescriptorProto(name=n, number=v)
                                              for n, v in values])
    for entry, (key, value) in MAP_ENTRIES.items():
        proto = message(entry)
        proto.options.map_entry = True
        proto.field.add(name="key", number=1, type=_TYPES[key], label=_LABELS["optional"])
        proto.field.add(name="value", number=2, type=_TYPES["message"], label=_LABELS["optional"],
                        type_name="." + value)
    oneof_of = {(m, f): i for m, _, fields in ONEOFS for i, f in enumerate(fields)}
    for full, oneof, _ in ONEOFS:
        message(full).oneof_decl.add(name=oneof)
    for full, name, number, kind, label, type_name in FACTS:
        proto = message(full)
        field = proto.field.add(name=name, number=number, type=_TYPES[kind], label=_LABELS[label])
        if type_name:
            field.type_name = "." + type_name
        if (full, name) in oneof_of:
            field.oneof_index = 0
        elif (full, name) in EXPLICIT_PRESENCE:
            field.proto3_optional = True
            field.oneof_index = len(proto.oneof_decl)
            proto.oneof_decl.add(name=f"_{name}")
    pool.Add(files[TELEMETRY])
    pool.Add(files[RUNTIME])
    return pool


class _PublishedService:
    """A gRPC server speaking the published messages (no tpu-tools code or .proto behind it)."""

    def __init__(self, responses: dict[str, object], listed: list[str]):
        pool = _published_pool()
        self.cls = {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{RUNTIME}.{name}"))
                    for name in ("MetricRequest", "MetricResponse", "ListSupportedMetricsRequest",
                                 "ListSupportedMetricsResponse", "GetTpuRuntimeStatusRequest",
                                 "GetTpuRuntimeStatusResponse", "TPUMetric")}
        self.pool = pool
        self.responses = responses
        self.listed = listed
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        cls = self.cls

        def get_metric(request, context):
            response = self.responses.get(request.metric_name)
            if response is None:
                context.abort(grpc.StatusCode.NOT_FOUND, "no such metric")
            return response

        def list_metrics(request, context):
            return cls["ListSupportedMetricsResponse"](supported_metric=[{"metric_name": n} for n in self.listed])

        def unary(function, request_type):
            return grpc.unary_unary_rpc_method_handler(function, request_deserializer=cls[request_type].FromString,
                                                       response_serializer=lambda m: m.SerializeToString())

        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {
            "GetRuntimeMetric": unary(get_metric, "MetricRequest"),
            "ListSupportedMetrics": unary(list_metrics, "ListSupportedMetricsRequest"),
        }),))
        self.port = self.server.add_secure_port("127.0.0.1:0", grpc.local_server_credentials())
        self.server.start()

    def stop(self) -> None:
        self.server.stop(grace=None).wait(5)


def _metric_class(pool, name):
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{RUNTIME}.{name}"))


def test_published_messages_read_through_the_client_give_the_same_figures():
    pool = _published_pool()
    response = _metric_class(pool, "MetricResponse")

    def gauge_metric(name, key, values, as_field):
        return response(metric={"name": name, "metrics": [
            {"attribute": {"key": key, "value": {"int_attr": device}}, "gauge": {as_field: value}}
            for device, value in enumerate(values)]})

    gib = 1 << 30
    used = [int(11.5 * gib), int(12.25 * gib)]
    duty = [87.5, 12.0]
    bounds = [10.0, 100.0, 1000.0]
    h2d = "megascale.host_to_device_transfer_latencies.microsecond.cumulative.distribution"
    rate = "megascale.grpc_tcp_delivery_rate.Mbps.cumulative.distribution"
    distribution = {"count": 10, "mean": 150.0, "min": 20.0, "max": 900.0,
                    "bucket_options": {"explicit_buckets": {"bounds": bounds}}, "bucket_counts": [0, 4, 6]}
    responses = {
        "tpu.runtime.hbm.memory.usage.bytes": gauge_metric("tpu.runtime.hbm.memory.usage.bytes", "device-id", used,
                                                           "as_int"),
        "tpu.runtime.hbm.memory.total.bytes": gauge_metric("tpu.runtime.hbm.memory.total.bytes", "device-id",
                                                           [16 * gib] * 2, "as_int"),
        "tpu.runtime.tensorcore.dutycycle.percent": gauge_metric("tpu.runtime.tensorcore.dutycycle.percent",
                                                                 "device-id", duty, "as_double"),
        h2d: response(metric={"name": h2d, "metrics": [{
            "attribute": {"key": "", "value": {"kvlist_attr": {"attributes": [
                {"key": "buffer-size", "value": {"string_attr": "8MB"}}]}}},
            "distribution": distribution}]}),
        rate: response(metric={"name": rate, "metrics": [{
            "attribute": {"key": "", "value": {"kvlist_attr": {"attributes": [
                {"key": "buffer-size", "value": {"string_attr": "1MB"}}]}}},
            "distribution": distribution}]}),
    }
    service = _PublishedService(responses, sorted(responses))
    try:
        with LibtpuClient([f"127.0.0.1:{service.port}"], timeout_s=5) as client:
            (snapshot,) = client.snapshot()
    finally:
        service.stop()
    assert snapshot.ok, snapshot.error
    assert [d.hbm_used_bytes for d in snapshot.devices] == used
    assert [d.hbm_total_bytes for d in snapshot.devices] == [16 * gib] * 2
    assert [d.duty_cycle_percent for d in snapshot.devices] == duty
    (latency,) = snapshot.transfer_latencies
    assert (latency.name, latency.buffer_size, latency.latency_us.count) == ("host_to_device_transfer_latencies",
                                                                              "8MB", 10)
    # 6 of 10 samples in [100, 1000): the median is interpolated there, independently of how it was encoded
    assert 100.0 <= latency.latency_us.percentile("p50") < 1000.0
    (delivery,) = snapshot.delivery_rates
    assert (delivery.name, delivery.label, delivery.rate_mbps.count) == ("grpc_tcp_delivery_rate", "1MB", 10)
    assert math.isclose(delivery.rate_mbps.percentile("p50"), latency.latency_us.percentile("p50"))


def test_a_deprecated_regular_layout_is_named_not_misread():
    pool = _published_pool()
    metric = _metric_class(pool, "TPUMetric")(name="hlo.execution.timing.distribution.microseconds", metrics=[{
        "attribute": {"key": "", "value": {"kvlist_attr": {"attributes": [
            {"key": "device_ordinal", "value": {"int_attr": 0}}]}}},
        "distribution": {"count": 3, "mean": 5.0, "min": 1.0, "max": 9.0, "bucket_counts": [1, 1, 1],
                         "bucket_options": {"regular_buckets": {"num_finite_buckets": 1,
                                                                "bounds": [{"width": 5.0, "offset": 0.0}]}}}}])
    from tpu_tools.metrics.libtpu import LibtpuSnapshot
    from tpu_tools.metrics.libtpu.decode import fill_snapshot

    snapshot = LibtpuSnapshot("fixture")
    fill_snapshot(snapshot, {metric.name: ours.TPUMetric.FromString(metric.SerializeToString())})
    (device,) = snapshot.devices
    assert device.hlo_execution_time_us.count == 3
    assert device.hlo_execution_time_us.percentile("p50") is None
    assert any("deprecated regular bucket layout" in note for note in snapshot.notes)
