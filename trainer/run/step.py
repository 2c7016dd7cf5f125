"""The jit-compiled train and eval steps, around the optimizer (trainer.run.optimizer).

State = {"step", "params" (the trained masters, float32 or with --precision lean bfloat16: all weights,
or only the LoRA adapters),
"opt_state"}; with LoRA the frozen base weights travel beside it in the compute dtype, not donated,
not checkpointed (they are reloaded from --weights). A full fine-tune has no frozen tree: None.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import re
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec

from trainer.model import models
from trainer.nn import layers as layers_lib
from trainer.nn import loss
from trainer.run import hbm, mesh, vocab_chunk
from trainer.run import compile_answers
from trainer.run.optimizer import Optimizer, OptimizerConfig, build_optimizer, optimizer_config

State = dict[str, Any]


def model_params(trained, frozen):
    """The model's whole parameter tree: `trained` alone in a text model's full fine-tune (`frozen` is None),
    else joined to the frozen part (LoRA's base, a vision-language model's image encoder: models.trained_and_frozen)."""
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
    optimizer: Optimizer,
    *,
    compute_dtype,
    softcap: float | None,
    vocab_chunk: int | None,
    state_shardings=None,
    layers: layers_lib.LayerOptions = layers_lib.LayerOptions(),
    grad_accum_steps: int = 1,
) -> StepFunctions:
    """`grad_accum_steps` > 1: the train step runs the global batch as that many micro-batches in sequence
    (micro_batches) and updates once, with the loss and gradient of the whole global batch."""

    def loss_sums(trained, frozen, batch):
        params = forward_params(trained, frozen, compute_dtype)
        return loss.loss_sums(model, params, batch, softcap=softcap, vocab_chunk=vocab_chunk, layers=layers)

    def mean_loss(trained, frozen, batch):
        total, count = loss_sums(trained, frozen, batch)
        return total / jnp.maximum(count, 1.0)

    def accumulated_mean_loss_and_grads(trained, frozen, batch):
        # Each micro-batch's loss sum is divided by the GLOBAL batch's mask count before its gradient, so the
        # gradients add up to that of the global mean (not a mean of per-micro-batch means, which would
        # weight a mostly padded micro-batch's tokens as much as a full one's).
        scale = 1.0 / jnp.maximum(jnp.sum(batch["loss_mask"].astype(jnp.float32)), 1.0)

        def scaled_sum(trained, micro_batch):
            total, _ = loss_sums(trained, frozen, micro_batch)
            return total * scale

        def micro_step(carry, micro_batch):
            mean, grads = carry
            part, micro_grads = jax.value_and_grad(scaled_sum)(trained, micro_batch)
            return (mean + part, jax.tree.map(jnp.add, grads, micro_grads)), None

        # In the trained weights' dtype: float32 masters add float32 gradients; lean's bfloat16 weights get
        # bfloat16 sums (a float32 tree would add 4 bytes a trained parameter to lean's 8, README).
        zeros = jax.tree.map(jnp.zeros_like, trained)
        if state_shardings is not None:  # split as the weights are, not whole on every device
            zeros = jax.lax.with_sharding_constraint(zeros, state_shardings["params"])
        (mean, grads), _ = jax.lax.scan(micro_step, (jnp.zeros((), jnp.float32), zeros),
                                        micro_batches(batch, grad_accum_steps, layers))
        return mean, grads

    def train(state: State, frozen, batch):
        if grad_accum_steps == 1:
            mean, grads = jax.value_and_grad(mean_loss)(state["params"], frozen, batch)
        else:
            mean, grads = accumulated_mean_loss_and_grads(state["params"], frozen, batch)
        updates, opt_state = optimizer.update(grads, state["opt_state"], state["params"])
        new_state = {
            "step": state["step"] + 1,
            "params": optimizer.apply_updates(state["params"], updates),
            "opt_state": opt_state,
        }
        metrics = {
            "loss": mean,
            "grad_norm": optax.tree.norm(jax.tree.map(lambda g: g.astype(jnp.float32), grads)),
            "tokens": jnp.sum(batch["segment_ids"] > 0),  # non-padding
        }
        return new_state, metrics

    def evaluate(state: State, frozen, batch):
        return loss_sums(state["params"], frozen, batch)

    return StepFunctions(
        train=jax.jit(train, donate_argnums=0, out_shardings=(state_shardings, None) if state_shardings else None),
        evaluate=jax.jit(evaluate),
    )


def micro_batches(batch: dict, steps: int, layers: layers_lib.LayerOptions) -> dict:
    """The global batch's arrays [B, L] as `steps` micro-batches [steps, B / steps, L]; micro-batch i holds rows
    i, i + steps, i + 2 * steps, ... A device's rows of the global batch are contiguous, so each device's
    B / devices rows split among the micro-batches where they are: every micro-batch stays spread over all
    devices, nothing moves (trainer.run.mesh.check_batch: B / steps divides by the devices)."""

    def constrain(array, spec):
        return array if layers.mesh is None else jax.lax.with_sharding_constraint(array, NamedSharding(layers.mesh, spec))

    def split(array):
        rows, *rest = array.shape
        interleaved = constrain(array.reshape(rows // steps, steps, *rest), PartitionSpec(layers.batch_axes))
        return constrain(jnp.swapaxes(interleaved, 0, 1), PartitionSpec(None, layers.batch_axes))

    return {key: split(array) for key, array in batch.items()}


def fresh_state(params, optimizer: Optimizer) -> State:
    """The state before step 1: `params` in the optimizer's dtype and its initial state for them."""
    params = jax.tree.map(lambda p: p.astype(optimizer.param_dtype), params)
    return {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": optimizer.init(params)}


def init_state(params, optimizer: Optimizer, *, state_shardings_fn: Callable) -> State:
    """fresh_state, built sharded by `state_shardings_fn(tree)`; `params` is consumed: donated, and the
    leaves the compiler could not reuse deleted. An output can only take over a donated buffer of its own
    size, so float32 weights made into lean's bfloat16 masters would otherwise stay on the device for as
    long as the caller holds them (gemma3-1b: 3.7 GiB beside a step planned without them)."""
    build = functools.partial(fresh_state, optimizer=optimizer)
    shardings = state_shardings_fn(jax.eval_shape(build, params))
    state = jax.jit(build, out_shardings=shardings, donate_argnums=0)(params)
    for leaf in jax.tree.leaves(params):
        if not leaf.is_deleted():
            leaf.delete()
    return state


def initial_state(config, model_config, run_step: RunStep, *, resuming: bool) -> tuple[State | None, Any]:
    """(state, frozen) a run starts from: the state before step 1 built from the initial weights
    (models.initial_params), which are consumed, and LoRA's frozen base in the compute dtype (None in a
    full fine-tune). `resuming`: the state is the checkpoint's, so only the frozen base is built (state None).
    The trainer and the benchmark both start here, so what one keeps on the device the other keeps too."""
    trained, frozen = models.initial_params(config, model_config, run_step.shard, resuming=resuming)
    frozen = jax.tree.map(lambda p: p.astype(run_step.compute_dtype), frozen)  # None stays None
    if resuming:
        return None, frozen
    return init_state(trained, run_step.optimizer, state_shardings_fn=run_step.shard), frozen


def abstract_state(params, optimizer: Optimizer, *, state_shardings_fn: Callable) -> State:
    """What init_state would build, as shapes, dtypes and shardings only: the target a checkpoint is
    restored into. `params` may be shapes too."""
    shapes = jax.eval_shape(functools.partial(fresh_state, optimizer=optimizer), params)
    with_sharding = lambda s, sharding: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding)  # noqa: E731
    return jax.tree.map(with_sharding, shapes, state_shardings_fn(shapes))


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunStep:
    """A run's step as built from its options, model and mesh, in one place: the loop trains with it and
    `python -m workloads fit` compiles the same for a TPU slice (trainer.measure.compiled)."""

    model: Any
    optimizer: Optimizer
    optimizer_config: OptimizerConfig
    compute_dtype: Any
    device_mesh: Any
    softcap: float | None
    state_shardings: Any
    vocab_chunk: int | None
    layers: layers_lib.LayerOptions
    functions: StepFunctions
    grad_accum_steps: int = 1  # --grad-accum-steps: micro-batches a step runs in sequence
    # --remat auto with an estimate: each policy compiled that fits, with its step time (compile_run_step)
    remat_speeds: tuple[RematSpeed, ...] = ()
    images_per_row: int = 0  # a vision-language run's batch: the images each row holds at most (its data's)

    def shard(self, tree):
        """The state's shardings: replicated over `data`, split over `fsdp` when large (trainer.run.mesh)."""
        return mesh.state_shardings(self.device_mesh, tree)

    def choosing(self, *, remat: str, vocab_chunk: int | None) -> RunStep:
        """The same step with another rematerialisation policy and vocabulary chunk."""
        layers = dataclasses.replace(self.layers, remat=remat)
        functions = make_step_functions(self.model, self.optimizer, compute_dtype=self.compute_dtype, softcap=self.softcap,
                                        vocab_chunk=vocab_chunk, state_shardings=self.state_shardings, layers=layers,
                                        grad_accum_steps=self.grad_accum_steps)
        return dataclasses.replace(self, vocab_chunk=vocab_chunk, layers=layers, functions=functions)


@dataclasses.dataclass(frozen=True)
class RematSpeed:
    """A rematerialisation policy whose step fits, with the step time its compiled program bounds (the
    larger of its FLOPs at the chip's peak, its HBM bytes at the chip's bandwidth, its collectives' bytes)."""

    remat: str
    seconds: float
    bound_by: str  # "flops", "bytes" or "ici"


def speed_words(speeds: tuple[RematSpeed, ...]) -> str:
    """`remat dots (0.35 s a step, bound by flops), over none (0.41 s, bytes)`: the chosen policy first."""
    chosen, *others = speeds
    line = f"remat {chosen.remat} ({chosen.seconds:.3g} s a step by the compiler's figures, bound by {chosen.bound_by})"
    return line + "".join(f", over {other.remat} ({other.seconds:.3g} s, {other.bound_by})" for other in others)


def build_run_step(config, model_config, device_mesh, *, total_steps: int, compute_dtype, images_per_row: int = 0) -> RunStep:
    """`config` is the run's TrainConfig; `total_steps` sizes the learning-rate schedule; a vision-language
    model's batches hold `images_per_row` images a row. The step has
    the first policy of --remat and the --vocab-chunk that needs no compiler (trainer.run.vocab_chunk.fixed);
    compile_run_step settles both."""
    optimizer_settings = optimizer_config(config, total_steps=total_steps)
    optimizer = build_optimizer(optimizer_settings)
    model = models.build_model(model_config, dtype=compute_dtype, lora_rank=config.lora_rank)
    trained, _ = abstract_params(config, model_config)
    platform = device_mesh.devices.flat[0].platform
    attention = layers_lib.choose_attention(config.attention, platform=platform, seq_len=config.seq_len)
    layers = layers_lib.LayerOptions(attention=attention, remat=remat_candidates(config.remat)[0], mesh=device_mesh,
                                     batch_axes=mesh.BATCH_AXES, interpret=layers_lib.interpreted(attention, platform))
    state_shardings = mesh.state_shardings(device_mesh, jax.eval_shape(functools.partial(fresh_state, optimizer=optimizer), trained))
    chunk = vocab_chunk.fixed(config.vocab_chunk, tokens_per_chip=micro_batch_size(config) * config.seq_len // device_mesh.size,
                              vocab_size=model_config.num_embed)
    functions = make_step_functions(model, optimizer, compute_dtype=compute_dtype, softcap=model_config.final_logit_softcap,
                                    vocab_chunk=chunk, state_shardings=state_shardings, layers=layers,
                                    grad_accum_steps=config.grad_accum_steps)
    return RunStep(model=model, optimizer=optimizer, optimizer_config=optimizer_settings, compute_dtype=compute_dtype,
                   device_mesh=device_mesh, softcap=model_config.final_logit_softcap, state_shardings=state_shardings,
                   vocab_chunk=chunk, layers=layers, functions=functions, grad_accum_steps=config.grad_accum_steps,
                   images_per_row=images_per_row)


def micro_batch_size(config) -> int:
    """The rows the model runs at once: --batch-size over --grad-accum-steps (the loss head sees these tokens)."""
    return config.batch_size // config.grad_accum_steps


def remat_candidates(requested: str) -> tuple[str, ...]:
    """The rematerialisation policies to try, least recomputation first."""
    return tuple(layers_lib.REMAT_POLICIES) if requested == "auto" else (requested,)


def chunk_candidates(run_step: RunStep, config, model_config) -> tuple[vocab_chunk.HeadCost | None, ...]:
    """--vocab-chunk's candidates, best first: on TPU with auto, ranked by the compiler
    (trainer.run.vocab_chunk); otherwise the one chunk build_run_step took, as None (no figures)."""
    platform = run_step.device_mesh.devices.flat[0].platform
    if config.vocab_chunk != "auto" or platform != "tpu" or len(vocab_chunk.candidates(model_config.num_embed)) == 1:
        return (None,)
    heads = vocab_chunk.ranked(run_step.device_mesh, run_step.compute_dtype, tokens=micro_batch_size(config) * config.seq_len,
                               embed_dim=model_config.embed_dim, vocab_size=model_config.num_embed, softcap=run_step.softcap)
    return heads or (None,)  # no head fits alone: the step's own refusal says by how much


def frees_enough(head: vocab_chunk.HeadCost | None, refused_head: vocab_chunk.HeadCost | None, short: int) -> bool:
    """Whether `head` may fit where the step with `refused_head` was `short` bytes over: its head's
    temporaries must be that much smaller (steps that differ only in their head differ by about that)."""
    return refused_head is None or refused_head.temporaries - head.temporaries >= short


def compile_run_step(run_step: RunStep, config, model_config, *, train_args: Callable,
                     estimate: Callable[[RunStep, Any, Any], RematSpeed] | None = None,
                     kept_speed: Callable[[RunStep, Any], RematSpeed | None] = lambda candidate, lowered: None):
    """(run_step, lowered, compiled train step): a rematerialisation policy of --remat whose step the
    compiler fits in memory, with the fastest vocabulary chunk that fits beside it. On TPU a program fits
    when the whole of it does (trainer.run.hbm), not only its temporaries. A candidate whose head cannot
    free the bytes the last refusal was short of is not compiled. `train_args(run_step)` gives the train
    step's arguments (arrays or shapes); the last refusal is raised (hbm.MemoryRefusal), at once when
    the arguments alone cannot fit.

    Which policy: without `estimate`, the first that fits (the least recomputation). With it
    (`estimate(candidate, lowered, compiled)`: its step time by the compiler's figures), the fastest that
    fits: the next policy is compiled only while the fastest so far is bound by HBM bytes, since one that
    recomputes more cannot beat a step bound by its FLOPs or collectives. The figures of every policy
    compared are in the returned step's `remat_speeds`, the chosen first. `kept_speed(candidate, lowered)`: the
    estimate a start before kept of that very program (compile_answers.kept_figures), if any; only a step that
    fitted was estimated, so such a policy is compared without compiling it (reading its executable back from
    JAX's cache), and compiled only if chosen. Every policy compared is still lowered: its estimate is found by
    its program, and a policy whose program changed must be compiled and estimated again."""
    on_tpu = run_step.device_mesh.devices.flat[0].platform == "tpu"
    devices = list(run_step.device_mesh.devices.flat)
    if on_tpu and (refused := hbm.arguments_refusal(train_args(run_step), devices)):
        raise refused
    chunks = chunk_candidates(run_step, config, model_config)
    remats = remat_candidates(config.remat)
    refused, fitting = None, []  # fitting: (speed, candidate, lowered, compiled)
    comparing = estimate is not None and len(remats) > 1  # else nothing to compare a policy with
    for remat_number, remat in enumerate(remats, 1):
        label = f"remat {remat} (candidate {remat_number} of {len(remats)})"
        fits, refusal = _fitting_head(run_step, config, remat, chunks, train_args, devices, on_tpu=on_tpu, remat_label=label,
                                      kept_speed=kept_speed if comparing else lambda candidate, lowered: None)
        if fits is None:
            refused = refusal
            continue
        candidate, lowered, compiled, kept = fits
        if not comparing:
            return candidate, lowered, compiled
        fitting.append((kept or estimate(candidate, lowered, compiled), candidate, lowered, compiled))
        fastest = min(fitting, key=lambda entry: entry[0].seconds)
        if fastest[0].bound_by != "bytes":
            break
    if not fitting:
        raise refused
    speeds, candidate, lowered, compiled = fastest
    if compiled is None:  # chosen by its kept estimate: compiled (read back) now
        compiled = compile_answers.compile(lowered, what=f"train step, remat {candidate.layers.remat}, vocabulary chunk "
                                                         f"{candidate.vocab_chunk or 'none'} (chosen by its kept estimate)", devices=devices)
    others = tuple(entry[0] for entry in fitting if entry[0] is not speeds)
    return dataclasses.replace(candidate, remat_speeds=(speeds, *others)), lowered, compiled


def _fitting_head(run_step: RunStep, config, remat: str, chunks, train_args: Callable, devices, *, on_tpu: bool,
                  remat_label: str, kept_speed: Callable[[RunStep, Any], RematSpeed | None]):
    """((candidate, lowered, compiled, None), None) for the first vocabulary chunk of `chunks` whose step with
    `remat` fits, or (None, the last refusal); ((candidate, lowered, None, its speed), None) for one whose
    speed a start before kept (compile_run_step): it fitted then, and is not compiled here."""
    short, tried, refused = 0, None, None
    for head_number, head in enumerate(chunks, 1):
        if not frees_enough(head, tried, short):
            continue
        candidate = run_step.choosing(remat=remat, vocab_chunk=run_step.vocab_chunk if head is None else head.chunk)
        lowered = candidate.functions.train.lower(*train_args(candidate))
        if (kept := kept_speed(candidate, lowered)) is not None:
            return (candidate, lowered, None, kept), None
        what = f"train step, {remat_label}, vocabulary chunk {candidate.vocab_chunk or 'none'} (head {head_number} of {len(chunks)})"
        try:
            compiled = compile_answers.compile(lowered, what=what, devices=devices)
        except jax.errors.JaxRuntimeError as error:
            refusal = hbm.memory_refusal(error)
            if refusal is None:
                raise
        else:
            refusal = hbm.whole_program_refusal(compiled, devices) if on_tpu else None
            if refusal is None:
                return (candidate, lowered, compiled, None), None
        refused, short, tried = refusal, refusal.required - refusal.available, head
    return None, refused


def abstract_params(config, model_config):
    """(trained, frozen) as shapes: what models.initial_params gives, without reading any weights (the model's
    shapes traced once a process: models.param_shapes)."""
    train_encoder = config.vision_encoder == "trained"
    base = models.param_shapes(model_config)
    if not config.lora_rank:
        return models.trained_and_frozen(base, train_encoder=train_encoder)
    adapters = models.adapter_shapes(model_config, lora_rank=config.lora_rank)
    return models.trained_and_frozen(base, adapters, train_encoder=train_encoder)


BATCH_KEYS = {"input_tokens": jnp.int32, "target_tokens": jnp.int32, "segment_ids": jnp.int32, "positions": jnp.int32,
              "loss_mask": jnp.float32}  # trainer.data.loader.batches' arrays (and "images" with images)


def abstract_train_args(run_step: RunStep, config, model_config):
    """(state, frozen, batch) of the train step as shapes, dtypes and shardings, as the loop passes
    them: the state sharded by `run_step.shard`, the frozen base in the compute dtype, the global batch
    split over every device."""
    trained, frozen = abstract_params(config, model_config)
    state = abstract_state(trained, run_step.optimizer, state_shardings_fn=run_step.shard)
    if frozen is not None:
        frozen = jax.tree.map(lambda leaf, sharding: jax.ShapeDtypeStruct(leaf.shape, run_step.compute_dtype, sharding=sharding),
                              frozen, run_step.shard(frozen))
    return state, frozen, abstract_batch(run_step, config)


def abstract_batch(run_step: RunStep, config) -> dict:
    """The global batch the train step takes, split over every device (trainer.run.mesh.global_batch); a
    vision-language run's has its images (run_step.images_per_row a row)."""
    sharding = mesh.batch_sharding(run_step.device_mesh)
    batch = {key: jax.ShapeDtypeStruct((config.batch_size, config.seq_len), dtype, sharding=sharding)
             for key, dtype in BATCH_KEYS.items()}
    vision = run_step.model.config.vision
    if vision is not None:
        shape = (config.batch_size, run_step.images_per_row, vision.image_size, vision.image_size, 3)
        batch["images"] = jax.ShapeDtypeStruct(shape, jnp.uint8, sharding=sharding)
    return batch


def step_fingerprint(lowered) -> str:
    """A short digest of a lowered train step's program text: the run records it in config.json and
    `python -m workloads fit` reports it, so equal digests mean the same program was compiled."""
    # A Pallas kernel's backend config holds its serialized body, which carries the source paths of the
    # checkout that traced it; the kernel's code is the pinned jax's, so the config is left out.
    text = re.sub(r'backend_config = "[^"]*"', "", compile_answers.program_text(lowered))
    return hashlib.sha256(text.encode()).hexdigest()[:16]
