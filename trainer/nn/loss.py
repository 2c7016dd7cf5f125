"""Next-token cross-entropy on packed rows, without materialising full logits when they would be large.

A packed row holds several documents: `positions` restart at 0 in each, and the attention mask is
block-diagonal causal from `segment_ids`, so a token sees only earlier tokens of its own document.

Large heads run in token chunks (`fused_loss_sum`): each chunk's logits against the whole vocabulary,
their log-sum-exp, the chunk's loss and at once its logits' gradient, which gives the chunk's hidden-state
gradient and its part of the embedding's, all in the forward pass: three [tokens, vocab, D] matmuls a
chunk, where a head chunked over the vocabulary needs four (the log-sum-exp of a token needs every
vocabulary chunk before any logit's gradient, so its backward pass computes the logits again). The loss
is the step's last operation, so the backward pass only scales those gradients by the loss's cotangent.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from trainer.data import images as images_lib
from trainer.nn import layers as layers_lib

# Logits of more elements than this ([tokens, vocab]) are computed in chunks instead. 2**26 float32 =
# 256 MiB per device; Gemma's 262,144 vocabulary passes it from 256 tokens on.
MAX_LOGITS_ELEMENTS = 2**26
# A chunked head holds the logits of as many elements as this many vocabulary rows of every token
# (--vocab-chunk): its tokens run in ceil(vocab / VOCAB_CHUNK) chunks against the whole vocabulary.
VOCAB_CHUNK = 16_384


def hidden_states(model, params, batch, layers: layers_lib.LayerOptions = layers_lib.LayerOptions()) -> jax.Array:
    """Final hidden states [B, L, D] of packed rows (trainer.gemma3.model), with their images where the batch has them."""
    images = batch.get("images")
    return model.apply({"params": params}, batch["input_tokens"], batch["positions"], batch["segment_ids"],
                       None if images is None else images_lib.normalised(images), options=layers)


def _softcap(logits: jax.Array, cap: float | None) -> jax.Array:
    return logits if cap is None else jnp.tanh(logits / cap) * cap


def _logits(hidden: jax.Array, embedding: jax.Array, cap: float | None) -> jax.Array:
    logits = jnp.einsum("nd,vd->nv", hidden, embedding, preferred_element_type=jnp.float32)
    return _softcap(logits, cap)


def token_losses(hidden: jax.Array, embedding: jax.Array, targets: jax.Array, *, softcap: float | None = None) -> jax.Array:
    """Per-token -log p(target) [B, L] from hidden states [B, L, D] and the tied embedding [V, D], through
    the whole [tokens, V] float32 logits (autodiff's backward: two more matmuls of the same size)."""
    batch_shape = targets.shape
    hidden = hidden.reshape(-1, hidden.shape[-1])
    targets = targets.reshape(-1)
    target_logits = _softcap(
        jnp.einsum("nd,nd->n", hidden, embedding[targets], preferred_element_type=jnp.float32), softcap
    )
    log_normalizer = jax.nn.logsumexp(_logits(hidden, embedding, softcap), axis=-1)
    return (log_normalizer - target_logits).reshape(batch_shape)


def chunk_loss(hidden, embedding, targets, weights, softcap: float | None):
    """(sum of weights x -log p(target), its gradient with respect to the logits, in hidden's dtype) of one
    token chunk: hidden [tokens, D], targets and weights [tokens] against the whole embedding [V, D]."""
    logits = _logits(hidden, embedding, softcap)  # [tokens, V] float32, one chunk's
    is_target = jnp.arange(embedding.shape[0])[None, :] == targets[:, None]
    log_normalizer = jax.nn.logsumexp(logits, axis=-1)
    target_logits = jnp.sum(jnp.where(is_target, logits, 0.0), axis=-1)
    total = jnp.sum(weights * (log_normalizer - target_logits))
    d_logits = weights[:, None] * (jnp.exp(logits - log_normalizer[:, None]) - is_target)
    if softcap is not None:  # d/dz cap * tanh(z / cap) = 1 - tanh^2
        d_logits = d_logits * (1 - jnp.square(logits / softcap))
    return total, d_logits.astype(hidden.dtype)


def chunk_gradients(hidden, embedding, targets, weights, softcap: float | None, *, embedding_gradient: bool = True):
    """(loss sum, d hidden, d embedding or None) of one token chunk (`chunk_loss`): the body of the fused
    head's loop (trainer.run.vocab_chunk counts its cost once per iteration). The embedding's part is a
    float32 matmul result, left in float32 for the caller's sum."""
    total, d_logits = chunk_loss(hidden, embedding, targets, weights, softcap)
    d_hidden = jnp.einsum("nv,vd->nd", d_logits, embedding, preferred_element_type=jnp.float32).astype(hidden.dtype)
    d_embedding = jnp.einsum("nv,nd->vd", d_logits, hidden, preferred_element_type=jnp.float32) if embedding_gradient else None
    return total, d_hidden, d_embedding


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def fused_loss_sum(hidden: jax.Array, embedding: jax.Array, targets: jax.Array, weights: jax.Array,
                   softcap: float | None) -> jax.Array:
    """sum(weights x -log p(target)) float32 of token chunks: hidden [chunks, tokens, D], targets and
    weights [chunks, tokens], against the embedding [V, D]; one chunk's [tokens, V] logits at a time.

    Differentiated, the forward pass computes the gradients as well (`chunk_gradients`), the embedding's
    only when the embedding is differentiated (LoRA's is frozen), summed over the chunks in the
    embedding's dtype: the bytes of the gradient itself, where a float32 sum of gemma3-1b's would hold
    1.2 GB more. In bfloat16 each chunk's sum rounds once more: 4,096 tokens in 16 chunks put the
    embedding's gradient 0.53% (of its norm) off float32's, against 0.28% in one. The backward pass
    scales the gradients by the cotangent. Weights and targets get none."""

    def body(total, chunk):
        chunk_hidden, chunk_targets, chunk_weights = chunk
        return total + chunk_loss(chunk_hidden, embedding, chunk_targets, chunk_weights, softcap)[0], None

    total, _ = jax.lax.scan(body, jnp.zeros((), jnp.float32), (hidden, targets, weights))
    return total


def _fused_loss_sum_forward(hidden, embedding, targets, weights, softcap):
    """With symbolic zeros: each argument is a CustomVJPPrimal (its value, and whether it is differentiated)."""
    embedding_gradient = embedding.perturbed
    hidden, embedding, targets, weights = hidden.value, embedding.value, targets.value, weights.value

    def body(carry, chunk):
        total, d_embedding = carry
        chunk_hidden, chunk_targets, chunk_weights = chunk
        part, d_hidden, d_part = chunk_gradients(chunk_hidden, embedding, chunk_targets, chunk_weights, softcap,
                                                 embedding_gradient=embedding_gradient)
        if embedding_gradient:
            d_embedding = (d_embedding + d_part).astype(embedding.dtype)
        return (total + part, d_embedding), d_hidden

    d_embedding = jnp.zeros(embedding.shape, embedding.dtype) if embedding_gradient else None
    (total, d_embedding), d_hidden = jax.lax.scan(body, (jnp.zeros((), jnp.float32), d_embedding), (hidden, targets, weights))
    return total, (d_hidden, d_embedding)


def _fused_loss_sum_backward(softcap, residuals, cotangent):
    d_hidden, d_embedding = residuals
    scale = lambda gradient: None if gradient is None else (cotangent * gradient).astype(gradient.dtype)  # noqa: E731
    return scale(d_hidden), scale(d_embedding), None, None


fused_loss_sum.defvjp(_fused_loss_sum_forward, _fused_loss_sum_backward, symbolic_zeros=True)


def _shards(layers: layers_lib.LayerOptions) -> int:
    """How many devices the token rows are split over."""
    return 1 if layers.mesh is None else math.prod(layers.mesh.shape[axis] for axis in layers.batch_axes)


def token_chunks(tokens: int, vocab_size: int, vocab_chunk: int, layers: layers_lib.LayerOptions = layers_lib.LayerOptions()) -> int:
    """How many token chunks a head of --vocab-chunk `vocab_chunk` runs in: each holds the logits of about
    as many elements as `vocab_chunk` rows of every token (ceil(vocab / vocab_chunk) chunks), raised to
    the next count that divides the tokens of each device the rows are split over (`layers`' mesh), so
    that every chunk is spread evenly over them."""
    local_tokens = tokens // _shards(layers)
    chunks = min(-(-vocab_size // vocab_chunk), local_tokens)
    while local_tokens % chunks:
        chunks += 1
    return chunks


def _interleaved(array: jax.Array, chunks: int, layers: layers_lib.LayerOptions) -> jax.Array:
    """[tokens, ...] as [chunks, tokens / chunks, ...], chunk i holding tokens i, i + chunks, ...: a
    device's tokens are contiguous, so each chunk takes an equal share of every device's, and nothing moves."""
    split = jnp.swapaxes(array.reshape(-1, chunks, *array.shape[1:]), 0, 1)
    if layers.mesh is None:
        return split
    return jax.lax.with_sharding_constraint(split, NamedSharding(layers.mesh, PartitionSpec(None, layers.batch_axes)))


def loss_sum(hidden: jax.Array, embedding: jax.Array, targets: jax.Array, weights: jax.Array, *, softcap: float | None,
             vocab_chunk: int | None, layers: layers_lib.LayerOptions = layers_lib.LayerOptions()) -> jax.Array:
    """sum(weights x -log p(target)) of hidden states [B, L, D] (or [tokens, D]) against the tied embedding
    [V, D]: plain logits when `vocab_chunk` is None or covers the vocabulary, else the fused head in
    token chunks (`token_chunks`)."""
    if vocab_chunk is None or vocab_chunk >= embedding.shape[0]:
        return jnp.sum(token_losses(hidden, embedding, targets, softcap=softcap) * weights)
    tokens = targets.size
    chunks = token_chunks(tokens, embedding.shape[0], vocab_chunk, layers)
    split = functools.partial(_interleaved, chunks=chunks, layers=layers)
    return fused_loss_sum(split(hidden.reshape(tokens, hidden.shape[-1])), embedding, split(targets.reshape(tokens)),
                          split(weights.reshape(tokens)), softcap)


def choose_vocab_chunk(tokens: int, vocab_size: int) -> int | None:
    """None (plain logits) when [tokens, vocab] logits are small, else VOCAB_CHUNK."""
    return None if tokens * vocab_size <= MAX_LOGITS_ELEMENTS else VOCAB_CHUNK


def loss_sums(model, params, batch, *, softcap: float | None, vocab_chunk: int | None,
              layers: layers_lib.LayerOptions = layers_lib.LayerOptions()) -> tuple[jax.Array, jax.Array]:
    """(sum of masked token losses, number of masked tokens): the mean is their ratio, computed by
    the caller over the whole global batch so that padding never dilutes it."""
    hidden = hidden_states(model, params, batch, layers)
    embedding = params["embedder"]["input_embedding"]
    mask = batch["loss_mask"].astype(jnp.float32)
    total = loss_sum(hidden, embedding, batch["target_tokens"], mask, softcap=softcap, vocab_chunk=vocab_chunk, layers=layers)
    return total, jnp.sum(mask)
