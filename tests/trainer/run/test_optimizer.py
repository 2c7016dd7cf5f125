"""The lean precision's optimizer: stochastic rounding that keeps small steps, AdamW's arithmetic, 8 bytes a parameter."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from trainer.run import optimizer as optimizer_lib


def _config(**overrides):
    values = dict(lr=1e-3, lr_schedule="constant", warmup_steps=0, total_steps=100, weight_decay=0.1, grad_clip=1.0)
    return optimizer_lib.OptimizerConfig(**{**values, **overrides})


def test_stochastic_rounding_is_exact_on_average_where_round_to_nearest_loses_the_step():
    value = jnp.full((200_000,), 1.0 + 1e-4, jnp.float32)  # 1e-4 is under bfloat16's spacing at 1 (2^-7)
    noise = jax.random.bits(jax.random.key(0), value.shape, jnp.uint32)
    rounded = optimizer_lib.round_stochastically(value, noise)
    assert rounded.dtype == jnp.bfloat16
    assert set(np.unique(np.asarray(rounded, np.float32))) == {1.0, 1.0078125}  # the two neighbours only
    assert float(jnp.mean(rounded.astype(jnp.float32))) == pytest.approx(1.0 + 1e-4, abs=2e-5)
    assert float(jnp.mean(value.astype(jnp.bfloat16).astype(jnp.float32))) == 1.0  # round-to-nearest: the step is lost
    # The update's own bits (an index hash, fused into it): uniform enough that the rounding stays exact on average.
    hashed = optimizer_lib.hashed_noise((400, 500), jnp.uint32(7))
    assert len(np.unique(np.asarray(hashed))) > 0.99 * hashed.size
    for half in (hashed & 0xFFFF, hashed >> 16):
        assert float(jnp.mean(half.astype(jnp.float32))) == pytest.approx(2**15, rel=0.01)
        rounded = optimizer_lib.round_stochastically(value[:hashed.size].reshape(hashed.shape), half)
        assert float(jnp.mean(rounded.astype(jnp.float32))) == pytest.approx(1.0 + 1e-4, abs=2e-5)
    assert not np.array_equal(hashed, optimizer_lib.hashed_noise((400, 500), jnp.uint32(8)))  # another seed, other bits
    exact = jnp.array([1.0, -2.5, 0.0, 2.0**120], jnp.float32)  # values bfloat16 holds stay as they are, whatever the noise
    for seed in range(4):
        noise = jax.random.bits(jax.random.key(seed), exact.shape, jnp.uint32)
        np.testing.assert_array_equal(optimizer_lib.round_stochastically(exact, noise).astype(jnp.float32), exact)


def _steps(optimizer, params, grads_by_step):
    state = optimizer.init(params)
    for grads in grads_by_step:
        params, state = optimizer.apply(grads, state, params)
    return params, state


def test_lean_adamw_follows_optax_adamw_within_bfloat16_rounding_and_keeps_8_bytes_a_parameter():
    key = jax.random.key(0)
    params = {"linear": jax.random.normal(key, (256, 256)), "norm": {"scale": jnp.ones((256,))}}
    grads_by_step = [jax.tree.map(lambda p, i=i: 3e-2 * jax.random.normal(jax.random.key(i + 1), p.shape), params) for i in range(20)]
    start = jax.tree.map(lambda p: p.astype(jnp.bfloat16), params)
    want, _ = _steps(optimizer_lib.build_optimizer(_config()), jax.tree.map(lambda p: p.astype(jnp.float32), start), grads_by_step)
    lean = optimizer_lib.build_optimizer(_config(precision="lean"))
    assert lean.param_dtype == jnp.bfloat16
    got, state = _steps(lean, start, [jax.tree.map(lambda g: g.astype(jnp.bfloat16), g) for g in grads_by_step])
    assert {leaf.dtype for leaf in jax.tree.leaves((got, state["mu"], state["nu"]))} == {jnp.dtype(jnp.bfloat16)}
    for name, g, w, p in zip(("linear", "scale"), jax.tree.leaves(got), jax.tree.leaves(want), jax.tree.leaves(start)):
        want_moved = np.asarray(w) - np.asarray(p, np.float32)
        got_moved = np.asarray(g, np.float32) - np.asarray(p, np.float32)
        # 20 steps of lr 1e-3 move each weight ~0.02, a few of bfloat16's spacings near 1: round-to-nearest
        # would lose most single steps. Each lean weight is noisier, but the update's direction and size are
        # float32's: its projection on float32's movement is whole.
        assert np.vdot(got_moved, want_moved) / np.vdot(want_moved, want_moved) == pytest.approx(1.0, abs=0.1), name
        difference = got_moved - want_moved  # no drift: its mean within 4 standard errors of 0
        assert abs(np.mean(difference)) <= 4 * np.std(difference) / np.sqrt(difference.size), name


def test_lean_weight_decay_pulls_matrices_but_not_norm_scales():
    optimizer = optimizer_lib.build_optimizer(_config(lr=1.0, weight_decay=0.5, precision="lean"))
    params = {"linear": jnp.ones((4, 4), jnp.bfloat16), "norm": {"scale": jnp.ones((4,), jnp.bfloat16)}}
    updated, _ = optimizer.apply(jax.tree.map(jnp.zeros_like, params), optimizer.init(params), params)
    np.testing.assert_array_equal(np.asarray(updated["linear"], np.float32), 0.5 * np.ones((4, 4)))
    np.testing.assert_array_equal(np.asarray(updated["norm"]["scale"], np.float32), np.ones(4))


def test_lean_clips_by_the_global_norm_as_float32_does():
    params = {"w": jnp.zeros((8, 8))}
    huge = {"w": jnp.full((8, 8), 100.0)}
    want, _ = _steps(optimizer_lib.build_optimizer(_config(weight_decay=0.0)), params, [huge])
    got, state = _steps(optimizer_lib.build_optimizer(_config(weight_decay=0.0, precision="lean")),
                        jax.tree.map(lambda p: p.astype(jnp.bfloat16), params), [jax.tree.map(lambda g: g.astype(jnp.bfloat16), huge)])
    # Adam's first step is lr * sign(g) whatever the clip, so the moments show the clip: mu = 0.1 * g * 1 / ||g||.
    np.testing.assert_allclose(np.asarray(got["w"], np.float32), np.asarray(want["w"]), rtol=1e-2)
    np.testing.assert_allclose(np.asarray(state["mu"]["w"], np.float32), 0.1 * 100.0 / np.linalg.norm(np.full(64, 100.0)), rtol=1e-2)


def test_float32_precision_is_optax_adamw():
    params = {"w": jax.random.normal(jax.random.key(3), (16, 16))}
    grads = [{"w": jax.random.normal(jax.random.key(4 + i), (16, 16))} for i in range(3)]
    got, _ = _steps(optimizer_lib.build_optimizer(_config()), params, grads)
    transform = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3, weight_decay=0.1))
    state, want = transform.init(params), params
    for g in grads:
        updates, state = transform.update(g, state, want)
        want = optax.apply_updates(want, updates)
    np.testing.assert_allclose(got["w"], want["w"], rtol=1e-6, atol=1e-7)


def test_the_factored_second_moment_is_adams_where_the_squared_gradients_are_rank_one_and_keeps_a_row_and_a_column():
    """lean-factored keeps float32 row and column means of each matrix's squared gradients (Adafactor): where
    those are rank one (every step's gradient an outer product of the same row and column profiles) the
    estimate is exact, so its weights move as lean's do; vectors keep lean's bfloat16 moment."""
    rows, columns = jnp.linspace(0.5, 2.0, 64), jnp.linspace(1.0, 3.0, 48)
    params = {"linear": jnp.ones((2, 64, 48), jnp.bfloat16), "norm": {"scale": jnp.ones((48,), jnp.bfloat16)}}
    grads_by_step = [{"linear": jnp.broadcast_to(scale * 1e-2 * jnp.outer(rows, columns), (2, 64, 48)).astype(jnp.bfloat16),
                      "norm": {"scale": jnp.full((48,), scale * 1e-2, jnp.bfloat16)}} for scale in (1.0, -0.5, 2.0, 0.3)]
    # A rate at which 4 steps move each weight by many of bfloat16's spacings (2^-7 near 1), so that a wrong
    # second moment shows beside the rounding.
    lean, _ = _steps(optimizer_lib.build_optimizer(_config(lr=0.1, precision="lean")), params, grads_by_step)
    factored = optimizer_lib.build_optimizer(_config(lr=0.1, precision="lean-factored"))
    got, state = _steps(factored, params, grads_by_step)
    assert {name: leaf.shape for name, leaf in state["nu"]["linear"].items()} == {"rows": (2, 64), "columns": (2, 48)}
    assert state["nu"]["norm"]["scale"].dtype == jnp.bfloat16
    for name, g, w in zip(("linear", "scale"), jax.tree.leaves(got), jax.tree.leaves(lean)):
        moved_got, moved_want = 1 - np.asarray(g, np.float32), 1 - np.asarray(w, np.float32)
        assert np.abs(moved_got - moved_want).max() <= 2 * 2.0**-7, name  # the same steps, up to the rounding's last bit


def test_the_factored_second_moment_follows_the_gradients_scale_by_row_and_column():
    """Where rows' gradients differ in size, their steps come out alike in size, as Adam's do (the point of a
    second moment): a factored estimate that ignored the rows would let the large rows take larger steps."""
    rows = jnp.array([1.0, 100.0])[:, None]
    params = {"linear": jnp.zeros((2, 8), jnp.bfloat16)}
    grads = [{"linear": (rows * jnp.ones((2, 8)) * 1e-3).astype(jnp.bfloat16)}] * 3
    got, _ = _steps(optimizer_lib.build_optimizer(_config(precision="lean-factored", weight_decay=0.0)), params, grads)
    small, large = np.abs(np.asarray(got["linear"], np.float32)).mean(axis=1)
    assert large == pytest.approx(small, rel=0.05)


def _first_step(precision: str, grad, lr: float = 1e-3):
    """The first step's movement of a zero matrix in learning rates (float32), for the gradient `grad`."""
    optimizer = optimizer_lib.build_optimizer(_config(lr=lr, precision=precision, weight_decay=0.0, grad_clip=1e9))
    params = {"linear": jnp.zeros(grad.shape, jnp.bfloat16)}
    moved, _ = optimizer.apply({"linear": grad.astype(jnp.bfloat16)}, optimizer.init(params), params)
    return -np.asarray(moved["linear"], np.float32) / lr


def _rms(values) -> float:
    return float(np.sqrt(np.mean(np.square(values))))


def test_lean_factored_clips_each_leafs_update_at_an_rms_of_the_learning_rate_as_adafactor_does():
    """Adafactor's clip (update / max(1, RMS(update)), before the rate): a matrix whose gradient is a dense block
    beside an identity-shaped one (rows and columns quiet but for one weight) has a rank-one estimate 1056 times
    below those weights' squared gradients: unclipped, the first step's RMS is 2.9 learning rates (32.5 on each of
    those weights). Clipped, it is 1 (11 on those weights). A plain identity's estimate is 1/n everywhere: its
    RMS is already 1, so the clip leaves its sqrt(n) = 8 rates on the diagonal (it bounds the RMS, not each
    weight); lean's first step (Adam's: the gradient's sign) is never clipped."""
    n = 32
    block_and_identity = jnp.zeros((2 * n, 2 * n)).at[:n, :n].set(1.0).at[n:, n:].set(jnp.eye(n))
    moved = _first_step("lean-factored", block_and_identity)
    assert _rms(moved) == pytest.approx(1.0, rel=1e-2)
    assert moved[n:, n:].max() == pytest.approx(np.sqrt(1056) / np.sqrt(8.5), rel=1e-2)  # 32.5 / its RMS of 2.92
    identity = _first_step("lean-factored", jnp.eye(2 * n))
    assert _rms(identity) == pytest.approx(1.0, rel=1e-2)
    np.testing.assert_allclose(np.diag(identity), np.sqrt(2 * n), rtol=1e-2)
    lean = _first_step("lean", block_and_identity)
    np.testing.assert_allclose(lean, np.asarray(block_and_identity), rtol=1e-2)


@pytest.mark.parametrize("precision", ["float32", "lean"])
def test_a_trained_image_encoder_starts_at_its_step_and_warms_up_while_the_rest_trains_from_step_1(precision):
    """--vision-encoder-from-step 3 with --warmup-steps 2: the encoder's weights stay as loaded for steps 1 and 2,
    move by half the rate at step 3 and by the whole at step 4 (Adam moves a weight by about the rate a step, the
    gradient constant); the language model's train from step 1."""
    params = {"vision_encoder": {"kernel": jnp.ones((4, 4))}, "layer_0": {"kernel": jnp.ones((4, 4))}}
    optimizer = optimizer_lib.build_optimizer(_config(precision=precision, lr=2.0**-4, warmup_steps=2, weight_decay=0.0,
                                                      encoder_from_step=3))
    params = jax.tree.map(lambda p: p.astype(optimizer.param_dtype), params)
    grads = jax.tree.map(lambda p: jnp.full(p.shape, 1e-3, p.dtype), params)
    state, moved, apply = optimizer.init(params), [], jax.jit(optimizer.apply)
    for _ in range(4):
        before = params
        params, state = apply(grads, state, params)
        moved.append({name: float(np.mean(np.asarray(before[name]["kernel"], np.float32) - np.asarray(params[name]["kernel"], np.float32)))
                      for name in params})
    rate = [min(step / 2, 1) * 2.0**-4 for step in (1, 2, 3, 4)]  # the run's warmup
    np.testing.assert_allclose([m["layer_0"] for m in moved], rate, rtol=0.05)
    np.testing.assert_allclose([m["vision_encoder"] for m in moved], [0, 0, rate[0], rate[1]], rtol=0.05, atol=1e-9)


def test_without_a_later_encoder_step_the_optimizer_state_is_optax_adamw_s():
    """A run without --vision-encoder-from-step keeps the state's tree its checkpoints have (clip, then AdamW)."""
    params = {"vision_encoder": {"kernel": jnp.ones((4, 4))}, "layer_0": {"kernel": jnp.ones((4, 4))}}
    plain = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(optimizer_lib.learning_rate_schedule(_config()),
                                                                    mask=optimizer_lib._decayed)).init(params)
    assert jax.tree.structure(optimizer_lib.build_optimizer(_config()).init(params)) == jax.tree.structure(plain)
