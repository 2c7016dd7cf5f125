"""Sample generations: from fixed prompts before and after training, and for `python -m trainer.generate`.

Greedy by default; with a temperature, sampled from the softmax of logits / temperature, cut to the
smallest set of tokens whose probability reaches top_p. For chat data the prompt is a user turn of
Gemma's template (trainer.data.chat) and the generation stops at <end_of_turn>. A vision-language model is
asked about generated pictures (trainer.data.vision_corpus) it never trained on: a few answers, and how
many of HELD_OUT_PICTURES it answers right.
"""

from __future__ import annotations

import functools
import io
import pathlib

import jax
import jax.numpy as jnp
import numpy as np

from trainer.data import chat, formats, images, vision_corpus
from trainer.data.chat_corpus import SAMPLE_PROMPTS as CHAT_PROMPTS
from trainer.nn import loss

# Openings in the style of the stories the demo and TinyStories train on.
PROMPTS = ("Once upon a time", "One day, a little girl named")
# One buffer length for every prompt, so the decoder compiles once (chat prompts are longer).
BUFFER_TOKENS = 64
CHAT_BUFFER_TOKENS = 128
# A vision-language model's samples: pictures drawn from a seed no run's training pictures use.
HELD_OUT_SEED = vision_corpus.HELD_OUT_SEED
SAMPLE_PICTURES, HELD_OUT_PICTURES = 4, 50
ANSWER_TOKENS = 16


def _top_p_logits(logits: jax.Array, top_p: jax.Array) -> jax.Array:
    """`logits` with -inf outside the most likely tokens whose probabilities first reach `top_p`."""
    order = jnp.argsort(-logits)
    probabilities = jax.nn.softmax(logits[order])
    before = jnp.cumsum(probabilities) - probabilities  # the most likely token is always kept
    keep = jnp.zeros(logits.shape, bool).at[order].set(before < top_p)
    return jnp.where(keep, logits, -jnp.inf)


@functools.partial(jax.jit, static_argnames=("model",))
def _decode(model, params, tokens: jax.Array, prompt_length: jax.Array, key: jax.Array, temperature: jax.Array,
            top_p: jax.Array, vocab_size: jax.Array, images: jax.Array | None = None) -> jax.Array:
    """Fills tokens[0, prompt_length:] one by one: the most likely next token at temperature 0, else a
    top-p sample at that temperature; never an id at or above `vocab_size` (the tokenizer's: a model's
    embedding table may have more rows, as Gemma's 262,144 have for a 512-piece tokenizer).

    Recomputes the whole (short) buffer per token instead of keeping a KV cache: simpler, and the
    causal mask makes the not-yet-written positions irrelevant. `images` [1, M, size, size, 3] uint8: the
    pictures of the prompt's image tokens.
    """
    length = tokens.shape[1]
    segment_ids = jnp.ones_like(tokens)
    positions = jnp.arange(length)[None, :]

    def next_token(index, tokens):
        batch = {"input_tokens": tokens, "positions": positions, "segment_ids": segment_ids}
        if images is not None:
            batch["images"] = images
        hidden = loss.hidden_states(model, params, batch)[0, index - 1]
        logits = (hidden @ params["embedder"]["input_embedding"].T).astype(jnp.float32)
        logits = jnp.where(jnp.arange(logits.shape[0]) < vocab_size, logits, -jnp.inf)
        greedy = jnp.argmax(logits)
        sampled = jax.random.categorical(jax.random.fold_in(key, index),
                                         _top_p_logits(logits / jnp.maximum(temperature, 1e-6), top_p))
        token = jnp.where(temperature > 0, sampled, greedy)
        return tokens.at[0, index].set(token.astype(tokens.dtype))

    return jax.lax.fori_loop(prompt_length, length, next_token, tokens)


def generate_ids(model, params, prompt_ids: list[int], *, vocab_size: int, buffer_tokens: int | None = None,
                 max_new_tokens: int | None = None, stop_ids, temperature: float = 0.0, top_p: float = 1.0,
                 seed: int = 0, images: np.ndarray | None = None) -> list[int]:
    """The ids (each below `vocab_size`) generated after `prompt_ids`, cut before the first of `stop_ids`:
    `max_new_tokens` at most, or as many as fill `buffer_tokens` (a fixed length compiles once for several
    prompts; the prompt fills at most buffer_tokens - 1)."""
    buffer_tokens = buffer_tokens or len(prompt_ids) + max_new_tokens
    prompt_ids = prompt_ids[: buffer_tokens - 1]
    buffer = np.zeros((1, buffer_tokens), np.int32)
    buffer[0, : len(prompt_ids)] = prompt_ids
    filled = _decode(model, params, jnp.asarray(buffer), len(prompt_ids), jax.random.key(seed), jnp.float32(temperature),
                     jnp.float32(top_p), jnp.int32(vocab_size), None if images is None else jnp.asarray(images))
    generated = np.asarray(filled)[0, len(prompt_ids):].tolist()
    stops = [generated.index(stop) for stop in stop_ids if stop in generated]
    return generated[: min(stops)] if stops else generated


def chat_prompt_ids(tokenizer, prompt: str) -> list[int]:
    """BOS and the prompt as a user turn, up to the opening of the model's turn."""
    (ids, _), = chat.tokenize(tokenizer, [chat.render_prompt(prompt)])
    return [tokenizer.bos_id, *ids]


def complete(model, params, tokenizer, prompt: str, *, chat_template: bool, **generation) -> str:
    """For chat, the model's answer to `prompt` as a user turn; for text, `prompt` continued.
    `generation`: generate_ids' buffer_tokens or max_new_tokens, temperature, top_p, seed."""
    if chat_template:
        end_of_turn = chat.turn_token_ids(tokenizer)[chat.END_OF_TURN]
        generated = generate_ids(model, params, chat_prompt_ids(tokenizer, prompt), vocab_size=tokenizer.vocab_size,
                                 stop_ids=(end_of_turn, tokenizer.eos_id), **generation)
        return tokenizer.decode(generated)
    # Documents start with BOS in training (trainer.data.loader), so prompts do too.
    prompt_ids = [tokenizer.bos_id, *tokenizer.encode(prompt)]
    if generation.get("buffer_tokens"):
        prompt_ids = prompt_ids[: generation["buffer_tokens"] - 1]
    generated = generate_ids(model, params, prompt_ids, vocab_size=tokenizer.vocab_size, stop_ids=(tokenizer.eos_id,),
                             **generation)
    return tokenizer.decode(prompt_ids[1:] + generated)


def picture_prompt(tokenizer, vision, picture, question: str) -> tuple[list[int], np.ndarray]:
    """(prompt ids, pixels [size, size, 3] uint8) of a user turn asking `question` about a Pillow `picture`, the
    picture read as a data file's image is (trainer.data.images) and laid out as the data's are (trainer.data.chat)."""
    layout = images.Layout(size=vision.image_size, token_id=vision.image_token_id, soft_tokens=vision.soft_tokens)
    encoded = io.BytesIO()
    picture.save(encoded, format="PNG")
    pixels = images.pixels(images.Image(encoded.getvalue()), vision.image_size, folder=pathlib.Path("."))
    (ids, _), = chat.tokenize(tokenizer, [chat.render_prompt((formats.ImagePart(None), question))], image_layout=layout)
    return [tokenizer.bos_id, *ids], pixels


def answer_picture(model, params, tokenizer, picture, question: str, **generation) -> str:
    """A vision-language model's answer to `question` about a Pillow `picture` (picture_prompt). `generation`: as complete's."""
    ids, pixels = picture_prompt(tokenizer, model.config.vision, picture, question)
    end_of_turn = chat.turn_token_ids(tokenizer)[chat.END_OF_TURN]
    generated = generate_ids(model, params, ids, vocab_size=tokenizer.vocab_size,
                             stop_ids=(end_of_turn, tokenizer.eos_id), images=pixels[None, None], **generation)
    return tokenizer.decode(generated)


def _picture_samples(model, params, tokenizer) -> str:
    held_out = list(vision_corpus.pictures(HELD_OUT_PICTURES, HELD_OUT_SEED))
    answers = [answer_picture(model, params, tokenizer, picture, vision_corpus.QUESTION, max_new_tokens=ANSWER_TOKENS)
               for picture, _ in held_out]
    lines = [f"[{i + 1}] a picture of {right[2:-1].lower()}: {vision_corpus.QUESTION} -> {answer}"
             for i, ((_, right), answer) in enumerate(zip(held_out[:SAMPLE_PICTURES], answers))]
    right = sum(answer.strip() == expected for (_, expected), answer in zip(held_out, answers))
    return "\n".join([*lines, f"{right} of {len(held_out)} held-out pictures answered right"])


def sample_text(model, params, tokenizer, *, chat_template: bool = False) -> str:
    """One greedy line per fixed prompt: a story opening continued, or for chat data a question and its
    answer; a vision-language model answers about generated pictures."""
    if model.config.vision is not None:
        return _picture_samples(model, params, tokenizer)
    if chat_template:
        answers = (complete(model, params, tokenizer, prompt, chat_template=True, buffer_tokens=CHAT_BUFFER_TOKENS)
                   for prompt in CHAT_PROMPTS)
        return "\n".join(f"[{i + 1}] {prompt} -> {answer}" for i, (prompt, answer) in enumerate(zip(CHAT_PROMPTS, answers)))
    return "\n".join(f"[{i + 1}] {complete(model, params, tokenizer, prompt, chat_template=False, buffer_tokens=BUFFER_TOKENS)}"
                     for i, prompt in enumerate(PROMPTS))
