"""Parameter counts and training FLOPs from a config, against REFERENCE figures and real models."""

import dataclasses

import jax
import numpy as np
import pytest
from trainer.model import models
from trainer.gemma3.config import Attention, Gemma3Config, tiny_vision
from trainer.measure import flops
from trainer.run import hardware

GEMMA3_270M = models.model_config("gemma3-270m", vocab_size=0)


def small_config(**changes):
    base = Gemma3Config(num_embed=97, embed_dim=24, hidden_dim=40, num_heads=4, head_dim=8, num_kv_heads=2, num_layers=3,
                        sliding_window_size=8, query_pre_attn_scalar=8)
    return dataclasses.replace(base, **changes)


def initialised_params(config, lora_rank=0):
    """The parameters the model's init creates, run abstractly (same shapes, no compute: fast)."""
    return jax.eval_shape(lambda: models.init_params(config, seed=0, lora_rank=lora_rank))


def count(tree, *, adapters_only=False):
    leaves = jax.tree_util.tree_leaves_with_path(tree)
    return sum(leaf.size for path, leaf in leaves if not adapters_only or "lora" in jax.tree_util.keystr(path))


VARIANTS = {
    "grouped-query": {},
    "multi-query": dict(num_kv_heads=1),
    "seven layers (a global one)": dict(num_layers=7),
}


@pytest.mark.parametrize("changes", VARIANTS.values(), ids=VARIANTS.keys())
def test_param_count_equals_an_initialised_model(changes):
    config = small_config(**changes)
    assert flops.param_count(config) == count(initialised_params(config))


@pytest.mark.parametrize("changes", VARIANTS.values(), ids=VARIANTS.keys())
def test_lora_param_count_equals_the_adapters_the_model_adds(changes):
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
    all_global = small_config(sliding_window_size=10**6)
    sliding = small_config()
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


def _mask_pairs(segments, window):
    """(query, key) pairs the dense mask of packed rows lets through: same document, causal, in the window."""
    pairs = 0
    for row in np.asarray(segments):
        for q in range(len(row)):
            for k in range(q + 1):
                pairs += bool(row[q] and row[q] == row[k] and (window is None or q - k < window))
    return pairs


def test_attention_within_documents_counts_the_pairs_the_packed_mask_lets_through():
    """Three documents (one longer than the 8-token window) and padding in one row, one document over the
    whole of another: within documents, each layer's pairs are the mask's; over the row, they are what
    training_flops_per_token counts, the same as within documents only for the row that is one document."""
    config = small_config(num_layers=7)  # local layers (window 8) and a global one
    segments = np.array([[1] * 11 + [2] * 3 + [3] * 5 + [0] * 5, [7] * 24])
    counted = flops.attention_flops(config, segments)
    per_pair = 3 * 4 * config.num_heads * config.head_dim
    windows = [config.sliding_window_size if kind is Attention.LOCAL else None for kind in config.attention_types]
    assert None in windows and 8 in windows
    assert counted.documents == per_pair * sum(_mask_pairs(segments, window) for window in windows)
    whole_row = per_pair * sum(_mask_pairs(np.ones((2, 24), int), window) for window in windows)
    assert counted.rows == whole_row == pytest.approx(
        (flops.training_flops_per_token(config, 24) - flops.weight_flops_per_token(config)) * 2 * 24)
    one_document = flops.attention_flops(config, segments[1:])
    assert one_document.documents == one_document.rows == counted.rows / 2
    assert counted.documents < 0.75 * counted.rows
    assert list(flops.document_lengths(segments)) == [11, 3, 5, 24]


@pytest.mark.parametrize("train_encoder, per_image", [
    # Counted by hand on the tiny encoder (56-pixel images of 14-pixel patches: 16 patches; width 32, 2 blocks,
    # feed-forward 48, 4 soft tokens) with embed_dim 24. Patch embedding: 2 x 16 x (14 x 14 x 3) x 32 = 602,112.
    # A block: 16 patches x (2 x 4 x 32 x 32 + 2 x 2 x 32 x 48 + 4 x 16 x 32) = 262,144. Projector: 2 x 4 x 32 x 24 = 6,144.
    (False, 602_112 + 2 * 262_144 + 2 * 6_144),  # frozen: forward, and the projector's weight gradient
    (True, 2 * 602_112 + 3 * 2 * 262_144 + 3 * 6_144),  # trained: backward too (the pixels get no gradient)
], ids=["frozen encoder", "trained encoder"])
def test_a_vision_language_row_adds_its_images_encoder_and_projector_flops(train_encoder, per_image):
    text = small_config()
    with_images = small_config(vision=tiny_vision(image_token_id=text.num_embed))
    images = dict(images_per_row=3, train_encoder=train_encoder)
    counted = {rank: flops.training_flops_per_token(with_images, 64, lora_rank=rank, **images)
               - flops.training_flops_per_token(text, 64, lora_rank=rank) for rank in (0, 4)}
    assert counted == {0: pytest.approx(3 * per_image / 64), 4: pytest.approx(3 * per_image / 64)}
