"""Gemma 3's images: the SigLIP encoder that turns each image into soft tokens, and how those tokens enter
the text (trainer.gemma3.model's Embedder projects them, its attention reads `image_ids`).

The encoder is a ViT: 14-pixel patches embedded by a convolution, a learnt position embedding, pre-norm
blocks of bidirectional attention and a GELU (tanh) feed-forward, a final LayerNorm; its outputs are
average-pooled over squares of patches to `soft_tokens` vectors an image (64 x 64 patches to 16 x 16 at
full size). Parameter names are gemma 4.0.1's `SigLiPFromPatches` (vision_encoder/siglip_encoder/...),
so that gemma's checkpoints keep their tree. `options.remat` rematerialises each encoder block as it does
the text's ("dots" keeps the feed-forward's and the attention's outputs, PROJECTIONS). With
`options.attention` "splash", the encoder's attention runs in the splash kernel (a full mask, every patch
seeing every patch) where its blocks divide the patches (4096 at full size): flax's dense attention
holds a [heads, patches, patches] logit tensor an image and layer (16 x 4096 x 4096, 1 GiB in float32).

In the text an image is `soft_tokens` consecutive image tokens (VisionConfig.image_token_id), between
`<start_of_image>` and `<end_of_image>`: the k-th image token of a row takes the k-th soft token of the
row's images, in order. Images are [rows, images a row, size, size, 3], normalised to [-1, 1]; a row
with fewer images than the batch's widest pads with any image, whose soft tokens no token takes.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from trainer.gemma3.config import VisionConfig
from trainer.nn import layers


class _Module(nn.Module):
    config: VisionConfig
    dtype: Any  # the parameters' and the computation's


class _FeedForward(_Module):
    @nn.compact
    def __call__(self, x):
        types = dict(dtype=self.dtype, param_dtype=self.dtype)
        x = checkpoint_name(nn.Dense(self.config.mlp_dim, name="Dense_0", **types)(x), layers.PROJECTIONS)
        return checkpoint_name(nn.Dense(self.config.width, name="Dense_1", **types)(nn.gelu(x)), layers.PROJECTIONS)


def _attention(options: layers.LayerOptions, patches: int):
    """The encoder's attention function for flax's MultiHeadDotProductAttention (unscaled queries [N, P, heads,
    head_dim]): the splash kernel with a full mask where the run asked for splash and its block divides the
    patches, else flax's dense one."""
    if options.attention != "splash" or patches % layers.KERNELS["splash"].block:
        return nn.dot_product_attention

    def attend(query, key, value):
        whole = jnp.ones(query.shape[:2], jnp.int32)  # one segment: the image
        return layers.kernel_attention(options, query * query.shape[-1] ** -0.5, key, value, whole, window=None, causal=False)

    return attend


class _EncoderBlock(_Module):
    options: layers.LayerOptions = layers.LayerOptions()

    @nn.compact
    def __call__(self, x):
        c, types = self.config, dict(dtype=self.dtype, param_dtype=self.dtype)
        y = nn.LayerNorm(name="LayerNorm_0", **types)(x)
        y = nn.MultiHeadDotProductAttention(num_heads=c.num_heads, attention_fn=_attention(self.options, x.shape[1]),
                                            name="MultiHeadDotProductAttention_0", **types)(y, y)
        x = x + checkpoint_name(y, layers.PROJECTIONS)
        return x + _FeedForward(c, self.dtype, name="MlpBlock_0")(nn.LayerNorm(name="LayerNorm_1", **types)(x))


class _Blocks(_Module):
    """gemma's `Transformer` scope of the encoder: its blocks and final norm."""

    options: layers.LayerOptions = layers.LayerOptions()

    @nn.compact
    def __call__(self, x):
        policy = layers.REMAT_POLICIES[self.options.remat]
        block = nn.remat(_EncoderBlock, policy=policy) if policy else _EncoderBlock
        for i in range(self.config.depth):
            x = block(self.config, self.dtype, self.options, name=f"encoderblock_{i}")(x)
        return nn.LayerNorm(name="encoder_norm", dtype=self.dtype, param_dtype=self.dtype)(x)


class _SigLIP(_Module):
    options: layers.LayerOptions = layers.LayerOptions()

    @nn.compact
    def __call__(self, images):
        """[N, size, size, 3] -> [N, patches, width]."""
        c = self.config
        x = nn.Conv(c.width, (c.patch_size, c.patch_size), strides=(c.patch_size, c.patch_size), padding="VALID",
                    name="embedding", dtype=self.dtype, param_dtype=self.dtype)(images.astype(self.dtype))
        x = x.reshape(x.shape[0], -1, c.width)  # the patches row by row
        x = x + self.param("pos_embedding", nn.initializers.normal(stddev=c.width**-0.5), (1, x.shape[1], c.width),
                           self.dtype)
        return _Blocks(c, self.dtype, self.options, name="Transformer")(x)


class VisionEncoder(_Module):
    """Images [B, M, size, size, 3] -> soft tokens [B, M, soft_tokens, width], before the projector."""

    options: layers.LayerOptions = layers.LayerOptions()  # how its blocks run: remat, the attention kernel

    @nn.compact
    def __call__(self, images):
        c = self.config
        rows, per_row = images.shape[:2]
        encoded = _SigLIP(c, self.dtype, self.options, name="siglip_encoder")(images.reshape(rows * per_row, *images.shape[2:]))
        side = c.patches_per_side
        grid = encoded.reshape(rows * per_row, side, side, c.width)
        pooled = nn.avg_pool(grid, (c.pooling, c.pooling), strides=(c.pooling, c.pooling))
        return pooled.reshape(rows, per_row, c.soft_tokens, c.width)


def image_ids(is_image):
    """[B, L] bool (the image tokens) -> [B, L] int32: 0 for text, k for the tokens of the row's k-th image
    (a run of image tokens), which see each other both ways."""
    starts = is_image & ~jnp.pad(is_image, ((0, 0), (1, 0)))[:, :-1]
    return jnp.where(is_image, jnp.cumsum(starts, axis=1, dtype=jnp.int32), 0)


def merged(text, soft, is_image):
    """The text's embeddings [B, L, D] with its image tokens' replaced by the row's soft tokens [B, M, T, D],
    in order."""
    rows = soft.reshape(soft.shape[0], -1, soft.shape[-1])
    index = jnp.clip(jnp.cumsum(is_image, axis=1) - 1, 0, rows.shape[1] - 1)
    taken = jnp.take_along_axis(rows, index[..., None], axis=1)
    return jnp.where(is_image[..., None], taken.astype(text.dtype), text)
