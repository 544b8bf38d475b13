"""`tpu-profile hlo` tells, for each output, whether it was reduced over every device, some or none:
on the CPU platform with --host-devices 8 (a mesh data 4 x model 2), read from the compiled HLO."""

from __future__ import annotations

import json
import textwrap

import pytest
from conftest import clean_env, run_tool

from tpu_tools.profile.reach import MeshAxes, output_reach, replica_groups

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
    assert output["reach"] == "replicated_input" and output["text"] == "replicated input, no reduction needed"


@pytest.mark.parametrize(("attrs", "groups"), [
    ("replica_groups={{0,2,4,6},{1,3,5,7}}, use_global_device_ids=true", [[0, 2, 4, 6], [1, 3, 5, 7]]),
    ("replica_groups=[2,4]<=[8]", [[0, 1, 2, 3], [4, 5, 6, 7]]),
    ("replica_groups=[4,2]<=[2,4]T(1,0)", [[0, 4], [1, 5], [2, 6], [3, 7]]),
    ("replica_groups={}", [[0, 1, 2, 3, 4, 5, 6, 7]]),
])
def test_replica_groups_in_both_forms(attrs, groups):
    assert replica_groups(attrs, 8) == groups


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
