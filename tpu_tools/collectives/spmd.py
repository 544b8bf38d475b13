"""The collectives as JAX SPMD programs over a mesh, one jitted function per test.

Each device holds one buffer: the global array has the mesh's shape plus one
buffer axis, sharded so that every device owns exactly its buffer. Inside
`shard_map` the op runs along one mesh axis with the lax collective that
lowers to the matching XLA collective (all-reduce, all-gather, reduce-scatter,
all-to-all, collective-permute). Two are not in lax's public set:
- prod: an all-reduce whose reduction is a multiply, built from jax's own
  all-reduce lowering with the multiply reducer;
- broadcast: XLA's collective-broadcast where jax lowers it (GPU); elsewhere
  the equivalent jax documents for `pbroadcast`, an all-reduce of the root's
  buffer with the others masked to zero.
Each test comes in two forms, as nccl-tests times them:
- out-of-place: the op on an input buffer into a fresh output buffer. Its timed
  form takes the previous call's output as a second, unused argument (kept by
  `keep_unused`): the runtime starts a call only once its arguments exist, so
  calls issued back to back run one after the other and cannot overlap.
- in-place: the op writes over its input (the input is donated). Ops whose
  output is as large as their input do so directly; all-gather reads its own
  chunk from the full-size buffer (nccl-tests' sendbuff = recvbuff + rank x
  count) and reduce-scatter writes its reduced chunk at its own offset of the
  input. Each call consumes the previous call's result, a chain by construction.
Everything here needs jax imported and the backend initialised.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from tpu_tools.collectives.mesh import MeshPlan
from tpu_tools.collectives.ops import Case
from tpu_tools.errors import RuntimeFailure

_PPROD: Any = None


@dataclass
class Collective:
    function: Callable  # jitted: global input array -> global output array
    implementation: str  # what runs, in words (header and JSON)
    sharding: Any  # of the input (and of the output, and of the in-place buffer)
    timed: Callable  # jitted: (input, previous output) -> output; the previous output only orders the calls
    in_place: Callable  # jitted, input donated: in-place buffer -> in-place buffer


def in_place_elements(test: Case, count: int, ranks: int) -> int:
    """Length of the buffer an in-place call works on: the larger of its input and output."""
    return max(test.op.input_elements(count, ranks), test.op.output_elements(count, ranks))


def _pprod_primitive() -> Any:
    """An all-reduce with a multiply reducer (lax has psum, pmax, pmin but no product)."""
    global _PPROD
    if _PPROD is None:
        from jax import lax
        from jax._src import core
        from jax._src.interpreters import mlir
        from jax._src.lax import parallel

        # jax's own all-reduce pieces, given a multiply: the lowering is _allreduce_lowering up to jax 0.10 and
        # _all_reduce_lowering from 0.11 (its new is_async argument defaults to a plain all-reduce)
        lowering = getattr(parallel, "_all_reduce_lowering", None) or getattr(parallel, "_allreduce_lowering", None)
        implement = getattr(parallel, "_allreduce_impl", None)
        abstract_eval = getattr(parallel, "_pmin_pmax_abstract_eval", None)
        if lowering is None or implement is None or abstract_eval is None:
            import jax

            raise RuntimeFailure(f"the prod reduction is built from jax's own all-reduce, whose internals jax "
                                 f"{jax.__version__} no longer has: choose --redop sum, max, min or avg")
        primitive = core.Primitive("tpu_tools_pprod")
        primitive.def_impl(partial(implement, primitive, lax.reduce_prod))
        primitive.def_effectful_abstract_eval(partial(abstract_eval, "pprod"))
        mlir.register_lowering(primitive, partial(lowering, lax.mul_p, lax.reduce_prod))
        _PPROD = primitive
    return _PPROD


def broadcast_implementation(platform: str) -> str:
    return "collective-broadcast" if platform in ("gpu", "cuda", "rocm") else "masked all-reduce"


def _all_reduce(axis: Any, redop: str | None, ranks: int, is_integer: bool) -> tuple[Callable[[Any], Any], str]:
    """The all-reduce of `redop` over the mesh axis, and what it is called in the report."""
    import jax.numpy as jnp
    from jax import lax

    if redop == "sum":
        return (lambda x: lax.psum(x, axis)), "psum"
    if redop == "max":
        return (lambda x: lax.pmax(x, axis)), "pmax"
    if redop == "min":
        return (lambda x: lax.pmin(x, axis)), "pmin"
    if redop == "prod":
        primitive = _pprod_primitive()
        return (lambda x: primitive.bind(x, axes=(axis,), axis_index_groups=None)), "all-reduce (multiply)"
    if redop == "avg":
        if is_integer:  # the mean of integers, truncated as an integer all-reduce average is
            return (lambda x: lax.div(lax.psum(x, axis), jnp.asarray(ranks, x.dtype))), "psum / n"
        return (lambda x: lax.psum(x, axis) / jnp.asarray(ranks, x.dtype)), "psum / n"
    raise ValueError(f"unknown reduction {redop}")


def build_collective(jax: Any, test: Case, plan: MeshPlan, *, root: int = 0, shift: int = 1,
                     is_integer: bool = False) -> Collective:
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import NamedSharding, PartitionSpec

    axis, ranks = plan.axis, plan.ranks
    last = len(plan.shape)  # the buffer axis inside each device's block
    op, redop = test.op.name, test.redop
    implementation: str
    body: Callable[[Any], Any]

    if op == "all-reduce":
        body, implementation = _all_reduce(axis, redop, ranks, is_integer)
    elif op == "all-gather":
        body, implementation = (lambda x: lax.all_gather(x, axis, axis=last, tiled=True)), "all_gather"
    elif op == "reduce-scatter":
        body = lambda x: lax.psum_scatter(x, axis, scatter_dimension=last, tiled=True)  # noqa: E731
        implementation = "psum_scatter"
    elif op == "all-to-all":
        body = lambda x: lax.all_to_all(x, axis, last, last, tiled=True)  # noqa: E731
        implementation = "all_to_all"
    elif op == "permute":
        pairs = [(r, (r + shift) % ranks) for r in range(ranks)]
        body, implementation = (lambda x: lax.ppermute(x, axis, pairs)), f"ppermute (shift {shift})"
    elif op == "broadcast":
        implementation = broadcast_implementation(plan.devices[0].platform)
        if implementation == "collective-broadcast":
            body = lambda x: lax.pbroadcast(x, axis, root)  # noqa: E731
        else:
            body = lambda x: lax.psum(jnp.where(lax.axis_index(axis) == root, x, jnp.zeros_like(x)), axis)  # noqa: E731
        implementation += f" (root {root})"
    else:
        raise ValueError(f"unknown op {op}")

    if op == "all-gather":
        def in_place_body(x: Any) -> Any:  # the own chunk sits at rank x count in the full buffer
            chunk = x.shape[last] // ranks
            own = lax.dynamic_slice_in_dim(x, lax.axis_index(axis) * chunk, chunk, axis=last)
            return body(own)
    elif op == "reduce-scatter":
        def in_place_body(x: Any) -> Any:  # the reduced chunk lands at rank x count of the input
            reduced = body(x)
            return lax.dynamic_update_slice_in_dim(x, reduced, lax.axis_index(axis) * reduced.shape[last],
                                                   axis=last)
    else:
        def in_place_body(x: Any) -> Any:  # the same program as out of place
            return body(x)

    spec = PartitionSpec(*plan.names, None)
    mapped = jax.shard_map(body, mesh=plan.mesh, in_specs=spec, out_specs=spec, check_vma=False)
    in_place = jax.shard_map(in_place_body, mesh=plan.mesh, in_specs=spec, out_specs=spec, check_vma=False)

    def timed(x: Any, previous: Any) -> Any:
        del previous  # an argument only: the call waits until the previous call's output exists
        return mapped(x)

    return Collective(jax.jit(mapped), implementation, NamedSharding(plan.mesh, spec),
                      timed=jax.jit(timed, keep_unused=True), in_place=jax.jit(in_place, donate_argnums=0))
