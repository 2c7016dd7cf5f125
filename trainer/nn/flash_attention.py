"""FlashAttention-2 for packed rows on NVIDIA GPUs: Pallas kernels (Triton backend) for the forward
and backward passes, so that attention keeps no [B, L, L] tensor on a GPU as splash attention keeps
none on TPU (trainer.nn.layers picks between them).

A query at index q of a row sees a key at index k when both carry the same segment id, k <= q, and,
for a local layer of `window` tokens, k > q - window: the mask trainer.gemma3.model.dense_attention
builds, given what the packed loader holds (positions restart at 0 in each document, so index
differences are position differences inside a document).

Each program owns one block of `block` queries of one head and walks the key blocks the causal
window can reach (the others are skipped, not masked), keeping a running maximum and sum of its
softmax (FlashAttention-2's online softmax) and the log-sum-exp for the backward pass. The backward
pass recomputes the probabilities block by block: one kernel walks the query blocks that reach a key
block (dK, dV; grouped-query heads summed inside), another the key blocks a query block reaches (dQ).
Rows must be a multiple of `block` tokens. `interpret=True` runs the same kernels in Pallas'
interpreter (CPU tests). The kernels use Pallas' Triton backend, which JAX 0.12 deprecates in favour
of Mosaic GPU (it warns when lowering for a GPU).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

BLOCK = 64  # queries and keys a program holds at once
MASKED = -1e30  # a masked score: finite, so a block with nothing visible yet gives exp(0) * 0, not nan


def _visible(q_start, k_start, q_segments, k_segments, *, block: int, window: int | None):
    """[block, block] bool: which keys of the block at k_start the queries at q_start see."""
    q_index = q_start + jax.lax.broadcasted_iota(jnp.int32, (block, block), 0)
    k_index = k_start + jax.lax.broadcasted_iota(jnp.int32, (block, block), 1)
    visible = (q_segments[:, None] == k_segments[None, :]) & (k_index <= q_index)
    if window is not None:
        visible &= k_index > q_index - window
    return visible


def _key_blocks(q_block, *, block: int, window: int | None):
    """The key blocks [first, last) the query block `q_block` can see."""
    first = 0 if window is None else jnp.maximum(q_block * block - window + 1, 0) // block
    return first, q_block + 1


def _query_blocks(k_block, num_blocks: int, *, block: int, window: int | None):
    """The query blocks [first, last) that can see the key block `k_block`."""
    last = num_blocks if window is None else jnp.minimum((k_block * block + block + window - 2) // block + 1, num_blocks)
    return k_block, last


def _dot(a, b, contract: tuple[int, int]):
    """a @ b over the given axes of two 2-D blocks, accumulated in float32."""
    return jax.lax.dot_general(a, b, (((contract[0],), (contract[1],)), ((), ())), preferred_element_type=jnp.float32)


def _forward_kernel(q_ref, k_ref, v_ref, segments_ref, out_ref, lse_ref, *, block: int, window: int | None):
    q_block = pl.program_id(1)
    q_start = q_block * block
    query = q_ref[...]
    q_segments = segments_ref[pl.ds(q_start, block)]

    def step(k_block, carry):
        maximum, total, acc = carry
        k_start = k_block * block
        keys = pl.ds(k_start, block)
        scores = _dot(query, k_ref[keys, :], (1, 1))
        visible = _visible(q_start, k_start, q_segments, segments_ref[keys], block=block, window=window)
        scores = jnp.where(visible, scores, MASKED)
        new_maximum = jnp.maximum(maximum, jnp.max(scores, axis=1))
        probs = jnp.where(visible, jnp.exp(scores - new_maximum[:, None]), 0.0)
        rescale = jnp.exp(maximum - new_maximum)
        acc = acc * rescale[:, None] + _dot(probs.astype(v_ref.dtype), v_ref[keys, :], (1, 0))
        return new_maximum, total * rescale + jnp.sum(probs, axis=1), acc

    first, last = _key_blocks(q_block, block=block, window=window)
    start = (jnp.full((block,), MASKED, jnp.float32), jnp.zeros((block,), jnp.float32),
             jnp.zeros(query.shape, jnp.float32))
    maximum, total, acc = jax.lax.fori_loop(first, last, step, start)
    out_ref[...] = (acc / total[:, None]).astype(out_ref.dtype)
    lse_ref[...] = maximum + jnp.log(total)


def _probs_and_score_grads(query, keys, values, d_out, lse, delta, visible):
    """The probabilities of a (query block, key block) pair and d(loss)/d(score), both [block, block]."""
    probs = jnp.where(visible, jnp.exp(_dot(query, keys, (1, 1)) - lse[:, None]), 0.0)
    d_probs = _dot(d_out, values, (1, 1))
    return probs, probs * (d_probs - delta[:, None])


def _key_grads_kernel(q_ref, k_ref, v_ref, segments_ref, d_out_ref, lse_ref, delta_ref, dk_ref, dv_ref,
                      *, block: int, window: int | None, group: int):
    """dK and dV of one key block of one key/value head, summed over the `group` query heads sharing it."""
    k_block = pl.program_id(1)
    k_start = k_block * block
    keys, values = k_ref[...], v_ref[...]
    k_segments = segments_ref[pl.ds(k_start, block)]
    first, last = _query_blocks(k_block, q_ref.shape[0] // block, block=block, window=window)

    def step(q_block, carry, head):
        dk, dv = carry
        q_start = q_block * block
        rows = pl.ds(q_start, block)
        query, d_out = q_ref[rows, head, :], d_out_ref[rows, head, :]
        visible = _visible(q_start, k_start, segments_ref[rows], k_segments, block=block, window=window)
        probs, d_scores = _probs_and_score_grads(
            query, keys, values, d_out, lse_ref[head, rows], delta_ref[head, rows], visible)
        dv = dv + _dot(probs.astype(d_out.dtype), d_out, (0, 0))
        dk = dk + _dot(d_scores.astype(query.dtype), query, (0, 0))
        return dk, dv

    carry = (jnp.zeros(keys.shape, jnp.float32), jnp.zeros(values.shape, jnp.float32))
    for head in range(group):
        carry = jax.lax.fori_loop(first, last, functools.partial(step, head=head), carry)
    dk, dv = carry
    dk_ref[...], dv_ref[...] = dk.astype(dk_ref.dtype), dv.astype(dv_ref.dtype)


def _query_grads_kernel(q_ref, k_ref, v_ref, segments_ref, d_out_ref, lse_ref, delta_ref, dq_ref,
                        *, block: int, window: int | None):
    q_block = pl.program_id(1)
    q_start = q_block * block
    query, d_out, lse, delta = q_ref[...], d_out_ref[...], lse_ref[...], delta_ref[...]
    q_segments = segments_ref[pl.ds(q_start, block)]

    def step(k_block, dq):
        k_start = k_block * block
        keys = pl.ds(k_start, block)
        visible = _visible(q_start, k_start, q_segments, segments_ref[keys], block=block, window=window)
        key_rows = k_ref[keys, :]
        _, d_scores = _probs_and_score_grads(query, key_rows, v_ref[keys, :], d_out, lse, delta, visible)
        return dq + _dot(d_scores.astype(key_rows.dtype), key_rows, (1, 0))

    first, last = _key_blocks(q_block, block=block, window=window)
    dq_ref[...] = jax.lax.fori_loop(first, last, step, jnp.zeros(query.shape, jnp.float32)).astype(dq_ref.dtype)


def _specs(length: int, heads: int, kv_heads: int, head_dim: int, block: int):
    """Block specs over the grid (row, query block, query head)."""
    group = heads // kv_heads
    return {
        "query_block": pl.BlockSpec((None, block, None, head_dim), lambda b, i, n: (b, i, n, 0)),
        "kv_row": pl.BlockSpec((None, length, None, head_dim), lambda b, i, n: (b, 0, n // group, 0)),
        "segments": pl.BlockSpec((None, length), lambda b, i, n: (b, 0)),
        "lse_block": pl.BlockSpec((None, None, block), lambda b, i, n: (b, n, i)),
    }


def _call(kernel, grid, in_specs, out_specs, out_shape, interpret: bool, name: str, head_dim: int):
    # A program's float32 accumulator is block x head_dim: over 8 warps (256 threads) Gemma 3's head_dim
    # 256 takes 64 registers a thread for it. Not yet tuned on a GPU.
    warps = 8 if head_dim > 64 else 4
    return pl.pallas_call(kernel, grid=grid, in_specs=in_specs, out_specs=out_specs, out_shape=out_shape,
                          interpret=interpret, name=name,
                          compiler_params=plgpu.CompilerParams(num_warps=warps, num_stages=2))


def _forward(query, key, value, segment_ids, window, block, interpret):
    batch, length, heads, head_dim = query.shape
    specs = _specs(length, heads, key.shape[2], head_dim, block)
    kernel = functools.partial(_forward_kernel, block=block, window=window)
    return _call(
        kernel, (batch, length // block, heads),
        [specs["query_block"], specs["kv_row"], specs["kv_row"], specs["segments"]],
        [specs["query_block"], specs["lse_block"]],
        [jax.ShapeDtypeStruct(query.shape, query.dtype), jax.ShapeDtypeStruct((batch, heads, length), jnp.float32)],
        interpret, "flash_attention_forward", head_dim)(query, key, value, segment_ids)


def _backward(query, key, value, segment_ids, out, lse, d_out, window, block, interpret):
    batch, length, heads, head_dim = query.shape
    kv_heads = key.shape[2]
    group = heads // kv_heads
    specs = _specs(length, heads, kv_heads, head_dim, block)
    delta = jnp.einsum("blnh,blnh->bnl", d_out.astype(jnp.float32), out.astype(jnp.float32))
    # dK, dV: one program per (row, key block, key/value head), reading its group's query heads whole.
    group_rows = pl.BlockSpec((None, length, group, head_dim), lambda b, j, k: (b, 0, k, 0))
    group_stats = pl.BlockSpec((None, group, length), lambda b, j, k: (b, k, 0))
    key_block = pl.BlockSpec((None, block, None, head_dim), lambda b, j, k: (b, j, k, 0))
    dk, dv = _call(
        functools.partial(_key_grads_kernel, block=block, window=window, group=group), (batch, length // block, kv_heads),
        [group_rows, key_block, key_block, specs["segments"], group_rows, group_stats, group_stats],
        [key_block, key_block],
        [jax.ShapeDtypeStruct(key.shape, key.dtype), jax.ShapeDtypeStruct(value.shape, value.dtype)],
        interpret, "flash_attention_key_grads", head_dim)(query, key, value, segment_ids, d_out, lse, delta)
    dq = _call(
        functools.partial(_query_grads_kernel, block=block, window=window), (batch, length // block, heads),
        [specs["query_block"], specs["kv_row"], specs["kv_row"], specs["segments"], specs["query_block"],
         specs["lse_block"], specs["lse_block"]],
        specs["query_block"], jax.ShapeDtypeStruct(query.shape, query.dtype),
        interpret, "flash_attention_query_grads", head_dim)(query, key, value, segment_ids, d_out, lse, delta)
    return dq, dk, dv


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _attention(query, key, value, segment_ids, window, block, interpret):
    return _forward(query, key, value, segment_ids, window, block, interpret)[0]


def _attention_forward(query, key, value, segment_ids, window, block, interpret):
    out, lse = _forward(query, key, value, segment_ids, window, block, interpret)
    return out, (query, key, value, segment_ids, out, lse)


def _attention_backward(window, block, interpret, residuals, d_out):
    query, key, value, segment_ids, out, lse = residuals
    dq, dk, dv = _backward(query, key, value, segment_ids, out, lse, d_out, window, block, interpret)
    return dq, dk, dv, None


_attention.defvjp(_attention_forward, _attention_backward)


def flash_attention(query, key, value, segment_ids, *, window: int | None, block: int = BLOCK, interpret: bool = False):
    """query [B, L, N, H] (already scaled), key/value [B, L, K, H] with N a multiple of K, segment_ids
    [B, L] -> [B, L, N, H]; L a multiple of `block`."""
    if query.shape[1] % block:
        raise ValueError(f"flash attention: a row of {query.shape[1]} tokens is not a multiple of the block ({block})")
    return _attention(query, key, value, segment_ids, window, block, interpret)
