"""`trainer.model.params_io` against the gemma package it stands in for: each reads what the other writes,
an official-layout checkpoint (FLAT, with a vision encoder) loads to the tree gemma's text_only load
gives, and the constants copied from gemma still match it. The trainer image lacks gemma; this dev
environment keeps it only to prove this."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from gemma import gm
from gemma.gm.ckpts import _checkpoint as gemma_checkpoint

from trainer.model import params_io


def _tiny_params():
    """A real (tiny) Gemma 3 text tree: bfloat16 weights, MLP einsums, QK norms, the embedder."""
    layers = gm.nn.config.make_attention_layers_types(gm.nn.config.GEMMA3_ATTENTION_PATTERN, num_layers=2)
    config = dataclasses.replace(
        gm.nn.Gemma3_270M.config, num_embed=64, embed_dim=16, hidden_dim=32, num_heads=2, head_dim=8, attention_types=layers
    )
    model = gm.nn.Transformer(config=config, dtype=jnp.bfloat16)
    return model.init(jax.random.key(0), jnp.ones((1, 4), jnp.int32))["params"]


@pytest.fixture(scope="module")
def params():
    return _tiny_params()


def _assert_same(got, want):
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(got)[0], jax.tree.leaves(want)):
        assert isinstance(a, jax.Array), path
        assert a.dtype == b.dtype and a.shape == b.shape, path
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=jax.tree_util.keystr(path))


def test_gemma_reads_what_we_save(params, tmp_path):
    params_io.save_params(params, tmp_path / "ours")
    _assert_same(gm.ckpts.load_params(tmp_path / "ours"), params)


def test_we_read_what_gemma_saves(params, tmp_path):
    gm.ckpts.save_params(params, tmp_path / "gemma", wait_until_finished=True)
    _assert_same(params_io.load_params(str(tmp_path / "gemma")), params)


def test_an_official_layout_checkpoint_loads_text_only_as_gemma_does(params, tmp_path):
    """The official checkpoints are FLAT ('transformer/layer_0/mlp/linear' -> {'w': ...}) with the
    vision encoder under 'SigLiPFromPatches_0/...'; gemma's own NESTED->FLAT conversion writes one."""
    ones = lambda *shape: jnp.ones(shape, jnp.float32)  # noqa: E731
    multimodal = jax.tree.map(lambda x: x, params)
    multimodal["embedder"]["mm_input_projection"] = {"w": ones(4, 16)}
    multimodal["embedder"]["mm_soft_embedding_norm"] = {"scale": ones(4)}
    multimodal["vision_encoder"] = {
        "siglip_encoder": {
            "embedding": {"kernel": ones(2, 2, 3, 4), "bias": ones(4)},
            "Transformer": {"encoderblock_0": {"MlpBlock_0": {"Dense_0": {"kernel": ones(4, 8)}}}},
        }
    }
    flat = gemma_checkpoint._nested_to_flat(multimodal)
    assert "transformer/layer_0/mlp/linear" in flat and any(k.startswith("SigLiPFromPatches_0/") for k in flat)
    with ocp.StandardCheckpointer() as writer:
        writer.save(tmp_path / "official", flat)
    assert gemma_checkpoint._CheckpointTree(tree=flat).type == gemma_checkpoint._CheckpointType.FLAT

    want = gm.ckpts.load_params(tmp_path / "official", text_only=True)
    got = params_io.load_params(str(tmp_path / "official"))
    _assert_same(got, want)
    _assert_same(got, params)  # the text tree, no vision entries


def test_restores_into_the_given_shardings(params, tmp_path):
    params_io.save_params(params, tmp_path / "ckpt")
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("fsdp",))
    seen = []

    def shardings(abstract):
        seen.append(abstract)
        return jax.tree.map(lambda x: jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("fsdp")), abstract)

    got = params_io.load_params(str(tmp_path / "ckpt"), sharding=shardings)
    _assert_same(got, params)
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(seen[0]))
    assert jax.tree.structure(seen[0]) == jax.tree.structure(params)
    assert all(x.sharding.spec == jax.sharding.PartitionSpec("fsdp") for x in jax.tree.leaves(got))

    one = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    assert all(x.sharding == one for x in jax.tree.leaves(params_io.load_params(str(tmp_path / "ckpt"), sharding=one)))


@pytest.mark.parametrize("make", [lambda p: None, lambda p: p.mkdir()], ids=["missing", "empty"])
def test_no_checkpoint_is_file_not_found(tmp_path, make):
    make(tmp_path / "weights")
    with pytest.raises(FileNotFoundError, match="no Orbax checkpoint"):
        params_io.load_params(str(tmp_path / "weights"))


def test_constants_match_gemma():
    from trainer.data import tokenizer

    assert tokenizer.OFFICIAL_TOKENIZER == str(gm.text.Gemma3Tokenizer.path)
    from trainer.config import GEMMA3_MODELS

    assert set(params_io.OFFICIAL_CHECKPOINTS) == set(GEMMA3_MODELS)
    for name, path in params_io.OFFICIAL_CHECKPOINTS.items():
        assert path == str(gm.ckpts.CheckpointPath[name.replace("-", "_").upper() + "_PT"])
