"""The `tpu-profile hlo` report, rendered from a `tpu-tools/profile-hlo/v1` document."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpu_tools.profile.summary import relative_to_cwd
from tpu_tools.units import MISSING, format_bytes, format_duration_us, format_si

if TYPE_CHECKING:
    from tpu_tools.profile.hlo import HloDocument


def hlo_text(doc: HloDocument) -> str:
    cost, memory, roof = doc.cost, doc.memory, doc.roofline
    args = ", ".join(doc.args) or "no arguments"
    files = doc.files
    lines = [
        f"{doc.target}({args}) on {doc.platform} ({doc.device_kind})",
        f"  StableHLO:      {relative_to_cwd(files.stablehlo) if files else MISSING}",
        f"  optimised HLO:  {relative_to_cwd(files.optimized_hlo) if files else MISSING}",
        f"  lowering {format_duration_us(doc.lowering_time_s * 1e6)}, "
        f"XLA compile {format_duration_us(doc.compile_time_s * 1e6)}",
        "",
        "Cost analysis (XLA)",
        f"  FLOPs            {format_si(cost.flops)}",
        f"  transcendentals  {format_si(cost.transcendentals)}",
        f"  bytes accessed   {format_bytes(cost.bytes_accessed)}",
    ]
    if doc.model_flops:
        ratio = doc.xla_to_model_flops_ratio
        lines.append(f"  model FLOPs      {format_si(doc.model_flops)} (analytic, matrix multiplies; XLA counts "
                     f"{MISSING if ratio is None else f'{ratio:.2f}'}x that)")
    lines += [
        "",
        "Memory analysis (XLA)",
        f"  arguments        {format_bytes(memory.argument_bytes)}",
        f"  outputs          {format_bytes(memory.output_bytes)}",
        f"  aliased          {format_bytes(memory.alias_bytes)}",
        f"  temporaries      {format_bytes(memory.temp_bytes)}",
        f"  generated code   {format_bytes(memory.generated_code_bytes)}",
        "",
    ]
    outputs = doc.outputs
    if any(output.devices > 1 for output in outputs):
        lines += [f"Outputs across {outputs[0].devices} devices (the collectives on each output's path)"]
        lines += [f"  output {output.index}  {output.text}" for output in outputs]
        lines.append("")
    intensity = roof.arithmetic_intensity_flops_per_byte
    intensity_text = MISSING if intensity is None else f"{intensity:.2f} FLOP/byte"
    if roof.chip is None:
        lines += ["Roofline", f"  arithmetic intensity  {intensity_text}", f"  verdict  unknown: {roof.note}"]
    else:
        ridge = roof.ridge_point_flops_per_byte
        lines += [
            f"Roofline against {roof.chip} ({format_si(roof.peak_flops_per_s, 'FLOP/s')} {roof.peak_dtype}, "
            f"{format_si(roof.memory_bandwidth_bytes_per_s, 'B/s')})",
            f"  arithmetic intensity  {intensity_text} (ridge point "
            f"{MISSING if ridge is None else f'{ridge:.1f}'} FLOP/byte)",
            f"  verdict               {roof.bound + '-bound' if roof.bound else 'unknown'}",
            f"  best case             {format_duration_us(roof.best_case_time_us)} "
            f"(compute {format_duration_us(roof.compute_time_us)}, "
            f"memory {format_duration_us(roof.memory_time_us)})",
        ]
        if roof.note:
            lines.append(f"  note: {roof.note}")
    return "\n".join(lines)
