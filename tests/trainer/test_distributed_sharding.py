"""The FSDP rules on the real Gemma 3 shapes, built abstractly (jax.eval_shape, an AbstractMesh of one
v6e 2x4 slice): every large matrix is split over the slice, and what a chip then holds is what
`trainer.measure.memory` estimates, so the README's memory table describes the sharding the trainer applies."""

import math

import jax
import pytest
from jax.sharding import AbstractMesh

from trainer.run import hardware
from trainer.measure import memory

from trainer.model import models
from trainer.run import mesh, step
from trainer.run import optimizer as optimizer_lib
from trainer.nn.sharding import MIN_FSDP_ELEMENTS
from trainer.config import TrainConfig
from trainer.errors import UserError

SLICE = memory.Shape("v6e", "2x4")
LORA_RANK = 16
# Leaves the rules leave whole (norm scales) are the only difference from the formula's N / fsdp.
AGREEMENT = 0.01


def _slice_mesh() -> AbstractMesh:
    return AbstractMesh((1, SLICE.chips), mesh.BATCH_AXES)


def _bytes_per_chip(tree, shardings, *, itemsize: int | None = None) -> int:
    return sum(
        math.prod(sharding.shard_shape(leaf.shape)) * (itemsize or leaf.dtype.itemsize)
        for leaf, sharding in zip(jax.tree.leaves(tree), jax.tree.leaves(shardings))
    )


def _estimate(config, *, lora_rank: int) -> dict:
    defaults = TrainConfig()
    return memory.estimate_bytes_per_chip(config, chips=SLICE.chips, fsdp=SLICE.chips, lora_rank=lora_rank,
                                          batch_per_chip=defaults.batch_size // SLICE.chips, seq_len=defaults.seq_len)  # fmt: skip


def _optimizer_state(params):
    optimizer = optimizer_lib.build_optimizer(optimizer_lib.OptimizerConfig(lr=1e-5, lr_schedule="cosine", warmup_steps=0, total_steps=10,
                                                          weight_decay=0.0, grad_clip=1.0))  # fmt: skip
    return jax.eval_shape(optimizer.init, params)


def _hbm() -> int:
    return hardware.hbm_bytes(hardware.DEVICE_KIND_OF_ACCELERATOR[SLICE.accelerator])


@pytest.fixture(scope="module")
def gemma3_1b():
    config = models.model_config("gemma3-1b", vocab_size=0)
    return config, jax.eval_shape(lambda: models.init_params(config, seed=0))


def test_fsdp_over_one_v6e_2x4_splits_every_large_gemma3_1b_matrix_over_all_its_chips(gemma3_1b):
    _, params = gemma3_1b
    shardings = mesh.state_shardings(_slice_mesh(), params)
    for (path, leaf), sharding in zip(jax.tree_util.tree_flatten_with_path(params)[0], jax.tree.leaves(shardings)):
        shard = math.prod(sharding.shard_shape(leaf.shape))
        if math.prod(leaf.shape) >= MIN_FSDP_ELEMENTS:
            assert shard * SLICE.chips == math.prod(leaf.shape), jax.tree_util.keystr(path)
        else:
            assert len(leaf.shape) == 1, jax.tree_util.keystr(path)  # only norm scales stay whole


def test_gemma3_1b_full_fine_tune_state_per_chip_is_the_estimate_and_fits_one_v6e_2x4(gemma3_1b):
    config, params = gemma3_1b
    state = {"params": params, "opt_state": _optimizer_state(params)}
    shardings = mesh.state_shardings(_slice_mesh(), state)
    # The train state plus a gradient laid out like the parameters.
    held = _bytes_per_chip(state, shardings) + _bytes_per_chip(params, shardings["params"])
    estimate = _estimate(config, lora_rank=0)
    assert held == pytest.approx(estimate["weights"] + estimate["gradients_and_optimizer"], rel=AGREEMENT)
    assert estimate["total"] <= _hbm()


def test_gemma3_4b_lora_base_per_chip_is_the_estimate_and_fits_one_v6e_2x4():
    config = models.model_config("gemma3-4b", vocab_size=0)
    base = jax.eval_shape(lambda: models.init_params(config, seed=0))
    adapters = jax.eval_shape(lambda: models.init_adapters(config, seed=0, lora_rank=LORA_RANK))
    slice_mesh = _slice_mesh()
    estimate = _estimate(config, lora_rank=LORA_RANK)
    # The frozen base is held in bfloat16, sharded like a full fine-tune's weights.
    base_bytes = _bytes_per_chip(base, mesh.state_shardings(slice_mesh, base), itemsize=2)
    assert base_bytes == pytest.approx(estimate["weights"], rel=AGREEMENT)
    # Adapters, their gradients and AdamW moments: the estimate keeps them whole, the rules may split some.
    trained = {"params": adapters, "opt_state": _optimizer_state(adapters)}
    trained_shardings = mesh.state_shardings(slice_mesh, trained)
    held = _bytes_per_chip(trained, trained_shardings) + _bytes_per_chip(adapters, trained_shardings["params"])
    assert held <= estimate["gradients_and_optimizer"]
    assert estimate["total"] <= _hbm()


def test_off_tpu_slices_are_emulated_by_processes_and_a_mismatch_is_one_clear_error():
    with pytest.raises(UserError, match="MEGASCALE_NUM_SLICES=2: off TPU each process emulates one slice, this job has 1 processes"):
        mesh.build_mesh({"data": -1, "fsdp": 1}, slices=2)
