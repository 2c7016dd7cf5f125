"""Gemma 3 with images (trainer.gemma3.vision): the full-size encoder and projector have the gemma package's
shapes and parameter tree (so its checkpoints keep theirs), a packed row of documents with images
computes what each document computes alone, with the splash kernel asked for too (a batch with images runs
dense), and --remat covers the encoder's blocks. Logit equality with transformers' Gemma3ForConditionalGeneration: tests/trainer/hf/test_import.py."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from gemma.gm.nn import _modules as gemma_modules
from gemma.gm.nn.vision import _vision as gemma_vision

from trainer.gemma3 import config as gemma3_config
from trainer.gemma3.model import Embedder
from trainer.gemma3.vision import VisionEncoder
from trainer.model import models
from trainer.nn import layers


def shapes(tree):
    return {jax.tree_util.keystr(path): leaf.shape for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def test_the_full_size_encoder_and_projector_are_gemmas():
    """SigLIP at 896 pixels, 14-pixel patches, 27 layers, pooled to 256 soft tokens, projected into gemma3-4b's
    embedding: gemma's Gemma3_4B has the same tree and shapes."""
    vision, text = gemma3_config.SIGLIP, gemma3_config.MODELS["gemma3-4b"]
    patches = jnp.zeros((1, 1, vision.patches_per_side**2, 3 * vision.patch_size**2))
    theirs = jax.eval_shape(lambda: gemma_vision.SigLiPFromPatches().init(jax.random.key(0), patches=patches, is_training=False))
    images = jnp.zeros((1, 1, vision.image_size, vision.image_size, 3))
    ours = jax.eval_shape(lambda: VisionEncoder(vision, jnp.float32).init(jax.random.key(0), images))
    assert shapes(ours["params"]) == shapes(theirs["params"])
    assert jax.eval_shape(lambda v: VisionEncoder(vision, jnp.float32).apply(v, images), ours).shape == (1, 1, 256, vision.width)

    gemma_embedder = gemma_modules.Embedder(text.num_embed, text.embed_dim, vision_proj_dim=vision.width)
    theirs = jax.eval_shape(lambda: gemma_embedder.init(jax.random.key(0), jnp.zeros((1, 256, vision.width)),
                                                        method=gemma_embedder.encode_vision))
    soft = jnp.zeros((1, 1, 256, vision.width))
    ours = jax.eval_shape(lambda: Embedder(text.num_embed, text.embed_dim, jnp.float32).init(
        jax.random.key(0), jnp.zeros((1, 260), jnp.int32), soft, jnp.zeros((1, 260), bool)))
    assert shapes(ours["params"]) == shapes(theirs["params"])


def tiny_vision_model(rng):
    """The tiny model with the tiny encoder, random N(0, 0.1) weights (drawn by numpy: init would compile)."""
    vision = gemma3_config.tiny_vision(image_token_id=256)
    config = dataclasses.replace(models.model_config("tiny", vocab_size=256), vision=vision)
    shapes_ = jax.eval_shape(lambda: models.init_params(config, seed=0))
    params = jax.tree.map(lambda leaf: jnp.asarray(0.1 * rng.standard_normal(leaf.shape), leaf.dtype), shapes_)
    return models.build_model(config, dtype=jnp.float32), vision, params


def document(rng, vision, length):
    """A document of `length` tokens from position 0 with one image (markers 5 and 6 around its tokens)."""
    tokens = rng.integers(7, 200, length)
    tokens[0], tokens[3], tokens[4 + vision.soft_tokens] = 2, 5, 6
    tokens[4: 4 + vision.soft_tokens] = vision.image_token_id
    return tokens


def test_a_packed_row_with_images_computes_each_document_alone():
    """Two documents with an image each, packed in one 128-token row (the splash kernel's block) and asked to
    run with splash: each document's hidden states are those it has alone in its own row, run dense."""
    rng = np.random.default_rng(0)
    model, vision, params = tiny_vision_model(rng)
    apply = jax.jit(model.apply, static_argnames="options")
    images = rng.uniform(-1, 1, (2, 1, vision.image_size, vision.image_size, 3)).astype(np.float32)
    first, second = document(rng, vision, 64), document(rng, vision, 64)

    packed = np.concatenate([first, second])[None]
    positions = np.concatenate([np.arange(64), np.arange(64)])[None]
    segments = np.concatenate([np.full(64, 1), np.full(64, 2)])[None]
    splash = layers.LayerOptions(attention="splash", interpret=True)
    together = apply({"params": params}, packed, positions, segments, images.reshape(1, 2, *images.shape[2:]), options=splash)[0]
    alone = apply({"params": params}, np.stack([first, second]), images=images)
    np.testing.assert_allclose(together, alone.reshape(together.shape), atol=1e-5)



def test_remat_covers_the_image_encoder():
    """The backward pass keeps each encoder block's feed-forward-wide activations without remat (5 a block),
    its first projection's output alone with dots (PROJECTIONS), none with full (jax.checkpoint keeps the
    gradients as they were)."""
    rng = np.random.default_rng(1)
    model, vision, params = tiny_vision_model(rng)
    tokens = document(rng, vision, 16)[None]
    images = rng.uniform(-1, 1, (1, 1, vision.image_size, vision.image_size, 3)).astype(np.float32)
    patches = vision.patches_per_side**2

    def hidden(params, remat):
        return model.apply({"params": params}, tokens, images=images, options=layers.LayerOptions(remat=remat))

    def kept(remat):
        leaves = jax.eval_shape(lambda p: jax.tree.leaves(jax.vjp(lambda p: hidden(p, remat), p)[1]), params)
        return sum(leaf.shape[-2:] == (patches, vision.mlp_dim) for leaf in leaves)

    assert {remat: kept(remat) for remat in ("none", "dots", "full")} == {"none": 5 * vision.depth, "dots": vision.depth, "full": 0}


def test_the_encoder_in_the_splash_kernel_computes_what_the_dense_one_does():
    """Asked for splash, an encoder of 256 patches (two of the kernel's 128-blocks) runs its attention in the
    kernel with a full mask (Pallas' interpreter here): the same soft tokens as the dense attention."""
    vision = gemma3_config.VisionConfig(image_size=224, patch_size=14, width=32, depth=1, mlp_dim=48, num_heads=2,
                                        soft_tokens=16, image_token_id=256)
    images = np.random.default_rng(2).uniform(-1, 1, (2, 1, vision.image_size, vision.image_size, 3)).astype(np.float32)
    dense = VisionEncoder(vision, jnp.float32)
    params = dense.init(jax.random.key(0), images)
    splash = VisionEncoder(vision, jnp.float32, layers.LayerOptions(attention="splash", interpret=True))
    assert "pallas_call" in str(jax.make_jaxpr(splash.apply)(params, images))
    np.testing.assert_allclose(jax.jit(splash.apply)(params, images), jax.jit(dense.apply)(params, images), atol=1e-5)
