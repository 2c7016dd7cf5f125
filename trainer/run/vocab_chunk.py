"""How many vocabulary rows' worth of logits the loss takes at a time (trainer.nn.loss), chosen on TPU by the compiler.

Gemma's 262,144-entry vocabulary makes the loss head the step's largest tensor: [tokens, vocab] float32
logits. A chunk of N rows bounds them to [tokens, N] elements at once: the fused head runs the tokens in
ceil(vocab / N) chunks against the whole vocabulary (trainer.nn.loss.token_chunks), at a price in bytes
(every chunk reads and writes the embedding's gradient sum), so the best chunk depends on the model,
the tokens per chip and the chip. On TPU the head alone (hidden states and embedding to the summed
loss, with both gradients, sharded as in the step) is compiled for each candidate on the run's mesh,
seconds each, and the candidates are ranked by the compiler's figures: the roofline time of their
FLOPs and bytes (every loop iteration counted, see `loop_cost`), then their temporaries.
trainer.run.step compiles the whole step with the fastest and, when the compiler refuses it for
memory, goes on to the fastest candidate whose head frees the bytes it was short. On CPU and GPU
memory is not what limits a run: trainer.nn.loss's size rule decides there.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from trainer.nn import layers as layers_lib
from trainer.nn import loss
from trainer.run import mesh
from trainer.run import hardware
from trainer.run import compile_answers

# Plain logits, then chunks of 2^16 down to 2^12 rows; those not below the vocabulary are left out.
CANDIDATES = (None, 65_536, 32_768, 16_384, 8_192, 4_096)


@dataclasses.dataclass(frozen=True, kw_only=True)
class HeadCost:
    """The compiler's figures for the loss head with one vocabulary chunk, per chip."""

    chunk: int | None
    flops: float
    bytes_accessed: float
    temporaries: int
    roofline_s: float  # the larger of FLOPs / peak and bytes / HBM bandwidth


def _cost(compiled) -> tuple[float, float]:
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0))


def _token_rows(device_mesh, tokens: int, embed_dim: int | None, dtype) -> jax.ShapeDtypeStruct:
    """`tokens` positions' hidden states (or, without `embed_dim`, one value each), split over the batch
    axes as the step splits them."""
    shape = (tokens,) if embed_dim is None else (tokens, embed_dim)
    return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(device_mesh, PartitionSpec(mesh.BATCH_AXES)))


def _layers(device_mesh) -> layers_lib.LayerOptions:
    """The token rows split over the mesh as the step's are (trainer.nn.loss chunks them by device)."""
    return layers_lib.LayerOptions(mesh=device_mesh, batch_axes=mesh.BATCH_AXES)


def loop_cost(device_mesh, compute_dtype, *, tokens: int, embed_dim: int, vocab_size: int, chunk: int | None,
              softcap: float | None, embedding_gradient: bool = True) -> tuple[float, float]:
    """(FLOPs, bytes accessed) per chip that XLA's cost analysis leaves out of a chunked head: it counts
    a loop body once, so the (chunks - 1) missing iterations of the fused head's loop
    (trainer.nn.loss.fused_loss_sum) are the compiler's own cost of one chunk's body compiled alone on
    the same mesh: with the sum of the embedding's gradient unless the embedding is frozen (LoRA)."""
    if chunk is None or chunk >= vocab_size:
        return 0.0, 0.0
    chunks = loss.token_chunks(tokens, vocab_size, chunk, _layers(device_mesh))
    embedding_sharding = mesh.state_shardings(device_mesh, jax.ShapeDtypeStruct((vocab_size, embed_dim), jnp.float32))
    embedding = jax.ShapeDtypeStruct((vocab_size, embed_dim), compute_dtype, sharding=embedding_sharding)

    def body(hidden, embedding, targets, weights, d_embedding):
        total, d_hidden, d_part = loss.chunk_gradients(hidden, embedding, targets, weights, softcap,
                                                       embedding_gradient=embedding_gradient)
        return total, d_hidden, d_part if d_part is None else (d_embedding + d_part).astype(d_embedding.dtype)

    lowered = jax.jit(body).lower(_token_rows(device_mesh, tokens // chunks, embed_dim, compute_dtype), embedding,
                                  _token_rows(device_mesh, tokens // chunks, None, jnp.int32),
                                  _token_rows(device_mesh, tokens // chunks, None, jnp.float32), embedding)
    compiled = compile_answers.compile(lowered, what=f"one chunk of {tokens // chunks} tokens (to count the loop's iterations)",
                                       devices=device_mesh.devices.flat)
    flops, bytes_accessed = _cost(compiled)
    return (chunks - 1) * flops, (chunks - 1) * bytes_accessed


def head_cost(device_mesh, compute_dtype, *, tokens: int, embed_dim: int, vocab_size: int, chunk: int | None,
              softcap: float | None) -> HeadCost:
    """The head with `chunk`, compiled for `device_mesh` (compile-only TPU devices will do)."""
    embedding_sharding = mesh.state_shardings(device_mesh, jax.ShapeDtypeStruct((vocab_size, embed_dim), jnp.float32))
    embedding = jax.ShapeDtypeStruct((vocab_size, embed_dim), compute_dtype, sharding=embedding_sharding)
    head = functools.partial(loss.loss_sum, softcap=softcap, vocab_chunk=chunk, layers=_layers(device_mesh))
    lowered = jax.jit(jax.value_and_grad(head, argnums=(0, 1))).lower(
        _token_rows(device_mesh, tokens, embed_dim, compute_dtype), embedding, _token_rows(device_mesh, tokens, None, jnp.int32),
        _token_rows(device_mesh, tokens, None, jnp.float32))
    compiled = compile_answers.compile(lowered, what=f"loss head with {_chunk_name(chunk)}", devices=device_mesh.devices.flat)
    flops, bytes_accessed = _cost(compiled)
    missing_flops, missing_bytes = loop_cost(device_mesh, compute_dtype, tokens=tokens, embed_dim=embed_dim,
                                             vocab_size=vocab_size, chunk=chunk, softcap=softcap)
    flops, bytes_accessed = flops + missing_flops, bytes_accessed + missing_bytes
    chip = hardware.CHIPS[device_mesh.devices.flat[0].device_kind]
    return HeadCost(chunk=chunk, flops=flops, bytes_accessed=bytes_accessed,
                    temporaries=compiled.memory_analysis().temp_size_in_bytes,
                    roofline_s=max(flops / chip.peak_bf16_flops, bytes_accessed / chip.hbm_bytes_per_s))


def _chunk_name(chunk: int | None) -> str:
    return "plain logits" if chunk is None else f"chunk {chunk}"


def candidates(vocab_size: int) -> tuple[int | None, ...]:
    """The chunks worth comparing for a vocabulary: plain logits and the chunks below its size."""
    return tuple(chunk for chunk in CANDIDATES if chunk is None or chunk < vocab_size)


@functools.lru_cache(maxsize=32)
def ranked(device_mesh, compute_dtype, *, tokens: int, embed_dim: int, vocab_size: int,
           softcap: float | None) -> tuple[HeadCost, ...]:
    """The candidates whose head alone the compiler fits in memory, fastest first (fewer temporaries
    breaking a tie). Remembered: the full and LoRA steps of a model on a mesh share their head."""
    costs = []
    chunks = candidates(vocab_size)
    for number, chunk in enumerate(chunks, 1):
        try:
            with compile_answers.doing(f"candidate {number} of {len(chunks)}"):
                costs.append(head_cost(device_mesh, compute_dtype, tokens=tokens, embed_dim=embed_dim, vocab_size=vocab_size,
                                       chunk=chunk, softcap=softcap))
        except jax.errors.JaxRuntimeError as error:
            if not compile_answers.out_of_memory(error):
                raise
    return tuple(sorted(costs, key=lambda cost: (cost.roofline_s, cost.temporaries)))


def fixed(requested: str, *, tokens_per_chip: int, vocab_size: int) -> int | None:
    """The chunk of a --vocab-chunk that needs no compiler: a number, none (plain logits), or for auto
    trainer.nn.loss's size rule (what auto is off TPU)."""
    if requested == "none":
        return None
    if requested == "auto":
        return loss.choose_vocab_chunk(tokens_per_chip, vocab_size)
    return int(requested)
