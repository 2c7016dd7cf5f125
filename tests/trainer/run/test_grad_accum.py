"""--grad-accum-steps: the train step as micro-batches equals the step over the whole global batch."""

import json
import os
import pathlib
import subprocess
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from trainer.model import models
from trainer.errors import UserError
from trainer.run import mesh, step
from trainer.run import optimizer as optimizer_lib

REPO = pathlib.Path(__file__).resolve().parents[3]
ROWS, LENGTH, VOCAB = 8, 16, 64
# bfloat16 keeps 8 bits of mantissa: two ways of summing the same gradients in it differ by about 2^-8 of a leaf.
TOLERANCE = 2e-2


def _batch() -> dict:
    """8 rows whose padding and loss masks differ between the 4 micro-batches (rows i and i + 4): micro-batch 0
    is full, 1 is mostly padding (3 of 32 tokens trained), 2 packs two documents and trains the second's, 3
    trains the second half of its rows only."""
    tokens = (np.arange(ROWS * LENGTH, dtype=np.int32).reshape(ROWS, LENGTH) * 7) % (VOCAB - 4) + 4
    segments = np.ones((ROWS, LENGTH), np.int32)
    positions = np.tile(np.arange(LENGTH, dtype=np.int32), (ROWS, 1))
    mask = np.ones((ROWS, LENGTH), np.float32)
    for row, used in ((1, 3), (5, 2)):  # micro-batch 1: a short document, then padding
        segments[row, used:], positions[row, used:], tokens[row, used:] = 0, 0, 0
        mask[row, used - 1:] = 0
    for row in (2, 6):  # micro-batch 2: two documents, the first a prompt
        segments[row, 6:] = 2
        positions[row, 6:] = np.arange(LENGTH - 6)
        mask[row, :6] = 0
    mask[[3, 7], : LENGTH // 2] = 0  # micro-batch 3
    mask[:, -1] = 0  # no target after a row's last token
    return {"input_tokens": tokens, "target_tokens": np.roll(tokens, -1, axis=1), "segment_ids": segments,
            "positions": positions, "loss_mask": mask}


@pytest.fixture(scope="module")
def tiny():
    config = models.model_config("tiny", vocab_size=VOCAB)
    return models.build_model(config, dtype=jnp.float32), models.init_params(config, seed=0)


def _gradient_recorder(param_dtype) -> optimizer_lib.Optimizer:
    """An 'optimizer' whose new weights are the step's gradients, to read them from the step itself."""
    return optimizer_lib.Optimizer(init=lambda params: (), update=lambda grads, state, params: (grads, state),
                                   apply_updates=lambda params, grads: grads, param_dtype=param_dtype)


def _step(model, params, optimizer, accumulation: int):
    functions = step.make_step_functions(model, optimizer, compute_dtype=jnp.float32, softcap=None, vocab_chunk=None,
                                         grad_accum_steps=accumulation)
    state = step.fresh_state(jax.tree.map(jnp.copy, params), optimizer)  # the step donates it
    return functions.train(state, None, _batch())


def _assert_close(got, want):
    for (path, g), w in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want)):
        g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
        error = np.linalg.norm(g - w) / max(np.linalg.norm(w), 1e-12)
        assert error < TOLERANCE, f"{jax.tree_util.keystr(path)}: off by {error:.3g} of its norm"


@pytest.mark.parametrize("param_dtype", [jnp.float32, jnp.bfloat16], ids=["float32 masters", "lean bfloat16 weights"])
def test_four_micro_batches_give_the_loss_and_gradients_of_the_whole_batch(tiny, param_dtype):
    model, params = tiny
    (one_pass, one_metrics), (accumulated, metrics) = (_step(model, params, _gradient_recorder(param_dtype), n) for n in (1, 4))
    assert {leaf.dtype for leaf in jax.tree.leaves(accumulated["params"])} == {jnp.dtype(param_dtype)}  # the sums' dtype
    assert float(metrics["loss"]) == pytest.approx(float(one_metrics["loss"]), rel=1e-2)
    assert int(metrics["tokens"]) == int(one_metrics["tokens"])
    assert float(metrics["grad_norm"]) == pytest.approx(float(one_metrics["grad_norm"]), rel=TOLERANCE)
    _assert_close(accumulated["params"], one_pass["params"])


def test_four_micro_batches_update_the_weights_as_one_batch_does(tiny):
    model, params = tiny
    optimizer = optimizer_lib.build_optimizer(optimizer_lib.OptimizerConfig(
        lr=1e-2, lr_schedule="constant", warmup_steps=0, total_steps=10, weight_decay=0.1, grad_clip=1.0))
    (one_pass, _), (accumulated, _) = (_step(model, params, optimizer, n) for n in (1, 4))
    assert int(accumulated["step"]) == 1
    # The updates, not the weights they move (whose norms would hide a wrong update).
    moved = lambda state: jax.tree.map(lambda new, old: new - old, state["params"], params)  # noqa: E731
    _assert_close(moved(accumulated), moved(one_pass))


def test_each_micro_batch_stays_spread_over_the_mesh_without_moving_rows():
    """On 4 devices (data=2, fsdp=2) the step with 2 micro-batches has the one pass's collectives: no device
    gathers the batch's rows (splitting the rows into halves, [N, B / N], would gather each array) and the
    gradients agree."""
    result = subprocess.run([sys.executable, "-m", "tests.trainer.run.grad_accum_mesh_run"], cwd=REPO, capture_output=True,
                            text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu",
                                                          "XLA_FLAGS": "--xla_force_host_platform_device_count=4"})
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads(result.stdout.splitlines()[-1])
    assert record["collectives"]["2"] == record["collectives"]["1"]
    assert record["gradient_error"] < 1e-4


def test_the_flag_and_its_yaml_key_and_what_they_refuse(tmp_path):
    from trainer.config import parse_config

    base = ["--model", "gemma3-270m", "--weights", "random", "--data", "x"]
    assert parse_config(base).grad_accum_steps == 1
    assert parse_config([*base, "--batch-size", "32", "--grad-accum-steps", "4"]).grad_accum_steps == 4
    yaml_file = tmp_path / "run.yaml"
    yaml_file.write_text("batch_size: 24\ngrad_accum_steps: 3\n")
    assert parse_config([*base, "--config", str(yaml_file)]).grad_accum_steps == 3
    with pytest.raises(UserError, match=r"^argument --grad-accum-steps: expected a positive integer, got '0'"):
        parse_config([*base, "--grad-accum-steps", "0"])
    with pytest.raises(UserError, match=r"^--batch-size 6 does not split into --grad-accum-steps 4 micro-batches: give a batch "
                                        r"size that is a multiple of the accumulation steps$"):
        parse_config([*base, "--batch-size", "6", "--grad-accum-steps", "4"])


def test_each_micro_batch_must_divide_over_the_devices():
    eight_chips = types.SimpleNamespace(size=8, devices=np.array([types.SimpleNamespace(process_index=i // 4) for i in range(8)]))
    mesh.check_batch(64, eight_chips, grad_accum_steps=8)  # micro-batches of 8 rows, one a chip
    with pytest.raises(UserError, match=r"^--batch-size 64 as --grad-accum-steps 16 micro-batches of 4 rows: a micro-batch must "
                                        r"be a multiple of the 8 devices; give a --batch-size that is a multiple of 128, or "
                                        r"--grad-accum-steps 8$"):
        mesh.check_batch(64, eight_chips, grad_accum_steps=16)
    with pytest.raises(UserError, match=r"^--batch-size 48 as --grad-accum-steps 4 micro-batches of 12 rows: .* a multiple of "
                                        r"32, or --grad-accum-steps 3$"):
        mesh.check_batch(48, eight_chips, grad_accum_steps=4)
