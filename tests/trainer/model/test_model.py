"""The model and the loss: packing, padding, vocabulary chunks, LoRA, weights and vocabulary checks."""

import dataclasses
import functools
import os
import pathlib
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend import core as jax_core

from trainer.data import loader as data

from trainer.model import models
from trainer.nn import layers, loss
from trainer.run import mesh
from trainer.errors import UserError
from trainer.gemma3.model import FeedForward, Transformer

SEQ_LEN = 64


@pytest.fixture(scope="module")
def tiny(tokenized_data):
    config = models.model_config("tiny", vocab_size=tokenized_data.vocab_size)
    model = models.build_model(config, dtype=jnp.float32)
    params = models.init_params(config, seed=0)
    return model, params


@pytest.fixture(scope="module")
def packed_batch(tokenized_data):
    """A real batch whose first row packs several documents."""
    iterator = data.batches(tokenized_data, seq_len=SEQ_LEN, global_batch_size=4, seed=0, prefetch=False)
    for batch in iterator:
        rows = [row for row in range(4) if len(np.unique(batch["segment_ids"][row])) >= 3]  # padding + 2 documents
        if rows:
            return {key: np.asarray(value)[[rows[0], *range(rows[0])]] for key, value in batch.items()}
    pytest.fail("no packed row in the fixture data")


def _token_losses(model, params, batch):
    hidden = loss.hidden_states(model, params, batch)
    return loss.token_losses(hidden, params["embedder"]["input_embedding"], batch["target_tokens"])


def _row_of_segment(batch, row, segment):
    """One document of a packed row, alone at the start of an unpacked row of the same length."""
    where = batch["segment_ids"][row] == segment
    alone = {key: np.zeros((1, SEQ_LEN), value.dtype) for key, value in batch.items()}
    for key, value in batch.items():
        alone[key][0, : where.sum()] = value[row][where]
    alone["segment_ids"][0, : where.sum()] = 1
    return alone, where


def test_packed_row_gives_each_document_the_loss_it_has_alone(tiny, packed_batch):
    model, params = tiny
    packed = np.asarray(_token_losses(model, params, packed_batch))
    segments = [s for s in np.unique(packed_batch["segment_ids"][0]) if s > 0]
    for segment in segments:
        alone, where = _row_of_segment(packed_batch, 0, segment)
        alone_losses = np.asarray(_token_losses(model, params, alone))[0, : where.sum()]
        mask = packed_batch["loss_mask"][0][where] > 0
        np.testing.assert_allclose(packed[0][where][mask], alone_losses[mask], rtol=2e-5, atol=2e-5)


def test_extra_padding_does_not_change_the_loss(tiny, packed_batch):
    model, params = tiny
    padded = {key: np.pad(value, ((0, 1), (0, SEQ_LEN))) for key, value in packed_batch.items()}  # a padding row, padded columns
    sums = loss.loss_sums(model, params, packed_batch, softcap=None, vocab_chunk=None)
    padded_sums = loss.loss_sums(model, params, padded, softcap=None, vocab_chunk=None)
    assert float(padded_sums[1]) == float(sums[1]) == packed_batch["loss_mask"].sum()
    np.testing.assert_allclose(float(padded_sums[0] / padded_sums[1]), float(sums[0] / sums[1]), rtol=1e-6)


# The query and key norms' scales get gradients of norm ~1e-9 (against ~1 for the embedding's), which another
# summation order moves by up to 0.07% of their norm; a wrong gradient is off by tens of percent.
FLOAT32_SUMMATION = 2e-3
VOCAB_SIZE = 1000  # a size no other axis of the tiny model has, so the loss head's matmuls can be told apart
CHUNK = 96  # rows' worth of logits: ceil(1000 / 96) = 11 token chunks, raised to 16, which divides 128 and 256 tokens


def _count_matmuls(jaxpr, counted) -> int:
    """dot_generals for which `counted(equation)` holds, in `jaxpr` and the loops and calls in it."""
    count = 0
    for equation in jaxpr.eqns:
        count += equation.primitive.name == "dot_general" and counted(equation)
        for value in equation.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(sub, (jax_core.Jaxpr, jax_core.ClosedJaxpr)):
                    count += _count_matmuls(getattr(sub, "jaxpr", sub), counted)
    return count


def _vocabulary_matmuls(jaxpr) -> int:
    """dot_generals with an operand of VOCAB_SIZE rows or columns."""
    return _count_matmuls(jaxpr, lambda equation: any(VOCAB_SIZE in operand.aval.shape for operand in equation.invars))


@pytest.mark.parametrize(("lora_rank", "matmuls"), [(0, 3), (4, 2)])
def test_fused_head_gives_the_plain_heads_loss_and_gradients_with_three_vocabulary_matmuls(packed_batch, lora_rank, matmuls):
    """The head in token chunks (float32, Gemma 2's final softcap, a packed batch whose loss mask leaves
    prompts out) computes the loss and every gradient that plain logits under autodiff do, and
    its step takes three [tokens x vocab x D] matmuls (logits, hidden-state and embedding gradients), all
    in the forward pass; a head chunked over the vocabulary took four (its backward recomputed the
    logits). LoRA's embedding is frozen: no embedding gradient, two."""
    config = dataclasses.replace(models.model_config("tiny", vocab_size=VOCAB_SIZE), num_layers=1)  # the head is the point
    model = models.build_model(config, dtype=jnp.float32, lora_rank=lora_rank)
    base = models.init_params(config, seed=0)
    adapters = jax.tree.map(lambda p: p + 0.05, models.init_adapters(config, seed=1, lora_rank=lora_rank))  # B starts at zero
    trained = adapters if lora_rank else base
    batch = dict(packed_batch, loss_mask=np.asarray(packed_batch["loss_mask"]).copy())
    batch["loss_mask"][:, :20] = 0  # prompts
    assert batch["target_tokens"].size == 128

    def mean_loss(trained, vocab_chunk):
        whole = models.join_lora(base, trained) if lora_rank else trained
        total, count = loss.loss_sums(model, whole, batch, softcap=30.0, vocab_chunk=vocab_chunk)
        return total / count

    step = jax.jit(jax.value_and_grad(mean_loss), static_argnums=1)
    (plain, plain_grads), (fused, fused_grads) = step(trained, None), step(trained, CHUNK)
    np.testing.assert_allclose(float(fused), float(plain), rtol=1e-6)
    assert_each_leaf_close(fused_grads, plain_grads, FLOAT32_SUMMATION)
    assert _vocabulary_matmuls(jax.make_jaxpr(jax.value_and_grad(mean_loss), static_argnums=1)(trained, CHUNK).jaxpr) == matmuls


def test_fused_head_in_bfloat16_gives_the_plain_heads_loss_and_gradients():
    """bfloat16 hidden states and embedding, a final softcap, a loss mask: the fused head equals the plain
    logits' head (autodiff) within bfloat16 summation; its embedding gradient, summed over 16 token
    chunks in bfloat16, too."""
    tokens, dim = 256, 32
    keys = jax.random.split(jax.random.key(0), 4)
    hidden = jax.random.normal(keys[0], (2, tokens // 2, dim), jnp.bfloat16)
    embedding = (jax.random.normal(keys[1], (VOCAB_SIZE, dim)) * 0.5).astype(jnp.bfloat16)
    targets = jax.random.randint(keys[2], (2, tokens // 2), 0, VOCAB_SIZE)
    mask = (jax.random.uniform(keys[3], (2, tokens // 2)) < 0.7).astype(jnp.float32)
    assert loss.token_chunks(tokens, VOCAB_SIZE, CHUNK) == 16

    def head(hidden, embedding, vocab_chunk):
        return loss.loss_sum(hidden, embedding, targets, mask, softcap=30.0, vocab_chunk=vocab_chunk) / jnp.sum(mask)

    plain, plain_grads = jax.value_and_grad(head, argnums=(0, 1))(hidden, embedding, None)
    fused, fused_grads = jax.jit(jax.value_and_grad(head, argnums=(0, 1)), static_argnums=2)(hidden, embedding, CHUNK)
    np.testing.assert_allclose(float(fused), float(plain), rtol=1e-3)
    assert [grad.dtype for grad in fused_grads] == [jnp.bfloat16, jnp.bfloat16]
    assert_each_leaf_close(fused_grads, plain_grads, BFLOAT16_SUMMATION)


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_feed_forward_computes_the_fused_gate_and_up_projection_in_bfloat16(lora_rank):
    """The two gate/up matmuls give what one matmul over gemma's [2, hidden, embed] weight gives."""
    config = models.model_config("tiny", vocab_size=512)
    module = FeedForward(config=config, dtype=jnp.bfloat16, lora_rank=lora_rank)
    x = jax.random.normal(jax.random.key(0), (2, 16, config.embed_dim), jnp.bfloat16)
    params = module.init(jax.random.key(1), x)["params"]
    params = jax.tree.map(lambda p: p + jnp.asarray(0.05, p.dtype), params)  # LoRA's B starts at zero: make it matter
    gate = jnp.einsum("...F,NHF->...NH", x, params["gating_einsum"])
    if lora_rank:
        factors = params["_LoRAEinsum_gating_einsum"]["lora"]
        gate = gate + jnp.einsum("...F,Fr,rNH->...NH", x, factors["a"], factors["b"])
    hidden = nn.gelu(gate[..., 0, :]) * gate[..., 1, :]
    fused = jnp.einsum("...H,HF->...F", hidden, params["linear"])
    if lora_rank:
        factors = params["_LoRAEinsum_linear"]["lora"]
        fused = fused + jnp.einsum("...H,Hr,rF->...F", hidden, factors["a"], factors["b"])
    split = module.apply({"params": params}, x)
    assert split.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(split, np.float32), np.asarray(fused, np.float32), rtol=2e-2, atol=2e-2)


def assert_gathered_computes_what_plain_did(lora_rank: int, fsdp: int, *, gather: str, remat: str, exact: bool) -> None:
    """The tiny model's loss and gradients with the run's mesh (FSDP over `fsdp` devices) in the layer
    options equal those without it; the mesh's program gathers the weights with the `gather` primitive."""
    config = models.model_config("tiny", vocab_size=512)
    model = Transformer(config, jnp.bfloat16, lora_rank=lora_rank)
    tokens = jax.random.randint(jax.random.key(0), (2, SEQ_LEN), 0, 512)
    params = jax.tree.map(lambda p: p + jnp.asarray(0.05, p.dtype), model.init(jax.random.key(1), tokens)["params"])
    device_mesh = mesh.build_mesh({"data": 1, "fsdp": fsdp}, devices=jax.devices()[:fsdp])
    results = []
    for options in (layers.LayerOptions(remat=remat), layers.LayerOptions(remat=remat, mesh=device_mesh, batch_axes=mesh.BATCH_AXES)):
        step = jax.jit(jax.value_and_grad(
            lambda p: jnp.mean(jnp.square(model.apply({"params": p}, tokens, options=options).astype(jnp.float32)))))
        results.append(step(params))
        assert (gather in str(jax.make_jaxpr(step)(params))) == (options.mesh is not None)
    (plain, plain_grads), (gathered, gathered_grads) = results
    tolerance = 0.0 if exact else BFLOAT16_SUMMATION
    assert abs(float(gathered) - float(plain)) <= tolerance * abs(float(plain))
    assert_each_leaf_close(gathered_grads, plain_grads, tolerance)


# Two bfloat16 steps (2 x 2^-7) of a leaf's norm: what another summation order may change, and far below
# a gradient that is wrong (a split weight's left at zero is 100% of its norm off).
BFLOAT16_SUMMATION = 2 * float(jnp.finfo(jnp.bfloat16).eps)


def assert_each_leaf_close(got_tree, want_tree, tolerance: float) -> None:
    """Every leaf within `tolerance` of its own norm: ||got - want|| <= tolerance ||want||. An absolute
    tolerance cannot tell a gradient from none where most leaves are small (45 of the tiny model's 46
    gradient leaves are below 1e-3, median 3.5e-8)."""
    assert jax.tree.structure(got_tree) == jax.tree.structure(want_tree)
    for (path, got), want in zip(jax.tree.leaves_with_path(got_tree), jax.tree.leaves(want_tree)):
        got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
        assert np.isfinite(got).all(), jax.tree_util.keystr(path)
        off, norm = np.linalg.norm(got - want), np.linalg.norm(want)
        assert off <= tolerance * norm, f"{jax.tree_util.keystr(path)}: off by {off:.3g}, {off / norm:.1%} of its norm {norm:.3g}"


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_projections_gathered_over_the_mesh_compute_what_they_did(lora_rank):
    """With the run's mesh in the layer options, every projection weight is whole on each device before
    its matmul (layers.gathered, which keeps TPU's SPMD partitioner from windowed matmul loops). On one
    device nothing is split: a placement constraint only, so loss and gradients are equal bit for bit."""
    assert_gathered_computes_what_plain_did(lora_rank, 1, gather="sharding_constraint", remat="dots", exact=True)


def test_large_logits_are_chunked_and_small_ones_are_not():
    assert loss.choose_vocab_chunk(32 * 256, 262_144) == loss.VOCAB_CHUNK  # Gemma 3 at 32 rows of 256 per device
    assert loss.choose_vocab_chunk(16 * 128, 512) is None  # the tiny demo


def _matmuls(jaxpr) -> int:
    """dot_generals in `jaxpr` and the loops and calls in it."""
    return _count_matmuls(jaxpr, lambda equation: True)


def _remat_figures(model, trained, join, tokens, remat: str, hidden_dim: int) -> tuple[int, int]:
    """(how many [B, L, hidden_dim] activations the backward pass of `remat` keeps, how many matmuls the
    forward and backward passes take): the kept are the leaves of jax.vjp's function with the tokens'
    shape and the feed-forward's width."""
    options = layers.LayerOptions(remat=remat)
    hidden = lambda trained: model.apply({"params": join(trained)}, tokens, options=options)  # noqa: E731
    kept = jax.eval_shape(lambda trained: jax.tree.leaves(jax.vjp(hidden, trained)[1]), trained)  # shapes only
    wide = sum(leaf.shape[:2] == tokens.shape and leaf.shape[-1] == hidden_dim for leaf in kept)
    return wide, _matmuls(jax.make_jaxpr(jax.grad(lambda trained: jnp.sum(hidden(trained))))(trained).jaxpr)


def test_remat_dots_keeps_a_lora_projections_sum_and_rank_r_intermediate_not_its_two_outputs():
    """--remat dots keeps each projection's output: with LoRA, the sum of the base's and the adapter's, and the
    adapter's rank-r intermediate, so a LoRA block keeps as many feed-forward-wide activations as a full
    fine-tune's (2 a layer, gate and up; keeping every matmul's output kept 4), recomputes no more matmuls
    than a full fine-tune does (the dense attention's two a layer), and computes what it did."""
    config = dataclasses.replace(models.model_config("tiny", vocab_size=VOCAB_SIZE), num_layers=1)
    tokens = jax.random.randint(jax.random.key(0), (2, SEQ_LEN), 0, VOCAB_SIZE)
    base = models.init_params(config, seed=0)
    adapters = jax.tree.map(lambda p: p + 0.05, models.init_adapters(config, seed=1, lora_rank=4))  # B starts at zero
    full, lora = models.build_model(config, dtype=jnp.float32), models.build_model(config, dtype=jnp.float32, lora_rank=4)
    joined = functools.partial(models.join_lora, base)
    figures = {(name, remat): _remat_figures(model, trained, join, tokens, remat, config.hidden_dim)
               for name, (model, trained, join) in {"full": (full, base, lambda p: p), "lora": (lora, adapters, joined)}.items()
               for remat in ("none", "dots")}
    assert figures["full", "dots"][0] == figures["lora", "dots"][0] == 2 * config.num_layers
    recomputed = {name: figures[name, "dots"][1] - figures[name, "none"][1] for name in ("full", "lora")}
    assert recomputed == {"full": 2 * config.num_layers, "lora": 2 * config.num_layers}

    def objective(adapters, remat):
        hidden = lora.apply({"params": joined(adapters)}, tokens, options=layers.LayerOptions(remat=remat))
        return jnp.mean(jnp.square(hidden))

    (plain, plain_grads), (rematerialised, remat_grads) = (jax.jit(jax.value_and_grad(objective), static_argnums=1)(adapters, remat)
                                                          for remat in ("none", "dots"))
    np.testing.assert_allclose(float(rematerialised), float(plain), rtol=1e-6)
    assert_each_leaf_close(remat_grads, plain_grads, 1e-5)


def test_merged_lora_export_computes_what_the_adapted_model_computes(tokenized_data, packed_batch):
    config = models.model_config("tiny", vocab_size=tokenized_data.vocab_size)
    lora_model = models.build_model(config, dtype=jnp.float32, lora_rank=4)
    initial = models.init_params(config, seed=0, lora_rank=4)
    # B starts at zero (the adapter is a no-op); make it matter.
    params = jax.tree_util.tree_map_with_path(
        lambda path, p: p + 0.05 if jax.tree_util.keystr(path).endswith("['b']") else p, initial
    )
    merged = models.merge_lora_into_base(params)
    plain_shapes = jax.eval_shape(lambda: models.init_params(config, seed=0))
    assert jax.tree.structure(merged) == jax.tree.structure(plain_shapes)  # a plain Gemma tree
    plain_model = models.build_model(config, dtype=jnp.float32)
    adapted = np.asarray(loss.hidden_states(lora_model, params, packed_batch))
    np.testing.assert_allclose(np.asarray(loss.hidden_states(plain_model, merged, packed_batch)), adapted, rtol=1e-4, atol=1e-4)
    assert not np.allclose(np.asarray(loss.hidden_states(lora_model, initial, packed_batch)), adapted, atol=1e-3)


def test_tiny_model_takes_the_tokenizer_vocabulary_and_gemma_keeps_its_own():
    assert models.model_config("tiny", vocab_size=700).num_embed == 700
    gemma = models.model_config("gemma3-4b", vocab_size=700)
    assert gemma.num_embed == 262_144


def test_tokenizer_larger_than_the_model_vocabulary_is_a_user_error():
    config = models.model_config("tiny", vocab_size=512)
    with pytest.raises(UserError, match="--tokenizer big.model: its vocabulary \\(1000 pieces\\) does not fit --model tiny"):
        models.check_vocabulary("tiny", config, tokenizer_path="big.model", vocab_size=1000)


@pytest.mark.parametrize("name, path", [("gemma3-270m", "gs://gemma-data/checkpoints/gemma3-270m-pt"), ("gemma3-27b", "gs://gemma-data/checkpoints/gemma3-27b-pt")])
def test_official_weights_are_the_gemma_packages_pretrained_checkpoints(name, path):
    assert models.official_checkpoint(name) == path


def test_weights_path_without_a_checkpoint_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match=f"--weights {tmp_path}/missing: no checkpoint there"):
        models.load_weights(str(tmp_path / "missing"), flag="--weights", expected={}, out_shardings=None)


def test_gemma3_270m_builds_with_its_published_parameter_count():
    config = models.model_config("gemma3-270m", vocab_size=262_144)
    shapes = jax.eval_shape(lambda: models.init_params(config, seed=0))
    assert sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(shapes)) == 268_098_176  # Gemma 3 270M's parameter count


GATHERED_OVER_TWO_DEVICES = """
from tests.trainer.model.test_model import assert_gathered_computes_what_plain_did
for lora_rank in (0, 4):
    assert_gathered_computes_what_plain_did(lora_rank, 2, gather="all_gather", remat="full", exact=False)
print("equal")
"""


def test_weights_split_over_fsdp_are_gathered_explicitly_and_compute_what_they_did():
    """Over two devices (FSDP 2) the split weights are gathered by an explicit all_gather (layers.gathered),
    whose transpose reduce-scatters their gradients: loss and gradients are those without the mesh, within
    bfloat16's summation order. In its own process: the host's CPU is split into two devices."""
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu",
               PYTHONPATH=str(pathlib.Path(__file__).resolve().parents[3]))
    done = subprocess.run([sys.executable, "-c", GATHERED_OVER_TWO_DEVICES], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip().endswith("equal"), done.stderr[-3000:]
