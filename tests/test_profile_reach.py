"""`tpu-profile hlo` tells, for each output, whether it was reduced over every device, some or none:
on the CPU platform with --host-devices 8 (a mesh data 4 x model 2), read from the compiled HLO."""

from __future__ import annotations

import json
import math
import textwrap

import numpy as np
import pytest
from conftest import clean_env, run_tool
from hypothesis import given, settings
from hypothesis import strategies as st

from tpu_tools.profile.reach import MeshAxes, output_reach, replica_groups, replicated

PROGRAMS = """
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))


    def _losses(x):
        s = jnp.sum(x)[None]
        hidden = jnp.reshape(jax.lax.pmean(jnp.reshape(x, (-1,)), ("data", "model")), x.shape)  # behind a reshape
        return jax.lax.psum(s, ("data", "model")), jax.lax.psum(s, "data"), s, hidden


    losses = jax.jit(jax.shard_map(_losses, mesh=mesh, in_specs=P("data", "model"),
                                   out_specs=(P(), P("model"), P(), P()), check_vma=False))


    def _scaled(x, y):
        return y * 2.0


    scaled = jax.jit(jax.shard_map(_scaled, mesh=mesh, in_specs=(P("data", "model"), P()), out_specs=P(),
                                   check_vma=False))
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    path = tmp_path_factory.mktemp("reach")
    (path / "programs.py").write_text(textwrap.dedent(PROGRAMS))
    return path


def hlo(project, *args: str):
    return run_tool("tpu-profile", "hlo", *args, "--host-devices", "8", "--platform", "cpu", "--force",
                    cwd=project, env=clean_env())


def test_psum_over_both_axes_one_none_and_a_pmean_behind_a_reshape(project):
    result = hlo(project, "programs:losses", "--arg", "f32[8,4]", "--out", "h", "--json")
    assert result.returncode == 0, result.stderr
    outputs = json.loads(result.stdout)["outputs"]
    assert [(o["reach"], o["axes"], o["devices"]) for o in outputs] == [
        ("all", ["data", "model"], 8), ("partial", ["data"], 8), ("local", [], 8), ("all", ["data", "model"], 8)]
    assert [o["text"] for o in outputs] == [
        "reduced over all 8 devices (axes data, model)", "partial: reduced over data only",
        "local: no cross-device reduction on its path", "reduced over all 8 devices (axes data, model)"]
    text = hlo(project, "programs:losses", "--arg", "f32[8,4]", "--out", "h")
    assert text.returncode == 0, text.stderr
    assert "Outputs across 8 devices" in text.stdout
    assert "  output 1  partial: reduced over data only" in text.stdout


def test_a_replicated_input_needs_no_reduction(project):
    result = hlo(project, "programs:scaled", "--arg", "f32[8,4]", "--arg", "f32[3]", "--out", "h", "--json")
    assert result.returncode == 0, result.stderr
    [output] = json.loads(result.stdout)["outputs"]
    assert output["reach"] == "replicated_input"
    assert output["text"] == "replicated input, no reduction needed"


@pytest.mark.parametrize(("attrs", "groups"), [
    ("replica_groups={{0,2,4,6},{1,3,5,7}}, use_global_device_ids=true", [[0, 2, 4, 6], [1, 3, 5, 7]]),
    ("replica_groups=[2,4]<=[8]", [[0, 1, 2, 3], [4, 5, 6, 7]]),
    ("replica_groups=[4,2]<=[2,4]T(1,0)", [[0, 4], [1, 5], [2, 6], [3, 7]]),
    ("replica_groups={}", [[0, 1, 2, 3, 4, 5, 6, 7]]),
])
def test_replica_groups_in_both_forms(attrs, groups):
    assert replica_groups(attrs, 8) == groups


@pytest.mark.parametrize(("attrs", "groups"), [
    # jax 0.11.2's XLA, as it wrote psum(s, "data") and psum(s, ("data", "model")) of the program above
    ("replica_groups=mesh['data'=4,'model'=2] {'data'}, use_global_device_ids=true", [[0, 2, 4, 6], [1, 3, 5, 7]]),
    ("replica_groups=mesh['data'=4,'model'=2] {'data','model'}", [[0, 1, 2, 3, 4, 5, 6, 7]]),
    ("replica_groups=mesh['data'=4,'model'=2] {'model'}", [[0, 1], [2, 3], [4, 5], [6, 7]]),
    # a later XLA's spelling: no quotes, the device order given, a part of an axis
    ("replica_groups=@mesh<data=4,model=2> {data}", [[0, 2, 4, 6], [1, 3, 5, 7]]),
    ("replica_groups=@mesh<a=2,b=4>(devices=[2,4]<=[4,2]T(1,0)) {b:(1)2}", [[0, 4], [2, 6], [1, 5], [3, 7]]),
    ("replica_groups=@mesh<o=4>(devices=[4]3,1,0,2) {o:(2)2}", [[3, 1], [0, 2]]),
    ("replica_groups=@mesh<u=2,v=4> {}", [[0], [1], [2], [3], [4], [5], [6], [7]]),
])
def test_replica_groups_over_a_mesh(attrs, groups):
    assert replica_groups(attrs, 8) == groups


@pytest.mark.parametrize("attrs", [
    "replica_groups=<a form of the future>", "replica_groups=mesh['x'=4] {'y'}",
    "replica_groups=mesh['x'=4] {'x':(3)2}", "replica_groups=@mesh<x=4>(devices=[4]0,1,2) {x}"])
def test_replica_groups_in_a_form_not_read_are_none_not_every_device(attrs):
    assert replica_groups(attrs, 4) is None


@settings(max_examples=200)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=3), st.data())
def test_mesh_groups_are_the_devices_that_differ_only_along_the_reduced_axes(sizes, data):
    names = [f"a{i}" for i in range(len(sizes))]
    total = math.prod(sizes)
    order = data.draw(st.permutations(range(total)))  # the device at each mesh position, row-major
    chosen = data.draw(st.lists(st.sampled_from(names), unique=True))
    header = ",".join(f"{name}={size}" for name, size in zip(names, sizes))
    listed = f"replica_groups=@mesh<{header}>(devices=[{','.join(map(str, sizes))}]{','.join(map(str, order))}) "
    groups = replica_groups(listed + "{" + ",".join(chosen) + "}", total)
    assert groups is not None
    assert sorted(d for g in groups for d in g) == list(range(total))
    position = {device: np.unravel_index(index, sizes) for index, device in enumerate(order)}
    for group in groups:
        assert len(group) == math.prod(sizes[names.index(name)] for name in chosen)
        for member in group:  # the same coordinates but on the reduced axes
            assert all(position[member][axis] == position[group[0]][axis]
                       for axis, name in enumerate(names) if name not in chosen)
    if order == list(range(total)):  # the device order left out is the same mesh
        quoted = ",".join(f"'{name}'={size}" for name, size in zip(names, sizes))
        assert replica_groups(f"replica_groups=mesh[{quoted}] {{{','.join(repr(n) for n in chosen)}}}",
                              total) == groups


@pytest.mark.parametrize(("attrs", "whole"), [
    (", sharding={replicated}", True),
    (", sharding={mesh[], replicated}, metadata={op_name=\"y\"}", True),  # jax 0.11.2's
    (", sharding={@mesh<a=2>, replicated}", True),
    (", sharding={mesh['data'=4,'model'=2], [{}]}", True),
    (", sharding={mesh['data'=4,'model'=2], []}", True),
    (", sharding={@mesh<a=2>(devices=[2]<=[2]T(0)), [{}, {}]}", True),
    (", sharding={mesh['data'=4,'model'=2], [{'data'}, {'model'}]}, metadata={op_name=\"x\"}", False),
    (", sharding={mesh['x'=2], [{}], unreduced={'x'}}", False),
    (", sharding={devices=[4]<=[4]}", False),
])
def test_a_parameter_is_replicated_in_either_form(attrs, whole):
    assert replicated(attrs) is whole


# jax 0.11.2's optimised HLO of `losses` above (its entry computation, without metadata): the reductions and the
# parameter's sharding over the mesh
MESH_HLO = """HloModule jit__losses, num_partitions=8

ENTRY %main.0_spmd (param.1: f32[2,2]) -> (f32[1], f32[1], f32[1], f32[2,2]) {
  %param.1 = f32[2,2]{1,0} parameter(0), sharding={mesh['data'=4,'model'=2], [{'data'}, {'model'}]}
  %reduce_bitcast_fusion = f32[1]{0} fusion(%param.1), kind=kLoop, calls=%fused_computation.1
  %bitcast.1 = f32[4]{0} bitcast(%param.1)
  %psum.22 = f32[1]{0} all-reduce(%reduce_bitcast_fusion), channel_id=1, replica_groups=mesh['data'=4,'model'=2] \
{'data'}, use_global_device_ids=true, to_apply=%region_2.0
  %all-reduce = (f32[1]{0}, f32[4]{0}) all-reduce(%reduce_bitcast_fusion, %bitcast.1), channel_id=1, \
replica_groups=mesh['data'=4,'model'=2] {'data','model'}, use_global_device_ids=true, to_apply=%region_1.0
  %get-tuple-element.4 = f32[1]{0} get-tuple-element(%all-reduce), index=0
  %get-tuple-element.5 = f32[4]{0} get-tuple-element(%all-reduce), index=1
  %multiply_bitcast_fusion = f32[2,2]{1,0} fusion(%get-tuple-element.5), kind=kLoop, calls=%fused_computation
  ROOT %tuple.5 = (f32[1]{0}, f32[1]{0}, f32[1]{0}, f32[2,2]{1,0}) tuple(%get-tuple-element.4, %psum.22, \
%reduce_bitcast_fusion, %multiply_bitcast_fusion)
}
"""


def test_the_mesh_form_of_jax_0_11_gives_the_same_reach():
    reach = output_reach(MESH_HLO, MeshAxes(("data", "model"), (4, 2)))
    assert [(r.reach, r.axes) for r in reach] == [
        ("all", ["data", "model"]), ("partial", ["data"]), ("local", []), ("all", ["data", "model"])]


def test_a_reduction_whose_groups_are_not_read_makes_its_outputs_unknown():
    future = MESH_HLO.replace("replica_groups=mesh['data'=4,'model'=2] {'data'}", "replica_groups=<new>")
    reach = output_reach(future, MeshAxes(("data", "model"), (4, 2)))
    assert [r.reach for r in reach] == ["all", "unknown", "local", "all"]
    assert reach[1].text.startswith("unknown: all-reduce psum.22 names its replica groups in a form")


HLO = """HloModule m, num_partitions=4

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%body (p: (s32[], f32[])) -> (s32[], f32[]) {
  %p = (s32[], f32[]) parameter(0)
  %v = f32[] get-tuple-element(%p), index=1
  %r = f32[] all-reduce(%v), channel_id=1, replica_groups=[1,4]<=[4], to_apply=%add
  %i = s32[] get-tuple-element(%p), index=0
  ROOT %t = (s32[], f32[]) tuple(%i, %r)
}

%cond (q: (s32[], f32[])) -> pred[] {
  %q = (s32[], f32[]) parameter(0)
  ROOT %c = pred[] constant(true)
}

ENTRY %main (x: f32[], y: f32[]) -> (f32[], f32[]) {
  %x = f32[] parameter(0), sharding={devices=[4]<=[4]}
  %y = f32[] parameter(1), sharding={replicated}
  %zero = s32[] constant(0)
  %init = (s32[], f32[]) tuple(%zero, %x)
  %loop = (s32[], f32[]) while(%init), condition=%cond, body=%body
  %out = f32[] get-tuple-element(%loop), index=1
  ROOT %t = (f32[], f32[]) tuple(%out, %y)
}
"""


def test_a_reduction_inside_a_loop_body_and_without_a_mesh():
    reach = output_reach(HLO)
    assert [r.text for r in reach] == ["reduced over all 4 devices", "replicated input, no reduction needed"]
    named = output_reach(HLO, MeshAxes(("x",), (4,)))
    assert named[0].text == "reduced over all 4 devices (axes x)"
    assert output_reach("not hlo at all\n}\n") == []
