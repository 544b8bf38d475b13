"""A decoder-only transformer: configuration, parameters, forward pass, loss, train step, FLOPs.

The reference model of `tpu-bench train`, `infer` and `compile`, and of the
profiler's HLO analysis, so every tool measures and lowers the same program.
Pure jax, no framework: parameters are a dict of arrays, the optimizer is AdamW
written out, layers are unrolled (a scanned loop would hide its trip count from
XLA's cost analysis, which the benchmarks cross-check against).

jax is imported inside the functions: importing this module costs nothing and
never initialises a runtime (the caller applies its runtime policy first).

    config = config_for("tiny")
    step, state_sharding, batch_sharding = data_parallel_train_step(config, jax.local_devices())
    state = jax.device_put(init_train_state(config, jax.random.key(0)), state_sharding)
    batch = jax.device_put(random_tokens(config, 16, jax.random.key(1)), batch_sharding)
    state, loss = step(state, batch)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

COMPUTE_DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class TransformerConfig:
    vocab_size: int
    seq_len: int
    d_model: int
    n_heads: int
    n_layers: int
    d_ff: int
    batch_per_device: int = 8  # default batch of the benchmarks, per data-parallel device
    dtype: str = "float32"  # compute dtype; parameters and optimizer state stay float32

    def __post_init__(self) -> None:
        for name in ("vocab_size", "seq_len", "d_model", "n_heads", "n_layers", "d_ff", "batch_per_device"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive whole number, got {value!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be a multiple of n_heads ({self.n_heads})")
        if self.dtype not in COMPUTE_DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(COMPUTE_DTYPES)}, got {self.dtype!r}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


PRESETS: dict[str, TransformerConfig] = {
    "tiny": TransformerConfig(vocab_size=1024, seq_len=128, d_model=128, n_heads=4, n_layers=2, d_ff=512),
    "small": TransformerConfig(vocab_size=8192, seq_len=256, d_model=512, n_heads=8, n_layers=6, d_ff=2048),
    "base": TransformerConfig(vocab_size=32768, seq_len=1024, d_model=768, n_heads=12, n_layers=12, d_ff=3072),
}


@dataclass(frozen=True)
class AdamW:
    learning_rate: float = 3e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1


def config_for(preset: str, **overrides: Any) -> TransformerConfig:
    """A preset's configuration with some fields replaced (None values are ignored).

    Raises KeyError for an unknown preset and ValueError for a bad size.
    """
    if preset not in PRESETS:
        raise KeyError(preset)
    return replace(PRESETS[preset], **{k: v for k, v in overrides.items() if v is not None})


# --- parameters ---------------------------------------------------------------------------------------

def parameter_shapes(config: TransformerConfig) -> dict[str, Any]:
    """The parameter tree as shapes (tuples), the same structure `init_params` returns."""
    d, f = config.d_model, config.d_ff
    layer = {
        "ln1_scale": (d,), "ln1_bias": (d,),
        "w_qkv": (d, 3 * d), "w_out": (d, d),
        "ln2_scale": (d,), "ln2_bias": (d,),
        "w_up": (d, f), "b_up": (f,), "w_down": (f, d), "b_down": (d,),
    }
    return {
        "embedding": (config.vocab_size, d),  # tied: also the output projection
        "position": (config.seq_len, d),
        "layers": [dict(layer) for _ in range(config.n_layers)],
        "ln_final_scale": (d,), "ln_final_bias": (d,),
    }


def parameter_count(config: TransformerConfig) -> int:
    return sum(math.prod(shape) for shape in _leaves(parameter_shapes(config)))


def _leaves(tree: Any) -> list[tuple[int, ...]]:
    if isinstance(tree, dict):
        return [leaf for value in tree.values() for leaf in _leaves(value)]
    if isinstance(tree, list):
        return [leaf for value in tree for leaf in _leaves(value)]
    return [tree]


def init_params(config: TransformerConfig, key: Any) -> dict[str, Any]:
    """Random float32 parameters: N(0, 0.02) matrices, unit norm scales, zero biases."""
    import jax
    import jax.numpy as jnp

    shapes = parameter_shapes(config)
    names = [("embedding", shapes["embedding"]), ("position", shapes["position"])]
    keys = iter(jax.random.split(key, 2 + 4 * config.n_layers))

    def matrix(shape: tuple[int, ...]) -> Any:
        return 0.02 * jax.random.normal(next(keys), shape, jnp.float32)

    params: dict[str, Any] = {name: matrix(shape) for name, shape in names}
    params["layers"] = []
    for layer_shapes in shapes["layers"]:
        layer = {}
        for name, shape in layer_shapes.items():
            if name.startswith("w_"):
                layer[name] = matrix(shape)
            elif name.endswith("_scale"):
                layer[name] = jnp.ones(shape, jnp.float32)
            else:
                layer[name] = jnp.zeros(shape, jnp.float32)
        params["layers"].append(layer)
    params["ln_final_scale"] = jnp.ones(shapes["ln_final_scale"], jnp.float32)
    params["ln_final_bias"] = jnp.zeros(shapes["ln_final_bias"], jnp.float32)
    return params


def init_train_state(config: TransformerConfig, key: Any) -> dict[str, Any]:
    """Parameters plus AdamW moments and the step counter."""
    import jax
    import jax.numpy as jnp

    params = init_params(config, key)
    zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
    return {"params": params, "mu": zeros, "nu": jax.tree_util.tree_map(jnp.zeros_like, params),
            "step": jnp.zeros((), jnp.int32)}


def random_tokens(config: TransformerConfig, batch_size: int, key: Any) -> Any:
    """A batch of random token ids, [batch, seq_len + 1]: inputs and their next-token targets."""
    import jax
    import jax.numpy as jnp

    return jax.random.randint(key, (batch_size, config.seq_len + 1), 0, config.vocab_size, jnp.int32)


# --- the model ----------------------------------------------------------------------------------------

def _layer_norm(x: Any, scale: Any, bias: Any) -> Any:
    import jax.numpy as jnp

    mean = jnp.mean(x, axis=-1, keepdims=True)
    variance = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * (1.0 / jnp.sqrt(variance + 1e-5)) * scale + bias


def _attention(x: Any, layer: dict[str, Any], config: TransformerConfig) -> Any:
    import jax
    import jax.numpy as jnp

    batch, seq, d = x.shape
    heads, head_dim = config.n_heads, config.head_dim
    qkv = x @ layer["w_qkv"]
    q, k, v = (t.reshape(batch, seq, heads, head_dim) for t in jnp.split(qkv, 3, axis=-1))
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(head_dim)
    causal = jnp.tril(jnp.ones((seq, seq), bool))
    scores = jnp.where(causal, scores, jnp.finfo(scores.dtype).min)
    weights = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(x.dtype)
    attended = jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(batch, seq, d)
    return attended @ layer["w_out"]


def _mlp(x: Any, layer: dict[str, Any]) -> Any:
    import jax

    return jax.nn.gelu(x @ layer["w_up"] + layer["b_up"]) @ layer["w_down"] + layer["b_down"]


def forward(params: dict[str, Any], tokens: Any, config: TransformerConfig) -> Any:
    """Logits [batch, seq, vocab] (float32) for token ids [batch, seq] (seq <= config.seq_len)."""
    import jax
    import jax.numpy as jnp

    dtype = jnp.dtype(config.dtype)
    p = jax.tree_util.tree_map(lambda a: a.astype(dtype), params)
    seq = tokens.shape[1]
    x = jnp.take(p["embedding"], tokens, axis=0) + p["position"][:seq]
    for layer in p["layers"]:
        x = x + _attention(_layer_norm(x, layer["ln1_scale"], layer["ln1_bias"]), layer, config)
        x = x + _mlp(_layer_norm(x, layer["ln2_scale"], layer["ln2_bias"]), layer)
    x = _layer_norm(x, p["ln_final_scale"], p["ln_final_bias"])
    return (x @ p["embedding"].T).astype(jnp.float32)


def loss_fn(params: dict[str, Any], batch: Any, config: TransformerConfig) -> Any:
    """Mean next-token cross-entropy of a [batch, seq_len + 1] token batch."""
    import jax
    import jax.numpy as jnp

    inputs, targets = batch[:, :-1], batch[:, 1:]
    logits = forward(params, inputs, config)
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    picked = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    return -jnp.mean(picked)


def adamw_update(state: dict[str, Any], grads: dict[str, Any], optimizer: AdamW) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    step = state["step"] + 1
    t = step.astype(jnp.float32)
    mu = jax.tree_util.tree_map(lambda m, g: optimizer.beta1 * m + (1 - optimizer.beta1) * g, state["mu"], grads)
    nu = jax.tree_util.tree_map(lambda v, g: optimizer.beta2 * v + (1 - optimizer.beta2) * g * g, state["nu"],
                                grads)
    mu_scale = 1.0 / (1 - optimizer.beta1 ** t)
    nu_scale = 1.0 / (1 - optimizer.beta2 ** t)

    def update(p: Any, m: Any, v: Any) -> Any:
        direction = (m * mu_scale) / (jnp.sqrt(v * nu_scale) + optimizer.eps)
        return p - optimizer.learning_rate * (direction + optimizer.weight_decay * p)

    params = jax.tree_util.tree_map(update, state["params"], mu, nu)
    return {"params": params, "mu": mu, "nu": nu, "step": step}


def train_step(state: dict[str, Any], batch: Any, config: TransformerConfig,
               optimizer: AdamW = AdamW()) -> tuple[dict[str, Any], Any]:
    """One optimizer step: forward, loss, gradients, AdamW update. Returns (new state, loss)."""
    import jax

    loss, grads = jax.value_and_grad(loss_fn)(state["params"], batch, config)
    return adamw_update(state, grads, optimizer), loss


def data_parallel_train_step(config: TransformerConfig, devices: list[Any], optimizer: AdamW = AdamW(),
                             donate: bool = True) -> tuple[Any, Any, Any]:
    """The train step jitted for data parallelism over `devices`.

    Returns (step, state_sharding, batch_sharding): the state is replicated, the
    batch split along its first axis (its size must be a multiple of the device
    count), and XLA inserts the gradient all-reduce.
    """
    import functools

    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.array(devices), ("data",))
    replicated = NamedSharding(mesh, PartitionSpec())
    batch_sharding = NamedSharding(mesh, PartitionSpec("data"))
    step = jax.jit(functools.partial(train_step, config=config, optimizer=optimizer),
                   in_shardings=(replicated, batch_sharding), out_shardings=(replicated, replicated),
                   donate_argnums=(0,) if donate else ())
    return step, replicated, batch_sharding


def forward_step(config: TransformerConfig) -> Any:
    """The forward pass jitted for inference: (params, tokens [batch, seq]) -> logits."""
    import functools

    import jax

    return jax.jit(functools.partial(forward, config=config))


# --- FLOPs --------------------------------------------------------------------------------------------

def forward_flops(config: TransformerConfig, batch_size: int, seq_len: int | None = None) -> int:
    """Matrix-multiply FLOPs of one forward pass (2 per multiply-add), attention counted in full.

    Elementwise work (norms, softmax, GELU) is left out, as in the usual "model FLOPs".
    """
    s = config.seq_len if seq_len is None else seq_len
    tokens = batch_size * s
    d, f = config.d_model, config.d_ff
    projections = 2 * tokens * (3 * d * d + d * d + 2 * d * f)
    attention = 2 * 2 * batch_size * s * s * d  # scores (q k^T) and the weighted sum of values
    logits = 2 * tokens * d * config.vocab_size
    return config.n_layers * (projections + attention) + logits


def train_step_flops(config: TransformerConfig, batch_size: int) -> int:
    """Model FLOPs of one training step: forward plus a backward pass twice its cost."""
    return 3 * forward_flops(config, batch_size)
