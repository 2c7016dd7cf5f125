"""FSDP's matmuls compiled for TPU run as loops over the weights' shards (windowed_dot_general), whose
bodies XLA's cost analysis counts once: with the missing iterations added, a matmul costs what it
does (2 FLOPs a multiply-add)."""

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from trainer.measure import compiled, windowed_loops
from trainer.nn import layers

pytest.importorskip("libtpu", reason="libtpu is in requirements-dev.lock: run `make setup`")


def _fsdp_matmul(tokens: int, embed: int = 640, hidden: int = 2048, *, gathered: bool = False):
    """gemma3-270m's gate projection of `tokens` tokens, rows and weights split over 8 v6e chips as FSDP
    splits them (`gathered`: the weight whole first, as the model's projections take it)."""
    mesh = Mesh(compiled.tpu_devices("v6e", "2x4"), ("fsdp",))
    split = NamedSharding(mesh, PartitionSpec("fsdp"))
    rows = jax.ShapeDtypeStruct((tokens, embed), jnp.bfloat16, sharding=split)
    weights = jax.ShapeDtypeStruct((embed, hidden), jnp.bfloat16, sharding=split)
    options = layers.LayerOptions(mesh=mesh)
    matmul = (lambda x, w: x @ layers.gathered(options, w)) if gathered else (lambda x, w: x @ w)
    program = jax.jit(matmul, out_shardings=split).lower(rows, weights).compile()
    return program.cost_analysis()["flops"], program.as_text(), 2 * tokens * embed * hidden / 8


def test_a_windowed_matmul_counts_every_iteration():
    reported, hlo, per_chip = _fsdp_matmul(32_768)
    assert "windowed_dot_general" in hlo and reported < 0.6 * per_chip  # the loop's body counted once
    assert reported + windowed_loops.missing_flops(hlo) == pytest.approx(per_chip, rel=0.02)


def test_a_matmul_without_a_loop_needs_no_correction():
    reported, hlo, per_chip = _fsdp_matmul(4_096)  # small enough that XLA gathers the weights instead
    assert "windowed_dot_general" not in hlo and windowed_loops.missing_flops(hlo) == 0
    assert reported == pytest.approx(per_chip, rel=0.02)


def test_a_gathered_weight_makes_the_matmul_one_matmul():
    """The model gathers a projection's weight (trainer.nn.layers.gathered): no loop, nothing to correct."""
    reported, hlo, per_chip = _fsdp_matmul(32_768, gathered=True)
    assert "windowed_dot_general" not in hlo and windowed_loops.missing_flops(hlo) == 0
    assert reported == pytest.approx(per_chip, rel=0.02)
