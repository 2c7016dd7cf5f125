"""Splash attention (the TPU kernel, here in Pallas' interpreter on CPU) against the dense [L, L] mask
on packed rows of the tiny Gemma 3 model: the same hidden states and gradients, with LoRA too; and
rematerialised blocks give the same loss and gradients as none."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from trainer import layers, loss, models
from trainer.errors import UserError

SEQ = 256  # the kernel's blocks are 128 tokens; the tiny model's sliding window (64) is shorter than a row
VOCAB = 512


def packed_batch():
    """Two rows: three documents, then two documents and padding (segment 0)."""
    rng = np.random.default_rng(0)
    segments = np.zeros((2, SEQ), np.int32)
    positions = np.zeros((2, SEQ), np.int32)
    for row, cuts in enumerate([(0, 90, 200, SEQ), (0, 150, 230)]):
        for doc, (start, end) in enumerate(zip(cuts, cuts[1:]), start=1):
            segments[row, start:end] = doc
            positions[row, start:end] = np.arange(end - start)
    tokens = rng.integers(1, VOCAB, (2, SEQ)).astype(np.int32) * (segments > 0)
    return {"input_tokens": jnp.asarray(tokens), "segment_ids": jnp.asarray(segments), "positions": jnp.asarray(positions)}


@pytest.fixture(scope="module")
def model_config():
    config = models.model_config("tiny", vocab_size=VOCAB)
    assert config.sliding_window_size < SEQ  # the local layers' window is exercised
    return config


@pytest.mark.parametrize("lora_rank, remat", [(0, "none"), (4, "none"), (0, "full")])
def test_splash_attention_equals_the_dense_mask_on_packed_rows(model_config, lora_rank, remat):
    """Also inside rematerialised blocks, where the kernel's segment ids cross the block's boundary."""
    model = models.build_model(model_config, dtype=jnp.float32, lora_rank=lora_rank)
    batch = packed_batch()
    params = model.init(jax.random.key(0), batch["input_tokens"][:, :8])["params"]
    if lora_rank:  # B starts at 0: move it so that the adapters take part
        params = jax.tree_util.tree_map_with_path(
            lambda path, x: x + 0.02 if "lora" in jax.tree_util.keystr(path) else x, params)
    splash = layers.LayerOptions(attention="splash", remat=remat, interpret=True)
    projection = jax.random.normal(jax.random.key(1), (model_config.embed_dim,))

    def objective(params, options):
        hidden = loss.hidden_states(model, params, batch, options)
        return jnp.sum((hidden @ projection) * (batch["segment_ids"] > 0))

    dense_hidden = jax.jit(lambda p: loss.hidden_states(model, p, batch))(params)
    splash_hidden = jax.jit(lambda p: loss.hidden_states(model, p, batch, splash))(params)
    real = np.asarray(batch["segment_ids"] > 0)
    np.testing.assert_allclose(np.asarray(splash_hidden)[real], np.asarray(dense_hidden)[real], atol=2e-5, rtol=1e-4)
    dense_grads = jax.jit(jax.grad(lambda p: objective(p, layers.LayerOptions())))(params)
    splash_grads = jax.jit(jax.grad(lambda p: objective(p, splash)))(params)
    for dense, kernel in zip(jax.tree.leaves(dense_grads), jax.tree.leaves(splash_grads)):
        np.testing.assert_allclose(kernel, dense, atol=1e-4 * float(jnp.max(jnp.abs(dense))) + 1e-6, rtol=1e-3)


def test_a_wrong_window_would_be_caught(model_config):
    """The comparison above can fail: the kernel with a window of the whole row is not the model's."""
    batch = packed_batch()
    model = models.build_model(model_config, dtype=jnp.float32)
    params = model.init(jax.random.key(0), batch["input_tokens"][:, :8])["params"]
    wide = dataclasses.replace(model_config, sliding_window_size=SEQ)
    wrong = models.build_model(wide, dtype=jnp.float32)
    dense = loss.hidden_states(model, params, batch)
    other = loss.hidden_states(wrong, params, batch, layers.LayerOptions(attention="splash", interpret=True))
    assert float(jnp.max(jnp.abs(dense - other))) > 1e-3


def primitives(jaxpr) -> set[str]:
    """The names of the primitives in a jaxpr and the jaxprs inside it."""
    found = set()
    for equation in jaxpr.eqns:
        found.add(equation.primitive.name)
        for value in equation.params.values():
            for inner in value if isinstance(value, (list, tuple)) else [value]:
                inner = getattr(inner, "jaxpr", inner)
                if hasattr(inner, "eqns"):
                    found |= primitives(inner)
    return found


@pytest.mark.parametrize("remat", ["dots", "full"])
def test_rematerialised_blocks_give_the_same_loss_and_gradients(model_config, remat):
    model = models.build_model(model_config, dtype=jnp.float32)
    batch = packed_batch()
    batch = {**batch, "target_tokens": jnp.roll(batch["input_tokens"], -1, axis=1),
             "loss_mask": (batch["segment_ids"] > 0).astype(jnp.float32)}
    params = model.init(jax.random.key(0), batch["input_tokens"][:, :8])["params"]

    def mean_loss(params, options):
        total, count = loss.loss_sums(model, params, batch, softcap=None, vocab_chunk=None, layers=options)
        return total / count

    plain, plain_grads = jax.jit(jax.value_and_grad(lambda p: mean_loss(p, layers.LayerOptions())))(params)
    rematerialised = jax.value_and_grad(lambda p: mean_loss(p, layers.LayerOptions(remat=remat)))
    assert "remat2" in primitives(jax.make_jaxpr(rematerialised)(params).jaxpr)  # blocks under jax.checkpoint
    value, grads = jax.jit(rematerialised)(params)
    assert float(value) == pytest.approx(float(plain), rel=1e-6)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(plain_grads)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_the_options_table_names_the_policies_there_are():
    from trainer import config, step

    assert (*step.remat_candidates("auto"),) == tuple(layers.REMAT_POLICIES) == config.REMATS[1:] == ("none", "dots", "full")
    assert config.ATTENTIONS == ("auto", "dense", "splash")
    assert layers.choose_attention("auto", platform="tpu", seq_len=1024) == "splash"
    assert layers.choose_attention("auto", platform="tpu", seq_len=1000) == "dense"  # the kernel's blocks are 128
    assert layers.choose_attention("auto", platform="cpu", seq_len=1024) == "dense"
    with pytest.raises(UserError, match="^--attention splash: --seq-len 1000 must be a multiple of 128"):
        layers.choose_attention("splash", platform="tpu", seq_len=1000)
