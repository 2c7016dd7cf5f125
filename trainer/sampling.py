"""Greedy sample generations from fixed prompts, to see what fine-tuning changed."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from trainer import loss

# Openings in the style of the stories the demo and TinyStories train on.
PROMPTS = ("Once upon a time", "One day, a little girl named")
# One buffer length for every prompt, so the decoder compiles once.
BUFFER_TOKENS = 64


@functools.partial(jax.jit, static_argnames=("model",))
def _greedy(model, params, tokens: jax.Array, prompt_length: jax.Array) -> jax.Array:
    """Fills tokens[0, prompt_length:] one by one with the most likely next token.

    Recomputes the whole (short) buffer per token instead of keeping a KV cache: simpler, and the
    causal mask makes the not-yet-written positions irrelevant.
    """
    length = tokens.shape[1]
    segment_ids = jnp.ones_like(tokens)
    positions = jnp.arange(length)[None, :]

    def next_token(index, tokens):
        batch = {"input_tokens": tokens, "positions": positions, "segment_ids": segment_ids}
        hidden = loss.hidden_states(model, params, batch)[0, index - 1]
        logits = hidden @ params["embedder"]["input_embedding"].T
        return tokens.at[0, index].set(jnp.argmax(logits).astype(tokens.dtype))

    return jax.lax.fori_loop(prompt_length, length, next_token, tokens)


def generate(model, params, tokenizer, prompt: str) -> str:
    """The prompt continued greedily up to BUFFER_TOKENS tokens, cut at the first end of document."""
    # Documents start with BOS in training (trainer.data), so prompts do too.
    prompt_ids = [tokenizer.bos_id, *tokenizer.encode(prompt)][: BUFFER_TOKENS - 1]
    buffer = np.zeros((1, BUFFER_TOKENS), np.int32)
    buffer[0, : len(prompt_ids)] = prompt_ids
    generated = np.asarray(_greedy(model, params, jnp.asarray(buffer), len(prompt_ids)))[0, len(prompt_ids) :].tolist()
    if tokenizer.eos_id in generated:
        generated = generated[: generated.index(tokenizer.eos_id)]
    return tokenizer.decode(prompt_ids[1:] + generated)


def sample_text(model, params, tokenizer) -> str:
    """One line per fixed prompt."""
    return "\n".join(f"[{i + 1}] {generate(model, params, tokenizer, prompt)}" for i, prompt in enumerate(PROMPTS))
