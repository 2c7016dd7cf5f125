"""The method of Google's GKE JAX-on-TPU Gemma 3 tutorial, faithfully, as the baseline the trainer is measured against.

- one document per row: [BOS] + tokens + [EOS], cut to the row and padded with id 0;
- tokenization inside the training loop, one document at a time, on the host;
- the loss averaged over every position, padding included;
- bfloat16 parameters as a checkpoint loads them, updated in place by AdamW;
- a flat 1-D `batch` mesh: the batch split over all devices, the parameters replicated;
- `flax.training.train_state.TrainState` holding the parameters and the optax AdamW state.

Only the inputs are shared with our side: the same model config, initial weights, tokenizer,
documents, sequence length and global batch. The tutorial builds the gemma package's Transformer;
this builds ours (trainer.gemma3, the same function of the same weights: tests/trainer/test_gemma3.py),
with gemma's full [batch, length, vocabulary] logits and its masking of padding, so that the benchmark
needs neither gemma nor the TensorFlow it brings.
"""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training import train_state
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from bench.side import Side, StepCounts
from trainer.config import TrainConfig
from trainer.data.tokenizer import Tokenizer
from trainer.model import models


def tokenize_row(tokenizer: Tokenizer, text: str, seq_len: int) -> tuple[np.ndarray, int]:
    """(seq_len + 1 ids, truncated to the row and padded with 0: inputs are the first seq_len, targets
    the last seq_len; the number of the document's targets cut off)."""
    ids = [tokenizer.bos_id, *tokenizer.encode(text), tokenizer.eos_id]
    row = np.full(seq_len + 1, tokenizer.pad_id, np.int32)
    kept = ids[: seq_len + 1]
    row[: len(kept)] = kept
    return row, len(ids) - len(kept)


def logits(model, params, inputs, *, pad_id: int, softcap: float | None):
    """gemma's Transformer's output: a document's positions never attend to padding (segment 0 against
    the document's 1), and the final logits are soft-capped."""
    hidden = model.apply({"params": params}, inputs, segment_ids=(inputs != pad_id).astype(jnp.int32))
    out = jnp.einsum("bld,vd->blv", hidden, params["embedder"]["input_embedding"])
    return out if softcap is None else jnp.tanh(out / softcap) * softcap


def train_step(state: train_state.TrainState, inputs, targets, *, pad_id: int, softcap: float | None):
    def mean_loss(params):
        return optax.softmax_cross_entropy_with_integer_labels(
            logits(state.apply_fn, params, inputs, pad_id=pad_id, softcap=softcap), targets).mean()

    loss, grads = jax.value_and_grad(mean_loss)(state.params)
    return state.apply_gradients(grads=grads), loss


class Baseline(Side):
    name = "baseline"

    def __init__(self, model_config, params, tokenizer: Tokenizer, documents: list[str], *, seq_len: int, batch_size: int):
        """`params`: the initial weights (any float dtype; the tutorial holds them in bfloat16)."""
        super().__init__()
        self.mesh = Mesh(np.array(jax.devices()), ("batch",))
        self.tokenizer, self.seq_len, self.batch_size = tokenizer, seq_len, batch_size
        self._documents = itertools.cycle(documents)
        self._batch_sharding = NamedSharding(self.mesh, PartitionSpec("batch"))
        model = models.build_model(model_config, dtype=jnp.bfloat16)
        bf16_params = jax.device_put(jax.tree.map(lambda p: p.astype(jnp.bfloat16), params),
                                     NamedSharding(self.mesh, PartitionSpec()))
        self.state = train_state.TrainState.create(apply_fn=model, params=bf16_params,
                                                   tx=optax.adamw(learning_rate=TrainConfig().lr))
        self._train_step = jax.jit(functools.partial(train_step, pad_id=tokenizer.pad_id,
                                                     softcap=model_config.final_logit_softcap), donate_argnums=0)
        self._trained_targets = self._cut_targets = 0

    def _next_batch(self) -> tuple[jax.Array, jax.Array, StepCounts]:
        rows, cut = zip(*(tokenize_row(self.tokenizer, text, self.seq_len)
                          for text in itertools.islice(self._documents, self.batch_size)))
        rows = np.stack(rows)
        inputs, targets = rows[:, :-1], rows[:, 1:]
        counts = StepCounts(useful_tokens=int(np.count_nonzero(targets != self.tokenizer.pad_id)), positions=targets.size)
        self._trained_targets += counts.useful_tokens
        self._cut_targets += sum(cut)
        return jax.device_put(inputs, self._batch_sharding), jax.device_put(targets, self._batch_sharding), counts

    def _build(self):
        inputs, targets, _ = self._next_batch()
        return self._train_step.lower(self.state, inputs, targets).compile()

    def _dispatch(self, compiled):
        inputs, targets, counts = self._next_batch()
        self.state, loss = compiled(self.state, inputs, targets)
        return counts, loss

    def truncated_fraction(self) -> float:
        return self._cut_targets / max(1, self._cut_targets + self._trained_targets)
