"""Each TPU generation's XLA flags (trainer.run.tpu_flags) are ones the installed libtpu compiles a sharded
training step with: libtpu refuses an unknown flag, and refuses continuation fusion outside v5e."""

import os
import subprocess
import sys

import pytest

from trainer.run import tpu_flags

pytest.importorskip("libtpu", reason="libtpu is in requirements-dev.lock: run `make setup`")

# The gradient of a matmul whose weight is split over 8 chips: all-gathers and a reduce-scatter.
_COMPILE = """
import os, sys
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec
from trainer.run import mesh
from trainer.measure import compiled
device_mesh = mesh.build_mesh({"data": 1, "fsdp": 8}, devices=compiled.tpu_devices(sys.argv[1], "2x4"))
weight = jax.ShapeDtypeStruct((1024, 1024), jnp.bfloat16, sharding=NamedSharding(device_mesh, PartitionSpec("fsdp")))
x = jax.ShapeDtypeStruct((64, 1024), jnp.bfloat16, sharding=NamedSharding(device_mesh, PartitionSpec(("data", "fsdp"))))
jax.jit(jax.grad(lambda w, x: jnp.sum(jnp.tanh(x @ w @ w).astype(jnp.float32)))).lower(weight, x).compile()
print(os.environ["LIBTPU_INIT_ARGS"])
"""


@pytest.mark.parametrize("accelerator", sorted(tpu_flags.FLAGS))
def test_libtpu_compiles_a_sharded_step_with_the_generations_flags(accelerator):
    env = {key: value for key, value in os.environ.items() if key != "LIBTPU_INIT_ARGS"} | {"JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-c", _COMPILE, accelerator], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == tpu_flags.libtpu_init_args(accelerator)  # the compile ran with them (tpu_devices set them)
