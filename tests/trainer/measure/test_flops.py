"""Parameter counts and training FLOPs from a config, against REFERENCE figures and real models."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest
from gemma import gm

from trainer.measure import flops, hardware

GEMMA3_270M = gm.nn.Gemma3_270M.config  # a config is code: no weights are downloaded


def small_config(**changes):
    base = gm.nn.config.TransformerConfig(
        num_embed=97,
        embed_dim=24,
        hidden_dim=40,
        num_heads=4,
        head_dim=8,
        num_kv_heads=2,
        final_logit_softcap=None,
        use_post_attn_norm=True,
        use_post_ffw_norm=True,
        use_qk_norm=True,
        attention_types=gm.nn.config.make_attention_layers_types(gm.nn.config.GEMMA3_ATTENTION_PATTERN, num_layers=3),
        sliding_window_size=8,
        transpose_gating_einsum=True,
    )
    return dataclasses.replace(base, **changes)


def initialised_params(config, lora_rank=0):
    """The parameters gemma's own init creates, run abstractly (same shapes, no compute: fast)."""
    model = gm.nn.Transformer(config=config, dtype=jnp.float32)
    if lora_rank:
        model = gm.nn.LoRA(rank=lora_rank, model=model, dtype=jnp.float32)
    return jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.ones((1, 4), jnp.int32)))["params"]


def count(tree, *, adapters_only=False):
    leaves = jax.tree_util.tree_leaves_with_path(tree)
    return sum(leaf.size for path, leaf in leaves if not adapters_only or "lora" in jax.tree_util.keystr(path))


VARIANTS = {
    "gemma3-like": {},
    "no-qk-norm-no-post-norms": dict(use_qk_norm=False, use_post_attn_norm=False, use_post_ffw_norm=False),
    "multi-head (fused qkv)": dict(num_kv_heads=4),
    "multi-query": dict(num_kv_heads=1, transpose_gating_einsum=False),
}


@pytest.mark.parametrize("changes", VARIANTS.values(), ids=VARIANTS.keys())
def test_param_count_equals_an_initialised_model(changes):
    config = small_config(**changes)
    assert flops.param_count(config) == count(initialised_params(config))


@pytest.mark.parametrize("changes", VARIANTS.values(), ids=VARIANTS.keys())
def test_lora_param_count_equals_the_adapters_gemma_adds(changes):
    config = small_config(**changes)
    assert flops.lora_param_count(config, 3) == count(initialised_params(config, lora_rank=3), adapters_only=True)


def test_gemma3_270m_param_count_matches_the_published_one():
    # Gemma 3 270M: 268,098,176 parameters, 167,772,160 of them the tied embedding.
    assert flops.param_count(GEMMA3_270M) == 268_098_176
    assert flops.embedding_params(GEMMA3_270M) == 167_772_160


def test_gemma3_270m_training_flops_per_token_at_256_is_in_reference_range():
    # Gemma 3 270M: about 1.64-1.67 GFLOP/token (6N + causal attention); 6N alone is 1.609 G.
    per_token = flops.training_flops_per_token(GEMMA3_270M, 256)
    assert 1.63e9 <= per_token <= 1.67e9
    assert per_token > 6 * flops.param_count(GEMMA3_270M)


def test_tutorial_throughput_gives_its_reported_mfu():
    # The GKE tutorial: 83,400 tokens/s (padding included) on one v6e chip was "roughly 15% MFU".
    mfu = flops.model_flops_utilization(
        83_400, flops.training_flops_per_token(GEMMA3_270M, 256), hardware.peak_bf16_flops("TPU v6 lite")
    )
    assert 0.14 <= mfu <= 0.16


def test_mfu_is_none_without_a_known_peak():
    assert flops.model_flops_utilization(1000.0, 1e9, hardware.peak_bf16_flops("cpu")) is None


def test_attention_flops_grow_with_sequence_but_a_sliding_window_caps_them():
    all_global = small_config(attention_types=(gm.nn.config.AttentionType.GLOBAL,) * 3)
    sliding = small_config(attention_types=(gm.nn.config.AttentionType.LOCAL_SLIDING,) * 3)
    window = sliding.sliding_window_size
    # Within the window the two are the same; beyond it, the sliding layers stop growing.
    assert flops.training_flops_per_token(sliding, window) == flops.training_flops_per_token(all_global, window)
    assert flops.training_flops_per_token(all_global, 4 * window) > flops.training_flops_per_token(all_global, 2 * window)
    sliding_at_2w = flops.training_flops_per_token(sliding, 2 * window)
    assert sliding_at_2w < flops.training_flops_per_token(all_global, 2 * window)
    assert flops.training_flops_per_token(sliding, 4 * window) > sliding_at_2w  # still causal, approaches the cap


def test_lora_skips_the_frozen_weight_gradients():
    full = flops.training_flops_per_token(GEMMA3_270M, 256)
    lora = flops.training_flops_per_token(GEMMA3_270M, 256, lora_rank=8)
    assert full - lora == pytest.approx(2 * flops.param_count(GEMMA3_270M))
