"""The optimizer: AdamW with global-norm clipping and a warmup-then-decay rate, in one of two precisions.

- "float32" (the default): float32 weights and second moment (16 bytes a parameter with the gradients;
  `--optimizer-state-dtype bfloat16` stores the first moment in bfloat16), optax's AdamW.
- "lean" (`--precision lean`): weights, gradients and both moments in bfloat16, 8 bytes a parameter.
  Each new value is computed in float32 and rounded to bfloat16 stochastically (up or down with the
  probabilities that make the rounding exact on average), so that an update below bfloat16's spacing
  is not lost as round-to-nearest loses it (at lr 2e-5 most of them: REFERENCE.md section 4), and the
  second moment's 0.1% a step still moves. The update is one elementwise pass over each weight.
- "lean-factored": lean, with the second moment of each matrix factored as Adafactor factors it: a
  float32 mean of the squared gradients per row and per column (over the last two axes) instead of a
  value per weight, their outer product over the rows' mean standing for it. About 6 bytes a
  parameter: what lets a full fine-tune of gemma3-4b at seq 1024 fit one v6e chip (docs/fit.md).
  As Adafactor does, it clips each weight's (leaf's) update to a root mean square of at most 1 before the
  learning rate multiplies it (update / max(1, RMS(update) / 1), optax's clip_by_block_rms): the rank-one
  estimate can be far below a weight's own squared gradient (a gradient concentrated on rows and columns
  that are otherwise quiet), and the first steps, with one gradient in the moments, would otherwise take
  steps of many times the learning rate across the whole matrix.

With `--vision-encoder-from-step S` (S > 1), a trained image encoder's updates start at step S, their rate rising over
--warmup-steps to the run's: Adam moves every weight by about the rate whatever its gradient, and while the
language model cannot yet read the images, the encoder's gradients are noise that would wash out its initial
features (tiny-vision, 300 steps: 18 of 50 held-out pictures right trained from step 1, 32 frozen, 33 from step 100).

The train step calls `Optimizer.update`, then `Optimizer.apply_updates`, as it called optax's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

PRECISIONS = ("float32", "lean", "lean-factored")
B1, B2, EPS = 0.9, 0.999, 1e-8  # optax.adamw's defaults, which both precisions use
UPDATE_CLIP = 1.0  # lean-factored: the largest RMS of a leaf's update, in learning rates (Adafactor's clipping_threshold)
_LOW_HALF = 0xFFFF


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimizerConfig:
    lr: float
    lr_schedule: str  # cosine | constant (after the linear warmup)
    warmup_steps: int
    total_steps: int
    weight_decay: float
    grad_clip: float
    state_dtype: str = "float32"  # AdamW's first moment (--optimizer-state-dtype), float32 precision
    precision: str = "float32"  # PRECISIONS (--precision)
    seed: int = 0  # of the stochastic rounding's bits (lean)
    encoder_from_step: int = 1  # a trained image encoder's first update (--vision-encoder-from-step)


def optimizer_config(config, *, total_steps: int) -> OptimizerConfig:
    """The optimizer of `config` (the run's TrainConfig) with a schedule of `total_steps`."""
    return OptimizerConfig(lr=config.lr, lr_schedule=config.lr_schedule, warmup_steps=config.warmup_steps, total_steps=total_steps,
                           weight_decay=config.weight_decay, grad_clip=config.grad_clip, state_dtype=config.optimizer_state_dtype,
                           precision=config.precision, seed=config.seed, encoder_from_step=config.vision_encoder_from_step)


def learning_rate_schedule(config: OptimizerConfig) -> optax.Schedule:
    """The rate of each step, by optimizer count (step 1 is count 0).

    Warmup rises linearly over the first `warmup_steps` steps, from lr/warmup_steps at step 1 to lr
    at step `warmup_steps`: no step trains at rate 0 (optax's warmup schedules start at 0, which
    would waste step 1 and report the initial weights' loss as its result). Then cosine decay to 0
    at `total_steps`, or a constant rate.
    """
    warmup = min(config.warmup_steps, config.total_steps)
    if config.lr_schedule == "cosine":
        after_warmup = optax.cosine_decay_schedule(config.lr, decay_steps=max(config.total_steps - warmup, 1))
    else:
        after_warmup = optax.constant_schedule(config.lr)
    if not warmup:
        return after_warmup
    ramp = optax.linear_schedule(config.lr / warmup, config.lr, transition_steps=warmup - 1)
    return optax.join_schedules([ramp, after_warmup], [warmup])


def _decayed(params):
    """Weight decay on matrices only (not norms' scales)."""
    return jax.tree.map(lambda p: p.ndim >= 2, params)


_ENCODER = "vision_encoder"  # the image encoder's branch of the trained tree (trainer.gemma3.model's module name)


def rate_factors(config: OptimizerConfig, params, count):
    """Each leaf's share of the step's rate at optimizer count `count`: 1.0 (a Python number, which multiplies
    nothing), but for an image encoder's leaves with `encoder_from_step` > 1, 0 before that step, then rising
    linearly over the warmup to 1."""
    warmup = max(min(config.warmup_steps, config.total_steps), 1)
    delayed = jnp.clip((count + 2 - config.encoder_from_step) / warmup, 0.0, 1.0)
    return jax.tree_util.tree_map_with_path(
        lambda path, _: delayed if config.encoder_from_step > 1 and getattr(path[0], "key", None) == _ENCODER else 1.0, params)


def _scaled(value, factor):
    return value if isinstance(factor, float) else value * factor.astype(value.dtype)


def _delayed_encoder(config: OptimizerConfig) -> optax.GradientTransformation:
    """Scales the updates by rate_factors (its state: the count)."""
    def update(updates, count, params=None):
        return jax.tree.map(_scaled, updates, rate_factors(config, updates, count)), count + 1

    return optax.GradientTransformation(lambda params: jnp.zeros((), jnp.int32), update)


@dataclasses.dataclass(frozen=True)
class Optimizer:
    """`init(params) -> state`; `update(grads, state, params) -> (updates, state)` and
    `apply_updates(params, updates) -> params`, as optax splits them (the train step calls both, in
    that order); `param_dtype`: the dtype the trained weights are kept in between steps. The lean
    update's "updates" are the new weights themselves: rounding them needs each whole value."""

    init: Callable[[Any], Any]
    update: Callable[[Any, Any, Any], tuple[Any, Any]]
    apply_updates: Callable[[Any, Any], Any]
    param_dtype: Any

    def apply(self, grads, state, params) -> tuple[Any, Any]:
        """(new params, new state): one step."""
        updates, state = self.update(grads, state, params)
        return self.apply_updates(params, updates), state


def build_optimizer(config: OptimizerConfig) -> Optimizer:
    return _float32_adamw(config) if config.precision == "float32" else _lean_adamw(config, factored=config.precision == "lean-factored")


def _float32_adamw(config: OptimizerConfig) -> Optimizer:
    transform = optax.chain(
        optax.clip_by_global_norm(config.grad_clip),
        optax.adamw(learning_rate_schedule(config), b1=B1, b2=B2, eps=EPS, weight_decay=config.weight_decay, mask=_decayed,
                    mu_dtype=jnp.dtype(config.state_dtype)),
        *([_delayed_encoder(config)] if config.encoder_from_step > 1 else []),  # other runs keep their state's tree
    )

    return Optimizer(transform.init, transform.update, optax.apply_updates, jnp.float32)


def round_stochastically(value: jax.Array, noise: jax.Array) -> jax.Array:
    """float32 `value` as bfloat16, rounded up with probability (the dropped low 16 bits) / 2^16: adds
    `noise` (uniform in [0, 2^16), uint32) to the bit pattern and truncates. Exact on average."""
    bits = jax.lax.bitcast_convert_type(value.astype(jnp.float32), jnp.uint32)
    rounded = (bits + (noise & _LOW_HALF)) & ~jnp.uint32(_LOW_HALF)
    return jax.lax.bitcast_convert_type(rounded, jnp.float32).astype(jnp.bfloat16)


def hashed_noise(shape: tuple[int, ...], seed: jax.Array) -> jax.Array:
    """32 random-looking bits per element, uint32, from the element's index and `seed` through an integer
    hash (lowbias32's multiply-xorshift rounds). Elementwise, so XLA fuses it into the update: no
    [weight-sized] array of random bits is written to memory, as jax.random's would be."""
    index = jnp.zeros(shape, jnp.uint32)
    stride = 1
    for axis in reversed(range(len(shape))):
        index = index + jax.lax.broadcasted_iota(jnp.uint32, shape, axis) * jnp.uint32(stride & 0xFFFFFFFF)
        stride *= shape[axis]
    bits = index * jnp.uint32(0x9E3779B1) + seed.astype(jnp.uint32)
    for multiplier in (0x7FEB352D, 0x846CA68B):
        bits = (bits ^ (bits >> 16)) * jnp.uint32(multiplier)
    return bits ^ (bits >> 16)


def _factors(param) -> bool:
    """Whether a weight's second moment is factored: a matrix (the last two axes), neither axis of length 1."""
    return param.ndim >= 2 and min(param.shape[-2:]) > 1


def _second_moment_init(param, factored: bool):
    if factored and _factors(param):
        return {"rows": jnp.zeros(param.shape[:-1], jnp.float32), "columns": jnp.zeros((*param.shape[:-2], param.shape[-1]), jnp.float32)}
    return jnp.zeros(param.shape, jnp.bfloat16)


def _factored_second_moment(nu: dict, squared: jax.Array) -> tuple[dict, jax.Array]:
    """(the new row and column means, the estimate of every weight's second moment they give): Adafactor's
    rank-one estimate, rows x columns / mean of the rows, exact when the squared gradients are."""
    rows = B2 * nu["rows"] + (1 - B2) * jnp.mean(squared, axis=-1)
    columns = B2 * nu["columns"] + (1 - B2) * jnp.mean(squared, axis=-2)
    estimate = rows[..., :, None] * columns[..., None, :] / jnp.maximum(jnp.mean(rows, axis=-1), 1e-30)[..., None, None]
    return {"rows": rows, "columns": columns}, estimate


def _lean_adamw(config: OptimizerConfig, *, factored: bool) -> Optimizer:
    schedule = learning_rate_schedule(config)

    def init(params):
        zeros = lambda p: jnp.zeros(p.shape, jnp.bfloat16)  # noqa: E731
        return {"count": jnp.zeros((), jnp.int32), "mu": jax.tree.map(zeros, params),
                "nu": jax.tree.map(lambda p: _second_moment_init(p, factored), params)}

    def update(grads, state, params):
        count = state["count"] + 1
        norm = optax.tree.norm(jax.tree.map(lambda g: g.astype(jnp.float32), grads))
        clip = jnp.minimum(1.0, config.grad_clip / jnp.maximum(norm, 1e-30))
        rate = schedule(state["count"])
        first_correction, second_correction = 1 - B1 ** count, 1 - B2 ** count
        # One 32-bit draw a value feeds two roundings (its halves), a second draw the third; each leaf and step
        # hashes from its own seed.
        leaves, treedef = jax.tree.flatten(params)
        step_seed = jnp.uint32(config.seed) * jnp.uint32(0x85EBCA77) + count.astype(jnp.uint32) * jnp.uint32(0xC2B2AE3D)
        seeds = iter(step_seed + jnp.uint32(0x27D4EB2F) * jnp.arange(1, 2 * len(leaves) + 1, dtype=jnp.uint32))

        def update(param, grad, mu, nu, decayed, factor):
            grad = grad.astype(jnp.float32) * clip
            mu = B1 * mu.astype(jnp.float32) + (1 - B1) * grad
            if isinstance(nu, dict):
                nu, second_moment = _factored_second_moment(nu, grad * grad)
            else:
                nu = second_moment = B2 * nu.astype(jnp.float32) + (1 - B2) * grad * grad
            step = (mu / first_correction) / (jnp.sqrt(second_moment / second_correction) + EPS)
            if factored:  # Adafactor's update clipping, per leaf (the weight decay below is not clipped, as in optax.adafactor)
                step = step / jnp.maximum(1.0, jnp.sqrt(jnp.mean(jnp.square(step))) / UPDATE_CLIP)
            if decayed:
                step = step + config.weight_decay * param.astype(jnp.float32)
            first, second = (hashed_noise(param.shape, next(seeds)) for _ in range(2))
            return (round_stochastically(param.astype(jnp.float32) - _scaled(rate, factor) * step, first),
                    round_stochastically(mu, first >> 16), nu if isinstance(nu, dict) else round_stochastically(nu, second))

        flat = [update(*parts) for parts in zip(leaves, treedef.flatten_up_to(grads), treedef.flatten_up_to(state["mu"]),
                                                treedef.flatten_up_to(state["nu"]), treedef.flatten_up_to(_decayed(params)),
                                                treedef.flatten_up_to(rate_factors(config, params, state["count"])))]
        new_params, mu, nu = (treedef.unflatten([parts[i] for parts in flat]) for i in range(3))
        return new_params, {"count": count, "mu": mu, "nu": nu}

    return Optimizer(init, update, lambda params, new_params: new_params, jnp.bfloat16)
