"""Our side: the trainer's own loader, model, optimizer, mesh and jit train step, built as `trainer.loop` builds them."""

from __future__ import annotations

import jax.numpy as jnp

from bench.side import Side, StepCounts
from trainer.data import loader as data_lib
from trainer import loss, mesh, models, precision, step
from trainer.config import TrainConfig


def optimizer_config(total_steps: int) -> step.OptimizerConfig:
    """The trainer's default optimizer (TrainConfig's defaults) with a constant rate, so the benchmark's length does not matter."""
    defaults = TrainConfig()
    return step.OptimizerConfig(lr=defaults.lr, lr_schedule="constant", warmup_steps=0, total_steps=total_steps,
                                weight_decay=defaults.weight_decay, grad_clip=defaults.grad_clip)


class Ours(Side):
    name = "ours"

    def __init__(self, model_config, data: data_lib.TokenizedData, *, seq_len: int, batch_size: int, seed: int = 0,
                 dtype=None):
        """`dtype`: the forward pass's; None = the trainer's choice for this platform (a what-if otherwise)."""
        super().__init__()
        if dtype is not None:
            self.name = f"ours/{jnp.dtype(dtype).name}"
        self.batch_size = batch_size
        self.mesh = mesh.build_mesh(TrainConfig().mesh)
        shard = lambda tree: mesh.state_shardings(self.mesh, tree)  # noqa: E731
        optimizer = step.build_optimizer(optimizer_config(total_steps=1_000_000))
        params = models.init_params(model_config, seed=seed, out_shardings=shard)
        self.state = step.init_state(params, optimizer, state_shardings_fn=shard)
        dtype = dtype or precision.compute_dtype()
        per_device_tokens = batch_size * seq_len // self.mesh.size
        self.functions = step.make_step_functions(
            models.build_model(model_config, dtype=dtype), optimizer, compute_dtype=dtype,
            softcap=model_config.final_logit_softcap, vocab_chunk=loss.choose_vocab_chunk(per_device_tokens, model_config.num_embed),
            state_shardings=shard(self.state),
        )
        self.batches = data_lib.batches(data, seq_len=seq_len, global_batch_size=batch_size, seed=seed, split="train")
        self._pending = next(self.batches)

    def _next_batch(self):
        if self._pending is not None:
            batch, self._pending = self._pending, None
            return batch
        return next(self.batches)

    def _lower(self):
        return self.functions.train.lower(self.state, None, mesh.global_batch(self._pending, self.mesh))

    def _dispatch(self, compiled):
        batch = self._next_batch()
        counts = StepCounts(useful_tokens=int(batch["loss_mask"].sum()), positions=batch["loss_mask"].size)
        self.state, metrics = compiled(self.state, None, mesh.global_batch(batch, self.mesh))
        return counts, metrics

    def close(self) -> None:
        self.batches.close()
