"""Next-token cross-entropy on packed rows, without materialising full logits when they would be large.

A packed row holds several documents: `positions` restart at 0 in each, and the attention mask is
block-diagonal causal from `segment_ids`, so a token sees only earlier tokens of its own document.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from trainer.nn import layers as layers_lib

# Logits of more elements than this ([tokens, vocab]) are computed in vocabulary chunks instead.
# 2**26 float32 = 256 MiB per device; Gemma's 262,144 vocabulary passes it from 256 tokens on.
MAX_LOGITS_ELEMENTS = 2**26
VOCAB_CHUNK = 16_384


def hidden_states(model, params, batch, layers: layers_lib.LayerOptions = layers_lib.LayerOptions()) -> jax.Array:
    """Final hidden states [B, L, D] of packed rows (trainer.gemma3.model)."""
    return model.apply({"params": params}, batch["input_tokens"], batch["positions"], batch["segment_ids"], options=layers)


def _softcap(logits: jax.Array, cap: float | None) -> jax.Array:
    return logits if cap is None else jnp.tanh(logits / cap) * cap


def _logits(hidden: jax.Array, embedding: jax.Array, cap: float | None) -> jax.Array:
    logits = jnp.einsum("nd,vd->nv", hidden, embedding, preferred_element_type=jnp.float32)
    return _softcap(logits, cap)


def token_losses(hidden: jax.Array, embedding: jax.Array, targets: jax.Array, *, softcap: float | None = None, vocab_chunk: int | None = None) -> jax.Array:
    """Per-token -log p(target) [B, L] from hidden states [B, L, D] and the tied embedding [V, D].

    With `vocab_chunk`, log-sum-exp is accumulated over vocabulary chunks (`chunked_logsumexp`), so
    neither the forward nor the backward pass holds more than [tokens, vocab_chunk] logits.
    """
    batch_shape = targets.shape
    hidden = hidden.reshape(-1, hidden.shape[-1])
    targets = targets.reshape(-1)
    target_logits = _softcap(
        jnp.einsum("nd,nd->n", hidden, embedding[targets], preferred_element_type=jnp.float32), softcap
    )
    vocab_size = embedding.shape[0]
    if vocab_chunk is None or vocab_chunk >= vocab_size:
        log_normalizer = jax.nn.logsumexp(_logits(hidden, embedding, softcap), axis=-1)
    else:
        log_normalizer = chunked_logsumexp(hidden, embedding, softcap, vocab_chunk)
    return (log_normalizer - target_logits).reshape(batch_shape)


def _chunk_logits(hidden, chunk, chunk_valid, softcap: float | None) -> jax.Array:
    return jnp.where(chunk_valid, _logits(hidden, chunk, softcap), -jnp.inf)


def chunk_logsumexp(hidden, chunk, chunk_valid, softcap: float | None) -> jax.Array:
    """log-sum-exp over one vocabulary chunk [chunk, D] of the logits of `hidden` [tokens, D]: the body
    of the forward chunk loop (trainer.run.vocab_chunk counts its cost once per iteration)."""
    return jax.nn.logsumexp(_chunk_logits(hidden, chunk, chunk_valid, softcap), axis=-1)


def chunk_gradients(hidden, chunk, chunk_valid, log_normalizer, cotangent, softcap: float | None):
    """(d hidden, d chunk) of sum(cotangent * log_normalizer) through one chunk: the body of the
    backward chunk loop. It recomputes the chunk's logits; softmax = exp(logits - log_normalizer)."""
    logits = _chunk_logits(hidden, chunk, chunk_valid, softcap)
    d_logits = cotangent[:, None] * jnp.exp(logits - log_normalizer[:, None])
    if softcap is not None:  # d/dz cap * tanh(z / cap) = 1 - tanh^2
        d_logits = d_logits * (1 - jnp.square(logits / softcap))
    d_logits = jnp.where(chunk_valid, d_logits, 0).astype(hidden.dtype)  # a padded row's -inf logit has no gradient
    d_hidden = jnp.einsum("nv,vd->nd", d_logits, chunk, preferred_element_type=jnp.float32)
    d_chunk = jnp.einsum("nv,nd->vd", d_logits, hidden, preferred_element_type=jnp.float32)
    return d_hidden, d_chunk


def _chunks(embedding, vocab_chunk: int):
    """The embedding padded to whole chunks [chunks, chunk, D], and which of their rows are real."""
    vocab_size, dim = embedding.shape
    num_chunks = -(-vocab_size // vocab_chunk)
    padding = num_chunks * vocab_chunk - vocab_size
    chunks = jnp.pad(embedding, ((0, padding), (0, 0))).reshape(num_chunks, vocab_chunk, dim)
    valid = (jnp.arange(num_chunks * vocab_chunk) < vocab_size).reshape(num_chunks, vocab_chunk)
    return chunks, valid


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def chunked_logsumexp(hidden: jax.Array, embedding: jax.Array, softcap: float | None, vocab_chunk: int) -> jax.Array:
    """log-sum-exp [tokens] float32 of the logits of `hidden` [tokens, D] against `embedding` [V, D],
    `vocab_chunk` rows at a time: matmuls in the inputs' dtype accumulating in float32. Its backward
    recomputes each chunk's logits and keeps only the log-sum-exp, so no [tokens, V] array exists
    either way."""
    chunks, valid = _chunks(embedding, vocab_chunk)
    per_chunk = jax.lax.map(lambda args: chunk_logsumexp(hidden, *args, softcap), (chunks, valid))  # [chunks, tokens]
    return jax.nn.logsumexp(per_chunk, axis=0)


def _chunked_logsumexp_forward(hidden, embedding, softcap, vocab_chunk):
    log_normalizer = chunked_logsumexp(hidden, embedding, softcap, vocab_chunk)
    return log_normalizer, (hidden, embedding, log_normalizer)


def _chunked_logsumexp_backward(softcap, vocab_chunk, residuals, cotangent):
    hidden, embedding, log_normalizer = residuals
    chunks, valid = _chunks(embedding, vocab_chunk)

    def body(d_hidden, args):
        d_hidden_part, d_chunk = chunk_gradients(hidden, *args, log_normalizer, cotangent, softcap)
        return d_hidden + d_hidden_part, d_chunk.astype(embedding.dtype)

    d_hidden, d_chunks = jax.lax.scan(body, jnp.zeros(hidden.shape, jnp.float32), (chunks, valid))
    d_embedding = d_chunks.reshape(-1, embedding.shape[1])[: embedding.shape[0]]
    return d_hidden.astype(hidden.dtype), d_embedding


chunked_logsumexp.defvjp(_chunked_logsumexp_forward, _chunked_logsumexp_backward)


def choose_vocab_chunk(tokens: int, vocab_size: int) -> int | None:
    """None (plain logits) when [tokens, vocab] logits are small, else VOCAB_CHUNK."""
    return None if tokens * vocab_size <= MAX_LOGITS_ELEMENTS else VOCAB_CHUNK


def loss_sums(model, params, batch, *, softcap: float | None, vocab_chunk: int | None,
              layers: layers_lib.LayerOptions = layers_lib.LayerOptions()) -> tuple[jax.Array, jax.Array]:
    """(sum of masked token losses, number of masked tokens): the mean is their ratio, computed by
    the caller over the whole global batch so that padding never dilutes it."""
    hidden = hidden_states(model, params, batch, layers)
    embedding = params["embedder"]["input_embedding"]
    losses = token_losses(hidden, embedding, batch["target_tokens"], softcap=softcap, vocab_chunk=vocab_chunk)
    mask = batch["loss_mask"].astype(jnp.float32)
    return jnp.sum(losses * mask), jnp.sum(mask)
