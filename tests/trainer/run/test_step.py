"""The optimizer, the jit step and the mesh rules, without a whole run."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from trainer.model import models
from trainer.run import mesh, step
from trainer.run import optimizer as optimizer_lib
from trainer.nn import sharding
from trainer.errors import UserError


def _optimizer_config(**overrides):
    values = dict(lr=1e-3, lr_schedule="cosine", warmup_steps=10, total_steps=100, weight_decay=0.1, grad_clip=1.0)
    return optimizer_lib.OptimizerConfig(**{**values, **overrides})


def test_learning_rate_warms_up_linearly_from_a_non_zero_first_step_then_decays_to_zero_or_stays():
    cosine = optimizer_lib.learning_rate_schedule(_optimizer_config())  # lr 1e-3, warmup 10 of 100 steps
    # Step s trains at schedule(s - 1): step 1 at lr/10, step 10 at lr.
    assert float(cosine(0)) == pytest.approx(1e-4) and float(cosine(5)) == pytest.approx(6e-4)
    assert float(cosine(9)) == pytest.approx(1e-3) and float(cosine(10)) == pytest.approx(1e-3)
    assert float(cosine(55)) == pytest.approx(5e-4, rel=1e-3) and float(cosine(100)) == pytest.approx(0, abs=1e-9)
    assert 0 < float(cosine(99)) < 1e-6  # the last step still trains
    constant = optimizer_lib.learning_rate_schedule(_optimizer_config(lr_schedule="constant"))
    assert float(constant(0)) == pytest.approx(1e-4) and float(constant(5)) == pytest.approx(6e-4)
    assert float(constant(9)) == float(constant(99)) == pytest.approx(1e-3)
    no_warmup = optimizer_lib.learning_rate_schedule(_optimizer_config(lr_schedule="constant", warmup_steps=0))
    assert float(no_warmup(0)) == pytest.approx(1e-3)
    one_step_warmup = optimizer_lib.learning_rate_schedule(_optimizer_config(warmup_steps=1))
    assert float(one_step_warmup(0)) == pytest.approx(1e-3)


def test_warmup_longer_than_the_run_is_accepted():
    schedule = optimizer_lib.learning_rate_schedule(_optimizer_config(warmup_steps=50, total_steps=20))
    assert 0 < float(schedule(0)) < float(schedule(19)) == pytest.approx(1e-3)  # the warmup ends with the run


def test_weight_decay_pulls_matrices_but_not_norm_scales():
    optimizer = optimizer_lib.build_optimizer(_optimizer_config(lr=1.0, warmup_steps=0, lr_schedule="constant", weight_decay=0.5))
    params = {"linear": jnp.ones((4, 4)), "norm": {"scale": jnp.ones((4,))}}
    zero_grads = jax.tree.map(jnp.zeros_like, params)
    updated, _ = optimizer.apply(zero_grads, optimizer.init(params), params)
    np.testing.assert_allclose(updated["linear"], 0.5 * np.ones((4, 4)))
    np.testing.assert_array_equal(updated["norm"]["scale"], np.ones(4))


def test_bfloat16_optimizer_state_halves_the_first_moment_and_updates_as_float32_does():
    params = {"linear": jax.random.normal(jax.random.key(0), (64, 64)), "norm": {"scale": jnp.ones((64,))}}
    grads = jax.tree.map(lambda p: 1e-2 * jax.random.normal(jax.random.key(1), p.shape), params)
    updates = {}
    for dtype in ("float32", "bfloat16"):
        optimizer = optimizer_lib.build_optimizer(_optimizer_config(warmup_steps=0, state_dtype=dtype))
        state = optimizer.init(params)
        for _ in range(3):
            updated, state = optimizer.apply(grads, state, params)
            updates[dtype] = jax.tree.map(jnp.subtract, updated, params)
        adam = state[1][0]
        assert {leaf.dtype for leaf in jax.tree.leaves(adam.mu)} == {jnp.dtype(dtype)}
        assert {leaf.dtype for leaf in jax.tree.leaves(adam.nu)} == {jnp.dtype("float32")}  # the second moment stays
    for got, want in zip(jax.tree.leaves(updates["bfloat16"]), jax.tree.leaves(updates["float32"])):
        assert got.dtype == jnp.float32  # the masters' updates
        np.testing.assert_allclose(got, want, rtol=2e-2, atol=1e-7)


def test_the_run_flag_sets_the_optimizer_state_dtype():
    from trainer.config import parse_config

    config = parse_config(["--model", "gemma3-270m", "--weights", "random", "--data", "x", "--optimizer-state-dtype", "bfloat16"])
    assert optimizer_lib.optimizer_config(config, total_steps=10).state_dtype == "bfloat16"
    assert optimizer_lib.optimizer_config(parse_config(["--model", "gemma3-270m", "--weights", "random", "--data", "x"]), total_steps=10).state_dtype == "float32"


def test_train_step_donates_the_state_and_updates_the_float32_masters():
    config = models.model_config("tiny", vocab_size=64)
    model = models.build_model(config, dtype=jnp.float32)
    params = models.init_params(config, seed=0)
    optimizer = optimizer_lib.build_optimizer(_optimizer_config(lr=1e-2, warmup_steps=0))
    state = step.init_state(params, optimizer, state_shardings_fn=lambda tree: None)
    functions = step.make_step_functions(model, optimizer, compute_dtype=jnp.float32, softcap=None, vocab_chunk=None)
    tokens = np.arange(2 * 16, dtype=np.int32).reshape(2, 16) % 60 + 4
    batch = {"input_tokens": tokens, "target_tokens": np.roll(tokens, -1, axis=1), "segment_ids": np.ones_like(tokens),
             "positions": np.tile(np.arange(16, dtype=np.int32), (2, 1)), "loss_mask": np.ones(tokens.shape, np.float32)}
    before = jax.tree.map(np.array, state["params"])  # copies: a numpy view would pin the buffer
    old_leaf = state["params"]["embedder"]["input_embedding"]
    new_state, metrics = functions.train(state, None, batch)
    assert old_leaf.is_deleted()  # donated: the step reused its memory
    assert int(new_state["step"]) == 1 and float(metrics["tokens"]) == tokens.size
    after = jax.tree.map(np.asarray, new_state["params"])
    assert not np.array_equal(after["layer_0"]["mlp"]["linear"], before["layer_0"]["mlp"]["linear"])
    assert after["embedder"]["input_embedding"].dtype == np.float32


def test_mesh_fills_the_minus_one_axis_and_refuses_what_does_not_fit():
    assert mesh.resolve_axis_sizes({"data": -1, "fsdp": 4}, 8) == {"data": 2, "fsdp": 4}
    assert mesh.resolve_axis_sizes({"data": 2, "fsdp": 4}, 8) == {"data": 2, "fsdp": 4}
    with pytest.raises(UserError, match="--mesh data=-1,fsdp=3: 8 devices do not divide by 3"):
        mesh.resolve_axis_sizes({"data": -1, "fsdp": 3}, 8)
    with pytest.raises(UserError, match="--mesh data=2,fsdp=2: needs 4 devices, this job has 8"):
        mesh.resolve_axis_sizes({"data": 2, "fsdp": 2}, 8)


def test_fsdp_splits_large_matrices_on_their_largest_divisible_axis_and_replicates_the_rest():
    assert sharding.fsdp_spec((262_144, 640), 4) == PartitionSpec("fsdp")  # Gemma 3 270M embedding: split the vocabulary
    assert sharding.fsdp_spec((2, 2048, 640), 4) == PartitionSpec(None, "fsdp")  # gating einsum
    assert sharding.fsdp_spec((4, 256, 640), 3) == PartitionSpec()  # no axis divides by 3: replicated
    assert sharding.fsdp_spec((640,), 4) == PartitionSpec()  # a norm scale: too small to split
    assert sharding.fsdp_spec((262_144, 640), 1) == PartitionSpec()  # no fsdp axis


def test_a_single_device_mesh_gives_global_batches_of_the_local_rows():
    device_mesh = mesh.build_mesh({"data": -1, "fsdp": 1})
    local = {"input_tokens": np.ones((4, 8), np.int32)}
    batch = mesh.global_batch(local, device_mesh)
    assert batch["input_tokens"].shape == (4, 8) and batch["input_tokens"].sharding.spec == PartitionSpec(("data", "fsdp"))


def test_a_start_traces_its_models_initialisation_once_for_every_shape_it_needs(monkeypatch):
    """The state's shardings, the checkpoint's restore target and a resumed run's weights each need the model's
    parameter shapes: one trace of its initialisation serves them all (gemma3-270m's or 1b's took about half a
    second each, three times a start; issue 50), and they are the shapes the initialisation gives."""
    from trainer.config import parse_config
    from trainer.gemma3.model import Transformer

    model_config = models.model_config("tiny", vocab_size=64)
    config = parse_config(["--model", "tiny", "--weights", "random", "--data", "x", "--tokenizer", "t.model"])
    described = lambda tree, *fields: {jax.tree_util.keystr(path): tuple(getattr(leaf, field) for field in fields)  # noqa: E731
                                       for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}
    want = described(jax.eval_shape(lambda: models.init_params(model_config, seed=0)), "shape", "dtype")
    models._traced_shapes.cache_clear()  # as a new process starts
    traces = []
    init = Transformer.init
    monkeypatch.setattr(Transformer, "init", lambda self, *args, **kwargs: traces.append(self) or init(self, *args, **kwargs))
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    step.abstract_params(config, model_config)[0].clear()  # a caller's changes to its tree stay its own
    trained, frozen = step.abstract_params(config, model_config)
    resumed, _ = models.initial_params(config, model_config, lambda tree: jax.tree.map(lambda _: device, tree), resuming=True)
    assert len(traces) == 1
    assert described(trained, "shape", "dtype") == want and frozen is None
    assert described(resumed, "shape", "dtype", "sharding") == {key: (*value, device) for key, value in want.items()}
