"""What XLA makes of one function: its StableHLO, optimised HLO, cost and memory analysis, compile time.

The target is "module:function" (a plain or jitted function), called with
abstract arguments given as shape specs ("f32[128,512]", "bf16[8]", "i32[]").
Nothing is executed: the function is lowered and compiled only.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from tpu_tools.errors import RuntimeFailure, first_line
from tpu_tools.profile.reach import OutputReach, mesh_of, output_reach
from tpu_tools.userfn.roofline import Roofline, chip_by_name, compute_dtype, roofline
from tpu_tools.userfn.specs import describe_argument, short_dtype
from tpu_tools.userfn.target import check_arity

SCHEMA = "tpu-tools/profile-hlo/v1"


class CostFigures(msgspec.Struct, kw_only=True):
    """XLA's cost analysis of the compiled program (None: the backend does not report it)."""

    flops: float | None
    transcendentals: float | None
    bytes_accessed: float | None
    output_bytes_accessed: float | None


class MemoryFigures(msgspec.Struct, kw_only=True):
    """XLA's memory analysis of the compiled program (None: the backend does not report it)."""

    argument_bytes: int | None
    output_bytes: int | None
    alias_bytes: int | None
    temp_bytes: int | None
    generated_code_bytes: int | None
    peak_bytes: int | None


class HloFiles(msgspec.Struct, kw_only=True):
    stablehlo: str
    optimized_hlo: str


class HloDocument(msgspec.Struct, kw_only=True):
    """`tpu-profile hlo`'s document (schema `tpu-tools/profile-hlo/v1`), in its JSON key order."""

    schema: str
    target: str
    args: list[str]
    platform: str
    device_kind: str
    files: HloFiles | None  # None until write_hlo_files
    lowering_time_s: float
    compile_time_s: float
    cost: CostFigures
    memory: MemoryFigures
    roofline: Roofline
    model_flops: int | None
    xla_to_model_flops_ratio: float | None
    outputs: list[OutputReach]


@dataclass
class HloAnalysis:
    target: str
    args: list[str]
    platform: str
    device_kind: str
    lowering_time_s: float
    compile_time_s: float
    cost: CostFigures
    memory: MemoryFigures
    roofline: Roofline
    stablehlo_text: str
    optimized_hlo_text: str
    files: HloFiles | None = None  # set by write_hlo_files
    model_flops: int | None = None  # analytic count, for built-in workloads
    outputs: list[OutputReach] = field(default_factory=list)  # the reach of each output (profile.reach)

    @property
    def model_flops_ratio(self) -> float | None:
        """XLA's FLOPs over the analytic count (1.0: they agree)."""
        flops = self.cost.flops
        return round(flops / self.model_flops, 4) if flops and self.model_flops else None

    def report(self) -> HloDocument:
        return HloDocument(schema=SCHEMA, target=self.target, args=self.args, platform=self.platform,
                           device_kind=self.device_kind, files=self.files, lowering_time_s=self.lowering_time_s,
                           compile_time_s=self.compile_time_s, cost=self.cost, memory=self.memory,
                           roofline=self.roofline, model_flops=self.model_flops,
                           xla_to_model_flops_ratio=self.model_flops_ratio, outputs=self.outputs)


def write_hlo_files(analysis: HloAnalysis, out_dir: Path) -> HloFiles:
    """The StableHLO and the optimised HLO, as files named after the target."""
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", analysis.target.replace(":", ".")).strip("_")
    stablehlo = out_dir / f"{stem}.stablehlo.mlir"
    optimized = out_dir / f"{stem}.optimized.hlo.txt"
    from tpu_tools.atomic import write_file

    # regenerated on every run, so replaced; a FIFO or device at either name is never renamed over
    write_file(stablehlo, analysis.stablehlo_text, force=True, what="the StableHLO file")
    write_file(optimized, analysis.optimized_hlo_text, force=True, what="the optimised HLO file")
    analysis.files = HloFiles(stablehlo=str(stablehlo), optimized_hlo=str(optimized))
    return analysis.files


def analyse(target: str, function: Any, arguments: list[Any], chip: str | None = None) -> HloAnalysis:
    """Lower and compile `function` for abstract `arguments` (ShapeDtypeStructs, or pytrees of them) on the
    default device; nothing is executed."""
    import jax

    chip_spec = chip_by_name(chip) if chip else None
    check_arity(target, function, len(arguments))
    texts = [describe_argument(jax, argument) for argument in arguments]
    jitted = function if hasattr(function, "lower") else jax.jit(function)
    started = time.perf_counter()
    try:
        lowered = jitted.lower(*arguments)
    except Exception as error:
        raise RuntimeFailure(f"tracing {target} with {', '.join(texts) or 'no arguments'} failed: "
                             f"{type(error).__name__}: {first_line(error, default='')}") from error
    lowering_s = time.perf_counter() - started
    started = time.perf_counter()
    try:
        compiled = lowered.compile()
    except Exception as error:
        raise RuntimeFailure(f"XLA could not compile {target}: "
                             f"{type(error).__name__}: {first_line(error, default='')}") from error
    compile_s = time.perf_counter() - started

    device = jax.devices()[0]
    cost = _cost(compiled)
    if chip_spec is None:
        from tpu_tools.accelerators import spec_for_device_kind

        chip_spec = spec_for_device_kind(device.device_kind)
    dtypes = [short_dtype(leaf.dtype) for leaf in jax.tree_util.tree_leaves(arguments)]
    verdict = roofline(cost.flops, cost.bytes_accessed, chip_spec, compute_dtype(dtypes), device.device_kind)
    if chip_spec is not None and chip_spec.platform != device.platform:
        elsewhere = (f"the cost analysis comes from the {device.platform} compile; XLA for {chip_spec.name} fuses "
                     "differently, so its bytes accessed may differ")
        verdict.note = f"{verdict.note}; {elsewhere}" if verdict.note else elsewhere
    optimized = compiled.as_text() or ""
    return HloAnalysis(target, texts, device.platform, device.device_kind, round(lowering_s, 6),
                       round(compile_s, 6), cost, _memory(compiled), verdict, lowered.as_text(),
                       optimized, outputs=_reach(optimized, compiled))


def _reach(optimized: str, compiled: Any) -> list[OutputReach]:
    try:
        return output_reach(optimized, mesh_of(compiled))
    except Exception:  # noqa: BLE001 HLO text this reader does not follow: the rest of the report stands
        return []


def _cost(compiled: Any) -> CostFigures:
    try:
        analysis = compiled.cost_analysis()
    except Exception:  # noqa: BLE001 some backends do not implement it
        analysis = None
    if isinstance(analysis, list | tuple):
        analysis = analysis[0] if analysis else None
    analysis = analysis or {}

    def value(key: str) -> float | None:
        found = analysis.get(key)
        return float(found) if found is not None else None

    return CostFigures(flops=value("flops"), transcendentals=value("transcendentals"),
                       bytes_accessed=value("bytes accessed"), output_bytes_accessed=value("bytes accessedout{}"))


def _memory(compiled: Any) -> MemoryFigures:
    try:
        stats = compiled.memory_analysis()
    except Exception:  # noqa: BLE001 a backend without memory analysis: the figures are unknown
        stats = None
    names = {"argument_bytes": "argument_size_in_bytes", "output_bytes": "output_size_in_bytes",
             "alias_bytes": "alias_size_in_bytes", "temp_bytes": "temp_size_in_bytes",
             "generated_code_bytes": "generated_code_size_in_bytes", "peak_bytes": "peak_memory_in_bytes"}
    return MemoryFigures(**{key: (int(getattr(stats, attribute)) if stats is not None
                                  and getattr(stats, attribute, None) is not None else None)
                            for key, attribute in names.items()})
