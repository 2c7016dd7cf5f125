"""--precision lean (and lean-factored): each step rounds stochastically, with noise of its own, and a fine-tune
from a trained start keeps float32's held-out gain (bench.lean_quality's method, on the tiny model)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bench import lean_quality
from trainer.run import optimizer as optimizer_lib

SPACING = 2.0**-7  # bfloat16's spacing in [1, 2)
START = 1.5  # in the middle of [1, 2): 64 steps of 1e-4 stay in it
STEPS, LR = 64, 1e-4
P = LR / SPACING  # the chance that one step of LR moves a weight down one spacing: 0.0128


def _spacings_moved(precision: str) -> np.ndarray:
    """STEPS lean steps of a constant gradient from weights of 1.5: Adam's step is then LR on every weight, 0.0128
    of bfloat16's spacing there, which round-to-nearest drops every time. How many spacings each weight moved."""
    optimizer = optimizer_lib.build_optimizer(optimizer_lib.OptimizerConfig(
        lr=LR, lr_schedule="constant", warmup_steps=0, total_steps=STEPS, weight_decay=0.0, grad_clip=1.0, precision=precision))
    params = {"linear": jnp.full((64, 256), START, jnp.bfloat16), "norm": {"scale": jnp.full((256,), START, jnp.bfloat16)}}
    grads = jax.tree.map(lambda p: jnp.full(p.shape, 1e-3, jnp.bfloat16), params)  # global norm 0.13: not clipped
    apply, state = jax.jit(optimizer.apply), optimizer.init(params)
    for _ in range(STEPS):
        params, state = apply(grads, state, params)
    weights = np.concatenate([np.asarray(leaf, np.float32).ravel() for leaf in jax.tree.leaves(params)])
    return (START - weights) / SPACING


@pytest.mark.parametrize("precision", optimizer_lib.PRECISIONS[1:])
def test_steps_below_bfloat16s_spacing_accumulate_as_float32s_do(precision):
    """Stochastic rounding is exact on average: after 64 steps of 0.0128 spacings the weights have moved 0.82
    spacings on average, as float32's would (round-to-nearest: 0, every step lost)."""
    moved = _spacings_moved(precision)
    assert moved.mean() == pytest.approx(STEPS * P, rel=0.05)  # its standard error: 0.9%


@pytest.mark.parametrize("precision", optimizer_lib.PRECISIONS[1:])
def test_each_steps_rounding_is_a_fresh_draw(precision):
    """Each step's noise is its own (the step's number is in the hash): a weight's 64 roundings are independent
    coins of P = 0.0128, so the spacings it moves are Binomial(64, P), variance 64 P (1 - P) = 0.81. With one
    noise for every step, a weight either moves at every step or at none: variance 64 times that (52);
    with round-to-nearest none moves: 0."""
    moved = _spacings_moved(precision)
    assert moved.var() == pytest.approx(STEPS * P * (1 - P), rel=0.15)  # its standard error: about 1.5%
    assert np.mean(moved > 0) == pytest.approx(1 - (1 - P) ** STEPS, rel=0.05)  # 56% moved at least once (one noise: 1.3%)


def test_lean_fine_tunes_from_a_trained_start_keep_float32s_held_out_gain(tokenized_data, capsys):
    """bench.lean_quality's method on the tiny model: float32 trains it from random weights for 100 steps (the
    start, rounded to bfloat16), then float32, lean and lean-factored fine-tune it 20 steps at lr 1e-4 on 3 seeds'
    batch orders. Each lean precision's held-out gain over the start is at least 0.9 of float32's on the same
    seed's batches, on every seed. Figures on this corpus: float32's gain moves by 16% between seeds (0.060-0.071),
    lean's share of it 0.991-1.003 and lean-factored's 1.072-1.087; with round-to-nearest they keep 0.59-0.68."""
    with capsys.disabled():
        print()
        figures = lean_quality.compare("tiny", tokenized_data, lean_quality.TINY, say=lambda line: print(f"  {line}"))
    assert figures["start_held_out_loss"] < 0.5 * np.log(tokenized_data.vocab_size)  # a trained start, far below a uniform guess
    assert min(figures["float32_gain"]) > 0  # the fine-tune still learns
    for precision, share in figures["gain_share"].items():
        assert min(share) >= lean_quality.KEEPS, (precision, share)
