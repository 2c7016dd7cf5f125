"""The attention kernels (splash for TPU, flash for GPU, here in Pallas' interpreter on CPU) against
the dense [L, L] mask on packed rows of the tiny Gemma 3 model: the same hidden states and gradients,
with LoRA too; the flash kernel alone with grouped-query heads, windows that are and are not a
multiple of its block, and bfloat16; the flash kernel lowered for an H200 from this CPU holds no
[L, L] tensor; and rematerialised blocks give the same loss and gradients as none."""

import dataclasses
import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from trainer.model import models
from trainer.nn import flash_attention, layers, loss
from trainer.errors import UserError
from trainer.gemma3.model import dense_attention

SEQ = 256  # a multiple of both kernels' blocks (128, 64); the tiny model's sliding window (64) is shorter than a row
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


@pytest.mark.parametrize("kernel, lora_rank, remat", [
    ("splash", 0, "none"), ("splash", 4, "none"), ("splash", 0, "full"), ("flash", 4, "none"), ("flash", 0, "full")])
def test_kernel_attention_equals_the_dense_mask_on_packed_rows(model_config, kernel, lora_rank, remat):
    """Also inside rematerialised blocks, where the kernel's segment ids cross the block's boundary."""
    model = models.build_model(model_config, dtype=jnp.float32, lora_rank=lora_rank)
    batch = packed_batch()
    params = model.init(jax.random.key(0), batch["input_tokens"][:, :8])["params"]
    if lora_rank:  # B starts at 0: move it so that the adapters take part
        params = jax.tree_util.tree_map_with_path(
            lambda path, x: x + 0.02 if "lora" in jax.tree_util.keystr(path) else x, params)
    kernel = layers.LayerOptions(attention=kernel, remat=remat, interpret=True)
    projection = jax.random.normal(jax.random.key(1), (model_config.embed_dim,))

    def objective(params, options):
        hidden = loss.hidden_states(model, params, batch, options)
        return jnp.sum((hidden @ projection) * (batch["segment_ids"] > 0))

    dense_hidden = jax.jit(lambda p: loss.hidden_states(model, p, batch))(params)
    kernel_hidden = jax.jit(lambda p: loss.hidden_states(model, p, batch, kernel))(params)
    real = np.asarray(batch["segment_ids"] > 0)
    np.testing.assert_allclose(np.asarray(kernel_hidden)[real], np.asarray(dense_hidden)[real], atol=2e-5, rtol=1e-4)
    dense_grads = jax.jit(jax.grad(lambda p: objective(p, layers.LayerOptions())))(params)
    kernel_grads = jax.jit(jax.grad(lambda p: objective(p, kernel)))(params)
    for dense, attended in zip(jax.tree.leaves(dense_grads), jax.tree.leaves(kernel_grads)):
        np.testing.assert_allclose(attended, dense, atol=1e-4 * float(jnp.max(jnp.abs(dense))) + 1e-6, rtol=1e-3)


def attention_inputs(dtype, *, heads: int = 4, kv_heads: int = 2, head_dim: int = 32):
    """Scaled queries, keys and values of packed_batch's rows, with grouped-query heads."""
    batch = packed_batch()
    q, k, v = jax.random.split(jax.random.key(2), 3)
    rows = batch["segment_ids"].shape
    query = jax.random.normal(q, (*rows, heads, head_dim)) * head_dim**-0.5
    key, value = (jax.random.normal(part, (*rows, kv_heads, head_dim)) for part in (k, v))
    return (query.astype(dtype), key.astype(dtype), value.astype(dtype)), batch


@pytest.mark.parametrize("window, dtype", [(None, jnp.float32), (64, jnp.float32), (100, jnp.float32), (100, jnp.bfloat16)])
def test_flash_attention_equals_the_dense_mask(window, dtype):
    """Outputs and the gradients of queries, keys and values; a window of 100 ends inside a block of 64.
    In bfloat16 both are compared with the dense mask in float32, the flash kernel within bfloat16's error."""
    inputs, batch = attention_inputs(dtype)
    segments, positions = batch["segment_ids"], batch["positions"]
    cotangent = jax.random.normal(jax.random.key(3), inputs[0].shape)
    flash = jax.jit(lambda *x: flash_attention.flash_attention(*x, segments, window=window, interpret=True))
    out, pullback = jax.vjp(flash, *inputs)
    wide = [x.astype(jnp.float32) for x in inputs]
    dense_out, dense_pullback = jax.vjp(lambda *x: dense_attention(*x, positions, segments, window=window), *wide)
    tolerance = {"atol": 2e-5, "rtol": 1e-4} if dtype == jnp.float32 else {"atol": 3e-2, "rtol": 3e-2}
    np.testing.assert_allclose(np.asarray(out, np.float32), dense_out, **tolerance)
    for grad, dense in zip(pullback(cotangent.astype(dtype)), dense_pullback(cotangent)):
        assert grad.dtype == dtype
        np.testing.assert_allclose(np.asarray(grad, np.float32), dense, **tolerance)


def test_flash_attention_refuses_a_row_its_block_does_not_divide():
    (query, key, value), batch = attention_inputs(jnp.float32)
    with pytest.raises(ValueError, match="a row of 200 tokens is not a multiple of the block \\(64\\)"):
        flash_attention.flash_attention(query[:, :200], key[:, :200], value[:, :200], batch["segment_ids"][:, :200],
                                        window=None, interpret=True)


@pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated")
@pytest.mark.parametrize("attention, square", [("flash", False), ("dense", True)])
def test_flash_attention_lowered_for_a_gpu_holds_no_square_tensor(model_config, attention, square):
    """The tiny model's forward and backward passes lowered for an NVIDIA H200 from this CPU (Triton's
    kernels are generated here; compiling them to PTX needs the GPU): the flash kernels appear as Triton
    calls, and only the dense path holds a [.., L, L] tensor."""
    model = models.build_model(model_config, dtype=jnp.bfloat16)
    batch = packed_batch()
    params = jax.eval_shape(lambda: model.init(jax.random.key(0), batch["input_tokens"][:, :8])["params"])
    options = layers.LayerOptions(attention=attention)
    objective = lambda p: jnp.sum(loss.hidden_states(model, p, batch, options).astype(jnp.float32))  # noqa: E731
    h200 = jax.sharding.AbstractMesh((1,), ("rows",), abstract_device=jax.sharding.AbstractDevice(
        device_kind="NVIDIA H200", num_cores=None, platform="gpu"))
    with jax.sharding.use_abstract_mesh(h200):
        lowered = jax.jit(jax.grad(objective)).trace(params).lower(lowering_platforms=("cuda",)).as_text()
    triton_calls = re.findall(r"xla\.gpu\.triton", lowered)
    assert len(triton_calls) == (0 if square else 3 * model_config.num_layers)  # forward, dK/dV, dQ per layer
    assert (re.search(rf"tensor<(\d+x)*{SEQ}x{SEQ}x", lowered) is not None) == square


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


def equations(jaxpr):
    """The equations of a jaxpr and of the jaxprs inside it."""
    for equation in jaxpr.eqns:
        yield equation
        for value in equation.params.values():
            for inner in value if isinstance(value, (list, tuple)) else [value]:
                inner = getattr(inner, "jaxpr", inner)
                if hasattr(inner, "eqns"):
                    yield from equations(inner)


def primitives(jaxpr) -> set[str]:
    """The names of the primitives in a jaxpr and the jaxprs inside it."""
    return {equation.primitive.name for equation in equations(jaxpr)}


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


@pytest.mark.parametrize("remat, forward_calls", [("none", 1), ("dots", 1), ("full", 2)])
def test_dots_keeps_the_splash_kernels_output_instead_of_running_the_kernel_again(model_config, remat, forward_calls):
    """A layer's backward pass needs its attention's output (for the output projection's gradient) and log-sum-exp
    (for the kernel's own): "dots" keeps both, so the kernel's forward runs once a layer, as without remat;
    "full" runs it again in the backward pass. Each layer's backward is one kernel (query and key/value
    gradients fused, layers.splash_block_sizes)."""
    model = models.build_model(model_config, dtype=jnp.float32)
    batch = packed_batch()
    params = model.init(jax.random.key(0), batch["input_tokens"][:, :8])["params"]
    options = layers.LayerOptions(attention="splash", remat=remat, interpret=True)
    gradient = jax.make_jaxpr(jax.grad(lambda p: jnp.sum(loss.hidden_states(model, p, batch, options))))(params)
    kernels = [str(e.params["name"]) for e in equations(gradient.jaxpr) if e.primitive.name == "pallas_call"]
    layer_count = model_config.num_layers
    assert sum("_fwd_" in name for name in kernels) == forward_calls * layer_count, kernels
    assert sum("_dkv_" in name for name in kernels) == layer_count and not any("_dq_" in name for name in kernels), kernels


def test_splash_tiles_divide_the_row_and_fuse_the_backward_only_on_short_rows():
    """512 tiles where they divide the row; one backward kernel up to FUSED_BACKWARD_MAX_TILES tiles a row, whose
    query gradient it writes once per key/value tile."""
    tiles = {seq_len: layers.splash_block_sizes(seq_len) for seq_len in (256, 1024, 1536, 8192)}
    assert {seq_len: (t.block_q, t.block_kv, t.block_kv_dkv) for seq_len, t in tiles.items()} == {
        256: (256, 256, 256), 1024: (512, 512, 512), 1536: (512, 512, 512), 8192: (512, 512, 512)}
    assert {seq_len: t.use_fused_bwd_kernel for seq_len, t in tiles.items()} == {256: True, 1024: True, 1536: False, 8192: False}
    assert (tiles[8192].block_q_dq, tiles[1024].block_q_dq) == (512, None)


def multi_tile_inputs(seq: int):
    """One row of `seq` positions, four documents (one across every tile boundary of 128) and padding; two
    heads of 16 sharing one key/value head: the smallest work that still crosses tiles."""
    segments, positions = np.zeros((1, seq), np.int32), np.zeros((1, seq), np.int32)
    cuts = (0, 100, 140, seq - 100, seq - 20)
    for doc, (start, end) in enumerate(zip(cuts, cuts[1:]), start=1):
        segments[0, start:end], positions[0, start:end] = doc, np.arange(end - start)
    q, k, v = jax.random.split(jax.random.key(4), 3)
    query = jax.random.normal(q, (1, seq, 2, 16)) * 16**-0.5
    key, value = (jax.random.normal(part, (1, seq, 1, 16)) for part in (k, v))
    return (query, key, value), jnp.asarray(segments), jnp.asarray(positions)


@pytest.mark.parametrize("seq, fused, window, backward_kernels", [
    (256, None, None, ("_dkv_",)),  # two tiles of 128: the fused backward (FUSED_BACKWARD_MAX_TILES)
    (384, None, 100, ("_dq_", "_dkv_")),  # three tiles: the query gradient's kernel and the key/value's
    (384, True, 100, ("_dkv_",)),  # the fused backward over three tiles, its query gradient summed over them
], ids=["fused-2-tiles", "two-kernels-3-tiles-window", "fused-3-tiles-window"])
def test_splash_over_several_tiles_has_the_dense_masks_gradients(seq, fused, window, backward_kernels):
    """The model's rows are one tile (SEQ) above; here tiles of 128 (splash_block_sizes' `largest`), so the
    backward runs over several: the fused kernel, which writes a query gradient per key/value tile and sums
    them, and the two kernels that rows of more than FUSED_BACKWARD_MAX_TILES tiles take. Gradients of the
    queries, keys and values equal the dense mask's at the documents' positions."""
    assert layers.FUSED_BACKWARD_MAX_TILES == 2  # the cases above name the kernels for this limit
    (query, key, value), segments, positions = multi_tile_inputs(seq)
    tiles = layers.splash_block_sizes(seq, 128, fused_backward=fused)
    assert (tiles.block_q, tiles.block_kv_dkv, tiles.use_fused_bwd_kernel) == (128, 128, "_dq_" not in backward_kernels)
    splash = lambda *x: layers.splash_attention(*x, segments, window=window, interpret=True, block_sizes=tiles)  # noqa: E731
    out, pullback = jax.vjp(splash, query, key, value)
    cotangent = jax.random.normal(jax.random.key(5), out.shape)
    dense_out, dense_pullback = jax.vjp(lambda *x: dense_attention(*x, positions, segments, window=window), query, key, value)
    real = np.asarray(segments[0] > 0)
    np.testing.assert_allclose(np.asarray(out)[0, real], np.asarray(dense_out)[0, real], atol=2e-5, rtol=1e-4)
    cotangent = cotangent * (segments > 0)[..., None, None]  # padding's outputs are nobody's
    for grad, dense in zip(pullback(cotangent), dense_pullback(cotangent)):
        np.testing.assert_allclose(np.asarray(grad)[0, real], np.asarray(dense)[0, real], atol=2e-5, rtol=1e-4)
    gradient = jax.make_jaxpr(lambda *x: pullback(cotangent))(query)
    kernels = [str(e.params["name"]) for e in equations(gradient.jaxpr) if e.primitive.name == "pallas_call"]
    assert sorted(kind for kind in ("_dq_", "_dkv_") if any(kind in name for name in kernels)) == sorted(backward_kernels), kernels


def test_the_options_table_names_the_policies_there_are():
    from trainer import config
    from trainer.run import step

    assert (*step.remat_candidates("auto"),) == tuple(layers.REMAT_POLICIES) == config.REMATS[1:] == ("none", "dots", "full")
    assert config.ATTENTIONS == ("auto", "dense", *layers.KERNELS) == ("auto", "dense", "splash", "flash")
    assert layers.choose_attention("auto", platform="tpu", seq_len=1024) == "splash"
    assert layers.choose_attention("auto", platform="tpu", seq_len=1000) == "dense"  # the kernel's blocks are 128
    assert layers.choose_attention("auto", platform="gpu", seq_len=1024) == "flash"
    assert layers.choose_attention("auto", platform="gpu", seq_len=1088) == "flash"  # 17 blocks of 64
    assert layers.choose_attention("auto", platform="gpu", seq_len=1000) == "dense"
    assert layers.choose_attention("auto", platform="cpu", seq_len=1024) == "dense"
    assert layers.choose_attention("flash", platform="cpu", seq_len=1024) == "flash"  # the interpreter, for tests
    assert layers.interpreted("flash", "cpu") and not layers.interpreted("flash", "gpu") and layers.interpreted("splash", "cpu")
    with pytest.raises(UserError, match="^--attention splash: --seq-len 1000 must be a multiple of 128"):
        layers.choose_attention("splash", platform="tpu", seq_len=1000)
    with pytest.raises(UserError, match="^--attention flash: --seq-len 1000 must be a multiple of 64"):
        layers.choose_attention("flash", platform="gpu", seq_len=1000)
    with pytest.raises(UserError, match="^--attention flash: the kernel runs on gpu, this run is on tpu; use --attention auto"):
        layers.choose_attention("flash", platform="tpu", seq_len=1024)


def test_a_run_with_the_flash_kernel_trains_as_the_dense_mask_does(tmp_path, prepared_dir, tokenizer_path):
    """`python -m trainer --attention flash` on the CPU (the kernel in the interpreter): config.json names
    the kernel, and the first steps' losses are the dense run's."""
    from trainer import loop
    from trainer.config import parse_config
    from trainer.run.metrics import read_metrics

    def run(attention):
        workdir = tmp_path / attention
        loop.train(parse_config([
            "--model", "tiny", "--weights", "random", "--data", str(prepared_dir), "--tokenizer", str(tokenizer_path),
            "--workdir", str(workdir), "--seq-len", "128", "--batch-size", "4", "--steps", "2", "--log-interval", "1",
            "--eval-fraction", "0", "--no-samples", "--compute-dtype", "float32", "--attention", attention]))
        recorded = json.loads((workdir / "config.json").read_text())["attention_kind"]
        return recorded, [r["loss"] for r in read_metrics(workdir / "metrics.jsonl") if "loss" in r]

    (flash, flash_losses), (dense, dense_losses) = run("flash"), run("dense")
    assert (flash, dense) == ("flash", "dense")
    assert len(flash_losses) == 2 and flash_losses == pytest.approx(dense_losses, rel=1e-5)
