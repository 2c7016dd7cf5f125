"""--precision lean (and lean-factored): the same step as float32's, and the same quality on the demo's run."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from trainer import loop
from trainer.config import PRESET_VALUES, parse_config
from trainer.model import models
from trainer.nn import loss
from trainer.run import optimizer as optimizer_lib, step
from trainer.run.metrics import read_metrics

BF16_EPS = 2.0**-7


def _batch(vocab: int, rows: int = 2, length: int = 32) -> dict:
    tokens = (np.arange(rows * length, dtype=np.int32).reshape(rows, length) * 7) % (vocab - 4) + 4
    return {"input_tokens": tokens, "target_tokens": np.roll(tokens, -1, axis=1), "segment_ids": np.ones_like(tokens),
            "positions": np.tile(np.arange(length, dtype=np.int32), (rows, 1)), "loss_mask": np.ones(tokens.shape, np.float32)}


def test_the_lean_step_computes_float32s_loss_and_gradients_in_bfloat16():
    """With a bfloat16 forward pass (as on TPU) the lean state's weights are the ones float32's step casts to:
    the loss is the same, each gradient leaf the same within bfloat16's rounding, relative to its norm."""
    config = models.model_config("tiny", vocab_size=64)
    model = models.build_model(config, dtype=jnp.bfloat16)
    params = models.init_params(config, seed=0)
    batch = _batch(64)

    def mean_loss(trained):
        total, count = loss.loss_sums(model, step.forward_params(trained, None, jnp.bfloat16), batch, softcap=None, vocab_chunk=None)
        return total / count

    lean = step.fresh_state(params, optimizer_lib.build_optimizer(optimizer_lib.OptimizerConfig(
        lr=1e-3, lr_schedule="constant", warmup_steps=0, total_steps=10, weight_decay=0.0, grad_clip=1.0, precision="lean")))
    assert {leaf.dtype for leaf in jax.tree.leaves(lean["params"])} == {jnp.dtype(jnp.bfloat16)}
    want_loss, want = jax.value_and_grad(mean_loss)(params)
    got_loss, got = jax.value_and_grad(mean_loss)(lean["params"])
    assert float(got_loss) == pytest.approx(float(want_loss), rel=BF16_EPS)
    for (path, g), w in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want)):
        assert g.dtype == jnp.bfloat16 and w.dtype == jnp.float32
        off = np.linalg.norm(np.asarray(g, np.float32) - np.asarray(w)) / max(np.linalg.norm(np.asarray(w)), 1e-30)
        assert off <= BF16_EPS, f"{jax.tree_util.keystr(path)}: off by {off:.2e} of its norm"


def _demo_run(workdir, prepared_dir, tokenizer_path, *extra):
    loop.train(parse_config(["--preset", "tiny", "--data", str(prepared_dir), "--tokenizer", str(tokenizer_path),
                             "--workdir", str(workdir), "--no-samples", "--checkpoint-interval", "1000", *extra]))
    return {record["step"]: record for record in read_metrics(workdir / "metrics.jsonl")}


def test_the_lean_demo_runs_end_within_1_percent_of_float32s_loss(tmp_path, prepared_dir, tokenizer_path, capsys):
    """The demo's run (`--preset tiny`: 150 steps) on the test corpus, float32, lean and lean-factored from the same
    weights and batches: the held-out loss at step 150 no more than 1% above float32's; the figures are printed (BENCHMARKS.md has the
    demo's own)."""
    steps = PRESET_VALUES["tiny"]["steps"]
    float32 = _demo_run(tmp_path / "float32", prepared_dir, tokenizer_path)
    for precision in ("lean", "lean-factored"):
        lean = _demo_run(tmp_path / precision, prepared_dir, tokenizer_path, "--precision", precision)
        with capsys.disabled():
            print(f"\n  demo run, step {steps}: eval loss float32 {float32[steps]['eval_loss']:.4f}, {precision} "
                  f"{lean[steps]['eval_loss']:.4f}; train loss float32 {float32[steps]['loss']:.4f}, {precision} {lean[steps]['loss']:.4f}")
        assert lean[1]["loss"] == pytest.approx(float32[1]["loss"], rel=1e-3), precision  # the same start
        assert lean[steps]["eval_loss"] <= 1.01 * float32[steps]["eval_loss"], precision  # no more than 1% worse
        assert lean[steps]["eval_loss"] < 0.5 * lean[1]["loss"], precision  # and it learned
