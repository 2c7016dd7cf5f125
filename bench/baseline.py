"""The method of Google's GKE JAX-on-TPU Gemma 3 tutorial, faithfully, as the baseline the trainer is measured against.

- one document per row: [BOS] + tokens + [EOS], cut to the row and padded with id 0;
- tokenization inside the training loop, one document at a time, on the host;
- the loss averaged over every position, padding included;
- bfloat16 parameters as a checkpoint loads them, updated in place by AdamW;
- a flat 1-D `batch` mesh: the batch split over all devices, the parameters replicated;
- `flax.training.train_state.TrainState` holding the parameters and the optax AdamW state.

Only the inputs are shared with our side: the same model config, initial weights, tokenizer,
documents, sequence length and global batch.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training import train_state
from gemma import gm
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from bench.side import Side, StepCounts
from trainer.gemma3.config import Attention, Gemma3Config
from trainer.config import TrainConfig
from trainer.data.tokenizer import Tokenizer


def tokenize_row(tokenizer: Tokenizer, text: str, seq_len: int) -> tuple[np.ndarray, int]:
    """(seq_len + 1 ids, truncated to the row and padded with 0: inputs are the first seq_len, targets
    the last seq_len; the number of the document's targets cut off)."""
    ids = [tokenizer.bos_id, *tokenizer.encode(text), tokenizer.eos_id]
    row = np.full(seq_len + 1, tokenizer.pad_id, np.int32)
    kept = ids[: seq_len + 1]
    row[: len(kept)] = kept
    return row, len(ids) - len(kept)


def train_step(state: train_state.TrainState, inputs, targets):
    def mean_loss(params):
        logits = state.apply_fn({"params": params}, inputs).logits  # the model masks id 0 out of attention itself
        return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

    loss, grads = jax.value_and_grad(mean_loss)(state.params)
    return state.apply_gradients(grads=grads), loss


def gemma_config(config: Gemma3Config) -> gm.nn.config.TransformerConfig:
    """The gemma package's config of one of our architectures (the tutorial builds gemma's own model)."""
    kinds = {Attention.LOCAL: gm.nn.AttentionType.LOCAL_SLIDING, Attention.GLOBAL: gm.nn.AttentionType.GLOBAL}
    norms = {config.head_dim: gm.nn.config.QueryPreAttentionNormalisation.BY_ONE_OVER_SQRT_HEAD_DIM,
             config.embed_dim // config.num_heads: gm.nn.config.QueryPreAttentionNormalisation.BY_ONE_OVER_SQRT_EMBED_DIM_DIV_NUM_HEADS}
    return gm.nn.config.TransformerConfig(
        num_embed=config.num_embed, embed_dim=config.embed_dim, hidden_dim=config.hidden_dim,
        num_heads=config.num_heads, head_dim=config.head_dim, num_kv_heads=config.num_kv_heads,
        attention_types=tuple(kinds[kind] for kind in config.attention_types),
        final_logit_softcap=config.final_logit_softcap, use_post_attn_norm=True, use_post_ffw_norm=True, use_qk_norm=True,
        query_pre_attn_norm=norms[config.query_pre_attn_scalar], sliding_window_size=config.sliding_window_size,
        transpose_gating_einsum=True, local_base_frequency=config.local_base_frequency,
        global_base_frequency=config.global_base_frequency, global_scale_factor=config.global_scale_factor,
    )


class Baseline(Side):
    name = "baseline"

    def __init__(self, model_config, params, tokenizer: Tokenizer, documents: list[str], *, seq_len: int, batch_size: int):
        """`params`: the initial weights (any float dtype; the tutorial holds them in bfloat16)."""
        super().__init__()
        self.mesh = Mesh(np.array(jax.devices()), ("batch",))
        self.tokenizer, self.seq_len, self.batch_size = tokenizer, seq_len, batch_size
        self._documents = itertools.cycle(documents)
        self._batch_sharding = NamedSharding(self.mesh, PartitionSpec("batch"))
        model = gm.nn.Transformer(config=gemma_config(model_config), dtype=jnp.bfloat16)
        bf16_params = jax.device_put(jax.tree.map(lambda p: p.astype(jnp.bfloat16), params),
                                     NamedSharding(self.mesh, PartitionSpec()))
        self.state = train_state.TrainState.create(apply_fn=model.apply, params=bf16_params,
                                                   tx=optax.adamw(learning_rate=TrainConfig().lr))
        self._train_step = jax.jit(train_step, donate_argnums=0)
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

    def _lower(self):
        inputs, targets, _ = self._next_batch()
        return self._train_step.lower(self.state, inputs, targets)

    def _dispatch(self, compiled):
        inputs, targets, counts = self._next_batch()
        self.state, loss = compiled(self.state, inputs, targets)
        return counts, loss

    def truncated_fraction(self) -> float:
        return self._cut_targets / max(1, self._cut_targets + self._trained_targets)
