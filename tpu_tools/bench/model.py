"""Model options shared by the `train`, `infer` and `compile` benchmarks: a preset plus overrides."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tpu_tools.bench.figures import record_rate, record_times
from tpu_tools.bench.records import Case, CaseResult
from tpu_tools.bench.timing import Measurement
from tpu_tools.workloads.transformer import PRESETS, TransformerConfig, config_for

# Beyond these a model is no benchmark any device runs: a usage error, not an out-of-memory.
LIMITS = {"vocab_size": 1 << 24, "seq_len": 1 << 20, "d_model": 1 << 16, "n_heads": 1 << 12,
          "n_layers": 1 << 12, "d_ff": 1 << 18, "batch_per_device": 1 << 20}


@dataclass(frozen=True)
class ModelChoice:
    preset: str = "tiny"
    overrides: dict[str, Any] = field(default_factory=dict)

    def config(self) -> TransformerConfig:
        """Raises ValueError with a sentence for an unknown preset or a bad or absurd size."""
        if self.preset not in PRESETS:
            raise ValueError(f"unknown model preset {self.preset!r}: choose one of {', '.join(PRESETS)}")
        for name, value in self.overrides.items():
            if value is not None and name in LIMITS and isinstance(value, int) and value > LIMITS[name]:
                raise ValueError(f"{name.replace('_', '-')} {value} is absurdly large (at most {LIMITS[name]})")
        return config_for(self.preset, **self.overrides)

    @property
    def label(self) -> str:
        shown = {k: v for k, v in self.overrides.items() if v is not None}
        return self.preset if not shown else self.preset + "+custom"


def state_bytes(parameters: int) -> int:
    """float32 parameters, gradients and two AdamW moments."""
    return 4 * 4 * parameters


def activation_bytes(config: TransformerConfig, batch: int, training: bool) -> int:
    """A rough upper bound of live activations, to refuse what cannot fit before trying."""
    itemsize = 2 if config.dtype in ("bfloat16", "float16") else 4
    tokens = batch * config.seq_len
    per_layer = tokens * (8 * config.d_model + 2 * config.d_ff) + batch * config.n_heads * config.seq_len ** 2 * 2
    logits = tokens * config.vocab_size * (3 if training else 1)
    layers = config.n_layers if training else 1
    return itemsize * per_layer * layers + 4 * logits


def model_name(choice: ModelChoice, config: TransformerConfig) -> str:
    """A preset's name, or every size of a custom model (the name keys comparisons between runs)."""
    if not any(v is not None for v in choice.overrides.values()):
        return choice.preset
    return (f"custom l{config.n_layers}-d{config.d_model}-h{config.n_heads}-f{config.d_ff}-s{config.seq_len}"
            f"-v{config.vocab_size}-b{config.batch_per_device}-{config.dtype}")


_PEAK_DTYPE = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}


def peak_dtype(config: TransformerConfig) -> str:
    """The matmul dtype whose peak bounds this model's FLOP rate."""
    return _PEAK_DTYPE[config.dtype]


def cost_per_million(price_per_hour: float | None, samples_per_s: float) -> float | None:
    """What 1M samples cost at this throughput, in the price's currency."""
    if price_per_hour is None or samples_per_s <= 0:
        return None
    return price_per_hour / 3600.0 * 1e6 / samples_per_s


def throughput_result(case: Case, time_figure: str, measurement: Measurement, batch: int, config: TransformerConfig,
                      model_flops: float, peak_flops: float | None) -> CaseResult:
    """The figures train and infer share: time per call (ms), samples/s, tokens/s, achieved FLOP/s, MFU, cost.

    The calls are timed back to back. `model_flops` is the work of one call,
    `peak_flops` the peak of all devices doing it (None if unknown).
    """
    result = CaseResult(case, primary="samples_per_s")
    record_times(result, measurement, time_figure, 1e3)
    record_rate(result, measurement, "samples_per_s", batch, 1.0)
    record_rate(result, measurement, "tokens_per_s", batch * config.seq_len, 1.0)
    achieved = model_flops / (result.stats[time_figure].median / 1e3)
    price = case.params.get("price_per_hour")
    result.values.update({
        "achieved_tflops": achieved / 1e12,
        "peak_flops_per_s": peak_flops,
        "mfu_percent": 100 * achieved / peak_flops if peak_flops else None,
        "price_per_hour": price,
        "cost_per_1m_samples": cost_per_million(price, result.stats["samples_per_s"].median),
    })
    return result
