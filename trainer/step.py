"""The optimizer and the jit-compiled train and eval steps.

State = {"step", "params" (the trained float32 masters: all weights, or only the LoRA adapters),
"opt_state"}; with LoRA the frozen base weights travel beside it in the compute dtype, not donated,
not checkpointed (they are reloaded from --weights). A full fine-tune has no frozen tree: None.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from trainer import loss, models

State = dict[str, Any]


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimizerConfig:
    lr: float
    lr_schedule: str  # cosine | constant (after the linear warmup)
    warmup_steps: int
    total_steps: int
    weight_decay: float
    grad_clip: float


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


def build_optimizer(config: OptimizerConfig) -> optax.GradientTransformation:
    """AdamW with global-norm clipping; weight decay on matrices only (not norms' scales)."""
    return optax.chain(
        optax.clip_by_global_norm(config.grad_clip),
        optax.adamw(
            learning_rate_schedule(config),
            weight_decay=config.weight_decay,
            mask=lambda params: jax.tree.map(lambda p: p.ndim >= 2, params),
        ),
    )


def model_params(trained, frozen):
    """The model's whole parameter tree: `trained` alone in a full fine-tune (`frozen` is None),
    else LoRA's adapters joined to the frozen base."""
    return trained if frozen is None else models.join_lora(frozen, trained)


def forward_params(trained, frozen, compute_dtype):
    """The weights the model runs with, in the compute dtype."""
    return jax.tree.map(lambda p: p.astype(compute_dtype), model_params(trained, frozen))


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepFunctions:
    """What the loop calls: `train(state, frozen, batch) -> (state, metrics)`, `evaluate(state, frozen, batch) -> sums`."""

    train: Callable
    evaluate: Callable


def make_step_functions(
    model,
    optimizer: optax.GradientTransformation,
    *,
    compute_dtype,
    softcap: float | None,
    vocab_chunk: int | None,
    state_shardings=None,
) -> StepFunctions:
    def loss_sums(trained, frozen, batch):
        params = forward_params(trained, frozen, compute_dtype)
        return loss.loss_sums(model, params, batch, softcap=softcap, vocab_chunk=vocab_chunk)

    def mean_loss(trained, frozen, batch):
        total, count = loss_sums(trained, frozen, batch)
        return total / jnp.maximum(count, 1.0)

    def train(state: State, frozen, batch):
        mean, grads = jax.value_and_grad(mean_loss)(state["params"], frozen, batch)
        updates, opt_state = optimizer.update(grads, state["opt_state"], state["params"])
        new_state = {
            "step": state["step"] + 1,
            "params": optax.apply_updates(state["params"], updates),
            "opt_state": opt_state,
        }
        metrics = {
            "loss": mean,
            "grad_norm": optax.tree.norm(grads),
            "tokens": jnp.sum(batch["segment_ids"] > 0),  # non-padding
        }
        return new_state, metrics

    def evaluate(state: State, frozen, batch):
        return loss_sums(state["params"], frozen, batch)

    return StepFunctions(
        train=jax.jit(train, donate_argnums=0, out_shardings=(state_shardings, None) if state_shardings else None),
        evaluate=jax.jit(evaluate),
    )


def fresh_state(params, optimizer: optax.GradientTransformation) -> State:
    """The state before step 1: the float32 `params` and the optimizer's initial state for them."""
    return {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": optimizer.init(params)}


def init_state(params, optimizer: optax.GradientTransformation, *, state_shardings_fn: Callable) -> State:
    """fresh_state, built sharded by `state_shardings_fn(tree)`; `params` is donated."""
    build = functools.partial(fresh_state, optimizer=optimizer)
    shardings = state_shardings_fn(jax.eval_shape(build, params))
    return jax.jit(build, out_shardings=shardings, donate_argnums=0)(params)


def abstract_state(params, optimizer: optax.GradientTransformation, *, state_shardings_fn: Callable) -> State:
    """What init_state would build, as shapes, dtypes and shardings only: the target a checkpoint is
    restored into. `params` may be shapes too."""
    shapes = jax.eval_shape(functools.partial(fresh_state, optimizer=optimizer), params)
    with_sharding = lambda s, sharding: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding)  # noqa: E731
    return jax.tree.map(with_sharding, shapes, state_shardings_fn(shapes))
