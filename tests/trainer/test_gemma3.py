"""trainer.gemma3 against the gemma package it replaces in the image: the same architectures, the same
parameter tree (so gemma's checkpoints and our earlier runs' load), the same hidden states for the
same weights, LoRA included; and the trainer imports without gemma, kauldron or TensorFlow."""

import dataclasses
import pkgutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gemma import gm, peft

import trainer
from trainer.model import models
from trainer.nn import loss
from trainer.gemma3 import config as gemma3_config
from trainer.gemma3.config import Attention, Gemma3Config
from trainer.gemma3.model import packed_mask

GEMMA_CLASSES = {"gemma3-270m": "Gemma3_270M", "gemma3-1b": "Gemma3_1B", "gemma3-4b": "Gemma3_4B", "gemma3-12b": "Gemma3_12B",
                 "gemma3-27b": "Gemma3_27B"}


def gemma_config(config: Gemma3Config) -> gm.nn.config.TransformerConfig:
    """The gemma package's config of one of our architectures."""
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


def gemma_model(config, lora_rank=0):
    model = gm.nn.Transformer(config=gemma_config(config), dtype=jnp.float32)
    return gm.nn.LoRA(rank=lora_rank, model=model, dtype=jnp.float32) if lora_rank else model


def shapes(tree):
    return {jax.tree_util.keystr(path): leaf.shape for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


@pytest.mark.parametrize("name", list(GEMMA_CLASSES))
def test_each_architecture_is_the_gemma_packages(name):
    theirs = dataclasses.replace(getattr(gm.nn, GEMMA_CLASSES[name]).config, vision_encoder=None)
    assert gemma_config(gemma3_config.MODELS[name]) == theirs
    assert gemma3_config.MODELS[name].query_pre_attn_scalar**-0.5 == pytest.approx(theirs.query_pre_attn_scalar())


@pytest.mark.parametrize("name, lora_rank", [("gemma3-270m", 0), ("gemma3-270m", 16), ("gemma3-4b", 0), ("gemma3-27b", 8)])
def test_the_parameter_tree_is_gemmas(name, lora_rank):
    """Names, nesting and shapes: what checkpoints (official, exported, a LoRA run's adapters) are read by."""
    config = gemma3_config.MODELS[name]
    tokens = jnp.ones((1, 8), jnp.int32)
    theirs = jax.eval_shape(lambda: gemma_model(config, lora_rank).init(jax.random.key(0), tokens)["params"])
    ours = jax.eval_shape(lambda: models.init_params(config, seed=0, lora_rank=lora_rank))
    assert shapes(ours) == shapes(theirs)


def rich_config(vocab=96):
    """Grouped kv heads, a global layer after five local ones with its own RoPE base and scaling, a
    window shorter than the documents."""
    return dataclasses.replace(gemma3_config.tiny(vocab), num_kv_heads=2, num_layers=6, sliding_window_size=8,
                               global_scale_factor=8.0, embed_dim=64, hidden_dim=128, head_dim=16,
                               query_pre_attn_scalar=16)


def packed_batch(vocab, *, rows=2, length=64):
    """Rows of three documents each; positions restart in each."""
    rng = np.random.default_rng(0)
    lengths = (20, 30, length - 50)
    segment_ids = np.concatenate([np.full(n, i + 1) for i, n in enumerate(lengths)])
    positions = np.concatenate([np.arange(n) for n in lengths])
    return {"input_tokens": jnp.asarray(rng.integers(0, vocab, (rows, length))),
            "segment_ids": jnp.asarray(np.tile(segment_ids, (rows, 1))), "positions": jnp.asarray(np.tile(positions, (rows, 1)))}


@pytest.mark.parametrize("config, lora_rank", [(gemma3_config.tiny(96), 0), (rich_config(), 4)], ids=["tiny", "rich-lora"])
def test_hidden_states_equal_gemmas_for_the_same_weights(config, lora_rank):
    """Each side jitted; gemma's init compiled unoptimised, as trainer.model.models compiles ours on CPU (the rich
    model's took 40 s to optimise)."""
    theirs = gemma_model(config, lora_rank)
    batch = packed_batch(config.num_embed)
    init = jax.jit(theirs.init, compiler_options=models.INIT_COMPILER_OPTIONS.get(jax.default_backend()))
    params = init(jax.random.key(0), batch["input_tokens"])["params"]
    # Every weight moved off its initial value: norm scales away from 0, LoRA's B away from 0.
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    params = jax.tree.unflatten(tree, [leaf + 0.05 * jax.random.normal(key, leaf.shape) for leaf, key in zip(leaves, keys)])
    mask = packed_mask(batch["segment_ids"])
    want = jax.jit(lambda p: theirs.apply({"params": p}, batch["input_tokens"], positions=batch["positions"], attention_mask=mask,
                                          return_hidden_states=True).hidden_states)(params)
    ours = models.build_model(config, dtype=jnp.float32, lora_rank=lora_rank)
    got = jax.jit(lambda p: loss.hidden_states(ours, p, batch))(params)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


def test_adapters_split_and_join_as_gemmas_peft():
    config = rich_config()
    params = jax.eval_shape(lambda: models.init_params(config, seed=0, lora_rank=2))
    base, adapters = peft.split_params(params)
    assert shapes(models.adapters_only(params)) == shapes(adapters)
    assert shapes(models.join_lora(base, adapters)) == shapes(peft.merge_params(base, adapters)) == shapes(params)


def test_the_trainer_imports_without_gemma_kauldron_or_tensorflow():
    """The image installs none of them: every trainer module must import on its package set."""
    names = [module.name for module in pkgutil.walk_packages(trainer.__path__, "trainer.")]
    code = ("import importlib, sys\n"
            "for blocked in ('gemma', 'kauldron', 'tensorflow', 'tensorflow_datasets'):\n"
            "    sys.modules[blocked] = None\n"
            f"for name in {names!r}:\n"
            "    importlib.import_module(name)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
