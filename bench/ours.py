"""Our side: the trainer's own loader, model, optimizer, mesh and train step, built and compiled as
`trainer.loop` builds and compiles them (trainer.run.step.build_run_step, trainer.measure.compiled.compile_fastest: on TPU the
rematerialisation and vocabulary chunk the compiler fits in memory). The step is compiled from the state's shapes
(the program is the one the loop's arrays give), and the state is built at the first step: a side compiled only to
be compared (bench.training_choice) holds none of the device's memory."""

from __future__ import annotations

import jax.numpy as jnp

from bench.side import Side, StepCounts
from trainer.config import TrainConfig
from trainer.data import loader as data_lib
from trainer.measure import compiled as compiled_lib
from trainer.nn import precision
from trainer.run import mesh, step


class Ours(Side):
    name = "ours"

    def __init__(self, model_config, data: data_lib.TokenizedData, *, seq_len: int, batch_size: int, seed: int = 0,
                 dtype=None, lora_rank: int = 0, state_precision: str = "float32", remat: str = "auto", vocab_chunk: str = "auto"):
        """`dtype`: the forward pass's; None = the trainer's choice for this platform (a what-if otherwise).
        The learning rate is constant, so the benchmark's length does not matter. `state_precision`, `remat` and
        `vocab_chunk`: --precision's, --remat's and --vocab-chunk's."""
        super().__init__()
        if dtype is not None:
            self.name = f"ours/{jnp.dtype(dtype).name}"
        self.batch_size = batch_size
        self.config = TrainConfig(seq_len=seq_len, batch_size=batch_size, lora_rank=lora_rank, lr_schedule="constant",
                                  weights="random", seed=seed, precision=state_precision,
                                  remat=remat, vocab_chunk=vocab_chunk)
        self.model_config = model_config
        self.mesh = mesh.build_mesh(self.config.mesh)
        compute_dtype = dtype or precision.compute_dtype()
        self.run_step = step.build_run_step(self.config, model_config, self.mesh, total_steps=1_000_000,
                                            compute_dtype=compute_dtype)
        self.state = self.frozen = self.lowered = None
        self.batches = data_lib.batches(data, seq_len=seq_len, global_batch_size=batch_size, seed=seed, split="train")

    def _build(self):
        self.run_step, self.lowered, compiled = compiled_lib.compile_fastest(
            self.run_step, self.config, self.model_config,
            train_args=lambda candidate: step.abstract_train_args(candidate, self.config, self.model_config))
        return compiled

    def speed(self) -> step.RematSpeed | None:
        """The compiled step's bound by the compiler's figures (what --remat auto compares policies by); None on a
        device of no known peak (the CPU)."""
        if self.run_step.remat_speeds:  # --remat auto compared policies: the chosen one's is first
            return self.run_step.remat_speeds[0]
        estimate = compiled_lib.speed_estimate(self.config, self.model_config, list(self.mesh.devices.flat))
        return estimate and estimate(self.run_step, self.lowered, self._compiled)

    def _dispatch(self, compiled):
        if self.state is None:
            self.state, self.frozen = step.initial_state(self.config, self.model_config, self.run_step, resuming=False)
        batch = next(self.batches)
        counts = StepCounts(useful_tokens=int(batch["loss_mask"].sum()), positions=batch["loss_mask"].size)
        self.state, metrics = compiled(self.state, self.frozen, mesh.global_batch(batch, self.mesh))
        return counts, metrics

    def step_choices(self) -> dict:
        return {"remat": self.run_step.layers.remat, "vocab_chunk": self.run_step.vocab_chunk}

    def close(self) -> None:
        self.batches.close()
