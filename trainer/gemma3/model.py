"""The Gemma 3 text transformer and its LoRA adapters in flax.

`Transformer.apply({"params": p}, tokens, positions, segment_ids, options=...)` gives the final
hidden states [B, L, D] of packed rows; the loss head (trainer.nn.loss) multiplies them by the tied
embedding. A packed row holds several documents: `positions` restart at 0 in each, and a token sees
only earlier tokens of its own segment (and, in a local layer, only the last `sliding_window_size`).

`options.attention` picks how: "dense" builds that [B, L, L] mask (CPU, and any length); "splash" (TPU)
and "flash" (GPU) run Pallas kernels that read the segment ids and the window, so no [L, L] tensor
exists (trainer.nn.layers). `options.remat` rematerialises each block.

With `config.vision` (a VisionConfig) the model also takes images (trainer.gemma3.vision): their soft tokens
replace the embeddings of the image tokens, and Gemma 3's attention rule adds that an image's tokens see
each other both ways (still within their document and window). No kernel takes that data-dependent block,
so a batch with images runs every layer's attention dense, whatever `options.attention` says (the image
encoder's own attention does take the splash kernel: trainer.gemma3.vision).

LoRA (`lora_rank`): every projection weight W of a block gets factors A (W's input axes, rank) and
B (rank, W's output axes), B starting at zero, in the tree places gemma's `gm.nn.LoRA` gives them.
"""

from __future__ import annotations

import string
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from trainer.gemma3 import vision as vision_lib
from trainer.gemma3.config import RMS_EPSILON, Attention, Gemma3Config
from trainer.nn import layers

LORA = "lora"  # the scope of an adapter's factors, as gemma names it
MASKED = -2.3819763e38  # a masked attention logit (gemma's value: its exp underflows in bfloat16 too)


def lora_factors(equation: str, weight_shape: tuple[int, ...], rank: int) -> tuple[str, str, tuple, tuple]:
    """For a projection `inputs,weights->outputs`: (the equation of x times A, that of its rank-r result
    times B, A's shape, B's shape). A keeps the weight axes the input has, B those only the output has,
    each in the weight's order."""
    inputs, rest = equation.replace(" ", "").split(",")
    weights, outputs = rest.split("->")
    a_axes = "".join(axis for axis in weights if axis in inputs)
    b_axes = "".join(axis for axis in weights if axis in outputs and axis not in inputs)
    rank_axis = "r" if "r" not in equation else min(set(string.ascii_letters) - set(equation))
    size = dict(zip(weights, weight_shape)) | {rank_axis: rank}
    low = "".join(axis for axis in inputs if axis not in a_axes) + rank_axis
    return (f"{inputs},{a_axes}{rank_axis}->{low}", f"{low},{rank_axis}{b_axes}->{outputs}",
            tuple(size[axis] for axis in a_axes + rank_axis), tuple(size[axis] for axis in rank_axis + b_axes))


class _LoRA(nn.Module):
    rank: int
    equation: str  # the adapted projection's
    weight_shape: tuple[int, ...]
    dtype: Any
    options: layers.LayerOptions = layers.LayerOptions()
    pair: bool = False  # the gated feed-forward's: a (gate, up) pair of outputs, each its own matmul


class _Factors(_LoRA):
    """A and B gathered whole before their matmuls, as the weights are, by a sharding constraint
    (layers.gathered's `by_constraint`: gathered explicitly they cost more): left split
    over FSDP, B's gradient is a windowed reduce-scatter loop whose body carries the whole [tokens, 2,
    hidden] cotangent of the feed-forward's adapter, and XLA keeps one such buffer a layer alive at
    once: 11 of the 30.6 GiB of temporaries of gemma3-12b LoRA on v6e 2x4 (128 x 256, remat full)."""

    @nn.compact
    def __call__(self, x):
        low_equation, high_equation, a_shape, b_shape = lora_factors(self.equation, self.weight_shape, self.rank)
        a = layers.gathered(self.options, self.param("a", nn.initializers.kaiming_uniform(), a_shape, self.dtype),
                            by_constraint=True)
        b = layers.gathered(self.options, self.param("b", nn.initializers.zeros_init(), b_shape, self.dtype),
                            by_constraint=True)
        if self.pair:
            low = checkpoint_name(jnp.einsum("...F,Fr->...r", x, a), layers.PROJECTIONS)
            return tuple(jnp.einsum("...r,rH->...H", low, b[:, part]) for part in (0, 1))
        return jnp.einsum(high_equation, checkpoint_name(jnp.einsum(low_equation, x, a), layers.PROJECTIONS), b)


class _Adapter(_LoRA):
    """The scope gemma's LoRA wrapper gives the factors: <adapter name>/lora/{a, b}."""

    @nn.compact
    def __call__(self, x):
        return _Factors(self.rank, self.equation, self.weight_shape, self.dtype, self.options, self.pair, name=LORA)(x)


def _project(module: nn.Module, weight_name: str, adapter_name: str, shape: tuple[int, ...], equation: str, x):
    """x times `module`'s weight `weight_name` (plus its LoRA adapter), inside `module`'s compact call."""
    weight = layers.gathered(module.options, module.param(weight_name, nn.initializers.normal(), shape, module.dtype))
    out = jnp.einsum(equation, x, weight)
    if module.lora_rank:
        out = out + _Adapter(module.lora_rank, equation, shape, module.dtype, module.options, name=adapter_name)(x)
    return checkpoint_name(out, layers.PROJECTIONS)


class Einsum(nn.Module):
    """A projection whose weight is `w` in its own scope (the attention's)."""

    shape: tuple[int, ...]
    dtype: Any
    lora_rank: int = 0
    options: layers.LayerOptions = layers.LayerOptions()

    @nn.compact
    def __call__(self, equation: str, x):
        return _project(self, "w", "_LoRAEinsum_0", self.shape, equation, x)


class RMSNorm(nn.Module):
    dtype: Any

    @nn.compact
    def __call__(self, x):
        scale = self.param("scale", nn.initializers.zeros_init(), (x.shape[-1],), self.dtype)
        normed = x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + RMS_EPSILON)
        return normed * (1 + scale)


def rope(x, positions, *, base_frequency: int, scale_factor: float):
    """Rotary embedding of x [B, N, L, H] (heads first) at `positions` [B, L] (the halves of H rotate together)."""
    half = x.shape[-1] // 2
    timescale = base_frequency ** (2.0 * jnp.arange(half, dtype=jnp.float32) / x.shape[-1])
    angle = positions[:, None, :, None] / timescale / scale_factor
    sin, cos = jnp.sin(angle), jnp.cos(angle)
    first, second = x[..., :half], x[..., half:]
    return jnp.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1).astype(x.dtype)


def packed_mask(segment_ids, image_ids=None):
    """[B, L] segment ids -> [B, L, L] bool: query i sees key j <= i of the same segment; given image_ids
    (trainer.gemma3.vision.image_ids), an image's tokens also see every token of their image."""
    length = segment_ids.shape[-1]
    seen = jnp.tril(jnp.ones((length, length), bool))
    if image_ids is not None:
        seen = seen | ((image_ids[:, :, None] == image_ids[:, None, :]) & (image_ids[:, :, None] > 0))
    return (segment_ids[:, :, None] == segment_ids[:, None, :]) & seen


def dense_attention(query, key, value, positions, segment_ids, *, window: int | None, image_ids=None):
    """query [B, L, N, H] (already scaled), key/value [B, L, K, H] -> [B, L, N, H], through the [B, L, L]
    mask of packed rows (same segment, causal or within one image, and within `window` positions for a
    local layer)."""
    batch, length, heads, head_dim = query.shape
    kv_heads = key.shape[2]
    mask = packed_mask(segment_ids, image_ids)
    if window is not None:
        mask &= positions[:, None, :] > positions[:, :, None] - window
    grouped = query.reshape(batch, length, kv_heads, heads // kv_heads, head_dim)
    logits = jnp.einsum("BTKGH,BSKH->BTKGS", grouped, key)
    logits = jnp.where(mask[:, :, None, None, :], logits, MASKED)
    probs = jax.nn.softmax(logits, axis=-1).astype(key.dtype)
    return jnp.einsum("BTKGS,BSKH->BTKGH", probs, value).reshape(batch, length, heads, head_dim)


class Embedder(nn.Module):
    """The token embedding, scaled by sqrt(embed_dim); the loss head decodes with the same table. Given an
    image encoder's soft tokens [B, M, T, W], they take the place of the image tokens (`is_image`), after
    the projector that gemma keeps in this scope: an RMS norm and a [W, D] projection, unscaled."""

    vocab_size: int
    embed_dim: int
    dtype: Any

    @nn.compact
    def __call__(self, tokens, soft_tokens=None, is_image=None):
        table = self.param("input_embedding", nn.initializers.normal(), (self.vocab_size, self.embed_dim), self.dtype)
        if soft_tokens is None:
            x = table[tokens]
            return x * jnp.sqrt(self.embed_dim).astype(x.dtype)
        x = table[jnp.where(is_image, 0, tokens)]  # an image token may lie past the table
        soft = RMSNorm(self.dtype, name="mm_soft_embedding_norm")(soft_tokens)
        soft = Einsum((soft.shape[-1], self.embed_dim), self.dtype, name="mm_input_projection")("...W,WD->...D", soft)
        return vision_lib.merged(x * jnp.sqrt(self.embed_dim).astype(x.dtype), soft, is_image)


class _Module(nn.Module):
    config: Gemma3Config
    dtype: Any
    lora_rank: int = 0


class SelfAttention(_Module):
    """Queries, keys and values projected heads first ([B, N, T, H], the splash kernel's layout), normed and
    rotated so, then handed to the attention tokens first, as it takes them: in the compiled step that swap and
    splash's own back to heads first cancel, while the projection's equation decides the layout XLA gives its
    output. Projected tokens first, gemma3-270m's queries (16 x 1024, compiled for v5e) were written [B, N, H, T]
    and copied to the kernel's layout, 33.6 MB a layer; called heads first, the splash kernel's saved output got a
    pass of its own under --remat dots (gemma3-1b, +0.7 GB a step): BENCHMARKS.md, issue 52. The weights keep
    gemma's shapes."""

    kind: Attention = Attention.GLOBAL
    options: layers.LayerOptions = layers.LayerOptions()

    @nn.compact
    def __call__(self, x, positions, segment_ids, image_ids=None):
        c, dtype, rank = self.config, self.dtype, self.lora_rank
        query = Einsum((c.num_heads, c.embed_dim, c.head_dim), dtype, rank, self.options, name="q_einsum")("BTD,NDH->BNTH", x)
        key, value = Einsum((2, c.num_kv_heads, c.embed_dim, c.head_dim), dtype, rank, self.options, name="kv_einsum")(
            "BSD,CKDH->CBKSH", x)
        query, key = RMSNorm(dtype, name="_query_norm")(query), RMSNorm(dtype, name="_key_norm")(key)
        base_frequency, scale_factor = c.rope(self.kind)
        query = rope(query, positions, base_frequency=base_frequency, scale_factor=scale_factor) * c.query_pre_attn_scalar**-0.5
        key = rope(key, positions, base_frequency=base_frequency, scale_factor=scale_factor)
        query, key, value = (jnp.swapaxes(x, 1, 2) for x in (query, key, value))  # tokens first
        window = c.sliding_window_size if self.kind is Attention.LOCAL else None
        if self.options.attention in layers.KERNELS and image_ids is None:
            encoded = layers.kernel_attention(self.options, query, key, value, segment_ids, window=window)
        else:
            encoded = dense_attention(query, key, value, positions, segment_ids, window=window, image_ids=image_ids)
        return Einsum((c.num_heads, c.head_dim, c.embed_dim), dtype, rank, self.options, name="attn_vec_einsum")(
            "BTNH,NHD->BTD", encoded)


class FeedForward(_Module):
    """Gated GELU (tanh approximation); both weights sit in this scope, as gemma's do.

    The gate and up projections are two matmuls of the halves of gemma's [2, hidden, embed] weight:
    one matmul with the pair axis inside writes a [tokens, 2, hidden] tensor that XLA copies to
    another layout before the halves are read (9% of the step's bytes at gemma3-1b, seq 8192)."""

    options: layers.LayerOptions = layers.LayerOptions()

    @nn.compact
    def __call__(self, x):
        c = self.config
        shape = (2, c.hidden_dim, c.embed_dim)
        weight = layers.gathered(self.options, self.param("gating_einsum", nn.initializers.normal(), shape, self.dtype))
        gate, up = (jnp.einsum("...F,HF->...H", x, weight[part]) for part in (0, 1))
        if self.lora_rank:
            adapted = _Adapter(self.lora_rank, "...F,NHF->...NH", shape, self.dtype, self.options, pair=True,
                               name="_LoRAEinsum_gating_einsum")(x)
            gate, up = gate + adapted[0], up + adapted[1]
        gate, up = checkpoint_name(gate, layers.PROJECTIONS), checkpoint_name(up, layers.PROJECTIONS)
        hidden = nn.gelu(gate) * up
        return _project(self, "linear", "_LoRAEinsum_linear", (c.hidden_dim, c.embed_dim), "...H,HF->...F", hidden)


class Block(_Module):
    kind: Attention = Attention.GLOBAL
    options: layers.LayerOptions = layers.LayerOptions()

    @nn.compact
    def __call__(self, x, positions, segment_ids, image_ids=None):
        common = dict(config=self.config, dtype=self.dtype, lora_rank=self.lora_rank)
        attended = SelfAttention(**common, kind=self.kind, options=self.options, name="attn")(
            RMSNorm(self.dtype, name="pre_attention_norm")(x), positions, segment_ids, image_ids)
        x = x + RMSNorm(self.dtype, name="post_attention_norm")(attended)
        fed = FeedForward(**common, options=self.options, name="mlp")(RMSNorm(self.dtype, name="pre_ffw_norm")(x))
        return x + RMSNorm(self.dtype, name="post_ffw_norm")(fed)


class Transformer(_Module):
    """Token ids [B, L] (and, with `config.vision`, images [B, M, size, size, 3]) -> final hidden states [B, L, D].
    `dtype` is the parameters' (and so the computation's) dtype."""

    @nn.compact
    def __call__(self, tokens, positions=None, segment_ids=None, images=None, *,
                 options: layers.LayerOptions = layers.LayerOptions()):
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(tokens.shape[-1]), tokens.shape)
        if segment_ids is None:
            segment_ids = jnp.ones_like(tokens)
        embedder = Embedder(self.config.num_embed, self.config.embed_dim, self.dtype, name="embedder")
        image_ids = None
        if images is None:
            x = embedder(tokens)
        else:
            vision = self.config.vision
            is_image = tokens == vision.image_token_id
            encoder = vision_lib.VisionEncoder(vision, self.dtype, options, name="vision_encoder")
            x = embedder(tokens, encoder(images), is_image)
            image_ids = vision_lib.image_ids(is_image)
        policy = layers.REMAT_POLICIES[options.remat]
        block = nn.remat(Block, policy=policy) if policy else Block
        for i, kind in enumerate(self.config.attention_types):
            x = block(config=self.config, dtype=self.dtype, lora_rank=self.lora_rank, kind=kind, options=options,
                      name=f"layer_{i}")(x, positions, segment_ids, image_ids)
        return RMSNorm(self.dtype, name="final_norm")(x)
