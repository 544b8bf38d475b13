"""libtpu answers from a hostile or broken service: any protobuf gives figures, notes or one error, never a crash."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from libtpu_server import (
    DCN_LATENCY,
    DUTY_CYCLE,
    HBM_TOTAL,
    HBM_USAGE,
    HLO_EXECUTION_TIMING,
    HLO_QUEUE_SIZE,
    TENSORCORE_IDLE,
    explicit_layout,
    exponential_layout,
    int_attr,
    kvlist,
    linear_layout,
    string_attr,
)

from tpu_tools.metrics.libtpu.decode import fill_snapshot, runtime_status
from tpu_tools.metrics.libtpu.proto import runtime_metric_service_pb2 as pb
from tpu_tools.metrics.libtpu.records import LibtpuSnapshot
from tpu_tools.render.libtpu_view import runtime_status_views, service_device_table
from tpu_tools.render.table import plain_table
from tpu_tools.sanitize import is_safe

_int64 = st.integers(min_value=-(2 ** 63), max_value=2 ** 63 - 1)
_uint64 = st.integers(min_value=0, max_value=2 ** 64 - 1)
_int32 = st.integers(min_value=-(2 ** 31), max_value=2 ** 31 - 1)
_double = st.floats(allow_nan=True, allow_infinity=True)
_text = st.text(max_size=12)

_attribute = st.one_of(
    st.builds(int_attr, st.sampled_from(["device-id", "chip-id", "device_ordinal", "x"]), _int64),
    st.builds(string_attr, st.sampled_from(["device-id", "buffer-size", "device_ordinal"]), _text),
    st.builds(lambda key, value: kvlist(int_attr("device_ordinal", value), string_attr("buffer-size", key)),
              _text, _int64),
    st.just(pb.Attribute()),
)
_gauge = st.one_of(st.builds(lambda v: pb.Gauge(as_double=v), _double), st.builds(lambda v: pb.Gauge(as_int=v), _int64),
                   st.builds(lambda v: pb.Gauge(as_string=v), _text), st.builds(lambda v: pb.Gauge(as_bool=v),
                                                                                 st.booleans()))
_layout = st.one_of(
    st.builds(exponential_layout, _int32, _double, _double),
    st.builds(linear_layout, _int32, _double, _double),
    st.builds(explicit_layout, st.lists(_double, max_size=6)),
    st.just(pb.Distribution.BucketOptions()),
)
_distribution = st.builds(
    lambda count, mean, low, high, layout, counts: pb.Distribution(
        count=count, mean=mean, min=low, max=high, bucket_options=layout, bucket_counts=counts),
    _int64, _double, _double, _double, _layout, st.lists(_int64, max_size=8))
_point = st.one_of(
    st.builds(lambda a, g: pb.Metric(attribute=a, gauge=g), _attribute, _gauge),
    st.builds(lambda a, d: pb.Metric(attribute=a, distribution=d), _attribute, _distribution),
    st.builds(lambda a, v: pb.Metric(attribute=a, counter=pb.Counter(as_double=v)), _attribute, _double),
    st.just(pb.Metric()),
)
_metrics = st.dictionaries(
    st.sampled_from([HBM_USAGE, HBM_TOTAL, DUTY_CYCLE, TENSORCORE_IDLE, HLO_QUEUE_SIZE, HLO_EXECUTION_TIMING,
                     DCN_LATENCY]),
    st.lists(_point, max_size=5), max_size=7)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_metrics)
def test_any_metrics_answer_decodes_to_finite_figures_and_inert_text(metrics):
    snapshot = LibtpuSnapshot("localhost:8431")
    fill_snapshot(snapshot, {name: pb.TPUMetric(name=name, metrics=points) for name, points in metrics.items()})
    json.dumps(snapshot.to_dict(), allow_nan=False)  # no NaN or Infinity reaches any output
    assert is_safe(plain_table(service_device_table([snapshot])), multiline=True)


_core = st.builds(
    lambda chip, error, hlo, fingerprint: pb.CoreState(
        core_id=pb.CoreId(global_core_id=chip, chip_id=chip, core_on_chip=pb.CoreOnChip(type=chip % 5, index=chip)),
        sequencer_info=[pb.SequencerState(sequencer_type=chip % 9, pc=chip, hlo_location=hlo)],
        program_fingerprint=fingerprint, error_message=error),
    _int32, st.text(max_size=30), st.text(max_size=30), st.binary(max_size=8))


@settings(max_examples=80, deadline=None)
@given(st.text(max_size=40), st.dictionaries(_int32, _core, max_size=4))
def test_any_runtime_status_gives_strict_json_and_inert_text(host_name, cores):
    response = pb.GetTpuRuntimeStatusResponse(host_name=host_name)
    for key, core in cores.items():
        response.core_states[key].CopyFrom(core)
    status = runtime_status("localhost:8431", response)
    json.dumps(status.to_dict(), allow_nan=False)
    for view in runtime_status_views([status]):
        text = view if isinstance(view, str) else plain_table(view)
        assert is_safe(text, multiline=True)


def test_a_layout_of_two_billion_buckets_is_refused_at_once():
    import tracemalloc

    import pytest

    from tpu_tools.metrics.libtpu.distribution import LayoutError, exponential, linear

    tracemalloc.start()
    for build in (lambda: exponential(2 ** 31 - 1, 2.0, 1.0), lambda: linear(2 ** 31 - 1, 1.0, 0.0),
                  lambda: exponential(2000, 1e10, 1.0)):  # the last overflows to infinity
        with pytest.raises(LayoutError, match=r"buckets is more than the 10000 read|bucket bounds overflow"):
            build()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1 << 20  # refused before any bucket was made: two billion bounds would take gigabytes


def test_non_finite_summary_fields_become_none():
    from tpu_tools.metrics.libtpu.distribution import Histogram, summarize

    summary = summarize(Histogram(count=1, mean=float("nan"), min=0.0, max=float("inf"), buckets=None, counts=[]))
    assert (summary.count, summary.mean, summary.min, summary.max) == (1, None, 0.0, None)
