"""What XLA makes of one function: its StableHLO, optimised HLO, cost and memory analysis, compile time.

The target is "module:function" (a plain or jitted function), called with
abstract arguments given as shape specs ("f32[128,512]", "bf16[8]", "i32[]").
Nothing is executed: the function is lowered and compiled only.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
import os
import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpu_tools.errors import RuntimeFailure, UsageError, first_line
from tpu_tools.parsing import ascii_digits
from tpu_tools.profile.roofline import Roofline, chip_by_name, compute_dtype, roofline
from tpu_tools.shorten import quoted

SCHEMA = "tpu-tools/profile-hlo/v1"

# Short dtype names (as HLO prints them) -> numpy / ml_dtypes names.
DTYPES = {
    "pred": "bool", "bool": "bool",
    "s8": "int8", "s16": "int16", "s32": "int32", "s64": "int64",
    "i8": "int8", "i16": "int16", "i32": "int32", "i64": "int64",
    "u8": "uint8", "u16": "uint16", "u32": "uint32", "u64": "uint64",
    "f16": "float16", "bf16": "bfloat16", "f32": "float32", "f64": "float64",
    "c64": "complex64", "c128": "complex128",
    "f8e4m3fn": "float8_e4m3fn", "f8e5m2": "float8_e5m2",
}
MAX_RANK = 64
MAX_ARGUMENT_BYTES = 1 << 60  # far beyond any device, well inside XLA's int64 size arithmetic
_ITEM_BITS = {"bool": 8, "int8": 8, "uint8": 8, "float8_e4m3fn": 8, "float8_e5m2": 8, "int16": 16, "uint16": 16,
              "float16": 16, "bfloat16": 16, "int32": 32, "uint32": 32, "float32": 32, "int64": 64, "uint64": 64,
              "float64": 64, "complex64": 64, "complex128": 128}
_SPEC = re.compile(r"^\s*(?P<dtype>[a-z][a-z0-9]*)\s*(?:\[(?P<dims>[^\]]*)\])?\s*$")


@dataclass(frozen=True)
class ArgSpec:
    dtype: str  # short name, e.g. "f32"
    shape: tuple[int, ...]

    @property
    def text(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.shape))}]"


def parse_arg_spec(text: str) -> ArgSpec:
    """ "f32[128,512]" -> ArgSpec("f32", (128, 512)); "i32[]" and "i32" are scalars."""
    match = _SPEC.match(text.lower())
    shown = quoted(text, 60)
    if not match or match["dtype"] not in DTYPES:
        raise UsageError(f"bad --arg {shown}: expected DTYPE[DIM,...] such as f32[128,512], bf16[8] or i32[] "
                         f"(dtypes: {', '.join(sorted(set(DTYPES) - {'bool', 'i8', 'i16', 'i32', 'i64'}))})")
    dims_text = (match["dims"] or "").strip()
    dims: list[int] = []
    if dims_text:
        for part in dims_text.split(","):
            part = part.strip()
            if not ascii_digits(part) or len(part) > 19:  # str.isdigit() takes "²", which int() refuses
                raise UsageError(f"bad --arg {shown}: dimension {quoted(part, 24)} is not a whole number >= 0")
            dims.append(int(part))
    if len(dims) > MAX_RANK:
        raise UsageError(f"bad --arg {shown}: {len(dims)} dimensions, XLA takes at most {MAX_RANK}")
    dtype = match["dtype"]
    elements = math.prod(dims)
    # XLA computes sizes in int64 and aborts the process (no exception) on an overflow: refuse it here.
    if elements * _ITEM_BITS.get(DTYPES[dtype], 64) // 8 > MAX_ARGUMENT_BYTES:
        raise UsageError(f"bad --arg {shown}: {elements:.3g} elements is far beyond any device "
                         "(at most 1 EiB per argument)")
    canonical = {"bool": "pred", "i8": "s8", "i16": "s16", "i32": "s32", "i64": "s64"}.get(dtype, dtype)
    return ArgSpec(canonical, tuple(dims))


def _split_target(target: str) -> tuple[str, str]:
    module_name, sep, attribute = target.partition(":")
    if not sep or not module_name or not attribute:
        raise UsageError(f"bad target {target!r}: expected MODULE:FUNCTION, e.g. mypkg.model:loss")
    return module_name, attribute


@contextmanager
def _cwd_importable() -> Iterator[None]:
    """Modules of the current directory importable, as `python -c` would have them."""
    sys.path.insert(0, os.getcwd())
    try:
        yield
    finally:
        sys.path.pop(0)


def check_target(target: str) -> None:
    """Refuse a target that is not MODULE:FUNCTION, or whose top-level package is nowhere to be found.

    Run before jax is imported and its backend started (seconds on an accelerator), so that a typo is told at
    once; finding a top-level module imports nothing. The rest is judged by resolve_target.
    """
    module_name, _ = _split_target(target)
    top = module_name.partition(".")[0]
    if not top:  # a relative name: resolve_target says why it cannot be imported
        return
    try:
        with _cwd_importable():
            spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):  # a finder that fails: resolve_target says why
        return
    if spec is None:
        raise UsageError(f"cannot import module {module_name!r}: ModuleNotFoundError: No module named {top!r}")


def resolve_target(target: str) -> Any:
    """The callable named by "module:function" (attributes may be dotted: "module:Class.method")."""
    module_name, attribute = _split_target(target)
    try:
        with _cwd_importable():
            module = importlib.import_module(module_name)
    except Exception as error:
        raise UsageError(f"cannot import module {module_name!r}: {type(error).__name__}: {error}") from error
    value: Any = module
    for part in attribute.split("."):
        if not hasattr(value, part):
            raise UsageError(f"module {module_name!r} has no {attribute!r}")
        value = getattr(value, part)
    if inspect.isclass(value) or not callable(value):
        raise UsageError(f"{target} is not a function (it is {_describe(value)}); name a function to compile")
    return value


def _describe(value: Any) -> str:
    if inspect.isclass(value):
        return f"the class {value.__name__}"
    if inspect.ismodule(value):
        return "a module"
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


@dataclass
class HloAnalysis:
    target: str
    args: list[str]
    platform: str
    device_kind: str
    lowering_time_s: float
    compile_time_s: float
    cost: dict[str, float | None]
    memory: dict[str, int | None]
    roofline: Roofline
    stablehlo_text: str
    optimized_hlo_text: str
    files: dict[str, str] = field(default_factory=dict)  # set by write_hlo_files
    model_flops: int | None = None  # analytic count, for built-in workloads
    outputs: list[dict[str, Any]] = field(default_factory=list)  # the reach of each output (profile.reach)

    @property
    def model_flops_ratio(self) -> float | None:
        """XLA's FLOPs over the analytic count (1.0: they agree)."""
        flops = self.cost.get("flops")
        return round(flops / self.model_flops, 4) if flops and self.model_flops else None

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, "target": self.target, "args": self.args, "platform": self.platform,
                "device_kind": self.device_kind, "files": self.files, "lowering_time_s": self.lowering_time_s,
                "compile_time_s": self.compile_time_s, "cost": self.cost, "memory": self.memory,
                "roofline": self.roofline.to_dict(), "model_flops": self.model_flops,
                "xla_to_model_flops_ratio": self.model_flops_ratio, "outputs": self.outputs}


def write_hlo_files(analysis: HloAnalysis, out_dir: Path) -> dict[str, str]:
    """The StableHLO and the optimised HLO, as files named after the target."""
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", analysis.target.replace(":", ".")).strip("_")
    stablehlo = out_dir / f"{stem}.stablehlo.mlir"
    optimized = out_dir / f"{stem}.optimized.hlo.txt"
    from tpu_tools.atomic import write_file

    # regenerated on every run, so replaced; a FIFO or device at either name is never renamed over
    write_file(stablehlo, analysis.stablehlo_text, force=True, what="the StableHLO file")
    write_file(optimized, analysis.optimized_hlo_text, force=True, what="the optimised HLO file")
    analysis.files = {"stablehlo": str(stablehlo), "optimized_hlo": str(optimized)}
    return analysis.files


def abstract_arguments(specs: list[ArgSpec]) -> list[Any]:
    """jax.ShapeDtypeStruct for each --arg spec."""
    import jax
    import numpy as np

    return [jax.ShapeDtypeStruct(s.shape, _np_dtype(np, s.dtype)) for s in specs]


def analyse(target: str, function: Any, arguments: list[Any], chip: str | None = None) -> HloAnalysis:
    """Lower and compile `function` for abstract `arguments` (ShapeDtypeStructs, or pytrees of them) on the
    default device; nothing is executed."""
    import jax

    chip_spec = chip_by_name(chip) if chip else None
    _check_arity(target, function, len(arguments))
    texts = [_describe_argument(jax, argument) for argument in arguments]
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
    dtypes = [_short_dtype(leaf.dtype) for leaf in jax.tree_util.tree_leaves(arguments)]
    verdict = roofline(cost["flops"], cost["bytes_accessed"], chip_spec, compute_dtype(dtypes), device.device_kind)
    if chip_spec is not None and chip_spec.platform != device.platform:
        elsewhere = (f"the cost analysis comes from the {device.platform} compile; XLA for {chip_spec.name} fuses "
                     "differently, so its bytes accessed may differ")
        verdict.note = f"{verdict.note}; {elsewhere}" if verdict.note else elsewhere
    optimized = compiled.as_text() or ""
    return HloAnalysis(target, texts, device.platform, device.device_kind, round(lowering_s, 6),
                       round(compile_s, 6), cost, _memory(compiled), verdict, lowered.as_text(),
                       optimized, outputs=_reach(optimized, compiled))


def _reach(optimized: str, compiled: Any) -> list[dict[str, Any]]:
    from tpu_tools.profile.reach import mesh_of, output_reach

    try:
        return [r.to_dict() for r in output_reach(optimized, mesh_of(compiled))]
    except Exception:  # HLO text this reader does not follow: the rest of the report stands
        return []


_SHORT = {numpy_name: short for short, numpy_name in DTYPES.items()
          if short not in ("bool", "i8", "i16", "i32", "i64")}


def _short_dtype(dtype: Any) -> str:
    return _SHORT.get(str(dtype), str(dtype))


def _describe_argument(jax: Any, argument: Any) -> str:
    """"f32[128,512]" for an array; a pytree of arrays is counted."""
    if hasattr(argument, "shape") and hasattr(argument, "dtype"):
        return ArgSpec(_short_dtype(argument.dtype), tuple(argument.shape)).text
    leaves = jax.tree_util.tree_leaves(argument)
    return f"pytree of {len(leaves)} arrays"


def _np_dtype(np: Any, name: str) -> Any:
    numpy_name = DTYPES[name]
    if hasattr(np, numpy_name):
        return np.dtype(numpy_name)
    import ml_dtypes

    return np.dtype(getattr(ml_dtypes, numpy_name))


def _check_arity(target: str, function: Any, count: int) -> None:
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(*range(count))
    except TypeError as error:
        raise UsageError(f"{target} cannot be called with {count} argument(s) from --arg: {error}") from error


def _cost(compiled: Any) -> dict[str, float | None]:
    try:
        analysis = compiled.cost_analysis()
    except Exception:  # some backends do not implement it
        analysis = None
    if isinstance(analysis, list | tuple):
        analysis = analysis[0] if analysis else None
    analysis = analysis or {}

    def value(key: str) -> float | None:
        found = analysis.get(key)
        return float(found) if found is not None else None

    return {"flops": value("flops"), "transcendentals": value("transcendentals"),
            "bytes_accessed": value("bytes accessed"), "output_bytes_accessed": value("bytes accessedout{}")}


def _memory(compiled: Any) -> dict[str, int | None]:
    try:
        stats = compiled.memory_analysis()
    except Exception:
        stats = None
    names = {"argument_bytes": "argument_size_in_bytes", "output_bytes": "output_size_in_bytes",
             "alias_bytes": "alias_size_in_bytes", "temp_bytes": "temp_size_in_bytes",
             "generated_code_bytes": "generated_code_size_in_bytes", "peak_bytes": "peak_memory_in_bytes"}
    return {key: (int(getattr(stats, attribute)) if stats is not None and getattr(stats, attribute, None)
                  is not None else None) for key, attribute in names.items()}
